package stages

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"

	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/wire"
)

// HostTensor is one tensor held by a HostModel.
type HostTensor struct {
	DType dtype.DType
	Shape []int64
	Data  []byte
}

// HostModel is a Sink that keeps the received model in host memory, name →
// bytes. Tensors are allocated in the first round that carries them and
// updated in place in later rounds, so a steady sync allocates nothing; a
// tensor whose dtype or shape changes is reallocated.
//
// Made WithShadow, it keeps two copies: Get serves the committed version
// while a round loads into the other copy, and the copies swap when the
// group commits the round (Committed). A failed round leaves the committed
// version servable and unchanged. A tensor that a round does not carry
// keeps its committed bytes.
type HostModel struct {
	mu      sync.RWMutex
	tensors map[string]*HostTensor // what Get serves
	version uint64                 // the version Get serves
	allocs  int

	// With a shadow: the copy rounds load into, the tensors this round
	// loaded, and the version fully loaded into it. Only the receiver's
	// goroutines touch them, one after another (Begin, Load, Commit,
	// Committed), never Get.
	shadow  bool
	spare   map[string]*HostTensor
	loaded  map[string]bool
	pending uint64
}

// HostModelOption adjusts NewHostModel.
type HostModelOption func(*HostModel)

// WithShadow makes a HostModel stage each round into a second copy and
// switch to it only when the round is committed on every receiver, at the
// cost of holding the model twice. It needs a Receiver (or a caller of
// Committed) to switch: with a pipeline's Load stage alone nothing would
// ever become visible.
func WithShadow() HostModelOption {
	return func(h *HostModel) {
		h.shadow = true
		h.spare, h.loaded = map[string]*HostTensor{}, map[string]bool{}
	}
}

// NewHostModel returns an empty HostModel.
func NewHostModel(opts ...HostModelOption) *HostModel {
	h := &HostModel{tensors: map[string]*HostTensor{}}
	for _, o := range opts {
		if o != nil {
			o(h)
		}
	}
	return h
}

// Holding is HoldsShadowed for a model made WithShadow, else HoldsInPlace.
func (h *HostModel) Holding() Holding {
	if h.shadow {
		return HoldsShadowed
	}
	return HoldsInPlace
}

// Begin starts a round: with a shadow, it forgets what an unfinished
// round loaded.
func (h *HostModel) Begin(ctx context.Context, version uint64, info *wire.SourceInfo) error {
	if h.shadow {
		clear(h.loaded)
		h.pending = 0
	}
	return nil
}

// Load copies the entry's bytes into the tensor's place: the served
// tensor, or with a shadow its copy in the spare model.
func (h *HostModel) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	if h.shadow {
		return h.loadShadow(e, data)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.tensors[e.Name]
	if !fits(t, e) {
		t = newHostTensor(e)
		h.tensors[e.Name] = t
		h.allocs++
	}
	copy(t.Data[e.Chunk:], data)
	return nil
}

func (h *HostModel) loadShadow(e *wire.Entry, data []byte) error {
	t := h.spare[e.Name]
	if !h.loaded[e.Name] && (!fits(t, e) || h.serves(e.Name, t)) {
		// A new tensor, a changed one, or one the spare shares with
		// the served model (a tensor an earlier round did not carry).
		t = newHostTensor(e)
		h.spare[e.Name] = t
		h.mu.Lock()
		h.allocs++
		h.mu.Unlock()
	}
	h.loaded[e.Name] = true
	if !fits(t, e) {
		return fmt.Errorf("tensor %q arrived as %s%v after a chunk as %s%v", e.Name, e.DType, e.Shape, t.DType, t.Shape)
	}
	copy(t.Data[e.Chunk:], data)
	return nil
}

// serves reports whether t is the tensor Get serves as name.
func (h *HostModel) serves(name string, t *HostTensor) bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return t != nil && h.tensors[name] == t
}

func fits(t *HostTensor, e *wire.Entry) bool {
	return t != nil && t.DType == e.DType && slices.Equal(t.Shape, e.Shape)
}

func newHostTensor(e *wire.Entry) *HostTensor {
	return &HostTensor{DType: e.DType, Shape: slices.Clone(e.Shape), Data: make([]byte, e.Total)}
}

// Commit records the version: the one Get serves, or with a shadow the
// one the spare copy holds until Committed.
func (h *HostModel) Commit(ctx context.Context, version uint64) error {
	if h.shadow {
		h.pending = version
		return nil
	}
	h.mu.Lock()
	h.version = version
	h.mu.Unlock()
	return nil
}

// Committed switches a shadowed model to the copy holding version, which
// the group has committed: from then on Get serves it. The tensors it
// served before become the spare copy, which the round after next
// overwrites. Without a shadow it does nothing.
func (h *HostModel) Committed(ctx context.Context, version uint64) error {
	if !h.shadow {
		return nil
	}
	if h.pending != version {
		return fmt.Errorf("version %d was committed, but the shadow copy holds version %d (a round loaded without Begin and Commit?)", version, h.pending)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	// Tensors the round did not carry keep their committed bytes: the
	// new model shares them with the old one until a round loads them.
	// What a failed round left in the spare copy goes.
	for name := range h.spare {
		if _, ok := h.tensors[name]; !ok && !h.loaded[name] {
			delete(h.spare, name)
		}
	}
	for name, t := range h.tensors {
		if !h.loaded[name] {
			h.spare[name] = t
		}
	}
	h.tensors, h.spare = h.spare, h.tensors
	h.version = version
	clear(h.loaded)
	h.pending = 0
	return nil
}

// Get returns the tensor called name. Its Data must not be modified.
// Without a shadow it changes under a running sync. With a shadow it
// holds the committed version's bytes, unchanged until the round after
// the next commit loads into it: call Get again after each commit.
func (h *HostModel) Get(name string) (*HostTensor, bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	t, ok := h.tensors[name]
	return t, ok
}

// Snapshot returns the version Get serves and its tensors, taken at one
// instant, so that a reader sees one version even across a commit. The map
// is the caller's; the tensors are shared, under the rules of Get.
func (h *HostModel) Snapshot() (uint64, map[string]*HostTensor) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.version, maps.Clone(h.tensors)
}

// Names lists the tensors Get serves, sorted.
func (h *HostModel) Names() []string {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make([]string, 0, len(h.tensors))
	for n := range h.tensors {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Version is the model version Get serves: without a shadow the last
// round loaded completely, with one the last round committed.
func (h *HostModel) Version() uint64 {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.version
}

// Allocations counts tensor allocations so far (for checking that later
// rounds update in place).
func (h *HostModel) Allocations() int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.allocs
}

// ChecksumSink is a Sink that keeps only a checksum.Sum of every tensor,
// for comparing ranks without holding the model.
type ChecksumSink struct {
	open    map[string]*checksum.Digest
	Sums    map[string]uint64
	Bytes   int64
	Version uint64
}

// NewChecksumSink returns an empty ChecksumSink.
func NewChecksumSink() *ChecksumSink {
	return &ChecksumSink{open: map[string]*checksum.Digest{}, Sums: map[string]uint64{}}
}

// Load adds the entry's bytes to its tensor's checksum.
func (c *ChecksumSink) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	if e.Whole() {
		c.Sums[e.Name] = checksum.Sum(data)
	} else {
		d := c.open[e.Name]
		if d == nil {
			d = new(checksum.Digest)
			c.open[e.Name] = d
		}
		d.Write(data)
		if e.Complete() {
			c.Sums[e.Name] = d.Sum64()
			delete(c.open, e.Name)
		}
	}
	c.Bytes += int64(len(data))
	return nil
}

// Commit records the version.
func (c *ChecksumSink) Commit(ctx context.Context, version uint64) error {
	c.Version = version
	return nil
}

// Received is a whole tensor as a Callback sees it.
type Received struct {
	Name  string
	DType dtype.DType
	Shape []int64
	// Data is valid only during the callback.
	Data []byte
}

// Callback returns a Sink that calls fn once per tensor with its whole
// bytes. Tensors that fit in a bucket are passed as views of the bucket
// (no copy); tensors split across buckets are reassembled first. commit,
// when not nil, is called at the end of each round.
func Callback(fn func(ctx context.Context, t Received) error, commit func(ctx context.Context, version uint64) error) Sink {
	return &callbackSink{fn: fn, commit: commit, partial: map[string][]byte{}}
}

type callbackSink struct {
	fn      func(context.Context, Received) error
	commit  func(context.Context, uint64) error
	partial map[string][]byte
}

func (c *callbackSink) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	if e.Whole() {
		return c.fn(ctx, Received{Name: e.Name, DType: e.DType, Shape: e.Shape, Data: data})
	}
	buf := c.partial[e.Name]
	if buf == nil {
		buf = make([]byte, e.Total)
		c.partial[e.Name] = buf
	}
	copy(buf[e.Chunk:], data)
	if !e.Complete() {
		return nil
	}
	delete(c.partial, e.Name)
	return c.fn(ctx, Received{Name: e.Name, DType: e.DType, Shape: e.Shape, Data: buf})
}

func (c *callbackSink) Commit(ctx context.Context, version uint64) error {
	if c.commit != nil {
		return c.commit(ctx, version)
	}
	return nil
}

// Lookuper finds a tensor by name; a SyntheticModel is one.
type Lookuper interface {
	Lookup(name string) (*Tensor, bool)
}

// Verify returns a Sink that compares every received byte with the tensor
// of the same name in want (regenerating or re-reading it), and fails on
// the first difference, naming the tensor and the byte offset. It counts
// the bytes it checked.
func Verify(want Lookuper) *VerifySink { return &VerifySink{want: want} }

// VerifySink is the Sink returned by Verify.
type VerifySink struct {
	want    Lookuper
	scratch []byte
	round   int // tensors completed this round
	// Bytes and Tensors count everything verified so far.
	Bytes   int64
	Tensors int
}

// Holding is HoldsNothing: a verifier keeps no copy of the model.
func (v *VerifySink) Holding() Holding { return HoldsNothing }

// Load compares the entry's bytes with the source's, in 1 MiB pieces.
func (v *VerifySink) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	t, ok := v.want.Lookup(e.Name)
	if !ok {
		return fmt.Errorf("received tensor %q that the source does not have", e.Name)
	}
	if t.DType != e.DType || !slices.Equal(t.Shape, e.Shape) {
		return fmt.Errorf("tensor %q arrived as %s%v, the source has %s%v", e.Name, e.DType, e.Shape, t.DType, t.Shape)
	}
	// Compare in pieces, so checking a bucket-sized chunk costs a small
	// scratch buffer, not a second bucket.
	const piece = 1 << 20
	if v.scratch == nil {
		v.scratch = make([]byte, piece)
	}
	for off := 0; off < len(data); off += piece {
		got := data[off:min(off+piece, len(data))]
		exp := v.scratch[:len(got)]
		if err := t.ReadAt(exp, e.Chunk+int64(off)); err != nil {
			return err
		}
		if !bytes.Equal(exp, got) {
			i := 0
			for i < len(got) && got[i] == exp[i] {
				i++
			}
			return fmt.Errorf("tensor %q differs from the source at byte %d (received %#02x, expected %#02x)", e.Name, e.Chunk+int64(off+i), got[i], exp[i])
		}
	}
	v.Bytes += int64(len(data))
	if e.Complete() {
		v.Tensors++
		v.round++
	}
	return nil
}

// Commit checks that the round brought every tensor of the source, when
// the source can list them (as a SyntheticModel can).
func (v *VerifySink) Commit(ctx context.Context, version uint64) error {
	got := v.round
	v.round = 0
	if l, ok := v.want.(interface{ List() []*Tensor }); ok && got != len(l.List()) {
		return fmt.Errorf("round %d brought %d tensors, the source has %d", version, got, len(l.List()))
	}
	return nil
}
