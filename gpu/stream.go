package gpu

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/weightcast/weightcast/mem"
)

// Stream is a CUDA stream of one device: work queued on it runs in order,
// asynchronously to the host. Create it with (*CUDADevice).NewStream. A
// Stream may be used from several goroutines, but the order of work queued
// concurrently is then unspecified.
//
// Host memory handed to a copy: pinned memory (AllocPinned) is read or
// written asynchronously, so it must stay allocated and untouched until the
// copy is known finished (Sync, or an Event recorded after it). Ordinary Go
// memory is staged by the driver: the call returns once the source bytes are
// taken (host to device) or the copy is complete (device to host), so Go
// memory is never used after the call returns.
type Stream struct {
	d      *CUDADevice
	s      cuStream
	closed bool
}

// NewStream creates a stream that does not synchronize with the legacy
// default stream (CU_STREAM_NON_BLOCKING). Close it when done.
func (d *CUDADevice) NewStream() (*Stream, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	h, r := cuStreamCreate(d.ctx)
	if r != 0 {
		return nil, d.err("cuStreamCreate", "", r)
	}
	return &Stream{d: d, s: h}, nil
}

// Device returns the stream's device.
func (s *Stream) Device() *CUDADevice { return s.d }

// Handle returns the CUstream, to hand to another CUDA library loaded in
// this process (NCCL). It stays valid until Close.
func (s *Stream) Handle() uintptr { return uintptr(s.s) }

func (s *Stream) check() error {
	if s.closed {
		return fmt.Errorf("gpu: stream of cuda:%d used after Close", s.d.ordinal)
	}
	return s.d.checkOpen()
}

// devRange returns the device address of b[off:off+n] after checking that b
// is live device memory and the range lies inside it.
func devRange(b mem.Buffer, off, n int) (uint64, error) {
	if db, ok := b.(*deviceBuffer); ok && db.freed {
		return 0, mem.ErrFreed
	}
	p := b.DevicePtr()
	if p == 0 {
		return 0, fmt.Errorf("gpu: %s buffer is not device memory; copy host memory through its Host() bytes", b.Device().Name())
	}
	if off < 0 || n < 0 || off > b.Len()-n {
		return 0, fmt.Errorf("gpu: range [%d, %d) outside the %d-byte buffer on %s", off, off+n, b.Len(), b.Device().Name())
	}
	return p + uint64(off), nil
}

// CopyHtoD queues a copy of src into dst[dstOff:dstOff+len(src)].
func (s *Stream) CopyHtoD(dst mem.Buffer, dstOff int, src []byte) error {
	p, err := devRange(dst, dstOff, len(src))
	if err != nil {
		return err
	}
	return s.CopyHtoDPtr(p, src)
}

// CopyDtoH queues a copy of src[srcOff:srcOff+len(dst)] into dst.
func (s *Stream) CopyDtoH(dst []byte, src mem.Buffer, srcOff int) error {
	p, err := devRange(src, srcOff, len(dst))
	if err != nil {
		return err
	}
	return s.CopyDtoHPtr(dst, p)
}

// CopyDtoD queues a copy of n bytes from src[srcOff:] to dst[dstOff:].
func (s *Stream) CopyDtoD(dst mem.Buffer, dstOff int, src mem.Buffer, srcOff, n int) error {
	dp, err := devRange(dst, dstOff, n)
	if err != nil {
		return err
	}
	sp, err := devRange(src, srcOff, n)
	if err != nil {
		return err
	}
	return s.CopyDtoDPtr(dp, sp, n)
}

// Memset queues setting dst[off:off+n] to value.
func (s *Stream) Memset(dst mem.Buffer, off, n int, value byte) error {
	p, err := devRange(dst, off, n)
	if err != nil {
		return err
	}
	if err := s.check(); err != nil || n == 0 {
		return err
	}
	if r := cuMemsetD8Async(s.d.ctx, p, value, n, s.s); r != 0 {
		return s.d.err("cuMemsetD8Async", fmt.Sprintf("%d bytes", n), r)
	}
	return nil
}

// CopyHtoDPtr queues a copy of src to the device address dst, for device
// memory this package did not allocate (a tensor handed in by address).
func (s *Stream) CopyHtoDPtr(dst uint64, src []byte) error {
	if err := s.check(); err != nil || len(src) == 0 {
		return err
	}
	if r := cuMemcpyHtoDAsync(s.d.ctx, dst, src, s.s); r != 0 {
		return s.d.err("cuMemcpyHtoDAsync_v2", fmt.Sprintf("%d bytes", len(src)), r)
	}
	return nil
}

// CopyDtoHPtr queues a copy from the device address src into dst.
func (s *Stream) CopyDtoHPtr(dst []byte, src uint64) error {
	if err := s.check(); err != nil || len(dst) == 0 {
		return err
	}
	if r := cuMemcpyDtoHAsync(s.d.ctx, dst, src, s.s); r != 0 {
		return s.d.err("cuMemcpyDtoHAsync_v2", fmt.Sprintf("%d bytes", len(dst)), r)
	}
	return nil
}

// CopyDtoDPtr queues a copy of n bytes between device addresses.
func (s *Stream) CopyDtoDPtr(dst, src uint64, n int) error {
	if err := s.check(); err != nil || n == 0 {
		return err
	}
	if n < 0 {
		return fmt.Errorf("gpu: cannot copy %d bytes", n)
	}
	if r := cuMemcpyDtoDAsync(s.d.ctx, dst, src, n, s.s); r != 0 {
		return s.d.err("cuMemcpyDtoDAsync_v2", fmt.Sprintf("%d bytes", n), r)
	}
	return nil
}

// Query reports whether all work queued on the stream has finished.
func (s *Stream) Query() (bool, error) {
	if err := s.check(); err != nil {
		return false, err
	}
	switch r := cuStreamQuery(s.d.ctx, s.s); r {
	case CUDASuccess:
		return true, nil
	case CUDAErrorNotReady:
		return false, nil
	default:
		return false, s.d.err("cuStreamQuery", "", r)
	}
}

// Sync waits until all work queued on the stream has finished, polling
// without blocking a thread in the driver. When ctx ends first it returns a
// *WaitError; the queued work is not cancelled.
func (s *Stream) Sync(ctx context.Context) error {
	return s.d.wait(ctx, "stream sync", s.Query)
}

// Record records a new event at the current end of the stream. The caller
// owns the event and must Close it.
func (s *Stream) Record() (*Event, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	e, err := s.d.newEvent()
	if err != nil {
		return nil, err
	}
	if r := cuEventRecord(s.d.ctx, e.e, s.s); r != 0 {
		_ = e.Close()
		return nil, s.d.err("cuEventRecord", "", r)
	}
	return e, nil
}

// WaitEvent makes work queued on s after this call wait until e has
// completed, without blocking the host.
func (s *Stream) WaitEvent(e *Event) error {
	if err := s.check(); err != nil {
		return err
	}
	if e.closed {
		return fmt.Errorf("gpu: event of cuda:%d used after Close", e.d.ordinal)
	}
	if r := cuStreamWaitEvent(s.d.ctx, s.s, e.e); r != 0 {
		return s.d.err("cuStreamWaitEvent", "", r)
	}
	return nil
}

// WaitValue makes work queued on s after this call wait until the 32-bit
// word at device address addr reaches v, compared cyclically
// (int32(word-v) >= 0, so a counter may wrap), without blocking the host.
// Nothing bounds the wait on the GPU: the caller must make sure that some
// work, on any stream of any process that maps the word, writes it
// (WriteValue), also when the work meant to write it fails or its process
// is gone.
func (s *Stream) WaitValue(addr uint64, v uint32) error {
	if err := s.check(); err != nil {
		return err
	}
	if r := cuStreamWaitValue32(s.d.ctx, s.s, addr, v); r != 0 {
		return s.d.err("cuStreamWaitValue32", "", r)
	}
	return nil
}

// WriteValue queues on s a write of v to the 32-bit word at device address
// addr, made once the work queued on s before it has finished, and
// visible with that work's writes.
func (s *Stream) WriteValue(addr uint64, v uint32) error {
	if err := s.check(); err != nil {
		return err
	}
	if r := cuStreamWriteValue32(s.d.ctx, s.s, addr, v); r != 0 {
		return s.d.err("cuStreamWriteValue32", "", r)
	}
	return nil
}

// WaitValue64 makes work queued on s after this call wait until the
// 64-bit word at device address addr (8-byte aligned) reaches v, compared
// cyclically (int64(word-v) >= 0), without blocking the host. It needs a
// device whose StreamMemOps64 is true. As for WaitValue, nothing bounds
// the wait on the GPU: some work must raise the word, also when the work
// meant to raise it fails or its process is gone.
func (s *Stream) WaitValue64(addr, v uint64) error {
	if err := s.check(); err != nil {
		return err
	}
	if r := cuStreamWaitValue64(s.d.ctx, s.s, addr, v); r != 0 {
		return s.d.err("cuStreamWaitValue64", "", r)
	}
	return nil
}

// WriteValue64 queues on s a write of v to the 64-bit word at device
// address addr, made once the work queued on s before it has finished. A
// plain write can lower the word; RaiseValue64 cannot.
func (s *Stream) WriteValue64(addr, v uint64) error {
	if err := s.check(); err != nil {
		return err
	}
	if r := cuStreamWriteValue64(s.d.ctx, s.s, addr, v); r != 0 {
		return s.d.err("cuStreamWriteValue64", "", r)
	}
	return nil
}

// Close destroys the stream. Work already queued still runs to completion.
// Close is idempotent.
func (s *Stream) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	if r := cuStreamDestroy(s.d.ctx, s.s); r != 0 {
		return s.d.err("cuStreamDestroy_v2", "", r)
	}
	return nil
}

// Event marks a point in a stream's work (Stream.Record).
type Event struct {
	d      *CUDADevice
	e      cuEvent
	closed bool
}

// Query reports whether the work before the event has finished.
func (e *Event) Query() (bool, error) {
	if e.closed {
		return false, fmt.Errorf("gpu: event of cuda:%d used after Close", e.d.ordinal)
	}
	switch r := cuEventQuery(e.d.ctx, e.e); r {
	case CUDASuccess:
		return true, nil
	case CUDAErrorNotReady:
		return false, nil
	default:
		return false, e.d.err("cuEventQuery", "", r)
	}
}

// Wait waits until the work before the event has finished. When ctx ends
// first it returns a *WaitError.
func (e *Event) Wait(ctx context.Context) error {
	return e.d.wait(ctx, "event wait", e.Query)
}

// Close destroys the event. Close is idempotent.
func (e *Event) Close() error {
	if e.closed {
		return nil
	}
	e.closed = true
	if r := cuEventDestroy(e.d.ctx, e.e); r != 0 {
		return e.d.err("cuEventDestroy_v2", "", r)
	}
	return nil
}

// WaitError is returned when a wait for GPU work ends because its context
// did. It unwraps to the context's error (context.DeadlineExceeded or
// context.Canceled).
type WaitError struct {
	Op     string // "stream sync", "event wait"
	Device int
	Waited time.Duration
	Err    error
}

// Error says what was being waited for and why the wait ended.
func (e *WaitError) Error() string {
	return fmt.Sprintf("gpu: %s on cuda:%d gave up after %v: %v (the queued GPU work was not cancelled)",
		e.Op, e.Device, e.Waited.Round(time.Millisecond), e.Err)
}

// Unwrap returns the context error that ended the wait.
func (e *WaitError) Unwrap() error { return e.Err }

func (d *CUDADevice) wait(ctx context.Context, op string, done func() (bool, error)) error {
	start := time.Now()
	err := Poll(ctx, done)
	if err != nil && err == ctx.Err() {
		return &WaitError{Op: op, Device: d.ordinal, Waited: time.Since(start), Err: err}
	}
	return err
}

// The polling schedule of Poll. Go timers shorter than a millisecond
// overshoot by up to about a millisecond when the thread parks, which would
// halve the measured speed of a 1 GiB device copy; so short waits poll more
// finely, and only long ones fall back to timers.
const (
	// spinFor: yield (runtime.Gosched) between checks for this long.
	spinFor = 100 * time.Microsecond
	// fineFor: then sleep the thread (nanosleep) for 1/32 of the time
	// waited so far, between minFineSleep and maxFineSleep, checking
	// ctx.Done() between sleeps, until this much time has passed.
	fineFor      = 50 * time.Millisecond
	minFineSleep = 5 * time.Microsecond
	maxFineSleep = 100 * time.Microsecond
	// MaxPollInterval is the sleep between checks after fineFor, in a
	// select on ctx.Done(): it bounds how late Poll notices completion of
	// long waits.
	MaxPollInterval = time.Millisecond
)

// Poll calls done until it reports true or fails, and returns ctx.Err() as
// is when ctx ends first. It yields between checks for the first 100µs,
// sleeps briefly (at most 100µs) until 50ms have passed, then sleeps
// MaxPollInterval at a time selecting on ctx.Done(). Completion is noticed
// within about max(100µs, 2% of the time waited); a cancelled ctx within
// about 1ms. It is the wait loop of Stream.Sync and Event.Wait, exported for
// waits that combine several conditions (an event and a communicator's error
// state).
func Poll(ctx context.Context, done func() (bool, error)) error {
	start := time.Now()
	var t *time.Timer
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		waited := time.Since(start)
		switch {
		case waited < spinFor:
			if err := ctx.Err(); err != nil {
				return err
			}
			runtime.Gosched()
		case waited < fineFor:
			select {
			case <-ctx.Done():
				return finalCheck(ctx, done)
			default:
			}
			fineSleep(min(max(waited/32, minFineSleep), maxFineSleep))
		default:
			if t == nil {
				t = time.NewTimer(MaxPollInterval)
				defer t.Stop()
			} else {
				t.Reset(MaxPollInterval)
			}
			select {
			case <-ctx.Done():
				return finalCheck(ctx, done)
			case <-t.C:
			}
		}
	}
}

// finalCheck counts work that finished while the context ended as done.
func finalCheck(ctx context.Context, done func() (bool, error)) error {
	if ok, err := done(); err != nil || ok {
		return err
	}
	return ctx.Err()
}
