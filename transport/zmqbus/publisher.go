package zmqbus

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/weightcast/weightcast/transport"
)

// peer is the root's view of one receiver.
type peer struct {
	id       []byte        // routing identity, set by HELLO
	joined   bool          // HELLO accepted
	acked    uint64        // lowest sequence number not yet acknowledged
	maxMsg   uint64        // the receiver's max_message
	interval time.Duration // how often to send it heartbeats
	lastSeen time.Time     // last frame from it
	lastSent time.Time     // last heartbeat to it
	gone     error         // why it is gone, once it is
}

// publisher is the root's side of the bus. The three goroutines of its
// busSocket, started by OpenPublisher and joined by Close, own the ROUTER
// socket: read hands every incoming message to handle, the writer sends
// what the outbox holds, and tick runs tickLocked (heartbeats and
// liveness). API calls and those goroutines share the state below under
// mu; every change closes and replaces changed.
type publisher struct {
	busSocket
	addr string

	// guarded by mu
	peers  []peer // by rank; peers[0] unused
	byID   map[string]int
	joined int
	next   uint64           // next sequence number to publish
	fatal  *transport.Error // first failure that ends the bus
}

// OpenPublisher opens the root's side of the metadata bus of cfg.Group:
// it binds a ZeroMQ ROUTER socket to tcp://<bind>:0, publishes the bound
// address under AddrKey through cfg.Exchange, and accepts the receivers'
// HELLOs from then on. cfg.Rank must be 0.
//
// Options (cfg.Options): "bind" (host to bind, default 127.0.0.1),
// "advertise" (host to publish instead, required when binding 0.0.0.0 or
// ::), "max_message" (default 64MiB), "heartbeat" (default 1s) and
// "liveness" (default 3 heartbeats, at most cfg.WaitTimeout()).
func OpenPublisher(ctx context.Context, cfg transport.Config) (transport.Publisher, error) {
	fail := func(err error) (transport.Publisher, error) {
		return nil, busError(cfg, "open", 0, false, -1, err)
	}
	if err := cfg.Validate(); err != nil {
		return fail(err)
	}
	if cfg.Rank != 0 {
		return fail(fmt.Errorf("only rank 0 publishes metadata, not rank %d", cfg.Rank))
	}
	if cfg.Exchange == nil {
		return fail(errors.New("no Exchange in the config: the root publishes its address through it"))
	}
	opts, err := parseOptions(cfg)
	if err != nil {
		return fail(err)
	}
	host := opts.advertise
	if host == "" {
		if ip := net.ParseIP(opts.bind); ip != nil && ip.IsUnspecified() {
			return fail(fmt.Errorf("binding %s needs option advertise=<host receivers can reach>", opts.bind))
		}
		host = opts.bind
	}

	sctx, cancel := context.WithCancel(withGuard(context.Background(), guardConfig{
		maxFrame: controlLimit, maxMessage: 2 * controlLimit, maxParts: 4, handshake: opts.handshake,
	}))
	sock := zmq4.NewRouter(sctx, zmq4.WithTimeout(cfg.WaitTimeout()))
	if err := sock.Listen(guardScheme + "://" + net.JoinHostPort(opts.bind, "0")); err != nil {
		sock.Close()
		cancel()
		return fail(fmt.Errorf("binding the metadata socket on %s: %w", opts.bind, err))
	}
	tcp, ok := sock.Addr().(*net.TCPAddr)
	if !ok {
		sock.Close()
		cancel()
		return fail(fmt.Errorf("metadata socket bound to %v, not a TCP address", sock.Addr()))
	}
	p := &publisher{
		addr:  "tcp://" + net.JoinHostPort(host, strconv.Itoa(tcp.Port)),
		peers: make([]peer, cfg.WorldSize),
		byID:  map[string]int{},
	}
	p.adopt(cfg, opts, sock, cancel)
	p.start(sideHooks{
		handle: func(frames [][]byte) {
			if len(frames) >= 1 {
				p.handle(frames[0], frames[1:])
			}
		},
		recvFailed: p.recvFailedLocked,
		sendFailed: p.sendFailedLocked,
		tick:       p.tickLocked,
	})

	pctx, pcancel := context.WithTimeout(ctx, cfg.WaitTimeout())
	defer pcancel()
	if err := cfg.Exchange.Put(pctx, AddrKey, []byte(p.addr)); err != nil {
		p.Close()
		return fail(fmt.Errorf("publishing the metadata address %s: %w", p.addr, err))
	}
	return p, nil
}

// abortLocked records the failure that ends the bus and tells every live
// receiver, so that each fails with the same reason instead of waiting.
func (p *publisher) abortLocked(err *transport.Error, code uint32) *transport.Error {
	if p.fatal != nil {
		return p.fatal
	}
	p.fatal = err
	text := errorText(err.Error())
	for r := 1; r < len(p.peers); r++ {
		if pr := &p.peers[r]; pr.joined && pr.gone == nil {
			p.out.push(zmq4.NewMsgFrom(pr.id, encodeHeader(typeError, code, p.next), text))
		}
	}
	p.broadcastLocked()
	return err
}

// recvFailedLocked hears from read that the socket failed while open.
func (p *publisher) recvFailedLocked(err error) {
	p.abortLocked(busError(p.cfg, "recv", 0, false, -1, fmt.Errorf("metadata socket failed: %w", err)), codeProtocol)
}

// sendFailedLocked hears from the writer that a message could not be sent.
func (p *publisher) sendFailedLocked(m zmq4.Msg, err error) {
	if p.closing || len(m.Frames) == 0 {
		return
	}
	if r, ok := p.byID[string(m.Frames[0])]; ok && p.peers[r].gone == nil {
		p.peers[r].gone = fmt.Errorf("%w: sending to rank %d failed: %v", errPeerGone, r, err)
		p.broadcastLocked()
	}
}

// handle processes one message from the receiver with routing identity id.
func (p *publisher) handle(id []byte, frames [][]byte) {
	now := time.Now()
	h, body, derr := decode(frames)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing {
		return
	}
	r, known := p.byID[string(id)]
	if !known {
		switch {
		case errors.Is(derr, errVersion):
			p.rejectLocked(id, -1, &codedError{codeVersion, fmt.Sprintf("a receiver (identity %q) speaks metadata protocol version %d, this root speaks %d; run the same weightcast version on every rank", id, h.version, ProtocolVersion)})
		case derr == nil && h.typ == typeHello:
			p.helloLocked(id, body, now)
		case derr == nil && (h.typ == typeBye || h.typ == typeError):
			// a rejected receiver closing or giving up: answering could
			// start an exchange of ERRORs
		default:
			// A stranger that never joined: tell it, but do not fail the
			// group for a connection that is not one of its ranks.
			why := fmt.Sprintf("unknown receiver %q: send HELLO first", id)
			if derr != nil {
				why = derr.Error()
			}
			p.out.push(zmq4.NewMsgFrom(id, encodeHeader(typeError, codeProtocol, 0), errorText(why)))
		}
		return
	}
	pr := &p.peers[r]
	pr.lastSeen = now
	if derr != nil {
		p.abortLocked(busError(p.cfg, "recv", p.next, true, r, fmt.Errorf("from rank %d: %w", r, derr)), errCode(derr, codeProtocol))
		return
	}
	switch h.typ {
	case typeAck:
		if h.seq != pr.acked || h.seq >= p.next {
			p.abortLocked(busError(p.cfg, "recv", h.seq, true, r, fmt.Errorf("%w: rank %d acknowledged message %d, but the next to acknowledge is %d and %d were published", ErrProtocol, r, h.seq, pr.acked, p.next)), codeProtocol)
			return
		}
		pr.acked++
		p.broadcastLocked()
	case typeHeartbeat:
	case typeError:
		cause := fmt.Errorf("%w: rank %d gave up: %s", codeError(h.code), r, body)
		if pr.gone == nil {
			pr.gone = cause
		}
		p.abortLocked(busError(p.cfg, "recv", h.seq, true, r, cause), h.code)
	case typeBye:
		if pr.gone == nil {
			pr.gone = fmt.Errorf("%w: rank %d closed its subscriber", errPeerGone, r)
			p.broadcastLocked()
		}
	case typeHello:
		p.rejectLocked(id, r, &codedError{codeDuplicate, fmt.Sprintf("rank %d (identity %q) said HELLO twice", r, id)})
	default:
		p.abortLocked(busError(p.cfg, "recv", h.seq, true, r, fmt.Errorf("%w: unexpected %s from rank %d", ErrProtocol, typeName(h.typ), r)), codeProtocol)
	}
}

// helloLocked admits a receiver or rejects it, failing the bus: a HELLO
// that does not fit means the group is misconfigured.
func (p *publisher) helloLocked(id, body []byte, now time.Time) {
	m, err := decodeHello(body)
	if err != nil {
		p.rejectLocked(id, -1, &codedError{codeProtocol, err.Error()})
		return
	}
	rank, world := int(m.rank), p.cfg.WorldSize
	reject := func(code uint32, format string, args ...any) {
		peerRank := rank
		if rank <= 0 || rank >= world {
			peerRank = -1
		}
		p.rejectLocked(id, peerRank, &codedError{code, fmt.Sprintf(format, args...)})
	}
	switch {
	case m.group != p.cfg.Group:
		reject(codeGroup, "rank %d of group %q reached the root of group %q at %s; check the group name and where the address came from", m.rank, m.group, p.cfg.Group, p.addr)
	case int(m.world) != world:
		reject(codeWorldSize, "world size mismatch: rank %d says %d, the root was opened with %d; give every rank the same world size", m.rank, m.world, world)
	case rank <= 0 || rank >= world:
		reject(codeRank, "rank %d is outside [1, %d): rank 0 is the root and receivers are 1..%d", m.rank, world, world-1)
	case !strings.HasPrefix(string(id), "r"+strconv.Itoa(rank)+"."):
		reject(codeRank, "routing identity %q does not encode rank %d (want the prefix \"r%d.\")", id, rank, rank)
	case p.peers[rank].joined:
		reject(codeDuplicate, "rank %d joined twice (first as identity %q, now as %q); give every receiver a distinct rank, and restart the group rather than rejoin a rank", rank, p.peers[rank].id, id)
	default:
		pr := &p.peers[rank]
		*pr = peer{
			id: append([]byte(nil), id...), joined: true, maxMsg: m.maxMessage, lastSeen: now, lastSent: now,
			interval: sendInterval(p.opts.heartbeat, time.Duration(m.livenessMS)*time.Millisecond),
		}
		p.byID[string(pr.id)] = rank
		p.joined++
		p.out.push(zmq4.NewMsgFrom(pr.id, encodeHeader(typeWelcome, 0, 0), welcome{
			window: transport.DefaultWindow, heartbeatMS: millis(p.opts.heartbeat), livenessMS: millis(p.opts.liveness),
		}.encode()))
		p.broadcastLocked()
	}
}

// rejectLocked answers a HELLO with an ERROR frame and fails the bus with
// the same reason.
func (p *publisher) rejectLocked(id []byte, rank int, err *codedError) {
	p.out.push(zmq4.NewMsgFrom(id, encodeHeader(typeError, err.code, 0), errorText(err.msg)))
	p.abortLocked(busError(p.cfg, "handshake", 0, false, rank, err), err.code)
}

// tickLocked sends heartbeats and declares silent receivers gone.
func (p *publisher) tickLocked(now time.Time) {
	changed := false
	for r := 1; r < len(p.peers) && !p.closing; r++ {
		pr := &p.peers[r]
		if !pr.joined || pr.gone != nil {
			continue
		}
		if silent := now.Sub(pr.lastSeen); silent > p.opts.liveness {
			pr.gone = fmt.Errorf("%w: no message or heartbeat from rank %d for %v (liveness %v): it was killed, hung or lost its network", errPeerGone, r, silent.Round(time.Millisecond), p.opts.liveness)
			changed = true
			continue
		}
		if now.Sub(pr.lastSent) >= pr.interval {
			p.out.push(zmq4.NewMsgFrom(pr.id, encodeHeader(typeHeartbeat, 0, p.next)))
			pr.lastSent = now
		}
	}
	if changed {
		p.broadcastLocked()
	}
}

// waitState is what a wait condition reports.
type waitState struct {
	done bool
	err  error
	what string // what is awaited, for timeout messages
	peer int    // the rank awaited, or -1
}

// wait re-evaluates cond (with mu held) on every state change until it is
// done or fails, the context ends, or cfg.WaitTimeout() passes.
func (p *publisher) wait(ctx context.Context, op string, seq uint64, hasSeq bool, cond func() waitState) error {
	timeout := p.cfg.WaitTimeout()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		p.mu.Lock()
		st := cond()
		ch := p.changed
		p.mu.Unlock()
		if st.err != nil {
			return st.err
		}
		if st.done {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return busError(p.cfg, op, seq, hasSeq, st.peer, fmt.Errorf("waiting for %s: %w", st.what, transport.ContextErr(ctx)))
		case <-timer.C:
			return busError(p.cfg, op, seq, hasSeq, st.peer, fmt.Errorf("waited %v for %s: %w", timeout, st.what, errTimeout))
		}
	}
}

// goneLocked fails the bus because receiver r is gone.
func (p *publisher) goneLocked(op string, seq uint64, hasSeq bool, r int) error {
	return p.abortLocked(busError(p.cfg, op, seq, hasSeq, r, p.peers[r].gone), codePeerGone)
}

// Publish waits until every receiver has joined (the first time), checks
// msg against every receiver's size limit, waits until message seq fits
// the window of every receiver, and queues a copy of msg to each.
func (p *publisher) Publish(ctx context.Context, seq uint64, msg []byte) error {
	if n := uint64(len(msg)); n > p.opts.maxMessage {
		return busError(p.cfg, "publish", seq, true, -1, fmt.Errorf("%w: message %d is %d bytes, over this root's max_message of %d bytes", ErrTooLarge, seq, n, p.opts.maxMessage))
	}
	data := append([]byte(nil), msg...)
	return p.wait(ctx, "publish", seq, true, func() waitState {
		switch {
		case p.closing:
			return waitState{err: busError(p.cfg, "publish", seq, true, -1, transport.ErrClosed)}
		case p.fatal != nil:
			return waitState{err: p.fatal}
		case seq != p.next:
			return waitState{err: busError(p.cfg, "publish", seq, true, -1, fmt.Errorf("out of order: expected sequence number %d", p.next))}
		}
		var missing []string
		for r := 1; r < len(p.peers); r++ {
			pr := &p.peers[r]
			if pr.gone != nil {
				return waitState{err: p.goneLocked("publish", seq, true, r)}
			}
			if !pr.joined {
				missing = append(missing, strconv.Itoa(r))
			}
		}
		if len(missing) > 0 {
			return waitState{what: "HELLO from receiver rank(s) " + strings.Join(missing, ", "), peer: -1}
		}
		for r := 1; r < len(p.peers); r++ {
			if n := uint64(len(data)); n > p.peers[r].maxMsg {
				return waitState{err: busError(p.cfg, "publish", seq, true, r, fmt.Errorf("%w: message %d is %d bytes, over rank %d's max_message of %d bytes; raise max_message on every rank", ErrTooLarge, seq, n, r, p.peers[r].maxMsg))}
			}
		}
		for r := 1; r < len(p.peers); r++ {
			if pr := &p.peers[r]; seq >= pr.acked+transport.DefaultWindow {
				return waitState{what: fmt.Sprintf("rank %d to acknowledge message %d (window %d)", r, pr.acked, transport.DefaultWindow), peer: r}
			}
		}
		hdr := encodeHeader(typeData, 0, seq)
		for r := 1; r < len(p.peers); r++ {
			p.out.push(zmq4.NewMsgFrom(p.peers[r].id, hdr, data))
		}
		p.next++
		return waitState{done: true}
	})
}

// Sync waits until every receiver has acknowledged every message
// published so far.
func (p *publisher) Sync(ctx context.Context) error {
	p.mu.Lock()
	last, hasSeq := p.next-1, p.next > 0
	p.mu.Unlock()
	return p.wait(ctx, "sync", last, hasSeq, func() waitState {
		switch {
		case p.closing:
			return waitState{err: busError(p.cfg, "sync", last, hasSeq, -1, transport.ErrClosed)}
		case p.fatal != nil:
			return waitState{err: p.fatal}
		}
		for r := 1; r < len(p.peers); r++ {
			pr := &p.peers[r]
			if pr.acked >= p.next {
				continue
			}
			if pr.gone != nil {
				return waitState{err: p.goneLocked("sync", last, hasSeq, r)}
			}
			return waitState{what: fmt.Sprintf("rank %d to acknowledge message %d", r, pr.acked), peer: r}
		}
		return waitState{done: true}
	})
}

// Abort ends the bus because the root's round failed with err: every
// receiver still connected gets an ERROR (code ABORTED) carrying err's
// text, so each fails with the root's reason instead of a bare BYE.
// Publish and Sync fail afterwards. Close is still needed.
func (p *publisher) Abort(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.abortLocked(busError(p.cfg, "abort", 0, false, -1, fmt.Errorf("%w: %v", ErrAborted, err)), codeAborted)
}

// Close says BYE to every receiver, closes the socket and joins the
// goroutines. It is idempotent.
func (p *publisher) Close() error {
	p.shutdown(func() {
		if p.fatal != nil {
			return
		}
		for r := 1; r < len(p.peers); r++ {
			if pr := &p.peers[r]; pr.joined && pr.gone == nil {
				p.out.push(zmq4.NewMsgFrom(pr.id, encodeHeader(typeBye, 0, p.next)))
			}
		}
	})
	return nil
}
