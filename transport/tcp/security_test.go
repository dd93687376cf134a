package tcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/auth/authtest"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/internal/handshake"
	"github.com/weightcast/weightcast/transport/transporttest"
)

// chainWorks opens every rank and moves one bucket down the chain.
func chainWorks(t *testing.T, ctx context.Context, cfgs []transport.Config) {
	t.Helper()
	eps := transporttest.OpenAll(t, ctx, Open, cfgs)
	bufs := hostBufs(t, len(cfgs), 1<<20)
	for i := range bufs[0].Host() {
		bufs[0].Host()[i] = byte(i * 31)
	}
	if err := errors.Join(broadcastAll(ctx, eps, 0, bufs, 1<<20)...); err != nil {
		t.Fatal(err)
	}
	for r := 1; r < len(bufs); r++ {
		if !bytes.Equal(bufs[r].Host(), bufs[0].Host()) {
			t.Fatalf("rank %d received other bytes", r)
		}
	}
}

func TestChainSecured(t *testing.T) {
	secret, ca := authtest.Secret(t), authtest.NewCA(t)
	for name, c := range map[string]struct {
		secret *auth.Secret
		ca     *authtest.CA
	}{"secret": {secret, nil}, "TLS": {nil, ca}, "TLS and secret": {secret, ca}} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			chainWorks(t, ctx, authtest.Secure(t, transporttest.Configs(t.Name(), 3, 10*time.Second), c.secret, c.ca))
		})
	}
}

// TestDifferentSecrets opens a chain whose ranks hold different secrets,
// or one none: the dialer fails at once with "authentication failed", the
// receiver refuses it and its wait ends saying so too.
func TestDifferentSecrets(t *testing.T) {
	t.Parallel() // each case waits out a 2 s handshake timeout
	a, b := authtest.Secret(t), authtest.Secret(t)
	for name, s := range map[string][2]*auth.Secret{"different": {a, b}, "root none": {nil, a}, "receiver none": {a, nil}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cfgs := transporttest.Configs(t.Name(), 2, 2*time.Second)
			for r := range cfgs {
				if s[r] != nil {
					cfgs[r].Auth = authtest.Keys(t, s[r], cfgs[r].Group, authtest.Run)
				}
			}
			errs := openPair(t, ctx, cfgs)
			for r, err := range errs {
				if !errors.Is(err, auth.ErrFailed) || !strings.Contains(err.Error(), "authentication failed") {
					t.Errorf("rank %d: %v; want authentication failed", r, err)
				}
			}
			t.Logf("rank 0: %v", errs[0])
			t.Logf("rank 1: %v", errs[1])
		})
	}
}

// TestStrangerRefused has strangers reach rank 1 before the real root: one
// without the secret claiming to be rank 0, one that says nothing, one
// speaking garbage, one with another protocol version, a plain connection
// to a TLS rank. Each is refused and logged; the real root then opens the
// chain and the bucket arrives.
func TestStrangerRefused(t *testing.T) {
	secret, ca := authtest.Secret(t), authtest.NewCA(t)
	for name, c := range map[string]struct {
		secret *auth.Secret
		ca     *authtest.CA
	}{"no secret": {nil, nil}, "secret": {secret, nil}, "TLS and secret": {secret, ca}} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cfgs := authtest.Secure(t, transporttest.Configs(t.Name(), 2, 10*time.Second), c.secret, c.ca)
			var logs authtest.LogBuffer
			cfgs[1].Logger = logs.Logger()
			var (
				rx    transport.Endpoint
				rxErr error
				wg    sync.WaitGroup
			)
			wg.Go(func() { rx, rxErr = Open(ctx, cfgs[1]) })
			addr, err := cfgs[0].Exchange.Get(ctx, 1, AddrKey)
			if err != nil {
				t.Fatal(err)
			}
			silent, err := net.Dial("tcp", string(addr))
			if err != nil {
				t.Fatal(err)
			}
			defer silent.Close()
			stranger := func(send func(net.Conn)) {
				c, err := net.Dial("tcp", string(addr))
				if err != nil {
					t.Error(err)
					return
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				send(c)
			}
			stranger(func(c net.Conn) { c.Write([]byte("GET / HTTP/1.1\\r\\n\\r\\n")) })
			stranger(func(c net.Conn) {
				old := handshake.Protocol{Name: Name, Magic: magic, Version: 1}
				handshake.Dial(c, old, handshake.Side{Group: cfgs[0].Group, Rank: 0, World: 2}, func(handshake.Hello) string { return "" })
			})
			if c.secret != nil && c.ca == nil {
				// Knows everything but the secret: claims rank 0 with a key
				// of its own.
				stranger(func(c net.Conn) {
					keys := authtest.Keys(t, authtest.Secret(t), cfgs[0].Group, authtest.Run)
					_, err := handshake.Dial(c, proto, handshake.Side{Group: cfgs[0].Group, Rank: 0, World: 2, Keys: keys}, func(handshake.Hello) string { return "" })
					if !errors.Is(err, auth.ErrFailed) {
						t.Errorf("a stranger with another secret heard %v; want authentication failed", err)
					}
				})
			}
			root, err := Open(ctx, cfgs[0])
			wg.Wait()
			if err != nil || rxErr != nil {
				t.Fatalf("root %v, receiver %v", err, rxErr)
			}
			defer root.Close()
			defer rx.Close()
			bufs := hostBufs(t, 2, 100)
			copy(bufs[0].Host(), "hello")
			if err := errors.Join(broadcastAll(ctx, []transport.Endpoint{root, rx}, 0, bufs, 5)...); err != nil {
				t.Fatal(err)
			}
			if got := string(bufs[1].Host()[:5]); got != "hello" {
				t.Fatalf("got %q", got)
			}
			if !strings.Contains(logs.String(), "refused a connection whose handshake failed") {
				t.Errorf("nothing logged of the refused strangers; the log holds %q", logs.String())
			}
		})
	}
}

// TestTLSMismatch opens a chain where only one end has TLS, or their
// certificates come from different authorities: the dialer fails naming
// TLS, and no plain byte reaches a TLS rank as a bucket.
func TestTLSMismatch(t *testing.T) {
	t.Parallel() // each case waits out a 2 s handshake timeout
	ca, other := authtest.NewCA(t), authtest.NewCA(t)
	for name, tl := range map[string][2]*auth.TLS{
		"root plain":      {nil, ca.TLS(t)},
		"receiver plain":  {ca.TLS(t), nil},
		"two authorities": {ca.TLS(t), other.TLS(t)},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cfgs := transporttest.Configs(t.Name(), 2, 2*time.Second)
			cfgs[0].TLS, cfgs[1].TLS = tl[0], tl[1]
			errs := openPair(t, ctx, cfgs)
			if errs[0] == nil || errs[1] == nil {
				t.Fatalf("opened: root %v, receiver %v", errs[0], errs[1])
			}
			t.Logf("root: %v", errs[0])
			if name == "root plain" && (!errors.Is(errs[0], ErrHandshake) || !strings.Contains(errs[0].Error(), "rank 1 runs with TLS")) {
				t.Errorf("a plain root: %v; want rank 1's refusal saying it runs with TLS", errs[0])
			}
		})
	}
}

// floodSize is how many stranger connections TestStrangerFlood opens
// before the real root: several times the handshakes a receiver runs at
// once.
const floodSize = 4 * handshake.MaxInFlight

// flood opens n connections to addr (loopback only) that stall: half say
// nothing, half send the first bytes of a hello and then stall (a
// slowloris). It returns them; the caller closes them.
func flood(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	if host, _, _ := net.SplitHostPort(addr); !net.ParseIP(host).IsLoopback() {
		t.Fatalf("flood of %s: loopback only", addr)
	}
	conns := make([]net.Conn, 0, n)
	for i := range n {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("stranger %d: %v", i, err)
		}
		if i%2 == 1 {
			var b [6]byte
			binary.BigEndian.PutUint32(b[:], magic)
			binary.BigEndian.PutUint16(b[4:], version)
			c.Write(b[:])
		}
		conns = append(conns, c)
	}
	return conns
}

// TestStrangerFlood has strangers open several times as many stalled
// connections to rank 1 as it runs handshakes at once, before the real
// root connects, with and without a secret and with TLS: the root is
// still admitted, within seconds (the wait's bound is a minute and a
// stalled handshake's 10 s), and neither end fails.
func TestStrangerFlood(t *testing.T) {
	secret, ca := authtest.Secret(t), authtest.NewCA(t)
	for name, c := range map[string]struct {
		secret *auth.Secret
		ca     *authtest.CA
	}{"no secret": {nil, nil}, "secret": {secret, nil}, "TLS and secret": {secret, ca}} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cfgs := authtest.Secure(t, transporttest.Configs(t.Name(), 2, time.Minute), c.secret, c.ca)
			var logs authtest.LogBuffer
			cfgs[1].Logger = logs.Logger()
			var (
				rx    transport.Endpoint
				rxErr error
				wg    sync.WaitGroup
			)
			wg.Go(func() { rx, rxErr = Open(ctx, cfgs[1]) })
			addr, err := cfgs[0].Exchange.Get(ctx, 1, AddrKey)
			if err != nil {
				t.Fatal(err)
			}
			conns := flood(t, string(addr), floodSize)
			defer func() {
				for _, c := range conns {
					c.Close()
				}
			}()
			start := time.Now()
			root, err := Open(ctx, cfgs[0])
			wg.Wait()
			if err != nil || rxErr != nil {
				t.Fatalf("after a flood of %d strangers: root %v, receiver %v", floodSize, err, rxErr)
			}
			defer root.Close()
			defer rx.Close()
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("the root took %v to open after the flood", d)
			}
			bufs := hostBufs(t, 2, 100)
			copy(bufs[0].Host(), "hello")
			if err := errors.Join(broadcastAll(ctx, []transport.Endpoint{root, rx}, 0, bufs, 5)...); err != nil {
				t.Fatal(err)
			}
		})
	}
}
