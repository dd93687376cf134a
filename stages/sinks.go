package stages

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/dtype"
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
type HostModel struct {
	mu      sync.RWMutex
	tensors map[string]*HostTensor
	version uint64
	allocs  int
}

// NewHostModel returns an empty HostModel.
func NewHostModel() *HostModel { return &HostModel{tensors: map[string]*HostTensor{}} }

// Load copies the entry's bytes into the tensor's place.
func (h *HostModel) Load(ctx context.Context, e *Entry, data []byte) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.tensors[e.Name]
	if t == nil || t.DType != e.DType || !slices.Equal(t.Shape, e.Shape) {
		t = &HostTensor{DType: e.DType, Shape: slices.Clone(e.Shape), Data: make([]byte, e.Total)}
		h.tensors[e.Name] = t
		h.allocs++
	}
	copy(t.Data[e.Chunk:], data)
	return nil
}

// Commit records the version.
func (h *HostModel) Commit(ctx context.Context, version uint64) error {
	h.mu.Lock()
	h.version = version
	h.mu.Unlock()
	return nil
}

// Get returns the tensor called name. Its Data must not be modified and
// changes under a running sync.
func (h *HostModel) Get(name string) (*HostTensor, bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	t, ok := h.tensors[name]
	return t, ok
}

// Names lists the tensors held, sorted.
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

// Version is the last committed model version.
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
func (c *ChecksumSink) Load(ctx context.Context, e *Entry, data []byte) error {
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

func (c *callbackSink) Load(ctx context.Context, e *Entry, data []byte) error {
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

func (v *VerifySink) Load(ctx context.Context, e *Entry, data []byte) error {
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
