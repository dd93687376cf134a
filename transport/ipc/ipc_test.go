package ipc

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"fmt"
	"sync"
	"sync/atomic"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/transporttest"
)

// These tests need no GPU.

func TestFramesRoundTrip(t *testing.T) {
	if ri, err := decodeReceiverExtra(receiverExtra(4242, -1)); err != nil || ri.pid != 4242 || ri.device != -1 || ri.flags != 0 {
		t.Fatalf("receiver's extra: %+v, %v", ri, err)
	}
	uuid := [16]byte{7, 15: 9}
	if ri, err := decodeReceiverExtra(readsDirect(receiverExtra(4242, 2), uuid)); err != nil || ri.pid != 4242 || ri.device != 2 || ri.uuid != uuid || ri.flags != extraReadsDirect {
		t.Fatalf("the extra of a receiver that reads in place: %+v, %v", ri, err)
	}
	if _, err := decodeReceiverExtra(readsDirect(receiverExtra(1, 2), uuid)[:20]); !errors.Is(err, errFrame) {
		t.Fatalf("a cut receiver's extra: %v", err)
	}
	if pid, err := decodeRootExtra(rootExtra(7)); err != nil || pid != 7 {
		t.Fatalf("root's extra: %d, %v", pid, err)
	}
	if _, err := decodeReceiverExtra(rootExtra(7)); !errors.Is(err, errFrame) {
		t.Fatalf("a short receiver's extra: %v", err)
	}
	m := bucketMsg{seq: 9, n: 100, bufLen: 4096, addr: 0x7f00_0000_1000}
	m.handle[0], m.handle[63] = 1, 2
	if got, err := decodeBucket(m.encode()); err != nil || got != m {
		t.Fatalf("bucket: %+v, %v", got, err)
	}
	a := ack{seq: 9, ok: false, msg: strings.Repeat("x", 2000)}
	got, err := decodeAck(a.encode())
	if err != nil || got.seq != 9 || got.ok || len(got.msg) != maxText {
		t.Fatalf("ack: %+v, %v (long texts are cut at %d bytes)", got, err, maxText)
	}
}

func TestFramesRejected(t *testing.T) {
	bad := bucketMsg{seq: 1, n: 5000, bufLen: 4096}
	if _, err := decodeBucket(bad.encode()); !errors.Is(err, errFrame) {
		t.Errorf("bucket longer than its buffer: %v", err)
	}
	if _, err := decodeBucket(bad.encode()[:20]); !errors.Is(err, errFrame) {
		t.Errorf("short bucket frame: %v", err)
	}
	var b bytes.Buffer
	if err := writeFrame(&b, frameAck, make([]byte, maxFrame)); err == nil {
		t.Error("oversized frame written")
	}
	b.Write([]byte{0xff, 0xff, 0xff, 0x7f, frameAck})
	if _, _, err := readFrame(&b); !errors.Is(err, errFrame) {
		t.Errorf("oversized frame read: %v", err)
	}
}

func TestOpenNeedsCUDA(t *testing.T) {
	cfgs := transporttest.Configs(t.Name(), 2, time.Second)
	_, err := Open(context.Background(), cfgs[1])
	var te *transport.Error
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "not a CUDA GPU") {
		t.Fatalf("Open on host memory: %v", err)
	}
	if _, err := transport.Open(context.Background(), Name, transport.Config{Group: "g", Rank: 0, WorldSize: 1, Device: mem.Host{}}); err == nil {
		t.Fatal("a world of one opened")
	}
}

// TestRefuse checks the checks that both ends run before a broadcast: each
// refusal is a *transport.Error naming the group, rank and bucket, with no
// peer at fault, and says what is wrong.
func TestRefuse(t *testing.T) {
	cfg := transport.Config{Group: "g", Rank: 2, WorldSize: 3}
	host, _ := mem.Host{}.Alloc(64)
	earlier := errors.New("the root went away")
	for _, c := range []struct {
		name   string
		closed bool
		broken error
		buf    mem.Buffer
		n      int
		want   string
		is     error
	}{
		{"ok", false, nil, fakeDeviceBuf{64}, 64, "", nil},
		{"empty", false, nil, fakeDeviceBuf{64}, 0, "", nil},
		{"closed", true, earlier, fakeDeviceBuf{64}, 64, "closed", transport.ErrClosed},
		{"broken", false, earlier, fakeDeviceBuf{64}, 64, "unusable after an earlier failure", earlier},
		{"negative", false, nil, fakeDeviceBuf{64}, -1, "length -1 outside the 64-byte buffer", nil},
		{"too long", false, nil, fakeDeviceBuf{64}, 65, "length 65 outside the 64-byte buffer", nil},
		{"host", false, nil, host, 64, "not device memory", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := refuse(cfg, 7, c.closed, c.broken, c.buf, c.n)
			if c.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var te *transport.Error
			if !errors.As(err, &te) || te.Group != "g" || te.Rank != 2 || !te.HasSeq || te.Seq != 7 || te.Peer != -1 || te.Op != "broadcast" {
				t.Fatalf("refuse = %#v; want a *transport.Error for group g, rank 2, bucket 7, no peer", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("refuse = %v; want it to say %q", err, c.want)
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("refuse = %v; want it to wrap %v", err, c.is)
			}
		})
	}
}

// TestConformanceOnFakes runs the suite's cases with every rank a
// goroutine of one process against gputest's stand-in CUDA driver (one
// device whose memory is host memory; its IPC handles work only within one
// process, which is the case receivers in the root's process take), to
// check the suite's GPU memory and this transport's in-process path on
// machines without a GPU. TestConformance is the real thing, on a GPU.
func TestConformanceOnFakes(t *testing.T) { gputest.RunWithFakes(t, "TestConformanceOnFakesChild") }

func TestConformanceOnFakesChild(t *testing.T) {
	gputest.InFakeChild(t)
	s := &transporttest.Suite{Name: Name, Open: Open, Memory: gputest.CUDAMemory{}, Ranks: transporttest.Goroutines}
	s.Run(t)
}

// checkLend opens a root and a receiver on d as goroutines of this process
// and moves four buckets from the root's two buffers by lending them: the
// receiver reads each bucket in the root's buffer, the root's Broadcast
// returns only once the receiver has released it, and a release with an
// error fails the root's broadcast with that error.
func checkLend(t *testing.T, d *gpu.CUDADevice) {
	const size, count = 64 << 10, 4
	s := gputest.Stream(t, d)
	bufs := []mem.Buffer{gputest.Alloc(t, d, size), gputest.Alloc(t, d, size)}
	for i, b := range bufs {
		gputest.Fill(t, s, b, byte(0x31+i))
	}
	g := transporttest.NewGroup(t, "ipc-lend")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eps := make([]transport.Endpoint, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() { eps[r], errs[r] = Open(ctx, g.Config(r, 2, d, 20*time.Second)) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, ep := range eps {
		t.Cleanup(func() { ep.Close() })
	}
	l, ok := eps[1].(transport.Lender)
	if !ok || !l.Lends() {
		t.Fatal("a receiver on the root's GPU does not lend")
	}
	var released atomic.Int64
	wg.Go(func() {
		for seq := range count {
			err := eps[0].Broadcast(ctx, uint64(seq), bufs[seq%2], size)
			if seq == count-1 {
				if err == nil || !strings.Contains(err.Error(), "the receiver gave up") {
					errs[0] = fmt.Errorf("the last bucket, released with an error: Broadcast = %v", err)
				}
				return
			}
			if err != nil || released.Load() != int64(seq+1) {
				errs[0] = fmt.Errorf("bucket %d: Broadcast returned %v with %d buckets released", seq, err, released.Load())
				return
			}
		}
	})
	for seq := range count {
		buf, release, err := l.Lend(ctx, uint64(seq), size)
		if err != nil {
			t.Fatal(err)
		}
		if got := gputest.Download(t, s, buf, size-1, 1)[0]; got != byte(0x31+seq%2) {
			t.Fatalf("bucket %d: the lent buffer ends with %#x, want %#x", seq, got, 0x31+seq%2)
		}
		if seq == count-1 {
			release(errors.New("the receiver gave up"))
			break
		}
		released.Add(1)
		if err := release(nil); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
}

// TestLendOnFakes runs checkLend against gputest's stand-in CUDA driver.
func TestLendOnFakes(t *testing.T) { gputest.RunWithFakes(t, "TestLendOnFakesChild") }

func TestLendOnFakesChild(t *testing.T) {
	gputest.InFakeChild(t)
	checkLend(t, gputest.Device(t))
}
