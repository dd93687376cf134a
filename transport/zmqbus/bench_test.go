package zmqbus

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/transport/transporttest"
)

// BenchmarkPublish measures metadata messages per second from the root to
// 3 receivers over loopback TCP, each receiver acknowledging every message
// (transport.DefaultWindow messages in flight).
func BenchmarkPublish(b *testing.B) {
	for _, size := range []int{1 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("%dKiB-3subs", size>>10), func(b *testing.B) {
			ctx := testContext(b, 10*time.Minute)
			pub, subs := openAll(b, ctx, transporttest.Configs(fmt.Sprintf("bench-%d", size), 4, time.Minute))
			msg := make([]byte, size)
			b.SetBytes(int64(size))
			b.ResetTimer()
			start := time.Now()
			errs := make([]error, len(subs))
			var wg sync.WaitGroup
			for i, s := range subs {
				wg.Go(func() {
					for range b.N {
						m, err := s.Recv(ctx)
						if err == nil {
							err = s.Ack(ctx, m.Seq)
						}
						if err != nil {
							errs[i] = err
							return
						}
					}
				})
			}
			for k := range b.N {
				if err := pub.Publish(ctx, uint64(k), msg); err != nil {
					b.Fatal(err)
				}
			}
			if err := pub.Sync(ctx); err != nil {
				b.Fatal(err)
			}
			wg.Wait()
			b.StopTimer()
			if err := errors.Join(errs...); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}
