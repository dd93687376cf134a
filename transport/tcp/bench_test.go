package tcp

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/auth/authtest"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/transporttest"
)

// benchTotal is what one benchmark operation moves from the root.
const benchTotal = 1 << 30

func reportGBps(b *testing.B, total int) {
	b.ReportMetric(float64(total)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}

// BenchmarkLoopbackBaseline is the yardstick: 1 GiB per operation over one
// plain loopback TCP connection between two goroutines, io.Copy from a
// 64 MiB source sixteen times on one side, io.ReadFull into a 64 MiB
// buffer on the other.
func BenchmarkLoopbackBaseline(b *testing.B) {
	const bucket = 64 << 20
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	tx, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Close()
	rx, ok := <-accepted
	if !ok {
		b.Fatal("accept failed")
	}
	defer rx.Close()
	src, dst := make([]byte, bucket), make([]byte, bucket)
	for i := range src {
		src[i] = byte(i * 7)
	}
	b.SetBytes(benchTotal)
	b.ResetTimer()
	for range b.N {
		done := make(chan error, 1)
		go func() {
			for range benchTotal / bucket {
				if _, err := io.ReadFull(rx, dst); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		for range benchTotal / bucket {
			if _, err := io.Copy(tx, bytes.NewReader(src)); err != nil {
				b.Fatal(err)
			}
		}
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportGBps(b, benchTotal)
}

// BenchmarkBroadcast moves 1 GiB per operation from the root down a chain
// of 1 or 3 receivers, in buckets of 64 or 256 MiB, two buffers per rank
// alternating as the pipeline's pool does. GB/s counts the bytes the root
// sends (every receiver gets all of them).
func BenchmarkBroadcast(b *testing.B) {
	for _, receivers := range []int{1, 3} {
		for _, bucket := range []int{64 << 20, 256 << 20} {
			b.Run(fmt.Sprintf("receivers=%d/bucket=%dMiB", receivers, bucket>>20), func(b *testing.B) {
				benchBroadcast(b, receivers+1, bucket, nil, nil)
			})
		}
	}
}

// BenchmarkChunk varies the chunk size, with 64 MiB buckets.
func BenchmarkChunk(b *testing.B) {
	for _, receivers := range []int{1, 3} {
		for _, chunk := range []string{"64KiB", "256KiB", "1MiB", "4MiB", "16MiB"} {
			b.Run(fmt.Sprintf("receivers=%d/chunk=%s", receivers, chunk), func(b *testing.B) {
				benchBroadcast(b, receivers+1, 64<<20, map[string]string{OptChunk: chunk}, nil)
			})
		}
	}
}

// BenchmarkTLS runs the chain over mutual TLS 1.3 (AES-GCM, with a group
// secret for the handshake) against plain TCP, 64 MiB buckets.
func BenchmarkTLS(b *testing.B) {
	ca, secret := authtest.NewCA(b), authtest.Secret(b)
	for _, receivers := range []int{1, 3} {
		for _, tls := range []bool{false, true} {
			name := map[bool]string{false: "plain", true: "tls"}[tls]
			b.Run(fmt.Sprintf("receivers=%d/%s", receivers, name), func(b *testing.B) {
				benchBroadcast(b, receivers+1, 64<<20, nil, func(c *transport.Config) {
					if tls {
						c.TLS = ca.TLS(b)
						c.Auth = authtest.Keys(b, secret, c.Group, "bench")
					}
				})
			})
		}
	}
}

func benchBroadcast(b *testing.B, world, bucket int, opts map[string]string, edit func(*transport.Config)) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cfgs := transporttest.Configs(b.Name(), world, time.Minute)
	for r := range cfgs {
		cfgs[r].Options = opts
		if edit != nil {
			edit(&cfgs[r])
		}
	}
	eps := transporttest.OpenAll(b, ctx, Open, cfgs)
	bufs := make([][2]mem.Buffer, world)
	for r := range bufs {
		for i := range 2 {
			buf, err := mem.Host{}.Alloc(bucket)
			if err != nil {
				b.Fatal(err)
			}
			bufs[r][i] = buf
		}
	}
	for i, x := range bufs[0][0].Host() {
		bufs[0][0].Host()[i], bufs[0][1].Host()[i] = byte(i), x^0x5a
	}
	var seq uint64
	b.SetBytes(benchTotal)
	b.ResetTimer()
	for range b.N {
		var wg sync.WaitGroup
		errs := make([]error, world)
		for r := range world {
			wg.Go(func() {
				for k := range benchTotal / bucket {
					s := seq + uint64(k)
					if err := eps[r].Broadcast(ctx, s, bufs[r][s%2], bucket); err != nil {
						errs[r] = err
						return
					}
				}
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		seq += benchTotal / uint64(bucket)
	}
	b.StopTimer()
	reportGBps(b, benchTotal)
}
