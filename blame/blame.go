// Package blame decides who is to blame when a rank's round fails on a
// lost peer, and says so in the round's error.
//
// When one rank fails, its neighbours usually fail within milliseconds
// too, and each hears of it by a different road: its byte transport (a
// closed connection), the metadata bus (the other side's abort, or
// silence), the rendezvous (a lease that ran out, a record tampered
// with). The first to speak is not always the one that knows why. A
// Watch is one rank's owner of those roads: it ends a running round at
// once when the bus fails for the other side's reason, after a grace
// period when the rendezvous says a peer is gone (so that the
// transports' own errors, which name the rank that failed first, win),
// and, when a round failed on a lost peer, waits a moment for the
// witnesses' word and adds it as typed causes (PeerLost, Cause).
//
// Nothing here matches error text: whether an error already says a cause
// is a question about its tree of wrapped errors (Says).
package blame

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/weightcast/weightcast/transport"
)

// Grace is how long a rank lets its transports report a failure before
// it acts on the rendezvous saying a peer is gone. The rendezvous is the
// backstop for what they cannot see (a dead NCCL peer, a stopped
// process).
const Grace = 2 * time.Second

// WitnessWait bounds how long a round that failed on a lost peer waits
// for a witness's word before the bus is aborted.
const WitnessWait = time.Second

// Witness is something that may say why a peer was lost.
type Witness struct {
	// Name introduces its word in an error: "the metadata bus".
	Name string
	// Failed is closed once it has failed.
	Failed func() <-chan struct{}
	// Err is its word once Failed is closed; nil when it has none to
	// give.
	Err func() error
}

// Bus returns the metadata bus end bus (a Publisher or Subscriber) as a
// witness named "the metadata bus", when it is a transport.Watcher.
func Bus(bus any) (Witness, bool) {
	w, ok := bus.(transport.Watcher)
	if !ok {
		return Witness{}, false
	}
	return Witness{Name: "the metadata bus", Failed: w.Failed, Err: w.Err}, true
}

// Group is what breaks when a peer of the rank is gone: its rendezvous
// group (rendezvous.Group).
type Group interface {
	// PeerGone is closed once the group broke.
	PeerGone() <-chan struct{}
	// Err says why, once PeerGone is closed.
	Err() error
}

// Watch is one rank's owner of lost-peer attribution, across its
// rounds. Its methods may be called from any goroutine; a nil *Watch
// watches no group and has no witnesses but the bus.
type Watch struct {
	group     Group // nil: no rendezvous (every rank in one process)
	witnesses []Witness
	grace     time.Duration

	mu     sync.Mutex
	goneAt time.Time // when a round or the open first saw the group break
}

// New returns the Watch of a rank in group (nil for none), with
// witnesses besides the bus that may say why a peer was lost (the
// rendezvous's verdict on tampered records).
func New(group Group, witnesses ...Witness) *Watch {
	return &Watch{group: group, witnesses: witnesses, grace: Grace}
}

// Round watches a round (or a rank's open) that runs under ctx, which
// cancel cancels: it calls cancel at once with the word of any of buses
// (metadata bus ends that are transport.Watchers) that fails, the byte
// transport, waiting for that side, may never hear of it (NCCL has no
// way to); and with the group's error once the group broke and Grace has
// passed since this Watch first saw it (the grace counts from then, so
// that short rounds after it do not each restart it). The returned stop
// ends the watching and waits for it; call it once the round returned.
func (w *Watch) Round(ctx context.Context, cancel context.CancelCauseFunc, buses ...any) (stop func()) {
	wctx, end := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, b := range buses {
		if bw, ok := b.(transport.Watcher); ok {
			wg.Go(func() {
				select {
				case <-bw.Failed():
					cancel(bw.Err())
				case <-wctx.Done():
				}
			})
		}
	}
	if w != nil && w.group != nil {
		wg.Go(func() { w.watchGroup(wctx, cancel) })
	}
	return func() {
		end()
		wg.Wait()
	}
}

func (w *Watch) watchGroup(ctx context.Context, cancel context.CancelCauseFunc) {
	select {
	case <-w.group.PeerGone():
	case <-ctx.Done():
		return
	}
	w.mu.Lock()
	if w.goneAt.IsZero() {
		w.goneAt = time.Now()
	}
	grace := time.NewTimer(max(w.grace-time.Since(w.goneAt), 0))
	w.mu.Unlock()
	defer grace.Stop()
	select {
	case <-grace.C:
		cancel(w.group.Err())
	case <-ctx.Done():
	}
}

// GroupBroke reports whether cause, the cause of a context Round
// watched, is the group's error: the group broke while the work ran.
func (w *Watch) GroupBroke(cause error) bool {
	if w == nil || w.group == nil || cause == nil {
		return false
	}
	gerr := w.group.Err()
	return gerr != nil && cause == gerr
}

// Lost returns err, the error of a round that failed, with what the
// witnesses say added when it failed on a lost peer
// (transport.ErrPeerGone): a neighbour that stopped because the root gave
// up or fell silent, or because its record was tampered with, hangs up on
// this rank a moment before this rank hears the same (each rank's
// liveness runs out on its own clock). So Lost first waits, WitnessWait
// at most, for bus (when it is a transport.Watcher) or one of the Watch's
// witnesses to fail with a word, then returns a *PeerLost with every word
// then known that err does not already say. Otherwise it returns err.
func (w *Watch) Lost(err error, bus any) error {
	if !errors.Is(err, transport.ErrPeerGone) {
		return err
	}
	var ws []Witness
	if b, ok := Bus(bus); ok {
		ws = append(ws, b)
	}
	if w != nil {
		ws = append(ws, w.witnesses...)
	}
	return hear(err, ws)
}

// Abort ends the metadata bus end bus (a Publisher or Subscriber) after
// this rank's round failed with err, telling the other side why (when bus
// is a transport.Aborter), and returns err with what the witnesses say
// added (Lost), so that the other side is told the real reason, not a
// neighbour's hang-up alone. w may be nil.
func (w *Watch) Abort(err error, bus any) error {
	err = w.Lost(err, bus)
	if a, ok := bus.(transport.Aborter); ok {
		a.Abort(err)
	}
	return err
}

// hear waits, WitnessWait at most, until one of ws has failed with a
// word, and returns err with each word ws give then that it does not
// already say.
func hear(err error, ws []Witness) error {
	if len(ws) == 0 {
		return err
	}
	said := make(chan struct{}, len(ws))
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(func() {
			select {
			case <-w.Failed():
				if w.Err() != nil {
					said <- struct{}{}
				}
			case <-done:
			}
		})
	}
	t := time.NewTimer(WitnessWait)
	select {
	case <-said:
	case <-t.C:
	}
	t.Stop()
	close(done)
	wg.Wait()
	lost := &PeerLost{Err: err}
	for _, w := range ws {
		select {
		case <-w.Failed():
		default:
			continue
		}
		if werr := w.Err(); werr != nil && !Says(lost, werr) {
			lost.Causes = append(lost.Causes, Cause{Witness: w.Name, Err: werr})
		}
	}
	if len(lost.Causes) == 0 {
		return err
	}
	return lost
}

// Merge returns err, the error of work whose context ended with cause,
// with the cause added (" (cause: ...)") unless it is nil, plain
// cancellation, or already said by err.
func Merge(err, cause error) error {
	if err == nil || cause == nil || cause == context.Canceled || Says(err, cause) {
		return err
	}
	return fmt.Errorf("%w (cause: %w)", err, cause)
}

// PeerLost is the error of a round that failed on a lost peer, with what
// witnesses said of it. It matches what Err matches (errors.Is), and
// Ranks says which ranks the errors blame.
type PeerLost struct {
	// Err is the round's own error (it wraps transport.ErrPeerGone).
	Err error
	// Causes are the witnesses' words, in the order they were asked.
	Causes []Cause
}

// Error is Err's text and each cause's in parentheses:
// "... (the metadata bus: the root gave up: ...)".
func (e *PeerLost) Error() string {
	var b strings.Builder
	b.WriteString(e.Err.Error())
	for _, c := range e.Causes {
		b.WriteString(" (")
		b.WriteString(c.Error())
		b.WriteString(")")
	}
	return b.String()
}

// Unwrap returns Err: the causes are words about the failure, not what
// it is, so KindOf and errors.Is see the round's own error.
func (e *PeerLost) Unwrap() error { return e.Err }

// Ranks are the ranks that Err and the causes name as at fault (a
// transport.Error's Peer, a rendezvous error's Ranks: anything in their
// trees with a FaultRanks method), sorted, each once.
func (e *PeerLost) Ranks() []int {
	var out []int
	for _, err := range append([]error{e.Err}, causeErrs(e.Causes)...) {
		walk(err, func(x error) bool {
			if f, ok := x.(interface{ FaultRanks() []int }); ok {
				out = append(out, f.FaultRanks()...)
			}
			return false
		})
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func causeErrs(cs []Cause) []error {
	out := make([]error, len(cs))
	for i, c := range cs {
		out[i] = c.Err
	}
	return out
}

// Cause is one witness's word on a lost peer.
type Cause struct {
	Witness string // "the metadata bus", "the rendezvous"
	Err     error
}

// Error is "witness: word".
func (c Cause) Error() string { return c.Witness + ": " + c.Err.Error() }

// Unwrap returns the word.
func (c Cause) Unwrap() error { return c.Err }

// Says reports whether err already carries cause: cause is in err's tree
// of wrapped errors (errors.Is), or is, or is carried by, the cause of a
// context error in it (transport.CanceledError, from
// transport.ContextErr), or of a word a PeerLost in it gives.
func Says(err, cause error) bool {
	if cause == nil {
		return true
	}
	return walk(err, func(x error) bool {
		if errors.Is(x, cause) {
			return true
		}
		var because error
		switch e := x.(type) {
		case *transport.CanceledError:
			because = e.Cause
		case *PeerLost:
			for _, c := range e.Causes {
				if Says(c.Err, cause) {
					return true
				}
			}
		}
		return because != nil && Says(because, cause)
	})
}

// walk calls f on err and every error wrapped in it, depth first, until f
// returns true, and reports whether it did.
func walk(err error, f func(error) bool) bool {
	if err == nil {
		return false
	}
	if f(err) {
		return true
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return walk(u.Unwrap(), f)
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if walk(e, f) {
				return true
			}
		}
	}
	return false
}
