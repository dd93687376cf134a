package route

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/blame"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/plan"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/wire"
)

// Config places one rank in a routed group and holds what it needs
// across rounds.
type Config struct {
	Group string
	// Rank is this rank's index in [0, WorldSize); ranks [0, Senders)
	// send, the others receive.
	Rank, Senders, WorldSize int
	// Pairs moves the buckets between senders and receivers.
	Pairs transport.Pairs
	// Exchange carries the layouts: the group's rendezvous.
	Exchange transport.Exchange
	// Publisher is rank 0's end of the metadata bus to every other rank;
	// Subscriber every other rank's end.
	Publisher  transport.Publisher
	Subscriber transport.Subscriber
	// Device is where the rank's bucket buffers live: host memory.
	Device mem.Device
	// BucketSize is the size of every bucket buffer, the seal included;
	// every rank must use the same.
	BucketSize int
	// Checksum seals every bucket with a checksum of its bytes, which its
	// receiver checks before writing any of them.
	Checksum bool
	// Auth, the run's keys when the group has a secret, seals every bucket
	// with a MAC bound to the version, the pair and its place instead, and
	// signs the bus's messages.
	Auth *auth.Keys
	// Links is the link model the plan balances over; the zero value is
	// one link of equal speed per rank.
	Links plan.Links
	// Timeout bounds each wait on the exchange (zero: 5 minutes); ctx
	// bounds everything.
	Timeout time.Duration
	// Tracer, when set, records each round's spans under Rank.
	Tracer *pipeline.Tracer
	// Blame, when set, is the rank's owner of lost-peer attribution:
	// a round failed on a lost peer hears its witnesses before the bus is
	// aborted. Nil hears the bus alone.
	Blame *blame.Watch
}

// Validate reports a Config that cannot run rounds.
func (c Config) Validate() error {
	switch {
	case c.Senders < 1 || c.Senders >= c.WorldSize:
		return fmt.Errorf("route: %d senders in a group of %d ranks: give at least one sender and one receiver", c.Senders, c.WorldSize)
	case c.Rank < 0 || c.Rank >= c.WorldSize:
		return fmt.Errorf("route: rank %d outside [0, %d)", c.Rank, c.WorldSize)
	case c.Pairs == nil || c.Exchange == nil || c.Device == nil:
		return errors.New("route: a config needs Pairs, an Exchange and a Device")
	case c.Rank == 0 && c.Publisher == nil:
		return errors.New("route: rank 0 needs the metadata bus's Publisher")
	case c.Rank > 0 && c.Subscriber == nil:
		return fmt.Errorf("route: rank %d needs the metadata bus's Subscriber", c.Rank)
	}
	s := sealer{c.Checksum, c.Auth}
	if c.BucketSize <= s.size() {
		return fmt.Errorf("route: a bucket size of %d bytes leaves no room for data", c.BucketSize)
	}
	return nil
}

// Stats describes one rank's finished (or failed) round.
type Stats struct {
	Version uint64
	// BytesSent and BytesReceived count the payload of the rank's
	// buckets (their seals not included): what the plan gave it.
	BytesSent, BytesReceived int64
	Buckets                  int
	// Peers counts the ranks this rank exchanged buckets with.
	Peers    int
	Duration time.Duration
	// Waited is the part of Duration this rank spent waiting for the
	// others to begin the round (rank 0 for every rank's layout digest,
	// the others for rank 0's start message): Duration less Waited is
	// the round from the moment every rank was in it to its commit.
	Waited time.Duration
	// Plan is the plan's digest (hex); Replanned says the round made it
	// (the first round, or a layout changed).
	Plan      string
	Replanned bool
	// Balance is the plan's busiest sender's bytes over the mean.
	Balance float64
	Stages  []pipeline.Metrics
}

// member is what a Sender and a Receiver share: the round's control (the
// layouts, the plan, the bus) and the pairs' buffers.
type member struct {
	cfg   Config
	seal  sealer
	bus   uint64 // the next bus message's sequence number
	round uint64 // rounds begun

	declared string                 // the digest of the layout this rank last published
	decls    map[string]declaration // every layout seen, by digest
	planKey  string                 // the digests the plan was made from
	sched    *Schedule
	next     map[int]uint64 // each pair's next bucket seq, by peer
	pools    map[int]*stages.Pool
	engines  map[string]engine // by pair stage

	committed atomic.Uint64
	broken    error
	waited    time.Duration // the last round's wait for the others to begin
}

func newMember(cfg Config) *member {
	return &member{cfg: cfg, seal: sealer{cfg.Checksum, cfg.Auth}, decls: map[string]declaration{}, next: map[int]uint64{}, pools: map[int]*stages.Pool{}, engines: map[string]engine{}}
}

// ErrBroken is stages.ErrBroken: a failed round leaves the rank broken.
var ErrBroken = stages.ErrBroken

func (m *member) timeout() time.Duration {
	if m.cfg.Timeout > 0 {
		return m.cfg.Timeout
	}
	return transport.DefaultTimeout
}

// Keys of the exchange: a rank's layout by digest, and the digest of the
// layout it uses in its n-th round.
func layoutKey(digest string) string { return "route.layout." + digest }
func roundKey(n uint64) string       { return fmt.Sprintf("route.round.%d", n) }

// begin starts a round with this rank's layout decl: it publishes the
// layout, learns everyone's (rank 0 gathers the digests and publishes
// them with version in the round's start message), and returns the
// round's version and whether the plan was made anew. version is 0 on a
// receiver, which learns it.
func (m *member) begin(ctx context.Context, version uint64, decl declaration) (uint64, bool, error) {
	body, digest := decl.encode()
	m.round++
	ex := m.cfg.Exchange
	xctx, cancel := context.WithTimeout(ctx, m.timeout())
	defer cancel()
	if digest != m.declared {
		if err := ex.Put(xctx, layoutKey(digest), body); err != nil {
			return 0, false, fmt.Errorf("publishing this rank's layout: %w", err)
		}
		m.declared = digest
		m.decls[digest] = decl
	}
	if err := ex.Put(xctx, roundKey(m.round), []byte(digest)); err != nil {
		return 0, false, fmt.Errorf("publishing this rank's layout digest: %w", err)
	}
	began := time.Now()
	start, err := m.start(xctx, ctx, version)
	m.waited = time.Since(began)
	if err != nil {
		return 0, false, err
	}
	if start.Layouts[m.cfg.Rank] != digest {
		return 0, false, fmt.Errorf("rank 0 lists layout %s for this rank, which published %s", start.Layouts[m.cfg.Rank][:12], digest[:12])
	}
	g, gctx := errgroup.WithContext(xctx)
	got := make([]declaration, len(start.Layouts))
	for r, d := range start.Layouts {
		if have, ok := m.decls[d]; ok {
			got[r] = have
			continue
		}
		g.Go(func() error {
			b, err := ex.Get(gctx, r, layoutKey(d))
			if err != nil {
				return fmt.Errorf("fetching rank %d's layout: %w", r, err)
			}
			if got[r], err = decodeDeclaration(b, d); err != nil {
				return fmt.Errorf("rank %d's layout: %w", r, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, false, err
	}
	for r, d := range start.Layouts {
		m.decls[d] = got[r]
	}
	key := strings.Join(start.Layouts, ",")
	if key == m.planKey {
		return start.Version, false, nil
	}
	snd, rcv, err := layouts(got, m.cfg.Senders)
	if err != nil {
		return 0, false, err
	}
	links := m.cfg.Links
	if links == (plan.Links{}) {
		links = plan.Links{NIC: 1}
	}
	p, err := plan.Make(snd, rcv, links)
	if err != nil {
		return 0, false, fmt.Errorf("planning: %w", err)
	}
	sc, err := NewSchedule(p, m.cfg.Rank, m.cfg.Senders, int64(m.cfg.BucketSize-m.seal.size()))
	if err != nil {
		return 0, false, err
	}
	m.sched, m.planKey = sc, key
	return start.Version, true, nil
}

// start is the round's start message: published by rank 0 once it has
// every rank's layout digest, received by the others. xctx bounds the
// exchange, ctx the bus.
func (m *member) start(xctx, ctx context.Context, version uint64) (wire.RouteStart, error) {
	seq := m.bus
	if m.cfg.Rank == 0 {
		st := wire.RouteStart{Version: version, Senders: m.cfg.Senders, Layouts: make([]string, m.cfg.WorldSize)}
		g, gctx := errgroup.WithContext(xctx)
		for r := range st.Layouts {
			g.Go(func() error {
				d, err := m.cfg.Exchange.Get(gctx, r, roundKey(m.round))
				if err != nil {
					return fmt.Errorf("waiting for rank %d's layout of round %d: %w", r, m.round, err)
				}
				if raw, err := hex.DecodeString(string(d)); err != nil || len(raw) != 32 {
					return fmt.Errorf("rank %d published layout digest %q: not 64 hex digits", r, d)
				}
				st.Layouts[r] = string(d)
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return st, err
		}
		if err := m.cfg.Publisher.Publish(ctx, seq, wire.Seal(m.cfg.Auth, seq, wire.EncodeRouteStart(st))); err != nil {
			return st, fmt.Errorf("starting version %d: %w", version, err)
		}
		return st, nil
	}
	msg, err := m.cfg.Subscriber.Recv(ctx)
	if err != nil {
		return wire.RouteStart{}, fmt.Errorf("waiting for rank 0 to start a round: %w", err)
	}
	if msg.Seq != seq {
		return wire.RouteStart{}, fmt.Errorf("expected a round's start as message %d, got message %d", seq, msg.Seq)
	}
	data, err := wire.Open(m.cfg.Auth, msg.Seq, msg.Data)
	if err != nil {
		return wire.RouteStart{}, fmt.Errorf("the round's start message: %w", err)
	}
	st, err := wire.DecodeRouteStart(data)
	switch {
	case err != nil:
		return st, err
	case st.Senders != m.cfg.Senders || len(st.Layouts) != m.cfg.WorldSize:
		return st, fmt.Errorf("rank 0 runs %d senders of %d ranks, this rank %d of %d: start every rank with the same numbers", st.Senders, len(st.Layouts), m.cfg.Senders, m.cfg.WorldSize)
	case version != 0 && st.Version != version:
		return st, fmt.Errorf("rank 0 sends version %d where this sender sends version %d: give every sender the same version", st.Version, version)
	}
	return st, nil
}

// finish ends a round whose part on this rank is done: every other rank
// acknowledges the start message, rank 0 waits for them all and
// announces the commit, and the others wait for it.
func (m *member) finish(ctx context.Context, version uint64) error {
	seq := m.bus
	if m.cfg.Rank == 0 {
		if err := m.cfg.Publisher.Sync(ctx); err != nil {
			return fmt.Errorf("waiting for every rank to finish version %d: %w", version, err)
		}
		return stages.AnnounceCommit(ctx, m.cfg.Publisher, seq+1, version, m.cfg.Auth)
	}
	if err := m.cfg.Subscriber.Ack(ctx, seq); err != nil {
		return fmt.Errorf("telling rank 0 this rank's part of version %d is done: %w", version, err)
	}
	return stages.AwaitCommit(ctx, m.cfg.Subscriber, seq+1, version, m.cfg.Auth)
}

// busEnd returns the rank's end of the metadata bus.
func (m *member) busEnd() any {
	if m.cfg.Rank == 0 {
		return m.cfg.Publisher
	}
	return m.cfg.Subscriber
}

// run runs one round: begin, the rank's part (part, given the schedule),
// finish; a failure aborts the bus with its reason and breaks the rank.
func (m *member) run(ctx context.Context, version uint64, decl declaration, part func(context.Context, *Schedule, uint64) (*pipeline.Pipeline, error), commit func(uint64) error) (Stats, error) {
	if m.broken != nil {
		return Stats{}, fmt.Errorf("rank %d %w: %w", m.cfg.Rank, ErrBroken, m.broken)
	}
	if c := m.committed.Load(); version != 0 && version <= c {
		return Stats{}, fmt.Errorf("%w: model version %d is not above the last committed version %d: give every round a higher version", stages.ErrStaleVersion, version, c)
	}
	began := time.Now()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := m.cfg.Blame.Round(ctx, cancel, m.busEnd())
	defer stop()
	var st Stats
	v, replanned, err := m.begin(ctx, version, decl)
	if err == nil {
		st.Version, st.Replanned = v, replanned
		sum := m.sched.Plan.Digest()
		st.Plan = hex.EncodeToString(sum[:])
		if ps := m.sched.Plan.Stats; ps.SentMean > 0 {
			st.Balance = float64(ps.SentMax) / ps.SentMean
		}
		var p *pipeline.Pipeline
		p, err = part(ctx, m.sched, v)
		if p != nil {
			st.Stages = p.Metrics()
		}
	}
	if err == nil {
		err = m.finish(ctx, v)
	}
	if err == nil && commit != nil {
		err = commit(v)
	}
	st.Duration, st.Waited = time.Since(began), m.waited
	if err != nil {
		err = blame.Merge(err, context.Cause(ctx))
		err = m.cfg.Blame.Abort(fmt.Errorf("rank %d, round %d: %w", m.cfg.Rank, m.round, err), m.busEnd())
		m.broken = err
		return st, err
	}
	for _, s := range m.sched.Streams {
		peer := s.Receiver
		if m.cfg.Rank >= m.cfg.Senders {
			peer = s.Sender
		}
		m.next[peer] += uint64(len(s.Buckets))
		st.Buckets += len(s.Buckets)
		if m.cfg.Rank < m.cfg.Senders {
			st.BytesSent += s.Bytes
		} else {
			st.BytesReceived += s.Bytes
		}
	}
	st.Peers = len(m.sched.Streams)
	m.bus += 2 // the start and the commit
	m.committed.Store(v)
	return st, nil
}

// pool returns the two buffers of the pair with peer.
func (m *member) pool(peer int) (*stages.Pool, error) {
	if p, ok := m.pools[peer]; ok {
		return p, nil
	}
	p, err := stages.NewPool(m.cfg.Device, stages.DefaultBuffers, m.cfg.BucketSize)
	if err != nil {
		return nil, err
	}
	m.pools[peer] = p
	return p, nil
}

// engine returns the engine of the pair stage called stage.
func (m *member) engine(stage string) (engine, error) {
	if e, ok := m.engines[stage]; ok {
		return e, nil
	}
	e, err := newEngine(m.cfg.Device)
	if err != nil {
		return nil, err
	}
	m.engines[stage] = e
	return e, nil
}

// Committed returns the last version committed on every receiver, or 0.
func (m *member) Committed() uint64 { return m.committed.Load() }

// maxHeld is the most bucket buffers the rank's pairs held at once,
// every pair's together (each pair's pool peaking at two).
func (m *member) maxHeld() int {
	n := 0
	for _, p := range m.pools {
		n += p.MaxHeld()
	}
	return n
}

// Close frees the pairs' buffers and GPU state (not Pairs, the Exchange or
// the bus, which stay the caller's). It is idempotent.
func (m *member) Close() error {
	var errs []error
	for stage, e := range m.engines {
		ctx, cancel := context.WithTimeout(context.Background(), m.timeout())
		errs = append(errs, e.close(ctx))
		cancel()
		delete(m.engines, stage)
	}
	for peer, p := range m.pools {
		errs = append(errs, p.Close())
		delete(m.pools, peer)
	}
	return errors.Join(errs...)
}

// item is one bucket between a pair's two stages; Release returns its
// buffer: to the pool, or, for a bucket borrowed from the sender, to the
// sender (lent).
type item struct {
	buf  mem.Buffer
	pool *stages.Pool
	lent func(error) error
	seq  uint64
	n    int // payload bytes
	b    *Bucket
}

func (it *item) Release() {
	if it.lent != nil {
		it.lent(nil)
		return
	}
	it.pool.Put(it.buf)
}
func (it *item) ByteSize() int64 { return int64(it.n) }
