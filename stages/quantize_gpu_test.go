package stages

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/quant"
)

// quantTestModel returns weights that Quantize picks, of every source
// dtype, with blocks of every kind gpu.QuantTestWeight makes (NaNs,
// infinities, zeros, tiny scales, ties...), from one element to larger
// than a bucket of bucket bytes (so their codes split across buckets at
// 64-byte boundaries, inside blocks and rows), and tensors it leaves as
// they are; as host tensors (Data).
func quantTestModel(rng *rand.Rand) tensorList {
	var ts tensorList
	for i, c := range []struct {
		from       dtype.DType
		rows, cols int
	}{
		{dtype.BF16, 300, 260}, {dtype.BF16, 1000, 1100}, {dtype.F16, 129, 130},
		{dtype.F32, 260, 1030}, {dtype.BF16, 1, 5}, {dtype.F16, 1200, 1000},
	} {
		name := fmt.Sprintf("model.layers.%d.mlp.up_proj.weight", i)
		ts = append(ts, &Tensor{Name: name, DType: c.from, Shape: []int64{int64(c.rows), int64(c.cols)},
			Data: gpu.QuantTestWeight(rng, c.from, c.rows, c.cols)})
		norm := fmt.Sprintf("model.layers.%d.input_layernorm.weight", i)
		ts = append(ts, &Tensor{Name: norm, DType: dtype.BF16, Shape: []int64{777}, Data: gputest.RandomBytes(rng, 2*777)})
	}
	return ts
}

// uploadTensors returns ts with the same names, dtypes and shapes, their bytes
// uploaded to d (each in an allocation of its own, 64 bytes in).
func uploadTensors(t *testing.T, d *gpu.CUDADevice, s *gpu.Stream, ts tensorList) tensorList {
	t.Helper()
	var out tensorList
	for _, tn := range ts {
		buf := gputest.Alloc(t, d, len(tn.Data)+128)
		gputest.Upload(t, s, buf, 64, tn.Data)
		out = append(out, &Tensor{Name: tn.Name, DType: tn.DType, Shape: tn.Shape, Device: buf, DeviceOffset: 64})
	}
	gputest.Sync(t, s)
	return out
}

// hostQuantized returns the bytes of every tensor of Quantize(ts) as the
// host path computes them (Tensor.ReadAt), after checking that the picked
// weights' codes and scales are package quant's.
func hostQuantized(t *testing.T, ts tensorList) map[string][]byte {
	t.Helper()
	qs, err := Quantize(ts, QuantizeConfig{Scheme: quant.FP8Block})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	err = qs.Tensors(context.Background(), func(tn *Tensor) error {
		size, err := tn.Validate()
		if err != nil {
			return err
		}
		b := make([]byte, size)
		if err := tn.ReadAt(b, 0); err != nil {
			return err
		}
		out[tn.Name] = b
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ts {
		if len(w.Shape) != 2 {
			continue
		}
		codes, scales := wantQuantized(t, w.Data, w.DType, int(w.Shape[0]), int(w.Shape[1]))
		if !bytes.Equal(out[w.Name], codes) || !bytes.Equal(out[w.Name+quant.ScaleSuffix], scaleBytes(scales)) {
			t.Fatalf("%s: the host path differs from package quant", w.Name)
		}
	}
	return out
}

// TestGPUQuantizeDevice sends weights held in device memory through
// Quantize into device buckets, with and without checksums (the fused
// copy and checksum kernel, and the copy engine with a checksum pass), two
// rounds on one Sender: the GPU quantizes them as pack fills the buckets,
// and every receiver gets exactly the codes and scales the host path
// gives (package quant's), the other tensors as they were.
func TestGPUQuantizeDevice(t *testing.T) {
	d := gputest.Device(t)
	s := gputest.Stream(t, d)
	rng := rand.New(rand.NewPCG(23, 23))
	host := quantTestModel(rng)
	want := hostQuantized(t, host)
	dev := uploadTensors(t, d, s, host)
	qs, err := Quantize(dev, QuantizeConfig{Scheme: quant.FP8Block})
	if err != nil {
		t.Fatal(err)
	}
	for _, sum := range []bool{true, false} {
		t.Run(fmt.Sprintf("checksum=%v", sum), func(t *testing.T) {
			g := newGPUGroup(t, d, 3, 1<<20, false, sum, nil)
			for v := uint64(1); v <= 2; v++ {
				hm, dm := newMemModel(), newDevModel(t, d)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if err := roundCancel(ctx, g, qs, v, []Sink{hm, dm}); err != nil {
					t.Fatal(err)
				}
				exp := hostLookup{}
				for name, b := range want {
					got, ok := hm.Get(name)
					if !ok {
						t.Fatalf("round %d: %s not received", v, name)
					}
					if i := gputest.FirstDiff(got.Data, b); i >= 0 || len(got.Data) != len(b) {
						t.Fatalf("round %d: %s (%s%v) differs from the host path at byte %d", v, name, got.DType, got.Shape, i)
					}
					exp[name] = &Tensor{Name: name, DType: got.DType, Shape: got.Shape, Data: b}
				}
				if _, err := dm.Verify(ctx, exp); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestGPUQuantizeScalesOnly packs the scale tensor of a device weight
// without its codes (found by Lookup): the GPU then computes every
// block's scale in a launch of its own.
func TestGPUQuantizeScalesOnly(t *testing.T) {
	d := gputest.Device(t)
	s := gputest.Stream(t, d)
	rng := rand.New(rand.NewPCG(1, 23))
	host := quantTestModel(rng)[2:4] // a 1000×1100 weight and a norm
	want := hostQuantized(t, host)
	// A source that looks up: a plain Tensors list is not a Lookuper, so
	// Quantize over one finds nothing (TestQuantizeLookup).
	qs, err := Quantize(listLookup{uploadTensors(t, d, s, host)}, QuantizeConfig{Scheme: quant.FP8Block})
	if err != nil {
		t.Fatal(err)
	}
	name := host[0].Name + quant.ScaleSuffix
	sc, ok := qs.(Lookuper).Lookup(name)
	if !ok {
		t.Fatalf("no %s", name)
	}
	pk := testPacker(t, defaultPlan, gpu.DefaultStagingConfig())
	checkPacked(t, tensorList{sc}, map[string][]byte{name: want[name]}, devicePool(t, d, DefaultBuffers, 1<<20), pk)
}

// TestGPUQuantizeRefused checks the clear errors of device weights the GPU
// cannot quantize: the kernel turned off, naming the weight.
func TestGPUQuantizeRefused(t *testing.T) {
	t.Setenv(gpu.QuantEnv, "off")
	d := gputest.Device(t) // a device of its own: the kernel loads once per device
	s := gputest.Stream(t, d)
	rng := rand.New(rand.NewPCG(2, 23))
	host := quantTestModel(rng)[:2]
	qs, err := Quantize(uploadTensors(t, d, s, host), QuantizeConfig{Scheme: quant.FP8Block})
	if err != nil {
		t.Fatal(err)
	}
	g := newGPUGroup(t, d, 2, 1<<20, false, true, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = roundCancel(ctx, g, qs, 1, []Sink{newMemModel()})
	if err == nil || !bytesContain(err.Error(), host[0].Name) || !bytesContain(err.Error(), gpu.QuantEnv) {
		t.Fatalf("round with the quantize kernel off: %v", err)
	}
}
