package zmqbus

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/transporttest"
)

// BenchmarkPublish measures metadata messages per second from the root to
// 3 receivers over loopback TCP, each receiver acknowledging every message
// (window 2).
func BenchmarkPublish(b *testing.B) {
	for _, size := range []int{1 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("%dKiB-3subs", size>>10), func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			cfgs := transporttest.Configs(fmt.Sprintf("bench-%d", size), 4, time.Minute)
			var (
				pub  transport.Publisher
				subs = make([]transport.Subscriber, len(cfgs))
				errs = make([]error, len(cfgs))
				wg   sync.WaitGroup
			)
			for r := range cfgs {
				wg.Go(func() {
					if r == 0 {
						pub, errs[0] = OpenPublisher(ctx, cfgs[0])
					} else {
						subs[r], errs[r] = OpenSubscriber(ctx, cfgs[r])
					}
				})
			}
			wg.Wait()
			defer func() {
				for _, s := range subs[1:] {
					if s != nil {
						s.Close()
					}
				}
				if pub != nil {
					pub.Close()
				}
			}()
			if err := errors.Join(errs...); err != nil {
				b.Fatal(err)
			}
			msg := make([]byte, size)
			b.SetBytes(int64(size))
			b.ResetTimer()
			start := time.Now()
			for r := 1; r < len(cfgs); r++ {
				wg.Go(func() {
					for range b.N {
						m, err := subs[r].Recv(ctx)
						if err == nil {
							err = subs[r].Ack(ctx, m.Seq)
						}
						if err != nil {
							errs[r] = err
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
