package transporttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
)

// MemExchange is an in-memory transport.Exchange for tests. Its zero value
// is not usable; call NewMemExchange.
type MemExchange struct {
	mu      sync.Mutex
	vals    map[string][]byte
	changed chan struct{}
}

// NewMemExchange returns an empty exchange shared by all ranks of a test.
func NewMemExchange() *MemExchange {
	return &MemExchange{vals: map[string][]byte{}, changed: make(chan struct{})}
}

// For returns the Exchange that rank uses.
func (m *MemExchange) For(rank int) transport.Exchange { return rankExchange{m, rank} }

type rankExchange struct {
	m    *MemExchange
	rank int
}

func (x rankExchange) Put(ctx context.Context, key string, value []byte) error {
	x.m.mu.Lock()
	defer x.m.mu.Unlock()
	k := fmt.Sprintf("%d/%s", x.rank, key)
	if _, dup := x.m.vals[k]; dup {
		return fmt.Errorf("exchange: rank %d published %q twice", x.rank, key)
	}
	x.m.vals[k] = append([]byte(nil), value...)
	close(x.m.changed)
	x.m.changed = make(chan struct{})
	return nil
}

func (x rankExchange) Get(ctx context.Context, rank int, key string) ([]byte, error) {
	k := fmt.Sprintf("%d/%s", rank, key)
	for {
		x.m.mu.Lock()
		v, ok := x.m.vals[k]
		ch := x.m.changed
		x.m.mu.Unlock()
		if ok {
			return v, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("exchange: waiting for rank %d's %q: %w", rank, key, ctx.Err())
		}
	}
}

// Configs returns the configs of a world of n ranks on host memory sharing
// one fresh MemExchange, with a short timeout suited to tests.
func Configs(group string, n int, timeout time.Duration) []transport.Config {
	ex := NewMemExchange()
	cfgs := make([]transport.Config, n)
	for r := range cfgs {
		cfgs[r] = transport.Config{Group: group, Rank: r, WorldSize: n, Device: mem.Host{}, Exchange: ex.For(r), Timeout: timeout}
	}
	return cfgs
}

// OpenAll opens every rank's endpoint concurrently (transports may block in
// Open until all ranks are there) and closes them at the end of the test.
func OpenAll(t testing.TB, ctx context.Context, open transport.Opener, cfgs []transport.Config) []transport.Endpoint {
	t.Helper()
	eps := make([]transport.Endpoint, len(cfgs))
	errs := make([]error, len(cfgs))
	var wg sync.WaitGroup
	for r := range cfgs {
		wg.Go(func() { eps[r], errs[r] = open(ctx, cfgs[r]) })
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, ep := range eps {
			if ep != nil {
				ep.Close()
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("open: %v", err)
	}
	return eps
}

// TestEndpoints runs the byte-transport conformance suite against open.
// Every subtest uses a fresh group name under prefix.
func TestEndpoints(t *testing.T, prefix string, open transport.Opener) {
	t.Run("RoundTrip", func(t *testing.T) { testRoundTrip(t, prefix+"-rt", open) })
	t.Run("ReceiverGone", func(t *testing.T) { testReceiverGone(t, prefix+"-gone", open) })
	t.Run("Cancel", func(t *testing.T) { testCancel(t, prefix+"-cancel", open) })
}

func testRoundTrip(t *testing.T, group string, open transport.Opener) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const world = 4
	eps := OpenAll(t, ctx, open, Configs(group, world, 20*time.Second))
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{0, 1, 7, 4096, 1 << 20, 3<<20 + 5}
	for range 10 {
		sizes = append(sizes, rng.IntN(2<<20))
	}
	bufs := make([]mem.Buffer, world)
	for r := range bufs {
		bufs[r], _ = mem.Host{}.Alloc(4 << 20)
	}
	for seq, n := range sizes {
		want := bufs[0].Host()[:n]
		for i := range want {
			want[i] = byte(rng.Uint32())
		}
		for r := 1; r < world; r++ {
			clear(bufs[r].Host())
		}
		var wg sync.WaitGroup
		errs := make([]error, world)
		for r := range world {
			wg.Go(func() { errs[r] = eps[r].Broadcast(ctx, uint64(seq), bufs[r], n) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("bucket %d (%d bytes): %v", seq, n, err)
		}
		for r := 1; r < world; r++ {
			if !bytes.Equal(bufs[r].Host()[:n], want) {
				t.Fatalf("bucket %d: rank %d received different bytes", seq, r)
			}
		}
	}
}

// testReceiverGone closes one receiver; the root's next broadcast must fail
// with an error rather than hang.
func testReceiverGone(t *testing.T, group string, open transport.Opener) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const world = 3
	eps := OpenAll(t, ctx, open, Configs(group, world, 3*time.Second))
	buf, _ := mem.Host{}.Alloc(1 << 20)
	eps[2].Close()
	done := make(chan error, 2)
	go func() { done <- eps[0].Broadcast(ctx, 0, buf, 1<<20) }()
	go func() {
		b, _ := mem.Host{}.Alloc(1 << 20)
		done <- eps[1].Broadcast(ctx, 0, b, 1<<20)
	}()
	var rootErr error
	for range 2 {
		select {
		case err := <-done:
			if err != nil && rootErr == nil {
				rootErr = err
			}
		case <-time.After(30 * time.Second):
			t.Fatal("broadcast hung after a receiver left")
		}
	}
	if rootErr == nil {
		t.Fatal("broadcast to a group with a departed receiver succeeded")
	}
	var te *transport.Error
	if !errors.As(rootErr, &te) {
		t.Fatalf("error is not a *transport.Error: %v", rootErr)
	}
}

// testCancel cancels the context while the root waits for receivers that
// never call Broadcast.
func testCancel(t *testing.T, group string, open transport.Opener) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eps := OpenAll(t, ctx, open, Configs(group, 2, time.Minute))
	buf, _ := mem.Host{}.Alloc(1 << 20)
	cctx, ccancel := context.WithCancel(ctx)
	go func() { time.Sleep(50 * time.Millisecond); ccancel() }()
	done := make(chan error, 1)
	go func() { done <- eps[0].Broadcast(cctx, 0, buf, buf.Len()) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("cancelled broadcast succeeded with no receiver")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("broadcast ignored cancellation")
	}
}
