package rendezvous

import (
	"context"
	"errors"
	"fmt"
)

// Store is the small key-value API the rendezvous is built on. Keys are
// plain strings ("/weightcast/<group>/..."), values are opaque bytes.
//
// A Store belongs to one process (one rank) and carries one lease: keys
// written with CreateLeased live only while that owner lives. The owner
// keeps the lease alive in the background; Close revokes it, and if the
// owner dies without closing, the lease expires after its TTL and every
// key bound to it is deleted.
//
// Every method is safe for concurrent use. Every blocking method returns
// when ctx is done, with an error wrapping ctx.Err().
type Store interface {
	// Create stores value under key if key does not exist yet. The key
	// lives until it is deleted. When key already exists, Create returns
	// created == false and the value already stored, and changes nothing.
	Create(ctx context.Context, key string, value []byte) (created bool, existing []byte, err error)
	// CreateLeased is Create for a key bound to this Store's lease: it is
	// deleted when the Store is closed or its owner dies.
	CreateLeased(ctx context.Context, key string, value []byte) (created bool, existing []byte, err error)
	// Get returns the value under key; ok is false when key does not exist.
	Get(ctx context.Context, key string) (value []byte, ok bool, err error)
	// List returns every key under prefix with its value.
	List(ctx context.Context, prefix string) (map[string][]byte, error)
	// Wait blocks until key exists and returns its value. It returns at
	// once when key exists already.
	Wait(ctx context.Context, key string) ([]byte, error)
	// WaitAbsent blocks until key does not exist. It returns at once when
	// key is absent already.
	WaitAbsent(ctx context.Context, key string) error
	// WaitChange blocks until key no longer holds value and says how:
	// it holds another value (the new value is returned), or it was
	// deleted. It returns at once when that is so already.
	WaitChange(ctx context.Context, key string, value []byte) (Change, []byte, error)
	// Lease returns the id of this Store's lease, granting it on first
	// use as CreateLeased does.
	Lease(ctx context.Context) (int64, error)
	// LeaseAlive reports whether the lease with this id (of any Store on
	// the same backend) is still alive.
	LeaseAlive(ctx context.Context, id int64) (bool, error)
	// DeleteIf deletes key if it holds exactly value, and reports whether
	// it did.
	DeleteIf(ctx context.Context, key string, value []byte) (bool, error)
	// Add atomically adds delta to the decimal counter under key (an
	// absent key counts as 0) and returns the new value. Counters are not
	// leased.
	Add(ctx context.Context, key string, delta int64) (int64, error)
	// DeletePrefix deletes every key that starts with prefix. It refuses
	// the empty prefix.
	DeletePrefix(ctx context.Context, prefix string) error
	// Close revokes the lease (deleting the leased keys) and releases the
	// connection. It is idempotent; other methods return an error
	// wrapping ErrStoreClosed after it.
	Close() error
}

// Change is what WaitChange saw happen to a key.
type Change int

const (
	// Rewritten: the key holds another value, or was written again.
	Rewritten Change = iota + 1
	// Deleted: the key is gone: a client deleted it, or the lease that
	// held it ended.
	Deleted
)

func (c Change) String() string {
	switch c {
	case Rewritten:
		return "rewritten"
	case Deleted:
		return "deleted"
	}
	return fmt.Sprintf("change %d", int(c))
}

// ErrStoreClosed is wrapped by errors from a Store used after Close.
var ErrStoreClosed = errors.New("rendezvous: store closed")

// ErrLeaseLost is wrapped by errors from CreateLeased after the Store's
// lease stopped being kept alive while the Store was open: its owner lost
// the server for longer than the lease TTL, and every key bound to the
// lease is gone.
var ErrLeaseLost = errors.New("rendezvous: lease lost (no contact with the store for longer than the lease TTL); this rank's keys are gone, restart the run")
