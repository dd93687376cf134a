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

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/internal/ratelog"
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
	reg  *registry // the ROUTER's connections, by peer identity
	log  *ratelog.Logger

	// guarded by mu
	peers   []peer // by rank; peers[0] unused
	byID    map[string]int
	joined  int
	pending map[string]*pendingHello // receivers challenged, by identity
	refused refusals                 // connections refused before they joined
	next    uint64                   // next sequence number to publish
	fatal   *transport.Error         // first failure that ends the bus
}

// pendingHello is a receiver the root challenged and awaits the proof of.
type pendingHello struct {
	hello   hello
	nonce   auth.Nonce // the root's
	started time.Time
}

// maxPending bounds the challenges outstanding at once.
const maxPending = 64

// refusals describes the connections the root refused before they
// joined, for the timeout of a wait for a receiver.
type refusals struct {
	n     int
	notes []string
	auth  bool
}

func (r *refusals) add(err error) {
	r.n++ // callers broadcast: a wait's timeout message names the refusals
	if len(r.notes) < 4 {
		r.notes = append(r.notes, err.Error())
	}
	r.auth = r.auth || errors.Is(err, auth.ErrFailed)
}

func (r refusals) String() string {
	if r.n == 0 {
		return ""
	}
	s := fmt.Sprintf(" (refused %d connection(s) that did not join: %s", r.n, strings.Join(r.notes, "; "))
	if r.n > len(r.notes) {
		s += "; …"
	}
	return s + ")"
}

// OpenPublisher opens the root's side of the metadata bus of cfg.Group:
// it binds a ZeroMQ ROUTER socket to tcp://<bind>:0, publishes the bound
// address under AddrKey through cfg.Exchange, and accepts the receivers'
// HELLOs from then on. cfg.Rank must be 0. With cfg.Auth every receiver
// must prove it holds the group secret before it joins; with cfg.TLS the
// bus runs over mutual TLS 1.3 and the address is published as
// tcp+tls://host:port. A connection that fails to join (a stranger, a
// malformed or oversized frame, another version, group, world size or
// secret, a rank that has joined) hears why in an ERROR, is closed and
// logged; it never fails the bus.
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

	reg := newRegistry()
	gcfg := guardConfig{maxFrame: controlLimit, maxMessage: 2 * controlLimit, maxParts: 4, handshake: opts.handshake, reg: reg}
	scheme := "tcp://"
	if cfg.TLS != nil {
		gcfg.tls, scheme = cfg.TLS.Server(), tlsScheme
	}
	sctx, cancel := context.WithCancel(withGuard(context.Background(), gcfg))
	sock := zmq4.NewRouter(sctx, zmq4.WithTimeout(cfg.WaitTimeout()), zmq4.WithLogger(quietZMQ))
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
		addr:    scheme + net.JoinHostPort(host, strconv.Itoa(tcp.Port)),
		reg:     reg,
		log:     ratelog.New(cfg.Logger, 0),
		peers:   make([]peer, cfg.WorldSize),
		byID:    map[string]int{},
		pending: map[string]*pendingHello{},
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
	p.failedLocked()
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
		p.strangerLocked(id, h, body, derr, now)
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
	default:
		p.abortLocked(busError(p.cfg, "recv", h.seq, true, r, fmt.Errorf("%w: unexpected %s from rank %d", ErrProtocol, typeName(h.typ), r)), codeProtocol)
	}
}

// strangerLocked handles a message from a connection that has not joined:
// a HELLO, or the PROOF answering the root's challenge, or anything else,
// which is refused. Nothing a stranger sends fails the bus.
func (p *publisher) strangerLocked(id []byte, h header, body []byte, derr error, now time.Time) {
	switch {
	case errors.Is(derr, errVersion):
		p.refuseLocked(id, &codedError{codeVersion, fmt.Sprintf("this receiver speaks metadata protocol version %d, the root speaks %d; run the same weightcast version on every rank", h.version, ProtocolVersion)})
	case derr != nil:
		p.refuseLocked(id, &codedError{errCode(derr, codeProtocol), derr.Error()})
	case h.typ == typeHello:
		p.helloLocked(id, body, now)
	case h.typ == typeProof:
		p.proofLocked(id, body, now)
	case h.typ == typeError && h.code == codeAuth:
		// a receiver that found this root's proof wrong: another secret
		delete(p.pending, string(id))
		err := fmt.Errorf("%w: the receiver said: %s", errAuth, errorText(string(body)))
		p.refused.add(err)
		p.broadcastLocked()
		p.log.Warn("metadata bus refused a receiver that did not join", "group", p.cfg.Group, "identity", string(id), "error", err.Error())
		p.reg.drop(string(id))
	case h.typ == typeBye || h.typ == typeError:
		// a refused receiver closing or giving up: answering could start
		// an exchange of ERRORs
		delete(p.pending, string(id))
		p.reg.drop(string(id))
	default:
		p.refuseLocked(id, &codedError{codeProtocol, fmt.Sprintf("%s from a receiver that has not joined (identity %q): send HELLO first", typeName(h.typ), id)})
	}
}

// refuseLocked tells the connection of identity id why it cannot join,
// closes it once that is sent, and logs it. Its reason says nothing of the
// other receivers.
func (p *publisher) refuseLocked(id []byte, err *codedError) {
	delete(p.pending, string(id))
	p.refused.add(err)
	p.broadcastLocked()
	p.log.Warn("metadata bus refused a receiver that did not join", "group", p.cfg.Group, "identity", string(id), "error", err.Error())
	key := string(id)
	p.out.pushThen(zmq4.NewMsgFrom(id, encodeHeader(typeError, err.code, 0), errorText(err.msg)), func() { p.reg.drop(key) })
}

// helloLocked checks a HELLO from a connection that has not joined: one
// that fits joins (or, with a group secret, is challenged), one that does
// not is refused.
func (p *publisher) helloLocked(id, body []byte, now time.Time) {
	m, err := decodeHello(body)
	if err != nil {
		p.refuseLocked(id, &codedError{codeProtocol, err.Error()})
		return
	}
	if _, dup := p.pending[string(id)]; dup {
		p.refuseLocked(id, &codedError{codeProtocol, "HELLO twice"})
		return
	}
	rank, world := int(m.rank), p.cfg.WorldSize
	refuse := func(code uint32, format string, args ...any) {
		p.refuseLocked(id, &codedError{code, fmt.Sprintf(format, args...)})
	}
	switch {
	case m.group != p.cfg.Group:
		refuse(codeGroup, "rank %d of group %q reached the root of group %q at %s; check the group name and where the address came from", m.rank, m.group, p.cfg.Group, p.addr)
	case int(m.world) != world:
		refuse(codeWorldSize, "world size mismatch: rank %d says %d, the root was opened with %d; give every rank the same world size", m.rank, m.world, world)
	case rank <= 0 || rank >= world:
		refuse(codeRank, "rank %d is outside [1, %d): rank 0 is the root and receivers are 1..%d", m.rank, world, world-1)
	case !strings.HasPrefix(string(id), "r"+strconv.Itoa(rank)+"."):
		refuse(codeRank, "routing identity %q does not encode rank %d (want the prefix \"r%d.\")", id, rank, rank)
	case p.peers[rank].joined:
		refuse(codeDuplicate, "rank %d has joined already; give every receiver a distinct rank, and restart the group rather than rejoin a rank", rank)
	case m.nonce != nil && p.cfg.Auth == nil:
		refuse(codeAuth, "authentication failed: rank %d has a group secret and the root has none; give every rank the same secret, or none", rank)
	case m.nonce == nil && p.cfg.Auth != nil:
		refuse(codeAuth, "authentication failed: rank %d has no group secret and the root has one; give every rank the same secret, or none", rank)
	case p.cfg.Auth == nil:
		p.joinLocked(id, m, now)
	case len(p.pending) >= maxPending:
		refuse(codeProtocol, "%d receivers are being authenticated already; try again", maxPending)
	default:
		ph := &pendingHello{hello: m, nonce: auth.NewNonce(), started: now}
		proof := p.cfg.Auth.Prove(auth.Responder, transcript(rank, world, *m.nonce, ph.nonce, p.reg.binding(string(id))))
		p.pending[string(id)] = ph
		p.out.push(zmq4.NewMsgFrom(id, encodeHeader(typeChallenge, 0, 0), challenge{nonce: ph.nonce, proof: proof}.encode()))
	}
}

// proofLocked checks the proof of a receiver the root challenged: a
// receiver that proves it holds the group secret joins.
func (p *publisher) proofLocked(id, body []byte, now time.Time) {
	ph, ok := p.pending[string(id)]
	if !ok {
		p.refuseLocked(id, &codedError{codeProtocol, "PROOF without a challenge: send HELLO first"})
		return
	}
	delete(p.pending, string(id))
	proof, err := decodeProof(body)
	if err != nil {
		p.refuseLocked(id, &codedError{codeProtocol, err.Error()})
		return
	}
	m := ph.hello
	t := transcript(int(m.rank), p.cfg.WorldSize, *m.nonce, ph.nonce, p.reg.binding(string(id)))
	switch {
	case p.cfg.Auth.Verify(auth.Initiator, t, proof) != nil:
		p.refuseLocked(id, &codedError{codeAuth, fmt.Sprintf("authentication failed: rank %d did not prove that it holds this run's group secret (another secret, or a replayed or relayed handshake)", m.rank)})
	case p.peers[m.rank].joined:
		p.refuseLocked(id, &codedError{codeDuplicate, fmt.Sprintf("rank %d has joined already", m.rank)})
	default:
		p.joinLocked(id, m, now)
	}
}

// joinLocked admits the receiver of identity id, which said HELLO m (and
// proved itself, with a group secret).
func (p *publisher) joinLocked(id []byte, m hello, now time.Time) {
	pr := &p.peers[m.rank]
	*pr = peer{
		id: append([]byte(nil), id...), joined: true, maxMsg: m.maxMessage, lastSeen: now, lastSent: now,
		interval: sendInterval(p.opts.heartbeat, time.Duration(m.livenessMS)*time.Millisecond),
	}
	p.byID[string(pr.id)] = int(m.rank)
	p.joined++
	p.out.push(zmq4.NewMsgFrom(pr.id, encodeHeader(typeWelcome, 0, 0), welcome{
		window: transport.DefaultWindow, heartbeatMS: millis(p.opts.heartbeat), livenessMS: millis(p.opts.liveness),
	}.encode()))
	if p.fatal != nil {
		// The bus ended (the root aborted) before this rank joined: tell
		// it why, as the others were told, instead of letting it wait for
		// a bus that is over. Only a rank that joined (and proved itself,
		// with a group secret) hears the reason.
		p.out.push(zmq4.NewMsgFrom(pr.id, encodeHeader(typeError, codeAborted, p.next), errorText(p.fatal.Error())))
	}
	p.broadcastLocked()
}

// tickLocked sends heartbeats, declares silent receivers gone, and
// refuses receivers that did not answer their challenge in time.
func (p *publisher) tickLocked(now time.Time) {
	for id, ph := range p.pending {
		if now.Sub(ph.started) > p.opts.handshake {
			p.refuseLocked([]byte(id), &codedError{codeProtocol, fmt.Sprintf("no PROOF within %v of the challenge", p.opts.handshake)})
		}
	}
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
	auth bool   // connections that failed authentication were refused meanwhile
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
			if st.auth {
				return busError(p.cfg, op, seq, hasSeq, st.peer, fmt.Errorf("waited %v for %s: %w (%w)", timeout, st.what, errTimeout, auth.ErrFailed))
			}
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
			return waitState{what: "HELLO from receiver rank(s) " + strings.Join(missing, ", ") + p.refused.String(), peer: -1, auth: p.refused.auth}
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
	if p.fatal == nil {
		p.selfAborted = true
	}
	p.abortLocked(busError(p.cfg, "abort", 0, false, -1, fmt.Errorf("%w: %v", ErrAborted, err)), codeAborted)
}

// Err is the failure that ended the bus, or nil (transport.Watcher).
func (p *publisher) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fatal == nil {
		return nil
	}
	return p.fatal
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
