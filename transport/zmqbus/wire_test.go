package zmqbus

// These tests speak the protocol from its description in docs/protocol.md,
// building every frame by hand, as a client in another language would.

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/weightcast/weightcast/transport"
)

// Message types and error codes as documented.
const (
	wHello, wWelcome, wData, wAck, wHeartbeat, wError, wBye = 1, 2, 3, 4, 5, 6, 7
)

func rawHeader(version, typ byte, code uint32, seq uint64) []byte {
	b := []byte{'W', 'C', version, typ, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.LittleEndian.PutUint32(b[4:8], code)
	binary.LittleEndian.PutUint64(b[8:16], seq)
	return b
}

func rawHello(rank, world uint32, maxMessage uint64, heartbeatMS, livenessMS uint32, group string) []byte {
	b := make([]byte, 26, 26+len(group))
	binary.LittleEndian.PutUint32(b[0:], rank)
	binary.LittleEndian.PutUint32(b[4:], world)
	binary.LittleEndian.PutUint64(b[8:], maxMessage)
	binary.LittleEndian.PutUint32(b[16:], heartbeatMS)
	binary.LittleEndian.PutUint32(b[20:], livenessMS)
	binary.LittleEndian.PutUint16(b[24:], uint16(len(group)))
	return append(b, group...)
}

type rawMsg struct {
	version, typ byte
	code         uint32
	seq          uint64
	body         []byte
	frames       int
}

func parseRaw(t *testing.T, frames [][]byte) rawMsg {
	t.Helper()
	h := frames[0]
	if len(h) != 16 || h[0] != 'W' || h[1] != 'C' {
		t.Fatalf("bad header frame %x", h)
	}
	m := rawMsg{version: h[2], typ: h[3], code: binary.LittleEndian.Uint32(h[4:]), seq: binary.LittleEndian.Uint64(h[8:]), frames: len(frames)}
	if len(frames) > 1 {
		m.body = frames[1]
	}
	return m
}

// recvRaw receives the next message that is not a heartbeat (unless
// heartbeats are wanted), within 5 s.
func recvRaw(t *testing.T, s zmq4.Socket, skipHeartbeats bool) (id []byte, m rawMsg) {
	t.Helper()
	type result struct {
		msg zmq4.Msg
		err error
	}
	for {
		ch := make(chan result, 1)
		go func() { msg, err := s.Recv(); ch <- result{msg, err} }()
		var r result
		select {
		case r = <-ch:
		case <-time.After(5 * time.Second):
			s.Close() // ends the Recv above
			t.Fatal("nothing received within 5s")
		}
		if r.err != nil {
			t.Fatalf("raw recv: %v", r.err)
		}
		frames := r.msg.Frames
		if s.Type() == zmq4.Router {
			id, frames = frames[0], frames[1:]
		}
		m = parseRaw(t, frames)
		if skipHeartbeats && m.typ == wHeartbeat {
			continue
		}
		return id, m
	}
}

func rawDealer(t *testing.T, ctx context.Context, cfg transport.Config, identity string) zmq4.Socket {
	t.Helper()
	d := zmq4.NewDealer(ctx, zmq4.WithID(zmq4.SocketIdentity(identity)))
	if err := d.Dial(rootAddr(t, ctx, cfg)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func send(t *testing.T, s zmq4.Socket, frames ...[]byte) {
	t.Helper()
	if err := s.SendMulti(zmq4.NewMsgFrom(frames...)); err != nil {
		t.Fatal(err)
	}
}

// dialRoot opens a plain TCP connection to the root of cfg's group and
// closes it when the test ends.
func dialRoot(t *testing.T, ctx context.Context, cfg transport.Config) net.Conn {
	t.Helper()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", strings.TrimPrefix(rootAddr(t, ctx, cfg), "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// rawWelcome is a WELCOME body.
func rawWelcome(window, heartbeatMS, livenessMS uint32) []byte {
	b := make([]byte, 12)
	binary.LittleEndian.PutUint32(b[0:], window)
	binary.LittleEndian.PutUint32(b[4:], heartbeatMS)
	binary.LittleEndian.PutUint32(b[8:], livenessMS)
	return b
}

// TestWireReceiver: a hand-made receiver joins, gets DATA and heartbeats,
// acks, and says BYE.
func TestWireReceiver(t *testing.T) {
	ctx := testContext(t, time.Minute)
	cfgs := configs(t, 2, 20*time.Second, nil)
	pub := openPublisher(t, ctx, cfgs[0])
	d := rawDealer(t, ctx, cfgs[1], "r1.handmade")
	send(t, d, rawHeader(1, wHello, 0, 0), rawHello(1, 2, 1<<20, 1000, 600, cfgs[0].Group))

	_, m := recvRaw(t, d, true)
	if m.typ != wWelcome || m.version != 1 || m.frames != 2 || len(m.body) != 12 {
		t.Fatalf("want WELCOME with a 12-byte body, got %+v", m)
	}
	window, hb, live := binary.LittleEndian.Uint32(m.body[0:]), binary.LittleEndian.Uint32(m.body[4:]), binary.LittleEndian.Uint32(m.body[8:])
	if window != transport.DefaultWindow || hb != 1000 || live != 3000 {
		t.Fatalf("WELCOME window %d heartbeat_ms %d liveness_ms %d", window, hb, live)
	}

	if err := pub.Publish(ctx, 0, []byte("bucket zero")); err != nil {
		t.Fatal(err)
	}
	_, m = recvRaw(t, d, true)
	if m.typ != wData || m.seq != 0 || string(m.body) != "bucket zero" {
		t.Fatalf("want DATA 0, got %+v %q", m, m.body)
	}
	send(t, d, rawHeader(1, wAck, 0, 0))
	if err := pub.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	// Our liveness is 600 ms, so the root heartbeats at least every 200 ms;
	// its heartbeat carries the next sequence number.
	start := time.Now()
	_, m = recvRaw(t, d, false)
	if m.typ != wHeartbeat || m.seq != 1 || m.frames != 1 || time.Since(start) > time.Second {
		t.Fatalf("want HEARTBEAT seq 1 within 1s, got %+v after %v", m, time.Since(start))
	}
	send(t, d, rawHeader(1, wBye, 0, 1))
	err := pub.Publish(ctx, 1, nil) // may go out before the root reads BYE
	if err == nil {
		err = pub.Sync(ctx)
	}
	wantBusError(t, err, transport.ErrPeerGone, 1, "rank 1 closed its subscriber")
}

// TestWireRejections: HELLOs that do not fit get an ERROR frame with the
// documented code; the root, which cannot trust a connection that never
// joined, refuses it alone and the real receiver joins.
func TestWireRejections(t *testing.T) {
	for _, tc := range []struct {
		name     string
		identity string
		header   []byte
		hello    func(group string) []byte
		code     uint32
		want     string
	}{
		{"RankOutOfRange", "r7.x", rawHeader(1, wHello, 0, 0), func(g string) []byte { return rawHello(7, 2, 1<<20, 1000, 3000, g) }, 5, "rank 7 is outside [1, 2)"},
		{"RankZero", "r0.x", rawHeader(1, wHello, 0, 0), func(g string) []byte { return rawHello(0, 2, 1<<20, 1000, 3000, g) }, 5, "rank 0 is outside"},
		{"IdentityMismatch", "r2.x", rawHeader(1, wHello, 0, 0), func(g string) []byte { return rawHello(1, 2, 1<<20, 1000, 3000, g) }, 5, `want the prefix "r1."`},
		{"Version", "r1.x", rawHeader(2, wHello, 0, 0), func(g string) []byte { return rawHello(1, 2, 1<<20, 1000, 3000, g) }, 2, "protocol version 2"},
		{"ShortHello", "r1.x", rawHeader(1, wHello, 0, 0), func(g string) []byte { return []byte{1, 0, 0, 0} }, 1, "HELLO body of 4 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t, time.Minute)
			cfgs := configs(t, 2, 10*time.Second, nil)
			pub := openPublisher(t, ctx, cfgs[0])
			d := rawDealer(t, ctx, cfgs[1], tc.identity)
			send(t, d, tc.header, tc.hello(cfgs[0].Group))
			_, m := recvRaw(t, d, true)
			if m.typ != wError || m.code != tc.code || !strings.Contains(string(m.body), tc.want) {
				t.Fatalf("want ERROR code %d mentioning %q, got type %d code %d %q", tc.code, tc.want, m.typ, m.code, m.body)
			}
			roundTrip(t, ctx, pub, openSubscriber(t, ctx, cfgs[1]))
		})
	}
}

// TestWireAckOutOfOrder: an ACK for a message never sent fails the root
// with ErrProtocol, and the receiver hears why.
func TestWireAckOutOfOrder(t *testing.T) {
	ctx := testContext(t, time.Minute)
	cfgs := configs(t, 2, 10*time.Second, nil)
	pub := openPublisher(t, ctx, cfgs[0])
	d := rawDealer(t, ctx, cfgs[1], "r1.x")
	send(t, d, rawHeader(1, wHello, 0, 0), rawHello(1, 2, 1<<20, 1000, 3000, cfgs[0].Group))
	if _, m := recvRaw(t, d, true); m.typ != wWelcome {
		t.Fatalf("want WELCOME, got %+v", m)
	}
	send(t, d, rawHeader(1, wAck, 0, 5))
	_, m := recvRaw(t, d, true)
	if m.typ != wError || m.code != 1 || !strings.Contains(string(m.body), "acknowledged message 5") {
		t.Fatalf("want ERROR code 1, got %+v %q", m, m.body)
	}
	wantBusError(t, pub.Publish(ctx, 0, nil), ErrProtocol, 1, "acknowledged message 5")
}

// fakeRoot binds a hand-driven ROUTER, publishes its address for the
// receivers of cfg, and returns it.
func fakeRoot(t *testing.T, ctx context.Context, cfg transport.Config) zmq4.Socket {
	t.Helper()
	r := zmq4.NewRouter(ctx)
	if err := r.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if err := cfg.Exchange.Put(ctx, AddrKey, []byte("tcp://"+r.Addr().String())); err != nil {
		t.Fatal(err)
	}
	return r
}

// openWithFakeRoot opens rank 1 against a fake root that checks HELLO
// and answers WELCOME.
func openWithFakeRoot(t *testing.T, ctx context.Context, cfgs []transport.Config) (zmq4.Socket, []byte, transport.Subscriber) {
	t.Helper()
	root := fakeRoot(t, ctx, cfgs[0])
	type opened struct {
		s   transport.Subscriber
		err error
	}
	ch := make(chan opened, 1)
	go func() { s, err := OpenSubscriber(ctx, cfgs[1]); ch <- opened{s, err} }()
	id, m := recvRaw(t, root, true)
	if m.typ != wHello || !strings.HasPrefix(string(id), "r1.") {
		t.Fatalf("want HELLO from identity r1.*, got %+v from %q", m, id)
	}
	b := m.body
	rank, world, group := binary.LittleEndian.Uint32(b[0:]), binary.LittleEndian.Uint32(b[4:]), string(b[26:])
	if rank != 1 || int(world) != len(cfgs) || group != cfgs[1].Group || int(binary.LittleEndian.Uint16(b[24:])) != len(group) {
		t.Fatalf("HELLO rank %d world %d group %q", rank, world, group)
	}
	send(t, root, id, rawHeader(1, wWelcome, 0, 0), rawWelcome(2, 1000, 3000))
	o := <-ch
	if o.err != nil {
		t.Fatal(o.err)
	}
	t.Cleanup(func() { o.s.Close() })
	return root, id, o.s
}

// TestWireFakeRoot: a receiver checks what a root sends.
func TestWireFakeRoot(t *testing.T) {
	t.Run("Gap", func(t *testing.T) {
		ctx := testContext(t, time.Minute)
		root, id, s := openWithFakeRoot(t, ctx, configs(t, 2, 10*time.Second, nil))
		send(t, root, id, rawHeader(1, wData, 0, 1), []byte("one"))
		_, err := s.Recv(ctx)
		wantBusError(t, err, ErrProtocol, 0, "expected message 0, got 1")
		_, m := recvRaw(t, root, true)
		if m.typ != wError || m.code != 1 || !strings.Contains(string(m.body), "expected message 0, got 1") {
			t.Fatalf("want ERROR code 1 at the root, got %+v %q", m, m.body)
		}
	})
	t.Run("Duplicate", func(t *testing.T) {
		ctx := testContext(t, time.Minute)
		root, id, s := openWithFakeRoot(t, ctx, configs(t, 2, 10*time.Second, nil))
		send(t, root, id, rawHeader(1, wData, 0, 0), []byte("zero"))
		send(t, root, id, rawHeader(1, wData, 0, 0), []byte("zero"))
		if m, err := s.Recv(ctx); err != nil || m.Seq != 0 {
			t.Fatalf("first copy: %v", err)
		}
		_, err := s.Recv(ctx)
		wantBusError(t, err, ErrProtocol, 0, "expected message 1, got 0")
	})
	t.Run("PastWindow", func(t *testing.T) {
		ctx := testContext(t, time.Minute)
		root, id, s := openWithFakeRoot(t, ctx, configs(t, 2, 10*time.Second, nil))
		for k := range uint64(3) {
			send(t, root, id, rawHeader(1, wData, 0, k), nil)
		}
		for range 2 {
			if _, err := s.Recv(ctx); err != nil {
				t.Fatal(err)
			}
		}
		_, err := s.Recv(ctx)
		wantBusError(t, err, ErrProtocol, 0, "past the window of 2")
	})
	t.Run("TooLarge", func(t *testing.T) {
		ctx := testContext(t, time.Minute)
		root, id, s := openWithFakeRoot(t, ctx, configs(t, 2, 10*time.Second, map[string]string{"max_message": "1KiB"}))
		send(t, root, id, rawHeader(1, wData, 0, 0), make([]byte, 2048))
		_, err := s.Recv(ctx)
		wantBusError(t, err, ErrTooLarge, 0, "2048 bytes", "limit of 1024 bytes", "max_message")
		_, m := recvRaw(t, root, true)
		if m.typ != wError || m.code != 7 {
			t.Fatalf("want ERROR code 7 at the root, got %+v %q", m, m.body)
		}
	})
	t.Run("FrameOverGuard", func(t *testing.T) {
		ctx := testContext(t, time.Minute)
		root, id, s := openWithFakeRoot(t, ctx, configs(t, 2, 10*time.Second, map[string]string{"max_message": "1KiB"}))
		// The receiver hangs up in the middle of the frame, so this send may fail.
		root.SendMulti(zmq4.NewMsgFrom(id, rawHeader(1, wData, 0, 0), make([]byte, 100<<10)))
		_, err := s.Recv(ctx)
		wantBusError(t, err, ErrTooLarge, 0, "frame of 102400 bytes", "limit of 65536 bytes")
	})
	t.Run("SilentRoot", func(t *testing.T) {
		ctx := testContext(t, time.Minute)
		_, _, s := openWithFakeRoot(t, ctx, configs(t, 2, 10*time.Second, map[string]string{"heartbeat": "100ms", "liveness": "400ms"}))
		start := time.Now()
		_, err := s.Recv(ctx)
		wantBusError(t, err, transport.ErrPeerGone, 0, "no message or heartbeat from the root")
		if d := time.Since(start); d > 400*time.Millisecond+300*time.Millisecond {
			t.Fatalf("silent root noticed after %v, liveness 400ms", d)
		}
	})
	t.Run("ByeEndsRun", func(t *testing.T) {
		// BYE with every message acknowledged is the end of the run;
		// BYE with a message still unacknowledged is a root gone.
		for _, ack := range []bool{true, false} {
			ctx := testContext(t, time.Minute)
			root, id, s := openWithFakeRoot(t, ctx, configs(t, 2, 10*time.Second, nil))
			send(t, root, id, rawHeader(1, wData, 0, 0), []byte("bucket"))
			if _, err := s.Recv(ctx); err != nil {
				t.Fatal(err)
			}
			if ack {
				if err := s.Ack(ctx, 0); err != nil {
					t.Fatal(err)
				}
			}
			send(t, root, id, rawHeader(1, wBye, 0, 1))
			_, err := s.Recv(ctx)
			if ack {
				wantBusError(t, err, transport.ErrEnded, 0, "the root closed the metadata bus after message 1")
			} else {
				wantBusError(t, err, transport.ErrPeerGone, 0, "with 0 of 1 messages acknowledged")
			}
		}
	})
	t.Run("RootError", func(t *testing.T) {
		ctx := testContext(t, time.Minute)
		root, id, s := openWithFakeRoot(t, ctx, configs(t, 2, 10*time.Second, nil))
		send(t, root, id, rawHeader(1, wError, 8, 0), []byte("rank 2 died"))
		_, err := s.Recv(ctx)
		wantBusError(t, err, transport.ErrPeerGone, 0, "the root gave up: rank 2 died")
	})
}

// zmtpReady is what a ZMTP 3.0 peer (NULL security) sends first: its
// greeting and a READY command announcing it as sockType, with identity
// unless it is empty.
func zmtpReady(sockType, identity string) []byte {
	greeting := make([]byte, 64)
	greeting[0], greeting[9], greeting[10] = 0xFF, 0x7F, 3
	copy(greeting[12:], "NULL")
	prop := func(k, v string) []byte {
		b := append([]byte{byte(len(k))}, k...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
		return append(b, v...)
	}
	ready := append([]byte{5}, "READY"...)
	ready = append(ready, prop("Socket-Type", sockType)...)
	if identity != "" {
		ready = append(ready, prop("Identity", identity)...)
	}
	out := append(greeting, 0x04, byte(len(ready)))
	return append(out, ready...)
}

// zmtpPeer is a hand-written ZMTP 3.0 peer (NULL security) that greets,
// announces itself as sockType, and discards what it reads.
func zmtpPeer(t *testing.T, c net.Conn, sockType, identity string) {
	t.Helper()
	if _, err := c.Write(zmtpReady(sockType, identity)); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, c)
}

// zmtpFrame encodes one ZMTP message frame.
func zmtpFrame(more bool, body []byte) []byte {
	var flags byte
	if more {
		flags |= 0x1
	}
	if len(body) > 255 {
		return append(binary.BigEndian.AppendUint64([]byte{flags | 0x2}, uint64(len(body))), body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

// TestGuardRefusesBeforeAllocating: a frame header that announces 1 TiB
// fails Recv with ErrTooLarge. Without the guard zmq4 would try to
// allocate the terabyte.
func TestGuardRefusesBeforeAllocating(t *testing.T) {
	ctx := testContext(t, time.Minute)
	cfgs := configs(t, 2, 10*time.Second, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfgs[0].Exchange.Put(ctx, AddrKey, []byte("tcp://"+ln.Addr().String()))
	served := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- nil
			return
		}
		zmtpPeer(t, c, "ROUTER", "")
		msg := append(zmtpFrame(true, rawHeader(1, wWelcome, 0, 0)), zmtpFrame(false, rawWelcome(2, 1000, 3000))...)
		msg = append(msg, zmtpFrame(true, rawHeader(1, wData, 0, 0))...)
		msg = append(msg, 0x2) // LONG frame of 1 TiB, no body follows
		msg = binary.BigEndian.AppendUint64(msg, 1<<40)
		c.Write(msg)
		served <- c
	}()
	s, err := OpenSubscriber(ctx, cfgs[1])
	if c := <-served; c != nil {
		defer c.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.Recv(ctx)
	wantBusError(t, err, ErrTooLarge, 0, "frame of 1099511627776 bytes", "limit of 67108864 bytes")
}

// TestGuardProtectsRoot: a client that sends the root a 1 TiB frame header
// loses its connection; the bus goes on.
func TestGuardProtectsRoot(t *testing.T) {
	ctx := testContext(t, time.Minute)
	cfgs := configs(t, 2, 10*time.Second, nil)
	pub := openPublisher(t, ctx, cfgs[0])
	c := dialRoot(t, ctx, cfgs[1])
	out := append(zmtpReady("DEALER", "r1.big"), 0x2) // LONG frame of 1 TiB
	out = binary.BigEndian.AppendUint64(out, 1<<40)
	if _, err := c.Write(out); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("the root did not close the connection: %v", err)
	}
	roundTrip(t, ctx, pub, openSubscriber(t, ctx, cfgs[1]))
}

// TestWireStranger: a connection that never said HELLO is told so and
// closed; the group carries on.
func TestWireStranger(t *testing.T) {
	ctx := testContext(t, time.Minute)
	cfgs := configs(t, 2, 10*time.Second, nil)
	pub := openPublisher(t, ctx, cfgs[0])
	d := rawDealer(t, ctx, cfgs[1], "r1.stranger")
	send(t, d, rawHeader(1, wAck, 0, 0))
	_, m := recvRaw(t, d, true)
	if m.typ != wError || m.code != 1 || !strings.Contains(string(m.body), "send HELLO first") {
		t.Fatalf("want ERROR code 1, got %+v %q", m, m.body)
	}
	roundTrip(t, ctx, pub, openSubscriber(t, ctx, cfgs[1]))
}
