package zmqbus

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
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

// ZMTP framing (RFC 23): a 64-byte greeting, then frames of a flags byte
// (bit 0 MORE, bit 1 LONG, bit 2 COMMAND), a 1-byte or 8-byte big-endian
// size, and the body.
const (
	zmtpGreeting = 64
	flagMore     = 0x1
	flagLong     = 0x2
	flagCommand  = 0x4
)

type parseState int

const (
	stGreeting parseState = iota
	stFlags
	stSize
	stBody
)

// framer follows the ZMTP framing of one direction of a connection.
type framer struct {
	state    parseState
	left     uint64 // greeting or body bytes still to come
	flags    byte
	size     [8]byte
	sizeHave int
	sizeNeed int
	// body, when set, is given the bytes of every frame body as they
	// pass.
	body func(flags byte, b []byte)
}

func newFramer() framer { return framer{state: stGreeting, left: zmtpGreeting} }

// feed advances over b. It calls check (if not nil) when a frame's size
// is known, before the last byte of the size field is consumed, and stops
// there if check fails, returning how many bytes of b it consumed. It
// calls end at the end of the greeting (flags 0xFF) and of every frame,
// with the offset in b just past that end.
func (f *framer) feed(b []byte, check func(flags byte, size uint64) error, end func(flags byte, at int)) (int, error) {
	i := 0
	for i < len(b) {
		switch f.state {
		case stGreeting:
			k := min(f.left, uint64(len(b)-i))
			i += int(k)
			f.left -= k
			if f.left == 0 {
				f.state = stFlags
				end(0xFF, i)
			}
		case stFlags:
			f.flags = b[i]
			i++
			f.sizeHave, f.sizeNeed = 0, 1
			if f.flags&flagLong != 0 {
				f.sizeNeed = 8
			}
			f.state = stSize
		case stSize:
			f.size[f.sizeHave] = b[i]
			f.sizeHave++
			if f.sizeHave < f.sizeNeed {
				i++
				continue
			}
			size := uint64(f.size[0])
			if f.sizeNeed == 8 {
				size = binary.BigEndian.Uint64(f.size[:])
			}
			if check != nil {
				if err := check(f.flags, size); err != nil {
					return i, err
				}
			}
			i++
			f.left = size
			f.state = stBody
			if size == 0 {
				f.state = stFlags
				end(f.flags, i)
			}
		case stBody:
			k := min(f.left, uint64(len(b)-i))
			if f.body != nil {
				f.body(f.flags, b[i:i+int(k)])
			}
			i += int(k)
			f.left -= k
			if f.left == 0 {
				f.state = stFlags
				end(f.flags, i)
			}
		}
	}
	return len(b), nil
}

// messageEnd reports whether a frame with these flags ends what its
// sender will write in one go: the greeting, a command, or the last frame
// of a message.
func messageEnd(flags byte) bool {
	return flags == 0xFF || flags&flagCommand != 0 || flags&flagMore == 0
}

const (
	readBuffer = 64 << 10
	// coalesceLimit: pieces up to this size are copied and sent together
	// with the rest of their message; larger ones go out at once, in the
	// same writev as what is pending.
	coalesceLimit = 32 << 10
)

// guardConn follows the ZMTP framing of both directions of a connection.
// Reads are buffered and checked against the limits; writes are gathered
// per message into one writev, since zmq4 writes every frame header and
// body separately.
type guardConn struct {
	net.Conn
	cfg      guardConfig
	onDone   func(*guardConn) // handshake finished or failed; may be nil
	br       *bufio.Reader
	once     sync.Once
	shaken   atomic.Bool // greeting and the peer's first command (READY) read
	accepted bool        // accepted by a listener: its peer's identity is registered
	binding  []byte      // TLS channel binding; nil on plain TCP
	id       string      // the peer's routing identity, from its READY
	ready    []byte      // the body of the peer's first command, while it arrives

	// read side: used by the one goroutine that reads
	rf       framer
	err      error // sticky read error from a limit
	parts    int
	msgBytes uint64

	// write side
	wmu     sync.Mutex
	wf      framer
	pending []byte
	swallow int // bytes of zmq4's greeting still to drop: greet sent it
}

func newGuardConn(c net.Conn, cfg guardConfig, onDone func(*guardConn)) *guardConn {
	g := &guardConn{Conn: c, cfg: cfg, onDone: onDone, br: bufio.NewReaderSize(c, readBuffer), rf: newFramer(), wf: newFramer()}
	g.rf.body = g.readBody
	if cfg.handshake > 0 {
		c.SetDeadline(time.Now().Add(cfg.handshake))
	}
	return g
}

// readBody keeps the body of the peer's first command (its READY).
func (g *guardConn) readBody(flags byte, b []byte) {
	if !g.shaken.Load() && flags&flagCommand != 0 {
		g.ready = append(g.ready, b...)
	}
}

// Close closes the connection and forgets its identity.
func (g *guardConn) Close() error {
	if g.accepted && g.cfg.reg != nil && g.id != "" {
		g.cfg.reg.remove(g)
	}
	return g.Conn.Close()
}

func (g *guardConn) finishHandshake(ok bool) {
	g.once.Do(func() {
		if ok {
			g.Conn.SetDeadline(time.Time{})
		} else {
			// zmq4 drops a connection whose handshake failed without
			// closing it.
			g.Conn.Close()
		}
		if g.onDone != nil {
			g.onDone(g)
		}
	})
}

func (g *guardConn) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.br.Read(p)
	k, lerr := g.rf.feed(p[:n], g.check, g.readEnd)
	if lerr == nil && g.err != nil { // readEnd refused the peer
		lerr, k = g.err, 0
	}
	if lerr != nil {
		// Deliver the bytes before the last byte of the offending size
		// field only: zmq4's io.ReadFull then asks again and gets lerr,
		// before it allocates anything.
		g.err = lerr
		if !g.shaken.Load() {
			g.finishHandshake(false)
		}
		if k > 0 {
			return k, nil
		}
		return 0, lerr
	}
	if err != nil && !g.shaken.Load() {
		g.finishHandshake(false)
	}
	return n, err
}

func (g *guardConn) check(flags byte, size uint64) error {
	if flags&flagCommand != 0 {
		if size > controlLimit {
			return &limitError{what: "incoming ZMTP command", size: size, limit: controlLimit}
		}
		return nil
	}
	if !g.shaken.Load() {
		return fmt.Errorf("%w: message frame before the ZMTP handshake finished", ErrProtocol)
	}
	if g.parts+1 > g.cfg.maxParts {
		return fmt.Errorf("%w: incoming message of more than %d frames", ErrProtocol, g.cfg.maxParts)
	}
	if size > g.cfg.maxFrame {
		return &limitError{what: "incoming frame", size: size, limit: g.cfg.maxFrame}
	}
	if g.msgBytes+size > g.cfg.maxMessage {
		return &limitError{what: "incoming message", size: g.msgBytes + size, limit: g.cfg.maxMessage}
	}
	g.parts++
	g.msgBytes += size
	return nil
}

func (g *guardConn) readEnd(flags byte, _ int) {
	switch {
	case flags == 0xFF: // greeting
	case flags&flagCommand != 0:
		if !g.shaken.Load() {
			g.shaken.Store(true)
			if err := g.register(); err != nil {
				g.err = err
				g.finishHandshake(false)
				return
			}
			g.finishHandshake(true)
		}
	case flags&flagMore == 0:
		g.parts, g.msgBytes = 0, 0
	}
}

// register records an accepted connection under the routing identity of
// its peer's READY command: it refuses a connection without one, or with
// the identity of a live connection.
func (g *guardConn) register() error {
	ready := g.ready
	g.ready = nil
	if !g.accepted || g.cfg.reg == nil {
		return nil
	}
	id, err := readyIdentity(ready)
	switch {
	case err != nil:
		return err
	case id == "":
		return fmt.Errorf("%w: the peer announced no routing identity", ErrProtocol)
	}
	g.id = id
	if err := g.cfg.reg.add(id, g); err != nil {
		g.id = ""
		return err
	}
	return nil
}

// readyIdentity reads the Identity property of a ZMTP READY command body
// (RFC 23: a name of a length byte and bytes, then properties of a name
// of a length byte and bytes and a value of a 4-byte big-endian length and
// bytes; property names are case-insensitive).
func readyIdentity(b []byte) (string, error) {
	bad := fmt.Errorf("%w: malformed ZMTP READY command", ErrProtocol)
	if len(b) < 1 || len(b) < 1+int(b[0]) {
		return "", bad
	}
	if name := string(b[1 : 1+b[0]]); name != "READY" {
		return "", fmt.Errorf("%w: first ZMTP command %q, want READY", ErrProtocol, name)
	}
	b = b[1+b[0]:]
	for len(b) > 0 {
		kl := int(b[0])
		if len(b) < 1+kl+4 {
			return "", bad
		}
		key := string(b[1 : 1+kl])
		vl := binary.BigEndian.Uint32(b[1+kl:])
		b = b[1+kl+4:]
		if uint64(vl) > uint64(len(b)) {
			return "", bad
		}
		if strings.EqualFold(key, "Identity") {
			return string(b[:vl]), nil
		}
		b = b[vl:]
	}
	return "", nil
}

// Write gathers the pieces of one message and sends them in one writev
// when the message ends within p, or when p is large.
func (g *guardConn) Write(p []byte) (int, error) {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	if g.swallow > 0 {
		// zmq4's greeting, which greet sent already: the same bytes.
		k := min(g.swallow, len(p))
		at := zmtpGreeting - g.swallow
		if !bytes.Equal(p[:k], serverGreeting[at:at+k]) {
			return 0, fmt.Errorf("%w: zmq4's greeting differs from the one sent for it", ErrProtocol)
		}
		g.wf.feed(p[:k], nil, func(byte, int) {})
		g.swallow -= k
		if k == len(p) {
			return k, nil
		}
		n, err := g.write(p[k:])
		return k + n, err
	}
	return g.write(p)
}

// write is Write after the greeting, under wmu.
func (g *guardConn) write(p []byte) (int, error) {
	ends, endAt := false, 0
	g.wf.feed(p, nil, func(flags byte, at int) {
		if messageEnd(flags) {
			ends, endAt = true, at
		}
	})
	var err error
	switch {
	case ends:
		err = g.flush(p[:endAt])
		g.pending = append(g.pending, p[endAt:]...)
	case len(p) > coalesceLimit:
		err = g.flush(p)
	default:
		g.pending = append(g.pending, p...)
	}
	if err != nil {
		if !g.shaken.Load() {
			g.finishHandshake(false)
		}
		return 0, err
	}
	return len(p), nil
}

// flush writes what is pending, then tail, in one writev.
func (g *guardConn) flush(tail []byte) error {
	bufs := net.Buffers{}
	if len(g.pending) > 0 {
		bufs = append(bufs, g.pending)
	}
	if len(tail) > 0 {
		bufs = append(bufs, tail)
	}
	_, err := bufs.WriteTo(g.Conn)
	g.pending = g.pending[:0]
	if cap(g.pending) > coalesceLimit {
		g.pending = nil
	}
	return err
}
