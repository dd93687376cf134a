package transporttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
)

// scenario is one case of the suite: what each rank does, written once
// for every rank (a rank tells its part by its number), and the bounds it
// runs under. A rank's part returns its failure as an error, so that it
// plays alike on a goroutine and in a child process.
type scenario struct {
	name string
	// world is the case's world size; 0 means each of the suite's.
	world int
	// timeout is each rank's Config.Timeout, and collectiveTimeout that
	// of a Collective suite's ranks where it is set.
	timeout, collectiveTimeout time.Duration
	// limit bounds the whole case on every rank.
	limit time.Duration
	// departs: rank leaver(world) leaves after bucket 0, by Close on a
	// goroutine and by SIGKILL of its own process in a child.
	departs bool
	// clean: every rank's Close after the case must succeed.
	clean bool
	play  func(ctx context.Context, r *rank) error
}

// waitBound is the Config.Timeout of the case's ranks in suite s.
func (c *scenario) waitBound(s *Suite) time.Duration {
	if s.Collective && c.collectiveTimeout > 0 {
		return c.collectiveTimeout
	}
	return c.timeout
}

// leaver is the rank that leaves in a case that departs: one in the middle
// of a chain where there is one (rank 2 of 4), rank 1 of 2.
func leaver(world int) int { return world / 2 }

// scenarios are the suite's cases, in the order they run: the receiver
// that goes away last, since a peer killed in the middle of a collective
// may leave this process's GPU context unusable.
var scenarios = []*scenario{
	{name: "Buckets", timeout: 30 * time.Second, limit: 3 * time.Minute, clean: true, play: playBuckets},
	{name: "Refusals", world: 2, timeout: 10 * time.Second, limit: time.Minute, play: playRefusals},
	{name: "Close", world: 2, timeout: 10 * time.Second, limit: time.Minute, clean: true, play: playClose},
	{name: "CancelRoot", world: 2, timeout: 20 * time.Second, collectiveTimeout: 8 * time.Second, limit: time.Minute, play: playCancel(0)},
	{name: "CancelReceiver", world: 2, timeout: 20 * time.Second, collectiveTimeout: 8 * time.Second, limit: time.Minute, play: playCancel(1)},
	{name: "TimeoutRoot", world: 2, timeout: time.Second, limit: time.Minute, play: playTimeout(0)},
	{name: "TimeoutReceiver", world: 2, timeout: time.Second, limit: time.Minute, play: playTimeout(1)},
	{name: "ReceiverGone", timeout: time.Minute, collectiveTimeout: 5 * time.Second, limit: 2 * time.Minute, departs: true, play: playGone},
}

// scenarioNamed returns the case called name, or nil.
func scenarioNamed(name string) *scenario {
	if i := slices.IndexFunc(scenarios, func(c *scenario) bool { return c.name == name }); i >= 0 {
		return scenarios[i]
	}
	return nil
}

// rank is one rank playing a case.
type rank struct {
	cfg    transport.Config
	suite  *Suite
	ep     transport.Endpoint
	dev    Device
	depart func() // leaves the group (cases that depart)
}

func (r *rank) root() bool { return r.cfg.Rank == 0 }

// buffers allocates the rank's two buffers of the suite's largest bucket,
// as a Pool holds them, and returns a function that frees them.
func (r *rank) buffers() ([2]mem.Buffer, func(), error) {
	var bufs [2]mem.Buffer
	free := func() {
		for _, b := range bufs {
			if b != nil {
				b.Free()
			}
		}
	}
	for i := range bufs {
		b, err := r.dev.Mem().Alloc(r.suite.maxBucket())
		if err != nil {
			free()
			return bufs, func() {}, fmt.Errorf("allocating a %d-byte buffer on %s: %w", r.suite.maxBucket(), r.dev.Mem().Name(), err)
		}
		bufs[i] = b
	}
	return bufs, free, nil
}

// noise is a block of random bytes that payloads are windows of, made
// once per process (and grown when a suite needs longer buckets), since
// drawing fresh bytes for every bucket on every rank would take longer
// than moving them.
var noise struct {
	sync.Mutex
	b []byte
}

// payloadShift is how far apart the windows of two buckets in a row
// start, so that a receiver that got the wrong bucket is caught.
const payloadShift = 4099

// payload is bucket seq's first n bytes, which every rank computes alike.
// It must not be written to.
func payload(seq uint64, n int) []byte {
	off := int(seq%61) * payloadShift
	noise.Lock()
	defer noise.Unlock()
	if len(noise.b) < off+n {
		noise.b = make([]byte, 61*payloadShift+n)
		rand.NewChaCha8([32]byte{'w', 'c'}).Read(noise.b)
	}
	return noise.b[off : off+n : off+n]
}

// broadcast plays r's part of bucket seq of n bytes in b: the root packs
// the bucket's payload into b first.
func (r *rank) broadcast(ctx context.Context, seq uint64, b mem.Buffer, n int) error {
	b, err := r.pack(seq, b, n)
	if err != nil {
		return err
	}
	return r.ep.Broadcast(ctx, seq, b, n)
}

// pack returns b, on the root with bucket seq's payload packed into it.
func (r *rank) pack(seq uint64, b mem.Buffer, n int) (mem.Buffer, error) {
	if !r.root() {
		return b, nil
	}
	packed, err := r.dev.Pack(b, payload(seq, n))
	if err != nil {
		return nil, fmt.Errorf("packing bucket %d: %w", seq, err)
	}
	return packed, nil
}

// untilFailure broadcasts full buckets from seq on, alternating bufs,
// until one fails: once, or for the root of a Collective suite up to four
// times (its broadcast may finish into its peers' buffers before they
// take part). It returns the failing call's bucket, how long the call took
// (packing aside), and its error.
func (r *rank) untilFailure(ctx context.Context, bufs [2]mem.Buffer, seq uint64) (uint64, time.Duration, error) {
	tries := 1
	if r.suite.Collective && r.root() {
		tries = 4
	}
	n := r.suite.maxBucket()
	for i := range tries {
		s := seq + uint64(i)
		b, err := r.pack(s, bufs[s%2], n)
		if err != nil {
			return s, 0, err
		}
		start := time.Now()
		if err := r.ep.Broadcast(ctx, s, b, n); err != nil {
			return s, time.Since(start), err
		}
	}
	return seq, 0, nil
}

// anyPeer is a failure.peer that lets the error name any rank, or none.
const anyPeer = -2

// failure is what a failed call must look like.
type failure struct {
	what string // the call, for messages
	seq  uint64 // the bucket the error must name
	// peer is the rank at fault the error must name, -1 where it must
	// name none, or anyPeer. A Collective suite's errors need not name
	// the rank at fault.
	peer int
	is   []error // it must wrap one of these, where there are any
	// after and within bound how long the call took: a wait that ends
	// before its bound is as wrong as one that ends long after it.
	after, within time.Duration
}

// check returns why err, from a call of r's that took took, is not the
// failure f, or nil where it is.
func (r *rank) check(err error, took time.Duration, f failure) error {
	if err == nil {
		return fmt.Errorf("%s succeeded", f.what)
	}
	var te *transport.Error
	if !errors.As(err, &te) {
		return fmt.Errorf("%s: %v; want a *transport.Error", f.what, err)
	}
	if te.Group != r.cfg.Group || te.Rank != r.cfg.Rank || !te.HasSeq || te.Seq != f.seq {
		return fmt.Errorf("%s: %v; want an error naming group %q, rank %d and bucket %d", f.what, err, r.cfg.Group, r.cfg.Rank, f.seq)
	}
	if len(f.is) > 0 && !slices.ContainsFunc(f.is, func(target error) bool { return errors.Is(err, target) }) {
		want := make([]string, len(f.is))
		for i, e := range f.is {
			want[i] = fmt.Sprintf("%q", e)
		}
		return fmt.Errorf("%s: %v; want it to wrap %s", f.what, err, strings.Join(want, " or "))
	}
	if f.peer != anyPeer && (f.peer == -1 || !r.suite.Collective) && te.Peer != f.peer {
		want := fmt.Sprintf("name peer rank %d", f.peer)
		if f.peer == -1 {
			want = "blame no peer"
		}
		return fmt.Errorf("%s: %v; want it to %s (Peer is %d)", f.what, err, want, te.Peer)
	}
	if took < f.after {
		return fmt.Errorf("%s: %v after only %v; want it not before %v", f.what, err, took.Round(time.Millisecond), f.after)
	}
	if f.within > 0 && took > f.within {
		return fmt.Errorf("%s: %v after %v; want it within %v", f.what, err, took.Round(time.Millisecond), f.within)
	}
	return nil
}

// done waits until every rank of the case has reached its end, through the
// group's exchange (not the transport), and joins that wait's error to
// failed.
func (r *rank) done(ctx context.Context, failed error) error {
	return errors.Join(failed, Barrier(ctx, r.cfg.Exchange, "done", r.cfg.WorldSize))
}

// bucketSizes is the sequence of bucket lengths of a round: edge cases from
// 0 bytes up to max, then random ones.
func bucketSizes(max int) []int {
	var sizes []int
	for _, n := range []int{0, 1, 7, 63, 64, 65, 4096, 1 << 20, 3<<20 + 5, max} {
		if n <= max && !slices.Contains(sizes, n) {
			sizes = append(sizes, n)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 3 {
		sizes = append(sizes, rng.IntN(max+1))
	}
	return sizes
}

// guard is how many bytes past each bucket a receiver checks for writes
// that overran the bucket: more than a transport rounds up to (a chunk, a
// page), fewer than the whole buffer, which would make the suite copy
// mostly bytes no transport touches.
const guard = 64 << 10

// playBuckets moves two rounds of buckets of bucketSizes, one sequence
// across both, through the rank's two buffers in turn; every receiver
// checks every byte of each, and that the guard bytes past it did not
// change.
func playBuckets(ctx context.Context, r *rank) error {
	bufs, free, err := r.buffers()
	defer free()
	if err != nil {
		return err
	}
	size := r.suite.maxBucket()
	sentinel := bytes.Repeat([]byte{0xA5}, size)
	var seq uint64
	for round := 1; round <= 2; round++ {
		for _, n := range bucketSizes(size) {
			b, checked := bufs[seq%2], min(size, n+guard)
			if !r.root() {
				if err := r.dev.Write(ctx, b, 0, sentinel[:checked]); err != nil {
					return err
				}
			}
			if err := r.broadcast(ctx, seq, b, n); err != nil {
				return fmt.Errorf("round %d, bucket %d (%d bytes): %w", round, seq, n, err)
			}
			if !r.root() {
				got, err := r.dev.Read(ctx, b, 0, checked)
				if err != nil {
					return err
				}
				if i := firstDiff(got[:n], payload(seq, n)); i >= 0 {
					return fmt.Errorf("round %d, bucket %d (%d bytes): byte %d differs from the root's", round, seq, n, i)
				}
				if i := firstDiff(got[n:], sentinel[n:checked]); i >= 0 {
					return fmt.Errorf("round %d, bucket %d (%d bytes): byte %d of the buffer, past the bucket, changed", round, seq, n, n+i)
				}
			}
			seq++
		}
	}
	return nil
}

// firstDiff returns the index of the first byte where a and b (of one
// length) differ, or -1.
func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

// playRefusals hands Broadcast a length outside the buffer, one past its
// end on the root and -1 on receivers: each must refuse at once, blaming
// no peer.
func playRefusals(ctx context.Context, r *rank) error {
	bufs, free, err := r.buffers()
	defer free()
	if err != nil {
		return err
	}
	n := -1
	if r.root() {
		n = bufs[0].Len() + 1
	}
	start := time.Now()
	err = r.ep.Broadcast(ctx, 0, bufs[0], n)
	return r.check(err, time.Since(start), failure{
		what: fmt.Sprintf("Broadcast of %d bytes from a %d-byte buffer", n, bufs[0].Len()),
		peer: -1, within: 5 * time.Second,
	})
}

// playClose closes every rank's endpoint twice, both times without error,
// and then calls Broadcast, which must fail at once with ErrClosed.
func playClose(ctx context.Context, r *rank) error {
	bufs, free, err := r.buffers()
	defer free()
	if err != nil {
		return err
	}
	for i := 1; i <= 2; i++ {
		if err := r.ep.Close(); err != nil {
			return fmt.Errorf("Close #%d: %w", i, err)
		}
	}
	start := time.Now()
	err = r.broadcast(ctx, 0, bufs[0], 1)
	return r.check(err, time.Since(start), failure{
		what: "Broadcast after Close",
		peer: -1, is: []error{transport.ErrClosed}, within: 5 * time.Second,
	})
}

// playCancel: rank who calls Broadcast with a context cancelled 50 ms
// later while its peer stays silent; it must return within 5 s (its wait
// bound is 20 s, 8 s for a Collective transport, whose peer's Close may
// wait that long for the aborted rank) with an error wrapping
// context.Canceled.
func playCancel(who int) func(ctx context.Context, r *rank) error {
	return playAlone(who, func(ctx context.Context) (context.Context, func()) {
		cctx, cancel := context.WithCancel(ctx)
		t := time.AfterFunc(50*time.Millisecond, cancel)
		return cctx, func() { t.Stop(); cancel() }
	}, func(r *rank) failure {
		return failure{what: "a Broadcast cancelled while its peer is silent", peer: anyPeer, is: []error{context.Canceled}, within: 5 * time.Second}
	})
}

// playTimeout: rank who calls Broadcast while its peer stays silent; it
// must fail with ErrTimeout naming that peer when its wait bound (1 s)
// ends: not before, and not 10 s after.
func playTimeout(who int) func(ctx context.Context, r *rank) error {
	return playAlone(who, func(ctx context.Context) (context.Context, func()) { return ctx, func() {} }, func(r *rank) failure {
		bound := r.cfg.WaitTimeout()
		return failure{
			what: fmt.Sprintf("a Broadcast whose peer stays silent, with a wait bound of %v", bound),
			peer: 1 - who, is: []error{transport.ErrTimeout}, after: bound * 9 / 10, within: bound + 10*time.Second,
		}
	})
}

// playAlone returns a case in which rank who alone calls Broadcast, with
// the context that bound derives from the case's, while its peer stays
// silent until the end; the call must fail as want says.
func playAlone(who int, bound func(context.Context) (context.Context, func()), want func(r *rank) failure) func(ctx context.Context, r *rank) error {
	return func(ctx context.Context, r *rank) error {
		if r.cfg.Rank != who {
			return r.done(ctx, nil)
		}
		bufs, free, err := r.buffers()
		defer free()
		if err != nil {
			return err
		}
		bctx, stop := bound(ctx)
		defer stop()
		seq, took, err := r.untilFailure(bctx, bufs, 0)
		f := want(r)
		f.seq = seq
		return r.done(ctx, r.check(err, took, f))
	}
}

// playGone: after bucket 0, rank leaver(world) leaves (Close on a
// goroutine, SIGKILL of its process in a child). The root's next
// broadcast must fail with ErrPeerGone naming it within 10 s, well inside
// the wait bound (a Collective transport: with ErrPeerGone or ErrTimeout,
// within its short bound and 10 s), then the root closes; every other
// receiver must end its wait with a *transport.Error as promptly.
func playGone(ctx context.Context, r *rank) error {
	bufs, free, err := r.buffers()
	defer free()
	if err != nil {
		return err
	}
	gone := leaver(r.cfg.WorldSize)
	if err := r.broadcast(ctx, 0, bufs[0], r.suite.maxBucket()); err != nil {
		return fmt.Errorf("bucket 0, before rank %d leaves: %w", gone, err)
	}
	want := failure{peer: gone, is: []error{transport.ErrPeerGone}, within: 10 * time.Second}
	if r.suite.Collective {
		want.is = append(want.is, transport.ErrTimeout)
		want.within += r.cfg.WaitTimeout()
	}
	switch r.cfg.Rank {
	case gone:
		r.depart()
		return nil
	case 0:
		seq, took, err := r.untilFailure(ctx, bufs, 1)
		r.ep.Close() // the receivers still waiting learn that the root is gone
		want.what, want.seq = fmt.Sprintf("the root's Broadcast after rank %d left", gone), seq
		return r.check(err, took, want)
	}
	for seq := uint64(1); seq <= 8; seq++ {
		start := time.Now()
		if err := r.broadcast(ctx, seq, bufs[seq%2], r.suite.maxBucket()); err != nil {
			want.what, want.seq, want.peer, want.is = fmt.Sprintf("a Broadcast after rank %d left", gone), seq, anyPeer, nil
			return r.check(err, time.Since(start), want)
		}
	}
	return fmt.Errorf("rank %d left after bucket 0, and this rank still received 8 more", gone)
}
