package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/weightcast/weightcast/transport"
)

// Group is one rank's membership of a run of a group, as Join returns it.
// It watches every rank's liveness key until Close; it is the
// transport.Exchange of the rank's transports. Its methods are safe for
// concurrent use.
type Group struct {
	member
	timeout   time.Duration
	uniqueID  [128]byte
	endpoints []map[string]string // per rank
	records   []watched           // per rank

	// ctx is canceled when the group breaks (cause: the *Error) or
	// closes (cause: errGroupClosed); every wait of the Group ends with it.
	ctx      context.Context
	cancel   context.CancelCauseFunc
	gone     chan struct{} // closed by broken, once
	goneOnce sync.Once
	goneErr  error // written before gone is closed
	watchers sync.WaitGroup

	// published are the exchange keys Put was called with, so that a key
	// found taken is told apart: taken by this rank's own earlier Put
	// (ErrDuplicateKey), or by another writer (ErrTampered).
	pubMu     sync.Mutex
	published map[string]bool

	closed    atomic.Bool // set first thing in Close
	closeOnce sync.Once
	closeErr  error
}

var _ transport.Exchange = (*Group)(nil)

// watched is what watchRank watches of one rank: its record as stored,
// and the lease that holds it (0 when the record names none).
type watched struct {
	record []byte
	lease  int64
}

var errGroupClosed = errors.New("group closed by this rank")

func newGroup(m member, timeout time.Duration, uid [128]byte, endpoints []map[string]string, records []watched) *Group {
	g := &Group{
		member: m, timeout: timeout, uniqueID: uid, endpoints: endpoints, records: records, gone: make(chan struct{}),
	}
	g.ctx, g.cancel = context.WithCancelCause(context.Background())
	for r := range m.opts.WorldSize {
		g.watchers.Go(func() { g.watchRank(r) })
	}
	if lw, ok := m.store.(interface{ LeaseLost() <-chan struct{} }); ok {
		if lost := lw.LeaseLost(); lost != nil {
			g.watchers.Go(func() { g.watchLease(lost) })
		}
	}
	return g
}

// watchLease breaks the group when this rank's own lease ends: etcd is
// gone or unreachable, so no rank can tell whether the others live, and
// this rank's keys are gone.
func (g *Group) watchLease(lost <-chan struct{}) {
	select {
	case <-lost:
		if g.ctx.Err() == nil {
			g.broken(g.errorf(ErrLeaseLost, g.keys.rank(g.opts.Rank), []int{g.opts.Rank},
				"this rank could not renew its lease: etcd was unreachable for longer than the lease TTL (is the etcd server down?); restart the run once etcd is back"))
		}
	case <-g.ctx.Done():
	}
}

// Name returns the group's name.
func (g *Group) Name() string { return g.opts.Group }

// RunID returns the run's id.
func (g *Group) RunID() string { return g.opts.RunID }

// Rank returns this rank's index.
func (g *Group) Rank() int { return g.opts.Rank }

// WorldSize returns the number of ranks.
func (g *Group) WorldSize() int { return g.opts.WorldSize }

// UniqueID returns the unique id rank 0 made for the run; every rank sees
// the same one.
func (g *Group) UniqueID() [128]byte { return g.uniqueID }

// Endpoint returns the address rank published under name when it joined.
func (g *Group) Endpoint(rank int, name string) (string, bool) {
	if rank < 0 || rank >= len(g.endpoints) {
		return "", false
	}
	v, ok := g.endpoints[rank][name]
	return v, ok
}

// Endpoints returns a copy of every endpoint rank published when it joined.
func (g *Group) Endpoints(rank int) map[string]string {
	if rank < 0 || rank >= len(g.endpoints) {
		return nil
	}
	return maps.Clone(g.endpoints[rank])
}

// PeerGone returns a channel that is closed when the group breaks: a
// rank's liveness key disappeared because its process ended or lost etcd
// for longer than its lease TTL (this rank's own included), or watching
// the keys failed. Err then says which rank. Close does not close it.
// Once rank 0 closes the group at the end of a run, the others' PeerGone
// closes too, naming rank 0.
func (g *Group) PeerGone() <-chan struct{} { return g.gone }

// Err returns nil while the group is whole, and once PeerGone is closed
// the *Error that broke it: wrapping ErrPeerGone and naming the rank, or
// wrapping the store's error.
func (g *Group) Err() error {
	select {
	case <-g.gone:
		return g.goneErr
	default:
		return nil
	}
}

func (g *Group) broken(err *Error) {
	g.goneOnce.Do(func() {
		g.goneErr = err
		close(g.gone)
		g.cancel(err)
	})
}

// watchRank breaks the group when rank r's record changes: it went with
// r's lease (r ended or lost etcd), or something other than r deleted or
// rewrote it (a rank writes its record once and never deletes it, and
// rank 0 deletes only the keys that live on no lease).
func (g *Group) watchRank(r int) {
	key := g.keys.rank(r)
	change, _, err := g.store.WaitChange(g.ctx, key, g.records[r].record)
	deletedLive := false // deleted while its lease lives
	if err == nil && change == Deleted && g.records[r].lease != 0 {
		ctx, cancel := context.WithTimeout(g.ctx, cleanupTimeout)
		deletedLive, err = g.store.LeaseAlive(ctx, g.records[r].lease)
		cancel()
	}
	if g.ctx.Err() != nil {
		return // closed, or another rank's watcher was first
	}
	whose := fmt.Sprintf("rank %d's", r)
	if r == g.opts.Rank {
		whose = "this rank's own"
	}
	switch {
	case err != nil:
		g.broken(g.errorf(err, key, []int{r}, "watching rank %d's liveness key failed, so this rank cannot tell whether rank %d lives", r, r))
	case change == Rewritten:
		g.broken(g.errorf(ErrTampered, key, []int{r}, "%s record was rewritten while the rank lived; ranks write their record once, so something else wrote to etcd under %s (use a group secret and etcd's TLS client certificates to keep others out)", whose, KeyPrefix))
	case deletedLive:
		g.broken(g.errorf(ErrTampered, key, []int{r}, "%s record was deleted while the rank's lease lived; no rank deletes it, so something else deleted keys under %s (use etcd's TLS client certificates to keep others out)", whose, KeyPrefix))
	case r != g.opts.Rank && (r == 0 || g.rootGone()):
		// Rank 0's lease holds the root record; once it is gone the run
		// is over, whichever rank's departure this watcher saw first.
		g.broken(g.errorf(ErrPeerGone, g.keys.rank(0), []int{0}, "rank 0 ended the run (closed the group) or died"))
	case r == g.opts.Rank:
		g.broken(g.errorf(ErrPeerGone, key, []int{r}, "this rank's own liveness key disappeared: its lease expired after it lost contact with etcd for longer than the lease TTL"))
	default:
		g.broken(g.errorf(ErrPeerGone, key, []int{r}, "rank %d is gone: its process ended, or lost contact with etcd for longer than the lease TTL", r))
	}
}

func (g *Group) rootGone() bool {
	ctx, cancel := context.WithTimeout(g.ctx, cleanupTimeout)
	defer cancel()
	_, ok, err := g.store.Get(ctx, g.keys.root())
	return err == nil && !ok
}

// bound limits ctx by the Group's timeout and ends it when the group
// breaks or closes.
func (g *Group) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	tctx, cancelT := context.WithTimeout(ctx, g.timeout)
	wctx, cancelW := context.WithCancelCause(tctx)
	stop := context.AfterFunc(g.ctx, func() { cancelW(context.Cause(g.ctx)) })
	return wctx, func() {
		stop()
		cancelW(nil)
		cancelT()
	}
}

// waitError turns the error of a wait under wctx (from bound(ctx)) into an
// *Error. timeout describes the ranks at fault after a timeout.
func (g *Group) waitError(ctx, wctx context.Context, err error, key, what string, timeout func() *Error) *Error {
	cause := context.Cause(wctx)
	if g.ctx.Err() != nil { // the group broke or closed; wctx may not know yet
		cause = context.Cause(g.ctx)
	}
	var broke *Error
	var refused *refusedError
	switch {
	case g.closed.Load():
		return g.errorf(ErrClosed, key, nil, "%s after Close", what)
	case errors.As(cause, &broke):
		e := *broke
		e.Key = key
		e.Detail = fmt.Sprintf("%s (while %s)", broke.Detail, what)
		return &e
	case errors.As(err, &refused):
		return g.refusedAuthError(refused)
	case ctx.Err() == nil && errors.Is(wctx.Err(), context.DeadlineExceeded), errors.Is(ctx.Err(), context.DeadlineExceeded):
		return timeout()
	default:
		return g.errorf(err, key, nil, "%s failed", what)
	}
}

// keyExists reports whether key exists, reading it even after the group's
// own context ended (bounded by cleanupTimeout).
func (g *Group) keyExists(ctx context.Context, key string) bool {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_, ok, err := g.store.Get(rctx, key)
	return err == nil && ok
}

func validKey(key string) bool {
	if key == "" {
		return false
	}
	for _, r := range key {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return false
		}
	}
	return true
}

// Put publishes value under key for the other ranks (transport.Exchange).
// A rank publishes each key once per run; the value lives on this rank's
// lease. A second Put of a key fails with ErrDuplicateKey. A key that
// another writer created first (no rank of the run writes another's keys,
// so something else writes under KeyPrefix: with a group secret, a record
// that does not verify is replaced instead) fails with ErrTampered.
func (g *Group) Put(ctx context.Context, key string, value []byte) error {
	if !validKey(key) {
		return g.errorf(ErrInvalid, "", nil, "exchange key %q must be non-empty, without spaces or control characters", key)
	}
	sk := g.keys.data(g.opts.Rank, key)
	g.pubMu.Lock()
	again := g.published[key]
	if !again {
		if g.published == nil {
			g.published = map[string]bool{}
		}
		g.published[key] = true
	}
	g.pubMu.Unlock()
	if again {
		return g.errorf(ErrDuplicateKey, sk, []int{g.opts.Rank}, "rank %d published %q twice; publish each key once per run", g.opts.Rank, key)
	}
	wctx, cancel := g.bound(ctx)
	defer cancel()
	created, _, err := g.createRecord(wctx, sk, value, true)
	if err != nil {
		// Not published: a later Put of the key may try again.
		g.pubMu.Lock()
		delete(g.published, key)
		g.pubMu.Unlock()
		return g.waitError(ctx, wctx, err, sk, fmt.Sprintf("publishing %q", key), func() *Error {
			return g.errorf(ErrTimeout, sk, nil, "publishing %q took longer than %v; check that etcd is reachable", key, g.timeout)
		})
	}
	if !created {
		hint := "give every rank the same group secret (a record without it is then replaced) and protect etcd with TLS client certificates"
		if g.opts.Auth != nil {
			hint = "the record there verifies, so a process holding the group secret wrote it: look for another program using this group and run id, and protect etcd with TLS client certificates"
		}
		return g.errorf(ErrTampered, sk, nil, "rank %d could not publish %q: another writer created the key first (this rank had not published it, and no rank writes another's keys), so something other than this run's ranks writes under %s; %s, then start the run again with a new run id", g.opts.Rank, key, KeyPrefix, hint)
	}
	return nil
}

// Get waits until rank has published key and returns the value
// (transport.Exchange). It fails with ErrTimeout after the Group's timeout
// and with ErrPeerGone when the group breaks meanwhile.
func (g *Group) Get(ctx context.Context, rank int, key string) ([]byte, error) {
	if rank < 0 || rank >= g.opts.WorldSize {
		return nil, g.errorf(ErrInvalid, "", []int{rank}, "rank %d is outside [0, %d)", rank, g.opts.WorldSize)
	}
	if !validKey(key) {
		return nil, g.errorf(ErrInvalid, "", []int{rank}, "exchange key %q must be non-empty, without spaces or control characters", key)
	}
	sk := g.keys.data(rank, key)
	wctx, cancel := g.bound(ctx)
	defer cancel()
	v, err := g.waitRecord(wctx, sk)
	if err != nil {
		return nil, g.waitError(ctx, wctx, err, sk, fmt.Sprintf("waiting for rank %d's %q", rank, key), func() *Error {
			return g.errorf(ErrTimeout, sk, []int{rank}, "rank %d did not publish %q within %v; check that it is alive and opens the same transport", rank, key, g.timeout)
		})
	}
	return v, nil
}

// Barrier returns when every rank has called Barrier with the same name.
// Names are single-use within a run (use "round-7", not "round"). It fails
// with ErrTimeout naming the ranks that never came after the Group's
// timeout, and with ErrPeerGone when the group breaks meanwhile.
func (g *Group) Barrier(ctx context.Context, name string) error {
	if !ValidName(name) {
		return g.errorf(ErrInvalid, "", nil, "barrier name %q must be non-empty, without '/' or spaces", name)
	}
	prefix := g.keys.barrier(name)
	wctx, cancel := g.bound(ctx)
	defer cancel()
	err := g.barrier(wctx, prefix)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errBarrierReused):
		return g.errorf(ErrInvalid, prefix, []int{g.opts.Rank}, "barrier %q was already used in this run; give each barrier its own name", name)
	case g.keyExists(ctx, prefix+"done"):
		// Every rank arrived; a rank that left right after the barrier
		// completed (its lease gone) broke the wait, not the barrier.
		return nil
	}
	return g.waitError(ctx, wctx, err, prefix+"done", fmt.Sprintf("in barrier %q", name), func() *Error {
		lctx, lcancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer lcancel()
		missing, l, lerr := g.missingRanks(lctx, prefix)
		if lerr != nil {
			return g.errorf(ErrTimeout, prefix, nil, "barrier %q did not complete within %v, and listing who arrived failed: %v", name, g.timeout, lerr)
		}
		if len(l.refused) > 0 {
			return g.authError(prefix, l.refused, fmt.Sprintf("barrier %q did not complete within %v: the marker of %s is", name, g.timeout, rankList(l.refused)), l.unsigned)
		}
		return g.errorf(ErrTimeout, prefix, missing, "%s never reached barrier %q within %v", rankList(missing), name, g.timeout)
	})
}

// Close leaves the group: it stops watching the ranks, rank 0 waits (a few
// seconds at most) for the other ranks to leave and then deletes the run's
// keys that live on no lease, and the store is closed, which revokes this
// rank's lease and so deletes its leased keys (and with rank 0's, the
// group's owner key). It is idempotent.
func (g *Group) Close() error {
	g.closeOnce.Do(func() {
		g.closed.Store(true)
		g.cancel(errGroupClosed)
		g.watchers.Wait()
		var errs []error
		if g.opts.Rank == 0 && !errors.Is(g.goneErr, ErrLeaseLost) {
			ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
			// Let the other ranks leave first (bounded): they may still
			// be reading keys of the run, such as a barrier's "done".
			for r := 1; r < g.opts.WorldSize; r++ {
				if g.store.WaitAbsent(ctx, g.keys.rank(r)) != nil {
					break
				}
			}
			cancel()
			// Delete the keys that live on no lease. The leased ones
			// (every rank's record, data, rank 0's root record) go with
			// their rank's lease: a rank that sees another's record
			// deleted while that rank's lease lives reports tampering.
			ctx, cancel = context.WithTimeout(context.Background(), cleanupTimeout)
			for _, prefix := range g.keys.unleased() {
				if err := g.store.DeletePrefix(ctx, prefix); err != nil {
					errs = append(errs, fmt.Errorf("rendezvous: deleting run %q of group %q: %w", g.opts.RunID, g.opts.Group, err))
					break
				}
			}
			cancel()
		}
		if err := g.store.Close(); err != nil {
			errs = append(errs, err)
		}
		g.closeErr = errors.Join(errs...)
	})
	return g.closeErr
}
