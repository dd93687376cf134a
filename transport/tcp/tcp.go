package tcp

import (
	"bufio"
	"context"
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

	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
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
// not belong to this group: another group name, world size, rank or
// protocol version.
var ErrHandshake = errors.New("handshake rejected")

func init() { transport.Register(Name, Open) }

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

	up   net.Conn      // from rank-1; nil on the root
	upR  *bufio.Reader // reads up
	down net.Conn      // to rank+1; nil on the tail

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
// ends agree on the group, the world size and their ranks. Each wait (the
// successor's address, the predecessor's connection, the handshake) is
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
	e := &endpoint{cfg: cfg, rank: cfg.Rank, world: cfg.WorldSize, timeout: cfg.WaitTimeout(), chunk: opts.chunk}

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

// acceptPrev accepts the connection of rank-1. A connection that does not
// speak this protocol at all is dropped and the wait goes on; a peer of this
// protocol with another group, world size or rank fails Open on both sides.
func (e *endpoint) acceptPrev(ctx context.Context, ln *net.TCPListener) (net.Conn, error) {
	prev := e.rank - 1
	fail := func(err error) error {
		return &transport.Error{Transport: Name, Group: e.cfg.Group, Rank: e.rank, Op: "open", Peer: prev, Err: err}
	}
	ln.SetDeadline(deadline(ctx, e.timeout))
	stop := context.AfterFunc(ctx, func() { ln.SetDeadline(past) })
	defer stop()
	var dropped []string
	for {
		if err := ctxErr(ctx); err != nil {
			return nil, fail(fmt.Errorf("waiting for rank %d to connect to %s: %w", prev, ln.Addr(), err))
		}
		c, err := ln.Accept()
		if err != nil {
			if cerr := ctxErr(ctx); cerr != nil {
				return nil, fail(fmt.Errorf("waiting for rank %d to connect to %s: %w", prev, ln.Addr(), cerr))
			}
			if isTimeout(err) {
				note := ""
				if len(dropped) > 0 {
					note = fmt.Sprintf(" (dropped connections that were not rank %d: %s)", prev, strings.Join(dropped, "; "))
				}
				return nil, fail(fmt.Errorf("rank %d did not connect to %s within %v%s: %w", prev, ln.Addr(), e.timeout, note, transport.ErrTimeout))
			}
			return nil, fail(fmt.Errorf("accepting rank %d's connection on %s: %w", prev, ln.Addr(), err))
		}
		err = e.handshake(ctx, c, prev, false)
		if err == nil {
			return c, nil
		}
		c.Close()
		var np notPeer
		if errors.As(err, &np) {
			dropped = append(dropped, fmt.Sprintf("%s: %v", c.RemoteAddr(), np.err))
			continue
		}
		return nil, fail(err)
	}
}

// dialNext looks up rank+1's address and connects to it.
func (e *endpoint) dialNext(ctx context.Context) (net.Conn, error) {
	next := e.rank + 1
	fail := func(err error) error {
		return &transport.Error{Transport: Name, Group: e.cfg.Group, Rank: e.rank, Op: "open", Peer: next, Err: err}
	}
	gctx, cancel := context.WithTimeout(ctx, e.timeout)
	addr, err := e.cfg.Exchange.Get(gctx, next, AddrKey)
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
	var d net.Dialer
	c, err := d.DialContext(dctx, "tcp", string(addr))
	if err != nil {
		switch {
		case ctxErr(ctx) != nil:
			err = fmt.Errorf("connecting to rank %d at %s: %w", next, addr, ctxErr(ctx))
		case errors.Is(err, syscall.ECONNREFUSED):
			err = fmt.Errorf("rank %d at %s refused the connection; is it still running? (%v): %w", next, addr, err, transport.ErrPeerGone)
		case ctxErr(dctx) != nil || isTimeout(err):
			err = fmt.Errorf("connecting to rank %d at %s: no answer within %v: %w", next, addr, e.timeout, transport.ErrTimeout)
		default:
			err = fmt.Errorf("connecting to rank %d at %s: %w", next, addr, err)
		}
		return nil, fail(err)
	}
	if err := e.handshake(ctx, c, next, true); err != nil {
		c.Close()
		var np notPeer
		if errors.As(err, &np) {
			err = fmt.Errorf("rank %d's published address %s answered, but %v; check the exchange and the %s option", next, addr, np.err, OptAdvertise)
		}
		return nil, fail(err)
	}
	return c, nil
}

// notPeer wraps a handshake failure of a connection that does not speak this
// protocol.
type notPeer struct{ err error }

func (n notPeer) Error() string { return n.err.Error() }

// check returns why h, the hello of the peer that should be rank want, does
// not fit this rank, or "".
func (e *endpoint) check(h hello, want int) string {
	switch {
	case h.version != version:
		return fmt.Sprintf("rank %d speaks tcp transport protocol version %d, rank %d speaks %d: run the same weightcast release on every rank", h.rank, h.version, e.rank, version)
	case h.group != e.cfg.Group:
		return fmt.Sprintf("rank %d belongs to group %q, rank %d to group %q: start every rank of a group with the same group name", h.rank, h.group, e.rank, e.cfg.Group)
	case h.world != e.world:
		return fmt.Sprintf("rank %d says the group has %d ranks, rank %d says %d: start every rank with the same world size", h.rank, h.world, e.rank, e.world)
	case h.rank != want:
		return fmt.Sprintf("rank %d connected where rank %d's neighbour must be rank %d: give every rank a distinct rank", h.rank, e.rank, want)
	}
	return ""
}

// handshake introduces this rank to peer on c (see wire.go) and fails
// unless both ends accept each other.
func (e *endpoint) handshake(ctx context.Context, c net.Conn, peer int, dialer bool) error {
	stop, err := guard(ctx, c, e.timeout)
	if err != nil {
		return fmt.Errorf("handshake with rank %d: %w", peer, err)
	}
	defer stop()
	ioErr := func(err error) error {
		if errors.Is(err, errProtocol) {
			return fmt.Errorf("handshake with rank %d at %s: %w", peer, c.RemoteAddr(), err)
		}
		return ioError(ctx, err, peer, e.timeout, fmt.Sprintf("handshake with rank %d at %s", peer, c.RemoteAddr()))
	}
	me := hello{version: version, rank: e.rank, world: e.world, group: e.cfg.Group}.encode()
	var mine, theirs string
	if dialer {
		if _, err := c.Write(me); err != nil {
			return ioErr(err)
		}
		h, err := readHello(c)
		if errors.Is(err, errNotPeer) {
			return notPeer{err}
		}
		if err != nil {
			return ioErr(err)
		}
		if theirs, err = readVerdict(c); err != nil {
			return ioErr(err)
		}
		mine = e.check(h, peer)
		if _, err := c.Write(encodeVerdict(mine)); err != nil && mine == "" && theirs == "" {
			return ioErr(err)
		}
	} else {
		h, err := readHello(c)
		if err != nil {
			// Whatever this is, it is not a live predecessor: a
			// stranger, or a peer that died before saying hello.
			return notPeer{err}
		}
		mine = e.check(h, peer)
		if _, err := c.Write(append(me, encodeVerdict(mine)...)); err != nil && mine == "" {
			return ioErr(err)
		}
		if mine == "" {
			if theirs, err = readVerdict(c); err != nil {
				return ioErr(err)
			}
		}
	}
	switch {
	case mine != "":
		return fmt.Errorf("%w: %s", ErrHandshake, mine)
	case theirs != "":
		return fmt.Errorf("%w by rank %d: %s", ErrHandshake, peer, theirs)
	}
	return nil
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
