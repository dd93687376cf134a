package zmqbus

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/transport"
)

// subscriber is a receiver's side of the bus. Like the publisher, it
// embeds a busSocket whose three goroutines own its DEALER socket: read
// hands every incoming message to handle, the writer sends what the outbox
// holds, and tick runs tickLocked. API calls share the state below with
// them under mu, and every change closes and replaces changed.
type subscriber struct {
	busSocket

	reg   *registry   // its one connection
	nonce *auth.Nonce // sent in HELLO with a group secret; nil without

	// guarded by mu
	err        *transport.Error // first failure; the bus is dead after it
	challenged bool             // the root proved it holds the secret
	welcomed   bool
	window     uint64
	interval   time.Duration // how often to heartbeat the root
	lastSeen   time.Time     // last frame from the root
	lastSent   time.Time     // last heartbeat to the root
	queue      []transport.Message
	expect     uint64 // next sequence number due from the root
	received   uint64 // messages handed out by Recv
	acked      uint64 // messages acknowledged
	sendErr    error  // a failed send, reported by tick unless the reader reports the cause first
}

// maxDialAttempts bounds the ZMTP connections OpenSubscriber opens to a
// root that closes them in their handshake.
const maxDialAttempts = 5

// OpenSubscriber opens a receiver's side of the metadata bus of
// cfg.Group: it reads the root's address from cfg.Exchange (key AddrKey
// of rank 0), connects a ZeroMQ DEALER whose routing identity is
// "r<rank>.<random hex>", says HELLO and waits for the root's WELCOME or
// its ERROR. cfg.Rank must be 1 or more. With cfg.Auth the HELLO carries a
// nonce, the root must answer with a CHALLENGE that proves it holds the
// group secret, and this rank proves it in turn; with cfg.TLS the
// connection is mutual TLS 1.3 (the root must publish a tcp+tls://
// address).
//
// Options (cfg.Options): "max_message" (default 64MiB), "heartbeat"
// (default 1s) and "liveness" (default 3 heartbeats, at most
// cfg.WaitTimeout()).
func OpenSubscriber(ctx context.Context, cfg transport.Config) (transport.Subscriber, error) {
	fail := func(err error) (transport.Subscriber, error) {
		return nil, busError(cfg, "open", 0, false, 0, err)
	}
	badConfig := func(err error) (transport.Subscriber, error) {
		return nil, busError(cfg, "open", 0, false, -1, err)
	}
	if err := cfg.Validate(); err != nil {
		return badConfig(err)
	}
	if cfg.Rank == 0 {
		return badConfig(errors.New("rank 0 is the publisher and cannot subscribe"))
	}
	if cfg.Exchange == nil {
		return badConfig(errors.New("no Exchange in the config: the root's address comes through it"))
	}
	opts, err := parseOptions(cfg)
	if err != nil {
		return badConfig(err)
	}
	octx, ocancel := context.WithTimeout(ctx, cfg.WaitTimeout())
	defer ocancel()
	raw, err := cfg.Exchange.Get(octx, 0, AddrKey)
	if err != nil {
		return fail(fmt.Errorf("finding the root's metadata address (%q of rank 0): %w", AddrKey, err))
	}
	addr := string(raw)
	hostPort, plain := strings.CutPrefix(addr, "tcp://")
	if !plain {
		var ok bool
		if hostPort, ok = strings.CutPrefix(addr, tlsScheme); !ok {
			return fail(fmt.Errorf("the root published metadata address %q; want tcp://host:port or %shost:port", addr, tlsScheme))
		}
	}
	switch {
	case plain && cfg.TLS != nil:
		return fail(fmt.Errorf("%w: the root serves the metadata bus at %s without TLS, and this rank has TLS settings; give every rank the same TLS settings", ErrHandshake, addr))
	case !plain && cfg.TLS == nil:
		return fail(fmt.Errorf("%w: the root serves the metadata bus at %s over TLS, and this rank has no TLS settings; give every rank the same TLS settings", ErrHandshake, addr))
	}

	frame := max(opts.maxMessage, controlLimit)
	reg := newRegistry()
	gcfg := guardConfig{maxFrame: frame, maxMessage: frame + controlLimit, maxParts: 4, handshake: opts.handshake, reg: reg}
	if cfg.TLS != nil {
		host, _, _ := net.SplitHostPort(hostPort)
		gcfg.tls = cfg.TLS.Client(host)
	}
	sctx, cancel := context.WithCancel(withGuard(context.Background(), gcfg))
	id := fmt.Sprintf("r%d.%016x%016x", cfg.Rank, rand.Uint64(), rand.Uint64())
	sock := zmq4.NewDealer(sctx,
		zmq4.WithID(zmq4.SocketIdentity(id)),
		zmq4.WithDialerRetry(100*time.Millisecond),
		zmq4.WithDialerMaxRetries(-1), // bounded by octx instead
		zmq4.WithDialerTimeout(cfg.WaitTimeout()),
		zmq4.WithTimeout(cfg.WaitTimeout()),
		zmq4.WithLogger(quietZMQ),
	)
	stopDial := context.AfterFunc(octx, cancel)
	for attempt := 1; ; attempt++ {
		err = sock.Dial(guardScheme + "://" + hostPort)
		if err == nil || attempt == maxDialAttempts || octx.Err() != nil || reg.dialError() != nil {
			break
		}
		// The root's guard may have closed this connection in its
		// handshake to make room under a flood of strangers' ones
		// (guardListener.evictLocked): a new one takes a stranger's
		// place.
		t := time.NewTimer(time.Duration(attempt) * 100 * time.Millisecond)
		select {
		case <-t.C:
		case <-octx.Done():
			t.Stop()
		}
	}
	if !stopDial() && err == nil {
		err = octx.Err()
	}
	if err != nil {
		sock.Close()
		cancel()
		if terr := reg.dialError(); terr != nil {
			err = fmt.Errorf("%w (last TLS failure: %v; give every rank the same TLS settings, with certificates valid for the addresses they publish)", err, terr)
		}
		return fail(fmt.Errorf("connecting to the root at %s: %w", addr, err))
	}

	now := time.Now()
	s := &subscriber{lastSeen: now, lastSent: now, reg: reg}
	if cfg.Auth != nil {
		n := auth.NewNonce()
		s.nonce = &n
	}
	s.adopt(cfg, opts, sock, cancel)
	s.start(sideHooks{
		handle:     s.handle,
		recvFailed: s.recvFailedLocked,
		sendFailed: s.sendFailedLocked,
		tick:       s.tickLocked,
	})

	s.out.push(zmq4.NewMsgFrom(encodeHeader(typeHello, 0, 0), hello{
		rank: uint32(cfg.Rank), world: uint32(cfg.WorldSize), maxMessage: opts.maxMessage,
		heartbeatMS: millis(opts.heartbeat), livenessMS: millis(opts.liveness), group: cfg.Group, nonce: s.nonce,
	}.encode()))
	for {
		s.mu.Lock()
		welcomed, serr, ch := s.welcomed, s.err, s.changed
		s.mu.Unlock()
		if welcomed {
			return s, nil
		}
		if serr != nil {
			s.Close()
			return nil, serr
		}
		select {
		case <-ch:
		case <-octx.Done():
			s.Close()
			err := octx.Err()
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				err = fmt.Errorf("no WELCOME from the root at %s within %v: %w", addr, cfg.WaitTimeout(), errTimeout)
			}
			return fail(err)
		}
	}
}

// failLocked records the failure that ends the bus.
func (s *subscriber) failLocked(err error) {
	if s.err != nil {
		return
	}
	op := "recv"
	if !s.welcomed {
		op = "open"
	}
	s.err = busError(s.cfg, op, s.expect, s.welcomed, 0, err)
	s.failedLocked()
	s.broadcastLocked()
}

// Err is the failure that ended the bus, or nil (transport.Watcher).
func (s *subscriber) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		return nil
	}
	return s.err
}

// Abort ends the bus because this receiver's round failed with err, and
// tells the root why (ERROR code ABORTED with err's text), so the root fails
// naming the real cause rather than just this rank's departure. Close is
// still needed.
func (s *subscriber) Abort(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return
	}
	s.selfAborted = true
	s.failLocked(fmt.Errorf("%w: %v", ErrAborted, err))
	s.out.push(zmq4.NewMsgFrom(encodeHeader(typeError, codeAborted, s.expect), errorText(err.Error())))
}

// violationLocked fails the bus and tells the root why.
func (s *subscriber) violationLocked(err error) {
	s.failLocked(err)
	s.out.push(zmq4.NewMsgFrom(encodeHeader(typeError, errCode(err, codeProtocol), s.expect), errorText(s.err.Error())))
}

// recvFailedLocked hears from read that the connection to the root broke
// while open: an oversized frame the guard refused, or a lost connection.
func (s *subscriber) recvFailedLocked(err error) {
	var le *limitError
	if errors.As(err, &le) {
		s.failLocked(fmt.Errorf("%w (option max_message is %d bytes here); the connection to the root is closed", le, s.opts.maxMessage))
	} else {
		s.failLocked(fmt.Errorf("%w: connection to the root lost: %v", errPeerGone, err))
	}
}

// sendFailedLocked hears from the writer that a message could not be
// sent. The connection is broken; the reader usually learns why (an
// oversized frame, the root's BYE) at the same moment, so tickLocked
// reports the send failure only if the reader has not reported anything by
// its next round.
func (s *subscriber) sendFailedLocked(_ zmq4.Msg, err error) {
	if s.sendErr == nil {
		s.sendErr = err
	}
}

// handle processes one message from the root.
func (s *subscriber) handle(frames [][]byte) {
	now := time.Now()
	h, body, derr := decode(frames)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing || s.err != nil {
		return
	}
	s.lastSeen = now
	if derr != nil {
		s.violationLocked(fmt.Errorf("from the root: %w", derr))
		return
	}
	switch h.typ {
	case typeChallenge:
		s.challengeLocked(body)
	case typeWelcome:
		if s.welcomed {
			s.violationLocked(fmt.Errorf("%w: WELCOME twice", ErrProtocol))
			return
		}
		if s.nonce != nil && !s.challenged {
			s.authFailedLocked("the root welcomed this rank without proving that it holds the group secret: it runs without one (or is not the root); give every rank the same secret, or none")
			return
		}
		w, err := decodeWelcome(body)
		if err != nil {
			s.violationLocked(err)
			return
		}
		s.welcomed = true
		s.window = uint64(w.window)
		s.interval = sendInterval(s.opts.heartbeat, time.Duration(w.livenessMS)*time.Millisecond)
		s.lastSent = now
		s.broadcastLocked()
	case typeData:
		switch n := uint64(len(body)); {
		case !s.welcomed:
			s.violationLocked(fmt.Errorf("%w: DATA before WELCOME", ErrProtocol))
		case h.seq != s.expect:
			s.violationLocked(fmt.Errorf("%w: expected message %d, got %d: metadata lost, duplicated or reordered", ErrProtocol, s.expect, h.seq))
		case n > s.opts.maxMessage:
			s.violationLocked(fmt.Errorf("%w: message %d of %d bytes exceeds the limit of %d bytes (option max_message)", ErrTooLarge, h.seq, n, s.opts.maxMessage))
		case h.seq >= s.acked+s.window:
			s.violationLocked(fmt.Errorf("%w: message %d arrived with %d acknowledged, past the window of %d", ErrProtocol, h.seq, s.acked, s.window))
		default:
			s.queue = append(s.queue, transport.Message{Seq: h.seq, Data: body})
			s.expect++
			s.broadcastLocked()
		}
	case typeHeartbeat:
	case typeError:
		sentinel := codeError(h.code)
		if errors.Is(sentinel, ErrHandshake) && !s.welcomed {
			s.failLocked(fmt.Errorf("%w by the root: %s", sentinel, body))
		} else {
			s.failLocked(fmt.Errorf("%w: the root gave up: %s", sentinel, body))
		}
	case typeBye:
		if s.acked == s.expect {
			// Everything received is acknowledged: the root
			// ended the bus on purpose (between rounds: the run).
			s.failLocked(fmt.Errorf("%w: the root closed the metadata bus after message %d", transport.ErrEnded, s.acked))
		} else {
			s.failLocked(fmt.Errorf("%w: the root closed the metadata bus with %d of %d messages acknowledged", errPeerGone, s.acked, s.expect))
		}
	default:
		s.violationLocked(fmt.Errorf("%w: unexpected %s from the root", ErrProtocol, typeName(h.typ)))
	}
}

// challengeLocked checks the root's proof in its CHALLENGE and answers
// with this rank's proof.
func (s *subscriber) challengeLocked(body []byte) {
	switch {
	case s.welcomed || s.challenged:
		s.violationLocked(fmt.Errorf("%w: CHALLENGE after the handshake", ErrProtocol))
		return
	case s.nonce == nil:
		s.authFailedLocked("the root asked this rank to prove that it holds a group secret, and this rank has none; give every rank the same secret, or none")
		return
	}
	c, err := decodeChallenge(body)
	if err != nil {
		s.violationLocked(err)
		return
	}
	t := transcript(s.cfg.Rank, s.cfg.WorldSize, *s.nonce, c.nonce, s.reg.binding(""))
	if s.cfg.Auth.Verify(auth.Responder, t, c.proof[:]) != nil {
		s.authFailedLocked("the root did not prove that it holds this run's group secret (another secret, or a replayed or relayed handshake)")
		return
	}
	s.challenged = true
	proof := s.cfg.Auth.Prove(auth.Initiator, t)
	s.out.push(zmq4.NewMsgFrom(encodeHeader(typeProof, 0, 0), proof[:]))
}

// authFailedLocked fails the bus because the root did not authenticate,
// and tells the root why.
func (s *subscriber) authFailedLocked(why string) {
	s.failLocked(fmt.Errorf("%w: %s", errAuth, why))
	s.out.push(zmq4.NewMsgFrom(encodeHeader(typeError, codeAuth, 0), errorText("authentication failed: "+why)))
}

// tickLocked reports a failed send, sends heartbeats and declares a silent
// root gone.
func (s *subscriber) tickLocked(now time.Time) {
	if !s.closing && s.err == nil && s.sendErr != nil {
		s.failLocked(fmt.Errorf("%w: sending to the root failed: %v", errPeerGone, s.sendErr))
	}
	if !s.closing && s.err == nil && s.welcomed {
		if silent := now.Sub(s.lastSeen); silent > s.opts.liveness {
			s.failLocked(fmt.Errorf("%w: no message or heartbeat from the root for %v (liveness %v): it was killed, hung or lost its network", errPeerGone, silent.Round(time.Millisecond), s.opts.liveness))
		} else if now.Sub(s.lastSent) >= s.interval {
			s.out.push(zmq4.NewMsgFrom(encodeHeader(typeHeartbeat, 0, s.acked)))
			s.lastSent = now
		}
	}
}

// Recv returns the next message. Messages that arrived before the root
// went away are still delivered; the failure comes after them.
func (s *subscriber) Recv(ctx context.Context) (transport.Message, error) {
	timeout := s.cfg.WaitTimeout()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			return transport.Message{}, busError(s.cfg, "recv", s.received, true, -1, transport.ErrClosed)
		}
		if len(s.queue) > 0 {
			m := s.queue[0]
			s.queue = s.queue[1:]
			s.received++
			s.mu.Unlock()
			return m, nil
		}
		if s.err != nil {
			err := s.err
			s.mu.Unlock()
			return transport.Message{}, err
		}
		want, ch := s.received, s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return transport.Message{}, busError(s.cfg, "recv", want, true, 0, transport.ContextErr(ctx))
		case <-timer.C:
			return transport.Message{}, busError(s.cfg, "recv", want, true, 0, fmt.Errorf("no metadata message within %v: %w", timeout, errTimeout))
		}
	}
}

// Ack acknowledges message seq, which must be the oldest message received
// and not yet acknowledged.
func (s *subscriber) Ack(ctx context.Context, seq uint64) error {
	if err := ctx.Err(); err != nil {
		return busError(s.cfg, "ack", seq, true, -1, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closing:
		return busError(s.cfg, "ack", seq, true, -1, transport.ErrClosed)
	case s.err != nil:
		return s.err
	case seq != s.acked || seq >= s.received:
		return busError(s.cfg, "ack", seq, true, -1, fmt.Errorf("acknowledged out of order: next to acknowledge is %d, %d received so far", s.acked, s.received))
	}
	s.acked++
	s.out.push(zmq4.NewMsgFrom(encodeHeader(typeAck, 0, seq)))
	return nil
}

// Close says BYE to the root, closes the socket and joins the goroutines.
// It is idempotent.
func (s *subscriber) Close() error {
	s.shutdown(func() {
		if s.err == nil && s.welcomed {
			s.out.push(zmq4.NewMsgFrom(encodeHeader(typeBye, 0, s.acked)))
		}
	})
	return nil
}
