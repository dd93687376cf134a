package sink

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"sync"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/wire"
)

// HostTensor is one tensor held by a HostModel.
type HostTensor struct {
	DType dtype.DType
	Shape []int64
	Data  []byte
}

// HostModel is a stages.Sink that keeps the received model in host memory,
// name → bytes. Tensors are allocated in the first round that carries them
// and updated in place in later rounds, so a steady sync allocates
// nothing; a tensor whose dtype or shape changes is reallocated.
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
func (h *HostModel) Holding() stages.Holding {
	if h.shadow {
		return stages.HoldsShadowed
	}
	return stages.HoldsInPlace
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
	return slices.Sorted(maps.Keys(h.tensors))
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
