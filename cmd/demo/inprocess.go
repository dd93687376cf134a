package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/inproc"
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
	cfg := transport.Config{Group: group, Rank: rank, WorldSize: c.ranks, Device: mem.Host{}, Timeout: c.timeout}
	l := &links{}
	defer l.close()
	var err error
	if l.endpoint, err = transport.Open(ctx, inproc.Name, cfg); err != nil {
		return nil, err
	}
	if rank == 0 {
		l.publisher, err = inproc.OpenPublisher(ctx, cfg)
	} else {
		l.sub, err = inproc.OpenSubscriber(ctx, cfg)
	}
	if err != nil {
		return nil, err
	}
	return runRank(ctx, c, rank, l, mem.Host{}, tracer, report)
}
