package zmqbus

// The guard's connection: each net.Conn of the bus wrapped to check the
// frames it reads against the limits, bound and finish the handshake,
// register its peer's identity, and gather the frames it writes.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

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
