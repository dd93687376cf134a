//go:build cgo

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/weightcast/weightcast"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/route"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/stages"
)

// Status codes, as weightcast.h defines them.
const (
	wcOK       = 0
	wcAgain    = 1
	wcDone     = 2
	wcErrOther = -1
	wcErrPanic = -8
)

// codeOf maps an error to its WC_ERR_* code.
func codeOf(err error) int {
	switch weightcast.KindOf(err) {
	case weightcast.KindNone:
		return wcOK
	case weightcast.KindConfig:
		return -2
	case weightcast.KindTimeout:
		return -3
	case weightcast.KindPeerGone:
		return -4
	case weightcast.KindChecksum:
		return -5
	case weightcast.KindClosed:
		return -6
	case weightcast.KindAborted:
		return -7
	}
	return wcErrOther
}

// call runs the body of an exported function: a panic becomes
// WC_ERR_PANIC with its text and stack, an error its code; the text of
// either goes to setErr (the calling thread's last error), with the
// error's field detail (fieldDetail) or "".
func call(setErr func(text, field string), body func() (int, error)) (code int) {
	defer func() {
		if p := recover(); p != nil {
			setErr(fmt.Sprintf("weightcast: internal error, please report it: panic: %v\n%s", p, debug.Stack()), "")
			code = wcErrPanic
		}
	}()
	code, err := body()
	if err != nil {
		setErr(err.Error(), fieldDetail(err))
		if c := codeOf(err); c < 0 {
			return c
		}
		return wcErrOther
	}
	return code
}

// handles maps the integers C holds to Go objects. Handles are not reused.
var handles = struct {
	sync.Mutex
	next int64
	m    map[int64]any
}{m: map[int64]any{}}

func register(v any) int64 {
	handles.Lock()
	defer handles.Unlock()
	handles.next++
	handles.m[handles.next] = v
	return handles.next
}

func lookup[T any](h int64) (T, error) {
	handles.Lock()
	v, ok := handles.m[h]
	handles.Unlock()
	t, isT := v.(T)
	switch {
	case !ok:
		return t, fmt.Errorf("handle %d: %w (or never opened)", h, weightcast.ErrClosed)
	case !isT:
		return t, fmt.Errorf("%w: handle %d is a %s; this call takes another kind", weightcast.ErrConfig, h, kindName(v))
	}
	return t, nil
}

func kindName(v any) string {
	switch v.(type) {
	case *senderHandle:
		return "sender"
	case *receiverHandle:
		return "receiver"
	}
	return fmt.Sprintf("%T", v)
}

// closeHandle removes h from the table and closes its object.
func closeHandle(h int64) error {
	handles.Lock()
	v, ok := handles.m[h]
	delete(handles.m, h)
	handles.Unlock()
	if !ok {
		return nil // closing twice is fine
	}
	return v.(interface{ close() error }).close()
}

// openSet holds the contexts of the opens in flight, so that wc_interrupt
// can end them (an open waits for every rank to join, for minutes at most).
type openSet struct {
	mu   sync.Mutex
	next int
	m    map[int]context.CancelCauseFunc
}

var opens = openSet{m: map[int]context.CancelCauseFunc{}}

// start returns the context of one open and the function that ends it.
func (s *openSet) start() (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	s.mu.Lock()
	id := s.next
	s.next++
	s.m[id] = cancel
	s.mu.Unlock()
	return ctx, func() {
		s.mu.Lock()
		delete(s.m, id)
		s.mu.Unlock()
		cancel(nil)
	}
}

// interrupt ends every open in flight with reason, and returns how many.
func (s *openSet) interrupt(reason string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, cancel := range s.m {
		cancel(fmt.Errorf("%w: %s", weightcast.ErrInterrupted, reason))
	}
	return len(s.m)
}

// roundRunner runs one round at a time on a goroutine it owns.
type roundRunner struct {
	mu   sync.Mutex
	done chan struct{}     // the running round's; nil when none
	err  error             // its result, once done is closed
	into bool              // the running round was started by wc_receive_into
	last stages.RoundStats // the last round's, once it ended (Version 0: none yet)
	// routed is the last routed round's (routed.go).
	routed routedStats
}

// start runs fn on a new goroutine, refusing while a round runs.
func (r *roundRunner) start(what string, into bool, fn func() (stages.RoundStats, error)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done != nil {
		return fmt.Errorf("%w: a round is already running; wait for it (wc_wait, wc_next) before %s", weightcast.ErrConfig, what)
	}
	done := make(chan struct{})
	r.done, r.into = done, into
	go func() {
		defer close(done)
		st, err := fn()
		r.mu.Lock()
		r.err, r.last = err, st
		r.mu.Unlock()
	}()
	return nil
}

// running returns the running round's done channel, or nil.
func (r *roundRunner) running() chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done
}

// finish takes the result of the round whose done is closed.
func (r *roundRunner) finish() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	err := r.err
	r.done, r.err, r.into = nil, nil, false
	return err
}

// runningInto reports whether the running round was started by
// wc_receive_into.
func (r *roundRunner) runningInto() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done != nil && r.into
}

// join waits for a running round to end (after its context was cancelled).
func (r *roundRunner) join() {
	if d := r.running(); d != nil {
		<-d
	}
}

// waitFor waits at most ms for done.
func waitFor(done <-chan struct{}, ms int32) bool {
	if ms <= 0 {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
	t := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

type senderHandle struct {
	s *weightcast.Sender
	roundRunner
}

func openSender(text string) (int64, error) {
	o, err := parseConfig(text, getenv)
	if err != nil {
		return 0, err
	}
	ctx, done := opens.start()
	defer done()
	s, err := weightcast.OpenSender(ctx, o)
	if err != nil {
		return 0, err
	}
	return register(&senderHandle{s: s}), nil
}

// send starts the round of refs.
func (h *senderHandle) send(version uint64, refs []weightcast.Ref) error {
	return h.start("sending another", false, func() (stages.RoundStats, error) {
		return h.s.SendRefs(context.Background(), refs, version)
	})
}

// wait waits at most ms for the round wc_send or wc_receive_into started.
func (r *roundRunner) wait(ms int32) (int, error) {
	done := r.running()
	if done == nil {
		return 0, fmt.Errorf("%w: no round is running: wc_wait follows wc_send or wc_receive_into", weightcast.ErrConfig)
	}
	if !waitFor(done, ms) {
		return wcAgain, nil
	}
	return wcOK, r.finish()
}

func (h *senderHandle) close() error {
	err := h.s.Close() // ends a running round first
	h.join()
	return err
}

type receiverHandle struct {
	r     *weightcast.Receiver
	views *sink.Views
	dev   *gpu.CUDADevice // the receiver's GPU, when its buckets are on one
	roundRunner

	mu     sync.Mutex
	held   *sink.Batch   // handed out by next, not yet released
	out    cMemory       // the C memory describing held (a *cBatch or *cViews)
	shards *route.Shards // a routed receiver's rounds (routed.go), C memory
}

// cMemory is a batch's description in C memory, freed with the batch.
type cMemory interface{ free() }

func openReceiver(text string) (int64, error) {
	o, err := parseConfig(text, getenv)
	if err != nil {
		return 0, err
	}
	ctx, done := opens.start()
	defer done()
	r, err := weightcast.OpenReceiver(ctx, o)
	if err != nil {
		return 0, err
	}
	h := &receiverHandle{r: r, views: sink.NewViews(cHost{}, o.Timeout)}
	h.dev, _ = r.Device().(*gpu.CUDADevice)
	return register(h), nil
}

// receive starts a round.
func (h *receiverHandle) receive() error {
	return h.start("receiving another", false, func() (stages.RoundStats, error) {
		return h.r.Receive(context.Background(), h.views)
	})
}

// receiveInto starts a round written straight into refs.
func (h *receiverHandle) receiveInto(refs []weightcast.Ref) error {
	return h.start("receiving another", true, func() (stages.RoundStats, error) {
		return h.r.ReceiveInto(context.Background(), refs)
	})
}

// waitInto waits at most ms for the round wc_receive_into started; a round
// wc_receive started is taken with wc_next instead (waiting for it would
// wait for ever: nobody takes its batches).
func (h *receiverHandle) waitInto(ms int32) (int, error) {
	if h.running() != nil && !h.runningInto() {
		return 0, fmt.Errorf("%w: the running round was started by wc_receive: take it with wc_next (wc_wait follows wc_receive_into)", weightcast.ErrConfig)
	}
	return h.wait(ms)
}

// next releases the batch handed out before, after an event on stream,
// and waits at most ms for the next one, which it describes in C memory
// as a wc_batch.
func (h *receiverHandle) next(stream uintptr, ms int32) (int, *cBatch, error) {
	code, out, err := h.nextAs(stream, ms, func(b *sink.Batch) cMemory { return newCBatch(b) })
	c, _ := out.(*cBatch)
	return code, c, err
}

// nextAs is next with the description of the batch made by describe.
func (h *receiverHandle) nextAs(stream uintptr, ms int32, describe func(*sink.Batch) cMemory) (int, cMemory, error) {
	done := h.running()
	if done == nil {
		return 0, nil, fmt.Errorf("%w: no round is running: wc_next follows wc_receive", weightcast.ErrConfig)
	}
	if h.runningInto() {
		return 0, nil, fmt.Errorf("%w: the running round was started by wc_receive_into: wait for it with wc_wait", weightcast.ErrConfig)
	}
	if err := h.release(stream); err != nil {
		return 0, nil, err
	}
	timer := time.NewTimer(time.Duration(max(ms, 0)) * time.Millisecond)
	defer timer.Stop()
	select {
	case b := <-h.views.Batches():
		out := describe(b)
		h.mu.Lock()
		h.held, h.out = b, out
		h.mu.Unlock()
		return wcOK, out, nil
	case <-done:
		if err := h.finish(); err != nil {
			return 0, nil, err
		}
		return wcDone, nil, nil
	case <-timer.C:
		return wcAgain, nil, nil
	}
}

// release hands the batch back, after an event recorded on stream when
// the buckets are on a GPU, and frees its C description.
func (h *receiverHandle) release(stream uintptr) error {
	h.mu.Lock()
	b, out := h.held, h.out
	h.held, h.out = nil, nil
	h.mu.Unlock()
	if b == nil {
		return nil
	}
	out.free()
	var ev *gpu.Event
	if h.dev != nil {
		var err error
		if ev, err = h.dev.RecordOn(stream); err != nil {
			b.Release(nil)
			return fmt.Errorf("recording the end of the work queued on stream %#x: %w", stream, err)
		}
	}
	b.Release(ev)
	return nil
}

func (h *receiverHandle) close() error {
	err := h.r.Close() // ends a running round first
	h.join()
	h.mu.Lock()
	if h.out != nil {
		h.out.free()
	}
	h.held, h.out = nil, nil
	if h.shards != nil {
		err = errors.Join(err, h.shards.Close())
	}
	h.mu.Unlock()
	return errors.Join(err, h.views.Close())
}

// abort fails the handle's round on every rank.
func abort(h int64, reason string) error {
	handles.Lock()
	v, ok := handles.m[h]
	handles.Unlock()
	if !ok {
		return fmt.Errorf("handle %d: %w (or never opened)", h, weightcast.ErrClosed)
	}
	cause := errors.New(reason)
	switch v := v.(type) {
	case *senderHandle:
		v.s.Abort(cause)
	case *receiverHandle:
		v.r.Abort(cause)
	}
	return nil
}

// info describes a handle as JSON.
func info(h int64) (string, error) {
	handles.Lock()
	v, ok := handles.m[h]
	handles.Unlock()
	if !ok {
		return "", fmt.Errorf("handle %d: %w (or never opened)", h, weightcast.ErrClosed)
	}
	var m interface {
		Rank() int
		WorldSize() int
		Transport() (string, string)
	}
	var dev string
	var ordinal = -1
	var runner *roundRunner
	switch v := v.(type) {
	case *senderHandle:
		m, dev, runner = v.s, v.s.Device().Name(), &v.roundRunner
		if d, ok := v.s.Device().(*gpu.CUDADevice); ok {
			ordinal = d.Ordinal()
		}
	case *receiverHandle:
		m, dev, runner = v.r, v.r.Device().Name(), &v.roundRunner
		if v.dev != nil {
			ordinal = v.dev.Ordinal()
		}
	}
	name, reason := m.Transport()
	out := map[string]any{"role": kindName(v), "rank": m.Rank(), "world_size": m.WorldSize(), "transport": name, "reason": reason, "device": dev, "cuda": ordinal}
	runner.mu.Lock()
	if st := runner.last; st.Version != 0 && runner.done == nil {
		lr := map[string]any{"version": st.Version, "bytes": st.Bytes, "buckets": st.Buckets, "tensors": st.Tensors, "seconds": st.Duration.Seconds()}
		if rs := runner.routed; rs.ok {
			lr["bytes_sent"], lr["bytes_received"], lr["plan"], lr["waited"] = rs.sent, rs.received, rs.plan, rs.waited
		}
		out["last_round"] = lr
	}
	runner.mu.Unlock()
	b, err := json.Marshal(out)
	return string(b), err
}
