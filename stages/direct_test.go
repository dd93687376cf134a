package stages

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/wire"
)

// directEP is a root endpoint whose receivers read its memory in place
// (the receivers here are goroutines of the root's process). It counts
// the buckets that reach Broadcast.
type directEP struct {
	transport.Endpoint
	mu    sync.Mutex
	moved int
	// receivers is what Receivers says; 0 says 1, which takes no turns.
	receivers int
}

func (e *directEP) ReadsDirect() bool { return true }
func (e *directEP) Receivers() int    { return max(e.receivers, 1) }

func (e *directEP) Broadcast(ctx context.Context, seq uint64, buf mem.Buffer, n int) error {
	e.mu.Lock()
	e.moved++
	e.mu.Unlock()
	return e.Endpoint.Broadcast(ctx, seq, buf, n)
}

// directSource is a model for direct rounds on d: device tensors that
// receivers can read in place (some sharing one allocation, others in
// their own), with, when mixed, tensors a direct bucket cannot take among
// them (host bytes, a cast, and device memory CUDA IPC cannot share: a
// view of pinned host memory, which the driver knows as no device
// allocation), and what every receiver must end up with.
func directSource(t *testing.T, d *gpu.CUDADevice, s *gpu.Stream, seed uint64, mixed bool) (tensorList, hostLookup) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed+1))
	devTs := randomTensors(rng, 40, 300<<10)
	exp := hostLookup{}
	var src tensorList
	for i, tn := range placeOnDevice(t, d, devTs, 20, 3) {
		gputest.Upload(t, s, tn.Device, int(tn.DeviceOffset), devTs[i].Data)
		exp[tn.Name] = &Tensor{Name: tn.Name, DType: tn.DType, Shape: tn.Shape, Data: devTs[i].Data}
		src = append(src, tn)
		if !mixed || i%13 != 5 {
			continue
		}
		// Something a direct bucket cannot take, every 13 tensors.
		data := gputest.RandomBytes(rng, 1000+i)
		var odd *Tensor
		switch i / 13 % 3 {
		case 0:
			odd = &Tensor{Name: fmt.Sprintf("host.%d", i), DType: dtype.U8, Shape: []int64{int64(len(data))}, Data: data}
		case 1:
			pinned := gputest.Alloc(t, d.PinnedHost(), len(data))
			copy(pinned.Host(), data)
			addr, _ := gpu.Address(pinned)
			view, err := d.View(addr, len(data))
			if err != nil {
				t.Fatal(err)
			}
			odd = &Tensor{Name: fmt.Sprintf("pinned.%d", i), DType: dtype.U8, Shape: []int64{int64(len(data))}, Device: view}
		default:
			f32 := gputest.RandomBytes(rng, 4*(100+i))
			for j := 3; j < len(f32); j += 4 {
				f32[j] &= 0x3f // finite values
			}
			odd = &Tensor{Name: fmt.Sprintf("cast.%d", i), DType: dtype.BF16, SourceDType: dtype.F32, Shape: []int64{int64(len(f32) / 4)}, Data: f32}
			data = make([]byte, len(f32)/2)
			if err := odd.ReadAt(data, 0); err != nil {
				t.Fatal(err)
			}
		}
		exp[odd.Name] = &Tensor{Name: odd.Name, DType: odd.DType, Shape: odd.Shape, Data: data}
		src = append(src, odd)
	}
	gputest.Sync(t, s)
	return src, exp
}

// runDirectRounds runs two rounds of src from a root whose receivers read
// in place, with and without checksums: one receiver into a device model
// (which load copies into from the sender's memory), one into a host
// model and a verifier (direct buckets gathered into its own buffers
// first). Every receiver must hold exp; it returns the root's stats of
// the last round, the buckets that reached the byte transport and what the
// sender logged.
func runDirectRounds(t *testing.T, d *gpu.CUDADevice, src tensorList, exp hostLookup, sum bool) (RoundStats, int, []string) {
	t.Helper()
	var ep *directEP
	g := newGPUGroup(t, d, 3, 256<<10, false, sum, func(r int, e transport.Endpoint) transport.Endpoint {
		if r == 0 {
			ep = &directEP{Endpoint: e}
			return ep
		}
		return e
	})
	var logs bytes.Buffer
	g.sender.packer.logger = slog.New(slog.NewTextHandler(&logs, nil))
	cs := &countedSource{src: src}
	pub := &firstPublish{Publisher: g.sender.cfg.Publisher, src: cs}
	g.sender.cfg.Publisher = pub
	st := runRounds(t, g, d, cs, exp)
	// Without MPS (the stand-in driver has none) the sender sums a run of
	// direct buckets before it publishes the first: by then it has taken
	// every tensor of an all-direct round. And direct buckets take no
	// buffer of the sender's pool, nor of the pool of a receiver that
	// copies them into its device model from where they lie; the
	// receiver that gathers them takes its own.
	if st.Direct == st.Buckets {
		if held := g.pools[0].MaxHeld(); held != 0 {
			t.Errorf("a round of direct buckets held %d of the sender's buffers; want none", held)
		}
		if held := g.pools[1].MaxHeld(); held != 0 {
			t.Errorf("the receiver copying direct buckets into its device model held %d of its buffers; want none", held)
		}
		if held := g.pools[2].MaxHeld(); held < 1 || held > DefaultBuffers {
			t.Errorf("the receiver gathering direct buckets held at most %d of its buffers; want 1 to %d", held, DefaultBuffers)
		}
		if sum && !d.MPS() && pub.sawBefore != len(src) {
			t.Errorf("the first bucket was published when %d of %d tensors had been taken; want every one: the round's checksums come first", pub.sawBefore, len(src))
		}
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if l != "" {
			lines = append(lines, l)
		}
	}
	return st, ep.moved, lines
}

// countedSource is a Source that counts the tensors taken from it.
type countedSource struct {
	src   tensorList
	taken atomic.Int64
}

func (c *countedSource) Tensors(ctx context.Context, emit func(*Tensor) error) error {
	for _, t := range c.src {
		c.taken.Add(1)
		if err := emit(t); err != nil {
			return err
		}
	}
	return nil
}

// firstPublish notes how many of src's tensors had been taken in the last
// round when its first message was published.
type firstPublish struct {
	transport.Publisher
	src       *countedSource
	sawBefore int
}

func (p *firstPublish) Publish(ctx context.Context, seq uint64, msg []byte) error {
	if m, err := wire.DecodeMeta(msg); err == nil && m.Index == 0 && len(m.Entries) > 0 { // a bucket, not the commit
		p.sawBefore = int(p.src.taken.Load())
		p.src.taken.Store(0) // the next round counts anew
	}
	return p.Publisher.Publish(ctx, seq, msg)
}

// runRounds runs two rounds of src through g, whose two receivers load
// into a device model and into a host model and a verifier, and checks that
// both hold exp after each; it returns the root's stats of the last round.
func runRounds(t *testing.T, g *group, d *gpu.CUDADevice, src Source, exp hostLookup) RoundStats {
	t.Helper()
	dm := newDevModel(t, d)
	hm := newMemModel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var st RoundStats
	for v := uint64(1); v <= 2; v++ {
		vs := verify(exp)
		errs := make(chan error, 1)
		go func() {
			var err error
			st, err = g.sender.Sync(ctx, src, v)
			errs <- err
		}()
		var wg sync.WaitGroup
		rerrs := make([]error, 2)
		for i, sink := range []Sink{dm, Sinks(hm, vs)} {
			wg.Go(func() { _, rerrs[i] = g.receivers[i].Sync(ctx, sink) })
		}
		wg.Wait()
		if err := errors.Join(append(rerrs, <-errs)...); err != nil {
			t.Fatalf("round %d: %v", v, err)
		}
		if _, err := dm.Verify(ctx, exp); err != nil {
			t.Fatalf("round %d: %v", v, err)
		}
		for name, w := range exp {
			if got, ok := hm.Get(name); !ok || !bytes.Equal(got.Data, w.Data) {
				t.Fatalf("round %d: the host model's %s differs", v, name)
			}
		}
		if vs.Tensors != len(exp) {
			t.Fatalf("round %d: the verifier checked %d of %d tensors", v, vs.Tensors, len(exp))
		}
	}
	return st
}

// TestDirectRoundsOnFakes runs direct rounds against gputest's stand-in
// driver (see TestDeviceRoundsOnFakes): the sender exports its
// allocations and leaves buckets unfilled, the receivers map them (here by
// address: they share the sender's process) and copy the tensors out, the
// checksums summed on the host where the layout kernel is missing. With
// tensors a direct bucket cannot take mixed in, their buckets are packed
// and broadcast as before, and the sender says once why.
func TestDirectRoundsOnFakes(t *testing.T) { gputest.RunWithFakes(t, "TestDirectRoundsOnFakesChild") }

// TestDirectRoundsOnFakesChild is the child side of TestDirectRoundsOnFakes.
func TestDirectRoundsOnFakesChild(t *testing.T) {
	gputest.InFakeChild(t)
	checkDirectRounds(t)
}

// TestGPUDirectRounds is TestDirectRoundsOnFakes on a GPU, with the
// layout kernel.
func TestGPUDirectRounds(t *testing.T) { checkDirectRounds(t) }

func checkDirectRounds(t *testing.T) {
	d := gputest.Device(t)
	s := gputest.Stream(t, d)
	for _, sum := range []bool{true, false} {
		t.Run(fmt.Sprintf("checksum=%v", sum), func(t *testing.T) {
			src, exp := directSource(t, d, s, 91, false)
			st, moved, logs := runDirectRounds(t, d, src, exp, sum)
			if st.Direct != st.Buckets || moved != 0 || len(logs) != 0 {
				t.Fatalf("device tensors only: %d of %d buckets direct, %d broadcast, logged %q; want all direct, none broadcast, nothing logged", st.Direct, st.Buckets, moved, logs)
			}
			src, exp = directSource(t, d, s, 92, true)
			st, moved, logs = runDirectRounds(t, d, src, exp, sum)
			if st.Direct == 0 || st.Direct == st.Buckets || moved != 2*(st.Buckets-st.Direct) {
				t.Fatalf("mixed: %d of %d buckets direct, %d broadcast in two rounds; want some of each, the others broadcast", st.Direct, st.Buckets, moved)
			}
			if len(logs) != 1 || !strings.Contains(logs[0], "cannot share") {
				t.Fatalf("the sender logged %q; want one line about memory CUDA IPC cannot share", logs)
			}
			t.Logf("mixed: %d of %d buckets direct; logged: %s", st.Direct, st.Buckets, logs[0])
		})
	}
}

// flipSumPublisher publishes bucket seq's metadata with a checksum that
// is not the bucket's.
type flipSumPublisher struct {
	transport.Publisher
	seq uint64
}

func (p *flipSumPublisher) Publish(ctx context.Context, seq uint64, msg []byte) error {
	if seq == p.seq {
		m, err := wire.DecodeMeta(msg)
		if err != nil {
			return err
		}
		m.Checksum ^= 1
		if msg, err = wire.EncodeMeta(m); err != nil {
			return err
		}
	}
	return p.Publisher.Publish(ctx, seq, msg)
}

// checkDirectMismatch checks that a direct bucket whose checksum is not
// that of the sender's tensors fails the round on a receiver that copies
// it into a device model from where it lies (found by load's copies: the
// model is left partial) and on one that gathers it into its own buffer
// for a host model (found before the sink sees it: the model stays
// intact).
func checkDirectMismatch(t *testing.T) {
	d := gputest.Device(t)
	s := gputest.Stream(t, d)
	src, _ := directSource(t, d, s, 93, false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range []struct {
		name string
		sink Sink
		want SinkState
	}{{"device model, read in place", newDevModel(t, d), StatePartial}, {"host model, gathered", newMemModel(), StateIntact}} {
		g := newGPUGroup(t, d, 2, 256<<10, false, true, func(r int, e transport.Endpoint) transport.Endpoint {
			if r == 0 {
				return &directEP{Endpoint: e}
			}
			return e
		})
		g.sender.cfg.Publisher = &flipSumPublisher{Publisher: g.sender.cfg.Publisher, seq: 0}
		err := roundCancel(ctx, g, src, 1, []Sink{c.sink})
		if err == nil || !strings.Contains(err.Error(), "failed its checksum") {
			t.Fatalf("%s: a direct bucket with a wrong checksum went unnoticed: %v", c.name, err)
		}
		if st := g.receivers[0].State(); st != c.want {
			t.Fatalf("%s: State() = %v after the mismatch, want %v", c.name, st, c.want)
		}
		t.Logf("%s, expected: %v", c.name, err)
	}
}

// TestDirectMismatchOnFakes runs checkDirectMismatch against the stand-in
// driver.
func TestDirectMismatchOnFakes(t *testing.T) {
	gputest.RunWithFakes(t, "TestDirectMismatchOnFakesChild")
}

// TestDirectMismatchOnFakesChild is the child side of
// TestDirectMismatchOnFakes.
func TestDirectMismatchOnFakesChild(t *testing.T) {
	gputest.InFakeChild(t)
	checkDirectMismatch(t)
}

// TestGPUDirectMismatch runs checkDirectMismatch on a GPU.
func TestGPUDirectMismatch(t *testing.T) { checkDirectMismatch(t) }

// TestDirectMetaRoundTrip encodes a direct bucket's metadata and decodes
// it back, and checks what DecodeMeta refuses in one: an entry with bytes
// but no source, a source in an allocation that is not listed or outside
// it, a handle or address that does not parse, and a source in a bucket
// that is not direct.
func TestDirectMetaRoundTrip(t *testing.T) {
	var h gpu.IPCHandle
	h[0], h[63] = 0xab, 0xcd
	good := func() *wire.BucketMeta {
		return &wire.BucketMeta{Seq: 4, Index: 1, Version: 2, Length: 192, Checksum: 0xfeed, HasChecksum: true,
			Entries: []wire.Entry{
				{Name: "a", DType: dtype.U8, Shape: []int64{100}, Offset: 0, Size: 100, Total: 100, Src: &wire.EntrySource{Alloc: 0, Offset: 4096}},
				{Name: "empty", DType: dtype.U8, Shape: []int64{0}, Offset: 100, Size: 0, Total: 0},
				{Name: "b", DType: dtype.U8, Shape: []int64{64}, Offset: 128, Size: 64, Total: 64, Src: &wire.EntrySource{Alloc: 1, Offset: 0}},
			},
			Direct: &wire.DirectInfo{PID: 77, Allocs: []wire.DirectAlloc{
				{Handle: h.String(), Size: 1 << 20, Addr: "7f0000000000"},
				{Handle: h.String(), Size: 64, Addr: "7f0000200000"},
			}},
		}
	}
	m := good()
	raw, err := wire.EncodeMeta(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := wire.DecodeMeta(raw)
	if err != nil {
		t.Fatal(err)
	}
	if got.Direct == nil || got.Direct.PID != 77 || len(got.Direct.Allocs) != 2 || got.Direct.Allocs[1] != m.Direct.Allocs[1] ||
		*got.Entries[0].Src != *m.Entries[0].Src || got.Entries[1].Src != nil || got.Checksum != 0xfeed {
		t.Fatalf("round trip changed the metadata:\n%s\n%+v", raw, got)
	}
	for name, c := range map[string]struct {
		edit func(m *wire.BucketMeta)
		want string
	}{
		"no source":         {func(m *wire.BucketMeta) { m.Entries[0].Src = nil }, "no source"},
		"unlisted alloc":    {func(m *wire.BucketMeta) { m.Entries[2].Src.Alloc = 2 }, "allocation 2 of 2"},
		"outside its alloc": {func(m *wire.BucketMeta) { m.Entries[2].Src.Offset = 1 }, "outside its 64-byte allocation"},
		"bad handle":        {func(m *wire.BucketMeta) { m.Direct.Allocs[0].Handle = "zz" }, "IPC handle"},
		"bad address":       {func(m *wire.BucketMeta) { m.Direct.Allocs[1].Addr = "-1" }, "do not place an allocation"},
		"not direct":        {func(m *wire.BucketMeta) { m.Direct = nil }, "not direct"},
	} {
		m := good()
		c.edit(m)
		raw, err := wire.EncodeMeta(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := wire.DecodeMeta(raw); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: DecodeMeta = %v, want an error saying %q", name, err, c.want)
		}
	}
}

// TestDirectMappingsOnFakes checks a receiver's cache of the sender's
// allocations against the stand-in driver (whose IPC handles open in the
// process that exported them, so a sender of another process id can be
// played here): each allocation mapped once and kept while rounds use it,
// a mapping that a whole round did not use closed at the next round's
// first direct bucket, and every mapping closed by close.
func TestDirectMappingsOnFakes(t *testing.T) {
	gputest.RunWithFakes(t, "TestDirectMappingsOnFakesChild")
}

// TestDirectMappingsOnFakesChild is the child side of
// TestDirectMappingsOnFakes.
func TestDirectMappingsOnFakesChild(t *testing.T) {
	gputest.InFakeChild(t)
	d := gputest.Device(t)
	bufs := []mem.Buffer{gputest.Alloc(t, d, 4096), gputest.Alloc(t, d, 8192)}
	allocs := make([]wire.DirectAlloc, len(bufs))
	for i, b := range bufs {
		h, err := d.ExportAddress(b.DevicePtr())
		if err != nil {
			t.Fatal(err)
		}
		allocs[i] = wire.DirectAlloc{Handle: h.String(), Size: int64(b.Len()), Addr: strconv.FormatUint(b.DevicePtr(), 16)}
	}
	meta := func(version uint64, use ...int) *wire.BucketMeta {
		m := &wire.BucketMeta{Version: version, Direct: &wire.DirectInfo{PID: os.Getpid() + 1}}
		for _, i := range use {
			m.Direct.Allocs = append(m.Direct.Allocs, allocs[i])
			m.Entries = append(m.Entries, wire.Entry{Name: fmt.Sprint(i), Size: 8, Src: &wire.EntrySource{Alloc: len(m.Direct.Allocs) - 1, Offset: 64}})
		}
		return m
	}
	mp := &mappings{dev: d}
	for _, step := range []struct {
		m    *wire.BucketMeta
		open int // mappings held after the bucket
	}{
		{meta(1, 0, 1), 2},
		{meta(1, 1), 2},
		{meta(2, 1), 2}, // allocation 0 was used in round 1: kept
		{meta(3, 1), 1}, // round 2 did not use allocation 0: closed
		{meta(3, 0, 1), 2},
	} {
		vs, _, err := mp.views(step.m)
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range vs {
			want := bufs[mustAtoi(t, step.m.Entries[i].Name)] // entries are named by their allocation
			if v.off != 64 || v.buf.DevicePtr() != want.DevicePtr() {
				t.Fatalf("round %d: entry %d mapped at %#x+%d, want %#x+64", step.m.Version, i, v.buf.DevicePtr(), v.off, want.DevicePtr())
			}
		}
		if len(mp.opened) != step.open {
			t.Fatalf("round %d: %d mappings held, want %d", step.m.Version, len(mp.opened), step.open)
		}
	}
	if err := mp.close(); err != nil || len(mp.opened) != 0 {
		t.Fatalf("close: %v, %d mappings left", err, len(mp.opened))
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDirectBucketOnHostPool: a direct bucket reaching a receiver whose
// buckets are host memory takes one of its buffers, as any bucket does,
// and fails in receive saying that it needs device buckets; no buffer
// stays held.
func TestDirectBucketOnHostPool(t *testing.T) {
	pool, err := NewPool(mem.Host{}, 2, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	meta := wire.BucketMeta{Version: 1, IsLast: true, Direct: newDirectInfo()}
	enc, err := wire.EncodeMeta(&meta)
	if err != nil {
		t.Fatal(err)
	}
	p := pipeline.New("receive")
	sub := &scriptedSubscriber{msgs: []transport.Message{{Seq: 0, Data: enc}}}
	collect(p, NewLoader().Receive(p, Subscribe(p, sub, pool, 0, nil), nil, nil), func(*Bucket) {})
	err = p.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "bucket 0 is direct") || !strings.Contains(err.Error(), "needs device buckets") {
		t.Fatalf("a direct bucket on a host pool: %v; want an error saying it needs device buckets", err)
	}
	if held := pool.Held(); held != 0 || pool.MaxHeld() != 1 {
		t.Fatalf("the pool holds %d buffers (at most %d); want the one the bucket took given back", held, pool.MaxHeld())
	}
}
