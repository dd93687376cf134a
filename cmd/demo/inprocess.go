package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/stages"
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
	o := c.opts // the run's settings, checked when the flags were read
	o.Group, o.RunID, o.Rank, o.WorldSize, o.Transport = group, "", rank, c.ranks, "inproc"
	o.Advertise, o.Secret, o.SecretFile, o.TLS, o.Quantize = "", nil, "", auth.TLSFiles{}, stages.QuantizeConfig{}
	return runRank(ctx, c, o, tracer, report)
}
