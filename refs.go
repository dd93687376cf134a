package weightcast

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/stages"
)

// Ref is a tensor handed in by address: memory its caller owns (a NumPy
// array, a PyTorch tensor) and keeps allocated and unchanged until the
// round that sends it returns. SendRefs reads it in place.
type Ref struct {
	Name string
	// DType is the element type as safetensors spells it ("BF16").
	DType string
	Shape []int64
	// Data holds the bytes of a tensor in host memory; nil for one in
	// device memory.
	Data []byte
	// Addr is the device address of a tensor in device memory on the
	// CUDA device Device, in its primary context (PyTorch's data_ptr()).
	Addr   uint64
	Device int
	// Bytes is a device tensor's byte length as its owner counts it,
	// checked against dtype and shape (0: not checked).
	Bytes int64
	// Stream is the CUstream the writes of a device tensor were queued on
	// (torch.cuda.current_stream().cuda_stream; 0 is the legacy default
	// stream): the round reads the tensor only after that work.
	Stream uintptr
	// Strided marks a tensor whose elements are not dense in row-major
	// order; SendRefs refuses it, naming it.
	Strided bool
}

// SendRefs sends one round of tensors handed in by address, as Send does.
// Device tensors are read in place: into device buckets on the GPU, into
// host buckets (transport tcp) by device-to-host copies. Before the first
// read it waits for an event recorded on each stream the device tensors
// name, never for the whole device. A tensor that cannot be sent as given
// (strided, an unknown dtype, bytes that do not match its shape) fails the
// round on every rank with an error naming it.
func (s *Sender) SendRefs(ctx context.Context, refs []Ref, version uint64) (stages.RoundStats, error) {
	return s.Send(ctx, refSource{s: s, refs: refs}, version)
}

// refSource is the Source of a SendRefs round.
type refSource struct {
	s    *Sender
	refs []Ref
}

func (r refSource) Tensors(ctx context.Context, emit func(*stages.Tensor) error) error {
	if err := awaitStreams(ctx, r.refs, r.s.device, r.s.opts.Timeout); err != nil {
		return err
	}
	for i := range r.refs {
		t, err := r.s.tensor(&r.refs[i])
		if err != nil {
			return err
		}
		if err := emit(t); err != nil {
			return err
		}
	}
	return nil
}

// layout checks what a Ref says of itself and returns its dtype and
// byte length: a dtype weightcast knows, dense elements, bytes that match
// dtype and shape. Its errors name the tensor and wrap ErrConfig.
func (r *Ref) layout() (dtype.DType, int64, error) {
	dt, err := dtype.Parse(r.DType)
	if err != nil {
		names := make([]string, 0, len(dtype.All()))
		for _, d := range dtype.All() {
			names = append(names, d.String())
		}
		return 0, 0, fmt.Errorf("%w: tensor %q has dtype %q, which weightcast cannot send (it sends %s)", ErrConfig, r.Name, r.DType, strings.Join(names, ", "))
	}
	if r.Strided {
		return 0, 0, fmt.Errorf("%w: tensor %q (%s%v) is not contiguous; hand in a contiguous tensor (tensor.contiguous(), numpy.ascontiguousarray)", ErrConfig, r.Name, dt, r.Shape)
	}
	size, err := dt.Bytes(r.Shape)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: tensor %q: %v", ErrConfig, r.Name, err)
	}
	switch {
	case r.Data != nil || r.Addr == 0 && size == 0:
		if int64(len(r.Data)) != size {
			return 0, 0, fmt.Errorf("%w: tensor %q is %s%v, %d bytes, but %d bytes were handed in", ErrConfig, r.Name, dt, r.Shape, size, len(r.Data))
		}
	case r.Bytes != 0 && r.Bytes != size:
		return 0, 0, fmt.Errorf("%w: tensor %q is %s%v, %d bytes, but it holds %d bytes", ErrConfig, r.Name, dt, r.Shape, size, r.Bytes)
	}
	return dt, size, nil
}

// onHost reports whether the Ref's bytes are host memory (Data): a
// tensor of no bytes with no address counts as one.
func (r *Ref) onHost(size int64) bool { return r.Data != nil || r.Addr == 0 && size == 0 }

// tensor turns a Ref into a stages.Tensor, checking it.
func (s *Sender) tensor(r *Ref) (*stages.Tensor, error) {
	dt, size, err := r.layout()
	if err != nil {
		return nil, err
	}
	t := &stages.Tensor{Name: r.Name, DType: dt, Shape: r.Shape}
	if r.onHost(size) {
		t.Data = r.Data
		return t, nil
	}
	dev, err := s.device(r.Device)
	if err != nil {
		return nil, fmt.Errorf("tensor %q: %w", r.Name, err)
	}
	if s.dev.Kind() != mem.KindCUDA {
		// Host buckets: read the tensor with device-to-host copies.
		st, err := s.readStream(dev)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", r.Name, err)
		}
		t.Reader = deviceReader{s: st, addr: r.Addr, timeout: s.opts.Timeout}
		return t, nil
	}
	view, err := dev.View(r.Addr, int(max(size, 1)))
	if err != nil {
		return nil, fmt.Errorf("tensor %q: %w", r.Name, err)
	}
	t.Device = view
	return t, nil
}

// device returns the CUDA device of a tensor handed in by address.
func (s *Sender) device(ordinal int) (*gpu.CUDADevice, error) {
	if d, ok := s.devs[ordinal]; ok {
		return d, nil
	}
	if own, ok := s.dev.(*gpu.CUDADevice); ok && own.Ordinal() == ordinal {
		s.devs[ordinal] = own
		return own, nil
	}
	d, err := gpu.NewCUDADevice(ordinal)
	if err != nil {
		return nil, fmt.Errorf("opening GPU %d, which holds a tensor handed in: %w", ordinal, err)
	}
	s.devs[ordinal] = d
	return d, nil
}

func (s *Sender) readStream(d *gpu.CUDADevice) (*gpu.Stream, error) {
	if st, ok := s.reads[d.Ordinal()]; ok {
		return st, nil
	}
	st, err := d.NewStream()
	if err != nil {
		return nil, err
	}
	s.reads[d.Ordinal()] = st
	return st, nil
}

// awaitStreams waits, bounded by ctx and the timeout, for an event
// recorded now on each stream that device tensors name: their writes are
// then done.
func awaitStreams(ctx context.Context, refs []Ref, device func(int) (*gpu.CUDADevice, error), timeout time.Duration) error {
	type key struct {
		dev    int
		stream uintptr
	}
	seen := map[key]bool{}
	for i := range refs {
		r := &refs[i]
		k := key{r.Device, r.Stream}
		if r.Data != nil || r.Addr == 0 || seen[k] {
			continue
		}
		seen[k] = true
		dev, err := device(r.Device)
		if err != nil {
			return fmt.Errorf("tensor %q: %w", r.Name, err)
		}
		ev, err := dev.RecordOn(r.Stream)
		if err != nil {
			return fmt.Errorf("tensor %q: ordering after stream %#x: %w", r.Name, r.Stream, err)
		}
		wctx, cancel := context.WithTimeout(ctx, timeout)
		err = ev.Wait(wctx)
		cancel()
		ev.Close()
		if err != nil {
			return fmt.Errorf("waiting for the work queued on stream %#x of cuda:%d before tensor %q: %w", r.Stream, r.Device, r.Name, err)
		}
	}
	return nil
}

// deviceReader reads a device tensor into host memory, for host buckets.
type deviceReader struct {
	s       *gpu.Stream
	addr    uint64
	timeout time.Duration
}

func (d deviceReader) ReadAt(p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if err := d.s.CopyDtoHPtr(p, d.addr+uint64(off)); err != nil {
		return 0, err
	}
	// Into pageable memory the copy is done when the call returns; into
	// pinned memory it is not: wait for it either way.
	ctx, cancel := context.WithTimeout(context.Background(), d.timeout)
	defer cancel()
	if err := d.s.Sync(ctx); err != nil {
		return 0, err
	}
	return len(p), nil
}
