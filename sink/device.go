package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/wire"
)

// finalWait bounds a wait for copies still queued where no context bounds
// it (Close, freeing memory a copy may still write), as it does the
// stages': memory is never freed under a copy.
const finalWait = time.Minute

// flushEvery bounds the copies a DeviceModel collects before it queues
// them, as pack's device fill does, so that the GPU starts on a bucket of
// many small tensors early.
const flushEvery = 4096

// cudaDeviceOf returns the CUDA device that owns b.
func cudaDeviceOf(b mem.Buffer) (*gpu.CUDADevice, error) {
	d, ok := gpu.Unfence(b).Device().(*gpu.CUDADevice)
	if !ok {
		return nil, fmt.Errorf("buffer on %s is not CUDA device memory", b.Device().Name())
	}
	return d, nil
}

// DeviceTensor is one tensor held by a DeviceModel.
type DeviceTensor struct {
	DType dtype.DType
	Shape []int64
	// Buf holds the tensor's bytes; nil for a tensor of zero bytes.
	Buf mem.Buffer
}

// DeviceModel is a stages.Sink that keeps the received model in device memory,
// the destination of a rollout worker's weights. Tensors are allocated on
// the first round that carries them and updated in place after (a tensor
// whose dtype or shape changes is reallocated). Copies into them run on
// the model's own stream: from device buckets device to device, in
// batches; from host buckets host to device. Flush (called by Load after
// each bucket) waits for them, so a bucket is never reused while a copy
// out of it is in flight; Commit leaves every tensor complete. As a
// stages.DeviceTarget it also lets Load copy device buckets into its tensors
// itself, with the buckets' checksums computed in the same pass.
//
// Its methods are safe for concurrent use. Close frees the tensors.
type DeviceModel struct {
	dev    *gpu.CUDADevice
	mu     sync.Mutex
	stream *gpu.Stream
	batch  gpu.CopyBatch

	tensors map[string]*DeviceTensor
	retired []mem.Buffer // replaced tensors, freed after the next Flush
	version uint64
	allocs  int
	fence   *gpu.Event // recorded by the last Flush after its copies
	closed  bool
	// fixed: the tensors are someone else's (NewDeviceModelOver): never
	// allocated, replaced or freed.
	fixed bool
}

// NewDeviceModel returns an empty model on dev.
func NewDeviceModel(dev *gpu.CUDADevice) (*DeviceModel, error) {
	s, err := dev.NewStream()
	if err != nil {
		return nil, fmt.Errorf("device model: %w", err)
	}
	return &DeviceModel{dev: dev, stream: s, tensors: map[string]*DeviceTensor{}}, nil
}

// ErrNotHeld is wrapped by the refusal of a DeviceModel made with
// NewDeviceModelOver to take a tensor it does not hold, or holds with
// another dtype or shape: the caller handed in the wrong tensors.
var ErrNotHeld = errors.New("not held by the model as received")

// NewDeviceModelOver returns a model over device tensors someone else
// owns, such as a PyTorch model's parameters (their Buf views of memory on
// dev): received bytes land in them in place. It never allocates, replaces
// or frees a tensor: a received tensor it does not hold, or one whose
// dtype or shape differs, fails the load, naming it. Close frees only the
// model's stream.
func NewDeviceModelOver(dev *gpu.CUDADevice, tensors map[string]*DeviceTensor) (*DeviceModel, error) {
	m, err := NewDeviceModel(dev)
	if err != nil {
		return nil, err
	}
	for name, t := range tensors {
		if size, err := t.DType.Bytes(t.Shape); err != nil || size > 0 && (t.Buf == nil || int64(t.Buf.Len()) < size) {
			m.Close()
			return nil, fmt.Errorf("device model: tensor %q (%s%v) has no memory of its size", name, t.DType, t.Shape)
		}
	}
	m.tensors, m.fixed = tensors, true
	return m, nil
}

var _ stages.DeviceTarget = (*DeviceModel)(nil)

// place returns the tensor of e, allocating it on first sight.
func (m *DeviceModel) place(e *wire.Entry) (*DeviceTensor, error) {
	if m.closed {
		return nil, errors.New("device model used after Close")
	}
	t := m.tensors[e.Name]
	if t != nil && t.DType == e.DType && slices.Equal(t.Shape, e.Shape) {
		return t, nil
	}
	if m.fixed {
		if t == nil {
			return nil, fmt.Errorf("%w: received tensor %q (%s%v), which the model does not hold", ErrNotHeld, e.Name, e.DType, e.Shape)
		}
		return nil, fmt.Errorf("%w: received tensor %q is %s%v, the model's is %s%v", ErrNotHeld, e.Name, e.DType, e.Shape, t.DType, t.Shape)
	}
	if t != nil && t.Buf != nil {
		m.retired = append(m.retired, t.Buf)
	}
	t = &DeviceTensor{DType: e.DType, Shape: slices.Clone(e.Shape)}
	if e.Total > 0 {
		b, err := m.dev.Alloc(int(e.Total))
		if err != nil {
			delete(m.tensors, e.Name)
			return nil, fmt.Errorf("allocating tensor %q (%d bytes) on %s: %w", e.Name, e.Total, m.dev.Name(), err)
		}
		t.Buf = b
	}
	m.tensors[e.Name] = t
	m.allocs++
	return t, nil
}

// Target returns where the entry's bytes go: its tensor's memory at the
// entry's chunk, the tensor allocated at its first sight. Load copies
// device buckets there itself, with their checksums (DeviceTarget).
func (m *DeviceModel) Target(ctx context.Context, e *wire.Entry) (mem.Buffer, int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, err := m.place(e)
	if err != nil {
		return nil, 0, err
	}
	return t.Buf, e.Chunk, nil
}

// LoadDevice queues the copy of the entry from src[off:] into its tensor.
func (m *DeviceModel) LoadDevice(ctx context.Context, e *wire.Entry, src mem.Buffer, off int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, err := m.place(e)
	if err != nil || e.Size == 0 {
		return err
	}
	from, ok := gpu.Address(src)
	if !ok {
		return fmt.Errorf("tensor %q: source buffer on %s is not GPU-addressable", e.Name, src.Device().Name())
	}
	m.batch.Add(t.Buf.DevicePtr()+uint64(e.Chunk), from+uint64(off), e.Size)
	if m.batch.Len() >= flushEvery {
		return m.stream.CopyBatch(&m.batch)
	}
	return nil
}

// Load queues the copy of host bytes into the entry's tensor. data must
// stay unchanged until Flush returns.
func (m *DeviceModel) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, err := m.place(e)
	if err != nil || len(data) == 0 {
		return err
	}
	if err := m.stream.CopyBatch(&m.batch); err != nil {
		return err
	}
	return m.stream.CopyHtoD(t.Buf, int(e.Chunk), data)
}

// Flush queues the collected copies, records an event after them and
// waits for it: when Flush returns, no copy reads a bucket any more.
func (m *DeviceModel) Flush(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.flushLocked(ctx)
}

func (m *DeviceModel) flushLocked(ctx context.Context) error {
	if m.closed {
		return errors.New("device model used after Close")
	}
	if err := m.stream.CopyBatch(&m.batch); err != nil {
		return err
	}
	ev, err := m.stream.Record()
	if err != nil {
		return err
	}
	if m.fence != nil {
		m.fence.Close()
	}
	m.fence = ev
	if err := ev.Wait(ctx); err != nil {
		return fmt.Errorf("device model: waiting for copies out of the bucket: %w", err)
	}
	var errs []error
	for _, b := range m.retired {
		errs = append(errs, b.Free())
	}
	m.retired = m.retired[:0]
	return errors.Join(errs...)
}

// Commit waits for every copy of the round and records its version.
func (m *DeviceModel) Commit(ctx context.Context, version uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.flushLocked(ctx); err != nil {
		return err
	}
	m.version = version
	return nil
}

// Get returns the tensor called name. Its buffer changes under a running
// sync.
func (m *DeviceModel) Get(name string) (*DeviceTensor, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.tensors[name]
	return t, ok
}

// Names lists the tensors held, sorted.
func (m *DeviceModel) Names() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.tensors))
}

// Version is the last committed model version.
func (m *DeviceModel) Version() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.version
}

// Allocations counts tensor allocations so far (later rounds of an
// unchanged model add none).
func (m *DeviceModel) Allocations() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.allocs
}

// Bytes is the total size of the tensors held.
func (m *DeviceModel) Bytes() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for _, t := range m.tensors {
		if t.Buf != nil {
			n += int64(t.Buf.Len())
		}
	}
	return n
}

// ReadHost copies the tensor called name back to host memory (for checks
// and debugging).
func (m *DeviceModel) ReadHost(ctx context.Context, name string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.tensors[name]
	if !ok {
		return nil, fmt.Errorf("device model has no tensor %q", name)
	}
	if t.Buf == nil {
		return []byte{}, nil
	}
	out := make([]byte, t.Buf.Len())
	if err := m.stream.CopyDtoH(out, t.Buf, 0); err != nil {
		return nil, err
	}
	if err := m.stream.Sync(ctx); err != nil {
		return nil, err
	}
	return out, nil
}

// verifyChunk is the size of the pieces Verify copies back at a time.
const verifyChunk = 16 << 20

// VerifyStats counts what DeviceModel.Verify compared.
type VerifyStats struct {
	Tensors int
	Bytes   int64
}

// Verify compares every tensor of the model, byte for byte, with the
// tensor of the same name in want (regenerated or re-read on the host),
// copying the model's bytes back in pieces of 16 MiB. It fails on the first
// difference, naming the tensor and byte, and when want can list its
// tensors, on a tensor missing from the model.
func (m *DeviceModel) Verify(ctx context.Context, want stages.Lookuper) (VerifyStats, error) {
	var st VerifyStats
	m.mu.Lock()
	defer m.mu.Unlock()
	pinned, err := m.dev.AllocPinned(verifyChunk)
	if err != nil {
		return st, err
	}
	defer func() {
		// Free only once no copy writes the pinned memory.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalWait)
		defer cancel()
		if m.stream.Sync(wctx) == nil {
			pinned.Free()
		}
	}()
	exp := make([]byte, verifyChunk)
	for _, name := range slices.Sorted(maps.Keys(m.tensors)) {
		t := m.tensors[name]
		w, ok := want.Lookup(name)
		if !ok {
			return st, fmt.Errorf("the model holds tensor %q that the source does not have", name)
		}
		if w.DType != t.DType || !slices.Equal(w.Shape, t.Shape) {
			return st, fmt.Errorf("tensor %q is %s%v in the model, %s%v in the source", name, t.DType, t.Shape, w.DType, w.Shape)
		}
		size, err := w.Size()
		if err != nil {
			return st, err
		}
		for off := int64(0); off < size; off += verifyChunk {
			n := min(verifyChunk, size-off)
			got := pinned.Host()[:n]
			if err := m.stream.CopyDtoH(got, t.Buf, int(off)); err != nil {
				return st, err
			}
			if w.Device != nil {
				// A device source: read it back the same way.
				src, _ := gpu.Address(w.Device)
				if err := m.stream.CopyDtoHPtr(exp[:n], src+uint64(w.DeviceOffset+off)); err != nil {
					return st, err
				}
			} else if err := w.ReadAt(exp[:n], off); err != nil {
				return st, err
			}
			if err := m.stream.Sync(ctx); err != nil {
				return st, err
			}
			if !bytes.Equal(got, exp[:n]) {
				i := 0
				for got[i] == exp[i] {
					i++
				}
				return st, fmt.Errorf("tensor %q differs from the source at byte %d (model %#02x, source %#02x)", name, off+int64(i), got[i], exp[i])
			}
			st.Bytes += n
		}
		st.Tensors++
	}
	if l, ok := want.(interface{ List() []*stages.Tensor }); ok && len(l.List()) != len(m.tensors) {
		return st, fmt.Errorf("the model holds %d tensors, the source has %d", len(m.tensors), len(l.List()))
	}
	return st, nil
}

// Close frees every tensor and the stream, after the copies in flight.
// It is idempotent.
func (m *DeviceModel) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.batch.Reset()
	ctx, cancel := context.WithTimeout(context.Background(), finalWait)
	defer cancel()
	if err := m.stream.Sync(ctx); err != nil {
		return fmt.Errorf("device model: copies still running; leaving its memory allocated: %w", err)
	}
	m.closed = true
	var errs []error
	if m.fixed {
		m.tensors = nil
	}
	for _, t := range m.tensors {
		if t.Buf != nil {
			errs = append(errs, t.Buf.Free())
		}
	}
	for _, b := range m.retired {
		errs = append(errs, b.Free())
	}
	if m.fence != nil {
		errs = append(errs, m.fence.Close())
	}
	errs = append(errs, m.stream.Close())
	m.tensors, m.retired = nil, nil
	return errors.Join(errs...)
}
