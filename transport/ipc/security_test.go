package ipc

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/auth/authtest"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/internal/handshake"
	"github.com/weightcast/weightcast/transport/transporttest"
)

// These tests need no GPU: the root runs against scripted receivers.

// stranger dials the root's side channel and runs the handshake as side,
// or writes raw when side is nil, and returns what it heard.
func stranger(ctx context.Context, x transport.Exchange, side *handshake.Side, raw string) error {
	addr, err := x.Get(ctx, 0, AddrKey)
	if err != nil {
		return err
	}
	info := struct{ Addr string }{}
	if err := jsonUnmarshal(addr, &info); err != nil {
		return err
	}
	c, err := net.Dial("tcp", info.Addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if side == nil {
		_, err := c.Write([]byte(raw))
		return err
	}
	_, err = handshake.Dial(c, proto, *side, func(handshake.Hello) string { return "" })
	return err
}

// TestRootRefusesStrangers has strangers reach the root before its real
// receivers: hellos of another group, world size, rank out of range, a
// rank with another secret or none, garbage, and a silent connection. Each
// hears why it was refused (the silent one nothing), the root logs them,
// and it opens once the real receivers, holding the secret, arrive.
func TestRootRefusesStrangers(t *testing.T) {
	secret := authtest.Secret(t)
	cfgs := transporttest.Configs(t.Name(), 3, 10*time.Second)
	for r := range cfgs {
		cfgs[r].Auth = authtest.Keys(t, secret, cfgs[r].Group, authtest.Run)
	}
	cfgs[0].Device = &gpu.CUDADevice{}
	var logs authtest.LogBuffer
	cfgs[0].Logger = logs.Logger()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type opened struct {
		ep  transport.Endpoint
		err error
	}
	openc := make(chan opened, 1)
	var wg sync.WaitGroup
	go func() {
		ep, err := Open(ctx, cfgs[0])
		openc <- opened{ep, err}
	}()
	g, keys := cfgs[0].Group, cfgs[1].Auth
	other := authtest.Keys(t, authtest.Secret(t), g, authtest.Run)
	side := func(group string, rank, world int, k *auth.Keys) *handshake.Side {
		return &handshake.Side{Group: group, Rank: rank, World: world, Extra: receiverExtra(1, 0), Keys: k}
	}
	for _, c := range []struct {
		side *handshake.Side
		auth bool
		want string
	}{
		{side("other", 1, 3, keys), false, "group"},
		{side(g, 1, 4, keys), false, "rank 0 says 3"},
		{side(g, 3, 3, keys), false, "outside [1, 3)"},
		{side(g, 1, 3, other), true, "did not prove"},
		{side(g, 2, 3, nil), true, "has one"},
	} {
		err := stranger(ctx, cfgs[1].Exchange, c.side, "")
		if !errors.Is(err, handshake.ErrRejected) || errors.Is(err, auth.ErrFailed) != c.auth || !strings.Contains(err.Error(), c.want) {
			t.Errorf("stranger %+v heard %v; want a refusal saying %q (authentication %v)", *c.side, err, c.want, c.auth)
		}
	}
	if err := stranger(ctx, cfgs[1].Exchange, nil, "\x00\x00\x00\x05\x01garbage"); err != nil {
		t.Fatal(err)
	}
	addr, _ := cfgs[1].Exchange.Get(ctx, 0, AddrKey)
	var info struct{ Addr string }
	jsonUnmarshal(addr, &info)
	silent, err := net.Dial("tcp", info.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()

	for r := 1; r < 3; r++ {
		wg.Go(func() {
			err := fakeReceiver(ctx, cfgs[r].Exchange, g, cfgs[r].Auth, r, 3, func(m bucketMsg) (ack, bool) { return ack{seq: m.seq, ok: true}, true })
			if err != nil {
				t.Errorf("rank %d: %v", r, err)
			}
		})
	}
	// Wait for Open alone: the receivers run until the root closes.
	o := <-openc
	if o.err != nil {
		t.Fatal(o.err)
	}
	ep := o.ep
	if err := ep.Broadcast(ctx, 0, fakeDeviceBuf{64}, 64); err != nil {
		t.Fatal(err)
	}
	ep.Close()
	wg.Wait()
	if !strings.Contains(logs.String(), "refused a connection whose handshake failed") {
		t.Errorf("the refusals were not logged: %q", logs.String())
	}
}

// TestRootDifferentSecret has the only receiver hold another secret: it
// hears "authentication failed" at once, and the root's wait ends saying
// that too.
func TestRootDifferentSecret(t *testing.T) {
	cfgs := transporttest.Configs(t.Name(), 2, time.Second)
	cfgs[0].Auth = authtest.Keys(t, authtest.Secret(t), cfgs[0].Group, authtest.Run)
	cfgs[0].Device = &gpu.CUDADevice{}
	other := authtest.Keys(t, authtest.Secret(t), cfgs[0].Group, authtest.Run)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rerr error
	var wg sync.WaitGroup
	wg.Go(func() {
		rerr = fakeReceiver(ctx, cfgs[1].Exchange, cfgs[1].Group, other, 1, 2, func(m bucketMsg) (ack, bool) { return ack{}, false })
	})
	_, err := Open(ctx, cfgs[0])
	wg.Wait()
	if !errors.Is(rerr, auth.ErrFailed) {
		t.Errorf("the receiver heard %v; want authentication failed", rerr)
	}
	if !errors.Is(err, auth.ErrFailed) || !errors.Is(err, transport.ErrTimeout) || !strings.Contains(err.Error(), "ranks [1] never connected") {
		t.Errorf("the root: %v; want a timeout naming rank 1 and authentication failed", err)
	}
	t.Logf("root: %v", err)
}

// TestReceiverRefusesFakeRoot runs a receiver's side against a stranger
// that listens where the root's address points and cannot prove the
// secret: the receiver fails with "authentication failed".
func TestReceiverRefusesFakeRoot(t *testing.T) {
	cfgs := transporttest.Configs(t.Name(), 2, 5*time.Second)
	k := authtest.Keys(t, authtest.Secret(t), cfgs[0].Group, authtest.Run)
	cfgs[1].Auth = k
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cfgs[0].Exchange.Put(ctx, AddrKey, []byte(`{"addr":"`+ln.Addr().String()+`"}`)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fake := handshake.Side{Group: cfgs[0].Group, Rank: 0, World: 2, Extra: rootExtra(1), Keys: authtest.Keys(t, authtest.Secret(t), cfgs[0].Group, authtest.Run)}
		handshake.Accept(c, proto, fake, func(handshake.Hello) string { return "" })
	})
	_, _, err = dialRoot(ctx, cfgs[1], receiverExtra(1, 0))
	wg.Wait()
	if !errors.Is(err, auth.ErrFailed) {
		t.Fatalf("a receiver dialing a fake root: %v; want authentication failed", err)
	}
}
