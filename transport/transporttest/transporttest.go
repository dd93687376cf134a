package transporttest

import (
	"context"
	"fmt"
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
	eps, err := openAll(ctx, open, cfgs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, ep := range eps {
			ep.Close()
		}
	})
	return eps
}
