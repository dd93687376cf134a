package zmqbus

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	ztransport "github.com/go-zeromq/zmq4/transport"

	"github.com/weightcast/weightcast/auth"
)

// guardScheme is the zmq4 transport name under which this package dials
// and listens. On the wire it is plain ZMTP 3 over TCP: peers (and the
// addresses published to them) see tcp://host:port.
//
// zmq4 v0.17.0 has no ZMQ_MAXMSGSIZE: it allocates whatever length a frame
// header announces, and it runs the ZMTP handshake of an accepted connection
// in its accept loop with no deadline, so one silent TCP client stops every
// later receiver from connecting. The guard wraps each net.Conn to fix both:
// it follows the ZMTP framing of the bytes zmq4 reads and fails the read
// that would deliver an oversized frame length (before zmq4 allocates), and
// it bounds the handshake with a deadline.
//
// It also gives the bus what zmq4 does not: a connection of its own per
// peer identity. zmq4's ROUTER sends a message to every connection whose
// peer announced the routing identity it is addressed to, and cannot close
// one connection; the guard reads each accepted connection's identity from
// its ZMTP READY command, refuses a second live connection with the same
// one, and lets the publisher close the connection of an identity (a
// stranger that failed its handshake) through the socket's registry. And
// zmq4 has no security mechanism but NULL and PLAIN (no CURVE): with TLS
// settings the guard runs TLS 1.3 under ZMTP, and the registry keeps each
// connection's channel binding for the bus's handshake proofs.
const guardScheme = "weightcast-tcp"

// guardConfig is the per-socket configuration of the guard, passed to the
// transport through the zmq4 socket's context.
type guardConfig struct {
	maxFrame   uint64        // largest data frame
	maxMessage uint64        // largest sum of the frames of one message
	maxParts   int           // most frames in one message
	handshake  time.Duration // bound on the TLS handshake, and on the ZMTP greeting and READY exchange
	tls        *tls.Config   // TLS under ZMTP: the server's config on a listener, the client's on a dialer; nil for plain TCP
	reg        *registry     // the socket's connections; nil: not kept
}

// registry is one socket's live connections: by the peer's identity on a
// listener, the one it dialed on a dialer.
type registry struct {
	mu     sync.Mutex
	byID   map[string]*guardConn
	dialed *guardConn
	tlsErr error // a TLS handshake of Dial that failed, for the caller's error
}

func newRegistry() *registry { return &registry{byID: map[string]*guardConn{}} }

// add records g under id, unless a live connection has it.
func (r *registry) add(id string, g *guardConn) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.byID[id]; dup {
		return fmt.Errorf("%w: a second connection announced the routing identity of a connected peer", ErrProtocol)
	}
	r.byID[id] = g
	return nil
}

func (r *registry) remove(g *guardConn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byID[g.id] == g {
		delete(r.byID, g.id)
	}
}

// drop closes the connection of identity id, if there is one.
func (r *registry) drop(id string) {
	r.mu.Lock()
	g := r.byID[id]
	r.mu.Unlock()
	if g != nil {
		g.Close()
	}
}

// binding is the TLS channel binding of the connection of identity id,
// or of the dialed connection when id is empty; nil on plain TCP.
func (r *registry) binding(id string) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.dialed
	if id != "" {
		g = r.byID[id]
	}
	if g == nil {
		return nil
	}
	return g.binding
}

func (r *registry) dialFailed(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.tlsErr == nil {
		r.tlsErr = err
	}
}

func (r *registry) dialError() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tlsErr
}

type guardKey struct{}

func withGuard(ctx context.Context, g guardConfig) context.Context {
	return context.WithValue(ctx, guardKey{}, g)
}

func guardFrom(ctx context.Context) guardConfig {
	if g, ok := ctx.Value(guardKey{}).(guardConfig); ok {
		return g
	}
	return guardConfig{maxFrame: controlLimit, maxMessage: 2 * controlLimit, maxParts: 4, handshake: 10 * time.Second}
}

func init() {
	if err := zmq4.RegisterTransport(guardScheme, guardTransport{}); err != nil {
		panic(err)
	}
}

// limitError reports a frame or message over a size limit. It matches
// ErrTooLarge under errors.Is.
type limitError struct {
	what        string
	size, limit uint64
}

func (e *limitError) Error() string {
	return fmt.Sprintf("%s of %d bytes exceeds the limit of %d bytes", e.what, e.size, e.limit)
}

func (e *limitError) Is(target error) bool { return target == ErrTooLarge }

type guardTransport struct{}

func (guardTransport) Dial(ctx context.Context, d ztransport.Dialer, addr string) (net.Conn, error) {
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	cfg := guardFrom(ctx)
	conn, binding, err := secure(c, cfg, false)
	if err != nil {
		c.Close()
		if cfg.reg != nil {
			cfg.reg.dialFailed(err)
		}
		return nil, err
	}
	g := newGuardConn(conn, cfg, nil)
	g.binding = binding
	if cfg.reg != nil {
		cfg.reg.mu.Lock()
		cfg.reg.dialed = g
		cfg.reg.mu.Unlock()
	}
	return g, nil
}

// secure runs the TLS handshake on c when cfg has TLS settings, within
// the handshake bound, and returns the connection ZMTP runs on and its
// channel binding.
func secure(c net.Conn, cfg guardConfig, server bool) (net.Conn, []byte, error) {
	if cfg.tls == nil {
		return c, nil, nil
	}
	if cfg.handshake > 0 {
		c.SetDeadline(time.Now().Add(cfg.handshake))
	}
	var tc *tls.Conn
	if server {
		tc = tls.Server(c, cfg.tls)
	} else {
		tc = tls.Client(c, cfg.tls)
	}
	if err := tc.Handshake(); err != nil {
		return nil, nil, fmt.Errorf("TLS handshake: %w", err)
	}
	b, err := auth.TLSBinding(tc.ConnectionState())
	return tc, b, err
}

func (guardTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	inner, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	l := &guardListener{inner: inner, cfg: guardFrom(ctx), ready: make(chan *guardConn), done: make(chan struct{}), shaking: map[net.Conn]time.Time{}}
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

func (guardTransport) Addr(ep string) (string, error) {
	host, port, err := net.SplitHostPort(ep)
	if err != nil {
		return "", err
	}
	if port == "*" || port == "" {
		port = "0"
	}
	if host == "*" {
		host = ""
	}
	return net.JoinHostPort(host, port), nil
}

// guardListener screens accepted connections before zmq4 sees them: zmq4
// runs the ZMTP handshake of each accepted connection inside its one
// accept loop, so a client that connects and stays silent (a health check,
// a port scan) would stall every later receiver. The listener hands zmq4 a
// connection only once it has completed TLS (with TLS settings) and its
// peer has sent its whole ZMTP greeting and READY (guardConn.greet),
// within the handshake bound, screening connections concurrently, at most
// maxScreening at once.
// Its goroutines end when it is closed.
type guardListener struct {
	inner net.Listener
	cfg   guardConfig
	ready chan *guardConn // screened connections, to Accept; never closed
	done  chan struct{}   // closed by Close
	wg    sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	shaking map[net.Conn]time.Time // accepted connections not yet through the ZMTP handshake, and when
}

// maxScreening bounds the connections a guardListener screens at once; one
// more closes one of them (evictLocked).
const maxScreening = 256

// evictLocked closes a connection still in its handshake to make room for
// a new one: the oldest of the source host with the most of them. A real
// receiver's handshake takes a round trip or two, so only a flood that
// opens maxScreening connections from its host meanwhile can close it (and
// the receiver's dialer then connects again).
func (l *guardListener) evictLocked() {
	per := map[string]int{}
	for c := range l.shaking {
		per[sourceHost(c)]++
	}
	var victim net.Conn
	for c, at := range l.shaking {
		if victim == nil {
			victim = c
			continue
		}
		n, m := per[sourceHost(c)], per[sourceHost(victim)]
		if n > m || n == m && at.Before(l.shaking[victim]) {
			victim = c
		}
	}
	if victim != nil {
		delete(l.shaking, victim)
		victim.Close()
	}
}

// sourceHost is the host part of c's remote address.
func sourceHost(c net.Conn) string {
	s := c.RemoteAddr().String()
	if h, _, err := net.SplitHostPort(s); err == nil {
		return h
	}
	return s
}

func (l *guardListener) acceptLoop() {
	defer l.wg.Done()
	for {
		c, err := l.inner.Accept()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // the listener is broken; zmq4 sees no more connections
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			c.Close()
			return
		}
		if len(l.shaking) >= maxScreening {
			l.evictLocked()
		}
		l.shaking[c] = time.Now()
		l.wg.Add(1)
		l.mu.Unlock()
		go l.screen(c)
	}
}

// screen runs TLS on c (with TLS settings), greets its peer (greet),
// then queues c's guardConn for Accept.
func (l *guardListener) screen(c net.Conn) {
	defer l.wg.Done()
	conn, binding, err := secure(c, l.cfg, true)
	if err != nil {
		l.untrack(c)
		c.Close()
		return
	}
	g := newGuardConn(conn, l.cfg, func(*guardConn) { l.untrack(c) })
	g.binding, g.accepted = binding, true
	if err := g.greet(); err != nil {
		g.finishHandshake(false)
		return
	}
	select {
	case l.ready <- g:
	case <-l.done:
		g.finishHandshake(false)
	}
}

// serverGreeting is the ZMTP greeting zmq4 sends on an accepted
// connection: signature, version 3.0, mechanism NULL, as-server 0.
var serverGreeting = func() []byte {
	b := make([]byte, zmtpGreeting)
	b[0], b[9], b[10] = 0xFF, 0x7F, 3
	copy(b[12:32], "NULL")
	return b
}()

// maxScreenedReady bounds the first command (READY) that greet reads
// ahead: what fits in the read buffer after the greeting and a long frame
// header.
const maxScreenedReady = readBuffer - zmtpGreeting - 9

// greet runs, on an accepted connection and before zmq4 sees it, the part
// of the ZMTP handshake that waits for the peer: it sends zmq4's greeting
// (and swallows the one zmq4 writes later), then waits, within the
// handshake bound, until the peer's whole greeting and its first command
// (READY) have arrived in the read buffer. zmq4 then runs the handshake of
// every accepted connection from memory, one at a time in its accept
// loop, but without waiting on anyone: a stranger that stalls in its
// greeting stalls only its own screening goroutine.
func (g *guardConn) greet() error {
	if _, err := g.Conn.Write(serverGreeting); err != nil {
		return err
	}
	g.swallow = zmtpGreeting
	b, err := g.br.Peek(zmtpGreeting + 2)
	if err != nil {
		return err
	}
	mech := strings.TrimRight(string(b[12:32]), "\x00")
	switch {
	case b[0] != 0xFF || b[9] != 0x7F:
		return fmt.Errorf("%w: no ZMTP signature", ErrProtocol)
	case b[10] < 3:
		return fmt.Errorf("%w: ZMTP version %d.%d, want 3.0 or later", ErrProtocol, b[10], b[11])
	case mech != "NULL":
		return fmt.Errorf("%w: ZMTP mechanism %q, want NULL", ErrProtocol, mech)
	case b[64]&flagCommand == 0:
		return fmt.Errorf("%w: the first ZMTP frame is not a command", ErrProtocol)
	}
	hdr, size := 2, uint64(b[65])
	if b[64]&flagLong != 0 {
		if b, err = g.br.Peek(zmtpGreeting + 9); err != nil {
			return err
		}
		hdr, size = 9, binary.BigEndian.Uint64(b[65:])
	}
	if size > maxScreenedReady {
		return &limitError{what: "incoming first ZMTP command", size: size, limit: maxScreenedReady}
	}
	_, err = g.br.Peek(zmtpGreeting + hdr + int(size))
	return err
}

func (l *guardListener) Accept() (net.Conn, error) {
	select {
	case g := <-l.ready:
		return g, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *guardListener) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.shaking, c)
	l.mu.Unlock()
}

func (l *guardListener) Addr() net.Addr { return l.inner.Addr() }

// Close stops accepting, closes the connections still in their handshake
// (zmq4 closes only those it has opened) and joins the screening
// goroutines.
func (l *guardListener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.done)
	for c := range l.shaking {
		c.Close()
	}
	l.mu.Unlock()
	err := l.inner.Close()
	l.wg.Wait()
	return err
}
