package weightcast

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/blame"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/internal/owned"
	"github.com/weightcast/weightcast/internal/testhook"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/rendezvous"
	"github.com/weightcast/weightcast/rendezvous/embedetcd"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/transport"
)

// ErrClosed is wrapped by the error of a call on a closed Sender or
// Receiver, and of a round that Close ended.
var ErrClosed = errors.New("closed")

// ErrInterrupted is the cause a caller gives the context of an open it
// gives up (the C library's wc_interrupt, on Ctrl-C): the other ranks of
// the run are told, and KindOf counts it as KindAborted.
var ErrInterrupted = errors.New("interrupted")

// keyBucket is the rank's bucket size in bytes, which every rank
// publishes when it joins besides the facts the transports' registry
// reads (transport.FactHost, FactGPUs and each transport's own): every
// rank must use the same, which the join checks.
const keyBucket = "weightcast.bucket"

// member is what a Sender and a Receiver share: one rank's place in a
// group and everything it opened, released in reverse order by Close.
type member struct {
	opts   Options
	role   string
	desc   transport.Descriptor // the transport in use (Name "custom": an Options.Endpoint of no registered transport)
	reason string               // why it was chosen

	emb      *embedetcd.Server
	keys     *auth.Keys // the run's keys from the group secret; nil without one
	tls      *auth.TLS  // nil: plain connections
	group    *rendezvous.Group
	dev      mem.Device
	closeDev func() error
	endpoint transport.Endpoint
	pairs    transport.Pairs // a routed group's, in place of endpoint
	pub      transport.Publisher
	sub      transport.Subscriber
	pool     *stages.Pool
	extra    []func() error // released first, in order: the stages Sender's or Receiver's GPU state, a Sender's tensor devices
	// ownBus and ownEndpoint say this rank opened them (rather than took
	// them from Options), so its Close closes them.
	ownBus, ownEndpoint bool

	mu      sync.Mutex
	closed  bool
	cancel  context.CancelCauseFunc // the running round's
	running chan struct{}           // closed when the running round has returned
	aborted error
	// blame owns who is to blame for a lost peer across the rank's open
	// and rounds: the bus's and the rendezvous's watchers, the grace, the
	// witnesses the stages hear.
	blame *blame.Watch
	once  sync.Once
	err   error // Close's
}

// open places this process in the group as role ("sender", "receiver").
func open(ctx context.Context, o Options, role string) (_ *member, err error) {
	if err := o.check(role); err != nil {
		return nil, err
	}
	m := &member{opts: o, role: role}
	defer func() {
		if err != nil {
			err = errors.Join(err, m.release())
		}
	}()
	if !o.TLS.IsZero() {
		if m.tls, err = o.TLS.Load(); err != nil {
			return nil, fmt.Errorf("%w: %s: TLS: %w", ErrConfig, m.who(), err)
		}
	}
	switch {
	case o.Endpoint != nil:
		m.desc, m.reason = transport.Descriptor{Name: "custom"}, "given in Options.Endpoint"
		if d, ok := transport.Lookup(o.Transport); ok {
			m.desc = d
		}
	case o.Transport != "auto":
		m.desc, _ = transport.Lookup(o.Transport) // check saw it registered
		m.reason = "chosen"
	}
	if m.desc.InProcess {
		m.blame = newBlame(nil)
		if o.Endpoint == nil {
			m.reason = "chosen: every rank in this process"
		}
		m.dev = m.hostMemory()
		if err := m.openLinks(ctx, m.config(nil)); err != nil {
			return nil, err
		}
	} else {
		if err := m.join(ctx); err != nil {
			return nil, err
		}
		m.blame = newBlame(m.group)
		peers := m.peers()
		if m.desc.Name == "" {
			cands := transport.Candidates()
			if o.Senders > 0 {
				cands = slices.DeleteFunc(cands, func(d transport.Descriptor) bool { return d.OpenPairs == nil })
			}
			if m.desc, m.reason, err = transport.ChooseAmong(cands, peers); err != nil {
				return nil, fmt.Errorf("%s: %w", m.who(), err)
			}
		}
		if err := m.openDevice(peers); err != nil {
			return nil, err
		}
		if err := m.openWatched(ctx); err != nil {
			return nil, err
		}
	}
	if o.Senders == 0 { // a routed group's buffers are its pairs' (route)
		if m.pool, err = stages.NewPool(m.dev, stages.DefaultBuffers, int(o.BucketSize)); err != nil {
			return nil, fmt.Errorf("%s: %w", m.who(), err)
		}
	}
	if m.group != nil {
		// No rank starts a round before every rank is open: a transport's
		// open may still need the rendezvous after its own side is up (a
		// tcp receiver looks up its successor), and a rank 0 whose first
		// round failed at once would otherwise leave, taking the
		// rendezvous it served with it, while a receiver still waits on it
		// (docs/protocol.md, "A run, step by step").
		if err := m.group.Barrier(ctx, "open"); err != nil {
			return nil, fmt.Errorf("%s: waiting for every rank to open: %w", m.who(), err)
		}
	}
	return m, nil
}

func (m *member) who() string {
	return fmt.Sprintf("group %q rank %d (%s)", m.opts.Group, m.opts.Rank, m.role)
}

func (m *member) hostMemory() mem.Device {
	if m.opts.HostMemory != nil {
		return m.opts.HostMemory
	}
	return mem.Host{}
}

// join meets the other ranks: serving the rendezvous first on a rank 0
// that serves it, and publishing what "auto" needs to know of this rank.
func (m *member) join(ctx context.Context) error {
	o := &m.opts
	addr, _ := RendezvousAddr(o.Rendezvous)
	if o.ServeRendezvous && o.Rank == 0 {
		// What served rendezvous of killed runs left in the temporary
		// directory goes first (a trainer killed with -9 leaves its etcd's
		// data); a live run's is kept.
		owned.Sweep(embedetcd.DirPrefix)
		emb, err := embedetcd.Start(ctx, embedetcd.Options{Addr: addr, TLS: o.TLS})
		if err != nil {
			return fmt.Errorf("%s: serving the rendezvous on %s: %w", m.who(), addr, err)
		}
		m.emb = emb
	}
	store, err := rendezvous.DialEtcd(ctx, []string{addr}, o.Timeout, rendezvous.WithTLS(m.tls), rendezvous.WithLogger(o.Logger))
	if err != nil {
		return fmt.Errorf("%s: %w", m.who(), err)
	}
	if o.RunID == "" {
		// A served rendezvous is the run's own (check allows no run id
		// only then): rank 0 names the run there, the others read it.
		if o.Rank == 0 {
			o.RunID = rendezvous.NewRunID()
			err = rendezvous.PublishServedRun(ctx, store, o.Group, o.RunID, o.Secret)
		} else {
			o.RunID, err = rendezvous.AwaitServedRun(ctx, store, o.Group, o.Rank, o.Secret, o.Timeout)
		}
		if err != nil {
			store.Close()
			return fmt.Errorf("%s: %w", m.who(), err)
		}
	}
	if o.Secret != nil {
		if m.keys, err = o.Secret.RunKeys(o.Group, o.RunID); err != nil {
			store.Close()
			return fmt.Errorf("%w: %s: %w", ErrConfig, m.who(), err)
		}
	}
	g, err := rendezvous.Join(ctx, store, rendezvous.JoinOptions{
		Group: o.Group, RunID: o.RunID, Rank: o.Rank, WorldSize: o.WorldSize, Timeout: o.Timeout,
		Endpoints: m.facts(), Auth: m.keys, Logger: o.Logger,
	})
	if err != nil {
		return err // Join closed the store; its errors name group and rank
	}
	m.group = g
	return m.checkBuckets()
}

// checkBuckets fails the join when the ranks were given different bucket
// sizes, naming each rank that differs from rank 0 and both sizes. Every
// rank reads the same records, so every rank fails alike, before any opens
// its transport. A rank that did not publish its size (a receiver written
// from the protocol alone) is not judged.
func (m *member) checkBuckets() error {
	size := func(r int) (int64, bool) {
		v, ok := m.group.Endpoint(r, keyBucket)
		if !ok {
			return 0, false
		}
		n, err := strconv.ParseInt(v, 10, 64)
		return n, err == nil
	}
	root, ok := size(0)
	if !ok {
		return nil
	}
	var differ []string
	for r := 1; r < m.opts.WorldSize; r++ {
		if n, ok := size(r); ok && n != root {
			differ = append(differ, fmt.Sprintf("rank %d with %s (%d bytes)", r, humanize.IBytes(uint64(n)), n))
		}
	}
	if len(differ) == 0 {
		return nil
	}
	// Every rank that published its size finds the same mismatch: meet
	// once more before leaving (briefly), so that none leaves while another
	// is still reading the records, which would make that one report a
	// lost peer instead of the mismatch.
	ctx, cancel := context.WithTimeout(context.Background(), min(m.opts.Timeout, mismatchBarrierWait))
	m.group.Barrier(ctx, "bucket-mismatch")
	cancel()
	return fmt.Errorf("%w: %s: bucket size mismatch: %s, but rank 0 with %s (%d bytes); give every rank the same bucket size",
		ErrConfig, m.who(), strings.Join(differ, ", "), humanize.IBytes(uint64(root)), root)
}

// mismatchBarrierWait bounds the meeting of ranks that found a bucket size
// mismatch before they leave.
const mismatchBarrierWait = 5 * time.Second

// facts are what this rank tells the others when it joins: its host and
// GPUs, what every registered transport adds (transport.Descriptor.Facts),
// and its bucket size. GPUs are counted, and the transports asked to look
// (transport.Probe.Auto), only where the answer matters: for "auto", and
// GPUs for a transport that keeps buckets on one.
func (m *member) facts() map[string]string {
	auto := m.desc.Name == ""
	gpus := 0
	if _, cpu, _ := parseDevice(m.opts.Device); !cpu && (auto || m.desc.DeviceMemory) {
		gpus, _ = gpu.DeviceCount()
	}
	f := map[string]string{transport.FactHost: transport.HostIdentity(), transport.FactGPUs: strconv.Itoa(gpus)}
	for _, d := range transport.Descriptors() {
		if d.Facts != nil {
			maps.Copy(f, d.Facts(transport.Probe{GPUs: gpus, Auto: auto}))
		}
	}
	f[keyBucket] = strconv.FormatInt(m.opts.BucketSize, 10)
	return f
}

// peers are what every rank published when it joined, by rank.
func (m *member) peers() []transport.Peer {
	out := make([]transport.Peer, m.opts.WorldSize)
	for r := range out {
		out[r] = transport.Peer{Rank: r, Facts: m.group.Endpoints(r)}
	}
	return out
}

// localIndex is this rank's place among the ranks on its host, in rank
// order: the GPU it takes unless Device names one.
func localIndex(peers []transport.Peer, rank int) int {
	var same []int
	for _, p := range peers {
		if p.Host() == peers[rank].Host() {
			same = append(same, p.Rank)
		}
	}
	sort.Ints(same)
	return sort.SearchInts(same, rank)
}

// openDevice opens where this rank's buckets live for the transport.
func (m *member) openDevice(peers []transport.Peer) error {
	if !m.desc.DeviceMemory {
		m.dev = m.hostMemory()
		return nil
	}
	ordinal, cpu, _ := parseDevice(m.opts.Device)
	if cpu {
		return fmt.Errorf("%w: %s: transport %s keeps buckets on a GPU, but the device is %q; use transport tcp", ErrConfig, m.who(), m.desc.Name, m.opts.Device)
	}
	n, err := gpu.DeviceCount()
	if err == nil && n == 0 {
		err = gpu.ErrNoDevice
	}
	if err != nil {
		return fmt.Errorf("%s: transport %s needs a GPU: %w; use transport tcp on machines without one", m.who(), m.desc.Name, err)
	}
	if ordinal < 0 {
		local := localIndex(peers, m.opts.Rank)
		if m.desc.GPUPerRank && local >= n {
			return fmt.Errorf("%w: %s: transport %s needs one GPU per rank, but this rank is number %d on its host, which shows %d GPUs; use transport ipc or fewer ranks per host", ErrConfig, m.who(), m.desc.Name, local, n)
		}
		ordinal = local % n
	}
	if ordinal >= n {
		return fmt.Errorf("%w: %s: device cuda:%d, but only %d GPUs are visible", ErrConfig, m.who(), ordinal, n)
	}
	d, err := gpu.NewCUDADevice(ordinal)
	if err != nil {
		return fmt.Errorf("%s: opening GPU %d: %w", m.who(), ordinal, err)
	}
	m.dev, m.closeDev = d, d.Close
	return nil
}

func (m *member) config(ex transport.Exchange) transport.Config {
	if testhook.Exchange != nil {
		ex = testhook.Exchange(ex)
	}
	return transport.Config{Group: m.opts.Group, Rank: m.opts.Rank, WorldSize: m.opts.WorldSize, Senders: m.opts.Senders, Device: m.dev, Exchange: ex, Timeout: m.opts.Timeout,
		Auth: m.keys, TLS: m.tls, Logger: m.opts.Logger}
}

// openLinks opens the metadata bus and the byte transport, except those
// given in Options (Publisher or Subscriber, Endpoint), which it takes.
func (m *member) openLinks(ctx context.Context, cfg transport.Config) error {
	// Sockets other hosts connect to (the metadata bus, a transport that
	// is Network, as the tcp chain) listen on every interface and publish
	// Advertise; the others find their peers themselves.
	netCfg := cfg
	if m.opts.Advertise != "" && !m.desc.InProcess {
		netCfg.Options = map[string]string{"bind": "0.0.0.0", "advertise": m.opts.Advertise}
	}
	var err error
	switch {
	case m.opts.Rank == 0 && m.opts.Publisher != nil:
		m.pub = m.opts.Publisher
	case m.opts.Rank != 0 && m.opts.Subscriber != nil:
		m.sub = m.opts.Subscriber
	default:
		var bus transport.Bus
		if bus, err = transport.BusFor(m.desc); err != nil {
			return fmt.Errorf("%s: %w", m.who(), err)
		}
		if m.opts.Rank == 0 {
			m.pub, err = bus.OpenPublisher(ctx, netCfg)
		} else {
			m.sub, err = bus.OpenSubscriber(ctx, netCfg)
		}
		m.ownBus = err == nil
		if err != nil {
			return err
		}
	}
	if m.opts.Endpoint != nil {
		m.endpoint = m.opts.Endpoint
		return nil
	}
	if m.desc.Network {
		cfg = netCfg
	}
	if m.opts.Senders > 0 {
		m.pairs, err = transport.OpenPairs(ctx, m.desc.Name, cfg)
		m.ownEndpoint = err == nil
		return err
	}
	m.endpoint, err = transport.Open(ctx, m.desc.Name, cfg)
	m.ownEndpoint = err == nil
	return err
}

// openWatched opens the metadata bus and the byte transport while
// watching the group: a peer that leaves or dies meanwhile (the one a
// transport waits for, often) ends the open within blame.Grace of the
// rendezvous noticing, with the group's error naming it, instead of at
// the transport's timeout.
func (m *member) openWatched(ctx context.Context) error {
	lctx, cancel := context.WithCancelCause(ctx)
	stop := m.blame.Round(lctx, cancel)
	err := m.openLinks(lctx, m.config(m.group))
	cause := context.Cause(lctx)
	cancel(nil)
	stop()
	if err != nil && m.blame.GroupBroke(cause) {
		return fmt.Errorf("%s: %w; it broke while this rank opened its transports: %w", m.who(), cause, err)
	}
	return err
}

// release closes everything opened, in reverse order.
func (m *member) release() error {
	var errs []error
	// A receiver closing after the root ended the run may find the
	// rendezvous the root served gone, with every lease on it: leaving it
	// then cannot be confirmed, and need not be.
	var rootEnded bool
	if w, ok := m.sub.(transport.Watcher); ok {
		rootEnded = errors.Is(w.Err(), transport.ErrEnded)
	}
	for _, f := range m.extra {
		errs = append(errs, f())
	}
	if m.pool != nil {
		errs = append(errs, m.pool.Close())
	}
	// What Options gave (a bus end, an Endpoint) is the caller's to close.
	if m.ownBus {
		for _, c := range []interface{ Close() error }{m.pub, m.sub} {
			if c != nil {
				errs = append(errs, c.Close())
			}
		}
	}
	if m.ownEndpoint && m.endpoint != nil {
		errs = append(errs, m.endpoint.Close())
	}
	if m.ownEndpoint && m.pairs != nil {
		errs = append(errs, m.pairs.Close())
	}
	if m.closeDev != nil {
		errs = append(errs, m.closeDev())
	}
	if m.group != nil {
		// Leaving a group that already broke (a peer died, perhaps the
		// rank 0 that served the rendezvous) cannot be confirmed; the
		// round's error has said what happened.
		if err := m.group.Close(); err != nil && m.group.Err() == nil && !rootEnded {
			errs = append(errs, err)
		}
	}
	if m.emb != nil {
		errs = append(errs, m.emb.Close())
	}
	return errors.Join(errs...)
}

// round runs fn as this rank's one round: a lost peer, Abort or Close
// cancels it with that cause.
func (m *member) round(ctx context.Context, fn func(context.Context) error) error {
	m.mu.Lock()
	switch {
	case m.closed:
		m.mu.Unlock()
		return fmt.Errorf("%s: %w", m.who(), ErrClosed)
	case m.running != nil:
		m.mu.Unlock()
		return fmt.Errorf("%w: %s: a round is already running; rounds run one at a time", ErrConfig, m.who())
	case m.aborted != nil:
		m.mu.Unlock()
		return fmt.Errorf("%s: %w: aborted: %w", m.who(), stages.ErrBroken, m.aborted)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	running := make(chan struct{})
	m.cancel, m.running = cancel, running
	m.mu.Unlock()

	// The bus failing for the other side's reason (a receiver that gave
	// up between rounds, the root's abort) ends the round at once, a
	// broken group after the grace.
	stop := m.blame.Round(ctx, cancel, m.pub, m.sub)
	err := fn(ctx)
	cause := context.Cause(ctx)
	cancel(nil)
	stop()
	m.mu.Lock()
	m.cancel, m.running = nil, nil
	m.mu.Unlock()
	close(running)
	return blame.Merge(err, cause)
}

// newBlame is the rank's owner of lost-peer attribution: it watches the
// group, when there is one, and has the rendezvous witness the stages'
// lost peers with its verdict on tampered records only: a peer whose
// etcd record was deleted or rewritten closes its connections before its
// neighbours hear why. A peer gone for any other reason is the
// transport's and the bus's to name.
func newBlame(g *rendezvous.Group) *blame.Watch {
	if g == nil {
		return blame.New(nil)
	}
	return blame.New(g, blame.Witness{Name: "the rendezvous", Failed: g.PeerGone, Err: func() error {
		if err := g.Err(); errors.Is(err, rendezvous.ErrTampered) {
			return err
		}
		return nil
	}})
}

// Abort fails the rank's round with cause, on every rank: the running
// one, or when none runs, the next (the peers are told through the
// metadata bus at once). The Sender or Receiver is broken after it. Abort
// may be called from any goroutine, as a signal handler would.
func (m *member) Abort(cause error) {
	if cause == nil {
		cause = errors.New("aborted")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	if m.aborted == nil {
		m.aborted = cause
	}
	if m.cancel != nil {
		m.cancel(cause)
		return
	}
	for _, l := range []any{m.pub, m.sub} {
		if a, ok := l.(transport.Aborter); ok {
			a.Abort(fmt.Errorf("%s: %w", m.who(), cause))
		}
	}
}

// Close ends a running round, then releases everything the rank opened:
// pool, metadata bus, transport, device, group membership, and the
// rendezvous a rank 0 served. It is idempotent and safe to call from any
// goroutine.
func (m *member) Close() error {
	m.once.Do(func() {
		m.mu.Lock()
		m.closed = true
		running := m.running
		if m.cancel != nil {
			m.cancel(fmt.Errorf("%s: %w while a round was running", m.who(), ErrClosed))
		}
		m.mu.Unlock()
		if running != nil {
			<-running // every wait of a round ends with its context
		}
		m.err = m.release()
	})
	return m.err
}

// Device is where this rank's buckets live.
func (m *member) Device() mem.Device { return m.dev }

// Transport names the byte transport in use and why it was chosen.
func (m *member) Transport() (name, reason string) { return m.desc.Name, m.reason }

// RunID returns the run's id: Options.RunID, or, when that was left empty
// with a served rendezvous, the one rank 0 made up and published there.
func (m *member) RunID() string { return m.opts.RunID }

// Rank is this rank's place in the group.
func (m *member) Rank() int { return m.opts.Rank }

// WorldSize counts the ranks of the group.
func (m *member) WorldSize() int { return m.opts.WorldSize }

// MaxBuffers is the most bucket buffers this rank held at once (two at
// most: the double buffering).
func (m *member) MaxBuffers() int {
	if m.pool == nil {
		return 0 // a routed group's buffers are its pairs' (Sender.MaxBuffers)
	}
	return m.pool.MaxHeld()
}
