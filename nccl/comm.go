package nccl

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/weightcast/weightcast/gpu"
)

// UniqueID is an ncclUniqueId: the root rank makes one with NewUniqueID and
// every rank passes the same bytes to NewComm.
type UniqueID [uniqueIDBytes]byte

// NewUniqueID loads NCCL if needed and returns a fresh id (ncclGetUniqueId).
// It starts the bootstrap listener of the communicator that will use it.
func NewUniqueID() (UniqueID, error) {
	var id UniqueID
	if err := ensureLoaded(); err != nil {
		return id, err
	}
	if r := ncclGetUniqueId(&id); r != Success {
		return id, &Error{Op: "get unique id", Rank: -1, Result: r, Detail: lastError()}
	}
	return id, nil
}

// Config places one rank in a communicator.
type Config struct {
	Device *gpu.CUDADevice // the GPU this rank uses
	ID     UniqueID        // the same on every rank
	NRanks int             // the world size
	Rank   int             // this rank, in [0, NRanks)
	Label  string          // names the communicator in errors (the sync group)
}

// Comm is one rank's non-blocking NCCL communicator. Its methods may be
// called from any goroutine, one at a time (they hold a lock): cancel the
// context of a running call to abort it.
type Comm struct {
	mu     sync.Mutex
	cfg    Config
	slot   commSlot // C memory holding the ncclComm_t; 0 once closed
	closed bool
}

// NewComm creates this rank's communicator with ncclCommInitRankConfig in
// non-blocking mode and waits, polling ncclCommGetAsyncError, until every
// rank has joined. When ctx ends first (a rank that never comes) the
// communicator is aborted and the *Error unwraps to ctx.Err().
//
// NCCL_COMM_BLOCKING=1 in the environment would turn the init blocking and
// uncancellable; leave it unset.
func NewComm(ctx context.Context, cfg Config) (*Comm, error) {
	switch {
	case cfg.Device == nil:
		return nil, errors.New("nccl: NewComm needs a CUDA device")
	case cfg.NRanks < 1 || cfg.Rank < 0 || cfg.Rank >= cfg.NRanks:
		return nil, fmt.Errorf("nccl: rank %d outside [0, %d)", cfg.Rank, cfg.NRanks)
	}
	if err := ensureLoaded(); err != nil {
		return nil, err
	}
	c := &Comm{cfg: cfg}
	if err := ctx.Err(); err != nil {
		return nil, c.error("init", Success, "", err)
	}
	// NCCL writes the handle through this pointer; keep it in C memory for
	// the communicator's life.
	c.slot = newCommSlot()
	unlock, err := cfg.Device.LockContext()
	if err != nil {
		c.freeSlot()
		return nil, err
	}
	r := ncclCommInitRankConfig(c.slot, cfg.NRanks, &cfg.ID, cfg.Rank)
	detail := lastError()
	unlock()
	if r != Success && r != InProgress {
		aborted := c.slot.created()
		if aborted {
			c.abortLocked()
		} else {
			c.freeSlot()
		}
		e := c.error("init", r, detail, nil)
		e.Aborted = aborted
		return nil, e
	}
	if err := c.waitReady(ctx, "init"); err != nil {
		return nil, err
	}
	return c, nil
}

// Rank returns this rank's index.
func (c *Comm) Rank() int { return c.cfg.Rank }

// NRanks returns the world size.
func (c *Comm) NRanks() int { return c.cfg.NRanks }

func (c *Comm) error(op string, r Result, detail string, err error) *Error {
	return &Error{Op: op, Label: c.cfg.Label, Rank: c.cfg.Rank, NRanks: c.cfg.NRanks, Result: r, Detail: detail, Err: err}
}

// asyncState returns the communicator's state: Success, InProgress, or the
// error that broke it.
func (c *Comm) asyncState() Result {
	st, r := ncclCommGetAsyncError(c.slot)
	if r != Success {
		return r
	}
	return st
}

// waitReady polls until the communicator leaves InProgress. On an error
// state or when ctx ends it aborts the communicator.
func (c *Comm) waitReady(ctx context.Context, op string) error {
	var failed Result
	err := gpu.Poll(ctx, func() (bool, error) {
		switch st := c.asyncState(); st {
		case Success:
			return true, nil
		case InProgress:
			return false, nil
		default:
			failed = st
			return false, st
		}
	})
	if err == nil {
		return nil
	}
	e := c.error(op, failed, lastError(), nil)
	if failed == Success {
		e.Err = err
	}
	c.abortLocked()
	e.Aborted = true
	return e
}

// Broadcast copies count bytes from sendPtr on the root rank to recvPtr on
// every rank (ncclBroadcast of ncclUint8; sendPtr == recvPtr is in place),
// queued on stream s, and waits until it is done: it polls an event recorded
// after the broadcast together with ncclCommGetAsyncError. When ctx ends
// before the broadcast is queued, nothing happens and the communicator stays
// usable; once queued, an ended ctx, an asynchronous NCCL error or a failed
// wait aborts the communicator (ncclCommAbort), and the *Error says so.
// Every rank must call Broadcast with the same count and root, in the same
// order.
func (c *Comm) Broadcast(ctx context.Context, sendPtr, recvPtr uint64, count, root int, s *gpu.Stream) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.error("broadcast", Success, "", ErrClosed)
	}
	switch {
	case count < 0:
		return c.error("broadcast", Success, "", fmt.Errorf("negative count %d", count))
	case root < 0 || root >= c.cfg.NRanks:
		return c.error("broadcast", Success, "", fmt.Errorf("root %d outside [0, %d)", root, c.cfg.NRanks))
	case s == nil || s.Device() != c.cfg.Device:
		return c.error("broadcast", Success, "", errors.New("the stream must belong to the communicator's device"))
	}
	if err := ctx.Err(); err != nil {
		return c.error("broadcast", Success, "", err)
	}
	unlock, err := c.cfg.Device.LockContext()
	if err != nil {
		return c.error("broadcast", Success, "", err)
	}
	r := ncclBroadcast(sendPtr, recvPtr, count, root, c.slot, s.Handle())
	detail := lastError()
	unlock()
	switch r {
	case Success:
	case InProgress: // a non-blocking communicator may still be queueing it
		if err := c.waitReady(ctx, "broadcast"); err != nil {
			return err
		}
	default:
		e := c.error("broadcast", r, detail, nil)
		c.abortLocked()
		e.Aborted = true
		return e
	}
	ev, err := s.Record()
	if err != nil {
		c.abortLocked()
		e := c.error("broadcast", Success, "", err)
		e.Aborted = true
		return e
	}
	defer ev.Close()
	var failed Result
	err = gpu.Poll(ctx, func() (bool, error) {
		if st := c.asyncState(); st != Success && st != InProgress {
			failed = st
			return false, st
		}
		return ev.Query()
	})
	if err == nil {
		return nil
	}
	e := c.error("broadcast", failed, "", nil)
	if failed == Success {
		e.Err = err
	}
	c.abortLocked()
	e.Aborted = true
	return e
}

// Abort aborts the communicator (ncclCommAbort): operations in flight are
// stopped and its resources freed. Abort is idempotent, and a no-op after
// Close.
func (c *Comm) Abort() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	if r := c.abortLocked(); r != Success && r != InProgress {
		return c.error("abort", r, "", nil)
	}
	return nil
}

func (c *Comm) abortLocked() Result {
	unlock, err := c.cfg.Device.LockContext()
	if err == nil {
		defer unlock()
	}
	r := ncclCommAbort(c.slot)
	c.closed = true
	c.freeSlot()
	return r
}

// Close shuts the communicator down cleanly: ncclCommFinalize, a wait
// (bounded by ctx) until every rank has finished, then ncclCommDestroy.
// When ctx ends first or NCCL reports an error, it aborts instead. Close is
// idempotent.
func (c *Comm) Close(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	unlock, err := c.cfg.Device.LockContext()
	if err != nil {
		c.abortLocked()
		e := c.error("finalize", Success, "", err)
		e.Aborted = true
		return e
	}
	r := ncclCommFinalize(c.slot)
	detail := lastError()
	unlock()
	switch r {
	case Success:
	case InProgress:
		if err := c.waitReady(ctx, "finalize"); err != nil {
			return err
		}
	default:
		e := c.error("finalize", r, detail, nil)
		c.abortLocked()
		e.Aborted = true
		return e
	}
	unlock, err = c.cfg.Device.LockContext()
	if err == nil {
		defer unlock()
	}
	r = ncclCommDestroy(c.slot)
	c.closed = true
	c.freeSlot()
	if r != Success && r != InProgress {
		return c.error("destroy", r, lastError(), nil)
	}
	return nil
}

func (c *Comm) freeSlot() {
	if c.slot != 0 {
		c.slot.free()
		c.slot = 0
	}
}
