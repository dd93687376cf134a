package rendezvous_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/rendezvous"
	"github.com/weightcast/weightcast/rendezvous/embedetcd"
)

// BenchmarkJoin8 measures forming a group of 8 local ranks from nothing:
// starting an embedded etcd, dialing 8 clients and joining all 8 ranks.
// It reports the start of etcd and the join (dial included) separately
// too, and closes everything outside the timed part.
func BenchmarkJoin8(b *testing.B) {
	const n = 8
	var startTotal, joinTotal time.Duration
	for i := 0; b.Loop(); i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		t0 := time.Now()
		e, err := embedetcd.Start(ctx, embedetcd.Options{})
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		groups := make([]*rendezvous.Group, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for r := range n {
			wg.Go(func() {
				s, err := rendezvous.DialEtcd(ctx, []string{e.ClientURL()}, 0)
				if err != nil {
					errs[r] = err
					return
				}
				groups[r], errs[r] = rendezvous.Join(ctx, s, rendezvous.JoinOptions{
					Group: "bench", RunID: fmt.Sprint("run-", i), Rank: r, WorldSize: n,
					Endpoints: map[string]string{"meta": fmt.Sprintf("127.0.0.1:%d", 7000+r)},
				})
			})
		}
		wg.Wait()
		t2 := time.Now()
		startTotal += t1.Sub(t0)
		joinTotal += t2.Sub(t1)
		b.StopTimer()
		for r, err := range errs {
			if err != nil {
				b.Fatalf("rank %d: %v", r, err)
			}
		}
		for _, g := range groups {
			g.Close()
		}
		e.Close()
		cancel()
		b.StartTimer()
	}
	b.ReportMetric(float64(startTotal.Milliseconds())/float64(b.N), "etcd-start-ms/op")
	b.ReportMetric(float64(joinTotal.Milliseconds())/float64(b.N), "join-ms/op")
}
