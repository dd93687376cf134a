package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/weightcast/weightcast"
	"github.com/weightcast/weightcast/pipeline"
)

// runInProcess runs every rank as goroutines of this process over the
// inproc transport and bus.
func runInProcess(ctx context.Context, c *config, tracer *pipeline.Tracer, report func(event)) []*rankResult {
	group := fmt.Sprintf("%s-%d", c.group, time.Now().UnixNano())
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	results := make([]*rankResult, c.ranks)
	var wg sync.WaitGroup
	for r := range c.ranks {
		wg.Go(func() {
			res, err := inProcessRank(ctx, c, group, r, tracer, report)
			if res == nil {
				res = &rankResult{Rank: r}
			}
			if err != nil {
				res.Error = err.Error()
				cancel(fmt.Errorf("rank %d failed: %w", r, err))
			}
			results[r] = res
		})
	}
	wg.Wait()
	return results
}

func inProcessRank(ctx context.Context, c *config, group string, rank int, tracer *pipeline.Tracer, report func(event)) (*rankResult, error) {
	return runRank(ctx, c, weightcast.Options{
		Group: group, Rank: rank, WorldSize: c.ranks, Transport: "inproc",
		BucketSize: c.bucket, Timeout: c.timeout, NoChecksum: !c.checksum, NoDirect: !c.direct,
	}, tracer, report)
}
