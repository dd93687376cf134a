package sink_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/stages/stagestest"
)

// consumeViews takes every batch of one round from v until done closes,
// copying each view's bytes out (through read) after the batch was handed
// over, and releasing it. It checks that the views are whole tensors, the
// batches numbered in order.
func consumeViews(v *sink.Views, done <-chan struct{}, read func(stages.View) []byte) (map[string][]byte, error) {
	got := map[string][]byte{}
	next := 0
	for {
		select {
		case b := <-v.Batches():
			if b.Index != next {
				return got, fmt.Errorf("batch %d arrived where %d was next", b.Index, next)
			}
			next++
			for _, view := range b.Views {
				if !view.Entry.Whole() {
					return got, fmt.Errorf("view of %q is a chunk (%d of %d bytes at %d)", view.Entry.Name, view.Entry.Size, view.Entry.Total, view.Entry.Chunk)
				}
				if _, dup := got[view.Entry.Name]; dup {
					return got, fmt.Errorf("tensor %q handed over twice", view.Entry.Name)
				}
				got[view.Entry.Name] = read(view)
			}
			b.Release(nil)
			b.Release(nil) // a second Release does nothing
		case <-done:
			return got, nil
		}
	}
}

// TestViews receives rounds of tensors from empty to three buckets large
// through Views on two receivers, consuming them batch by batch while the
// sender fills the next buckets, and checks every byte.
func TestViews(t *testing.T) {
	const bucket = 4 << 10
	g := stagestest.NewGroup(t, stagestest.GroupOptions{World: 3, Bucket: bucket, Checksum: true})
	rng := rand.New(rand.NewPCG(13, 14))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	views := []*sink.Views{sink.NewViews(nil, 0), sink.NewViews(mem.Host{}, 0)}
	for _, v := range views {
		defer v.Close()
	}
	for version := uint64(1); version <= 3; version++ {
		src := randomTensors(rng, 60, 3*bucket)
		want := map[string][]byte{}
		for _, tn := range src {
			want[tn.Name] = tn.Data
		}
		done := make(chan struct{})
		results := make([]map[string][]byte, len(views))
		errs := make([]error, len(views))
		var wg sync.WaitGroup
		for i, v := range views {
			wg.Go(func() {
				results[i], errs[i] = consumeViews(v, done, func(view stages.View) []byte { return bytes.Clone(view.Data) })
			})
		}
		err := g.Round(ctx, src, version, []stages.Sink{views[0], views[1]})
		close(done)
		wg.Wait()
		if err = errors.Join(err, errors.Join(errs...)); err != nil {
			t.Fatalf("version %d: %v", version, err)
		}
		for i, got := range results {
			if len(got) != len(want) {
				t.Fatalf("version %d: receiver %d got %d tensors, want %d", version, i+1, len(got), len(want))
			}
			for name, w := range want {
				if !bytes.Equal(got[name], w) {
					t.Fatalf("version %d: receiver %d: tensor %q differs", version, i+1, name)
				}
			}
		}
	}
	for r, p := range g.Pools {
		if p.Held() != 0 || p.MaxHeld() > stages.DefaultBuffers {
			t.Fatalf("rank %d: held %d, max held %d", r, p.Held(), p.MaxHeld())
		}
	}
}

// TestViewsUnreleased checks that a consumer that takes a batch and never
// releases it fails the round with an error naming the batch, instead of
// hanging, and that the buckets all come back.
func TestViewsUnreleased(t *testing.T) {
	const bucket = 4 << 10
	g := stagestest.NewGroup(t, stagestest.GroupOptions{World: 2, Bucket: bucket})
	v := sink.NewViews(nil, 200*time.Millisecond)
	defer v.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src := randomTensors(rand.New(rand.NewPCG(1, 2)), 20, bucket)
	taken := make(chan struct{})
	go func() {
		select {
		case <-v.Batches(): // taken and held
			close(taken)
		case <-ctx.Done():
		}
	}()
	err := errors.Join(g.RoundClosingOnError(ctx, src, 1, []stages.Sink{v})...)
	<-taken
	if err == nil || !strings.Contains(err.Error(), "batch 0 of version 1 was held for more than") {
		t.Fatalf("round with an unreleased batch: %v", err)
	}
	for r, p := range g.Pools {
		if p.Held() != 0 {
			t.Fatalf("rank %d still holds %d buffers", r, p.Held())
		}
	}
}

// TestGPUViews packs host tensors, some split across buckets, into device
// buckets and hands them to two Views (the receivers' load stages, each
// over a pipeline of its own: iterate, pack, unpack, load), and reads
// each view back from the GPU; the consumer releases each batch with an
// event recorded after its own copies out of the views.
func TestGPUViews(t *testing.T) {
	d := gputest.Device(t)
	s := gputest.Stream(t, d)
	const bucket = 1 << 20
	rng := rand.New(rand.NewPCG(7, 8))
	src := randomTensors(rng, 80, 3*bucket)
	want := map[string][]byte{}
	for _, tn := range src {
		want[tn.Name] = tn.Data
	}
	views := []*sink.Views{sink.NewViews(nil, 0), sink.NewViews(nil, 0)}
	var pools []*stages.Pool
	for range views {
		pool, err := stages.NewPool(d, stages.DefaultBuffers, bucket)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		pools = append(pools, pool)
	}
	// round runs round version of src into views[i].
	round := func(ctx context.Context, i int, version uint64) error {
		p := pipeline.New(fmt.Sprintf("views %d", i))
		in := stages.Pack(p, stages.Iterate(p, src), stages.PackConfig{Pool: pools[i], Version: version, Checksum: true})
		stages.Load(p, stages.Unpack(p, in), views[i])
		return p.Run(ctx)
	}
	for _, v := range views {
		defer v.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for version := uint64(1); version <= 2; version++ {
		done := make(chan struct{})
		results := make([]map[string][]byte, len(views))
		errs := make([]error, len(views))
		var wg sync.WaitGroup
		for i, v := range views {
			wg.Go(func() {
				got := map[string][]byte{}
				for {
					select {
					case b := <-v.Batches():
						for _, view := range b.Views {
							if view.Device == nil {
								errs[i] = fmt.Errorf("tensor %q came as a host view from a device bucket", view.Entry.Name)
								return
							}
							host := make([]byte, view.Entry.Size)
							if len(host) > 0 {
								if err := s.CopyDtoH(host, view.Device, int(view.Offset)); err != nil {
									errs[i] = err
									return
								}
							}
							got[view.Entry.Name] = host
						}
						ev, err := s.Record()
						if err != nil {
							errs[i] = err
							return
						}
						b.Release(ev)
					case <-done:
						results[i] = got
						return
					}
				}
			})
		}
		rounds := make([]error, len(views))
		var rw sync.WaitGroup
		for i := range views {
			rw.Go(func() { rounds[i] = round(ctx, i, version) })
		}
		rw.Wait()
		err := errors.Join(rounds...)
		close(done)
		wg.Wait()
		if err = errors.Join(err, errors.Join(errs...)); err != nil {
			t.Fatalf("version %d: %v", version, err)
		}
		gputest.Sync(t, s)
		for i, got := range results {
			for name, w := range want {
				if !bytes.Equal(got[name], w) {
					t.Fatalf("version %d: receiver %d: tensor %q differs (at byte %d)", version, i+1, name, gputest.FirstDiff(got[name], w))
				}
			}
		}
	}
}

// TestViewsOnFakes runs TestGPUViews against gputest's stand-in CUDA
// driver, so machines without a GPU check the device path of Views too.
func TestViewsOnFakes(t *testing.T) { gputest.RunWithFakes(t, "TestGPUViews") }
