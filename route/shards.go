package route

import (
	"errors"
	"slices"
	"sync"

	"github.com/weightcast/weightcast/layout"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/plan"
)

// Received is one local tensor of a receiver: a region of a global tensor
// and its bytes, row-major, in Buffer, which Shards allocated; Data is
// them when Buffer is host memory, else nil.
type Received struct {
	Tensor layout.Tensor
	Slice  layout.Slice
	Data   []byte
	Buffer mem.Buffer
}

// Shards is a Dest in host memory that keeps the last committed version
// whole: a round lands in memory of its own, Commit makes it the version
// All and Get return, and a failed round leaves the committed one as it
// was. It holds at most two copies of the receiver's shard (the committed
// one, and the round's), reusing the memory of the one before. Its
// methods may be called from any goroutine.
type Shards struct {
	// Device allocates the tensors' memory (host memory: its buffers'
	// Host bytes); nil means Go memory.
	Device mem.Device

	mu        sync.Mutex
	version   uint64
	committed []Received
	pending   []Received
	spare     map[int64][]mem.Buffer // free memory by size
}

// Tensor returns memory for the round's local tensor.
func (s *Shards) Tensor(t layout.Tensor, need layout.Slice) (mem.Buffer, error) {
	n := need.Elements() * int64(t.DType.Size())
	s.mu.Lock()
	defer s.mu.Unlock()
	var b mem.Buffer
	if free := s.spare[n]; len(free) > 0 {
		b, s.spare[n] = free[len(free)-1], free[:len(free)-1]
	} else {
		dev := s.Device
		if dev == nil {
			dev = mem.Host{}
		}
		var err error
		if b, err = dev.Alloc(max(int(n), 1)); err != nil {
			return nil, err
		}
	}
	r := Received{Tensor: t, Slice: need.Clone(), Buffer: b}
	if h := b.Host(); h != nil {
		r.Data = h[:n]
	}
	s.pending = append(s.pending, r)
	return b, nil
}

// Commit makes the round's tensors the committed version.
func (s *Shards) Commit(version uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free(s.committed)
	s.committed, s.pending, s.version = s.pending, nil, version
	return nil
}

// Abort drops the round's tensors; the committed version stays.
func (s *Shards) Abort() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free(s.pending)
	s.pending = nil
}

func (s *Shards) free(rs []Received) {
	if s.spare == nil {
		s.spare = map[int64][]mem.Buffer{}
	}
	for _, r := range rs {
		n := r.Slice.Elements() * int64(r.Tensor.DType.Size())
		s.spare[n] = append(s.spare[n], r.Buffer)
	}
}

// Close frees every tensor's memory, the committed version's too. It is
// idempotent; Shards is empty after it.
func (s *Shards) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, rs := range [][]Received{s.committed, s.pending} {
		for _, r := range rs {
			errs = append(errs, r.Buffer.Free())
		}
	}
	for _, bs := range s.spare {
		for _, b := range bs {
			errs = append(errs, b.Free())
		}
	}
	s.committed, s.pending, s.spare = nil, nil, nil
	return errors.Join(errs...)
}

// Version returns the committed version, or 0 before the first.
func (s *Shards) Version() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version
}

// All returns the committed version's tensors, sorted by name; their
// memory is valid until the next round's first Tensor after the next
// Commit (the round after next reuses it).
func (s *Shards) All() []Received {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Clone(s.committed)
	slices.SortFunc(out, func(a, b Received) int {
		if a.Tensor.Name < b.Tensor.Name {
			return -1
		}
		if a.Tensor.Name > b.Tensor.Name {
			return 1
		}
		return slices.Compare(a.Slice.Offset, b.Slice.Offset)
	})
	return out
}

// Get returns the committed local tensor of the named global tensor (the
// first, where the receiver needs several slices of it).
func (s *Shards) Get(name string) (Received, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.committed {
		if r.Tensor.Name == name {
			return r, true
		}
	}
	return Received{}, false
}

// Region returns the bytes of slice s of tensor t, row-major, out of its
// global bytes full (for checks and tests).
func Region(t layout.Tensor, s layout.Slice, full []byte) []byte {
	es := int64(t.DType.Size())
	out := make([]byte, 0, s.Elements()*es)
	m := plan.Move{Held: layout.Full(t.Shape), Need: s, Region: s}
	for run := range m.Runs(int(es)) {
		out = append(out, full[run.Src:run.Src+run.Len]...)
	}
	return out
}
