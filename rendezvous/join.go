package rendezvous

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/internal/owned"
)

// DefaultTimeout bounds Join, and each later wait of a Group, when
// JoinOptions.Timeout is zero.
const DefaultTimeout = 5 * time.Minute

// cleanupTimeout bounds the store calls made after a wait failed (to name
// the missing ranks, to tell the other ranks) and the deletes of Close.
const cleanupTimeout = 5 * time.Second

// JoinOptions places one rank in one run of a named group.
type JoinOptions struct {
	// Group names the sync group. One run at a time may hold a group.
	Group string
	// RunID names this launch of the group; every rank of the launch
	// passes the same one, and a new launch takes a new one (a timestamp
	// or a UUID made by the launcher). Keys are scoped by it, so keys
	// left by a crashed run never block a new one.
	RunID string
	// Rank is this rank's index in [0, WorldSize). Rank 0 creates the
	// group's unique id and owns the group while the run lives.
	Rank int
	// WorldSize counts every rank of the run.
	WorldSize int
	// Timeout is the one deadline of Join, and of each later Barrier and
	// Get. Zero means DefaultTimeout.
	Timeout time.Duration
	// Endpoints are this rank's named addresses ("meta": "host:port"),
	// published to every rank.
	Endpoints map[string]string
	// UniqueID makes the group's 128-byte unique id on rank 0 (the NCCL
	// unique id, for one). Nil means 128 random bytes.
	UniqueID func() ([128]byte, error)
	// Auth, when not nil, are this run's keys, derived from the group
	// secret by auth.Secret.RunKeys(Group, RunID). Every record this
	// rank writes under the run's keys is then signed with them, and every
	// record it reads must verify: one that does not is refused (and, on
	// a key a rank writes, replaced), and a wait that finds only such
	// records fails with ErrAuth. Every rank of a run is given keys of the
	// same secret, or none.
	Auth *auth.Keys
	// HeldWait is how long rank 0 waits for a group held by another run
	// to be let go before failing with ErrGroupInUse: a killed run's hold
	// ends when its lease expires, a live run's does not. Zero means
	// DefaultLeaseTTL plus 2 seconds (use more with a longer lease TTL).
	HeldWait time.Duration
	// Logger hears, every NoticeEvery while Join waits, what it waits
	// for and who has arrived ("waiting for rank 2 to join (2 of 3
	// joined), 1m40s left"). Nil means slog.Default(), which writes to
	// stderr; slog.New(slog.DiscardHandler) silences it.
	Logger *slog.Logger
}

// NoticeEvery is how often a rank that still waits to join, or for etcd
// to answer, says so (JoinOptions.Logger, WithLogger).
const NoticeEvery = 5 * time.Second

func (o JoinOptions) timeout() time.Duration {
	if o.Timeout > 0 {
		return o.Timeout
	}
	return DefaultTimeout
}

// ValidName reports whether s can name a group or a run (one element of a
// store key): not empty, at most 256 bytes, no '/', no spaces or control
// characters. Join refuses other names with ErrInvalid; a launcher can
// check them before starting anything.
func ValidName(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for _, r := range s {
		if r == '/' || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

func (o JoinOptions) validate() string {
	switch {
	case !ValidName(o.Group):
		return fmt.Sprintf("group name %q must be non-empty, without '/' or spaces", o.Group)
	case !ValidName(o.RunID) || o.RunID == "owner":
		return fmt.Sprintf("run id %q must be non-empty, without '/' or spaces, and not \"owner\"; give every rank of one launch the same fresh run id", o.RunID)
	case o.WorldSize < 1:
		return fmt.Sprintf("world size %d must be at least 1", o.WorldSize)
	case o.Rank < 0 || o.Rank >= o.WorldSize:
		return fmt.Sprintf("rank %d is outside [0, %d) for world size %d", o.Rank, o.WorldSize, o.WorldSize)
	case o.Timeout < 0:
		return fmt.Sprintf("timeout %v is negative", o.Timeout)
	case o.Auth != nil && (o.Auth.Group() != o.Group || o.Auth.RunID() != o.RunID):
		return fmt.Sprintf("the keys in Auth belong to group %q run %q, not to group %q run %q; derive them with RunKeys(group, run id) of this run", o.Auth.Group(), o.Auth.RunID(), o.Group, o.RunID)
	}
	for name := range o.Endpoints {
		if name == "" {
			return "an endpoint has an empty name"
		}
	}
	return ""
}

// rankRecord is the value of a rank's liveness key.
type rankRecord struct {
	WorldSize int               `json:"world_size"`
	Endpoints map[string]string `json:"endpoints,omitempty"`
	Host      string            `json:"host,omitempty"`
	PID       int               `json:"pid,omitempty"`
	// Start and PIDNS identify the process further (its start time since
	// boot in clock ticks, its pid namespace), so that a rank on the same
	// host can tell that the process has ended even if its pid was reused.
	Start string `json:"start,omitempty"`
	PIDNS string `json:"pidns,omitempty"`
	// Lease is the id of the lease that holds the key, in hex: when the
	// key disappears while the lease lives, something deleted it.
	Lease string `json:"lease,omitempty"`
}

// lease is the record's lease id, or 0 when it names none.
func (r rankRecord) lease() int64 {
	id, err := strconv.ParseUint(r.Lease, 16, 64)
	if err != nil {
		return 0
	}
	return int64(id)
}

func (r rankRecord) holder() string {
	return fmt.Sprintf("pid %d on host %q (world size %d)", r.PID, r.Host, r.WorldSize)
}

// heldBy says who holds a rank's key, from its record, and what to do:
// when the holder ran on this host and has ended (killed, or crashed before
// it could leave), the key lives on only until its lease expires, but the
// run id stays used by that launch's keys, so the launch needs a new one.
func (j *joiner) heldBy(rank int, rec rankRecord) string {
	host, _ := os.Hostname()
	proc := owned.Process{PID: rec.PID, Start: rec.Start, PIDNS: rec.PIDNS}
	switch {
	case rec.PID > 0 && rec.Host == host && proc.Ended():
		return fmt.Sprintf("rank %d of run %q is still held by pid %d on this host (%q), which has ended (killed, or crashed before it could leave): its key goes when its lease expires, a lease TTL after that, but that launch's keys stay under run id %q; start this launch with a new run id",
			rank, j.opts.RunID, rec.PID, host, j.opts.RunID)
	case rec.PID > 0 && rec.Host == host && rec.PIDNS != "" && rec.PIDNS == owned.Self().PIDNS:
		return fmt.Sprintf("rank %d of run %q is already held by pid %d on this host (%q, world size %d), which is running; give each process its own rank, and if pid %d is an earlier launch, stop it or start this launch with a new run id",
			rank, j.opts.RunID, rec.PID, host, rec.WorldSize, rec.PID)
	}
	return fmt.Sprintf("rank %d of run %q is already held by %s; give each process its own rank; if that is an earlier launch (one killed less than the lease TTL ago still holds its ranks), start this launch with a new run id",
		rank, j.opts.RunID, rec.holder())
}

// rootRecord is the value rank 0 publishes for the run.
type rootRecord struct {
	WorldSize int    `json:"world_size"`
	UniqueID  []byte `json:"unique_id"`
}

// abortRecord is the value of the run's abort key: the first failure a
// rank saw during Join, for every other rank to report.
type abortRecord struct {
	Kind   string    `json:"kind"`
	By     int       `json:"by"`
	Key    string    `json:"key,omitempty"`
	Ranks  []int     `json:"ranks,omitempty"`
	Detail string    `json:"detail"`
	Time   time.Time `json:"time"`
}

var abortKinds = map[string]error{
	"group-in-use":          ErrGroupInUse,
	"duplicate-rank":        ErrDuplicateRank,
	"world-size-mismatch":   ErrWorldSizeMismatch,
	"peer-gone":             ErrPeerGone,
	"authentication-failed": ErrAuth,
	"tampered":              ErrTampered,
}

func abortKind(err error) string {
	for kind, sentinel := range abortKinds {
		if errors.Is(err, sentinel) {
			return kind
		}
	}
	return "failed"
}

// joiner carries one rank through Join.
type joiner struct {
	member
}

// Join makes this process rank opts.Rank of run opts.RunID of group
// opts.Group, and returns when every rank has joined. Rank 0 claims the
// group, creates the unique id and publishes it; every rank registers its
// liveness key with its endpoints; then all wait for each other. The whole
// of it is bounded by opts.Timeout and ctx.
//
// Join takes ownership of store: the Group closes it, and Join closes it
// when it fails. Failures are *Error values wrapping ErrTimeout (naming
// the ranks that never came), ErrGroupInUse, ErrDuplicateRank,
// ErrWorldSizeMismatch, ErrPeerGone, ErrAuth, ErrAborted or ErrInvalid.
// When one rank sees a failure it records it in the run, so every other
// rank waiting in Join fails with the same error at once rather than at
// the deadline. Ranks given different group secrets fail with ErrAuth
// (authentication failed) at the deadline, naming the records that did
// not verify.
func Join(ctx context.Context, store Store, opts JoinOptions) (g *Group, err error) {
	if store == nil {
		return nil, errors.New("rendezvous: Join with a nil store")
	}
	defer func() {
		if err != nil {
			store.Close()
		}
	}()
	j := &joiner{member{store: store, opts: opts, keys: keys{opts.Group, opts.RunID}}}
	if msg := opts.validate(); msg != "" {
		return nil, j.errorf(ErrInvalid, "", nil, "%s", msg)
	}
	timeout := opts.timeout()
	jctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	// Watch the run's abort key for the whole of Join: a failure another
	// rank records there cancels every step below.
	actx, abort := context.WithCancelCause(jctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		// A record that does not verify is waited past: a stranger
		// cannot end the run by writing one.
		if v, err := j.waitRecord(actx, j.keys.abort()); err == nil {
			abort(j.fromAbort(v))
		}
	}()
	noticeDone := make(chan struct{})
	go func() {
		defer close(noticeDone)
		j.notice(actx)
	}()
	defer func() {
		abort(nil)
		<-watchDone
		<-noticeDone
	}()

	g, err = j.join(actx, timeout)
	if err == nil {
		return g, nil
	}
	var own, other *Error
	var refused *refusedError
	switch {
	case errors.As(err, &own):
		return nil, own // a failure this rank found; fail recorded it for the others
	case errors.As(context.Cause(actx), &other):
		return nil, other // another rank's failure ended this rank's wait
	case errors.As(err, &refused):
		return nil, j.refusedAuthError(refused) // waited in vain for a record that verifies
	case ctx.Err() == nil && jctx.Err() != nil, errors.Is(ctx.Err(), context.DeadlineExceeded):
		return nil, j.timeoutError(ctx, timeout, err)
	case ctx.Err() != nil:
		// The caller gave up (Ctrl-C): the ranks still waiting learn why
		// from the abort key instead of waiting out their timeout.
		return nil, j.fail(j.errorf(ErrAborted, "", nil, "rank %d gave up joining: %v", opts.Rank, context.Cause(ctx)))
	default:
		return nil, j.errorf(err, "", nil, "joining failed")
	}
}

// join runs the steps of Join under ctx.
func (j *joiner) join(ctx context.Context, timeout time.Duration) (*Group, error) {
	o := j.opts
	if o.Rank == 0 {
		if err := j.claimGroup(ctx); err != nil {
			return nil, err
		}
	}
	if err := j.register(ctx); err != nil {
		return nil, err
	}
	var uid [128]byte
	var err error
	if o.Rank == 0 {
		uid, err = j.publishRoot(ctx)
	} else {
		uid, err = j.readRoot(ctx)
	}
	if err != nil {
		return nil, err
	}
	if err := j.barrier(ctx, j.keys.joinBarrier()); err != nil {
		return nil, err
	}
	endpoints, records, err := j.readRanks(ctx)
	if err != nil {
		return nil, err
	}
	return newGroup(j.member, timeout, uid, endpoints, records), nil
}

// claimGroup makes rank 0's lease hold the group's owner key. A group held
// by another run is waited for, up to JoinOptions.HeldWait: a run that was
// killed lets go of it when its lease expires, a live run does not, and is
// then reported as holding it.
func (j *joiner) claimGroup(ctx context.Context) error {
	key := j.keys.owner()
	waited := false
	var wait time.Duration
	for {
		created, holder, err := j.store.CreateLeased(ctx, key, []byte(j.opts.RunID))
		switch {
		case err != nil:
			return err
		case created:
			j.deleteDeadRuns(ctx)
			return nil
		case string(holder) == j.opts.RunID:
			return j.fail(j.errorf(ErrDuplicateRank, key, []int{0}, "%s", j.rootHeld(ctx)))
		case waited:
			return j.fail(j.errorf(ErrGroupInUse, key, nil, "group %q is in use by live run %q (still held after waiting %v for a dead run's lease to expire); wait for run %q to finish or pick another group", j.opts.Group, holder, wait, holder))
		}
		// Wait for the hold to end, but leave time before the Join
		// deadline to say why it did not.
		wait = j.heldWait()
		if dl, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(dl)*3/4)
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		err = j.store.WaitAbsent(wctx, key)
		cancel()
		if err != nil && ctx.Err() != nil {
			return err
		}
		waited = true
	}
}

// rootHeld says who holds the group under this rank 0's own run id: the
// holder's rank record names its process, which may have ended on this
// host (a relaunch after kill -9 with the same run id).
func (j *joiner) rootHeld(ctx context.Context) string {
	if val, ok, err := j.store.Get(ctx, j.keys.rank(0)); err == nil && ok {
		if v, err := j.open(j.keys.rank(0), val); err == nil {
			if rec, err := decodeRankRecord(v); err == nil && rec.PID > 0 {
				return j.heldBy(0, rec)
			}
		}
	}
	return fmt.Sprintf("rank 0 of run %q is already running; start exactly one process with rank 0, and if that is an earlier launch (one killed less than the lease TTL ago still holds the group), start this launch with a new run id", j.opts.RunID)
}

// heldWait is how long rank 0 waits for a group held by another run.
func (j *joiner) heldWait() time.Duration {
	if j.opts.HeldWait > 0 {
		return j.opts.HeldWait
	}
	return DefaultLeaseTTL + 2*time.Second
}

// deleteDeadRuns deletes what earlier runs of the group left behind (the
// counters, markers and abort records that live on no lease). Rank 0 runs
// it right after claiming the group, so every other run is over or has
// not claimed it yet; a run with no live rank (no key under ranks/) is
// over, and its keys go. It is housekeeping: failures are ignored.
func (j *joiner) deleteDeadRuns(ctx context.Context) {
	all, err := j.store.List(ctx, j.keys.groupPrefix())
	if err != nil {
		return
	}
	live := map[string]bool{}
	for k := range all {
		run, rest, ok := strings.Cut(strings.TrimPrefix(k, j.keys.groupPrefix()), "/")
		if !ok || run == j.opts.RunID {
			continue
		}
		live[run] = live[run] || strings.HasPrefix(rest, "ranks/")
	}
	for run, alive := range live {
		if !alive {
			j.store.DeletePrefix(ctx, keys{j.opts.Group, run}.runPrefix())
		}
	}
}

// register creates this rank's liveness key, with its world size and
// endpoints, on its lease.
func (j *joiner) register(ctx context.Context) error {
	lease, err := j.store.Lease(ctx)
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	self := owned.Self()
	rec := rankRecord{WorldSize: j.opts.WorldSize, Endpoints: j.opts.Endpoints, Host: host, PID: self.PID,
		Start: self.Start, PIDNS: self.PIDNS, Lease: strconv.FormatUint(uint64(lease), 16)}
	val, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	key := j.keys.rank(j.opts.Rank)
	created, existing, err := j.createRecord(ctx, key, val, true)
	if err != nil {
		return err
	}
	if created {
		// A marker that outlives this rank's lease, so a rank that
		// gives up at the deadline still counts as having come.
		_, _, err := j.createRecord(ctx, j.keys.seen()+strconv.Itoa(j.opts.Rank), nil, false)
		return err
	}
	other, _ := decodeRankRecord(existing) // only for the message
	return j.fail(j.errorf(ErrDuplicateRank, key, []int{j.opts.Rank}, "%s", j.heldBy(j.opts.Rank, other)))
}

// publishRoot creates the unique id on rank 0 and publishes it.
func (j *joiner) publishRoot(ctx context.Context) ([128]byte, error) {
	var uid [128]byte
	if j.opts.UniqueID != nil {
		var err error
		if uid, err = j.opts.UniqueID(); err != nil {
			return uid, j.fail(j.errorf(err, "", nil, "rank 0 could not create the group's unique id"))
		}
	} else {
		rand.Read(uid[:])
	}
	val, err := json.Marshal(rootRecord{WorldSize: j.opts.WorldSize, UniqueID: uid[:]})
	if err != nil {
		return uid, err
	}
	key := j.keys.root()
	created, _, err := j.createRecord(ctx, key, val, true)
	if err != nil {
		return uid, err
	}
	if !created {
		return uid, j.fail(j.errorf(ErrDuplicateRank, key, []int{0}, "run %q already has a unique id from another rank 0; start exactly one process with rank 0, and a fresh run id per launch", j.opts.RunID))
	}
	return uid, nil
}

// readRoot waits for rank 0's record and checks the world size.
func (j *joiner) readRoot(ctx context.Context) ([128]byte, error) {
	var uid [128]byte
	key := j.keys.root()
	val, err := j.waitRecord(ctx, key)
	if err != nil {
		return uid, err
	}
	rec, err := decodeRootRecord(val)
	if err != nil {
		return uid, j.errorf(ErrInvalid, key, []int{0}, "rank 0's record is malformed (%v); is another program using the %s keys?", err, KeyPrefix)
	}
	if rec.WorldSize != j.opts.WorldSize {
		return uid, j.fail(j.errorf(ErrWorldSizeMismatch, key, []int{0, j.opts.Rank},
			"rank %d was started with world size %d but rank 0 with %d; start every rank with the same world size", j.opts.Rank, j.opts.WorldSize, rec.WorldSize))
	}
	copy(uid[:], rec.UniqueID)
	return uid, nil
}

// readRanks reads every rank's record after the join barrier: their
// endpoints, and what the Group watches: the records as stored and the
// leases that hold them.
func (j *joiner) readRanks(ctx context.Context) ([]map[string]string, []watched, error) {
	l, err := j.rankRecords(ctx, j.keys.ranks())
	if err != nil {
		return nil, nil, err
	}
	if len(l.refused) > 0 {
		// Every rank checked its own record when it registered: this
		// one was rewritten since.
		return nil, nil, j.fail(j.authError(j.keys.ranks(), l.refused, fmt.Sprintf("the record of %s is", rankList(l.refused)), l.unsigned))
	}
	n := j.opts.WorldSize
	endpoints := make([]map[string]string, n)
	records := make([]watched, n)
	var missing, mismatch []int
	for r := range n {
		val, ok := l.valid[r]
		if !ok {
			missing = append(missing, r)
			continue
		}
		rec, err := decodeRankRecord(val)
		if err != nil {
			return nil, nil, j.errorf(ErrInvalid, j.keys.rank(r), []int{r}, "rank %d's record is malformed (%v); is another program using the %s keys?", r, err, KeyPrefix)
		}
		if rec.WorldSize != n {
			mismatch = append(mismatch, r)
		}
		endpoints[r], records[r] = rec.Endpoints, watched{record: l.raw[r], lease: rec.lease()}
	}
	if len(mismatch) > 0 {
		return nil, nil, j.fail(j.errorf(ErrWorldSizeMismatch, j.keys.ranks(), mismatch, "these ranks were started with a world size other than %d; start every rank with the same world size", n))
	}
	if len(missing) > 0 {
		return nil, nil, j.fail(j.errorf(ErrPeerGone, j.keys.ranks(), missing, "these ranks joined and then left before the group formed; check their logs"))
	}
	return endpoints, records, nil
}

// fail records e in the run's abort key, so the ranks still waiting in
// Join fail with it too, and returns e. The first failure recorded wins.
func (j *joiner) fail(e *Error) *Error {
	rec := abortRecord{Kind: abortKind(e.Err), By: j.opts.Rank, Key: e.Key, Ranks: e.Ranks, Detail: e.Detail, Time: time.Now().UTC()}
	if rec.Kind == "failed" {
		rec.Detail = fmt.Sprintf("%s: %v", e.Detail, e.Err)
	}
	val, err := json.Marshal(rec)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		j.createRecord(ctx, j.keys.abort(), val, false)
		cancel()
	}
	return e
}

// fromAbort turns the run's abort record into this rank's error.
func (j *joiner) fromAbort(val []byte) *Error {
	rec, err := decodeAbortRecord(val)
	if err != nil {
		return j.errorf(ErrAborted, j.keys.abort(), nil, "the run was aborted with an unreadable record (%v)", err)
	}
	sentinel, ok := abortKinds[rec.Kind]
	if !ok {
		sentinel = ErrAborted
	}
	return j.errorf(sentinel, rec.Key, rec.Ranks, "%s (reported by rank %d at %s; if that was an earlier launch, start this one with a new run id)",
		rec.Detail, rec.By, rec.Time.Format(time.RFC3339))
}

// notice says, every NoticeEvery until ctx ends, who this rank still
// waits for in Join and who has arrived: the ranks not registered, or if
// all registered, those not at the join barrier.
func (j *joiner) notice(ctx context.Context) {
	log := j.opts.Logger
	if log == nil {
		log = slog.Default()
	}
	t := time.NewTicker(NoticeEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		n := j.opts.WorldSize
		what := "join"
		missing, _, err := j.missingRanks(ctx, j.keys.seen())
		if err == nil && len(missing) == 0 {
			what = "reach the join barrier"
			missing, _, err = j.missingRanks(ctx, j.keys.joinBarrier())
		}
		if err != nil || len(missing) == 0 || ctx.Err() != nil {
			continue // the wait is ending, or the listing failed: the next tick tells
		}
		left := ""
		if dl, ok := ctx.Deadline(); ok {
			left = fmt.Sprintf(", %v left", time.Until(dl).Round(time.Second))
		}
		log.Info(fmt.Sprintf("group %q run %q rank %d: waiting for %s to %s (%d of %d %s)%s",
			j.opts.Group, j.opts.RunID, j.opts.Rank, rankList(missing), what, n-len(missing), n, pastTense(what), left))
	}
}

func pastTense(what string) string {
	if what == "join" {
		return "joined"
	}
	return "at the barrier"
}

// timeoutError names the ranks that never came: those not registered, or
// if all registered, those that never reached the join barrier. Ranks
// whose records are there but do not verify were started with another
// group secret (or were impersonated), and are reported as such.
func (j *joiner) timeoutError(ctx context.Context, timeout time.Duration, cause error) *Error {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	n := j.opts.WorldSize
	where, prefix := "joined", j.keys.seen()
	missing, l, err := j.missingRanks(lctx, prefix)
	if err == nil && len(missing) == 0 {
		where, prefix = "reached the join barrier", j.keys.joinBarrier()
		missing, l, err = j.missingRanks(lctx, prefix)
	}
	if err != nil {
		return j.errorf(ErrTimeout, j.keys.ranks(), nil, "the group did not form within %v (%v), and listing its ranks failed: %v", timeout, cause, err)
	}
	if len(l.refused) > 0 {
		return j.authError(prefix, l.refused, fmt.Sprintf("the group did not form within %v: what %s wrote at %s is", timeout, rankList(l.refused), prefix), l.unsigned)
	}
	hint := fmt.Sprintf("start them with group %q, run id %q and world size %d against the same etcd, or raise the timeout", j.opts.Group, j.opts.RunID, n)
	if slices.Contains(missing, 0) {
		hint += "; rank 0 creates the group, so nothing proceeds without it"
	}
	return j.errorf(ErrTimeout, prefix, missing, "%s never %s within %v; %s", rankList(missing), where, timeout, hint)
}

func rankList(r []int) string {
	if len(r) == 1 {
		return "rank " + strconv.Itoa(r[0])
	}
	return "ranks " + joinInts(r)
}

// barrier makes this rank wait until every rank of the run entered the
// barrier under prefix: each creates prefix<rank> and counts itself in
// prefix"count"; a rank that brings the count to the world size, and finds
// every rank's marker there, creates prefix"done", which all wait for. The
// keys live on no lease: prefix<rank> must outlive a rank that gave up, to
// tell who never came, and "done" one that left right after creating it.
// The counter is only a hint (it is not signed): "done" is created only
// once every marker, signed with a secret, is there.
func (m *member) barrier(ctx context.Context, prefix string) error {
	rank, n := m.opts.Rank, m.opts.WorldSize
	arrived, _, err := m.createRecord(ctx, prefix+strconv.Itoa(rank), nil, false)
	if err != nil {
		return err
	}
	if !arrived {
		return fmt.Errorf("rank %d entered barrier %s twice: %w", rank, strings.TrimSuffix(prefix, "/"), errBarrierReused)
	}
	count, err := m.store.Add(ctx, prefix+"count", 1)
	if err != nil {
		return err
	}
	if count >= int64(n) {
		missing, _, err := m.missingRanks(ctx, prefix)
		if err != nil {
			return err
		}
		if len(missing) == 0 {
			if _, _, err := m.createRecord(ctx, prefix+"done", nil, false); err != nil {
				return err
			}
		}
	}
	_, err = m.waitRecord(ctx, prefix+"done")
	return err
}

var errBarrierReused = errors.New("barrier names are single-use within a run")
