package tcp

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"golang.org/x/sync/errgroup"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/internal/ratelog"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/internal/handshake"
)

// Name is the registry name of this transport.
const Name = "tcp"

// DefaultChunk is the chunk size used when the "chunk" option is not set.
const DefaultChunk = 256 << 10

// AddrKey is the Exchange key under which every receiver publishes the
// address it listens on.
const AddrKey = "tcp.addr"

// The option names Open understands in transport.Config.Options.
const (
	OptChunk     = "chunk"     // chunk size, such as "256KiB" or "1MiB"; the root's value applies to the whole chain
	OptBind      = "bind"      // host or host:port a receiver listens on; default 127.0.0.1
	OptAdvertise = "advertise" // host or host:port published instead of the bound address
)

// ErrHandshake is wrapped by Open errors from a connection whose peer does
// not belong to this group: another group name, world size, rank,
// protocol version or group secret (those wrap auth.ErrFailed too).
var ErrHandshake = handshake.ErrRejected

// proto is the handshake of the chain's connections.
var proto = handshake.Protocol{Name: Name, Magic: magic, Version: version}

// maxHandshake bounds one connection's handshake (TLS and ours) within
// the wait for it.
const maxHandshake = 10 * time.Second

type options struct {
	chunk     int
	bind      string
	advertise string
}

func parseOptions(m map[string]string) (options, error) {
	o := options{chunk: DefaultChunk, bind: "127.0.0.1"}
	var unknown []string
	for k, v := range m {
		switch k {
		case OptChunk:
			c, err := humanize.ParseBytes(v)
			if err != nil {
				return o, fmt.Errorf("option %s=%q: %v; give a size such as 4MiB", k, v, err)
			}
			if c < minChunk || c > maxChunk {
				return o, fmt.Errorf("option %s=%q: chunk size must lie between 1KiB and 1GiB", k, v)
			}
			o.chunk = int(c)
		case OptBind:
			if v == "" {
				return o, fmt.Errorf("option %s is empty; give a host such as 0.0.0.0 or 10.0.0.5", k)
			}
			o.bind = v
		case OptAdvertise:
			o.advertise = v
		default:
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return o, fmt.Errorf("unknown option(s) %s; the tcp transport takes %s, %s and %s",
			strings.Join(unknown, ", "), OptChunk, OptBind, OptAdvertise)
	}
	return o, nil
}

// endpoint is one rank's place in the chain root → 1 → 2 → … → N-1.
type endpoint struct {
	cfg     transport.Config
	rank    int
	world   int
	timeout time.Duration
	chunk   int

	// proto and extra are what the handshakes of this endpoint's
	// connections say: the chain's protocol, or the point-to-point
	// mode's (pairs.go) with the count of senders.
	proto handshake.Protocol
	extra []byte

	up   net.Conn      // from rank-1; nil on the root
	upR  *bufio.Reader // reads up
	down net.Conn      // to rank+1; nil on the tail
	log  *ratelog.Logger

	// Touched only by the goroutine running Broadcast (and the goroutines
	// it starts and joins), under mu.
	mu     sync.Mutex
	broken error // the first error; every later Broadcast returns it
	// upOwed and downOwed are the rest of a frame whose write a
	// failure interrupted, nil at a frame boundary (see writeFrames).
	upOwed, downOwed [][]byte
	rhdr             [frameLen]byte
	ahdr             [frameLen]byte
	whdr             [frameLen]byte
	hdrs             []byte   // chunk frame headers of one write batch
	iov              [][]byte // one write batch

	closed    atomic.Bool
	closeOnce sync.Once
}

// Open places cfg.Rank in the chain of cfg.Group. Every receiver listens on
// a TCP port and publishes its address under AddrKey through cfg.Exchange;
// every rank but the tail dials its successor, and every receiver accepts
// exactly one connection, from its predecessor. A handshake checks that both
// ends agree on the group, the world size and their ranks, and with
// cfg.Auth proves that both hold the group secret; with cfg.TLS the
// connection is mutual TLS 1.3 first. A receiver refuses (and logs) every
// connection whose handshake fails and keeps waiting for its predecessor.
// Each wait (the successor's address, the predecessor's connection) is
// bounded by cfg.WaitTimeout() and by ctx.
//
// Buffers must be host memory (cfg.Device of kind mem.KindHost).
func Open(ctx context.Context, cfg transport.Config) (transport.Endpoint, error) {
	fail := func(peer int, err error) error {
		return &transport.Error{Transport: Name, Group: cfg.Group, Rank: cfg.Rank, Op: "open", Peer: peer, Err: err}
	}
	if err := cfg.Validate(); err != nil {
		return nil, fail(-1, err)
	}
	if cfg.Device.Kind() != mem.KindHost {
		return nil, fail(-1, fmt.Errorf("device %s holds %s memory, the tcp transport moves host memory only; use the nccl or ipc transport for GPU buffers", cfg.Device.Name(), cfg.Device.Kind()))
	}
	if cfg.Exchange == nil {
		return nil, fail(-1, errors.New("no Exchange in the config: the tcp transport needs one to share the receivers' addresses"))
	}
	if len(cfg.Group) > maxGroup {
		return nil, fail(-1, fmt.Errorf("group name of %d bytes, the tcp transport takes at most %d", len(cfg.Group), maxGroup))
	}
	opts, err := parseOptions(cfg.Options)
	if err != nil {
		return nil, fail(-1, err)
	}
	e := &endpoint{cfg: cfg, rank: cfg.Rank, world: cfg.WorldSize, timeout: cfg.WaitTimeout(), chunk: opts.chunk,
		proto: proto, log: ratelog.New(cfg.Logger, 0)}

	var ln *net.TCPListener
	if e.rank > 0 {
		var addr string
		ln, addr, err = listen(ctx, opts)
		if err != nil {
			return nil, fail(-1, err)
		}
		defer ln.Close() // only one connection is ever accepted
		pctx, cancel := context.WithTimeout(ctx, e.timeout)
		err = cfg.Exchange.Put(pctx, AddrKey, []byte(addr))
		cancel()
		if err != nil {
			return nil, fail(-1, fmt.Errorf("publishing this rank's address %s: %w", addr, err))
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	if e.rank > 0 {
		g.Go(func() (err error) { e.up, err = e.acceptPrev(gctx, ln); return err })
	}
	if e.rank < e.world-1 {
		g.Go(func() (err error) { e.down, err = e.dialNext(gctx); return err })
	}
	if err := g.Wait(); err != nil {
		for _, c := range []net.Conn{e.up, e.down} {
			if c != nil {
				c.Close()
			}
		}
		return nil, err
	}
	if e.up != nil {
		// Frame headers are read through a small buffer (one read
		// may take several small frames); chunk payloads bypass it
		// and land in the caller's buffer, but for the few bytes the
		// buffer read ahead.
		e.upR = bufio.NewReaderSize(e.up, 4<<10)
	}
	return e, nil
}

// listen binds the receiver's port and returns the address to publish.
func listen(ctx context.Context, o options) (*net.TCPListener, string, error) {
	bind := o.bind
	if _, _, err := net.SplitHostPort(bind); err != nil {
		bind = net.JoinHostPort(bind, "0")
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", bind)
	if err != nil {
		return nil, "", fmt.Errorf("listening on %s (option %s): %w", bind, OptBind, err)
	}
	ln := l.(*net.TCPListener)
	bound := ln.Addr().(*net.TCPAddr)
	port := fmt.Sprint(bound.Port)
	switch {
	case o.advertise != "":
		if h, p, err := net.SplitHostPort(o.advertise); err == nil {
			return ln, net.JoinHostPort(h, p), nil
		}
		return ln, net.JoinHostPort(o.advertise, port), nil
	case bound.IP.IsUnspecified():
		ln.Close()
		return nil, "", fmt.Errorf("bound %s, which other ranks cannot dial; set option %s to an address of this host that the previous rank reaches", bound, OptAdvertise)
	}
	return ln, bound.String(), nil
}

// ctxErr is ctx.Err(), or context.DeadlineExceeded as soon as ctx's deadline
// has passed (a connection deadline set from it may fire a moment before the
// context's own timer).
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return transport.ContextErr(ctx)
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

// deadline is now plus d, or ctx's deadline when that comes first.
func deadline(ctx context.Context, d time.Duration) time.Time {
	t := time.Now().Add(d)
	if dl, ok := ctx.Deadline(); ok && dl.Before(t) {
		return dl
	}
	return t
}

var past = time.Unix(1, 0)

// isTimeout reports an I/O error caused by a deadline.
func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// isGone reports an I/O error meaning the peer closed or lost the
// connection.
func isGone(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.ETIMEDOUT) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH)
}

// ioError explains an error of I/O with peer while doing what.
func ioError(ctx context.Context, err error, peer int, timeout time.Duration, doing string) error {
	if cerr := ctxErr(ctx); cerr != nil {
		return fmt.Errorf("%s: %w", doing, cerr)
	}
	switch {
	case isTimeout(err):
		return fmt.Errorf("%s: nothing from rank %d within %v: %w", doing, peer, timeout, transport.ErrTimeout)
	case isGone(err):
		return fmt.Errorf("%s: rank %d closed the connection (%v): %w", doing, peer, err, transport.ErrPeerGone)
	}
	return fmt.Errorf("%s: %w", doing, err)
}

// guard bounds the I/O on c by d and by ctx until the returned stop is called.
func guard(ctx context.Context, c net.Conn, d time.Duration) (stop func(), err error) {
	c.SetDeadline(deadline(ctx, d))
	after := context.AfterFunc(ctx, func() { c.SetDeadline(past) })
	if err := ctxErr(ctx); err != nil { // cancelled before the deadline was set
		after()
		return nil, err
	}
	return func() { after(); c.SetDeadline(time.Time{}) }, nil
}

// side is what this rank says of itself in a handshake on a connection
// whose TLS channel binding is binding (nil on plain TCP).
func (e *endpoint) side(binding []byte) handshake.Side {
	return handshake.Side{Group: e.cfg.Group, Rank: e.rank, World: e.world, Extra: e.extra, Keys: e.cfg.Auth, Binding: binding}
}

// wantRank accepts a hello from rank want only.
func (e *endpoint) wantRank(want int) handshake.Check {
	return func(h handshake.Hello) string {
		if h.Rank != want {
			return fmt.Sprintf("rank %d connected where rank %d's neighbour must be rank %d: give every rank a distinct rank", h.Rank, e.rank, want)
		}
		return ""
	}
}

// secure runs the TLS handshake on c when the config has TLS (as the
// server when server is set, else as the client of host), and returns the
// connection to use and its channel binding.
func (e *endpoint) secure(ctx context.Context, c net.Conn, server bool, host string) (net.Conn, []byte, error) {
	if e.cfg.TLS == nil {
		return c, nil, nil
	}
	var tc *tls.Conn
	if server {
		tc = tls.Server(c, e.cfg.TLS.Server())
	} else {
		tc = tls.Client(c, e.cfg.TLS.Client(host))
	}
	if err := tc.HandshakeContext(ctx); err != nil {
		var plain tls.RecordHeaderError
		if server && errors.As(err, &plain) && plain.Conn != nil && binary.BigEndian.Uint32(plain.RecordHeader[:4]) == e.proto.Magic {
			e.refusePlain(plain.Conn)
		}
		return nil, nil, fmt.Errorf("TLS handshake: %w", err)
	}
	b, err := auth.TLSBinding(tc.ConnectionState())
	return tc, b, err
}

// refusePlain answers a plain handshake that reached this rank, which runs
// with TLS, with a refusal saying so, so that the dialer names the cause
// instead of seeing the connection close. It reads what the dialer sent
// after the refusal (until the dialer closes, within a second), since a
// connection closed with unread bytes is reset and the dialer could lose
// the refusal. The caller closes c.
func (e *endpoint) refusePlain(c net.Conn) {
	c.SetDeadline(time.Now().Add(time.Second))
	if handshake.Refuse(c, e.proto, fmt.Sprintf("rank %d runs with TLS, and this connection does not: give every rank the same TLS settings", e.rank)) == nil {
		io.Copy(io.Discard, io.LimitReader(c, handshake.MaxGroup+handshake.MaxExtra+256))
	}
}

// acceptPrev accepts the connection of rank-1. Every connection whose
// handshake fails (a stranger, a port scan, a peer of another group,
// world size, rank or secret) is refused, logged, and the wait goes on:
// nothing that has not proved to be rank-1 can end it.
func (e *endpoint) acceptPrev(ctx context.Context, ln *net.TCPListener) (net.Conn, error) {
	prev := e.rank - 1
	fail := func(err error) error {
		return &transport.Error{Transport: Name, Group: e.cfg.Group, Rank: e.rank, Op: "open", Peer: prev, Err: err}
	}
	wctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	addr := ln.Addr()
	a := handshake.Admission{Want: 1, Bound: min(e.timeout, maxHandshake), Log: e.log,
		What: fmt.Sprintf("tcp transport, group %q rank %d waiting for rank %d on %s", e.cfg.Group, e.rank, prev, addr)}
	got, refused, err := handshake.Admit(wctx, ln, a, func(hctx context.Context, c net.Conn) (net.Conn, error) {
		sc, binding, err := e.secure(hctx, c, true, "")
		if err != nil {
			return nil, err
		}
		if _, err := handshake.Accept(sc, e.proto, e.side(binding), e.wantRank(prev)); err != nil {
			return nil, err
		}
		return sc, nil
	})
	if err == nil {
		return got[0].Value, nil
	}
	note := ""
	if refused.N > 0 {
		note = " (" + refused.String() + ")"
	}
	switch {
	case ctxErr(ctx) != nil:
		return nil, fail(fmt.Errorf("waiting for rank %d to connect to %s%s: %w", prev, addr, note, ctxErr(ctx)))
	case errors.Is(err, context.DeadlineExceeded) && refused.Auth:
		return nil, fail(fmt.Errorf("rank %d did not connect to %s within %v%s: %w (%w)", prev, addr, e.timeout, note, transport.ErrTimeout, auth.ErrFailed))
	case errors.Is(err, context.DeadlineExceeded):
		return nil, fail(fmt.Errorf("rank %d did not connect to %s within %v%s: %w", prev, addr, e.timeout, note, transport.ErrTimeout))
	}
	return nil, fail(fmt.Errorf("accepting rank %d's connection on %s: %w", prev, addr, err))
}

// dialNext looks up rank+1's address and connects to it.
func (e *endpoint) dialNext(ctx context.Context) (net.Conn, error) {
	return e.dialRank(ctx, e.rank+1, AddrKey, e.wantRank(e.rank+1))
}

// dialRank looks up the address rank next published under key and
// connects to it, accepting its hello by check.
func (e *endpoint) dialRank(ctx context.Context, next int, key string, check handshake.Check) (net.Conn, error) {
	fail := func(err error) error {
		return &transport.Error{Transport: Name, Group: e.cfg.Group, Rank: e.rank, Op: "open", Peer: next, Err: err}
	}
	gctx, cancel := context.WithTimeout(ctx, e.timeout)
	addr, err := e.cfg.Exchange.Get(gctx, next, key)
	cancel()
	if err != nil {
		if ctxErr(ctx) == nil && errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("rank %d did not publish its address within %v (%v): %w", next, e.timeout, err, transport.ErrTimeout)
		} else {
			err = fmt.Errorf("looking up rank %d's address: %w", next, err)
		}
		return nil, fail(err)
	}
	dctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		c, err := e.dial(ctx, dctx, next, string(addr))
		if err != nil {
			return nil, fail(err)
		}
		sc, err := e.introduce(ctx, c, next, string(addr), check)
		if err == nil {
			return sc, nil
		}
		c.Close()
		var unanswered *unansweredError
		switch {
		case !errors.As(err, &unanswered):
			return nil, fail(err)
		case attempt == maxAttempts:
			return nil, fail(fmt.Errorf("%w (it closed all %d connections this rank opened)", err, attempt))
		}
		// A receiver under a flood of strangers' connections may have
		// closed this one to make room (handshake.Admit); a new one
		// takes the place of a stranger's.
		t := time.NewTimer(time.Duration(attempt) * retryPause)
		select {
		case <-t.C:
		case <-dctx.Done():
			t.Stop()
			return nil, fail(err)
		}
	}
}

// maxAttempts bounds the connections dialNext opens to a successor that
// closes them before answering the handshake, retryPause (times the
// attempt) the pause after each.
const (
	maxAttempts = 5
	retryPause  = 100 * time.Millisecond
)

// unansweredError is the error of a handshake whose peer closed the
// connection before it answered anything: worth a new connection.
type unansweredError struct{ err error }

func (e *unansweredError) Error() string { return e.err.Error() }
func (e *unansweredError) Unwrap() error { return e.err }

// dial connects to rank next at addr, within dctx.
func (e *endpoint) dial(ctx, dctx context.Context, next int, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(dctx, "tcp", addr)
	if err == nil {
		return c, nil
	}
	switch {
	case ctxErr(ctx) != nil:
		return nil, fmt.Errorf("connecting to rank %d at %s: %w", next, addr, ctxErr(ctx))
	case errors.Is(err, syscall.ECONNREFUSED):
		return nil, fmt.Errorf("rank %d at %s refused the connection; is it still running? (%v): %w", next, addr, err, transport.ErrPeerGone)
	case ctxErr(dctx) != nil || isTimeout(err):
		return nil, fmt.Errorf("connecting to rank %d at %s: no answer within %v: %w", next, addr, e.timeout, transport.ErrTimeout)
	}
	return nil, fmt.Errorf("connecting to rank %d at %s: %w", next, addr, err)
}

// introduce runs TLS (with the config's TLS) and the handshake on c, the
// connection to rank next at addr (whose hello check accepts), and returns
// the connection to use.
func (e *endpoint) introduce(ctx context.Context, c net.Conn, next int, addr string, check handshake.Check) (net.Conn, error) {
	hctx, cancel := context.WithTimeout(ctx, min(e.timeout, maxHandshake))
	defer cancel()
	stop, err := guard(hctx, c, e.timeout)
	if err != nil {
		return nil, fmt.Errorf("handshake with rank %d: %w", next, err)
	}
	defer stop()
	host, _, _ := net.SplitHostPort(addr)
	sc, binding, err := e.secure(hctx, c, false, host)
	if err != nil {
		hint := "if it runs without TLS, give every rank the same TLS settings"
		var cert *tls.CertificateVerificationError
		if errors.As(err, &cert) {
			hint = "give every rank a certificate of the same authority, valid for the addresses they publish"
		}
		err = fmt.Errorf("rank %d at %s: %w; %s", next, addr, ioError(ctx, err, next, e.timeout, "TLS"), hint)
		if errors.Is(err, transport.ErrPeerGone) && ctxErr(ctx) == nil {
			err = &unansweredError{err}
		}
		return nil, err
	}
	_, err = handshake.Dial(sc, e.proto, e.side(binding), check)
	switch {
	case err == nil:
		return sc, nil
	case isGone(err) && ctxErr(ctx) == nil:
		// A rank with TLS answers a plain handshake with a refusal
		// saying so; one that closes without a word is busy, or going.
		return nil, &unansweredError{fmt.Errorf("handshake with rank %d at %s: it closed the connection before answering (%v); is it still running, and is this its address?: %w", next, addr, err, transport.ErrPeerGone)}
	case errors.Is(err, handshake.ErrNotPeer):
		return nil, fmt.Errorf("rank %d's published address %s answered, but %v; check the exchange and the %s option", next, addr, err, OptAdvertise)
	case errors.Is(err, handshake.ErrRejected), errors.Is(err, handshake.ErrMalformed):
		return nil, fmt.Errorf("handshake with rank %d at %s: %w", next, addr, err)
	}
	return nil, ioError(hctx, err, next, e.timeout, fmt.Sprintf("handshake with rank %d at %s", next, addr))
}

// Close closes the endpoint's connections, so that its neighbours see
// ErrPeerGone naming this rank, and waits for a Broadcast in progress to
// return. It is idempotent.
func (e *endpoint) Close() error {
	e.closeOnce.Do(func() {
		e.closed.Store(true)
		for _, c := range []net.Conn{e.up, e.down} {
			if c != nil {
				c.Close()
			}
		}
	})
	e.mu.Lock() // a Broadcast in progress fails fast on the closed connections
	e.mu.Unlock()
	return nil
}
