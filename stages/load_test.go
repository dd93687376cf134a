package stages

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/wire"
)

// failAfter is a sink that keeps nothing and, when n > 0, fails at the n-th
// tensor of a round.
type failAfter struct{ n, seen int }

func (f *failAfter) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	if e.Chunk == 0 {
		f.seen++
	}
	if f.n > 0 && f.seen >= f.n {
		return errInjected
	}
	return nil
}

func (f *failAfter) Commit(ctx context.Context, version uint64) error { f.seen = 0; return nil }
func (f *failAfter) Holding() Holding                                 { return HoldsNothing }

// recordSink is a host sink that records what it was told.
type recordSink struct {
	mu                      sync.Mutex
	holds                   Holding
	begun, loaded, commits  int
	committed, flushes, dev int
}

func (s *recordSink) Begin(ctx context.Context, version uint64, info *wire.SourceInfo) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.begun++
	return nil
}

func (s *recordSink) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loaded++
	return nil
}

func (s *recordSink) Commit(ctx context.Context, version uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.commits++
	return nil
}

func (s *recordSink) Committed(ctx context.Context, version uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.committed++
	return nil
}

func (s *recordSink) Holding() Holding { return s.holds }

// recordDevice is a recordSink that takes device views too.
type recordDevice struct{ recordSink }

func (s *recordDevice) LoadDevice(ctx context.Context, e *wire.Entry, src mem.Buffer, off int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dev++
	return nil
}

func (s *recordDevice) Flush(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushes++
	return nil
}

// TestSinksCapabilities: sinks combined with Sinks (nested too) each keep
// their capabilities through a Receiver's round: every member is begun,
// loaded, committed and told of the group's commit, a DeviceSink is
// flushed after each bucket (host bytes copied to its GPU are done before
// the bucket goes back), and the set's Holding is its weakest member's.
func TestSinksCapabilities(t *testing.T) {
	a := &recordSink{holds: HoldsShadowed}
	d := &recordDevice{recordSink{holds: HoldsNothing}}
	set := Sinks(a, Sinks(d, newShadowModel()))
	if n := len(set.Unwrap()); n != 3 {
		t.Fatalf("a nested set has %d members, want 3", n)
	}
	g, st := commitGroup(t, groupFault{}, []Sink{set})
	if a.begun != 1 || d.begun != 1 || a.commits != 1 || d.commits != 1 || a.committed != 1 || d.committed != 1 {
		t.Fatalf("begun %d/%d, committed locally %d/%d, told of the group's commit %d/%d; want 1 each",
			a.begun, d.begun, a.commits, d.commits, a.committed, d.committed)
	}
	if a.loaded == 0 || d.loaded != a.loaded || d.dev != 0 {
		t.Fatalf("entries loaded %d and %d, device views %d (host buckets)", a.loaded, d.loaded, d.dev)
	}
	if d.flushes != st.Buckets {
		t.Fatalf("the device sink was flushed %d times for %d buckets", d.flushes, st.Buckets)
	}
	if v := g.receivers[0].Committed(); v != 1 {
		t.Fatalf("committed %d", v)
	}
	for _, c := range []struct {
		set  *SinkSet
		want Holding
	}{
		{set, HoldsShadowed},
		{Sinks(a, newMemModel()), HoldsInPlace},
		{Sinks(verify(roundModel(t, 1)), d), HoldsNothing},
		{Sinks(), HoldsNothing},
	} {
		if h := c.set.Holding(); h != c.want {
			t.Errorf("Holding of %d sinks = %v, want %v", len(c.set.Unwrap()), h, c.want)
		}
	}
}

// TestLoaderOneRoundAtATime: a Loader (or Packer) serves one round at a
// time, and refuses work after Close.
func TestLoaderOneRoundAtATime(t *testing.T) {
	ld := NewLoader()
	c, err := ld.takeCheck()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ld.takeCheck(); err == nil || !strings.Contains(err.Error(), "one round at a time") {
		t.Fatalf("a second unpack: %v", err)
	}
	if err := ld.Close(); err == nil {
		t.Fatal("Close while a round unpacks succeeded")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ld.keepCheck(ctx, c, false); err != nil {
		t.Fatal(err)
	}
	if err := ld.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ld.Close(); err != nil {
		t.Fatal("Close is not idempotent:", err)
	}
	if _, err := ld.takeLoad(newMemModel()); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("a round after Close: %v", err)
	}
	pk := NewPacker()
	pool, err := NewPool(mem.Host{}, DefaultBuffers, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pk.begin(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pk.begin(ctx, pool); err == nil || !strings.Contains(err.Error(), "one round at a time") {
		t.Fatalf("a second pack: %v", err)
	}
	if err := pk.end(ctx, nil, false); err != nil {
		t.Fatal(err)
	}
	if err := pk.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := pk.begin(ctx, pool); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("a round after Close: %v", err)
	}
}
