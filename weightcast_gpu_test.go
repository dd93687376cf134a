package weightcast

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/stages"
)

// TestGPURefsIntoHostBuckets sends device tensors handed in by address
// (as a PyTorch caller does) through host buckets over tcp: each is read
// after the memset that another stream queued on it just before the send,
// through the event SendRefs records on that stream.
func TestGPURefsIntoHostBuckets(t *testing.T) {
	d := gputest.Device(t)
	s := gputest.Stream(t, d)
	addr := freeAddr(t)
	o := Options{Group: "gpu-refs", RunID: "g1", Rendezvous: "etcd://" + addr, ServeRendezvous: true, BucketSize: 1 << 20, Device: "cpu", Timeout: 30 * time.Second}
	sender, rs := ranks(t, 2, o)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n, each = 8, 3 << 20 // larger than a bucket: split across buckets
	var refs []Ref
	for i := range n {
		buf := gputest.Alloc(t, d, each)
		if err := s.Memset(buf, 0, each, byte(i+1)); err != nil {
			t.Fatal(err)
		}
		refs = append(refs, Ref{Name: fmt.Sprintf("w%d", i), DType: "U8", Shape: []int64{each}, Addr: buf.DevicePtr(), Device: d.Ordinal(), Stream: s.Handle(), Bytes: each})
	}
	model := stages.NewHostModel()
	err := syncRound(ctx, sender, rs, func(ctx context.Context) error { _, err := sender.SendRefs(ctx, refs, 1); return err }, []stages.Sink{model})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		got, ok := model.Get(fmt.Sprintf("w%d", i))
		if !ok || !bytes.Equal(got.Data, bytes.Repeat([]byte{byte(i + 1)}, each)) {
			t.Fatalf("w%d differs: read before the memset queued on the caller's stream had run", i)
		}
	}
}

// BenchmarkGPUPackRefs packs 1 GiB of device tensors handed in by address
// (64 of 16 MiB, the path PyTorch tensors take through SendRefs: views,
// an event on the caller's stream) into 256 MiB device buckets, against
// one plain device-to-device copy of the same bytes; both in GB/s.
func BenchmarkGPUPackRefs(b *testing.B) { benchPackRefs(b, 1<<30, 16<<20, 256<<20) }

// BenchmarkGPUPackRefs16GiB is BenchmarkGPUPackRefs at the size of a real
// model: 16 GiB of 256 MiB tensors into 1 GiB buckets.
func BenchmarkGPUPackRefs16GiB(b *testing.B) { benchPackRefs(b, 16<<30, 256<<20, 1<<30) }

func benchPackRefs(b *testing.B, total, each, bucket int) {
	d := gputest.Device(b)
	st := gputest.Stream(b, d)
	var refs []Ref
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range total / each {
		buf := gputest.Alloc(b, d, each)
		gputest.Upload(b, st, buf, 0, gputest.RandomBytes(rng, 4096))
		refs = append(refs, Ref{Name: fmt.Sprintf("layers.%d.weight", i), DType: "BF16", Shape: []int64{int64(each / 2)}, Addr: buf.DevicePtr(), Device: d.Ordinal(), Stream: st.Handle()})
	}
	gputest.Sync(b, st)
	b.Run("plainD2D", func(b *testing.B) {
		src, dst := gputest.Alloc(b, d, total), gputest.Alloc(b, d, total)
		b.SetBytes(int64(total))
		for b.Loop() {
			if err := st.CopyDtoD(dst, 0, src, 0, total); err != nil {
				b.Fatal(err)
			}
			gputest.Sync(b, st)
		}
		b.ReportMetric(float64(total)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
	})
	b.Run("pack", func(b *testing.B) {
		pool, err := stages.NewPool(d, stages.DefaultBuffers, bucket)
		if err != nil {
			b.Fatal(err)
		}
		defer pool.Close()
		s := &Sender{member: &member{dev: d, opts: Options{Timeout: time.Minute}}, devs: map[int]*gpu.CUDADevice{}, reads: map[int]*gpu.Stream{}}
		src := refSource{s: s, refs: refs}
		// A Sender keeps its Packer (streams, kernels' memory) from round
		// to round; so does this benchmark, or it would time their set-up.
		pk := stages.NewPacker()
		defer pk.Close()
		for range 3 {
			packRefs(b, pk, src, pool)
		}
		b.SetBytes(int64(total))
		b.ResetTimer()
		for b.Loop() {
			packRefs(b, pk, src, pool)
		}
		b.ReportMetric(float64(total)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
	})
}

// packRefs packs one round of src into pool's buckets with pk and waits
// for each bucket's copies.
func packRefs(b *testing.B, pk *stages.Packer, src stages.Source, pool *stages.Pool) {
	p := pipeline.New("pack refs")
	buckets := pk.Pack(p, stages.Iterate(p, src), stages.PackConfig{Pool: pool, Version: 1})
	pipeline.Sink(p, "fence", buckets, func(ctx context.Context, in *pipeline.Input[*stages.Bucket]) error {
		for bk := range in.All() {
			var err error
			if ev := gpu.FenceOf(bk.Buf); ev != nil {
				err = ev.Wait(ctx)
			}
			bk.Release()
			if err != nil {
				return err
			}
		}
		return in.Err()
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.Run(ctx); err != nil {
		b.Fatal(err)
	}
}

// TestRefsOnFakes runs TestGPURefsIntoHostBuckets against gputest's
// stand-in CUDA driver, so machines without a GPU check tensors by address
// (RecordOn on the caller's stream, device-to-host reads) too.
func TestRefsOnFakes(t *testing.T) { gputest.RunWithFakes(t, "TestGPURefsIntoHostBuckets") }

// TestGPUReceiveInto receives rounds straight into device tensors handed
// in by address, as a PyTorch rollout worker's parameters are: device
// tensors sent by address from the same GPU over ipc land byte for byte in
// the receivers' own allocations, two rounds, in place; then a received
// tensor the receiver does not hold fails the round on every rank, naming
// it.
func TestGPUReceiveInto(t *testing.T) {
	d := gputest.Device(t)
	st := gputest.Stream(t, d)
	addr := freeAddr(t)
	o := Options{Group: "gpu-into", RunID: "g1", Rendezvous: "etcd://" + addr, ServeRendezvous: true, BucketSize: 1 << 20,
		Device: fmt.Sprintf("cuda:%d", d.Ordinal()), Transport: "ipc", Timeout: 30 * time.Second}
	sender, rs := ranks(t, 3, o)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rng := rand.New(rand.NewPCG(7, 8))
	sizes := []int{0, 4, 1000, 1 << 20, 3<<20 + 8, 64 << 10}
	var src []Ref
	var srcBufs []mem.Buffer
	for i, n := range sizes {
		b := gputest.Alloc(t, d, max(n, 1))
		srcBufs = append(srcBufs, b)
		src = append(src, Ref{Name: fmt.Sprintf("p%d", i), DType: "U8", Shape: []int64{int64(n)}, Addr: b.DevicePtr(), Device: d.Ordinal(), Stream: st.Handle(), Bytes: int64(n)})
	}
	dst := make([][]Ref, len(rs))
	dstBufs := make([][]mem.Buffer, len(rs))
	for i := range rs {
		for j, r := range src {
			b := gputest.Alloc(t, d, max(sizes[j], 1))
			dstBufs[i] = append(dstBufs[i], b)
			r.Addr = b.DevicePtr()
			dst[i] = append(dst[i], r)
		}
	}
	round := func(version uint64) []error {
		return intoRound(ctx, rs, dst, func(ctx context.Context) error { _, err := sender.SendRefs(ctx, src, version); return err })
	}
	for v := uint64(1); v <= 2; v++ {
		want := make([][]byte, len(sizes))
		for j, n := range sizes {
			want[j] = gputest.RandomBytes(rng, n)
			if n > 0 {
				gputest.Upload(t, st, srcBufs[j], 0, want[j])
			}
		}
		gputest.Sync(t, st)
		if err := errors.Join(round(v)...); err != nil {
			t.Fatalf("version %d: %v", v, err)
		}
		for i := range rs {
			for j, n := range sizes {
				if n == 0 {
					continue
				}
				if got := gputest.Download(t, st, dstBufs[i][j], 0, n); !bytes.Equal(got, want[j]) {
					t.Fatalf("version %d, receiver %d: p%d differs", v, i+1, j)
				}
			}
		}
	}
	dst[0] = dst[0][1:] // receiver 1 no longer holds p0
	for r, err := range round(3) {
		if err == nil || !strings.Contains(err.Error(), `"p0"`) {
			t.Errorf("rank %d: %v; want the failure naming p0", r, err)
		}
	}
}

// TestReceiveIntoOnFakes runs TestGPUReceiveInto against gputest's
// stand-in CUDA driver.
func TestReceiveIntoOnFakes(t *testing.T) { gputest.RunWithFakes(t, "TestGPUReceiveInto") }
