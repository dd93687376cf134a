package zmqbus

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/transporttest"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(runChild(role))
	}
	goleak.VerifyTestMain(m)
}

var openers = transporttest.MetaOpeners{Publisher: OpenPublisher, Subscriber: OpenSubscriber}

func TestConformance(t *testing.T) { transporttest.TestMetaBus(t, t.Name(), openers) }

// configs returns the configs of a world of n ranks sharing one in-memory
// exchange, each with a copy of opts.
func configs(t *testing.T, n int, timeout time.Duration, opts map[string]string) []transport.Config {
	cfgs := transporttest.Configs(t.Name(), n, timeout)
	for r := range cfgs {
		cfgs[r].Options = map[string]string{}
		for k, v := range opts {
			cfgs[r].Options[k] = v
		}
	}
	return cfgs
}

// testContext returns a context that ends after d or when the test ends.
func testContext(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// openPublisher opens the root of cfg and closes it when the test ends.
func openPublisher(t *testing.T, ctx context.Context, cfg transport.Config) transport.Publisher {
	t.Helper()
	pub, err := OpenPublisher(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	return pub
}

// openSubscriber opens the receiver of cfg and closes it when the test
// ends.
func openSubscriber(t *testing.T, ctx context.Context, cfg transport.Config) transport.Subscriber {
	t.Helper()
	s, err := OpenSubscriber(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// rootAddr is the address ("tcp://host:port") the root of cfg's group
// published.
func rootAddr(t *testing.T, ctx context.Context, cfg transport.Config) string {
	t.Helper()
	addr, err := cfg.Exchange.Get(ctx, 0, AddrKey)
	if err != nil {
		t.Fatal(err)
	}
	return string(addr)
}

// openAll opens the publisher and every subscriber concurrently and closes
// them when the test or benchmark ends.
func openAll(t testing.TB, ctx context.Context, cfgs []transport.Config) (transport.Publisher, []transport.Subscriber) {
	t.Helper()
	return transporttest.OpenBus(t, ctx, openers, cfgs)
}

// payload is message k's deterministic content, 0..4 KiB long.
func payload(k int) []byte {
	rng := rand.New(rand.NewPCG(uint64(k), 7))
	b := make([]byte, rng.IntN(4097))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// consume receives and acks n messages, checking sequence and content.
func consume(ctx context.Context, s transport.Subscriber, rank, n int) error {
	for k := range n {
		m, err := s.Recv(ctx)
		if err != nil {
			return err
		}
		if m.Seq != uint64(k) || !bytes.Equal(m.Data, payload(k)) {
			return fmt.Errorf("rank %d: message %d came as seq %d with %d bytes (want %d)", rank, k, m.Seq, len(m.Data), len(payload(k)))
		}
		if err := s.Ack(ctx, m.Seq); err != nil {
			return err
		}
	}
	return nil
}

// produce publishes messages 0..n-1 (see payload) and waits until every
// receiver has acknowledged them.
func produce(ctx context.Context, pub transport.Publisher, n int) error {
	for k := range n {
		if err := pub.Publish(ctx, uint64(k), payload(k)); err != nil {
			return err
		}
	}
	return pub.Sync(ctx)
}

// roundTrip publishes message 0, which every subscriber of subs (ranks 1,
// 2, ...) receives intact and acknowledges, and waits for pub's Sync.
func roundTrip(t *testing.T, ctx context.Context, pub transport.Publisher, subs ...transport.Subscriber) {
	t.Helper()
	if err := pub.Publish(ctx, 0, payload(0)); err != nil {
		t.Fatal(err)
	}
	for i, s := range subs {
		if err := consume(ctx, s, i+1, 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Sync(ctx); err != nil {
		t.Fatal(err)
	}
}

// wantBusError checks that err is a *transport.Error of this transport
// that wraps target, names peer, and mentions every word of want.
func wantBusError(t *testing.T, err, target error, peer int, want ...string) *transport.Error {
	t.Helper()
	var te *transport.Error
	if !errors.As(err, &te) {
		t.Fatalf("error is not a *transport.Error: %v", err)
	}
	t.Logf("error: %v", err)
	if te.Transport != Name {
		t.Errorf("error names transport %q, want %q: %v", te.Transport, Name, err)
	}
	if target != nil && !errors.Is(err, target) {
		t.Errorf("error does not wrap %q: %v", target, err)
	}
	if peer != -2 && te.Peer != peer {
		t.Errorf("error names peer %d, want %d: %v", te.Peer, peer, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not mention %q: %v", w, err)
		}
	}
	return te
}

// TestLossless sends 2,000 messages to 4 receivers: every receiver gets
// every message once, in order, intact.
func TestLossless(t *testing.T) {
	ctx := testContext(t, time.Minute)
	const world, n = 5, 2000
	pub, subs := openAll(t, ctx, configs(t, world, 20*time.Second, nil))
	errs := make([]error, world)
	var wg sync.WaitGroup
	for i, s := range subs {
		wg.Go(func() { errs[i+1] = consume(ctx, s, i+1, n) })
	}
	wg.Go(func() { errs[0] = produce(ctx, pub, n) })
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	// Nothing more arrives: no duplicates after the last message.
	rctx, rcancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer rcancel()
	if m, err := subs[0].Recv(rctx); err == nil {
		t.Fatalf("extra message after the last one: seq %d", m.Seq)
	}
}

// TestSlowJoiner: a receiver that connects 2 s after the root started
// publishing still gets message 0, because the first Publish waits for it.
func TestSlowJoiner(t *testing.T) {
	ctx := testContext(t, time.Minute)
	const n = 10
	cfgs := configs(t, 3, 20*time.Second, nil)
	pub, subs := openAll(t, ctx, cfgs[:2]) // rank 2 is late
	published := make(chan error, 1)
	start := time.Now()
	go func() { published <- produce(ctx, pub, n) }()
	early := make(chan error, 1)
	go func() { early <- consume(ctx, subs[0], 1, n) }()

	time.Sleep(2 * time.Second)
	select {
	case err := <-published:
		t.Fatalf("the root finished publishing before rank 2 joined: %v", err)
	default:
	}
	late := openSubscriber(t, ctx, cfgs[2])
	if err := consume(ctx, late, 2, n); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(<-early, <-published); err != nil {
		t.Fatal(err)
	}
	t.Logf("late joiner got all %d messages from 0; publishing took %v", n, time.Since(start).Round(time.Millisecond))
}

// TestRootOwnLimit: Publish refuses a message over the root's max_message,
// names the size and the limit, and the bus stays usable.
func TestRootOwnLimit(t *testing.T) {
	ctx := testContext(t, time.Minute)
	cfgs := configs(t, 2, 20*time.Second, nil)
	cfgs[0].Options["max_message"] = "1KiB"
	pub, subs := openAll(t, ctx, cfgs)
	err := pub.Publish(ctx, 0, make([]byte, 2048))
	wantBusError(t, err, ErrTooLarge, -1, "2048", "1024", "max_message")
	if err := pub.Publish(ctx, 0, []byte("small")); err != nil {
		t.Fatalf("publish after a refused message: %v", err)
	}
	if m, err := subs[0].Recv(ctx); err != nil || string(m.Data) != "small" {
		t.Fatalf("recv: %q, %v", m.Data, err)
	}
}

// TestReceiverLimit: a receiver's max_message travels in HELLO, and the
// root refuses a message over it before sending anything.
func TestReceiverLimit(t *testing.T) {
	ctx := testContext(t, time.Minute)
	cfgs := configs(t, 3, 20*time.Second, nil)
	cfgs[2].Options["max_message"] = "1000"
	pub, subs := openAll(t, ctx, cfgs)
	err := pub.Publish(ctx, 0, make([]byte, 4096))
	wantBusError(t, err, ErrTooLarge, 2, "4096", "1000", "rank 2")
	if err := pub.Publish(ctx, 0, make([]byte, 1000)); err != nil {
		t.Fatalf("publish at the limit: %v", err)
	}
	for _, s := range subs {
		if m, err := s.Recv(ctx); err != nil || m.Seq != 0 || len(m.Data) != 1000 {
			t.Fatalf("recv: seq %d, %d bytes, %v", m.Seq, len(m.Data), err)
		}
	}
}

// TestWorldSizeMismatch: a receiver with another world size is refused
// with a clear reason, and it is the only one that fails: the root cannot
// trust a connection that never joined, so the real ranks still join.
func TestWorldSizeMismatch(t *testing.T) {
	ctx := testContext(t, time.Minute)
	cfgs := configs(t, 3, 10*time.Second, nil)
	pub := openPublisher(t, ctx, cfgs[0])
	bad := cfgs[2]
	bad.WorldSize = 4
	_, err := OpenSubscriber(ctx, bad)
	wantBusError(t, err, ErrHandshake, 0, "world size mismatch", "says 4", "opened with 3")
	roundTrip(t, ctx, pub, openSubscriber(t, ctx, cfgs[1]), openSubscriber(t, ctx, cfgs[2]))
}

// TestDuplicateRank: a second rank 1 is refused, and the first one stays.
func TestDuplicateRank(t *testing.T) {
	ctx := testContext(t, time.Minute)
	cfgs := configs(t, 2, 10*time.Second, nil)
	pub, subs := openAll(t, ctx, cfgs)
	_, err := OpenSubscriber(ctx, cfgs[1])
	wantBusError(t, err, ErrHandshake, 0, "rank 1 has joined already", "distinct rank")
	roundTrip(t, ctx, pub, subs...)
}

// TestWrongGroup: a receiver of another group that found this root's
// address is refused with both group names; a root that waits for its
// receiver in vain says whom it refused.
func TestWrongGroup(t *testing.T) {
	ctx := testContext(t, time.Minute)
	cfgs := configs(t, 2, 2*time.Second, nil)
	pub := openPublisher(t, ctx, cfgs[0])
	other := cfgs[1]
	other.Group = "someone-else"
	_, err := OpenSubscriber(ctx, other)
	wantBusError(t, err, ErrHandshake, 0, `group "someone-else"`, `group "`+cfgs[0].Group+`"`)
	wantBusError(t, pub.Publish(ctx, 0, nil), transport.ErrTimeout, -1, "HELLO from receiver rank(s) 1", "refused 1 connection", "someone-else")
}

// TestRootClosedMidStream: messages published before the root closed are
// delivered, then Recv fails with ErrPeerGone.
func TestRootClosedMidStream(t *testing.T) {
	ctx := testContext(t, time.Minute)
	pub, subs := openAll(t, ctx, configs(t, 3, 10*time.Second, nil))
	for k := range transport.DefaultWindow {
		if err := pub.Publish(ctx, uint64(k), payload(k)); err != nil {
			t.Fatal(err)
		}
	}
	pub.Close()
	for i, s := range subs {
		for k := range transport.DefaultWindow {
			m, err := s.Recv(ctx)
			if err != nil || m.Seq != uint64(k) {
				t.Fatalf("rank %d: message %d: seq %d, %v", i+1, k, m.Seq, err)
			}
		}
		_, err := s.Recv(ctx)
		wantBusError(t, err, transport.ErrPeerGone, 0, "root closed")
		wantBusError(t, s.Ack(ctx, 0), transport.ErrPeerGone, 0)
	}
}

// TestSilentClientDoesNotBlock: a TCP client that connects to the root
// and never speaks does not keep receivers out.
func TestSilentClientDoesNotBlock(t *testing.T) {
	ctx := testContext(t, time.Minute)
	cfgs := configs(t, 3, 20*time.Second, nil)
	pub := openPublisher(t, ctx, cfgs[0])
	dialRoot(t, ctx, cfgs[1]) // and never speak
	start := time.Now()
	var subs []transport.Subscriber
	for _, c := range cfgs[1:] {
		subs = append(subs, openSubscriber(t, ctx, c))
	}
	if err := pub.Publish(ctx, 0, payload(0)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("receivers took %v to join past a silent client", d)
	}
	for i, s := range subs {
		if err := consume(ctx, s, i+1, 1); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCancel: a Publish stuck on the window and a Recv with nothing to
// receive both honour their context; neither poisons the bus.
func TestCancel(t *testing.T) {
	ctx := testContext(t, time.Minute)
	pub, subs := openAll(t, ctx, configs(t, 2, time.Minute, nil))
	for k := range transport.DefaultWindow {
		if err := pub.Publish(ctx, uint64(k), payload(k)); err != nil {
			t.Fatal(err)
		}
	}
	cctx, ccancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer ccancel()
	err := pub.Publish(cctx, transport.DefaultWindow, nil)
	wantBusError(t, err, context.DeadlineExceeded, 1, "acknowledge message 0")
	if err := consume(ctx, subs[0], 1, transport.DefaultWindow); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, transport.DefaultWindow, payload(transport.DefaultWindow)); err != nil {
		t.Fatalf("publish after a cancelled one: %v", err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer rcancel()
	if _, err := subs[0].Recv(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = subs[0].Recv(rctx)
	wantBusError(t, err, context.DeadlineExceeded, 0)
}

// TestTimeouts: waits end at Config.Timeout with ErrTimeout.
func TestTimeouts(t *testing.T) {
	ctx := testContext(t, time.Minute)
	cfgs := configs(t, 3, 300*time.Millisecond, map[string]string{"heartbeat": "50ms"})
	pub := openPublisher(t, ctx, cfgs[0])
	err := pub.Publish(ctx, 0, nil)
	wantBusError(t, err, transport.ErrTimeout, -1, "HELLO from receiver rank(s) 1, 2")
	s := openSubscriber(t, ctx, cfgs[1])
	_, err = s.Recv(ctx)
	wantBusError(t, err, transport.ErrTimeout, 0, "no metadata message")
}

// TestOptions: bad options are refused with the option named.
func TestOptions(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		opts map[string]string
		want string
	}{
		{map[string]string{"max_message": "lots"}, "max_message"},
		{map[string]string{"heartbeat": "-1s"}, "heartbeat"},
		{map[string]string{"liveness": "soon"}, "liveness"},
		{map[string]string{"bind": "0.0.0.0"}, "advertise"},
		{map[string]string{"advertise": "host:99"}, "without a port"},
	} {
		cfgs := configs(t, 2, time.Second, tc.opts)
		p, err := OpenPublisher(ctx, cfgs[0])
		if err == nil {
			p.Close()
			t.Errorf("options %v accepted", tc.opts)
			continue
		}
		wantBusError(t, err, nil, -1, tc.want)
	}
	cfgs := configs(t, 2, time.Second, nil)
	if _, err := OpenPublisher(ctx, cfgs[1]); err == nil {
		t.Error("rank 1 opened a publisher")
	}
	if _, err := OpenSubscriber(ctx, cfgs[0]); err == nil {
		t.Error("rank 0 opened a subscriber")
	}
}

// TestAdvertise: binding every interface publishes the advertised host
// with the port the system chose.
func TestAdvertise(t *testing.T) {
	ctx := testContext(t, time.Minute)
	cfgs := configs(t, 2, 10*time.Second, map[string]string{"bind": "0.0.0.0", "advertise": "localhost"})
	pub, subs := openAll(t, ctx, cfgs)
	addr := rootAddr(t, ctx, cfgs[1])
	if !strings.HasPrefix(addr, "tcp://localhost:") || strings.HasSuffix(addr, ":0") {
		t.Fatalf("published address %q", addr)
	}
	roundTrip(t, ctx, pub, subs...)
}

// TestCloseIdempotent: Close twice, and calls after Close fail with
// ErrClosed.
func TestCloseIdempotent(t *testing.T) {
	ctx := testContext(t, time.Minute)
	pub, subs := openAll(t, ctx, configs(t, 2, 10*time.Second, nil))
	for range 2 {
		if err := subs[0].Close(); err != nil {
			t.Fatal(err)
		}
		if err := pub.Close(); err != nil {
			t.Fatal(err)
		}
	}
	wantBusError(t, pub.Publish(ctx, 0, nil), transport.ErrClosed, -2)
	wantBusError(t, pub.Sync(ctx), transport.ErrClosed, -2)
	_, err := subs[0].Recv(ctx)
	wantBusError(t, err, transport.ErrClosed, -2)
	wantBusError(t, subs[0].Ack(ctx, 0), transport.ErrClosed, -2)
}
