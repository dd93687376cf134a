package stages

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/timeline"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/inproc"
	"github.com/weightcast/weightcast/wire"
)

// The tests below need a GPU; gputest.Device skips them, saying why, where
// CUDA is absent.

// devLoop is a test-only device transport between goroutines of one
// process: the root waits for its bucket's fence and hands the buffer to
// every receiver, which copies it into its own device buffer on its own
// stream (device to device, or host to device from a host root).
type devLoop struct {
	inbox []chan devDelivery
}

type devDelivery struct {
	seq  uint64
	buf  mem.Buffer
	n    int
	done chan error
}

type devLoopEP struct {
	h      *devLoop
	rank   int
	stream *gpu.Stream
}

func newDevLoop(t testing.TB, d *gpu.CUDADevice, world int) []transport.Endpoint {
	h := &devLoop{inbox: make([]chan devDelivery, world)}
	eps := make([]transport.Endpoint, world)
	for r := range world {
		h.inbox[r] = make(chan devDelivery)
		eps[r] = &devLoopEP{h: h, rank: r, stream: gputest.Stream(t, d)}
	}
	return eps
}

func (e *devLoopEP) Broadcast(ctx context.Context, seq uint64, buf mem.Buffer, n int) error {
	if e.rank != 0 {
		select {
		case d := <-e.h.inbox[e.rank]:
			err := e.copyIn(ctx, d, seq, buf, n)
			d.done <- err
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if ev := gpu.FenceOf(buf); ev != nil {
		if err := ev.Wait(ctx); err != nil {
			return err
		}
	}
	done := make(chan error, len(e.h.inbox))
	for r := 1; r < len(e.h.inbox); r++ {
		select {
		case e.h.inbox[r] <- devDelivery{seq: seq, buf: buf, n: n, done: done}:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	var errs []error
	for r := 1; r < len(e.h.inbox); r++ {
		select {
		case err := <-done: // a receiver answers once it copied, or released a lent buffer
			errs = append(errs, err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return errors.Join(errs...)
}

func (e *devLoopEP) copyIn(ctx context.Context, d devDelivery, seq uint64, buf mem.Buffer, n int) error {
	if d.seq != seq || d.n != n {
		return fmt.Errorf("root sent bucket %d of %d bytes, receiver %d expected %d of %d", d.seq, d.n, e.rank, seq, n)
	}
	var err error
	if h := d.buf.Host(); h != nil {
		err = e.stream.CopyHtoD(buf, 0, h[:n])
	} else {
		err = e.stream.CopyDtoD(buf, 0, gpu.Unfence(d.buf), 0, n)
	}
	if err != nil {
		return err
	}
	return e.stream.Sync(ctx)
}

func (e *devLoopEP) Close() error { return nil }

// newGPUGroup is a sender and world-1 receivers in this process over
// devLoop and the inproc metadata bus; the root's buckets are host memory
// when rootHost is set, every receiver's are on the GPU.
func newGPUGroup(t testing.TB, d *gpu.CUDADevice, world, bucket int, rootHost, sum bool, wrap func(int, transport.Endpoint) transport.Endpoint) *group {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("%s-%d", t.Name(), groupID.Add(1))
	eps := newDevLoop(t, d, world)
	g := &group{}
	for r := range world {
		cfg := transport.Config{Group: name, Rank: r, WorldSize: world, Device: mem.Host{}, Timeout: 20 * time.Second}
		var dev mem.Device = d
		if r == 0 && rootHost {
			dev = mem.Host{}
		}
		pool, err := NewPool(dev, DefaultBuffers, bucket)
		if err != nil {
			t.Fatal(err)
		}
		g.pools = append(g.pools, pool)
		ep := eps[r]
		if wrap != nil {
			ep = wrap(r, ep)
		}
		if r == 0 {
			pub, err := inproc.OpenPublisher(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			g.closers = append(g.closers, pub.Close)
			g.sender = NewSender(SenderConfig{Endpoint: ep, Publisher: pub, Pool: pool, Checksum: sum})
		} else {
			sub, err := inproc.OpenSubscriber(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			g.closers = append(g.closers, sub.Close)
			g.receivers = append(g.receivers, NewReceiver(ReceiverConfig{Endpoint: ep, Subscriber: sub, Pool: pool, Rank: r}))
		}
	}
	t.Cleanup(g.close)
	return g
}

// roundCancel runs one round on every rank of g, cancelling all ranks as
// soon as one fails (so that a failure ends the test at once), and returns
// the errors.
func roundCancel(ctx context.Context, g *group, src Source, version uint64, sinks []Sink) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(g.receivers)+1)
	wg.Go(func() {
		if _, errs[0] = g.sender.Sync(ctx, src, version); errs[0] != nil {
			cancel()
		}
	})
	for i, r := range g.receivers {
		wg.Go(func() {
			st, err := r.Sync(ctx, sinks[i])
			if err == nil && st.Version != version {
				err = fmt.Errorf("receiver %d committed version %d, want %d", i+1, st.Version, version)
			}
			if err != nil {
				errs[i+1] = fmt.Errorf("rank %d: %w", i+1, err)
				cancel()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// hostLookup finds expected tensors by name.
type hostLookup map[string]*Tensor

func (h hostLookup) Lookup(name string) (*Tensor, bool) { t, ok := h[name]; return t, ok }

func (h hostLookup) List() []*Tensor {
	out := make([]*Tensor, 0, len(h))
	for _, t := range h {
		out = append(out, t)
	}
	return out
}

// placeOnDevice gives ts a place on d, as device tensors named "dev."+name
// of the same dtypes and shapes (their bytes not uploaded): the first
// shared of them in one buffer, each i%gaps bytes after the one before
// (odd offsets included), the others in allocations of their own, and
// zero-byte ones anywhere in the shared buffer.
func placeOnDevice(t *testing.T, d *gpu.CUDADevice, ts tensorList, shared, gaps int) tensorList {
	t.Helper()
	var size int64
	offs := make([]int64, shared)
	for i, tn := range ts[:shared] {
		offs[i] = size + int64(i%gaps)
		size = offs[i] + int64(len(tn.Data))
	}
	flat := gputest.Alloc(t, d, int(size)+1)
	out := make(tensorList, len(ts))
	for i, tn := range ts {
		dev := &Tensor{Name: "dev." + tn.Name, DType: tn.DType, Shape: tn.Shape}
		switch {
		case i < shared:
			dev.Device, dev.DeviceOffset = flat, offs[i]
		case len(tn.Data) > 0:
			dev.Device = gputest.Alloc(t, d, len(tn.Data))
		default:
			dev.Device = flat
		}
		out[i] = dev
	}
	return out
}

// devicePool makes a pool of buffers device buckets of bucket bytes on d,
// closed when tb ends.
func devicePool(tb testing.TB, d *gpu.CUDADevice, buffers, bucket int) *Pool {
	tb.Helper()
	pool, err := NewPool(d, buffers, bucket)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { pool.Close() })
	return pool
}

// TestGPURoundTrip sends host tensors and device tensors (some sharing one
// buffer, some on their own) of random dtypes and sizes, some split across
// buckets, from device buckets to a device model, a host model and a
// verifier; the second round changes every tensor's bytes, which the models
// must take in place.
func TestGPURoundTrip(t *testing.T) {
	d := gputest.Device(t)
	s := gputest.Stream(t, d)
	const bucket = 1 << 20
	rng := rand.New(rand.NewPCG(5, 6))
	hostTs := randomTensors(rng, 300, 3*bucket)
	devTs := randomTensors(rng, 200, 3*bucket)
	// The first half of the device tensors share one buffer (odd offsets
	// included), the rest have their own.
	devs := placeOnDevice(t, d, devTs, 100, 3)
	exp := hostLookup{}
	var src tensorList
	for i := range 300 {
		src = append(src, hostTs[i])
		exp[hostTs[i].Name] = hostTs[i]
		if i < len(devs) {
			dev, dt := devs[i], devTs[i]
			exp[dev.Name] = &Tensor{Name: dev.Name, DType: dt.DType, Shape: dt.Shape, Data: dt.Data}
			src = append(src, dev)
		}
	}
	upload := func() {
		for _, tn := range src {
			if tn.Device != nil {
				gputest.Upload(t, s, tn.Device, int(tn.DeviceOffset), exp[tn.Name].Data)
			}
		}
		gputest.Sync(t, s)
	}
	upload()
	g := newGPUGroup(t, d, 4, bucket, false, true, nil)
	dm := newDevModel(t, d)
	hm := newMemModel()
	vs := verify(exp)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for round := uint64(1); round <= 2; round++ {
		if round == 2 {
			for _, tn := range exp {
				for i := range tn.Data {
					tn.Data[i] ^= byte(i*7 + 1)
				}
			}
			upload()
		}
		if err := roundCancel(ctx, g, src, round, []Sink{dm, hm, vs}); err != nil {
			t.Fatal(err)
		}
		st, err := dm.Verify(ctx, exp)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		var total int64
		for _, tn := range exp {
			total += int64(len(tn.Data))
			got, ok := hm.Get(tn.Name)
			if !ok || !bytes.Equal(got.Data, tn.Data) {
				t.Fatalf("round %d: host model's %s differs", round, tn.Name)
			}
		}
		if st.Bytes != total || st.Tensors != len(exp) {
			t.Fatalf("round %d: device model verified %d tensors, %d bytes; want %d, %d", round, st.Tensors, st.Bytes, len(exp), total)
		}
		if dm.Version() != round {
			t.Fatalf("device model at version %d after round %d", dm.Version(), round)
		}
		one, err := dm.ReadHost(ctx, src[1].Name)
		if err != nil || !bytes.Equal(one, exp[src[1].Name].Data) {
			t.Fatalf("ReadHost(%s): %v", src[1].Name, err)
		}
	}
	if dm.Allocations() != len(exp) || hm.Allocations() != len(exp) {
		t.Fatalf("allocations: device %d, host %d, for %d tensors: not updated in place", dm.Allocations(), hm.Allocations(), len(exp))
	}
	for r, p := range g.pools {
		if p.MaxHeld() > DefaultBuffers || p.Held() != 0 {
			t.Fatalf("rank %d: max held %d, held %d", r, p.MaxHeld(), p.Held())
		}
	}
	path, failure := gpu.LastBatchPath()
	t.Logf("%d tensors, %d verified bytes per rank per round; copies queued with %v (batch failure: %v)", len(exp), vs.Bytes/2, path, failure)
}

// TestGPUSynthetic sends a synthetic model (bytes generated on demand,
// tensors larger than a bucket and than the staging buffers) to a
// device model and a verifier fed through host staging.
func TestGPUSynthetic(t *testing.T) {
	d := gputest.Device(t)
	m := synthetic(t, 96<<20, 50, 3, dtype.BF16, dtype.F32)
	g := newGPUGroup(t, d, 3, 8<<20, false, false, nil)
	dm := newDevModel(t, d)
	vs := verify(m)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for round := uint64(1); round <= 2; round++ {
		start := time.Now()
		if err := roundCancel(ctx, g, m, round, []Sink{dm, vs}); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: %d bytes in %v", round, m.Size(), time.Since(start).Round(time.Millisecond))
	}
	st, err := dm.Verify(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	if st.Bytes != m.Size() || vs.Bytes != 2*m.Size() {
		t.Fatalf("verified %d bytes on the device and %d on the host; model %d bytes, 2 rounds", st.Bytes, vs.Bytes, m.Size())
	}
}

// TestGPUChecksum sends buckets with checksums to receivers with device
// buckets, from a root with host buckets (checksummed on the CPU) and from
// one with device buckets (checksummed on its GPU, each checksum equal to
// checksum.Sum of the bucket's bytes). A clean round passes on every rank;
// a byte flipped on a receiver's GPU after the transfer fails the round
// naming the checksum, whether the receiver checks it on the GPU (a device
// sink) or on the host (a host sink).
func TestGPUChecksum(t *testing.T) {
	d := gputest.Device(t)
	s := gputest.Stream(t, d)
	for _, rootHost := range []bool{true, false} {
		t.Run(map[bool]string{true: "host root", false: "device root"}[rootHost], func(t *testing.T) {
			rng := rand.New(rand.NewPCG(8, 9))
			src := randomTensors(rng, 150, 900<<10)
			exp := hostLookup{}
			for _, tn := range src {
				exp[tn.Name] = tn
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			g := newGPUGroup(t, d, 3, 1<<20, rootHost, true, nil)
			dm := newDevModel(t, d)
			if err := roundCancel(ctx, g, src, 1, []Sink{dm, verify(exp)}); err != nil {
				t.Fatal(err)
			}
			if _, err := dm.Verify(ctx, exp); err != nil {
				t.Fatal(err)
			}
			if !rootHost {
				checkPackedSums(t, d, src)
			}
			for _, sink := range []string{"device", "host"} {
				corrupt := func(r int, ep transport.Endpoint) transport.Endpoint {
					if r != 1 {
						return ep
					}
					return &flipEndpoint{Endpoint: ep, seq: 2, s: s}
				}
				g2 := newGPUGroup(t, d, 2, 1<<20, rootHost, true, corrupt)
				var sk Sink = newMemModel()
				if sink == "device" {
					dm2 := newDevModel(t, d)
					sk = dm2
				}
				err := roundCancel(ctx, g2, src, 1, []Sink{sk})
				if err == nil || !bytesContain(err.Error(), "failed its checksum") {
					t.Fatalf("%s sink: a byte flipped in a device bucket went unnoticed: %v", sink, err)
				}
				t.Logf("%s sink, expected: %v", sink, err)
			}
		})
	}
}

// checkPackedSums packs src into device buckets with checksums and checks
// that each bucket's checksum, computed on the GPU and completed as
// Publish completes it, is checksum.Sum of the bucket's bytes.
func checkPackedSums(t *testing.T, d *gpu.CUDADevice, src tensorList) {
	t.Helper()
	pool, err := NewPool(d, DefaultBuffers, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	n := 0
	pk := testPacker(t, defaultPlan, gpu.DefaultStagingConfig())
	err = packRound(src, PackConfig{Pool: pool, Version: 1, Checksum: true}, pk, func(ctx context.Context, rb *gpu.Readback, bk *Bucket) error {
		if !bk.Meta.HasChecksum || bk.sum == nil {
			return fmt.Errorf("bucket %d: no checksum pending on the GPU (HasChecksum %v)", bk.Meta.Seq, bk.Meta.HasChecksum)
		}
		sum, err := bk.sum.Wait(ctx) // as Publish does
		if err != nil {
			return err
		}
		bk.Meta.Checksum = sum
		host, err := rb.Read(ctx, bk.Buf, int(bk.Meta.Length))
		if err != nil {
			return err
		}
		if want := checksum.Sum(host); bk.Meta.Checksum != want {
			return fmt.Errorf("bucket %d (%d bytes): GPU checksum %x, checksum.Sum %x", bk.Meta.Seq, bk.Meta.Length, bk.Meta.Checksum, want)
		}
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d buckets, each checksum computed on the GPU equal to checksum.Sum of its bytes", n)
}

// flipEndpoint flips one byte of bucket seq on the GPU after it landed.
type flipEndpoint struct {
	transport.Endpoint
	seq uint64
	s   *gpu.Stream
}

func (f *flipEndpoint) Broadcast(ctx context.Context, seq uint64, buf mem.Buffer, n int) error {
	err := f.Endpoint.Broadcast(ctx, seq, buf, n)
	if err != nil || seq != f.seq || n == 0 {
		return err
	}
	var b [1]byte
	if err := f.s.CopyDtoH(b[:], buf, n/2); err != nil {
		return err
	}
	if err := f.s.Sync(ctx); err != nil {
		return err
	}
	if err := f.s.Memset(buf, n/2, 1, b[0]^0x10); err != nil {
		return err
	}
	return f.s.Sync(ctx)
}

func bytesContain(s, sub string) bool { return bytes.Contains([]byte(s), []byte(sub)) }

// TestGPUReleaseAfterCopy checks that Load gives a device bucket back only
// after the device model's copy out of it has completed: the release hook
// queries the model's fence, and the bucket is overwritten right after
// release without touching the model's bytes.
func TestGPUReleaseAfterCopy(t *testing.T) {
	d := gputest.Device(t)
	s := gputest.Stream(t, d)
	const n = 256 << 20 // a copy long enough to be caught in flight
	pool := devicePool(t, d, 1, n)
	want := make([]byte, n)
	rand.NewChaCha8([32]byte{1}).Read(want)
	dm := newDevModel(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for round := range 3 {
		buf, err := pool.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		gputest.Upload(t, s, buf, 0, want)
		gputest.Sync(t, s)
		meta := wire.BucketMeta{Seq: uint64(round), Version: uint64(round + 1), Length: n, IsLast: true,
			Entries: []wire.Entry{{Name: "w", DType: dtype.U8, Shape: []int64{n}, Offset: 0, Size: n, Total: n}}}
		b := pool.Bucket(buf, meta)
		var (
			released  bool
			copyDone  bool
			queryErr  error
			releaseMu sync.Mutex
		)
		put := b.put
		b.put = func(buf mem.Buffer) {
			releaseMu.Lock()
			released = true
			copyDone, queryErr = dm.fence.Query()
			releaseMu.Unlock()
			// Overwrite at once, as the next bucket would.
			s.Memset(buf, 0, n, 0xEE)
			put(buf)
		}
		u, err := newBucketCheck(nil).unpack(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		if u.Views[0].Device == nil || u.Views[0].Data != nil {
			t.Fatal("unpack of a device bucket did not yield a device view")
		}
		if err := (&loadRound{sinks: []Sink{dm}}).deliverNow(ctx, u); err != nil {
			t.Fatal(err)
		}
		u.Release()
		gputest.Sync(t, s)
		if !released || queryErr != nil || !copyDone {
			t.Fatalf("round %d: released %v with the model's copy done=%v (%v)", round, released, copyDone, queryErr)
		}
		got, err := dm.ReadHost(ctx, "w")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("round %d: the model's bytes changed when the released bucket was overwritten", round)
		}
		want[round] ^= 0xFF // next round differs
	}
	if dm.Allocations() != 1 {
		t.Fatalf("%d allocations for one tensor over 3 rounds", dm.Allocations())
	}
}

// checkPacked runs iterate → pack over src into device buckets from pool
// with pk's state, reads every bucket back to the host and compares each
// entry's bytes with exp; it returns the number of buckets.
func checkPacked(t *testing.T, src tensorList, exp map[string][]byte, pool *Pool, pk *Packer) int {
	return checkPackedWith(t, src, exp, pool, pk, false)
}

// checkPackedWith is checkPacked, with checksums when sum is set: each
// bucket's, waited for as Publish waits, must be checksum.Sum of the bytes
// read back.
func checkPackedWith(t *testing.T, src tensorList, exp map[string][]byte, pool *Pool, pk *Packer, sum bool) int {
	t.Helper()
	got := map[string]int64{}
	buckets := 0
	err := packRound(src, PackConfig{Pool: pool, Version: 1, Checksum: sum}, pk, func(ctx context.Context, rb *gpu.Readback, bk *Bucket) error {
		if gpu.FenceOf(bk.Buf) == nil {
			return fmt.Errorf("bucket %d carries no fence", bk.Meta.Seq)
		}
		host, err := rb.Read(ctx, bk.Buf, int(bk.Meta.Length)) // after the fence
		if err != nil {
			return err
		}
		if sum {
			if bk.sum == nil {
				return fmt.Errorf("bucket %d: no checksum pending on the GPU", bk.Meta.Seq)
			}
			v, err := bk.sum.Wait(ctx)
			if err != nil {
				return err
			}
			if want := checksum.Sum(host); v != want {
				return fmt.Errorf("bucket %d (%d bytes): GPU checksum %x, checksum.Sum %x", bk.Meta.Seq, bk.Meta.Length, v, want)
			}
		}
		for _, e := range bk.Meta.Entries {
			want := exp[e.Name][e.Chunk : e.Chunk+e.Size]
			if i := gputest.FirstDiff(host[e.Offset:e.Offset+e.Size], want); i >= 0 {
				return fmt.Errorf("bucket %d: %s bytes [%d, %d): byte %d differs", bk.Meta.Seq, e.Name, e.Chunk, e.Chunk+e.Size, e.Chunk+int64(i))
			}
			got[e.Name] += e.Size
		}
		buckets++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range exp {
		if got[name] != int64(len(data)) {
			t.Fatalf("%s: %d of %d bytes packed", name, got[name], len(data))
		}
	}
	return buckets
}

// TestGPUPackPlans packs device tensors (tiny to 3 MiB, split across 1 MiB
// buckets; some sharing one buffer at odd offsets, some in their own
// allocations) and host tensors through every device copy plan: all
// device copies through the gather kernel, the short ones only, none
// (cuMemcpyBatchAsync, the path before the kernel), and per-copy
// cuMemcpyAsync. Every bucket is read back and compared byte for byte.
func TestGPUPackPlans(t *testing.T) {
	d := gputest.Device(t)
	s := gputest.Stream(t, d)
	rng := rand.New(rand.NewPCG(7, 8))
	devTs := randomTensors(rng, 240, 3<<20)
	hostTs := randomTensors(rng, 40, 64<<10)
	exp := map[string][]byte{}
	var src tensorList
	for i, tn := range placeOnDevice(t, d, devTs, 80, 5) {
		data := devTs[i].Data
		gputest.Upload(t, s, tn.Device, int(tn.DeviceOffset), data)
		exp[tn.Name] = data
		src = append(src, tn)
		if i%6 == 0 {
			h := hostTs[i/6]
			h.Name = "host." + h.Name
			exp[h.Name] = h.Data
			src = append(src, h)
		}
	}
	gputest.Sync(t, s)
	for _, plan := range []devicePlan{
		{gatherBelow: math.MaxInt64},
		{gatherBelow: 256 << 10},
		{gatherBelow: 0},
		{gatherBelow: 0, perCopy: true},
		{gatherBelow: 256 << 10, perCopy: true},
		{gatherBelow: 0, lanes: 3, laneAbove: 4096},
		{gatherBelow: 16 << 10, lanes: 2, laneAbove: 16 << 10},
	} {
		for _, sum := range []bool{false, true} {
			t.Run(fmt.Sprintf("gatherBelow=%d,perCopy=%v,lanes=%d,checksum=%v", plan.gatherBelow, plan.perCopy, plan.lanes, sum), func(t *testing.T) {
				pk := testPacker(t, plan, gpu.DefaultStagingConfig())
				pool := devicePool(t, d, DefaultBuffers, 1<<20)
				n := checkPackedWith(t, src, exp, pool, pk, sum)
				path, why := gpu.LastGatherPath()
				if plan.gatherBelow > 0 && path != gpu.GatherKernel {
					t.Fatalf("device copies queued with %v: %v", path, why)
				}
				// With a checksum and the kernel, every device copy goes
				// through the fused kernel, the checksum in the same pass.
				if fused := pk.dev != nil && pk.dev.fuse; fused != (sum && plan.gatherBelow > 0) {
					t.Fatalf("fused copies and checksum: %v, want %v", fused, sum && plan.gatherBelow > 0)
				}
				batch, failure := gpu.LastBatchPath()
				t.Logf("%d tensors in %d buckets, byte-identical; gather: %v (%v); copy engine: %v (batch failure: %v)", len(src), n, path, why, batch, failure)
			})
		}
	}
}

// TestGPUCastDevice sends device tensors through Cast (f32 → bf16 and
// f16, bf16 ↔ f16, widening to f32) in device buckets: the GPU cast kernel
// converts them while packing, tensors larger than a bucket included, and
// every receiver holds exactly what cast.Convert gives on the host.
func TestGPUCastDevice(t *testing.T) {
	d := gputest.Device(t)
	s := gputest.Stream(t, d)
	rng := rand.New(rand.NewPCG(12, 13))
	const bucket = 1 << 20
	for _, to := range []dtype.DType{dtype.BF16, dtype.F16, dtype.F32} {
		t.Run(to.String(), func(t *testing.T) {
			var src tensorList
			var want []*Tensor
			for i, from := range []dtype.DType{dtype.F32, dtype.BF16, dtype.F16, dtype.F32, dtype.I32} {
				elems := []int64{1, 7, 1000, 300_001, 0}[i]
				data := gputest.RandomBytes(rng, int(elems)*from.Size())
				buf := gputest.Alloc(t, d, max(len(data), 1)+2*from.Size())
				off := int64(from.Size()) // not at the allocation's start
				if len(data) > 0 {
					gputest.Upload(t, s, buf, int(off), data)
				}
				name := fmt.Sprintf("t%d.%s", i, from)
				src = append(src, &Tensor{Name: name, DType: from, Shape: []int64{elems}, Device: buf, DeviceOffset: off})
				host := &Tensor{Name: name, DType: from, Shape: []int64{elems}, Data: data}
				ct, err := Cast(tensorList{host}, to).(*castSource).wrap(host)
				if err != nil {
					t.Fatal(err)
				}
				size, _ := ct.Validate()
				out := make([]byte, size)
				if err := ct.ReadAt(out, 0); err != nil {
					t.Fatal(err)
				}
				want = append(want, &Tensor{Name: name, DType: ct.DType, Shape: ct.Shape, Data: out})
			}
			gputest.Sync(t, s)
			g := newGPUGroup(t, d, 3, bucket, false, true, nil)
			hm := newMemModel()
			dm := newDevModel(t, d)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := roundCancel(ctx, g, Cast(src, to), 1, []Sink{hm, dm}); err != nil {
				t.Fatal(err)
			}
			exp := hostLookup{}
			for _, w := range want {
				exp[w.Name] = w
				got, ok := hm.Get(w.Name)
				if !ok || got.DType != w.DType || !bytes.Equal(got.Data, w.Data) {
					t.Fatalf("%s: received %v differs from cast.Convert's %s", w.Name, got.DType, w.DType)
				}
			}
			if _, err := dm.Verify(ctx, exp); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestGPUTraceSpans traces rounds of device tensors into device buckets
// and a device model: the root's pack spans only time queueing the copies
// (named "queued", with no byte count, so no rate is drawn from them), and
// a "pack (GPU)" lane holds, for every bucket, when the GPU did its copies
// and checksum; the receiver's "load (GPU)" lane holds when its GPU copied
// each bucket into the model, summing it. Both are read back from timed
// events after the round: inside the round, in order, each with its bytes,
// one per bucket. The trace passes the timeline's strict check, and each
// GPU lane reads as one lane.
func TestGPUTraceSpans(t *testing.T) {
	d := gputest.Device(t)
	s := gputest.Stream(t, d)
	rng := rand.New(rand.NewPCG(21, 22))
	ts := randomTensors(rng, 60, 3<<20)
	src := placeOnDevice(t, d, ts, 30, 7)
	for i, tn := range src {
		gputest.Upload(t, s, tn.Device, int(tn.DeviceOffset), ts[i].Data)
	}
	gputest.Sync(t, s)
	tr := pipeline.NewTracer(time.Now())
	g := newGPUGroup(t, d, 2, 1<<20, false, true, nil)
	g.sender.cfg.Tracer = tr
	g.receivers[0].cfg.Tracer = tr
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	inRound := func(round uint64, pid int, stage string) []pipeline.Event {
		var out []pipeline.Event
		for _, e := range spansOf(tr, pid, stage) {
			if e.Args["round"] == round {
				out = append(out, e)
			}
		}
		return out
	}
	for round := uint64(1); round <= 2; round++ {
		before := time.Since(tr.Epoch())
		if err := roundCancel(ctx, g, src, round, []Sink{newDevModel(t, d)}); err != nil {
			t.Fatal(err)
		}
		after := time.Since(tr.Epoch())
		packSpans := inRound(round, 0, "pack")
		for _, e := range packSpans {
			if _, ok := e.Args["bytes"]; ok || !bytesContain(e.Name, "(queued)") {
				t.Fatalf("round %d: pack span %q (%v) claims bytes or is not labelled as queueing", round, e.Name, e.Args)
			}
		}
		for _, lane := range []struct {
			pid  int
			name string
		}{{0, "pack (GPU)"}, {1, "load (GPU)"}} {
			gpuSpans := inRound(round, lane.pid, lane.name)
			if len(gpuSpans) == 0 || len(gpuSpans) != len(packSpans) {
				t.Fatalf("round %d: %d %s spans for %d buckets", round, len(gpuSpans), lane.name, len(packSpans))
			}
			var end float64
			for i, e := range gpuSpans {
				n, _ := e.Args["bytes"].(int64)
				if e.Dur <= 0 || n <= 0 && i < len(gpuSpans)-1 {
					t.Fatalf("round %d: %s span %q lasts %v µs for %d bytes", round, lane.name, e.Name, e.Dur, n)
				}
				if e.Ts < float64(before.Microseconds())-100 || e.Ts+e.Dur > float64(after.Microseconds())+100 || e.Ts < end-1 {
					t.Fatalf("round %d: %s span %q at [%v, %v] µs, outside the round [%v, %v] or before the previous one's end %v",
						round, lane.name, e.Name, e.Ts, e.Ts+e.Dur, before.Microseconds(), after.Microseconds(), end)
				}
				end = e.Ts + e.Dur
			}
			t.Logf("round %d: %d buckets; the first on the GPU (%s) for %.1f µs", round, len(gpuSpans), lane.name, gpuSpans[0].Dur)
		}
	}
	var buf bytes.Buffer
	if err := tr.WriteChrome(&buf, nil); err != nil {
		t.Fatal(err)
	}
	if err := timeline.Validate(bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	trace, err := timeline.Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	lanes := map[string]int{}
	for _, p := range trace.Processes {
		for _, l := range p.Lanes {
			lanes[l.Name]++
		}
	}
	if lanes["pack (GPU)"] != 1 || lanes["load (GPU)"] != 1 {
		t.Fatalf("lanes %v: want one named pack (GPU) and one load (GPU)", lanes)
	}
}

// TestDeviceRoundsOnFakes runs two rounds of the device paths against
// gputest's stand-in CUDA driver, whose "device" memory is host memory, on
// machines without a GPU: device tensors (sharing a buffer, some large
// enough for the copy lanes) and host tensors (some cast from F32 as they
// are packed) into device buckets through the gather kernel, the copy
// engine and the staging ring; checksums where the GPU kernel is
// unavailable (the stand-in runs only the gather kernel), summed on the
// host on both sides; a device sink and a verifier combined with Sinks on
// one receiver (device views for one, host bytes for the other), a host
// model on another; and the trace's pack (GPU) lane. The GPU tests above
// check the same paths, and the kernels, on a GPU.
func TestDeviceRoundsOnFakes(t *testing.T) { gputest.RunWithFakes(t, "TestDeviceRoundsOnFakesChild") }

// TestDeviceRoundsOnFakesChild is the child side of TestDeviceRoundsOnFakes.
func TestDeviceRoundsOnFakesChild(t *testing.T) {
	gputest.InFakeChild(t)
	d := gputest.Device(t)
	s := gputest.Stream(t, d)
	rng := rand.New(rand.NewPCG(31, 32))
	const bucket = 256 << 10
	devTs := randomTensors(rng, 40, 600<<10)
	hostTs := randomTensors(rng, 30, 300<<10)
	devs := placeOnDevice(t, d, devTs, 20, 3)
	exp := hostLookup{}
	var src tensorList
	for i, tn := range devs {
		gputest.Upload(t, s, tn.Device, int(tn.DeviceOffset), devTs[i].Data)
		exp[tn.Name] = &Tensor{Name: tn.Name, DType: tn.DType, Shape: tn.Shape, Data: devTs[i].Data}
		src = append(src, tn)
	}
	gputest.Sync(t, s)
	for i, tn := range hostTs {
		if i%3 == 0 { // cast from F32 as pack copies it: on the host here
			f32 := gputest.RandomBytes(rng, 4*(1+i*97))
			f32[3] &= 0x3f // keep the values finite
			tn = &Tensor{Name: fmt.Sprintf("cast.%d", i), DType: dtype.BF16, SourceDType: dtype.F32, Shape: []int64{int64(len(f32) / 4)}, Data: f32}
			want := make([]byte, len(f32)/2)
			if err := tn.ReadAt(want, 0); err != nil {
				t.Fatal(err)
			}
			exp[tn.Name] = &Tensor{Name: tn.Name, DType: dtype.BF16, Shape: tn.Shape, Data: want}
		} else {
			exp[tn.Name] = tn
		}
		src = append(src, tn)
	}
	tr := pipeline.NewTracer(time.Now())
	g := newGPUGroup(t, d, 3, bucket, false, true, nil)
	g.sender.cfg.Tracer = tr
	g.sender.packer = newPacker(devicePlan{gatherBelow: 64 << 10, lanes: 2, laneAbove: 128 << 10},
		gpu.StagingConfig{Slots: 2, SlotSize: 64 << 10, Piece: 16 << 10, Readers: 3})
	dm := newDevModel(t, d)
	hm := newMemModel()
	vs := verify(exp)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for round := uint64(1); round <= 2; round++ {
		if err := roundCancel(ctx, g, src, round, []Sink{Sinks(dm, vs), hm}); err != nil {
			t.Fatal(err)
		}
		if _, err := dm.Verify(ctx, exp); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for name, w := range exp {
			got, ok := hm.Get(name)
			if !ok || !bytes.Equal(got.Data, w.Data) {
				t.Fatalf("round %d: the host model's %s differs", round, name)
			}
		}
	}
	if vs.Tensors != 2*len(exp) {
		t.Fatalf("the verifier checked %d tensors in two rounds of %d", vs.Tensors, len(exp))
	}
	gpuSpans, packSpans := spansOf(tr, 0, "pack (GPU)"), spansOf(tr, 0, "pack")
	if len(gpuSpans) == 0 || len(gpuSpans) != len(packSpans) {
		t.Fatalf("%d pack (GPU) spans for %d buckets", len(gpuSpans), len(packSpans))
	}
	for _, e := range packSpans {
		if _, ok := e.Args["bytes"]; ok || !bytesContain(e.Name, "(queued)") {
			t.Fatalf("pack span %q (%v) claims bytes or is not labelled as queueing", e.Name, e.Args)
		}
	}
	if pinned := g.sender.packer.dev.ring.Pinned(); pinned != 2 {
		t.Fatalf("the staging ring pinned %d slots over two rounds, want its 2", pinned)
	}
}
