package stages

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/wire"
)

// lendEP is a devLoop receiver that borrows the root's buffer
// (transport.Lender) instead of copying each bucket into its own: the
// root's Broadcast returns once every receiver has released it. It counts
// the buckets it lent, and those given back as failed.
type lendEP struct {
	*devLoopEP
	lent, failed atomic.Int64
}

func (e *lendEP) Lends() bool { return true }

func (e *lendEP) Lend(ctx context.Context, seq uint64, n int) (mem.Buffer, func(error) error, error) {
	select {
	case d := <-e.h.inbox[e.rank]:
		if d.seq != seq || d.n != n || d.buf.Host() != nil {
			err := fmt.Errorf("root sent bucket %d of %d bytes (host memory: %v), receiver %d expected %d of %d in device memory", d.seq, d.n, d.buf.Host() != nil, e.rank, seq, n)
			d.done <- err
			return nil, nil, err
		}
		e.lent.Add(1)
		var once sync.Once
		release := func(err error) error {
			once.Do(func() {
				if err != nil {
					e.failed.Add(1)
				}
				d.done <- err
			})
			return err
		}
		return gpu.Unfence(d.buf), release, nil
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}

// failSink fails its Load of tensor name.
type failSink struct {
	Sink
	name string
}

func (f failSink) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	if e.Name == f.name {
		return errors.New("the sink refused it")
	}
	return f.Sink.Load(ctx, e, data)
}

// checkLendRounds runs two rounds from device buckets to receivers that
// borrow the root's buffers, with and without checksums: into a
// device model (which load copies into from the lent buffer, the checksum
// in the same copies) and into a host model and a verifier (the lent
// buffer copied to the host). Every receiver must hold every byte, each
// bucket must have been lent to each receiver, and the root must reuse a
// buffer only once both released it (else bytes would differ). Then a
// receiver whose sink fails gives the lent buffer back as failed, and the
// root's round fails.
func checkLendRounds(t *testing.T) {
	d := gputest.Device(t)
	s := gputest.Stream(t, d)
	rng := rand.New(rand.NewPCG(101, 102))
	devTs := randomTensors(rng, 50, 400<<10)
	exp := hostLookup{}
	var src tensorList
	for i, tn := range placeOnDevice(t, d, devTs, 25, 3) {
		gputest.Upload(t, s, tn.Device, int(tn.DeviceOffset), devTs[i].Data)
		exp[tn.Name] = &Tensor{Name: tn.Name, DType: tn.DType, Shape: tn.Shape, Data: devTs[i].Data}
		src = append(src, tn)
	}
	gputest.Sync(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lending := func(eps []*lendEP) func(int, transport.Endpoint) transport.Endpoint {
		return func(r int, e transport.Endpoint) transport.Endpoint {
			if r == 0 {
				return e
			}
			eps[r-1] = &lendEP{devLoopEP: e.(*devLoopEP)}
			return eps[r-1]
		}
	}
	for _, sum := range []bool{true, false} {
		t.Run(fmt.Sprintf("checksum=%v", sum), func(t *testing.T) {
			eps := make([]*lendEP, 2)
			g := newGPUGroup(t, d, 3, 256<<10, false, sum, lending(eps))
			st := runRounds(t, g, d, src, exp)
			for i, e := range eps {
				if n := e.lent.Load(); n != int64(2*st.Buckets) {
					t.Fatalf("receiver %d borrowed %d buckets of two rounds of %d", i+1, n, st.Buckets)
				}
			}
		})
	}

	// Each rank's own error, without cancelling the other (which would
	// race the root's failure with the receiver's).
	eps := make([]*lendEP, 1)
	g := newGPUGroup(t, d, 2, 256<<10, false, true, lending(eps))
	var serr, rerr error
	var wg sync.WaitGroup
	wg.Go(func() { _, serr = g.sender.Sync(ctx, src, 1) })
	wg.Go(func() { _, rerr = g.receivers[0].Sync(ctx, failSink{newMemModel(), src[30].Name}) })
	wg.Wait()
	if serr == nil || eps[0].failed.Load() == 0 {
		t.Fatalf("the root, whose receiver's sink failed: %v, with %d lent buffers given back as failed; want it failed, and the buffer given back as failed", serr, eps[0].failed.Load())
	}
	if rerr == nil || !strings.Contains(rerr.Error(), "the sink refused it") {
		t.Fatalf("the receiver whose sink failed: %v; want the sink's error", rerr)
	}
}

// TestLendRoundsOnFakes runs checkLendRounds against gputest's stand-in
// driver.
func TestLendRoundsOnFakes(t *testing.T) { gputest.RunWithFakes(t, "TestLendRoundsOnFakesChild") }

// TestLendRoundsOnFakesChild is the child side of TestLendRoundsOnFakes.
func TestLendRoundsOnFakesChild(t *testing.T) {
	gputest.InFakeChild(t)
	checkLendRounds(t)
}

// TestGPULendRounds runs checkLendRounds on a GPU.
func TestGPULendRounds(t *testing.T) { checkLendRounds(t) }
