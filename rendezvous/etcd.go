package rendezvous

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/weightcast/weightcast/auth"
)

// DefaultLeaseTTL is the lease TTL of an Etcd store unless WithLeaseTTL
// says otherwise: a rank that dies without closing its store is noticed
// by the others about this long after its last keep-alive.
const DefaultLeaseTTL = 10 * time.Second

// DefaultDialTimeout bounds DialEtcd's first contact with the cluster when
// its timeout is zero.
const DefaultDialTimeout = 5 * time.Second

// EtcdOption configures DialEtcd.
type EtcdOption func(*etcdOptions)

type etcdOptions struct {
	ttl time.Duration
	tls *auth.TLS
	log *slog.Logger
}

// WithLogger sends DialEtcd's notices, every NoticeEvery while etcd does
// not answer yet, to l; nil (the default) means slog.Default(), which
// writes to stderr.
func WithLogger(l *slog.Logger) EtcdOption {
	return func(o *etcdOptions) { o.log = l }
}

// WithTLS makes the client speak TLS 1.3 to etcd, verifying the server's
// certificate against the authority of t and presenting t's certificate
// (for etcd's --client-cert-auth). Endpoints are then host:port or
// https://host:port.
func WithTLS(t *auth.TLS) EtcdOption {
	return func(o *etcdOptions) { o.tls = t }
}

// WithLeaseTTL sets the TTL of the store's lease, rounded up to whole
// seconds. etcd raises TTLs below its minimum, 1.5 election timeouts
// rounded up: 2 s at etcd's defaults, 1 s on an embedetcd server.
func WithLeaseTTL(d time.Duration) EtcdOption {
	return func(o *etcdOptions) { o.ttl = d }
}

// Etcd is the Store on an etcd v3 cluster. Create-if-absent is a
// transaction on the key's CreateRevision being 0; Wait and WaitAbsent
// read the key and then watch it from the read's revision + 1, so nothing
// happening in between is missed and nothing is polled; when the history
// they need was compacted away they read and watch again. Leased keys
// live on one lease per Etcd, granted on first use and kept alive by the
// client until Close revokes it.
type Etcd struct {
	client    *clientv3.Client
	endpoints []string
	ttl       int64 // seconds

	leaseSem chan struct{} // capacity 1: held while granting the lease

	mu      sync.Mutex
	session *concurrency.Session
	closed  bool

	// afterRead, when set by tests, runs in Wait and WaitAbsent between
	// the read and the watch.
	afterRead func()
}

var _ Store = (*Etcd)(nil)

// DialEtcd connects to the etcd cluster at endpoints ("host:port" or
// "http://host:port") and checks that it answers within timeout (zero
// means DefaultDialTimeout) and ctx. It starts only the etcd client's own
// connection goroutines, and Close stops them.
//
// Its errors are *Error values (with no group or run): ErrTimeout when etcd
// does not answer in time, ErrInvalid for options that cannot work, or the
// context's or the client's error.
func DialEtcd(ctx context.Context, endpoints []string, timeout time.Duration, opts ...EtcdOption) (*Etcd, error) {
	o := etcdOptions{ttl: DefaultLeaseTTL}
	for _, opt := range opts {
		opt(&o)
	}
	if timeout == 0 {
		timeout = DefaultDialTimeout
	}
	where := strings.Join(endpoints, ",")
	fail := func(err error, format string, args ...any) (*Etcd, error) {
		return nil, &Error{Err: err, Detail: fmt.Sprintf(format, args...)}
	}
	switch {
	case len(endpoints) == 0:
		return fail(ErrInvalid, "no etcd endpoints given; give the address of an etcd server (etcd://HOST:PORT) or start one in this process with package embedetcd")
	case o.ttl <= 0:
		return fail(ErrInvalid, "lease TTL %v must be positive", o.ttl)
	case timeout < 0:
		return fail(ErrInvalid, "dial timeout %v is negative", timeout)
	}
	cfg := clientv3.Config{Endpoints: endpoints, DialTimeout: timeout, Logger: zap.NewNop()}
	hint := "check that it runs and that this host can reach it"
	if o.tls != nil {
		for _, ep := range endpoints {
			if strings.HasPrefix(ep, "http://") || strings.HasPrefix(ep, "unix://") {
				return fail(ErrInvalid, "endpoint %s would not use TLS; give https://host:port or host:port with TLS settings", ep)
			}
		}
		cfg.TLS = o.tls.Client("")
		hint += ", that it serves TLS, and that its certificate and this rank's come from the same authority"
	} else {
		for _, ep := range endpoints {
			if strings.HasPrefix(ep, "https://") {
				return fail(ErrInvalid, "endpoint %s needs TLS settings (the demo: --tls-ca, --tls-cert, --tls-key)", ep)
			}
		}
		hint += " (without TLS: if etcd serves TLS, give this rank TLS settings)"
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return fail(err, "connecting to etcd at %s", where)
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := firstAnswer(pctx, cli, where, o.log); err != nil {
		cli.Close()
		switch {
		case ctx.Err() != nil:
			return fail(ctx.Err(), "connecting to etcd at %s: %v", where, err)
		case pctx.Err() != nil:
			return fail(ErrTimeout, "etcd at %s does not answer within %v (%v); %s", where, timeout, err, hint)
		}
		return fail(err, "etcd at %s refused the first request; check the address and the credentials", where)
	}
	return &Etcd{
		client:    cli,
		endpoints: append([]string(nil), endpoints...),
		ttl:       int64(math.Ceil(o.ttl.Seconds())),
		leaseSem:  make(chan struct{}, 1),
	}, nil
}

// firstAnswer waits, within ctx, for etcd's answer to a first request,
// saying every NoticeEvery that it still waits. etcd may come up late (a
// rank 0 that serves it starting after the others), so a refused
// connection is waited past too.
func firstAnswer(ctx context.Context, cli *clientv3.Client, where string, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	for {
		actx, cancel := context.WithTimeout(ctx, NoticeEvery)
		_, err := cli.Get(actx, KeyPrefix, clientv3.WithCountOnly())
		expired := actx.Err() != nil
		cancel()
		if err == nil || !expired || ctx.Err() != nil {
			return err
		}
		left := ""
		if dl, ok := ctx.Deadline(); ok {
			left = fmt.Sprintf(", %v left", time.Until(dl).Round(time.Second))
		}
		log.Info(fmt.Sprintf("rendezvous: waiting for etcd at %s to answer (it does not yet: not started, or not reachable from here)%s", where, left))
	}
}

// Endpoints returns the endpoints the store was dialed with.
func (s *Etcd) Endpoints() []string { return append([]string(nil), s.endpoints...) }

func (s *Etcd) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// wrap names the operation and key in err, and turns the errors of a
// client closed underneath a call into ErrStoreClosed.
func (s *Etcd) wrap(ctx context.Context, op, key string, err error) error {
	if ctx.Err() == nil && s.isClosed() {
		err = ErrStoreClosed
	}
	return fmt.Errorf("etcd %s %q: %w", op, key, err)
}

func (s *Etcd) check(op, key string) error {
	if s.isClosed() {
		return fmt.Errorf("etcd %s %q: %w", op, key, ErrStoreClosed)
	}
	return nil
}

// LeaseLost returns a channel that is closed when the store's lease ends:
// etcd could not be reached to renew it for longer than the lease TTL, or
// it was revoked. It is nil before the lease exists (its first use).
func (s *Etcd) LeaseLost() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.session == nil {
		return nil
	}
	return s.session.Done()
}

// lease returns the store's lease, granting it and starting its
// keep-alive on first use.
func (s *Etcd) lease(ctx context.Context) (clientv3.LeaseID, error) {
	select {
	case s.leaseSem <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	defer func() { <-s.leaseSem }()
	s.mu.Lock()
	sess, closed := s.session, s.closed
	s.mu.Unlock()
	if closed {
		return 0, ErrStoreClosed
	}
	if sess != nil {
		select {
		case <-sess.Done():
			return 0, ErrLeaseLost
		default:
			return sess.Lease(), nil
		}
	}
	g, err := s.client.Grant(ctx, s.ttl)
	if err != nil {
		return 0, err
	}
	sess, err = concurrency.NewSession(s.client, concurrency.WithLease(g.ID), concurrency.WithTTL(int(s.ttl)))
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed { // Close ran meanwhile and did not see this session
		sess.Orphan()
		return 0, ErrStoreClosed
	}
	s.session = sess
	return sess.Lease(), nil
}

// Create implements Store.
func (s *Etcd) Create(ctx context.Context, key string, value []byte) (bool, []byte, error) {
	if err := s.check("create", key); err != nil {
		return false, nil, err
	}
	return s.create(ctx, "create", key, value)
}

// CreateLeased implements Store.
func (s *Etcd) CreateLeased(ctx context.Context, key string, value []byte) (bool, []byte, error) {
	if err := s.check("create", key); err != nil {
		return false, nil, err
	}
	id, err := s.lease(ctx)
	if err != nil {
		return false, nil, s.wrap(ctx, "create", key, err)
	}
	return s.create(ctx, "create", key, value, clientv3.WithLease(id))
}

func (s *Etcd) create(ctx context.Context, op, key string, value []byte, opts ...clientv3.OpOption) (bool, []byte, error) {
	resp, err := s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(value), opts...)).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return false, nil, s.wrap(ctx, op, key, err)
	}
	if resp.Succeeded {
		return true, nil, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 { // cannot happen: the Else branch runs on the same revision
		return false, nil, fmt.Errorf("etcd %s %q: key exists but reads empty", op, key)
	}
	return false, kvs[0].Value, nil
}

// Get implements Store.
func (s *Etcd) Get(ctx context.Context, key string) ([]byte, bool, error) {
	if err := s.check("get", key); err != nil {
		return nil, false, err
	}
	resp, err := s.client.Get(ctx, key)
	if err != nil {
		return nil, false, s.wrap(ctx, "get", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, false, nil
	}
	return resp.Kvs[0].Value, true, nil
}

// List implements Store.
func (s *Etcd) List(ctx context.Context, prefix string) (map[string][]byte, error) {
	if err := s.check("list", prefix); err != nil {
		return nil, err
	}
	resp, err := s.client.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, s.wrap(ctx, "list", prefix, err)
	}
	out := make(map[string][]byte, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = kv.Value
	}
	return out, nil
}

// Wait implements Store.
func (s *Etcd) Wait(ctx context.Context, key string) ([]byte, error) {
	if err := s.check("wait for", key); err != nil {
		return nil, err
	}
	for {
		resp, err := s.client.Get(ctx, key)
		if err != nil {
			return nil, s.wrap(ctx, "wait for", key, err)
		}
		if len(resp.Kvs) > 0 {
			return resp.Kvs[0].Value, nil
		}
		ev, err := s.watch(ctx, "wait for", key, resp.Header.Revision+1, clientv3.EventTypePut)
		if err != nil {
			return nil, err
		}
		if ev != nil {
			return ev.Kv.Value, nil
		}
		// nil, nil: the history was compacted; read again.
	}
}

// WaitAbsent implements Store.
func (s *Etcd) WaitAbsent(ctx context.Context, key string) error {
	if err := s.check("wait for deletion of", key); err != nil {
		return err
	}
	for {
		resp, err := s.client.Get(ctx, key, clientv3.WithCountOnly())
		if err != nil {
			return s.wrap(ctx, "wait for deletion of", key, err)
		}
		if resp.Count == 0 {
			return nil
		}
		ev, err := s.watch(ctx, "wait for deletion of", key, resp.Header.Revision+1, clientv3.EventTypeDelete)
		if err != nil || ev != nil {
			return err
		}
	}
}

// WaitChange implements Store: it reads key and, if it still holds
// value, watches it from the read's revision + 1 for its first event.
func (s *Etcd) WaitChange(ctx context.Context, key string, value []byte) (Change, []byte, error) {
	const op = "wait for a change of"
	if err := s.check(op, key); err != nil {
		return 0, nil, err
	}
	for {
		resp, err := s.client.Get(ctx, key)
		if err != nil {
			return 0, nil, s.wrap(ctx, op, key, err)
		}
		if len(resp.Kvs) == 0 {
			return Deleted, nil, nil
		}
		if v := resp.Kvs[0].Value; !bytes.Equal(v, value) {
			return Rewritten, v, nil
		}
		ev, err := s.watch(ctx, op, key, resp.Header.Revision+1, anyEvent)
		if err != nil {
			return 0, nil, err
		}
		switch {
		case ev == nil: // compacted: read again
		case ev.Type == clientv3.EventTypePut:
			return Rewritten, ev.Kv.Value, nil
		default:
			return Deleted, nil, nil
		}
	}
}

// Lease implements Store.
func (s *Etcd) Lease(ctx context.Context) (int64, error) {
	if err := s.check("grant lease of", "this store"); err != nil {
		return 0, err
	}
	id, err := s.lease(ctx)
	if err != nil {
		return 0, s.wrap(ctx, "grant lease of", "this store", err)
	}
	return int64(id), nil
}

// LeaseAlive implements Store: a lease that etcd no longer knows has
// ended.
func (s *Etcd) LeaseAlive(ctx context.Context, id int64) (bool, error) {
	key := fmt.Sprintf("lease %x", id)
	if err := s.check("read", key); err != nil {
		return false, err
	}
	ttl, err := s.client.TimeToLive(ctx, clientv3.LeaseID(id))
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return false, nil
	case err != nil:
		return false, s.wrap(ctx, "read", key, err)
	}
	return ttl.TTL > 0, nil
}

// DeleteIf implements Store: a transaction on the key's value.
func (s *Etcd) DeleteIf(ctx context.Context, key string, value []byte) (bool, error) {
	if err := s.check("delete", key); err != nil {
		return false, err
	}
	resp, err := s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(key), "=", string(value))).
		Then(clientv3.OpDelete(key)).
		Commit()
	if err != nil {
		return false, s.wrap(ctx, "delete", key, err)
	}
	return resp.Succeeded, nil
}

// anyEvent makes watch return the first event of any type.
const anyEvent mvccpb.Event_EventType = -1

// watch watches key from revision rev until an event of type typ (or of
// any type: anyEvent) and returns it. It returns nil, nil when rev was
// compacted away, so the caller reads again.
func (s *Etcd) watch(ctx context.Context, op, key string, rev int64, typ mvccpb.Event_EventType) (*clientv3.Event, error) {
	if s.afterRead != nil {
		s.afterRead()
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the watch on the server
	for wr := range s.client.Watch(wctx, key, clientv3.WithRev(rev)) {
		if wr.CompactRevision != 0 {
			return nil, nil
		}
		if err := wr.Err(); err != nil {
			return nil, s.wrap(ctx, op, key, err)
		}
		for _, ev := range wr.Events {
			if typ == anyEvent || ev.Type == typ {
				return ev, nil
			}
		}
	}
	// The channel closes without a response when ctx ends or the client
	// is closed.
	if err := ctx.Err(); err != nil {
		return nil, s.wrap(ctx, op, key, err)
	}
	return nil, s.wrap(ctx, op, key, errors.New("watch ended without an answer"))
}

// Add implements Store.
func (s *Etcd) Add(ctx context.Context, key string, delta int64) (int64, error) {
	if err := s.check("add to", key); err != nil {
		return 0, err
	}
	for {
		resp, err := s.client.Get(ctx, key)
		if err != nil {
			return 0, s.wrap(ctx, "add to", key, err)
		}
		var cur int64
		cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
		if len(resp.Kvs) > 0 {
			kv := resp.Kvs[0]
			if cur, err = strconv.ParseInt(string(kv.Value), 10, 64); err != nil {
				return 0, fmt.Errorf("etcd add to %q: value %q is not a counter", key, kv.Value)
			}
			cmp = clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)
		}
		next := cur + delta
		tr, err := s.client.Txn(ctx).If(cmp).Then(clientv3.OpPut(key, strconv.FormatInt(next, 10))).Commit()
		if err != nil {
			return 0, s.wrap(ctx, "add to", key, err)
		}
		if tr.Succeeded {
			return next, nil
		}
		// Someone else changed the counter between our read and write.
	}
}

// DeletePrefix implements Store. It refuses the empty prefix.
func (s *Etcd) DeletePrefix(ctx context.Context, prefix string) error {
	if prefix == "" {
		return errors.New("etcd delete: refusing to delete every key (empty prefix)")
	}
	if err := s.check("delete prefix", prefix); err != nil {
		return err
	}
	if _, err := s.client.Delete(ctx, prefix, clientv3.WithPrefix()); err != nil {
		return s.wrap(ctx, "delete prefix", prefix, err)
	}
	return nil
}

// revokeTimeout bounds the lease revocation of Close.
const revokeTimeout = 2 * time.Second

// Close implements Store: it stops the keep-alive, revokes the lease
// (within revokeTimeout; if that fails the lease simply expires), and
// closes the client.
func (s *Etcd) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	sess := s.session
	s.mu.Unlock()
	var err error
	if sess != nil {
		select {
		case <-sess.Done():
			// The lease is already gone (etcd unreachable past the TTL):
			// revoking it would only wait on an etcd that does not answer.
			sess.Orphan()
		default:
			// Revoke with a short bound, not the session's TTL: when etcd
			// is gone (it died with the rank 0 that served it), waiting
			// longer only delays the close, and the lease dies with it.
			sess.Orphan()
			ctx, cancel := context.WithTimeout(context.Background(), revokeTimeout)
			_, rerr := s.client.Revoke(ctx, sess.Lease())
			cancel()
			if rerr != nil {
				err = fmt.Errorf("etcd: revoking lease %x: %w", sess.Lease(), rerr)
			}
		}
	}
	if cerr := s.client.Close(); cerr != nil && !errors.Is(cerr, context.Canceled) {
		err = errors.Join(err, fmt.Errorf("etcd: closing client: %w", cerr))
	}
	return err
}

// abandon closes the client without revoking the lease, as a process that
// dies does: the leased keys stay until the lease TTL runs out. For tests.
func (s *Etcd) abandon() {
	s.mu.Lock()
	s.closed = true
	sess := s.session
	s.mu.Unlock()
	if sess != nil {
		sess.Orphan()
	}
	s.client.Close()
}
