package rendezvoustest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/weightcast/weightcast/rendezvous"
)

// Mem is an in-memory key space shared by the MemStores of one test, as
// one etcd cluster is shared by the stores of many processes. Its zero
// value is not usable; call NewMem.
type Mem struct {
	mu      sync.Mutex
	kv      map[string]memValue
	rev     int64               // counts changes
	leases  map[int64]*MemStore // every store's lease, by id
	changed chan struct{}       // closed and replaced on every change
}

type memValue struct {
	value []byte
	owner *MemStore // the store whose lease holds the key; nil if none
	rev   int64     // the change that wrote it
}

// NewMem returns an empty key space.
func NewMem() *Mem {
	return &Mem{kv: map[string]memValue{}, leases: map[int64]*MemStore{}, changed: make(chan struct{})}
}

// Put writes key unconditionally, on no lease, as a client that is not a
// rendezvous Store (an attacker, in tests) could.
func (m *Mem) Put(key string, value []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rev++
	m.kv[key] = memValue{value: clone(value), rev: m.rev}
	m.notify()
}

// Delete deletes key, as a client that is not a rendezvous Store could.
func (m *Mem) Delete(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.kv[key]; ok {
		m.deleteLocked(key)
		m.notify()
	}
}

// deleteLocked deletes key. Callers hold m.mu and notify.
func (m *Mem) deleteLocked(key string) {
	m.rev++
	delete(m.kv, key)
}

// NewStore returns a store on m with its own lease, as one process would
// have. Closing it deletes its leased keys.
func (m *Mem) NewStore() *MemStore {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := &MemStore{m: m, lease: int64(len(m.leases) + 1)}
	m.leases[s.lease] = s
	return s
}

// notify wakes every waiter. Callers hold m.mu.
func (m *Mem) notify() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// MemStore is one owner's rendezvous.Store on a Mem.
type MemStore struct {
	m      *Mem
	lease  int64
	closed bool // guarded by m.mu
}

var _ rendezvous.Store = (*MemStore)(nil)

func (s *MemStore) errClosed(op, key string) error {
	return fmt.Errorf("mem %s %q: %w", op, key, rendezvous.ErrStoreClosed)
}

func clone(b []byte) []byte { return append([]byte{}, b...) }

// Create implements rendezvous.Store.
func (s *MemStore) Create(ctx context.Context, key string, value []byte) (bool, []byte, error) {
	return s.create(ctx, key, value, nil)
}

// CreateLeased implements rendezvous.Store.
func (s *MemStore) CreateLeased(ctx context.Context, key string, value []byte) (bool, []byte, error) {
	return s.create(ctx, key, value, s)
}

func (s *MemStore) create(ctx context.Context, key string, value []byte, owner *MemStore) (bool, []byte, error) {
	if err := ctx.Err(); err != nil {
		return false, nil, fmt.Errorf("mem create %q: %w", key, err)
	}
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if s.closed {
		return false, nil, s.errClosed("create", key)
	}
	if v, ok := s.m.kv[key]; ok {
		return false, clone(v.value), nil
	}
	s.m.rev++
	s.m.kv[key] = memValue{value: clone(value), owner: owner, rev: s.m.rev}
	s.m.notify()
	return true, nil, nil
}

// Get implements rendezvous.Store.
func (s *MemStore) Get(ctx context.Context, key string) ([]byte, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, fmt.Errorf("mem get %q: %w", key, err)
	}
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if s.closed {
		return nil, false, s.errClosed("get", key)
	}
	v, ok := s.m.kv[key]
	if !ok {
		return nil, false, nil
	}
	return clone(v.value), true, nil
}

// List implements rendezvous.Store.
func (s *MemStore) List(ctx context.Context, prefix string) (map[string][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("mem list %q: %w", prefix, err)
	}
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if s.closed {
		return nil, s.errClosed("list", prefix)
	}
	out := map[string][]byte{}
	for k, v := range s.m.kv {
		if strings.HasPrefix(k, prefix) {
			out[k] = clone(v.value)
		}
	}
	return out, nil
}

// await blocks until cond, run under the lock, reports done.
func (s *MemStore) await(ctx context.Context, op, key string, cond func() bool) error {
	for {
		s.m.mu.Lock()
		if s.closed {
			s.m.mu.Unlock()
			return s.errClosed(op, key)
		}
		done := cond()
		ch := s.m.changed
		s.m.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("mem %s %q: %w", op, key, ctx.Err())
		}
	}
}

// Wait implements rendezvous.Store.
func (s *MemStore) Wait(ctx context.Context, key string) ([]byte, error) {
	var val []byte
	err := s.await(ctx, "wait for", key, func() bool {
		v, ok := s.m.kv[key]
		val = clone(v.value)
		return ok
	})
	if err != nil {
		return nil, err
	}
	return val, nil
}

// WaitAbsent implements rendezvous.Store.
func (s *MemStore) WaitAbsent(ctx context.Context, key string) error {
	return s.await(ctx, "wait for deletion of", key, func() bool {
		_, ok := s.m.kv[key]
		return !ok
	})
}

// Add implements rendezvous.Store.
func (s *MemStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("mem add to %q: %w", key, err)
	}
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if s.closed {
		return 0, s.errClosed("add to", key)
	}
	var cur int64
	if v, ok := s.m.kv[key]; ok {
		var err error
		if cur, err = strconv.ParseInt(string(v.value), 10, 64); err != nil {
			return 0, fmt.Errorf("mem add to %q: value %q is not a counter", key, v.value)
		}
	}
	cur += delta
	s.m.rev++
	s.m.kv[key] = memValue{value: []byte(strconv.FormatInt(cur, 10)), rev: s.m.rev}
	s.m.notify()
	return cur, nil
}

// DeletePrefix implements rendezvous.Store.
func (s *MemStore) DeletePrefix(ctx context.Context, prefix string) error {
	if prefix == "" {
		return errors.New("mem delete: refusing to delete every key (empty prefix)")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("mem delete prefix %q: %w", prefix, err)
	}
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if s.closed {
		return s.errClosed("delete prefix", prefix)
	}
	for k := range s.m.kv {
		if strings.HasPrefix(k, prefix) {
			s.m.deleteLocked(k)
		}
	}
	s.m.notify()
	return nil
}

// DeleteIf implements rendezvous.Store.
func (s *MemStore) DeleteIf(ctx context.Context, key string, value []byte) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("mem delete %q: %w", key, err)
	}
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if s.closed {
		return false, s.errClosed("delete", key)
	}
	v, ok := s.m.kv[key]
	if !ok || !bytes.Equal(v.value, value) {
		return false, nil
	}
	s.m.deleteLocked(key)
	s.m.notify()
	return true, nil
}

// WaitChange implements rendezvous.Store.
func (s *MemStore) WaitChange(ctx context.Context, key string, value []byte) (rendezvous.Change, []byte, error) {
	var (
		change rendezvous.Change
		now    []byte
		start  int64 = -1
	)
	err := s.await(ctx, "wait for a change of", key, func() bool {
		v, ok := s.m.kv[key]
		switch {
		case !ok:
			change = rendezvous.Deleted
		case start < 0 && !bytes.Equal(v.value, value), start >= 0 && v.rev != start:
			change, now = rendezvous.Rewritten, clone(v.value)
		default:
			start = v.rev
			return false
		}
		return true
	})
	if err != nil {
		return 0, nil, err
	}
	return change, now, nil
}

// Lease implements rendezvous.Store.
func (s *MemStore) Lease(ctx context.Context) (int64, error) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if s.closed {
		return 0, s.errClosed("grant lease of", "this store")
	}
	return s.lease, nil
}

// LeaseAlive implements rendezvous.Store: a store's lease lives until it
// is closed.
func (s *MemStore) LeaseAlive(ctx context.Context, id int64) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("mem read lease %x: %w", id, err)
	}
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if s.closed {
		return false, s.errClosed("read", fmt.Sprintf("lease %x", id))
	}
	owner, ok := s.m.leases[id]
	return ok && !owner.closed, nil
}

// Close implements rendezvous.Store: the store's leased keys are deleted
// at once, as a revoked lease's are.
func (s *MemStore) Close() error {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	for k, v := range s.m.kv {
		if v.owner == s {
			s.m.deleteLocked(k)
		}
	}
	s.m.notify()
	return nil
}
