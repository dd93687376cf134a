package zmqbus

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/auth/authtest"
	"github.com/weightcast/weightcast/transport"
)

func TestBusSecured(t *testing.T) {
	secret, ca := authtest.Secret(t), authtest.NewCA(t)
	for name, c := range map[string]struct {
		secret *auth.Secret
		ca     *authtest.CA
	}{"secret": {secret, nil}, "TLS": {nil, ca}, "TLS and secret": {secret, ca}} {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t, time.Minute)
			cfgs := authtest.Secure(t, configs(t, 3, 10*time.Second, nil), c.secret, c.ca)
			pub, subs := openAll(t, ctx, cfgs)
			if c.ca != nil && !strings.HasPrefix(rootAddr(t, ctx, cfgs[1]), tlsScheme) {
				t.Fatalf("a TLS root published %q", rootAddr(t, ctx, cfgs[1]))
			}
			errs := make([]error, 3)
			var wg sync.WaitGroup
			wg.Go(func() { errs[0] = produce(ctx, pub, 20) })
			for i, s := range subs {
				wg.Go(func() { errs[i+1] = consume(ctx, s, i+1, 20) })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestBusDifferentSecrets: a receiver with another secret, or none where
// the root has one (or the reverse), fails at once with "authentication
// failed"; the root, which cannot trust it, waits for its rank and ends
// saying the same.
func TestBusDifferentSecrets(t *testing.T) {
	a, b := authtest.Secret(t), authtest.Secret(t)
	for name, s := range map[string][2]*auth.Secret{"different": {a, b}, "root none": {nil, a}, "receiver none": {a, nil}} {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t, time.Minute)
			cfgs := configs(t, 2, 2*time.Second, nil)
			for r := range cfgs {
				if s[r] != nil {
					cfgs[r].Auth = authtest.Keys(t, s[r], cfgs[r].Group, authtest.Run)
				}
			}
			pub := openPublisher(t, ctx, cfgs[0])
			start := time.Now()
			_, err := OpenSubscriber(ctx, cfgs[1])
			if !errors.Is(err, auth.ErrFailed) || !strings.Contains(err.Error(), "authentication failed") || time.Since(start) > time.Second {
				t.Errorf("receiver after %v: %v; want authentication failed at once", time.Since(start), err)
			}
			err = pub.Publish(ctx, 0, nil)
			if !errors.Is(err, auth.ErrFailed) || !errors.Is(err, transport.ErrTimeout) {
				t.Errorf("root: %v; want a timeout saying authentication failed", err)
			}
			t.Logf("receiver: %v", err)
		})
	}
}

// TestBusStrangerTakeover: with a secret, a stranger that knows the group,
// world size and rank but not the secret claims rank 1 before the real one:
// it is refused, and the real rank 1 joins and gets every message.
func TestBusStrangerTakeover(t *testing.T) {
	ctx := testContext(t, time.Minute)
	cfgs := authtest.Secure(t, configs(t, 2, 10*time.Second, nil), authtest.Secret(t), nil)
	pub := openPublisher(t, ctx, cfgs[0])
	stranger := cfgs[1]
	stranger.Auth = authtest.Keys(t, authtest.Secret(t), cfgs[1].Group, authtest.Run)
	if _, err := OpenSubscriber(ctx, stranger); !errors.Is(err, auth.ErrFailed) {
		t.Fatalf("a stranger claiming rank 1: %v; want authentication failed", err)
	}
	sub := openSubscriber(t, ctx, cfgs[1])
	errs := make([]error, 2)
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = produce(ctx, pub, 10) })
	wg.Go(func() { errs[1] = consume(ctx, sub, 1, 10) })
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// strangerConn connects to the root as a hand-written ZMTP peer with
// routing identity id, sends frames, and returns everything the root sent
// until it closed the connection (failing the test if it did not within
// 5 s).
func strangerConn(t *testing.T, ctx context.Context, cfg transport.Config, id string, frames ...[]byte) []byte {
	t.Helper()
	c := dialRoot(t, ctx, cfg)
	out := zmtpReady("DEALER", id)
	for i, f := range frames {
		out = append(out, zmtpFrame(i < len(frames)-1, f)...)
	}
	if _, err := c.Write(out); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the root did not close the stranger's connection within 5s (it sent %q)", got)
	}
	return got
}

// TestStrangerCannotFailTheBus sends the root, from connections that never
// joined, every frame that used to end a run: a header of protocol version
// 0, a malformed message, an ACK before HELLO, a HELLO for the rank that
// has joined, one with another world size, a PROOF without a challenge, an
// oversized frame, and a connection announcing the joined rank's routing
// identity. Each connection is closed (after an ERROR about itself alone:
// never the joined rank's identity), the refusals are logged, and the bus
// carries on. With and without a secret.
func TestStrangerCannotFailTheBus(t *testing.T) {
	for name, secret := range map[string]*auth.Secret{"no secret": nil, "secret": authtest.Secret(t)} {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t, time.Minute)
			cfgs := authtest.Secure(t, configs(t, 2, 10*time.Second, nil), secret, nil)
			var logs authtest.LogBuffer
			cfgs[0].Logger = logs.Logger()
			pub, subs := openAll(t, ctx, cfgs)
			p := pub.(*publisher)
			p.mu.Lock()
			realID := string(p.peers[1].id)
			p.mu.Unlock()
			g := cfgs[0].Group
			for _, c := range []struct {
				name   string
				id     string
				frames [][]byte
				want   string // in the ERROR; "" when the guard just closes
			}{
				{"version 0", "r1.a", [][]byte{rawHeader(0, wHello, 0, 0), rawHello(1, 2, 1<<20, 1000, 3000, g)}, "protocol version 0"},
				{"16-byte version 0", "r1.b", [][]byte{rawHeader(0, wAck, 0, 0)}, "protocol version 0"},
				{"malformed", "r1.c", [][]byte{[]byte("xyz")}, "header frame of 3 bytes"},
				{"ACK first", "r1.d", [][]byte{rawHeader(1, wAck, 0, 0)}, "send HELLO first"},
				{"HELLO for a joined rank", "r1.e", [][]byte{rawHeader(1, wHello, 0, 0), rawHello(1, 2, 1<<20, 1000, 3000, g)}, "rank 1 has joined already"},
				{"world size", "r1.f", [][]byte{rawHeader(1, wHello, 0, 0), rawHello(1, 9, 1<<20, 1000, 3000, g)}, "says 9"},
				{"PROOF first", "r1.g", [][]byte{rawHeader(1, typeProof, 0, 0), make([]byte, 32)}, "PROOF without a challenge"},
				{"oversized", "r1.h", [][]byte{rawHeader(1, wHello, 0, 0), make([]byte, 70<<10)}, ""},
				{"joined rank's identity", realID, [][]byte{rawHeader(1, wAck, 0, 0)}, ""},
			} {
				got := strangerConn(t, ctx, cfgs[1], c.id, c.frames...)
				if c.want != "" && !bytes.Contains(got, []byte(c.want)) {
					t.Errorf("%s: the root sent %q; want an ERROR saying %q", c.name, got, c.want)
				}
				if c.id != realID && bytes.Contains(got, []byte(realID)) {
					t.Errorf("%s: the root's answer reveals the joined rank's routing identity %q: %q", c.name, realID, got)
				}
			}
			errs := make([]error, 2)
			var wg sync.WaitGroup
			wg.Go(func() { errs[0] = produce(ctx, pub, 10) })
			wg.Go(func() { errs[1] = consume(ctx, subs[0], 1, 10) })
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("the bus after the strangers: %v", err)
			}
			if !strings.Contains(logs.String(), "refused a receiver that did not join") {
				t.Errorf("the refusals were not logged: %q", logs.String())
			}
		})
	}
}

// TestBusReplay replays, from a stranger, a receiver's proof of an earlier
// handshake (made with the real keys over other nonces): the root refuses
// it, since its fresh nonce differs. A stranger that never sends its proof
// is closed after the handshake bound.
func TestBusReplay(t *testing.T) {
	ctx := testContext(t, time.Minute)
	secret := authtest.Secret(t)
	cfgs := authtest.Secure(t, configs(t, 2, time.Second, nil), secret, nil)
	pub := openPublisher(t, ctx, cfgs[0])
	old, oldRoot := auth.NewNonce(), auth.NewNonce()
	recorded := cfgs[1].Auth.Prove(auth.Initiator, transcript(1, 2, old, oldRoot, nil))
	hello := append(rawHello(1, 2, 1<<20, 1000, 3000, cfgs[0].Group), old[:]...)
	c := dialRoot(t, ctx, cfgs[1])
	c.Write(append(zmtpReady("DEALER", "r1.replay"), append(zmtpFrame(true, rawHeader(1, wHello, 0, 0)), zmtpFrame(false, hello)...)...))
	// Wait for the CHALLENGE, then replay the recorded proof.
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var seen []byte
	buf := make([]byte, 4096)
	for !bytes.Contains(seen, rawHeader(1, typeChallenge, 0, 0)) {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("no CHALLENGE from the root: %v (got %q)", err, seen)
		}
		seen = append(seen, buf[:n]...)
	}
	c.Write(append(zmtpFrame(true, rawHeader(1, typeProof, 0, 0)), zmtpFrame(false, recorded[:])...))
	rest, _ := io.ReadAll(c)
	if !bytes.Contains(rest, []byte("did not prove")) {
		t.Fatalf("a replayed proof: the root sent %q; want an authentication failure", rest)
	}
	// Silent after HELLO: closed after the handshake bound (1 s here).
	start := time.Now()
	got := strangerConn(t, ctx, cfgs[1], "r1.silent", rawHeader(1, wHello, 0, 0), append(rawHello(1, 2, 1<<20, 1000, 3000, cfgs[0].Group), old[:]...))
	if !bytes.Contains(got, []byte("no PROOF within")) || time.Since(start) > 4*time.Second {
		t.Fatalf("a stranger silent after its CHALLENGE: closed after %v with %q", time.Since(start), got)
	}
	roundTrip(t, ctx, pub, openSubscriber(t, ctx, cfgs[1]))
}

// TestReceiverRefusesReplayedChallenge: a fake root answers HELLO with a
// CHALLENGE recorded from an earlier handshake: the receiver refuses it.
func TestReceiverRefusesReplayedChallenge(t *testing.T) {
	ctx := testContext(t, time.Minute)
	cfgs := authtest.Secure(t, configs(t, 2, 5*time.Second, nil), authtest.Secret(t), nil)
	root := fakeRoot(t, ctx, cfgs[0])
	errc := make(chan error, 1)
	go func() {
		_, err := OpenSubscriber(ctx, cfgs[1])
		errc <- err
	}()
	id, m := recvRaw(t, root, true)
	if m.typ != wHello || len(m.body) != 26+len(cfgs[1].Group)+auth.NonceSize {
		t.Fatalf("want a HELLO with a nonce, got %+v", m)
	}
	old, oldRoot := auth.NewNonce(), auth.NewNonce()
	proof := cfgs[0].Auth.Prove(auth.Responder, transcript(1, 2, old, oldRoot, nil))
	send(t, root, id, rawHeader(1, typeChallenge, 0, 0), challenge{nonce: oldRoot, proof: proof}.encode())
	if err := <-errc; !errors.Is(err, auth.ErrFailed) || !strings.Contains(err.Error(), "the root did not prove") {
		t.Fatalf("a receiver given a replayed CHALLENGE: %v; want authentication failed", err)
	}
}

// TestBusTLSMismatch: a plain receiver and a TLS root, or the reverse, or
// certificates of two authorities: the receiver fails saying TLS.
func TestBusTLSMismatch(t *testing.T) {
	ca, other := authtest.NewCA(t), authtest.NewCA(t)
	for name, c := range map[string]struct {
		root, receiver *auth.TLS
		want           string
	}{
		"receiver plain":  {ca.TLS(t), nil, "over TLS, and this rank has no TLS settings"},
		"root plain":      {nil, ca.TLS(t), "without TLS, and this rank has TLS settings"},
		"two authorities": {ca.TLS(t), other.TLS(t), "TLS failure"},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t, time.Minute)
			cfgs := configs(t, 2, 2*time.Second, nil)
			cfgs[0].TLS, cfgs[1].TLS = c.root, c.receiver
			openPublisher(t, ctx, cfgs[0])
			_, err := OpenSubscriber(ctx, cfgs[1])
			wantBusError(t, err, nil, 0, c.want)
		})
	}
}

// TestGuardRefusesAnonymous: a peer that announces no routing identity
// cannot be told apart from others, so the root closes its connection.
func TestGuardRefusesAnonymous(t *testing.T) {
	ctx := testContext(t, time.Minute)
	cfgs := configs(t, 2, 10*time.Second, nil)
	pub := openPublisher(t, ctx, cfgs[0])
	if got := strangerConn(t, ctx, cfgs[1], "", rawHeader(1, wHello, 0, 0), rawHello(1, 2, 1<<20, 1000, 3000, cfgs[0].Group)); bytes.Contains(got, []byte("WC")) {
		t.Fatalf("the root answered a peer without identity: %q", got)
	}
	roundTrip(t, ctx, pub, openSubscriber(t, ctx, cfgs[1]))
}

// busFlood opens n connections to the root's bus (loopback only) that
// stall: a third say nothing, a third send the ZMTP signature, a third
// the whole greeting but no READY. The test closes them when it ends.
func busFlood(t *testing.T, ctx context.Context, cfg transport.Config, n int) {
	t.Helper()
	addr := rootAddr(t, ctx, cfg)
	hostPort := strings.TrimPrefix(strings.TrimPrefix(addr, "tcp://"), tlsScheme)
	if host, _, _ := net.SplitHostPort(hostPort); !net.ParseIP(host).IsLoopback() {
		t.Fatalf("flood of %s: loopback only", addr)
	}
	greeting := zmtpReady("DEALER", "")[:64]
	for i := range n {
		c, err := net.DialTimeout("tcp", hostPort, 5*time.Second)
		if err != nil {
			t.Fatalf("stranger %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		switch i % 3 {
		case 1:
			c.Write(greeting[:10])
		case 2:
			c.Write(greeting)
		}
	}
}

// TestBusStrangerFlood has strangers open more stalled connections to the
// root's bus than it screens at once before the receivers join, with and without a secret and
// with TLS: every receiver still joins within seconds (the handshake
// bound is 10 s, the wait's 30 s), and the bus carries messages.
func TestBusStrangerFlood(t *testing.T) {
	secret, ca := authtest.Secret(t), authtest.NewCA(t)
	for name, c := range map[string]struct {
		secret *auth.Secret
		ca     *authtest.CA
	}{"no secret": {nil, nil}, "secret": {secret, nil}, "TLS and secret": {secret, ca}} {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t, time.Minute)
			cfgs := authtest.Secure(t, configs(t, 3, 30*time.Second, nil), c.secret, c.ca)
			pub := openPublisher(t, ctx, cfgs[0])
			busFlood(t, ctx, cfgs[1], maxScreening+60)
			start := time.Now()
			subs := make([]transport.Subscriber, 2)
			errs := make([]error, 3)
			var wg sync.WaitGroup
			for i := range subs {
				wg.Go(func() { subs[i], errs[i+1] = OpenSubscriber(ctx, cfgs[i+1]) })
			}
			wg.Wait()
			for _, s := range subs {
				if s != nil {
					defer s.Close()
				}
			}
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("after a flood of stalled connections: %v", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("the receivers took %v to join after the flood", d)
			}
			wg.Go(func() { errs[0] = produce(ctx, pub, 10) })
			for i, s := range subs {
				wg.Go(func() { errs[i+1] = consume(ctx, s, i+1, 10) })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
		})
	}
}
