package handshake

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

	"go.uber.org/goleak"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/auth/authtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var proto = Protocol{Name: "test", Magic: 0x77637473, Version: 2}

// pair returns the two ends of a loopback TCP connection, closed when the
// test ends.
func pair(t *testing.T) (dialer, acceptor net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(acc)
			return
		}
		acc <- c
	}()
	d, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a, ok := <-acc
	if !ok {
		t.Fatal("accept failed")
	}
	for _, c := range []net.Conn{d, a} {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		t.Cleanup(func() { c.Close() })
	}
	return d, a
}

func wantRank(r int) Check {
	return func(h Hello) string {
		if h.Rank != r {
			return "wrong rank"
		}
		return ""
	}
}

// run runs both sides concurrently: the dialer wants rank 2, the acceptor
// rank 1.
func run(t *testing.T, d, a Side) (dh, ah Hello, derr, aerr error) {
	t.Helper()
	dc, ac := pair(t)
	var wg sync.WaitGroup
	wg.Go(func() { ah, aerr = Accept(ac, proto, a, wantRank(1)); ac.Close() })
	dh, derr = Dial(dc, proto, d, wantRank(2))
	dc.Close()
	wg.Wait()
	return dh, ah, derr, aerr
}

func sides(keys1, keys2 *auth.Keys) (Side, Side) {
	return Side{Group: "g", Rank: 1, World: 4, Extra: []byte("one"), Keys: keys1},
		Side{Group: "g", Rank: 2, World: 4, Extra: []byte("two"), Keys: keys2}
}

func TestHandshakeAccepts(t *testing.T) {
	secret := authtest.Secret(t)
	k := authtest.Keys(t, secret, "g", "r")
	for name, keys := range map[string]*auth.Keys{"no secret": nil, "secret": k} {
		d, a := sides(keys, keys)
		dh, ah, derr, aerr := run(t, d, a)
		if derr != nil || aerr != nil {
			t.Fatalf("%s: dialer %v, acceptor %v", name, derr, aerr)
		}
		if dh.Rank != 2 || string(dh.Extra) != "two" || ah.Rank != 1 || string(ah.Extra) != "one" || dh.Secret != (keys != nil) {
			t.Fatalf("%s: the dialer heard %+v, the acceptor %+v", name, dh, ah)
		}
	}
	// A TLS binding that is the same on both ends.
	d, a := sides(k, k)
	d.Binding, a.Binding = []byte("binding"), []byte("binding")
	if _, _, derr, aerr := run(t, d, a); derr != nil || aerr != nil {
		t.Fatalf("same binding: dialer %v, acceptor %v", derr, aerr)
	}
}

func TestHandshakeRefuses(t *testing.T) {
	ka := authtest.Keys(t, authtest.Secret(t), "g", "r")
	kb := authtest.Keys(t, authtest.Secret(t), "g", "r")
	other := authtest.Keys(t, authtest.Secret(t), "g", "other-run")
	for _, c := range []struct {
		name string
		edit func(d, a *Side)
		auth bool
		want string
	}{
		{"group", func(d, a *Side) { a.Group = "h" }, false, `belongs to group "g"`},
		{"world", func(d, a *Side) { a.World = 5 }, false, "the group has 4 ranks"},
		{"rank", func(d, a *Side) { d.Rank = 3 }, false, "wrong rank"},
		{"secret and none", func(d, a *Side) { d.Keys = ka }, true, "has a group secret and rank 2 has none"},
		{"none and secret", func(d, a *Side) { a.Keys = ka }, true, "has no group secret and rank 2 has one"},
		{"different secrets", func(d, a *Side) { d.Keys, a.Keys = ka, kb }, true, "did not prove"},
		{"another run's keys", func(d, a *Side) { d.Keys, a.Keys = ka, other }, true, "did not prove"},
		{"relayed (bindings differ)", func(d, a *Side) { d.Keys, a.Keys, d.Binding, a.Binding = ka, ka, []byte("x"), []byte("y") }, true, "did not prove"},
	} {
		d, a := sides(nil, nil)
		c.edit(&d, &a)
		_, _, derr, aerr := run(t, d, a)
		for side, err := range map[string]error{"dialer": derr, "acceptor": aerr} {
			var rj *Rejected
			switch {
			case !errors.As(err, &rj) || !errors.Is(err, ErrRejected):
				t.Errorf("%s: %s: %v; want a *Rejected", c.name, side, err)
			case errors.Is(err, auth.ErrFailed) != c.auth:
				t.Errorf("%s: %s: %v; authentication failure %v, want %v", c.name, side, err, errors.Is(err, auth.ErrFailed), c.auth)
			case !strings.Contains(err.Error(), c.want):
				t.Errorf("%s: %s: %q does not say %q", c.name, side, err, c.want)
			}
		}
	}
	// Another protocol version: both ends say so.
	dc, ac := pair(t)
	var aerr error
	var wg sync.WaitGroup
	wg.Go(func() {
		_, aerr = Accept(ac, Protocol{Name: "test", Magic: proto.Magic, Version: 3}, Side{Group: "g", Rank: 2, World: 4}, wantRank(1))
	})
	_, derr := Dial(dc, proto, Side{Group: "g", Rank: 1, World: 4}, wantRank(2))
	wg.Wait()
	for side, err := range map[string]error{"dialer": derr, "acceptor": aerr} {
		if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "protocol version") {
			t.Errorf("versions 2 and 3: %s: %v; want a refusal naming the versions", side, err)
		}
	}
}

// recorder keeps what is written through it.
type recorder struct {
	net.Conn
	mu  sync.Mutex
	out bytes.Buffer
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	r.out.Write(p)
	r.mu.Unlock()
	return r.Conn.Write(p)
}

// TestReplayRefused records both ends of a successful handshake and plays
// each recording to a fresh end of the other kind: both refuse it, since
// their fresh nonce differs from the one the recorded proof covers.
func TestReplayRefused(t *testing.T) {
	k := authtest.Keys(t, authtest.Secret(t), "g", "r")
	d, a := sides(k, k)
	dc, ac := pair(t)
	rd, ra := &recorder{Conn: dc}, &recorder{Conn: ac}
	var wg sync.WaitGroup
	var aerr error
	wg.Go(func() { _, aerr = Accept(ra, proto, a, wantRank(1)) })
	if _, err := Dial(rd, proto, d, wantRank(2)); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if aerr != nil {
		t.Fatal(aerr)
	}

	// The dialer's recording, replayed to a new acceptor.
	dc2, ac2 := pair(t)
	go func() {
		dc2.Write(rd.out.Bytes())
		io.Copy(io.Discard, dc2)
	}()
	if _, err := Accept(ac2, proto, a, wantRank(1)); !errors.Is(err, auth.ErrFailed) {
		t.Fatalf("a replayed initiator: %v; want authentication failed", err)
	}
	// The acceptor's recording, replayed to a new dialer.
	dc3, ac3 := pair(t)
	go func() {
		ac3.Write(ra.out.Bytes())
		io.Copy(io.Discard, ac3)
	}()
	if _, err := Dial(dc3, proto, d, wantRank(2)); !errors.Is(err, auth.ErrFailed) {
		t.Fatalf("a replayed responder: %v; want authentication failed", err)
	}
}

func TestNotPeer(t *testing.T) {
	dc, ac := pair(t)
	go dc.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	if _, err := Accept(ac, proto, Side{Group: "g", Rank: 2, World: 4}, wantRank(1)); !errors.Is(err, ErrNotPeer) {
		t.Fatalf("an HTTP request: %v; want ErrNotPeer", err)
	}
}

// TestAdmit runs strangers (one silent, one speaking garbage, one with a
// valid hello for the wrong rank, one with another secret) next to the
// real peer: Admit admits the real one within the strangers' handshake
// bound, refuses and counts the others, and none of them ends the wait.
func TestAdmit(t *testing.T) {
	k := authtest.Keys(t, authtest.Secret(t), "g", "r")
	stranger := authtest.Keys(t, authtest.Secret(t), "g", "r")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	me := Side{Group: "g", Rank: 2, World: 4, Keys: k}
	dial := func(s *Side) error {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if s == nil {
			_, err := c.Write([]byte("garbage garbage garbage"))
			return err
		}
		_, err = Dial(c, proto, *s, wantRank(2))
		return err
	}
	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	wg.Go(func() { errs[0] = dial(nil) })
	wg.Go(func() { errs[1] = dial(&Side{Group: "g", Rank: 3, World: 4, Keys: k}) })
	wg.Go(func() { errs[2] = dial(&Side{Group: "g", Rank: 1, World: 4, Keys: stranger}) })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := make(chan struct{})
	go func() {
		defer close(got)
		time.Sleep(100 * time.Millisecond) // the strangers first
		errs[3] = dial(&Side{Group: "g", Rank: 1, World: 4, Keys: k})
	}()
	start := time.Now()
	admitted, refused, err := Admit(ctx, ln, Admission{Want: 1, Bound: 3 * time.Second, What: "test rank 2"}, func(ctx context.Context, c net.Conn) (Hello, error) {
		return Accept(c, proto, me, wantRank(1))
	})
	if err != nil {
		t.Fatal(err)
	}
	<-got
	wg.Wait()
	defer admitted[0].Conn.Close()
	if len(admitted) != 1 || admitted[0].Value.Rank != 1 || errs[3] != nil {
		t.Fatalf("admitted %v (the real rank's Dial: %v)", admitted, errs[3])
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("admitting the real rank took %v: a silent stranger held it up", d)
	}
	if refused.N < 3 || !refused.Auth {
		t.Errorf("refusals %+v; want the three strangers that spoke, one failing authentication", refused)
	}
	if !errors.Is(errs[2], auth.ErrFailed) || !errors.Is(errs[1], ErrRejected) {
		t.Errorf("the strangers heard %v and %v; want a refusal and an authentication failure", errs[1], errs[2])
	}

	// A wait that ends before anyone is admitted says so.
	ln2, _ := net.Listen("tcp", "127.0.0.1:0")
	sctx, scancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer scancel()
	_, _, err = Admit(sctx, ln2, Admission{Want: 1, Bound: time.Second}, func(ctx context.Context, c net.Conn) (Hello, error) {
		return Accept(c, proto, me, wantRank(1))
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Admit that admits nobody: %v; want the context's deadline", err)
	}
}

// TestAdmitFlood has twice as many strangers as Admit runs handshakes at
// once connect before the real peer and stall, half of them silent and
// half after a few bytes: the real peer takes the place of one of them
// and is admitted, and the strangers closed to make room are noted.
func TestAdmitFlood(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	me := Side{Group: "g", Rank: 2, World: 4}
	var strangers []net.Conn
	defer func() {
		for _, c := range strangers {
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var (
		admitted []Admitted[Hello]
		refused  Refusals
		aerr     error
		wg       sync.WaitGroup
	)
	wg.Go(func() {
		admitted, refused, aerr = Admit(ctx, ln, Admission{Want: 1, Bound: 20 * time.Second, What: "test rank 2"}, func(ctx context.Context, c net.Conn) (Hello, error) {
			return Accept(c, proto, me, wantRank(1))
		})
	})
	for i := range 2 * MaxInFlight {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			c.Write([]byte{0x77})
		}
		strangers = append(strangers, c)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := Dial(c, proto, Side{Group: "g", Rank: 1, World: 4}, wantRank(2)); err != nil {
		t.Fatalf("the real peer after %d strangers: %v", len(strangers), err)
	}
	wg.Wait()
	if aerr != nil {
		t.Fatal(aerr)
	}
	defer admitted[0].Conn.Close()
	if admitted[0].Value.Rank != 1 {
		t.Fatalf("admitted %v", admitted[0].Value)
	}
	if refused.N < MaxInFlight {
		t.Errorf("refusals %d; want the %d strangers closed to make room", refused.N, MaxInFlight)
	}
}
