package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/internal/handshake"
	"github.com/weightcast/weightcast/transport/transporttest"
)

// conformance is the transport suite for tcp: host memory, ranks as
// goroutines and as processes.
var conformance = &transporttest.Suite{
	Name: Name, Open: Open, Memory: transporttest.HostMemory{},
	Ranks: transporttest.Goroutines | transporttest.Processes,
}

func TestMain(m *testing.M) { transporttest.Main(m, conformance) }

func TestConformance(t *testing.T) { conformance.Run(t) }

// broadcastAll runs one bucket on every rank and returns each rank's error.
func broadcastAll(ctx context.Context, eps []transport.Endpoint, seq uint64, bufs []mem.Buffer, n int) []error {
	errs := make([]error, len(eps))
	var wg sync.WaitGroup
	for r := range eps {
		wg.Go(func() { errs[r] = eps[r].Broadcast(ctx, seq, bufs[r], n) })
	}
	wg.Wait()
	return errs
}

func hostBufs(t testing.TB, n, size int) []mem.Buffer {
	t.Helper()
	bufs := make([]mem.Buffer, n)
	for i := range bufs {
		b, err := mem.Host{}.Alloc(size)
		if err != nil {
			t.Fatal(err)
		}
		bufs[i] = b
	}
	return bufs
}

// TestChainChunkSizes moves many buckets of odd sizes down a 4-rank chain
// with chunk sizes from 1 KiB to 16 MiB, two buffers per rank alternating,
// and checks every receiver's bytes.
func TestChainChunkSizes(t *testing.T) {
	const world = 4
	cases := []struct {
		chunk string
		sizes []int
	}{
		{"1KiB", []int{0, 1, 1023, 1024, 1025, 100_000, 1 << 20}},
		{"64KiB", []int{65535, 65536, 65537, 3<<20 + 11, 17}},
		{"4MiB", []int{4 << 20, 4<<20 + 1, 13<<20 + 7, 1}},
		{"16MiB", []int{16 << 20, 40<<20 + 3, 16<<20 - 1, 5}},
	}
	rng := rand.NewChaCha8([32]byte{3, 4})
	for _, c := range cases {
		t.Run(c.chunk, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cfgs := transporttest.Configs(t.Name(), world, 20*time.Second)
			for r := range cfgs {
				cfgs[r].Options = map[string]string{OptChunk: c.chunk}
			}
			eps := transporttest.OpenAll(t, ctx, Open, cfgs)
			maxN := slices.Max(c.sizes)
			bufs := [2][]mem.Buffer{hostBufs(t, world, maxN), hostBufs(t, world, maxN)}
			var seq uint64
			for round := range 2 {
				for _, n := range c.sizes {
					b := bufs[seq%2]
					want := b[0].Host()[:n]
					rng.Read(want)
					for r := 1; r < world; r++ {
						clear(b[r].Host())
					}
					if err := errors.Join(broadcastAll(ctx, eps, seq, b, n)...); err != nil {
						t.Fatalf("round %d bucket %d (%d bytes): %v", round, seq, n, err)
					}
					for r := 1; r < world; r++ {
						if !bytes.Equal(b[r].Host()[:n], want) {
							t.Fatalf("bucket %d (%d bytes): rank %d received different bytes", seq, n, r)
						}
						if tail := b[r].Host()[n:]; !bytes.Equal(tail, make([]byte, len(tail))) {
							t.Fatalf("bucket %d (%d bytes): rank %d wrote past the bucket", seq, n, r)
						}
					}
					seq++
				}
			}
		})
	}
}

// TestPeerGoneMidBucket closes rank 2 of 4 while a 64 MiB bucket is in the
// chain: rank 2's predecessors and successor must fail quickly with
// ErrPeerGone naming rank 2.
func TestPeerGoneMidBucket(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const world, n = 4, 64 << 20
	cfgs := transporttest.Configs(t.Name(), world, 20*time.Second)
	eps := transporttest.OpenAll(t, ctx, Open, cfgs)
	bufs := hostBufs(t, world, n)
	errs := make([]error, world)
	var wg sync.WaitGroup
	start := time.Now()
	for r := range 3 {
		wg.Go(func() { errs[r] = eps[r].Broadcast(ctx, 0, bufs[r], n) })
	}
	// Rank 3 is not reading yet, so the bucket is stuck inside the chain
	// once the socket buffers fill.
	time.Sleep(200 * time.Millisecond)
	eps[2].Close()
	errs[3] = eps[3].Broadcast(ctx, 0, bufs[3], n)
	wg.Wait()
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("failures took %v to surface", d)
	}
	for _, r := range []int{0, 1, 3} {
		var te *transport.Error
		switch {
		case !errors.As(errs[r], &te):
			t.Errorf("rank %d: want a *transport.Error, got %v", r, errs[r])
		case !errors.Is(errs[r], transport.ErrPeerGone) || te.Peer != 2:
			t.Errorf("rank %d: want ErrPeerGone naming rank 2, got %v", r, errs[r])
		default:
			t.Logf("rank %d: %v", r, errs[r])
		}
	}
	if !errors.Is(errs[2], transport.ErrClosed) {
		t.Errorf("rank 2 (closed): want ErrClosed, got %v", errs[2])
	}
	// Broken endpoints keep returning their first error.
	for _, r := range []int{0, 1, 3} {
		if err := eps[r].Broadcast(ctx, 1, bufs[r], 10); err != errs[r] {
			t.Errorf("rank %d after failure: got %v, want the first error %v", r, err, errs[r])
		}
	}
}

func openPair(t *testing.T, ctx context.Context, cfgs []transport.Config) []error {
	t.Helper()
	errs := make([]error, len(cfgs))
	var wg sync.WaitGroup
	for r := range cfgs {
		wg.Go(func() {
			ep, err := Open(ctx, cfgs[r])
			if ep != nil {
				ep.Close()
			}
			errs[r] = err
		})
	}
	wg.Wait()
	return errs
}

// TestHandshakeRejects starts two ranks that disagree on the group or the
// world size: the dialer fails at once, naming the disagreement; the
// receiver, which cannot trust a peer that failed its handshake, refuses
// the connection and keeps waiting, and its timeout names what it refused.
func TestHandshakeRejects(t *testing.T) {
	t.Parallel() // each case waits out a 2 s handshake timeout
	cases := []struct {
		name string
		edit func([]transport.Config)
		want string
	}{
		{"group", func(c []transport.Config) { c[1].Group = "other-group" }, `group "other-group"`},
		{"world", func(c []transport.Config) { c[0].WorldSize = 3 }, "start every rank with the same world size"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cfgs := transporttest.Configs(t.Name(), 2, 10*time.Second)
			cfgs[1].Timeout = 2 * time.Second
			c.edit(cfgs)
			start := time.Now()
			errs := openPair(t, ctx, cfgs)
			if d := time.Since(start); d > 8*time.Second {
				t.Errorf("rejection took %v", d)
			}
			var te *transport.Error
			if err := errs[0]; !errors.As(err, &te) || !errors.Is(err, ErrHandshake) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("dialer: want a handshake rejection mentioning %q, got %v", c.want, err)
			}
			if err := errs[1]; !errors.Is(err, transport.ErrTimeout) || !strings.Contains(err.Error(), "refused 1 connection") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("receiver: want a timeout naming the refused connection and %q, got %v", c.want, err)
			}
			t.Logf("dialer: %v", errs[0])
			t.Logf("receiver: %v", errs[1])
		})
	}
}

// TestHandshakeWrongRank dials a receiver pretending to be a rank that is
// not its predecessor: the pretender hears why, the receiver refuses it and
// opens with its real predecessor.
func TestHandshakeWrongRank(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfgs := transporttest.Configs(t.Name(), 3, 10*time.Second)
	eps := make([]transport.Endpoint, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	wg.Go(func() { eps[2], errs[2] = Open(ctx, cfgs[2]) })
	addr, err := cfgs[0].Exchange.Get(ctx, 2, AddrKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", string(addr))
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = handshake.Dial(c, proto, handshake.Side{Group: cfgs[0].Group, Rank: 0, World: 3}, func(handshake.Hello) string { return "" })
	c.Close()
	if !errors.Is(err, ErrHandshake) || !strings.Contains(err.Error(), "rank 0 connected where rank 2's neighbour must be rank 1") {
		t.Fatalf("the pretender heard %v", err)
	}
	for _, r := range []int{0, 1} {
		wg.Go(func() { eps[r], errs[r] = Open(ctx, cfgs[r]) })
	}
	wg.Wait()
	for r := range eps {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		defer eps[r].Close()
	}
	bufs := hostBufs(t, 3, 100)
	copy(bufs[0].Host(), "hello")
	if err := errors.Join(broadcastAll(ctx, eps, 0, bufs, 5)...); err != nil {
		t.Fatal(err)
	}
}

// TestStrangerIgnored connects something that is not a peer to a receiver
// before its predecessor: the receiver drops it and opens normally.
func TestStrangerIgnored(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfgs := transporttest.Configs(t.Name(), 2, 10*time.Second)
	type res struct {
		ep  transport.Endpoint
		err error
	}
	done := make(chan res, 1)
	go func() {
		ep, err := Open(ctx, cfgs[1])
		done <- res{ep, err}
	}()
	addr, err := cfgs[0].Exchange.Get(ctx, 1, AddrKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", string(addr))
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	c.Close()
	root, err := Open(ctx, cfgs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.ep.Close()
	bufs := hostBufs(t, 2, 100)
	copy(bufs[0].Host(), "hello")
	if err := errors.Join(broadcastAll(ctx, []transport.Endpoint{root, r.ep}, 0, bufs, 5)...); err != nil {
		t.Fatal(err)
	}
	if got := string(bufs[1].Host()[:5]); got != "hello" {
		t.Fatalf("got %q", got)
	}
}

func TestMismatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	eps := transporttest.OpenAll(t, ctx, Open, transporttest.Configs(t.Name(), 3, 10*time.Second))
	bufs := hostBufs(t, 3, 1000)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = eps[0].Broadcast(ctx, 7, bufs[0], 1000) })
	wg.Go(func() { errs[1] = eps[1].Broadcast(ctx, 8, bufs[1], 1000) })
	wg.Go(func() { errs[2] = eps[2].Broadcast(ctx, 7, bufs[2], 1000) })
	wg.Wait()
	if err := errs[1]; err == nil || !strings.Contains(err.Error(), "the root sent bucket 7 of 1000 bytes, this rank expected bucket 8 of 1000 bytes") {
		t.Errorf("rank 1: want a mismatch error naming both buckets, got %v", err)
	}
	for _, r := range []int{0, 2} {
		var te *transport.Error
		if !errors.As(errs[r], &te) || te.Peer != 1 || !strings.Contains(errs[r].Error(), "expected bucket 8") {
			t.Errorf("rank %d: want an error naming rank 1 and its complaint, got %v", r, errs[r])
		}
	}
}

// TestReceiverCancelled cancels a receiver waiting for a bucket; the root's
// next broadcast fails at once, naming that receiver.
func TestReceiverCancelled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	eps := transporttest.OpenAll(t, ctx, Open, transporttest.Configs(t.Name(), 3, 20*time.Second))
	bufs := hostBufs(t, 3, 8<<20)
	cctx, ccancel := context.WithCancel(ctx)
	go func() { time.Sleep(50 * time.Millisecond); ccancel() }()
	if err := eps[2].Broadcast(cctx, 0, bufs[2], 8<<20); !errors.Is(err, context.Canceled) {
		t.Fatalf("rank 2: want context.Canceled, got %v", err)
	}
	start := time.Now()
	errs := broadcastAll(ctx, eps[:2], 0, bufs[:2], 8<<20)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
	for r, err := range errs {
		var te *transport.Error
		if !errors.As(err, &te) || te.Peer != 2 || !strings.Contains(err.Error(), "context canceled") {
			t.Errorf("rank %d: want an error naming rank 2 and its cancellation, got %v", r, err)
		}
	}
}

// TestContextDeadline bounds a root broadcast by the caller's deadline,
// shorter than the transport's timeout.
func TestContextDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	eps := transporttest.OpenAll(t, ctx, Open, transporttest.Configs(t.Name(), 2, time.Minute))
	buf := hostBufs(t, 1, 64<<20)[0]
	dctx, dcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer dcancel()
	start := time.Now()
	err := eps[0].Broadcast(dctx, 0, buf, buf.Len())
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("want context.DeadlineExceeded soon, got %v after %v", err, time.Since(start))
	}
}

type deviceBuffer struct{}

func (deviceBuffer) Len() int                 { return 1 << 20 }
func (deviceBuffer) Host() []byte             { return nil }
func (deviceBuffer) DevicePtr() uint64        { return 0xd000 }
func (deviceBuffer) Device() mem.Device       { return fakeGPU{} }
func (deviceBuffer) Free() error              { return nil }
func (fakeGPU) Name() string                  { return "fake GPU" }
func (fakeGPU) Kind() mem.Kind                { return mem.KindCUDA }
func (fakeGPU) Alloc(int) (mem.Buffer, error) { return deviceBuffer{}, nil }

type fakeGPU struct{}

func TestDeviceMemoryRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := transporttest.Configs(t.Name(), 2, time.Second)[0]
	cfg.Device = fakeGPU{}
	if _, err := Open(ctx, cfg); err == nil || !strings.Contains(err.Error(), "host memory only") {
		t.Errorf("Open on a GPU device: want a clear refusal, got %v", err)
	}
	eps := transporttest.OpenAll(t, ctx, Open, transporttest.Configs(t.Name()+"-bc", 2, 10*time.Second))
	err := eps[0].Broadcast(ctx, 0, deviceBuffer{}, 100)
	if err == nil || !strings.Contains(err.Error(), "not host memory") {
		t.Errorf("Broadcast of a device buffer: want a clear refusal, got %v", err)
	}
	// The receiver learns why instead of waiting for its timeout.
	err = eps[1].Broadcast(ctx, 0, hostBufs(t, 1, 100)[0], 100)
	if err == nil || !strings.Contains(err.Error(), "not host memory") {
		t.Errorf("receiver: want the root's reason, got %v", err)
	}
}

func TestOptions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []struct {
		opts map[string]string
		want string
	}{
		{map[string]string{OptChunk: "lots"}, "give a size"},
		{map[string]string{OptChunk: "12"}, "between 1KiB and 1GiB"},
		{map[string]string{"chunks": "1MiB"}, "unknown option(s) chunks"},
		{map[string]string{OptBind: "0.0.0.0"}, "set option advertise"},
	} {
		cfg := transporttest.Configs(t.Name(), 2, time.Second)[1]
		cfg.Options = c.opts
		if _, err := Open(ctx, cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("options %v: want an error mentioning %q, got %v", c.opts, c.want, err)
		}
	}
	// A wildcard bind with an advertised host publishes that host.
	cfgs := transporttest.Configs(t.Name()+"-adv", 2, 10*time.Second)
	cfgs[1].Options = map[string]string{OptBind: "0.0.0.0", OptAdvertise: "127.0.0.1", OptChunk: "1MiB"}
	eps := transporttest.OpenAll(t, ctx, Open, cfgs)
	addr, _ := cfgs[0].Exchange.Get(ctx, 1, AddrKey)
	if !strings.HasPrefix(string(addr), "127.0.0.1:") {
		t.Errorf("published %q, want the advertised host", addr)
	}
	bufs := hostBufs(t, 2, 3<<20)
	if err := errors.Join(broadcastAll(ctx, eps, 0, bufs, 3<<20)...); err != nil {
		t.Fatal(err)
	}
}

// TestClosedRootSeenByReceiver: a receiver whose root closed learns it at
// its next Broadcast, as ErrPeerGone naming rank 0 (the suite checks Close
// itself).
func TestClosedRootSeenByReceiver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	eps := transporttest.OpenAll(t, ctx, Open, transporttest.Configs(t.Name(), 2, 10*time.Second))
	if err := eps[0].Close(); err != nil {
		t.Fatal(err)
	}
	err := eps[1].Broadcast(ctx, 0, hostBufs(t, 1, 10)[0], 10)
	var te *transport.Error
	if !errors.Is(err, transport.ErrPeerGone) || !errors.As(err, &te) || te.Peer != 0 {
		t.Fatalf("receiver of a closed root: want ErrPeerGone naming rank 0, got %v", err)
	}
}

func TestOpenTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfgs := transporttest.Configs(t.Name(), 3, 300*time.Millisecond)
	// Rank 1 alone: its successor never publishes, its predecessor never dials.
	_, err := Open(ctx, cfgs[1])
	if !errors.Is(err, transport.ErrTimeout) {
		t.Fatalf("want ErrTimeout, got %v", err)
	}
	t.Log(err)
}

// TestCancelledBeforeStart hands the root an already-cancelled context: no
// byte of the bucket moves and the receiver learns why at once.
func TestCancelledBeforeStart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	eps := transporttest.OpenAll(t, ctx, Open, transporttest.Configs(t.Name(), 2, 20*time.Second))
	bufs := hostBufs(t, 2, 1<<20)
	cctx, ccancel := context.WithCancel(ctx)
	ccancel()
	if err := eps[0].Broadcast(cctx, 0, bufs[0], 1<<20); !errors.Is(err, context.Canceled) {
		t.Fatalf("root: want context.Canceled, got %v", err)
	}
	err := eps[1].Broadcast(ctx, 0, bufs[1], 1<<20)
	var te *transport.Error
	if !errors.As(err, &te) || te.Peer != 0 || !strings.Contains(err.Error(), "context canceled") {
		t.Fatalf("receiver: want the root's cancellation, got %v", err)
	}
}

// TestCancelledMidBucket cancels the root (a cancellation, not a deadline:
// the pipeline cancels a round when another stage fails) while a 64 MiB
// bucket is stuck in the socket buffers of a receiver not yet reading. The
// root must return at once, not after its timeout, and the receiver must
// learn of it as soon as it reads.
func TestCancelledMidBucket(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 64 << 20
	eps := transporttest.OpenAll(t, ctx, Open, transporttest.Configs(t.Name(), 2, 30*time.Second))
	bufs := hostBufs(t, 2, n)
	cctx, ccancel := context.WithCancel(ctx)
	stop := context.AfterFunc(ctx, ccancel)
	defer stop()
	timer := time.AfterFunc(100*time.Millisecond, ccancel)
	defer timer.Stop()
	start := time.Now()
	err := eps[0].Broadcast(cctx, 0, bufs[0], n)
	if d := time.Since(start); !errors.Is(err, context.Canceled) || d > 5*time.Second {
		t.Fatalf("root: want context.Canceled at once, got %v after %v", err, d)
	}
	start = time.Now()
	err = eps[1].Broadcast(ctx, 0, bufs[1], n)
	var te *transport.Error
	if d := time.Since(start); !errors.As(err, &te) || te.Peer != 0 || d > 5*time.Second {
		t.Fatalf("receiver: want an error naming rank 0 at once, got %v after %v", err, d)
	}
}

// TestArmAfterFail: once an operation has failed, arming a connection's
// deadline (as the acknowledgement wait does after the bucket's last write)
// must leave it expired, so that a reader still blocked on it returns
// instead of waiting out the timeout.
func TestArmAfterFail(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
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
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	peer, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	defer peer.Close()

	o := &op{e: &endpoint{down: c}, ctx: context.Background(), done: make(chan struct{})}
	o.fail(&fault{peer: -1, err: context.Canceled})
	for _, write := range []bool{false, true} {
		if o.arm(c, write, time.Now().Add(time.Hour)) {
			t.Fatalf("arm (write %v) after fail reported the operation running", write)
		}
	}
	watchdog := time.AfterFunc(5*time.Second, func() { c.Close() })
	defer watchdog.Stop()
	start := time.Now()
	_, err = c.Read(make([]byte, 1))
	if !isTimeout(err) {
		t.Fatalf("read after a failed arm: want an expired deadline at once, got %v after %v", err, time.Since(start))
	}
}

// TestCancelMidFrame cancels the root while a receiver is reading a large
// bucket, so that the root stops inside a chunk frame: it finishes that
// frame and sends its abort, and the receiver fails with the root's
// reason, not with a closed connection.
func TestCancelMidFrame(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 64 << 20
	bufs := hostBufs(t, 2, n)
	cut := 0 // tries whose cancellation cut the frame
	for i := range 5 {
		eps := transporttest.OpenAll(t, ctx, Open, transporttest.Configs(fmt.Sprintf("%s-%d", t.Name(), i), 2, 30*time.Second))
		cctx, ccancel := context.WithCancel(ctx)
		var rootErr error
		var wg sync.WaitGroup
		wg.Go(func() { rootErr = eps[0].Broadcast(cctx, 0, bufs[0], n) })
		timer := time.AfterFunc(time.Duration(1+3*i)*time.Millisecond, ccancel)
		start := time.Now()
		err := eps[1].Broadcast(ctx, 0, bufs[1], n)
		wg.Wait()
		timer.Stop()
		ccancel()
		if rootErr == nil || err == nil {
			// The cancellation came after the last byte left the root
			// (it may still fail its acknowledgement wait): the receiver
			// rightly has the whole bucket.
			t.Logf("try %d: the bucket moved before the cancellation", i)
			continue
		}
		cut++
		var te *transport.Error
		if d := time.Since(start); !errors.As(err, &te) || te.Peer != 0 || errors.Is(err, transport.ErrPeerGone) ||
			!strings.Contains(err.Error(), "context canceled") || d > 5*time.Second {
			t.Fatalf("try %d: receiver: want the root's cancellation naming rank 0, got %v after %v", i, err, d)
		}
	}
	if cut == 0 {
		t.Skip("no try's cancellation came before the bucket had moved; nothing was checked")
	}
}

// TestPairsConformance runs the point-to-point suite on tcp's pairs.
func TestPairsConformance(t *testing.T) {
	(&transporttest.PairsSuite{Name: Name, Open: OpenPairs, Memory: transporttest.HostMemory{}}).Run(t)
}

// TestPairsOfChain runs the point-to-point suite on pairs made of tcp's
// two-rank chains (transport.PairsOf), the way ipc makes its pairs.
func TestPairsOfChain(t *testing.T) {
	(&transporttest.PairsSuite{Name: Name + "-of", Open: transport.PairsOf(Open), Memory: transporttest.HostMemory{}}).Run(t)
}
