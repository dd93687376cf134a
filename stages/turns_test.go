package stages

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/wire"
)

// TestTurnsOnFakes runs three receivers' parts in a round's turns against
// gputest's stand-in driver, which refuses a wait not met when it is
// queued: so each wait that must hold a receiver back is seen to be there,
// with its value, and each raise to land where and when the protocol
// says (wire.DirectTurns).
func TestTurnsOnFakes(t *testing.T) { gputest.RunWithFakes(t, "TestTurnsOnFakesChild") }

// TestTurnsOnFakesChild is the child side of TestTurnsOnFakes.
func TestTurnsOnFakesChild(t *testing.T) {
	gputest.InFakeChild(t)
	os.Setenv("FAKECUDA_WAIT64", "1") // the stand-in's waits here are met when queued
	d := gputest.Device(t)
	s := gputest.Stream(t, d)
	buf := gputest.Alloc(t, d, 8*3)
	gputest.Fill(t, s, buf, 0)
	words, _ := gpu.Address(buf)
	const round = 7
	turns := wire.DirectTurns{Receivers: 3, Round: round, Every: 2}
	// Six buckets, groups {0, 1}, {2, 3}, {4, 5}.
	bucket := func(i int) *Bucket {
		return &Bucket{Meta: wire.BucketMeta{Seq: uint64(100 + i), Index: i, IsLast: i == 5}, turn: &bucketTurn{words: words, DirectTurns: turns}}
	}
	word := func(rank int) uint64 {
		return binary.LittleEndian.Uint64(gputest.Download(t, s, buf, 8*(rank-1), 8))
	}
	ranks := make([]*roundTurns, 4)
	for r := 1; r <= 3; r++ {
		ranks[r] = &roundTurns{rank: r}
	}
	take := func(r, g int) error {
		for i := 2 * g; i < 2*g+2; i++ {
			b := bucket(i)
			if err := ranks[r].before(s, b); err != nil {
				return err
			}
			if err := ranks[r].after(b); err != nil {
				return err
			}
		}
		return nil
	}

	// Rank 2 may not start before rank 1 has ended group 0.
	probe := &roundTurns{rank: 2}
	if err := probe.before(s, bucket(0)); err == nil {
		t.Fatal("rank 2 queued group 0 with no wait for rank 1")
	}
	for g := range 3 {
		for r := 1; r <= 3; r++ {
			if err := take(r, g); err != nil {
				t.Fatalf("rank %d, group %d: %v", r, g, err)
			}
			next := r%3 + 1
			if got, want := word(next), turnValue(round, uint64(g)); got != want {
				t.Fatalf("after rank %d's group %d, rank %d's word is %#x, want %#x", r, g, next, got, want)
			}
			if r == 3 || g == 2 {
				continue
			}
			// The rank after r waited for r; rank 1's next group waits
			// for rank 3's end of this one.
			probe := &roundTurns{rank: 1, took: true, group: uint64(g), turns: ranks[1].turns}
			if err := probe.before(s, bucket(2*g+2)); err == nil {
				t.Fatalf("rank 1 queued group %d before rank 3 ended group %d", g+1, g)
			}
		}
	}
	if ranks[1].open || ranks[2].open || ranks[3].open {
		t.Fatal("a group stayed open after the round's last bucket")
	}

	// A bucket without turns ends the group before it.
	gputest.Fill(t, s, buf, 0)
	mixed := &roundTurns{rank: 1}
	if err := mixed.before(s, bucket(0)); err != nil {
		t.Fatal(err)
	}
	if err := mixed.before(s, &Bucket{Meta: wire.BucketMeta{Seq: 101, Index: 1}}); err != nil {
		t.Fatal(err)
	}
	if mixed.open || word(2) != turnValue(round, 0) {
		t.Fatalf("a bucket without turns left group 0 open (rank 2's word %#x)", word(2))
	}
	// The root may not change the turns within a round.
	other := bucket(2)
	other.turn.Round++
	if err := mixed.before(s, other); err == nil {
		t.Fatal("a bucket with another round's turns was taken")
	}

	// A rank that does not take turns lets the next one go for the round;
	// one that does not know its rank lets every one go; a release ends
	// every wait.
	gputest.Fill(t, s, buf, 0)
	for _, c := range []struct {
		rank int
		want [3]uint64
	}{
		{2, [3]uint64{0, 0, turnValue(round, 0xffffffff)}},
		{3, [3]uint64{turnValue(round, 0xffffffff), 0, turnValue(round, 0xffffffff)}},
		{0, [3]uint64{turnValue(round, 0xffffffff), turnValue(round, 0xffffffff), turnValue(round, 0xffffffff)}},
	} {
		ld := NewLoader()
		ld.rank = c.rank
		if err := ld.passTurns(d, words, &turns); err != nil {
			t.Fatal(err)
		}
		if err := ld.passTurns(d, words, &turns); err != nil { // once a round
			t.Fatal(err)
		}
		if got := [3]uint64{word(1), word(2), word(3)}; got != c.want {
			t.Fatalf("rank %d passed: words %#x, want %#x", c.rank, got, c.want)
		}
		if err := ld.Close(); err != nil {
			t.Fatal(err)
		}
	}
	ld := NewLoader()
	defer ld.Close()
	if err := ld.releaseTurns(&roundTurns{rank: 1, turns: &bucketTurn{words: words, DirectTurns: turns}, stream: s}); err != nil {
		t.Fatal(err)
	}
	for r := 1; r <= 3; r++ {
		if word(r) != turnsEnd(round) {
			t.Fatalf("after a release rank %d's word is %#x", r, word(r))
		}
	}
	// The release ends the round's every wait, under the driver's cyclic
	// comparison (the stand-in's is the driver's).
	if err := s.WaitValue64(words+8, turnValue(round, 1<<20)); err != nil {
		t.Fatalf("a wait of the round after its release: %v", err)
	}
	// Words that only grow: a raise from the failed round changes nothing.
	late := &roundTurns{rank: 1, open: true, group: 5, turns: &bucketTurn{words: words, DirectTurns: turns}, stream: s}
	if err := late.pass(); err != nil {
		t.Fatal(err)
	}
	if word(2) != turnsEnd(round) {
		t.Fatalf("a late raise lowered a released word to %#x", word(2))
	}
}

// TestSenderTurnsOnFakes: a Sender whose receivers all read in place on
// its GPU gives each round turns, counted from 1, in groups of at least
// turnBytes (at most maxTurnBuckets buckets), on words it allocated for
// them; not with one receiver, nor with NoTurns.
func TestSenderTurnsOnFakes(t *testing.T) { gputest.RunWithFakes(t, "TestSenderTurnsOnFakesChild") }

// TestSenderTurnsOnFakesChild is the child side of TestSenderTurnsOnFakes.
func TestSenderTurnsOnFakesChild(t *testing.T) {
	gputest.InFakeChild(t)
	os.Setenv("FAKECUDA_WAIT64", "1")
	os.Setenv("FAKECUDA_WAIT_MS", "5000") // the check of turns at the words' making waits
	d := gputest.Device(t)
	pool := func(size int) *Pool {
		p, err := NewPool(d, DefaultBuffers, size)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	ep := &directEP{receivers: 3}
	s := NewSender(SenderConfig{Endpoint: ep, Pool: pool(1 << 20)})
	defer s.Close()
	s.turnBytes = 3 << 20
	for round := uint32(1); round <= 2; round++ {
		tr := s.turns(true)
		if tr == nil || tr.Receivers != 3 || tr.Round != round || tr.Every != 3 {
			t.Fatalf("round %d: turns %+v, want 3 receivers in groups of 3 buckets", round, tr)
		}
	}
	if s.words == nil || s.words.buf.Len() != turnWordsBytes {
		t.Fatalf("the sender's words: %+v", s.words)
	}
	s.turnBytes = 0 // turnBytes: 4 GiB of 1 MiB buckets, capped
	if tr := s.turns(true); tr == nil || tr.Every != maxTurnBuckets {
		t.Fatalf("turns %+v, want groups of %d buckets", tr, maxTurnBuckets)
	}
	if tr := s.turns(false); tr != nil {
		t.Fatalf("a round that is not direct got turns %+v", tr)
	}
	one := NewSender(SenderConfig{Endpoint: &directEP{receivers: 1}, Pool: pool(1 << 20)})
	defer one.Close()
	none := NewSender(SenderConfig{Endpoint: ep, Pool: pool(1 << 20), NoTurns: true})
	defer none.Close()
	if one.turns(true) != nil || none.turns(true) != nil {
		t.Fatal("turns with one receiver, or with NoTurns")
	}
	// A GPU whose waits do not hold work back (the stand-in refusing
	// them) fails the check at the words' making: no turns, said once.
	os.Setenv("FAKECUDA_WAIT_MS", "0")
	var logs strings.Builder
	broken := NewSender(SenderConfig{Endpoint: ep, Pool: pool(1 << 20), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer broken.Close()
	if tr := broken.turns(true); tr != nil || broken.turns(true) != nil {
		t.Fatalf("turns %+v where waits do not work", tr)
	}
	if n := strings.Count(logs.String(), "without taking turns"); n != 1 {
		t.Fatalf("the sender said %d times that its receivers take no turns:\n%s", n, logs.String())
	}
}

// turnsCount counts the published buckets that carry turns.
type turnsCount struct {
	transport.Publisher
	mu     sync.Mutex
	turned int
	rounds map[uint32]bool
}

func (p *turnsCount) Publish(ctx context.Context, seq uint64, msg []byte) error {
	if m, err := wire.DecodeMeta(msg); err == nil && m.Direct != nil && m.Direct.Turns != nil {
		p.mu.Lock()
		p.turned++
		p.rounds[m.Direct.Turns.Round] = true
		p.mu.Unlock()
	}
	return p.Publisher.Publish(ctx, seq, msg)
}

// failingTarget is a device model whose Target fails at one tensor.
type failingTarget struct {
	*devModel
	name string
}

func (f *failingTarget) Target(ctx context.Context, e *wire.Entry) (mem.Buffer, int64, error) {
	if e.Name == f.name {
		return nil, 0, errors.New("injected: this rank cannot place the tensor")
	}
	return f.devModel.Target(ctx, e)
}

// TestGPUDirectTurns: three receivers that read direct rounds in place on
// the sender's GPU take turns of four 256 KiB buckets, and every model
// holds the round, checksums on and off; then one receiver fails in the
// middle of a round, and every rank's Sync returns that failure rather
// than a wait on the GPU outliving the round (the turns' waits are
// released). The receivers are goroutines of one process here (one
// context, no time slicing), so this checks the protocol, not its speed
// (BenchmarkGatherLayoutTurns and the demo measure that).
func TestGPUDirectTurns(t *testing.T) { checkDirectTurns(t) }

// TestDirectTurnsOnFakes is TestGPUDirectTurns against gputest's stand-in
// driver, whose 64-bit waits hold the calling goroutine until another
// meets them (FAKECUDA_WAIT_MS): the receivers' goroutines run in their
// turns' order, through the whole Sender and Receiver, on machines
// without a GPU.
func TestDirectTurnsOnFakes(t *testing.T) { gputest.RunWithFakes(t, "TestDirectTurnsOnFakesChild") }

// TestDirectTurnsOnFakesChild is the child side of TestDirectTurnsOnFakes.
func TestDirectTurnsOnFakesChild(t *testing.T) {
	gputest.InFakeChild(t)
	os.Setenv("FAKECUDA_WAIT64", "1")
	os.Setenv("FAKECUDA_WAIT_MS", "20000")
	checkDirectTurns(t)
}

func checkDirectTurns(t *testing.T) {
	d := gputest.Device(t)
	if !d.StreamMemOps64() || d.MPS() {
		t.Skipf("%s: no 64-bit stream memory operations, or MPS: no turns", d.Name())
	}
	s := gputest.Stream(t, d)
	src, exp := directSource(t, d, s, 97, false)
	for _, sum := range []bool{true, false} {
		t.Run(fmt.Sprintf("checksum=%v", sum), func(t *testing.T) {
			g := newGPUGroup(t, d, 4, 256<<10, false, sum, func(r int, e transport.Endpoint) transport.Endpoint {
				if r == 0 {
					return &directEP{Endpoint: e, receivers: 3}
				}
				return e
			})
			g.sender.turnBytes = 1 << 20
			pub := &turnsCount{Publisher: g.sender.cfg.Publisher, rounds: map[uint32]bool{}}
			g.sender.cfg.Publisher = pub
			models := []*devModel{newDevModel(t, d), newDevModel(t, d), newDevModel(t, d)}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var st RoundStats
			for v := uint64(1); v <= 2; v++ {
				errs := syncAll(ctx, g, src, v, &st, models[0], models[1], models[2])
				if err := errors.Join(errs...); err != nil {
					t.Fatalf("round %d: %v", v, err)
				}
				for i, m := range models {
					if _, err := m.Verify(ctx, exp); err != nil {
						t.Fatalf("round %d, rank %d: %v", v, i+1, err)
					}
				}
			}
			if st.Direct != st.Buckets || pub.turned != 2*st.Buckets || len(pub.rounds) != 2 || st.Buckets < 9 {
				t.Fatalf("%d of %d buckets direct, %d published with turns over rounds %v; want every one, two rounds, at least three turns a round", st.Direct, st.Buckets, pub.turned, pub.rounds)
			}

			// Rank 2 fails at a tensor two thirds into the round, in a
			// later turn than the first.
			fail := &failingTarget{devModel: models[1], name: src[len(src)*2/3].Name}
			fctx, fcancel := context.WithTimeout(ctx, 30*time.Second)
			defer fcancel()
			errs := syncAll(fctx, g, src, 3, &st, models[0], fail, models[2])
			for i, err := range errs {
				switch {
				case err == nil:
					t.Errorf("rank %d: the round with a failing receiver succeeded", i)
				case errors.Is(err, context.DeadlineExceeded):
					t.Errorf("rank %d waited out its deadline: %v", i, err)
				case !strings.Contains(err.Error(), "injected"):
					t.Errorf("rank %d failed for another reason: %v", i, err)
				}
			}
		})
	}
}

// syncAll runs round v of src through g's sender and its receivers into
// sinks, and returns their errors, the sender's first.
func syncAll(ctx context.Context, g *group, src Source, v uint64, st *RoundStats, sinks ...Sink) []error {
	errs := make([]error, 1+len(sinks))
	var wg sync.WaitGroup
	wg.Go(func() { *st, errs[0] = g.sender.Sync(ctx, src, v) })
	for i, sink := range sinks {
		wg.Go(func() { _, errs[i+1] = g.receivers[i].Sync(ctx, sink) })
	}
	wg.Wait()
	return errs
}
