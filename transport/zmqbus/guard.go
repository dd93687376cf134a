package zmqbus

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	ztransport "github.com/go-zeromq/zmq4/transport"
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
const guardScheme = "weightcast-tcp"

// guardConfig is the per-socket configuration of the guard, passed to the
// transport through the zmq4 socket's context.
type guardConfig struct {
	maxFrame   uint64        // largest data frame
	maxMessage uint64        // largest sum of the frames of one message
	maxParts   int           // most frames in one message
	handshake  time.Duration // bound on the ZMTP greeting and READY exchange
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
	return newGuardConn(c, guardFrom(ctx), nil), nil
}

func (guardTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	inner, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	l := &guardListener{inner: inner, cfg: guardFrom(ctx), ready: make(chan *guardConn), done: make(chan struct{}), shaking: map[*guardConn]struct{}{}}
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
// connection only once its peer has sent the 10-byte ZMTP signature,
// within the handshake bound. Its goroutines end when it is closed.
type guardListener struct {
	inner net.Listener
	cfg   guardConfig
	ready chan *guardConn // screened connections, to Accept; never closed
	done  chan struct{}   // closed by Close
	wg    sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	shaking map[*guardConn]struct{} // connections not yet through the ZMTP handshake
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
		g := newGuardConn(c, l.cfg, l.untrack)
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			c.Close()
			return
		}
		l.shaking[g] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go l.screen(g)
	}
}

// screen waits for the ZMTP signature, then queues g for Accept.
func (l *guardListener) screen(g *guardConn) {
	defer l.wg.Done()
	var sig [10]byte
	if _, err := io.ReadFull(g.Conn, sig[:]); err != nil || sig[0] != 0xFF || sig[9] != 0x7F {
		g.finishHandshake(false)
		return
	}
	g.pre = sig[:]
	select {
	case l.ready <- g:
	case <-l.done:
		g.finishHandshake(false)
	}
}

func (l *guardListener) Accept() (net.Conn, error) {
	select {
	case g := <-l.ready:
		return g, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *guardListener) untrack(g *guardConn) {
	l.mu.Lock()
	delete(l.shaking, g)
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
	for g := range l.shaking {
		g.Conn.Close()
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

// guardConn follows the ZMTP framing of the bytes zmq4 reads. Its parser
// state is touched only by the one goroutine that reads the connection.
type guardConn struct {
	net.Conn
	cfg    guardConfig
	onDone func(*guardConn) // handshake finished or failed; may be nil

	pre    []byte // bytes read while screening, delivered first
	once   sync.Once
	shaken atomic.Bool // greeting and first command (READY) read
	err    error       // sticky read error from a limit

	state    parseState
	left     uint64 // greeting bytes or body bytes still to come
	flags    byte
	size     [8]byte
	sizeHave int
	sizeNeed int
	parts    int
	msgBytes uint64
}

func newGuardConn(c net.Conn, cfg guardConfig, onDone func(*guardConn)) *guardConn {
	g := &guardConn{Conn: c, cfg: cfg, onDone: onDone, state: stGreeting, left: zmtpGreeting}
	if cfg.handshake > 0 {
		c.SetDeadline(time.Now().Add(cfg.handshake))
	}
	return g
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
	var (
		n   int
		err error
	)
	if len(g.pre) > 0 {
		n = copy(p, g.pre)
		g.pre = g.pre[n:]
	} else {
		n, err = g.Conn.Read(p)
	}
	if k, lerr := g.scan(p[:n]); lerr != nil {
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

func (g *guardConn) Write(p []byte) (int, error) {
	n, err := g.Conn.Write(p)
	if err != nil && !g.shaken.Load() {
		g.finishHandshake(false)
	}
	return n, err
}

// scan advances the parser over b. On a limit violation it returns the
// number of bytes of b that may be delivered and the error.
func (g *guardConn) scan(b []byte) (int, error) {
	i := 0
	for i < len(b) {
		switch g.state {
		case stGreeting:
			k := min(g.left, uint64(len(b)-i))
			i += int(k)
			g.left -= k
			if g.left == 0 {
				g.state = stFlags
			}
		case stFlags:
			g.flags = b[i]
			i++
			g.sizeHave, g.sizeNeed = 0, 1
			if g.flags&flagLong != 0 {
				g.sizeNeed = 8
			}
			g.state = stSize
		case stSize:
			g.size[g.sizeHave] = b[i]
			g.sizeHave++
			if g.sizeHave < g.sizeNeed {
				i++
				continue
			}
			size := uint64(g.size[0])
			if g.sizeNeed == 8 {
				size = binary.BigEndian.Uint64(g.size[:])
			}
			if err := g.check(size); err != nil {
				return i, err
			}
			i++
			g.left = size
			g.state = stBody
			if size == 0 {
				g.endFrame()
			}
		case stBody:
			k := min(g.left, uint64(len(b)-i))
			i += int(k)
			g.left -= k
			if g.left == 0 {
				g.endFrame()
			}
		}
	}
	return len(b), nil
}

func (g *guardConn) check(size uint64) error {
	if g.flags&flagCommand != 0 {
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

func (g *guardConn) endFrame() {
	g.state = stFlags
	if g.flags&flagCommand != 0 {
		if !g.shaken.Load() {
			g.shaken.Store(true)
			g.finishHandshake(true)
		}
		return
	}
	if g.flags&flagMore == 0 {
		g.parts, g.msgBytes = 0, 0
	}
}
