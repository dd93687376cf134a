package tcp_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
	_ "github.com/weightcast/weightcast/transport/tcp"
	"github.com/weightcast/weightcast/transport/transporttest"
)

// Example opens a chain of a root and two receivers in one process (real
// programs run one rank each and share addresses through the rendezvous
// package) and broadcasts one bucket.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfgs := transporttest.Configs("example", 3, 10*time.Second)
	eps := make([]transport.Endpoint, len(cfgs))
	var wg sync.WaitGroup
	for r, cfg := range cfgs {
		cfg.Options = map[string]string{"chunk": "1MiB"}
		wg.Go(func() {
			ep, err := transport.Open(ctx, "tcp", cfg)
			if err != nil {
				panic(err)
			}
			eps[r] = ep
		})
	}
	wg.Wait()
	bufs := make([]mem.Buffer, len(eps))
	for r := range bufs {
		bufs[r], _ = mem.Host{}.Alloc(64)
	}
	n := copy(bufs[0].Host(), "weights")
	for r, ep := range eps {
		wg.Go(func() {
			if err := ep.Broadcast(ctx, 0, bufs[r], n); err != nil {
				panic(err)
			}
		})
	}
	wg.Wait()
	for r, ep := range eps {
		fmt.Printf("rank %d: %s\n", r, bufs[r].Host()[:n])
		ep.Close()
	}
	// Output:
	// rank 0: weights
	// rank 1: weights
	// rank 2: weights
}
