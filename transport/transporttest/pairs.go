package transporttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
)

// PairsSuite is the conformance suite of a point-to-point transport
// (transport.Pairs), with ranks as goroutines of the test: every sender
// streams buckets of odd sizes to every receiver at once, both ways of a
// schedule mismatch fail naming the peer, and a sender that closes midway
// fails its receivers with ErrPeerGone naming it, within the timeout.
type PairsSuite struct {
	Name   string
	Open   transport.PairsOpener
	Memory Memory
	// Ordinal places rank r of a group whose ranks below senders send on
	// a device of Memory (nil: all on 0).
	Ordinal func(rank, senders int) int
	// MinDevices is how many devices of Memory the suite needs (a
	// transport whose pairs cannot share one); fewer skip it.
	MinDevices int
}

// Run runs every case of the suite.
func (s *PairsSuite) Run(t *testing.T) {
	t.Run("Streams", func(t *testing.T) { s.streams(t, 2, 3) })
	t.Run("OneSender", func(t *testing.T) { s.streams(t, 1, 2) })
	t.Run("Mismatch", s.mismatch)
	t.Run("SenderGone", s.senderGone)
}

// pairRank is one rank of a suite's group: its endpoint, device and two
// buffers.
type pairRank struct {
	p    transport.Pairs
	dev  Device
	bufs [2]mem.Buffer
}

// open opens a group of world ranks of which senders send, each with two
// buffers of size bytes.
func (s *PairsSuite) open(t *testing.T, ctx context.Context, senders, world, size int, timeout time.Duration) []*pairRank {
	t.Helper()
	if n := s.Memory.Devices(t); n < s.MinDevices {
		t.Skipf("%s pairs need %d %s devices, %d found", s.Name, s.MinDevices, s.Memory.Name(), n)
	}
	cfgs := Configs(fmt.Sprintf("%s-pairs-%d", s.Name, time.Now().UnixNano()), world, timeout)
	ranks := make([]*pairRank, world)
	for r := range cfgs {
		ord := 0
		if s.Ordinal != nil {
			ord = s.Ordinal(r, senders)
		}
		dev, err := s.Memory.Open(ord)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dev.Close() })
		pr := &pairRank{dev: dev}
		for i := range pr.bufs {
			if pr.bufs[i], err = dev.Mem().Alloc(size); err != nil {
				t.Fatal(err)
			}
			b := pr.bufs[i]
			t.Cleanup(func() { b.Free() })
		}
		cfgs[r].Senders, cfgs[r].Device = senders, dev.Mem()
		ranks[r] = pr
	}
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range ranks {
		wg.Go(func() { ranks[r].p, errs[r] = s.Open(ctx, cfgs[r]) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: open: %v", r, err)
		}
		p := ranks[r].p
		t.Cleanup(func() { p.Close() })
	}
	return ranks
}

// pairBytes is bucket seq of the pair from → to: n bytes that differ per
// pair and bucket.
func pairBytes(from, to int, seq uint64, n int) []byte {
	b := make([]byte, n)
	x := uint32(from*7919+to*104729) ^ uint32(seq*2654435761)
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
	return b
}

// pairSizes are the sizes of a pair's buckets, in order.
var pairSizes = []int{1, 4096, 0, 100003, 1 << 20, 17}

func (s *PairsSuite) streams(t *testing.T, senders, receivers int) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	world := senders + receivers
	ranks := s.open(t, ctx, senders, world, 1<<20, 20*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 2*senders*receivers)
	for from := range senders {
		for to := senders; to < world; to++ {
			wg.Go(func() {
				for seq, n := range pairSizes {
					pr := ranks[from]
					b, err := pr.dev.Mem().Alloc(max(n, 1))
					if err != nil {
						errs <- err
						return
					}
					defer b.Free()
					b, err = pr.dev.Pack(b, pairBytes(from, to, uint64(seq), n))
					if err == nil {
						err = pr.p.Send(ctx, to, uint64(seq), b, n)
					}
					if err != nil {
						errs <- fmt.Errorf("rank %d sending bucket %d to %d: %w", from, seq, to, err)
						return
					}
				}
			})
		}
	}
	for to := senders; to < world; to++ {
		wg.Go(func() {
			for from := range senders {
				for seq, n := range pairSizes {
					pr := ranks[to]
					b := pr.bufs[from%2]
					if err := pr.p.Recv(ctx, from, uint64(seq), b, n); err != nil {
						errs <- fmt.Errorf("rank %d receiving bucket %d from %d: %w", to, seq, from, err)
						return
					}
					got, err := pr.dev.Read(ctx, b, 0, n)
					if err != nil {
						errs <- err
						return
					}
					if !bytes.Equal(got, pairBytes(from, to, uint64(seq), n)) {
						errs <- fmt.Errorf("rank %d: bucket %d from rank %d holds other bytes", to, seq, from)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// mismatch: a receiver that expects another bucket length fails naming
// the sender and the schedule.
func (s *PairsSuite) mismatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ranks := s.open(t, ctx, 1, 2, 4096, 10*time.Second)
	send := make(chan error, 1)
	go func() {
		b, err := ranks[0].dev.Pack(ranks[0].bufs[0], pairBytes(0, 1, 0, 100))
		if err == nil {
			err = ranks[0].p.Send(ctx, 1, 0, b, 100)
		}
		send <- err
	}()
	err := ranks[1].p.Recv(ctx, 0, 0, ranks[1].bufs[0], 200)
	var te *transport.Error
	if !errors.As(err, &te) || te.Peer != 0 {
		t.Fatalf("a receiver expecting 200 bytes where 100 came: %v; want a *transport.Error naming peer 0", err)
	}
	<-send
}

// senderGone: a receiver waiting on a sender that closes fails at once
// with ErrPeerGone naming it, not after the timeout.
func (s *PairsSuite) senderGone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ranks := s.open(t, ctx, 2, 3, 4096, 30*time.Second)
	go func() {
		time.Sleep(100 * time.Millisecond)
		ranks[1].p.Close()
	}()
	start := time.Now()
	err := ranks[2].p.Recv(ctx, 1, 0, ranks[2].bufs[0], 10)
	var te *transport.Error
	switch {
	case !errors.Is(err, transport.ErrPeerGone) || !errors.As(err, &te) || te.Peer != 1:
		t.Fatalf("receiving from a sender that closed: %v; want ErrPeerGone naming rank 1", err)
	case time.Since(start) > 10*time.Second:
		t.Fatalf("the receiver took %v to see its sender gone", time.Since(start))
	}
}
