package gputest

import (
	"context"
	"time"

	"github.com/weightcast/weightcast/gpu"
)

// OnDevice runs f, the body of a child rank (see transporttest.Procs),
// with cuda:ordinal open and a context that ends after limit, and closes
// the device after it.
func OnDevice(ordinal int, limit time.Duration, f func(ctx context.Context, d *gpu.CUDADevice) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	d, err := gpu.NewCUDADevice(ordinal)
	if err != nil {
		return err
	}
	defer d.Close()
	return f(ctx, d)
}
