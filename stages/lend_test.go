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
)

// lendEP is a devLoop receiver that borrows the root's buffer
// (transport.Lender) instead of copying each bucket into its own: the
// root's Broadcast returns once every receiver has released it. It counts
// the buckets it lent.
type lendEP struct {
	*devLoopEP
	lent atomic.Int64
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
			once.Do(func() { d.done <- err })
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

func (f failSink) Load(ctx context.Context, e *Entry, data []byte) error {
	if e.Name == f.name {
		return errors.New("the sink refused it")
	}
	return f.Sink.Load(ctx, e, data)
}

// checkLendRounds runs two rounds from device buckets to receivers that
// borrow the root's buffers, with and without checksums: into a
// DeviceModel (which load copies into from the lent buffer, the checksum
// in the same copies) and into a host model and a verifier (the lent
// buffer copied to the host). Every receiver must hold every byte, each
// bucket must have been lent to each receiver, and the root must reuse a
// buffer only once both released it (else bytes would differ). Then a
// receiver whose sink fails gives the lent buffer back as failed, which
// fails the root's broadcast of that bucket.
func checkLendRounds(t *testing.T) {
	d := gputest.Device(t)
	s := gputest.Stream(t, d)
	rng := rand.New(rand.NewPCG(101, 102))
	devTs := randomTensors(rng, 50, 400<<10)
	exp := hostLookup{}
	var src Tensors
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

	eps := make([]*lendEP, 1)
	g := newGPUGroup(t, d, 2, 256<<10, false, true, lending(eps))
	err := roundCancel(ctx, g, src, 1, []Sink{failSink{NewHostModel(), src[30].Name}})
	if err == nil || !strings.Contains(err.Error(), "did not load the bucket") || !strings.Contains(err.Error(), "the sink refused it") {
		t.Fatalf("a receiver whose sink failed: %v; want the root's broadcast failed by the lent buffer given back, and the sink's error", err)
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
