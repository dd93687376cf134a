package sink_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/source"
	"github.com/weightcast/weightcast/stages"
)

// deviceRound runs round version of src into dst over a pipeline of its
// own (iterate, pack into pool's buckets, unpack, load): a receiver's
// stages without a transport.
func deviceRound(ctx context.Context, src stages.Source, pool *stages.Pool, version uint64, dst stages.Sink) error {
	p := pipeline.New(fmt.Sprintf("round %d", version))
	in := stages.Pack(p, stages.Iterate(p, src), stages.PackConfig{Pool: pool, Version: version, Checksum: true})
	stages.Load(p, stages.Unpack(p, in), dst)
	return p.Run(ctx)
}

// TestGPUDeviceModel loads two rounds of host tensors of random dtypes and
// sizes, some split across buckets, packed into device buckets, into a
// DeviceModel, alone (a DeviceTarget: load copies into it, with the
// checksums) and beside a verifier (device views it copies itself): the
// model holds every byte, took the second round's new bytes in place, and
// reads a tensor back. A model over tensors it does not own takes the
// tensors it holds and refuses any other with ErrNotHeld.
func TestGPUDeviceModel(t *testing.T) {
	d := gputest.Device(t)
	const bucket = 256 << 10
	pool, err := stages.NewPool(d, stages.DefaultBuffers, bucket)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rng := rand.New(rand.NewPCG(21, 22))
	src := randomTensors(rng, 40, 2*bucket)
	for _, alone := range []bool{true, false} {
		dm, err := sink.NewDeviceModel(d)
		if err != nil {
			t.Fatal(err)
		}
		for version := uint64(1); version <= 2; version++ {
			for _, tn := range src {
				rng.Shuffle(len(tn.Data), func(i, j int) { tn.Data[i], tn.Data[j] = tn.Data[j], tn.Data[i] })
			}
			var dst stages.Sink = dm
			if !alone {
				dst = stages.Sinks(dm, sink.Verify(lookup(src)))
			}
			if err := deviceRound(ctx, src, pool, version, dst); err != nil {
				t.Fatalf("alone %v, round %d: %v", alone, version, err)
			}
			st, err := dm.Verify(ctx, lookup(src))
			if err != nil || st.Tensors != len(src) || dm.Version() != version {
				t.Fatalf("alone %v, round %d: verified %d of %d tensors, version %d: %v", alone, version, st.Tensors, len(src), dm.Version(), err)
			}
		}
		if dm.Allocations() != len(src) {
			t.Fatalf("alone %v: %d allocations for %d tensors over two rounds: not updated in place", alone, dm.Allocations(), len(src))
		}
		got, err := dm.ReadHost(ctx, src[3].Name)
		if err != nil || !bytes.Equal(got, src[3].Data) {
			t.Fatalf("ReadHost of %s: %v", src[3].Name, err)
		}
		if err := dm.Close(); err != nil {
			t.Fatal(err)
		}
	}

	// Over tensors held elsewhere: the first tensor of src only.
	held := gputest.Alloc(t, d, max(1, len(src[0].Data)))
	over, err := sink.NewDeviceModelOver(d, map[string]*sink.DeviceTensor{src[0].Name: {DType: src[0].DType, Shape: src[0].Shape, Buf: held}})
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	if err := deviceRound(ctx, src[:1], pool, 3, over); err != nil {
		t.Fatal(err)
	}
	if got := gputest.Download(t, gputest.Stream(t, d), held, 0, len(src[0].Data)); !bytes.Equal(got, src[0].Data) {
		t.Fatal("the model over the caller's tensor did not write into it")
	}
	if err := deviceRound(ctx, src[:2], pool, 4, over); !errors.Is(err, sink.ErrNotHeld) {
		t.Fatalf("a tensor the model does not hold: %v, want ErrNotHeld", err)
	}
}

// TestDeviceModelOnFakes runs TestGPUDeviceModel against gputest's
// stand-in CUDA driver, so machines without a GPU check DeviceModel too.
func TestDeviceModelOnFakes(t *testing.T) { gputest.RunWithFakes(t, "TestGPUDeviceModel") }

// lookup finds the tensors of ts by name, and lists them.
type lookup source.Tensors

func (l lookup) Lookup(name string) (*stages.Tensor, bool) {
	for _, t := range l {
		if t.Name == name {
			return t, true
		}
	}
	return nil, false
}

func (l lookup) List() []*stages.Tensor { return l }
