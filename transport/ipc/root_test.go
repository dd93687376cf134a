package ipc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/internal/handshake"
	"github.com/weightcast/weightcast/transport/transporttest"
)

// These tests need no GPU: the root's side of the protocol runs against
// scripted receivers that speak the wire format, with a buffer that looks
// like device memory (the root only passes its address on).

type fakeDeviceBuf struct{ n int }

func (f fakeDeviceBuf) Len() int           { return f.n }
func (f fakeDeviceBuf) Host() []byte       { return nil }
func (f fakeDeviceBuf) DevicePtr() uint64  { return 0x7f0000000000 }
func (f fakeDeviceBuf) Device() mem.Device { return mem.Host{} }
func (f fakeDeviceBuf) Free() error        { return nil }

// fakeReceiver joins the root as rank and answers each bucket with
// answer(seq), which returns the ack to send, or false to hang up.
func fakeReceiver(ctx context.Context, x transport.Exchange, group string, keys *auth.Keys, rank, world int, answer func(m bucketMsg) (ack, bool)) error {
	raw, err := x.Get(ctx, 0, AddrKey)
	if err != nil {
		return err
	}
	var info rootInfo
	if err := json.Unmarshal(raw, &info); err != nil {
		return err
	}
	c, err := net.Dial("tcp", info.Addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	me := handshake.Side{Group: group, Rank: rank, World: world, Extra: receiverExtra(os.Getpid(), 0), Keys: keys}
	if _, err := handshake.Dial(c, proto, me, func(handshake.Hello) string { return "" }); err != nil {
		return err
	}
	c.SetDeadline(time.Time{})
	for {
		_, p, err := readFrame(c)
		if err != nil {
			return nil // the root closed
		}
		m, err := decodeBucket(p)
		if err != nil {
			return err
		}
		a, ok := answer(m)
		if !ok {
			return nil
		}
		if err := writeFrame(c, frameAck, a.encode()); err != nil {
			return err
		}
	}
}

func openFakeGroup(t *testing.T, world int, timeout time.Duration, answer func(rank int, m bucketMsg) (ack, bool)) transport.Endpoint {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfgs := transporttest.Configs(t.Name(), world, timeout)
	cfgs[0].Device = &gpu.CUDADevice{}
	var wg sync.WaitGroup
	for r := 1; r < world; r++ {
		wg.Go(func() {
			if err := fakeReceiver(context.Background(), cfgs[r].Exchange, cfgs[r].Group, nil, r, world, func(m bucketMsg) (ack, bool) { return answer(r, m) }); err != nil {
				t.Errorf("fake rank %d: %v", r, err)
			}
		})
	}
	ep, err := Open(ctx, cfgs[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ep.Close(); wg.Wait() })
	return ep
}

func TestRootBroadcastAcks(t *testing.T) {
	ep := openFakeGroup(t, 4, 5*time.Second, func(rank int, m bucketMsg) (ack, bool) {
		return ack{seq: m.seq, ok: true}, true
	})
	for seq := range uint64(5) {
		if err := ep.Broadcast(context.Background(), seq, fakeDeviceBuf{1 << 20}, int(seq)*1000); err != nil {
			t.Fatal(err)
		}
	}
	if err := ep.Broadcast(context.Background(), 5, fakeDeviceBuf{10}, 11); err == nil {
		t.Fatal("broadcast of more bytes than the buffer holds succeeded")
	}
}

func TestRootReceiverHangsUp(t *testing.T) {
	ep := openFakeGroup(t, 3, 5*time.Second, func(rank int, m bucketMsg) (ack, bool) {
		return ack{seq: m.seq, ok: true}, !(rank == 2 && m.seq == 1)
	})
	ctx := context.Background()
	if err := ep.Broadcast(ctx, 0, fakeDeviceBuf{64}, 64); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := ep.Broadcast(ctx, 1, fakeDeviceBuf{64}, 64)
	var te *transport.Error
	if !errors.As(err, &te) || te.Peer != 2 || !errors.Is(err, transport.ErrPeerGone) || !te.HasSeq || te.Seq != 1 {
		t.Fatalf("broadcast to a receiver that hung up: %v; want ErrPeerGone from peer 2 at bucket 1", err)
	}
	if time.Since(start) > time.Second {
		t.Fatalf("noticed after %v", time.Since(start))
	}
	if err := ep.Broadcast(ctx, 2, fakeDeviceBuf{64}, 64); err == nil || !strings.Contains(err.Error(), "earlier failure") {
		t.Fatalf("broadcast after a failure: %v", err)
	}
}

// TestRootFailureWaitsForReaders checks that a Broadcast failed by one
// receiver (rank 1 hangs up) returns only once every other receiver told
// of the bucket has acknowledged it (rank 2 holds it a while first): until
// then rank 2 may be reading the root's buffer, which the root's caller
// reuses, or frees, once Broadcast returns.
func TestRootFailureWaitsForReaders(t *testing.T) {
	holding, hold := make(chan struct{}), make(chan struct{})
	var once sync.Once
	let := func() { once.Do(func() { close(hold) }) }
	ep := openFakeGroup(t, 3, 30*time.Second, func(rank int, m bucketMsg) (ack, bool) {
		if rank == 1 {
			return ack{}, false
		}
		close(holding)
		<-hold
		return ack{seq: m.seq, ok: true}, true
	})
	t.Cleanup(let) // before the group's cleanup, which waits for rank 2
	returned := make(chan error, 1)
	go func() { returned <- ep.Broadcast(context.Background(), 0, fakeDeviceBuf{64}, 64) }()
	defer func() { let(); <-returned }()
	<-holding
	select {
	case <-ep.(*root).peers[0].gone: // the root has seen rank 1 hang up
	case <-time.After(10 * time.Second):
		t.Fatal("the root did not see rank 1 hang up within 10s")
	}
	// A root that did not wait for rank 2 would now return at once; one
	// that waits returns only after rank 2 acknowledges. A second is far
	// more than the first needs, even on a loaded machine.
	select {
	case err := <-returned:
		returned <- err
		t.Fatalf("Broadcast returned (%v) while rank 2 still held the bucket", err)
	case <-time.After(time.Second):
	}
	let()
	var err error
	select {
	case err = <-returned:
		returned <- err
	case <-time.After(10 * time.Second):
		t.Fatal("Broadcast did not return within 10s of rank 2's acknowledgement")
	}
	var te *transport.Error
	if !errors.As(err, &te) || te.Peer != 1 || !errors.Is(err, transport.ErrPeerGone) || !te.HasSeq || te.Seq != 0 {
		t.Fatalf("Broadcast = %v; want ErrPeerGone from peer 1 at bucket 0", err)
	}
}

func TestRootReceiverSilent(t *testing.T) {
	const bound = 300 * time.Millisecond
	release := make(chan struct{})
	ep := openFakeGroup(t, 2, bound, func(rank int, m bucketMsg) (ack, bool) {
		<-release
		return ack{}, false
	})
	defer close(release)
	start := time.Now()
	err := ep.Broadcast(context.Background(), 0, fakeDeviceBuf{64}, 64)
	if !errors.Is(err, transport.ErrTimeout) || time.Since(start) > 10*bound {
		t.Fatalf("broadcast to a silent receiver: %v after %v; want ErrTimeout after about %v", err, time.Since(start), bound)
	}
	t.Logf("expected: %v", err)
}

func TestRootReceiverFails(t *testing.T) {
	ep := openFakeGroup(t, 3, 5*time.Second, func(rank int, m bucketMsg) (ack, bool) {
		if rank == 1 {
			return ack{seq: m.seq, ok: false, msg: "cuIpcOpenMemHandle failed"}, true
		}
		return ack{seq: m.seq, ok: true}, true
	})
	err := ep.Broadcast(context.Background(), 0, fakeDeviceBuf{64}, 64)
	if err == nil || !strings.Contains(err.Error(), "cuIpcOpenMemHandle failed") || !strings.Contains(err.Error(), "peer rank 1") {
		t.Fatalf("broadcast with a failing receiver: %v", err)
	}
}

func TestRootCancel(t *testing.T) {
	release := make(chan struct{})
	ep := openFakeGroup(t, 2, time.Minute, func(rank int, m bucketMsg) (ack, bool) {
		<-release
		return ack{}, false
	})
	defer close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := ep.Broadcast(ctx, 0, fakeDeviceBuf{64}, 64); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled broadcast: %v", err)
	}
}

func TestRootNeverJoined(t *testing.T) {
	cfgs := transporttest.Configs(t.Name(), 3, 200*time.Millisecond)
	cfgs[0].Device = &gpu.CUDADevice{}
	_, err := Open(context.Background(), cfgs[0])
	if !errors.Is(err, transport.ErrTimeout) || !strings.Contains(err.Error(), fmt.Sprint([]int{1, 2})) {
		t.Fatalf("open with no receivers: %v", err)
	}
}
