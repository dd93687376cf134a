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

// BenchmarkRoundTrip measures one metadata message at a time from the root
// to one receiver over loopback TCP and its acknowledgement back: Publish,
// Recv, Ack, then Sync returning on the root; and, of that, the message's
// way alone, from Publish's call to Recv's return. With idle, both sides
// sleep that long between round trips (off the clock), as a colocated
// receiver waits for a round's first message while the sender sums its
// tensors: the one way is what that message waits between the sender's
// last checksum and the receiver's first copy (docs/benchmarks.md, "Main
// after both changes" and "The bus after an idle wait").
func BenchmarkRoundTrip(b *testing.B) {
	for _, idle := range []time.Duration{0, 3 * time.Millisecond} {
		b.Run(fmt.Sprintf("idle=%v", idle), func(b *testing.B) { benchRoundTrip(b, idle) })
	}
}

func benchRoundTrip(b *testing.B, idle time.Duration) {
	ctx := testContext(b, 10*time.Minute)
	pub, subs := openAll(b, ctx, transporttest.Configs("bench-rtt", 2, time.Minute))
	sub := subs[0]
	msg := make([]byte, 4<<10) // a 1 GiB bucket of 37 tensors' metadata is about this size
	sent, got := make([]time.Time, b.N+1), make([]time.Time, b.N+1)
	errs := make(chan error, 1)
	go func() {
		for k := range b.N + 1 {
			m, err := sub.Recv(ctx)
			got[k] = time.Now()
			if err == nil {
				err = sub.Ack(ctx, m.Seq)
			}
			if err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}()
	roundTrip := func(k int) {
		sent[k] = time.Now()
		if err := pub.Publish(ctx, uint64(k), msg); err != nil {
			b.Fatal(err)
		}
		if err := pub.Sync(ctx); err != nil {
			b.Fatal(err)
		}
	}
	roundTrip(0) // warm up
	b.ResetTimer()
	for k := range b.N {
		if idle > 0 {
			b.StopTimer()
			time.Sleep(idle)
			b.StartTimer()
		}
		roundTrip(k + 1)
	}
	b.StopTimer()
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	var way time.Duration
	for k := 1; k <= b.N; k++ {
		way += got[k].Sub(sent[k])
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/round-trip")
	b.ReportMetric(float64(way.Microseconds())/float64(b.N), "µs/one-way")
}
