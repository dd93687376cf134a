package stages

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/wire"
)

// Turns: receivers on the sender's GPU copy a direct round one after
// another, several buckets at a time.
//
// Without MPS the kernels of processes that share a GPU take turns in time
// slices, and each hand-over from one process's kernels to another's costs
// about 120-150 µs; receivers whose copies interleave hand over at least
// once per copy kernel, receivers in turns once per turn
// (docs/benchmarks.md, "What the GPU's hand-over between processes
// costs"). So where every receiver reads the round in place, the Sender
// has them take turns of turnBytes: it allocates one 64-bit word per
// receiver, exports it with the round's allocations, and names the words,
// the ring of receivers, its count of rounds with turns and the buckets
// per turn in each direct bucket (wire.DirectTurns, whose comment gives
// the protocol). A receiver's load stage waits on the GPU for its word
// before its first copies of a group of buckets and raises the next
// receiver's word after its last (roundTurns); a receiver that does not
// copy into its model on the GPU lets the next one go at once (passTurns).
//
// Nothing bounds a wait on the GPU, so every way out of a round lets
// every wait go: the words only grow (gpu.Stream.RaiseValue64, an atomic
// maximum, never a plain write that a late one could undo); a rank whose
// round fails, the root included, writes the round's last value into
// every word from a stream that waits for nothing (releaseTurns), above
// every value of the round that a late raise could bring; and a failed
// round leaves the Sender and every Receiver broken, so no later round
// meets those words. The driver compares a 64-bit wait cyclically
// (int64(word-value) >= 0), so a value ends the waits for those below it
// by less than 2^63: all ones would end none of them; the Sender keeps
// its round count below 2^31. Turns are a schedule and never a check: a
// wait that ends early costs speed, never bytes.

// turnBytes is the least a turn holds: with 4 GiB kernels three processes
// in turns kept 96% of one process's copy rate on an H200, with 1 GiB 85%
// and with 256 MiB 62%; a turn of several buckets queued back to back
// costs the hand-over of one long kernel (docs/benchmarks.md).
const turnBytes = 4 << 30

// maxTurnBuckets bounds a turn in buckets: the root publishes a turn and
// the next while the last receiver, waiting for its turn, acknowledges
// nothing, within the bus's window.
const maxTurnBuckets = transport.DefaultWindow / 2

// turnValue is the value of group g of round r in the turns' words.
func turnValue(round uint32, g uint64) uint64 { return uint64(round)<<32 | g }

// turnsEnd is the last value of round r, which ends each of its waits: a
// rank that does not take the round's turns raises the next rank's word
// to it, and a rank whose round fails writes it into every word.
func turnsEnd(round uint32) uint64 { return turnValue(round, 0xffffffff) }

// turnWords are a Sender's words of turns: one 64-bit word per receiver in
// device memory that the receivers map (exported with the direct buckets'
// allocations), allocated at the first round with turns and zeroed, kept
// for the Sender's life, with a stream of their own for releases.
type turnWords struct {
	buf    mem.Buffer
	n      int
	stream *gpu.Stream
	round  uint32 // the last round given turns
}

// turns returns the turns of the next round, nil where its receivers do
// not take turns: where the round is not direct, the Sender was told
// NoTurns, fewer than two receivers share the GPU, the GPU is shared
// through MPS (its kernels then run side by side), or the GPU cannot run
// the words' operations (said once to the Logger).
func (s *Sender) turns(direct bool) *wire.DirectTurns {
	if !direct || s.cfg.NoTurns || s.turnsOff {
		return nil
	}
	d, _ := s.cfg.Endpoint.(transport.DirectReader)
	n := 0
	if d != nil {
		n = d.Receivers()
	}
	if n < 2 || n > wire.MaxTurnsReceivers {
		return nil
	}
	dev, err := cudaDeviceOf(s.cfg.Pool.Buffers()[0])
	if err != nil || dev.MPS() {
		return nil
	}
	// The endpoint and the pool, so the receivers and the GPU, are the
	// Sender's for its life: the words are made once.
	w := s.words
	if w == nil {
		if w, err = newTurnWords(dev, n); err != nil {
			s.turnsOff = true
			logger := s.cfg.Logger
			if logger == nil {
				logger = slog.Default()
			}
			logger.Warn("weightcast: receivers on the sender's GPU copy without taking turns (said once)", "reason", err)
			return nil
		}
		s.words = w
	}
	if w.round >= wire.MaxTurnsRound {
		return nil // no round value left for the words
	}
	w.round++
	least := turnBytes
	if s.turnBytes > 0 {
		least = s.turnBytes
	}
	every := (least + s.cfg.Pool.BufferSize() - 1) / s.cfg.Pool.BufferSize()
	return &wire.DirectTurns{Alloc: -1, Receivers: n, Round: w.round, Every: max(1, min(every, maxTurnBuckets))}
}

// turnWordsBytes is the least the words' allocation takes: the driver's
// 2 MiB page.
const turnWordsBytes = 2 << 20

// newTurnWords allocates and zeroes n words on dev, once dev has shown
// that its waits and raises take turns (checkTurns).
func newTurnWords(dev *gpu.CUDADevice, n int) (*turnWords, error) {
	if !dev.StreamMemOps64() {
		return nil, fmt.Errorf("%s does not run 64-bit stream memory operations", dev.Name())
	}
	s, err := dev.NewStream()
	if err != nil {
		return nil, err
	}
	// A page of its own: CUDA IPC maps whole allocations, and the
	// driver may place small ones side by side in one page.
	buf, err := dev.Alloc(max(8*n, turnWordsBytes))
	if err != nil {
		return nil, errors.Join(err, s.Close())
	}
	w := &turnWords{buf: buf, n: n, stream: s}
	err = checkTurns(dev, s, buf)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), finalWait)
		defer cancel()
		if err = s.Memset(buf, 0, buf.Len(), 0); err == nil {
			err = s.Sync(ctx)
		}
	}
	if err != nil {
		return nil, errors.Join(err, w.close())
	}
	return w, nil
}

// turnsCheckWait bounds checkTurns' wait for a met wait to end.
const turnsCheckWait = 5 * time.Second

// checkTurns tries, on dev, what receivers in turns rely on, before any
// does: work queued behind a wait on the first word of buf (a stream of
// its own, queued from a goroutine of its own, which is what a receiver
// is to the next) does not run while a raise leaves the word below the
// wait's value, and runs once a raise reaches it. A GPU or driver where
// this fails takes no turns.
func checkTurns(dev *gpu.CUDADevice, s *gpu.Stream, buf mem.Buffer) (err error) {
	ctx, cancel := context.WithTimeout(context.Background(), finalWait)
	defer cancel()
	word := buf.DevicePtr()
	if err := s.Memset(buf, 0, 16, 0); err != nil {
		return err
	}
	if err := s.Sync(ctx); err != nil {
		return err
	}
	waiter, err := dev.NewStream()
	if err != nil {
		return err
	}
	queued := make(chan error, 1)
	go func() {
		err := waiter.WaitValue64(word, turnValue(1, 1))
		if err == nil {
			err = waiter.Memset(buf, 8, 8, 0xab) // the work behind the wait
		}
		queued <- err
	}()
	defer func() {
		// Whatever happened, the wait ends before the stream goes, and
		// the goroutine that queued it has returned: until then the
		// stream stays open, rather than be closed under it.
		if werr := s.WriteValue64(word, turnsEnd(1)); werr != nil {
			err = errors.Join(err, werr)
		}
		wctx, wcancel := context.WithTimeout(ctx, turnsCheckWait)
		defer wcancel()
		select {
		case <-queued:
		case <-wctx.Done():
			err = errors.Join(err, errors.New("turns: queueing a wait did not return within 5 s; leaving its stream open"))
			return
		}
		if serr := waiter.Sync(wctx); serr != nil {
			err = errors.Join(err, fmt.Errorf("turns: a met wait did not end: %w", serr))
			return
		}
		err = errors.Join(err, waiter.Close())
	}()
	marked := func() (bool, error) {
		b := make([]byte, 8)
		if err := s.CopyDtoH(b, buf, 8); err != nil {
			return false, err
		}
		return b[0] == 0xab, nil
	}
	if err := s.RaiseValue64(word, turnValue(1, 0)); err != nil {
		return err
	}
	if err := s.Sync(ctx); err != nil {
		return err
	}
	time.Sleep(time.Millisecond)
	if done, err := marked(); err != nil || done {
		return errors.Join(err, errors.New("turns: work behind a wait ran before its word reached the wait's value"))
	}
	if err := s.RaiseValue64(word, turnValue(1, 1)); err != nil {
		return err
	}
	wctx, wcancel := context.WithTimeout(ctx, turnsCheckWait)
	defer wcancel()
	select {
	case err := <-queued:
		queued <- err // for the deferred wait
		if err != nil {
			return err
		}
	case <-wctx.Done():
		return errors.New("turns: a wait was not queued within 5 s of its word's raise")
	}
	if err := waiter.Sync(wctx); err != nil {
		return fmt.Errorf("turns: the work behind a met wait did not run: %w", err)
	}
	if done, err := marked(); err != nil || !done {
		return errors.Join(err, errors.New("turns: the work behind a met wait did not run"))
	}
	return nil
}

// release writes the last value of round into every word, which ends
// every receiver's wait: the root's round failed.
func (w *turnWords) release(round uint32) error {
	if w == nil {
		return nil
	}
	return releaseWords(w.stream, w.buf.DevicePtr(), w.n, round)
}

// close frees the words and their stream, once nothing queued on it runs.
func (w *turnWords) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), finalWait)
	defer cancel()
	if err := w.stream.Sync(ctx); err != nil {
		return fmt.Errorf("turns: a release still running; leaving its words allocated: %w", err)
	}
	return errors.Join(w.buf.Free(), w.stream.Close())
}

// releaseWords queues on s a write of round's last value into each of the
// n words at words, and waits for them (at most finalWait). A plain write
// lowers no word of the round: none holds more than its last value.
func releaseWords(s *gpu.Stream, words uint64, n int, round uint32) error {
	var errs []error
	for i := range n {
		errs = append(errs, s.WriteValue64(words+8*uint64(i), turnsEnd(round)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), finalWait)
	defer cancel()
	errs = append(errs, s.Sync(ctx))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("turns: letting every receiver's wait go: %w", err)
	}
	return nil
}

// bucketTurn is a direct bucket's place in its round's turns, on a
// receiver that takes them: the words mapped here (at words) and the
// bucket's turns.
type bucketTurn struct {
	words uint64
	wire.DirectTurns
}

// roundTurns is a receiver's part in a round's turns, kept by its load
// stage (load goroutine only). Its waits and raises go on the stream of
// the copies they order.
type roundTurns struct {
	rank int // this receiver's rank, 1..Receivers
	// turns and words: the round's, from its first bucket with turns.
	turns *bucketTurn
	// open: the copies of group are queued, the next rank not yet
	// raised; took: the round had a group here, the last being group.
	open, took bool
	group      uint64
	stream     *gpu.Stream
}

// before queues, on s, what b's copies wait for: it ends an open group
// that b is not in (raising the next rank), and, where b opens a group,
// the wait for this rank's turn.
func (t *roundTurns) before(s *gpu.Stream, b *Bucket) error {
	bt := b.turn
	if t.open && (bt == nil || uint64(b.Meta.Index/bt.Every) != t.group) {
		if err := t.pass(); err != nil {
			return err
		}
	}
	if bt == nil {
		return nil
	}
	switch was := t.turns; {
	case was == nil:
		t.turns, t.stream = bt, s
	case was.words != bt.words || was.Receivers != bt.Receivers || was.Round != bt.Round || was.Every != bt.Every:
		return fmt.Errorf("bucket %d: the root changed the round's turns from %+v to %+v", b.Meta.Seq, was.DirectTurns, bt.DirectTurns)
	}
	if t.open {
		return nil
	}
	g := uint64(b.Meta.Index / bt.Every)
	var err error
	switch {
	case t.rank > 1:
		err = s.WaitValue64(bt.words+8*uint64(t.rank-1), turnValue(bt.Round, g))
	case t.took: // rank 1 waits for the last rank's end of its last group
		err = s.WaitValue64(bt.words, turnValue(bt.Round, t.group))
	}
	if err != nil {
		return fmt.Errorf("bucket %d: waiting for this rank's turn: %w", b.Meta.Seq, err)
	}
	t.open, t.took, t.group, t.stream = true, true, g, s
	return nil
}

// after ends the open group when b ends it: the last bucket of its index
// range or of the round.
func (t *roundTurns) after(b *Bucket) error {
	if !t.open || b.turn == nil || ((b.Meta.Index+1)%b.turn.Every != 0 && !b.Meta.IsLast) {
		return nil
	}
	return t.pass()
}

// pass ends the open group: once the copies queued before it have run, it
// raises the next rank's word (rank 1's, after the last) to the group's
// value.
func (t *roundTurns) pass() error {
	if !t.open {
		return nil
	}
	t.open = false
	next := t.rank % t.turns.Receivers // the next rank's word
	if err := t.stream.RaiseValue64(t.turns.words+8*uint64(next), turnValue(t.turns.Round, t.group)); err != nil {
		return fmt.Errorf("passing the turn of group %d (round %d of turns) to rank %d: %w", t.group, t.turns.Round, next+1, err)
	}
	return nil
}

// receiverOf reports whether rank takes turns of t: one of its ranks.
func receiverOf(t *wire.DirectTurns, rank int) bool { return rank >= 1 && rank <= t.Receivers }

// passTurns lets the receivers after this one go for the whole round, at
// the round's first bucket with turns: this rank copies the round some
// other way (it gathers the buckets, or sums them where they lie for a
// sink that reads them there), or does not know its rank, and so neither
// waits nor raises. It raises the next rank's word, or, not knowing which
// that is, every word, to the round's last value, on a stream that waits
// for nothing.
func (ld *Loader) passTurns(dev *gpu.CUDADevice, words uint64, t *wire.DirectTurns) error {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	if ld.passed == t.Round {
		return nil
	}
	s, err := ld.sideStream(dev)
	if err != nil {
		return err
	}
	last := turnsEnd(t.Round)
	if receiverOf(t, ld.rank) {
		err = s.RaiseValue64(words+8*uint64(ld.rank%t.Receivers), last)
	} else {
		for i := range t.Receivers {
			if err = s.RaiseValue64(words+8*uint64(i), last); err != nil {
				break
			}
		}
	}
	if err != nil {
		return fmt.Errorf("letting the receivers after this one go: %w", err)
	}
	ld.passed = t.Round
	return nil
}

// releaseTurns ends every wait of the round's turns, this rank's too: its
// round failed. It writes the round's last value into every word from the
// Loader's stream that waits for nothing, before the round's queued copies
// are waited for.
func (ld *Loader) releaseTurns(t *roundTurns) error {
	if t.turns == nil {
		return nil
	}
	ld.mu.Lock()
	s, err := ld.sideStream(t.stream.Device())
	ld.mu.Unlock() // the stream is the Loader's until Close, which no round runs beside
	if err != nil {
		return fmt.Errorf("turns: letting every receiver's wait go: %w", err)
	}
	return releaseWords(s, t.turns.words, t.turns.Receivers, t.turns.Round)
}

// sideStream returns the Loader's stream for passes and releases, which
// nothing else uses, making it at first use. ld.mu is held.
func (ld *Loader) sideStream(dev *gpu.CUDADevice) (*gpu.Stream, error) {
	if ld.side != nil && ld.side.Device() == dev {
		return ld.side, nil
	}
	if ld.side != nil {
		return nil, fmt.Errorf("turns on %s after turns on %s: give every bucket of a receiver one GPU", dev.Name(), ld.side.Device().Name())
	}
	s, err := dev.NewStream()
	if err != nil {
		return nil, err
	}
	ld.side = s
	return s, nil
}
