package stages

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/wire"
)

// errInjected is the failure each fault below injects.
var errInjected = errors.New("injected failure")

// failingSource yields good tensors, then fails.
type failingSource struct {
	list  []*Tensor
	after int
}

func (f failingSource) Tensors(ctx context.Context, emit func(*Tensor) error) error {
	for i, t := range f.list {
		if i == f.after {
			return errInjected
		}
		if err := emit(t); err != nil {
			return err
		}
	}
	return nil
}

// faultyEndpoint fails (or corrupts the landed bytes) at bucket seq.
type faultyEndpoint struct {
	transport.Endpoint
	seq     uint64
	corrupt bool
}

func (f *faultyEndpoint) Broadcast(ctx context.Context, seq uint64, buf mem.Buffer, n int) error {
	if seq == f.seq && !f.corrupt {
		return errInjected
	}
	err := f.Endpoint.Broadcast(ctx, seq, buf, n)
	if err == nil && seq == f.seq && n > 0 {
		buf.Host()[n/2] ^= 0x10 // a bit flipped in transit
	}
	return err
}

type faultyPublisher struct {
	transport.Publisher
	seq uint64
}

func (f *faultyPublisher) Publish(ctx context.Context, seq uint64, msg []byte) error {
	if seq == f.seq {
		return errInjected
	}
	return f.Publisher.Publish(ctx, seq, msg)
}

type faultySubscriber struct {
	transport.Subscriber
	seq      uint64
	truncate bool
}

func (f *faultySubscriber) Recv(ctx context.Context) (transport.Message, error) {
	m, err := f.Subscriber.Recv(ctx)
	if err == nil && m.Seq == f.seq {
		if f.truncate {
			m.Data = m.Data[:len(m.Data)/2]
			return m, nil
		}
		return m, errInjected
	}
	return m, err
}

type faultySink struct {
	Sink
	after int
	n     int
}

func (f *faultySink) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	if f.n++; f.n > f.after {
		return errInjected
	}
	return f.Sink.Load(ctx, e, data)
}

// TestFailureAnywhereStopsEveryRank injects a failure into each stage of
// the sender's and a receiver's pipeline in turn. Every rank must return an
// error (none may hang or report success), the failing rank's error must
// name the cause once, and every bucket buffer must be back in its pool.
func TestFailureAnywhereStopsEveryRank(t *testing.T) {
	model := synthetic(t, 2<<20, 40, 3)
	bad := append(tensorList(nil), model.List()...)
	bad[5] = &Tensor{Name: "bad", DType: dtype.F32, Shape: []int64{4}, Data: []byte{1, 2, 3}}
	dup := append(tensorList(nil), model.List()...)
	dup[7] = dup[3]

	cases := []struct {
		name  string
		src   Source
		fault groupFault
		want  string // text the failing rank's error carries
	}{
		{"iterate", failingSource{model.List(), 9}, groupFault{}, errInjected.Error()},
		{"pack-invalid-tensor", bad, groupFault{}, `tensor "bad"`},
		{"pack-duplicate-name", dup, groupFault{}, "appears twice"},
		{"publish", model, groupFault{pub: 3}, errInjected.Error()},
		{"broadcast-root", model, groupFault{ep: map[int]*faultyEndpoint{0: {seq: 2}}}, errInjected.Error()},
		{"subscribe", model, groupFault{sub: map[int]*faultySubscriber{2: {seq: 1}}}, errInjected.Error()},
		{"subscribe-truncated-metadata", model, groupFault{sub: map[int]*faultySubscriber{1: {seq: 2, truncate: true}}}, "malformed bucket metadata"},
		{"receive", model, groupFault{ep: map[int]*faultyEndpoint{1: {seq: 2}}}, errInjected.Error()},
		{"unpack-bit-flip", model, groupFault{ep: map[int]*faultyEndpoint{2: {seq: 1, corrupt: true}}}, "failed its checksum"},
		{"load", model, groupFault{sink: map[int]int{1: 10}}, errInjected.Error()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := newFaultyGroup(t, 3, 256<<10, c.fault)
			errs := g.roundClosingOnError(t, c.src, 1)
			var hits int
			for r, err := range errs {
				if err == nil {
					t.Errorf("rank %d reported success", r)
					continue
				}
				if strings.Contains(err.Error(), c.want) {
					hits++
					if c.want == "failed its checksum" && r == 2 && !errors.Is(err, ErrChecksum) {
						t.Errorf("rank %d's checksum failure does not wrap ErrChecksum: %v", r, err)
					}
					if n := strings.Count(err.Error(), c.want); n != 1 {
						t.Errorf("rank %d repeats the cause %d times: %v", r, n, err)
					}
				}
			}
			if hits == 0 {
				t.Errorf("no rank's error mentions %q: %v", c.want, errs)
			}
			for r, p := range g.pools {
				if p.Held() != 0 {
					t.Errorf("rank %d still holds %d buffers", r, p.Held())
				}
			}
		})
	}
}

type groupFault struct {
	pub  uint64 // publisher fails at this seq (0: never... seq 0 is never chosen)
	ep   map[int]*faultyEndpoint
	sub  map[int]*faultySubscriber
	sink map[int]int
}

type faultyGroup struct {
	*group
	fault groupFault
	links [][]func() error // per rank: what closing its connections means
}

func newFaultyGroup(t *testing.T, world, bucket int, f groupFault) *faultyGroup {
	fg := &faultyGroup{fault: f}
	fg.group = newGroup(t, groupOpts{world: world, bucket: bucket, checksum: true, wrapEP: func(rank int, ep transport.Endpoint) transport.Endpoint {
		if fe := f.ep[rank]; fe != nil {
			fe.Endpoint = ep
			return fe
		}
		return ep
	}})
	if f.pub != 0 {
		fg.sender.cfg.Publisher = &faultyPublisher{Publisher: fg.sender.cfg.Publisher, seq: f.pub}
	}
	for i, r := range fg.receivers {
		if fs := f.sub[i+1]; fs != nil {
			fs.Subscriber = r.cfg.Subscriber
			r.cfg.Subscriber = fs
		}
	}
	return fg
}

// roundClosingOnError runs one round; a rank whose Sync fails closes its
// connections at once, as a failed process's would close on exit, so the
// others notice.
func (g *faultyGroup) roundClosingOnError(t *testing.T, src Source, version uint64) []error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make([]error, len(g.receivers)+1)
	var wg sync.WaitGroup
	wg.Go(func() {
		_, errs[0] = g.sender.Sync(ctx, src, version)
		if errs[0] != nil {
			g.sender.cfg.Endpoint.Close()
			g.sender.cfg.Publisher.Close()
		}
	})
	for i, r := range g.receivers {
		wg.Go(func() {
			var sink Sink = &countSink{}
			if n, ok := g.fault.sink[i+1]; ok {
				sink = &faultySink{Sink: sink, after: n}
			}
			_, errs[i+1] = r.Sync(ctx, sink)
			if errs[i+1] != nil {
				r.cfg.Endpoint.Close()
				r.cfg.Subscriber.Close()
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(25 * time.Second):
		t.Fatal("a rank hung after the failure")
	}
	return errs
}

// TestBrokenAfterFailure: a rank whose round failed refuses the next one
// with ErrBroken rather than running with an unknown stream position.
func TestBrokenAfterFailure(t *testing.T) {
	model := synthetic(t, 1<<20, 13, 3)
	g := newFaultyGroup(t, 2, 64<<10, groupFault{pub: 1})
	g.roundClosingOnError(t, model, 1)
	if _, err := g.sender.Sync(context.Background(), model, 2); !errors.Is(err, ErrBroken) {
		t.Fatalf("second Sync after a failure: %v", err)
	}
}

// TestCancelMidRound cancels the context while buckets are in flight on
// every rank: all return promptly, and every buffer is back.
func TestCancelMidRound(t *testing.T) {
	model := synthetic(t, 16<<20, 40, 5)
	slow := func(rank int, ep transport.Endpoint) transport.Endpoint {
		return &slowEndpoint{Endpoint: ep, d: 20 * time.Millisecond}
	}
	g := newGroup(t, groupOpts{world: 3, bucket: 256 << 10, wrapEP: slow})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	err := g.round(ctx, model, 1, []Sink{&countSink{}, &countSink{}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("round = %v; want context.Canceled", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("cancellation took %v", d)
	}
	for r, p := range g.pools {
		if p.Held() != 0 {
			t.Errorf("rank %d still holds %d buffers", r, p.Held())
		}
	}
}

// slowEndpoint sleeps before each broadcast, as a slow link would.
type slowEndpoint struct {
	transport.Endpoint
	d time.Duration
}

func (s *slowEndpoint) Broadcast(ctx context.Context, seq uint64, buf mem.Buffer, n int) error {
	select {
	case <-time.After(s.d):
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Endpoint.Broadcast(ctx, seq, buf, n)
}

// TestDoubleBuffering: with a slow broadcast, the root packs bucket k+1
// while bucket k is being broadcast (read from the trace spans), and no
// rank ever holds more than two buffers, however many buckets the model
// takes.
func TestDoubleBuffering(t *testing.T) {
	model := synthetic(t, 8<<20, 60, 9)
	tr := pipeline.NewTracer(time.Now())
	slowRoot := func(rank int, ep transport.Endpoint) transport.Endpoint {
		if rank == 0 {
			return &slowEndpoint{Endpoint: ep, d: 10 * time.Millisecond}
		}
		return ep
	}
	g := newGroup(t, groupOpts{world: 3, bucket: 256 << 10, checksum: true, tracer: tr, wrapEP: slowRoot})
	if err := g.round(context.Background(), model, 1, []Sink{&countSink{}, &countSink{}}); err != nil {
		t.Fatal(err)
	}
	type span struct{ start, end float64 }
	pack, bcast := map[uint64]span{}, map[uint64]span{}
	for _, e := range tr.Events() {
		if e.Ph != "X" || e.Pid != 0 {
			continue
		}
		seq := e.Args["bucket"].(uint64)
		switch e.Cat {
		case "pack":
			pack[seq] = span{e.Ts, e.Ts + e.Dur}
		case "broadcast":
			bcast[seq] = span{e.Ts, e.Ts + e.Dur}
		}
	}
	if len(bcast) < 20 {
		t.Fatalf("only %d buckets; the test needs many", len(bcast))
	}
	overlaps := 0
	for k := range uint64(len(bcast) - 1) {
		p, b := pack[k+1], bcast[k]
		if p.start < b.end && b.start < p.end {
			overlaps++
		}
	}
	// Every bucket but the last few should overlap its predecessor's
	// broadcast; allow a little scheduling noise.
	if overlaps < (len(bcast)-1)*3/4 {
		t.Fatalf("packing bucket k+1 overlapped broadcasting bucket k for only %d of %d buckets", overlaps, len(bcast)-1)
	}
	for r, p := range g.pools {
		if p.MaxHeld() != DefaultBuffers {
			t.Errorf("rank %d held at most %d buffers; want exactly %d in use at the peak", r, p.MaxHeld(), DefaultBuffers)
		}
	}
}

func TestBadBucketSizes(t *testing.T) {
	for _, size := range []int{-1, 0, 1, MinBucketSize - 1} {
		if _, err := NewPool(mem.Host{}, 2, size); err == nil || !strings.Contains(err.Error(), "below the minimum") {
			t.Errorf("NewPool(size %d) = %v", size, err)
		}
	}
	if _, err := NewPool(mem.Host{}, 0, 4096); err == nil {
		t.Error("a pool of zero buffers was accepted")
	}
}

func TestDecodeMetaRejects(t *testing.T) {
	good := wire.BucketMeta{Seq: 3, Length: 100, Entries: []wire.Entry{{Name: "a", DType: dtype.F32, Shape: []int64{5}, Offset: 0, Size: 20, Total: 20}}, Checksum: 0xdeadbeefcafe, HasChecksum: true}
	enc, err := wire.EncodeMeta(&good)
	if err != nil {
		t.Fatal(err)
	}
	back, err := wire.DecodeMeta(enc)
	if err != nil || back.Checksum != good.Checksum || !back.HasChecksum || back.Entries[0].DType != dtype.F32 {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	mutate := func(f func(m *wire.BucketMeta)) []byte {
		m := good
		m.Entries = append([]wire.Entry(nil), good.Entries...)
		f(&m)
		b, _ := wire.EncodeMeta(&m)
		return b
	}
	cases := map[string][]byte{
		"truncated":       enc[:len(enc)/2],
		"oversized":       make([]byte, wire.MaxMetaSize+1),
		"not json":        []byte("bucket 3"),
		"past length":     mutate(func(m *wire.BucketMeta) { m.Length = 10 }),
		"shape mismatch":  mutate(func(m *wire.BucketMeta) { m.Entries[0].Shape = []int64{6} }),
		"negative length": mutate(func(m *wire.BucketMeta) { m.Length = -1 }),
		"chunk outside":   mutate(func(m *wire.BucketMeta) { m.Entries[0].Chunk = 8 }),
		"empty name":      mutate(func(m *wire.BucketMeta) { m.Entries[0].Name = "" }),
		"long name":       mutate(func(m *wire.BucketMeta) { m.Entries[0].Name = strings.Repeat("x", wire.MaxNameLen+1) }),
		"overlap": mutate(func(m *wire.BucketMeta) {
			m.Entries = append(m.Entries, wire.Entry{Name: "b", DType: dtype.U8, Shape: []int64{4}, Offset: 10, Size: 4, Total: 4})
		}),
		"bad dtype":    []byte(`{"seq":0,"length":4,"entries":[{"name":"a","dtype":"F128","shape":[1],"offset":0,"size":4,"total":4}]}`),
		"bad checksum": []byte(`{"seq":0,"length":0,"entries":[],"checksum":"xyz"}`),
	}
	for name, b := range cases {
		if _, err := wire.DecodeMeta(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestPackSplitsAndMarksLast checks the pack stage alone: small tensors are
// never split, large ones are chunked on Align boundaries, only the last
// bucket is marked, and an empty model still sends one (empty) last bucket.
func TestPackSplitsAndMarksLast(t *testing.T) {
	pack := func(src tensorList, bucket int) []wire.BucketMeta {
		pool, _ := NewPool(mem.Host{}, 2, bucket)
		defer pool.Close()
		p := pipeline.New("pack")
		var metas []wire.BucketMeta
		collect(p, Pack(p, Iterate(p, src), PackConfig{Pool: pool}), func(b *Bucket) { metas = append(metas, b.Meta) })
		if err := p.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		return metas
	}
	if m := pack(nil, 4096); len(m) != 1 || !m[0].IsLast || m[0].Length != 0 {
		t.Fatalf("empty model: %+v", m)
	}
	src := tensorList{
		{Name: "small", DType: dtype.U8, Shape: []int64{3000}, Data: make([]byte, 3000)},
		{Name: "fits-next", DType: dtype.U8, Shape: []int64{2000}, Data: make([]byte, 2000)},
		{Name: "big", DType: dtype.U8, Shape: []int64{10000}, Data: make([]byte, 10000)},
		{Name: "empty", DType: dtype.F32, Shape: []int64{0, 3}},
	}
	metas := pack(src, 4096)
	for i, m := range metas {
		if m.IsLast != (i == len(metas)-1) || m.Index != i {
			t.Fatalf("bucket %d: IsLast=%v Index=%d", i, m.IsLast, m.Index)
		}
		if err := m.Check(); err != nil {
			t.Fatal(err)
		}
		for _, e := range m.Entries {
			if e.Name != "big" && !e.Whole() {
				t.Fatalf("%s was split", e.Name)
			}
			if !e.Complete() && e.Size%wire.Align != 0 {
				t.Fatalf("chunk of %s ends off the %d-byte alignment: %+v", e.Name, wire.Align, e)
			}
		}
	}
	if metas[0].Entries[0].Name != "small" || len(metas[0].Entries) != 1 || metas[1].Entries[0].Name != "fits-next" {
		t.Fatalf("a tensor that did not fit was not moved to the next bucket: %+v", metas[:2])
	}
}

// collect runs fn on every bucket and releases it (a test helper sink stage).
func collect(p *pipeline.Pipeline, in *pipeline.Stream[*Bucket], fn func(*Bucket)) {
	pipeline.Sink(p, "collect", in, func(ctx context.Context, in *pipeline.Input[*Bucket]) error {
		for b := range in.All() {
			fn(b)
			b.Release()
		}
		return in.Err()
	})
}

// TestTensorCountLimit: a round with more tensors than the limit fails on
// the sender with an error naming the limit, and a receiver refuses it
// too, rather than growing bookkeeping without bound.
func TestTensorCountLimit(t *testing.T) {
	src := make(tensorList, 11)
	for i := range src {
		src[i] = &Tensor{Name: "t" + string(rune('a'+i)), DType: dtype.U8, Shape: []int64{4}, Data: make([]byte, 4)}
	}
	pool, err := NewPool(mem.Host{}, DefaultBuffers, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	p := pipeline.New("limit")
	collect(p, Pack(p, Iterate(p, src), PackConfig{Pool: pool, Version: 1, maxTensors: 10}), func(*Bucket) {})
	if err := p.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "more than 10 tensors") {
		t.Fatalf("sender: %v", err)
	}
	c := newBucketCheck(nil)
	c.maxTensors = 10
	for i := range 10 {
		c.got[string(rune('a'+i))] = progress{4, 4}
	}
	b := &Bucket{Meta: wire.BucketMeta{Seq: 1, Length: 4, Entries: []wire.Entry{{Name: "new", DType: dtype.U8, Shape: []int64{4}, Size: 4, Total: 4}}}}
	b.Buf, _ = mem.Host{}.Alloc(4096)
	if _, err := c.unpack(context.Background(), b); err == nil || !strings.Contains(err.Error(), "more than 10 tensors") {
		t.Fatalf("receiver's unpack: %v", err)
	}
}
