package inproc

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weightcast/weightcast/transport"
)

// bus carries one group's metadata inside the process.
type bus struct {
	group  string
	world  int
	window int

	mu      sync.Mutex
	queues  []chan transport.Message // per receiver, capacity window
	next    []uint64                 // per receiver: lowest sequence number not yet acknowledged
	changed chan struct{}            // closed and replaced on every ack
	joined  []bool
	nJoined int
	all     chan struct{} // closed when every subscriber has joined
	gone    []chan struct{}
	users   int
	// The first Abort: its rank and reason, set before aborted is
	// closed.
	abortBy  int
	abortErr error
	aborted  chan struct{}
}

var buses = map[string]*bus{}

func getBus(cfg transport.Config) (*bus, error) {
	mu.Lock()
	defer mu.Unlock()
	b, ok := buses[cfg.Group]
	if !ok {
		b = &bus{group: cfg.Group, world: cfg.WorldSize, window: transport.DefaultWindow,
			queues: make([]chan transport.Message, cfg.WorldSize), next: make([]uint64, cfg.WorldSize),
			changed: make(chan struct{}), joined: make([]bool, cfg.WorldSize), all: make(chan struct{}),
			gone: make([]chan struct{}, cfg.WorldSize), aborted: make(chan struct{})}
		for r := range b.queues {
			b.queues[r] = make(chan transport.Message, b.window)
			b.gone[r] = make(chan struct{})
		}
		buses[cfg.Group] = b
	}
	if b.world != cfg.WorldSize {
		return nil, fmt.Errorf("world size mismatch: this rank says %d, the group was opened with %d", cfg.WorldSize, b.world)
	}
	if b.joined[cfg.Rank] {
		return nil, fmt.Errorf("rank %d joined twice; give every rank a distinct rank", cfg.Rank)
	}
	b.joined[cfg.Rank] = true
	b.users++
	if cfg.Rank != 0 {
		b.nJoined++
		if b.nJoined == b.world-1 {
			close(b.all)
		}
	}
	return b, nil
}

func (b *bus) leave(rank int) {
	mu.Lock()
	defer mu.Unlock()
	close(b.gone[rank])
	b.mu.Lock()
	close(b.changed) // wake a publisher so it sees the departure
	b.changed = make(chan struct{})
	b.mu.Unlock()
	b.users--
	if b.users == 0 && buses[b.group] == b {
		delete(buses, b.group)
	}
}

// abort records the first rank to give up and why, and wakes every waiter.
func (b *bus) abort(rank int, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.abortErr != nil {
		return
	}
	b.abortBy, b.abortErr = rank, err
	close(b.aborted)
}

// abortedErr is the error a rank other than the one that aborted sees.
func (b *bus) abortedErr(cfg transport.Config, op string, seq uint64) error {
	who := fmt.Sprintf("rank %d", b.abortBy)
	if b.abortBy == 0 {
		who = "the root"
	}
	return metaErr(cfg, op, seq, true, b.abortBy, fmt.Errorf("round aborted: %s gave up: %v", who, b.abortErr))
}

func metaErr(cfg transport.Config, op string, seq uint64, hasSeq bool, peer int, err error) error {
	return &transport.Error{Transport: Name + "-meta", Group: cfg.Group, Rank: cfg.Rank, Op: op, Seq: seq, HasSeq: hasSeq, Peer: peer, Err: err}
}

// OpenPublisher opens the root's side of the in-process metadata bus of
// cfg.Group. cfg.Rank must be 0.
func OpenPublisher(ctx context.Context, cfg transport.Config) (transport.Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Rank != 0 {
		return nil, metaErr(cfg, "open", 0, false, -1, fmt.Errorf("only rank 0 publishes metadata, not rank %d", cfg.Rank))
	}
	b, err := getBus(cfg)
	if err != nil {
		return nil, metaErr(cfg, "open", 0, false, -1, err)
	}
	return &publisher{b: b, cfg: cfg}, nil
}

// OpenSubscriber opens a receiver's side of the in-process metadata bus of
// cfg.Group. cfg.Rank must be 1 or more.
func OpenSubscriber(ctx context.Context, cfg transport.Config) (transport.Subscriber, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Rank == 0 {
		return nil, metaErr(cfg, "open", 0, false, -1, fmt.Errorf("rank 0 is the publisher and cannot subscribe"))
	}
	b, err := getBus(cfg)
	if err != nil {
		return nil, metaErr(cfg, "open", 0, false, -1, err)
	}
	return &subscriber{b: b, cfg: cfg}, nil
}

type publisher struct {
	b     *bus
	cfg   transport.Config
	next  uint64 // next sequence number to publish
	once  sync.Once
	ready bool
}

// Publish waits for every subscriber to join (the first time), then for
// window room on every subscriber, then queues a copy of msg to each.
func (p *publisher) Publish(ctx context.Context, seq uint64, msg []byte) error {
	if seq != p.next {
		return metaErr(p.cfg, "publish", seq, true, -1, fmt.Errorf("out of order: expected sequence number %d", p.next))
	}
	timer := time.NewTimer(p.cfg.WaitTimeout())
	defer timer.Stop()
	if !p.ready {
		select {
		case <-p.b.all:
			p.ready = true
		case <-ctx.Done():
			return metaErr(p.cfg, "publish", seq, true, -1, transport.ContextErr(ctx))
		case <-timer.C:
			return metaErr(p.cfg, "publish", seq, true, -1, fmt.Errorf("subscribers never joined within %v: %w", p.cfg.WaitTimeout(), transport.ErrTimeout))
		}
	}
	if err := p.waitFor(ctx, timer, seq, func(next uint64) bool { return seq < next+uint64(p.b.window) }); err != nil {
		return err
	}
	for r := 1; r < p.b.world; r++ {
		// Never blocks: fewer than window messages are outstanding.
		p.b.queues[r] <- transport.Message{Seq: seq, Data: append([]byte(nil), msg...)}
	}
	p.next++
	return nil
}

// waitFor waits until ok(next[r]) holds for every receiver r.
func (p *publisher) waitFor(ctx context.Context, timer *time.Timer, seq uint64, ok func(next uint64) bool) error {
	for {
		select {
		case <-p.b.gone[0]:
			return metaErr(p.cfg, "publish", seq, true, -1, transport.ErrClosed)
		default:
		}
		p.b.mu.Lock()
		lagging, changed := -1, p.b.changed
		for r := 1; r < p.b.world; r++ {
			if ok(p.b.next[r]) {
				continue
			}
			select {
			case <-p.b.gone[r]:
				p.b.mu.Unlock()
				return metaErr(p.cfg, "publish", seq, true, r, transport.ErrPeerGone)
			default:
			}
			if lagging < 0 {
				lagging = r
			}
		}
		p.b.mu.Unlock()
		if lagging < 0 {
			return nil
		}
		select {
		case <-changed:
		case <-p.b.aborted:
			return p.b.abortedErr(p.cfg, "publish", seq)
		case <-ctx.Done():
			return metaErr(p.cfg, "publish", seq, true, lagging, transport.ContextErr(ctx))
		case <-timer.C:
			return metaErr(p.cfg, "publish", seq, true, lagging, fmt.Errorf("no acknowledgement within %v: %w", p.cfg.WaitTimeout(), transport.ErrTimeout))
		}
	}
}

// Sync waits until every subscriber acknowledged everything published.
func (p *publisher) Sync(ctx context.Context) error {
	timer := time.NewTimer(p.cfg.WaitTimeout())
	defer timer.Stop()
	return p.waitFor(ctx, timer, p.next, func(next uint64) bool { return next >= p.next })
}

// Abort makes every subscriber's waits fail with err, the reason the
// root gave up its round.
func (p *publisher) Abort(err error) { p.b.abort(0, err) }

func (p *publisher) Close() error {
	p.once.Do(func() { p.b.leave(0) })
	return nil
}

type subscriber struct {
	b    *bus
	cfg  transport.Config
	want atomic.Uint64 // next sequence number to receive; Ack reads it from another goroutine
	once sync.Once
}

// Recv returns the next message. Messages queued before the root left or
// the bus was aborted are still handed over.
func (s *subscriber) Recv(ctx context.Context) (transport.Message, error) {
	queue := s.b.queues[s.cfg.Rank]
	select {
	case m := <-queue:
		return s.take(m)
	default:
	}
	timer := time.NewTimer(s.cfg.WaitTimeout())
	defer timer.Stop()
	select {
	case m := <-queue:
		return s.take(m)
	case <-s.b.gone[0]:
		s.b.mu.Lock()
		ended := s.b.next[s.cfg.Rank] == s.want.Load() // everything received is acknowledged
		s.b.mu.Unlock()
		if ended {
			return s.last(metaErr(s.cfg, "recv", s.want.Load(), true, 0, fmt.Errorf("%w: the root closed the bus", transport.ErrEnded)))
		}
		return s.last(metaErr(s.cfg, "recv", s.want.Load(), true, 0, transport.ErrPeerGone))
	case <-s.b.aborted:
		if s.b.abortBy != s.cfg.Rank {
			return s.last(s.b.abortedErr(s.cfg, "recv", s.want.Load()))
		}
		return s.last(metaErr(s.cfg, "recv", s.want.Load(), true, -1, fmt.Errorf("this rank aborted: %v", s.b.abortErr)))
	case <-ctx.Done():
		return transport.Message{}, metaErr(s.cfg, "recv", s.want.Load(), true, 0, transport.ContextErr(ctx))
	case <-timer.C:
		return transport.Message{}, metaErr(s.cfg, "recv", s.want.Load(), true, 0, fmt.Errorf("no metadata within %v: %w", s.cfg.WaitTimeout(), transport.ErrTimeout))
	}
}

// last returns a message queued before the end of the bus, or err.
func (s *subscriber) last(err error) (transport.Message, error) {
	select {
	case m := <-s.b.queues[s.cfg.Rank]:
		return s.take(m)
	default:
		return transport.Message{}, err
	}
}

func (s *subscriber) take(m transport.Message) (transport.Message, error) {
	if want := s.want.Load(); m.Seq != want {
		return transport.Message{}, metaErr(s.cfg, "recv", m.Seq, true, 0, fmt.Errorf("expected message %d: metadata lost or reordered", want))
	}
	s.want.Add(1)
	return m, nil
}

func (s *subscriber) Ack(ctx context.Context, seq uint64) error {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	r := s.cfg.Rank
	if want := s.want.Load(); seq != s.b.next[r] || seq >= want {
		return metaErr(s.cfg, "ack", seq, true, -1, fmt.Errorf("acknowledged out of order: next to acknowledge is %d, received up to %d", s.b.next[r], want))
	}
	s.b.next[r]++
	close(s.b.changed)
	s.b.changed = make(chan struct{})
	return nil
}

// Abort makes the root's waits (and every other subscriber's) fail with
// err, the reason this receiver gave up its round.
func (s *subscriber) Abort(err error) { s.b.abort(s.cfg.Rank, err) }

func (s *subscriber) Close() error {
	s.once.Do(func() { s.b.leave(s.cfg.Rank) })
	return nil
}
