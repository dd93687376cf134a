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

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/quant"
	"github.com/weightcast/weightcast/sink"
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
	model := sink.NewHostModel()
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

// TestGPURefsQuantize sends weights handed in by address as device
// tensors (as PyTorch CUDA tensors are) with Quantize over ipc, so that
// the GPU quantizes them into the sender's device buckets, then the same
// weights from host memory, which the CPU quantizes: both rounds give the
// receivers the same bytes, tensor for tensor, and those are package
// quant's codes and scales.
func TestGPURefsQuantize(t *testing.T) {
	d := gputest.Device(t)
	st := gputest.Stream(t, d)
	addr := freeAddr(t)
	o := Options{Group: "gpu-quant", RunID: "g1", Rendezvous: "etcd://" + addr, ServeRendezvous: true, BucketSize: 1 << 20,
		Device: fmt.Sprintf("cuda:%d", d.Ordinal()), Transport: "ipc", Timeout: 30 * time.Second,
		Quantize: stages.QuantizeConfig{Scheme: quant.FP8Block}}
	sender, rs := ranks(t, 3, o)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rng := rand.New(rand.NewPCG(23, 3))
	var devRefs, hostRefs []Ref
	for i, c := range []struct {
		dt         dtype.DType
		rows, cols int
	}{{dtype.BF16, 1000, 1100}, {dtype.F16, 300, 260}, {dtype.F32, 129, 700}, {dtype.BF16, 7, 3}} {
		data := gpu.QuantTestWeight(rng, c.dt, c.rows, c.cols)
		buf := gputest.Alloc(t, d, len(data))
		gputest.Upload(t, st, buf, 0, data)
		r := Ref{Name: fmt.Sprintf("model.layers.%d.self_attn.o_proj.weight", i), DType: c.dt.String(), Shape: []int64{int64(c.rows), int64(c.cols)}}
		h := r
		h.Data = data
		r.Addr, r.Device, r.Stream, r.Bytes = buf.DevicePtr(), d.Ordinal(), st.Handle(), int64(len(data))
		devRefs, hostRefs = append(devRefs, r), append(hostRefs, h)
		norm := gputest.RandomBytes(rng, 2*333)
		nbuf := gputest.Alloc(t, d, len(norm))
		gputest.Upload(t, st, nbuf, 0, norm)
		n := Ref{Name: fmt.Sprintf("model.layers.%d.post_attention_layernorm.weight", i), DType: "BF16", Shape: []int64{333}}
		hn := n
		hn.Data = norm
		n.Addr, n.Device, n.Stream = nbuf.DevicePtr(), d.Ordinal(), st.Handle()
		devRefs, hostRefs = append(devRefs, n), append(hostRefs, hn)
	}
	var models [2][]*sink.HostModel
	for v, refs := range [][]Ref{devRefs, hostRefs} {
		var sinks []stages.Sink
		for range rs {
			m := sink.NewHostModel()
			models[v] = append(models[v], m)
			sinks = append(sinks, m)
		}
		err := syncRound(ctx, sender, rs, func(ctx context.Context) error { _, err := sender.SendRefs(ctx, refs, uint64(v+1)); return err }, sinks)
		if err != nil {
			t.Fatalf("round %d (%s tensors): %v", v+1, []string{"device", "host"}[v], err)
		}
	}
	for i := range rs {
		for _, r := range hostRefs {
			names := []string{r.Name}
			if len(r.Shape) == 2 {
				names = append(names, r.Name+quant.ScaleSuffix)
			}
			for _, name := range names {
				g, ok1 := models[0][i].Get(name)
				h, ok2 := models[1][i].Get(name)
				if !ok1 || !ok2 || g.DType != h.DType || !bytes.Equal(g.Data, h.Data) {
					t.Fatalf("receiver %d: %s differs between the GPU-quantized and the host-quantized round", i+1, name)
				}
			}
			if len(r.Shape) != 2 {
				continue
			}
			dt, _ := dtype.Parse(r.DType)
			rows, cols := r.Shape[0], r.Shape[1]
			br, bc := quant.ScaleShape(rows, cols)
			scales, codes := make([]uint32, br*bc), make([]byte, rows*cols)
			if err := quant.Scales(scales, r.Data, dt, int(cols)); err != nil {
				t.Fatal(err)
			}
			if err := quant.Encode(codes, r.Data, dt, int(cols), 0, scales); err != nil {
				t.Fatal(err)
			}
			g, _ := models[0][i].Get(r.Name)
			if g.DType != dtype.F8E4M3 || !bytes.Equal(g.Data, codes) {
				t.Fatalf("receiver %d: %s (%s) is not package quant's codes", i+1, r.Name, g.DType)
			}
		}
	}
}
