package inproc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weightcast/weightcast/internal/parallel"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
)

// Name is the registry name of this transport.
const Name = "inproc"

// hub joins the ranks of one group inside the process.
type hub struct {
	group  string
	world  int
	joined []bool
	all    chan struct{} // closed when every rank has joined
	nJoin  int
	gone   []chan struct{} // closed when a rank's endpoint closes
	inbox  []chan delivery // per receiver
}

type delivery struct {
	seq  uint64
	data []byte
	done chan error
}

var (
	mu   sync.Mutex
	hubs = map[string]*hub{}
)

func getHub(group string, world int) (*hub, error) {
	mu.Lock()
	defer mu.Unlock()
	h, ok := hubs[group]
	if !ok {
		h = &hub{group: group, world: world, joined: make([]bool, world), all: make(chan struct{}),
			gone: make([]chan struct{}, world), inbox: make([]chan delivery, world)}
		for r := range world {
			h.gone[r] = make(chan struct{})
			h.inbox[r] = make(chan delivery)
		}
		hubs[group] = h
	}
	if h.world != world {
		return nil, fmt.Errorf("world size mismatch: this rank says %d, the group was opened with %d", world, h.world)
	}
	return h, nil
}

// Open joins cfg.Rank to the in-process group cfg.Group and waits until every
// rank of the group has joined. Buffers must be host memory.
func Open(ctx context.Context, cfg transport.Config) (transport.Endpoint, error) {
	fail := func(err error) error {
		return &transport.Error{Transport: Name, Group: cfg.Group, Rank: cfg.Rank, Op: "open", Peer: -1, Err: err}
	}
	h, err := getHub(cfg.Group, cfg.WorldSize)
	if err != nil {
		return nil, fail(err)
	}
	mu.Lock()
	if h.joined[cfg.Rank] {
		mu.Unlock()
		return nil, fail(fmt.Errorf("rank %d joined twice; give every rank a distinct rank", cfg.Rank))
	}
	h.joined[cfg.Rank] = true
	h.nJoin++
	if h.nJoin == h.world {
		close(h.all)
	}
	mu.Unlock()
	e := &endpoint{h: h, cfg: cfg}
	if err := waitAll(ctx, cfg.WaitTimeout(), h.all, func() []int { return missing(h.joined) }); err != nil {
		e.Close()
		return nil, fail(err)
	}
	return e, nil
}

func missing(joined []bool) []int {
	mu.Lock()
	defer mu.Unlock()
	var out []int
	for r, ok := range joined {
		if !ok {
			out = append(out, r)
		}
	}
	return out
}

func waitAll(ctx context.Context, d time.Duration, all chan struct{}, miss func() []int) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-all:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for ranks %v: %w", miss(), transport.ContextErr(ctx))
	case <-t.C:
		return fmt.Errorf("ranks %v never joined within %v: %w", miss(), d, transport.ErrTimeout)
	}
}

type endpoint struct {
	h      *hub
	cfg    transport.Config
	closed atomic.Bool
	close  sync.Once
}

func (e *endpoint) err(op string, seq uint64, peer int, err error) error {
	return &transport.Error{Transport: Name, Group: e.cfg.Group, Rank: e.cfg.Rank, Op: op, Seq: seq, HasSeq: true, Peer: peer, Err: err}
}

// Broadcast copies the root's buf[:n] into every receiver's buf (a large
// bucket on several goroutines: one core's memcpy would limit a host sync).
func (e *endpoint) Broadcast(ctx context.Context, seq uint64, buf mem.Buffer, n int) error {
	if e.closed.Load() {
		return e.err("broadcast", seq, -1, transport.ErrClosed)
	}
	if buf.Host() == nil {
		return e.err("broadcast", seq, -1, errors.New("inproc needs host buffers; use the ipc or nccl transport for device memory"))
	}
	if n < 0 || n > buf.Len() {
		return e.err("broadcast", seq, -1, fmt.Errorf("length %d outside buffer of %d bytes", n, buf.Len()))
	}
	timer := time.NewTimer(e.cfg.WaitTimeout())
	defer timer.Stop()
	h, me := e.h, e.cfg.Rank
	if me != 0 {
		select {
		case d := <-h.inbox[me]:
			if d.seq != seq || len(d.data) != n {
				err := fmt.Errorf("root sent bucket %d of %d bytes, receiver expected bucket %d of %d bytes", d.seq, len(d.data), seq, n)
				d.done <- err
				return e.err("broadcast", seq, 0, err)
			}
			parallel.Copy(buf.Host()[:n], d.data)
			d.done <- nil
			return nil
		case <-h.gone[0]:
			return e.err("broadcast", seq, 0, transport.ErrPeerGone)
		case <-ctx.Done():
			return e.err("broadcast", seq, -1, transport.ContextErr(ctx))
		case <-timer.C:
			return e.err("broadcast", seq, 0, fmt.Errorf("no bytes from the root within %v: %w", e.cfg.WaitTimeout(), transport.ErrTimeout))
		}
	}
	done := make(chan error, h.world)
	data := buf.Host()[:n]
	handed := 0 // receivers that hold a reference to data
	var failure error
	for r := 1; r < h.world && failure == nil; r++ {
		select {
		case h.inbox[r] <- delivery{seq: seq, data: data, done: done}:
			handed++
		case <-h.gone[r]:
			failure = e.err("broadcast", seq, r, transport.ErrPeerGone)
		case <-ctx.Done():
			failure = e.err("broadcast", seq, r, transport.ContextErr(ctx))
		case <-timer.C:
			failure = e.err("broadcast", seq, r, fmt.Errorf("receiver did not take the bucket within %v: %w", e.cfg.WaitTimeout(), transport.ErrTimeout))
		}
	}
	// Every receiver that took the bucket copies out of buf until it
	// answers, and it always answers (the copy is synchronous), so the
	// root waits for each before it returns and lets buf be reused, even
	// when it is giving up.
	for range handed {
		if err := <-done; err != nil && failure == nil {
			failure = e.err("broadcast", seq, -1, err)
		}
	}
	return failure
}

// Close leaves the group; peers waiting on this rank see ErrPeerGone, and
// Broadcast on this endpoint returns ErrClosed. It is idempotent.
func (e *endpoint) Close() error {
	e.closed.Store(true)
	e.close.Do(func() {
		mu.Lock()
		defer mu.Unlock()
		close(e.h.gone[e.cfg.Rank])
		e.h.joined[e.cfg.Rank] = false
		e.h.nJoin--
		if e.h.nJoin == 0 && hubs[e.h.group] == e.h {
			delete(hubs, e.h.group)
		}
	})
	return nil
}
