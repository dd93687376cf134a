package stages

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/safetensors"
	"github.com/weightcast/weightcast/wire"
)

// The sinks and sources the stages' tests move bytes between. The real
// ones live in packages sink and source, which import this package, so
// its own tests cannot use them: these doubles do what the tests need of
// them, and each real one is tested in its package (through whole rounds,
// with stagestest.Group).

// tensorList is a Source over a fixed list of tensors (as source.Tensors
// is). It is not a Lookuper.
type tensorList []*Tensor

func (ts tensorList) Tensors(ctx context.Context, emit func(*Tensor) error) error {
	for _, t := range ts {
		if err := emit(t); err != nil {
			return err
		}
	}
	return nil
}

// genModel is a model whose bytes are generated on demand from a seed, so
// that any rank can regenerate any byte (as source.Synthetic's are). It is
// a Source and a Lookuper.
type genModel struct {
	list   []*Tensor
	byName map[string]*Tensor
	size   int64
}

// synthetic lays out a genModel of count tensors (at least 3) of about
// size bytes in all, of the dtypes given in turn (BF16 when none): the
// first and the last take about a quarter of the bytes each, so that at
// the tests' bucket sizes they are split across buckets (as a model's
// embeddings and LM head are), the one before the last has no elements,
// and the others share the rest in sizes that differ by a few bytes.
// seed picks the bytes: the same layout with another seed is another
// round's model.
func synthetic(tb testing.TB, size int64, count int, seed uint64, dtypes ...dtype.DType) *genModel {
	tb.Helper()
	if count < 3 {
		tb.Fatalf("synthetic: %d tensors, want at least 3", count)
	}
	if len(dtypes) == 0 {
		dtypes = []dtype.DType{dtype.BF16}
	}
	m := &genModel{byName: map[string]*Tensor{}}
	big, rest := size/4, size/2/int64(count-3)
	for i := range count {
		dt := dtypes[i%len(dtypes)]
		n := rest + int64(i%5)*int64(dt.Size())
		switch i {
		case 0, count - 1:
			n = big
		case count - 2:
			n = 0
		}
		elems := max(0, n/int64(dt.Size()))
		shape := []int64{elems}
		switch {
		case i == count-2:
			shape = []int64{0, 8}
		case elems%64 == 0 && elems > 0:
			shape = []int64{elems / 64, 64}
		}
		t := &Tensor{Name: fmt.Sprintf("gen.%03d.weight", i), DType: dt, Shape: shape, Reader: genBytes{seed: seed, id: uint64(i)}}
		m.list = append(m.list, t)
		m.byName[t.Name] = t
		m.size += elems * int64(dt.Size())
	}
	return m
}

func (m *genModel) Tensors(ctx context.Context, emit func(*Tensor) error) error {
	return tensorList(m.list).Tensors(ctx, emit)
}

func (m *genModel) Lookup(name string) (*Tensor, bool) { t, ok := m.byName[name]; return t, ok }

func (m *genModel) List() []*Tensor { return m.list }

func (m *genModel) Size() int64 { return m.size }

// genBytes generates a tensor's bytes: word k (8 bytes, little-endian) is
// a hash of (seed, tensor id, k), so that any range can be read alone.
type genBytes struct{ seed, id uint64 }

func (g genBytes) word(k uint64) uint64 {
	x := g.seed ^ g.id<<40 ^ k + 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func (g genBytes) ReadAt(p []byte, off int64) (int, error) {
	n := len(p)
	k := uint64(off) / 8
	var w [8]byte
	if skip := int(off % 8); skip != 0 {
		binary.LittleEndian.PutUint64(w[:], g.word(k))
		c := copy(p, w[skip:])
		p, k = p[c:], k+1
	}
	for len(p) >= 8 {
		binary.LittleEndian.PutUint64(p, g.word(k))
		p, k = p[8:], k+1
	}
	if len(p) > 0 {
		binary.LittleEndian.PutUint64(w[:], g.word(k))
		copy(p, w[:])
	}
	return n, nil
}

// fileSource is a Source over a safetensors checkpoint's tensors, each
// read straight from its file as source.Checkpoint reads it (without its
// checks that the files did not change). It is a Lookuper; the model is
// closed when tb ends.
type fileSource struct {
	tensorList
	byName map[string]*Tensor
}

func openFiles(tb testing.TB, path string) *fileSource {
	tb.Helper()
	m, err := safetensors.OpenModel(path)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { m.Close() })
	f := &fileSource{byName: map[string]*Tensor{}}
	for _, mt := range m.Tensors() {
		r, err := m.Section(mt.Name)
		if err != nil {
			tb.Fatal(err)
		}
		t := &Tensor{Name: mt.Name, DType: mt.DType, Shape: mt.Shape, Reader: r}
		f.tensorList = append(f.tensorList, t)
		f.byName[t.Name] = t
	}
	return f
}

func (f *fileSource) Lookup(name string) (*Tensor, bool) { t, ok := f.byName[name]; return t, ok }

// memTensor is one tensor a memModel holds.
type memTensor struct {
	DType dtype.DType
	Shape []int64
	Data  []byte
}

// memModel is a Sink that keeps the received model in memory (as
// sink.HostModel does), name → bytes. In place, a tensor is allocated when
// it first comes and again when its dtype or shape changes, and updated in
// place otherwise. Shadowed (newShadowModel), each round loads into tensors
// of its own, which Committed (the group's commit) installs: a failed
// round leaves what Get serves as the last committed round left it.
type memModel struct {
	mu       sync.Mutex
	shadowed bool
	tensors  map[string]*memTensor // what Get serves
	round    map[string]*memTensor // shadowed: the round being loaded
	version  uint64                // the version Get serves
	pending  uint64                // shadowed: the version round holds
	allocs   int
}

func newMemModel() *memModel { return &memModel{tensors: map[string]*memTensor{}} }

func newShadowModel() *memModel {
	m := newMemModel()
	m.shadowed = true
	return m
}

func (m *memModel) Holding() Holding {
	if m.shadowed {
		return HoldsShadowed
	}
	return HoldsInPlace
}

func (m *memModel) Begin(ctx context.Context, version uint64, info *wire.SourceInfo) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.round, m.pending = map[string]*memTensor{}, 0
	return nil
}

func (m *memModel) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	into := m.tensors
	if m.shadowed {
		if m.round == nil {
			return fmt.Errorf("tensor %q loaded before Begin", e.Name)
		}
		into = m.round
	}
	t := into[e.Name]
	if t == nil || t.DType != e.DType || !slices.Equal(t.Shape, e.Shape) {
		t = &memTensor{DType: e.DType, Shape: slices.Clone(e.Shape), Data: make([]byte, e.Total)}
		into[e.Name] = t
		m.allocs++
	}
	copy(t.Data[e.Chunk:], data)
	return nil
}

func (m *memModel) Commit(ctx context.Context, version uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.shadowed {
		m.pending = version
	} else {
		m.version = version
	}
	return nil
}

func (m *memModel) Committed(ctx context.Context, version uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.shadowed {
		return nil
	}
	if m.pending != version {
		return fmt.Errorf("version %d was committed, but the round loaded holds version %d", version, m.pending)
	}
	for name, t := range m.round {
		m.tensors[name] = t
	}
	m.version, m.round, m.pending = version, nil, 0
	return nil
}

func (m *memModel) Get(name string) (*memTensor, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.tensors[name]
	return t, ok
}

func (m *memModel) Names() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.tensors))
	for n := range m.tensors {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func (m *memModel) Version() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.version
}

func (m *memModel) Allocations() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.allocs
}

// verifier is a Sink that compares every byte it takes with the tensor of
// the same name in want (as sink.Verify does), counts what it compared,
// and, when want lists its tensors, fails a round that did not bring all
// of them.
type verifier struct {
	want    Lookuper
	round   int // tensors completed this round
	Bytes   int64
	Tensors int
}

func verify(want Lookuper) *verifier { return &verifier{want: want} }

func (v *verifier) Holding() Holding { return HoldsNothing }

func (v *verifier) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	t, ok := v.want.Lookup(e.Name)
	if !ok {
		return fmt.Errorf("received tensor %q that the source does not have", e.Name)
	}
	if t.DType != e.DType || !slices.Equal(t.Shape, e.Shape) {
		return fmt.Errorf("tensor %q arrived as %s%v, the source has %s%v", e.Name, e.DType, e.Shape, t.DType, t.Shape)
	}
	exp := make([]byte, len(data))
	if err := t.ReadAt(exp, e.Chunk); err != nil {
		return err
	}
	if i := firstDiff(exp, data); i >= 0 {
		return fmt.Errorf("tensor %q differs from the source at byte %d", e.Name, e.Chunk+int64(i))
	}
	v.Bytes += int64(len(data))
	if e.Complete() {
		v.Tensors++
		v.round++
	}
	return nil
}

func (v *verifier) Commit(ctx context.Context, version uint64) error {
	got := v.round
	v.round = 0
	if l, ok := v.want.(interface{ List() []*Tensor }); ok && got != len(l.List()) {
		return fmt.Errorf("round %d brought %d tensors, the source has %d", version, got, len(l.List()))
	}
	return nil
}

// firstDiff returns the first index where a and b differ, or -1.
func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}

// devModel is a DeviceTarget that keeps the received model on one GPU (as
// sink.DeviceModel does): each tensor in an allocation of its own, made at
// its first sight and again when its size changes. Device views and host
// bytes are copied on its own stream; Flush records an event after the
// copies (fence) and waits for it, Commit waits for them too. It is closed
// when the test ends.
type devModel struct {
	dev    *gpu.CUDADevice
	stream *gpu.Stream
	mu     sync.Mutex
	bufs   map[string]mem.Buffer // nil for a tensor of no bytes
	shapes map[string][]int64
	fence  *gpu.Event // recorded by the last Flush
	ver    uint64
	allocs int
}

func newDevModel(tb testing.TB, d *gpu.CUDADevice) *devModel {
	tb.Helper()
	s, err := d.NewStream()
	if err != nil {
		tb.Fatal(err)
	}
	m := &devModel{dev: d, stream: s, bufs: map[string]mem.Buffer{}, shapes: map[string][]int64{}}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.Sync(ctx); err != nil {
			tb.Errorf("device model: copies still running at the end: %v", err)
			return
		}
		for _, b := range m.bufs {
			if b != nil {
				b.Free()
			}
		}
		if m.fence != nil {
			m.fence.Close()
		}
		s.Close()
	})
	return m
}

var _ DeviceTarget = (*devModel)(nil)

// place returns e's tensor's memory, allocating it at its first sight.
func (m *devModel) place(e *wire.Entry) (mem.Buffer, error) {
	b, ok := m.bufs[e.Name]
	if ok && (b == nil && e.Total == 0 || b != nil && int64(b.Len()) == e.Total) {
		m.shapes[e.Name] = e.Shape
		return b, nil
	}
	if e.Chunk != 0 {
		return nil, fmt.Errorf("tensor %q: chunk at %d before its first", e.Name, e.Chunk)
	}
	if b != nil {
		if err := m.stream.Sync(context.Background()); err != nil {
			return nil, err
		}
		b.Free()
	}
	b = nil
	if e.Total > 0 {
		var err error
		if b, err = m.dev.Alloc(int(e.Total)); err != nil {
			return nil, err
		}
	}
	m.bufs[e.Name], m.shapes[e.Name] = b, e.Shape
	m.allocs++
	return b, nil
}

func (m *devModel) Target(ctx context.Context, e *wire.Entry) (mem.Buffer, int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.place(e)
	return b, e.Chunk, err
}

func (m *devModel) LoadDevice(ctx context.Context, e *wire.Entry, src mem.Buffer, off int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.place(e)
	if err != nil || e.Size == 0 {
		return err
	}
	from, ok := gpu.Address(src)
	if !ok {
		return fmt.Errorf("tensor %q: its source is not memory the GPU can address", e.Name)
	}
	var batch gpu.CopyBatch
	batch.Add(b.DevicePtr()+uint64(e.Chunk), from+uint64(off), e.Size)
	return m.stream.CopyBatch(&batch)
}

func (m *devModel) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.place(e)
	if err != nil || len(data) == 0 {
		return err
	}
	return m.stream.CopyHtoD(b, int(e.Chunk), data)
}

func (m *devModel) Flush(ctx context.Context) error {
	ev, err := m.stream.Record()
	if err != nil {
		return err
	}
	m.mu.Lock()
	if m.fence != nil {
		m.fence.Close()
	}
	m.fence = ev
	m.mu.Unlock()
	return ev.Wait(ctx)
}

func (m *devModel) Commit(ctx context.Context, version uint64) error {
	if err := m.stream.Sync(ctx); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ver = version
	return nil
}

func (m *devModel) Version() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ver
}

func (m *devModel) Allocations() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.allocs
}

// ReadHost copies the tensor called name back to host memory.
func (m *devModel) ReadHost(ctx context.Context, name string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.bufs[name]
	if !ok {
		return nil, fmt.Errorf("device model has no tensor %q", name)
	}
	if b == nil {
		return []byte{}, nil
	}
	out := make([]byte, b.Len())
	if err := m.stream.CopyDtoH(out, b, 0); err != nil {
		return nil, err
	}
	return out, m.stream.Sync(ctx)
}

// devVerified counts what devModel.Verify compared.
type devVerified struct {
	Tensors int
	Bytes   int64
}

// Verify compares every tensor of the model, byte for byte, with the
// tensor of the same name in want (read on the host, or back from the GPU
// for a device tensor), and, when want lists its tensors, fails unless the
// model holds all of them.
func (m *devModel) Verify(ctx context.Context, want Lookuper) (devVerified, error) {
	var st devVerified
	var names []string
	m.mu.Lock()
	for n := range m.bufs {
		names = append(names, n)
	}
	m.mu.Unlock()
	sort.Strings(names)
	for _, name := range names {
		w, ok := want.Lookup(name)
		if !ok {
			return st, fmt.Errorf("the model holds tensor %q that the source does not have", name)
		}
		m.mu.Lock()
		shape := m.shapes[name]
		m.mu.Unlock()
		if !slices.Equal(w.Shape, shape) {
			return st, fmt.Errorf("tensor %q is %v in the model, %v in the source", name, shape, w.Shape)
		}
		got, err := m.ReadHost(ctx, name)
		if err != nil {
			return st, err
		}
		exp := make([]byte, len(got))
		if w.Device != nil {
			from, _ := gpu.Address(w.Device)
			if err := m.stream.CopyDtoHPtr(exp, from+uint64(w.DeviceOffset)); err != nil {
				return st, err
			}
			if err := m.stream.Sync(ctx); err != nil {
				return st, err
			}
		} else if err := w.ReadAt(exp, 0); err != nil {
			return st, err
		}
		if i := firstDiff(got, exp); i >= 0 {
			return st, fmt.Errorf("tensor %q differs from the source at byte %d", name, i)
		}
		st.Tensors++
		st.Bytes += int64(len(got))
	}
	if l, ok := want.(interface{ List() []*Tensor }); ok && len(l.List()) != len(names) {
		return st, errors.New("the model does not hold every tensor of the source")
	}
	return st, nil
}
