package weightcast

import (
	"context"
	"fmt"
	"slices"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/wire"
)

// ReceiveInto receives one round straight into the caller's tensors, dst,
// by name, as a rollout engine updates its parameters in place: device
// tensors (Addr) on the receiver's GPU when the buckets are on a GPU, host
// tensors (Data) when they are in host memory (Device "cpu", the tcp
// transport). The bytes land in place: from device buckets in the copies
// that compute their checksum, and on the sender's GPU straight from the
// sender's tensors where it allows. Before the first write it waits for an
// event recorded on each stream dst names (the work that still reads the
// tensors); when it returns every byte is in place.
//
// A received tensor dst does not hold, or one whose dtype or shape
// differs, fails the round on every rank with an error naming it (of
// KindConfig), and so does a Ref of dst that cannot be written as given
// (strided, on another GPU, in host memory while the buckets are on a
// GPU); tensors of dst the round does not carry are left as they are.
// As with Receive, a failed round leaves the Receiver broken, and State
// says whether dst holds some of the failed round (partial).
func (r *Receiver) ReceiveInto(ctx context.Context, dst []Ref) (stages.RoundStats, error) {
	sink, closeSink, err := r.into(dst)
	if err != nil {
		err = fmt.Errorf("%s: %w", r.who(), err)
		r.Abort(err) // the others fail with this cause instead of waiting
		return stages.RoundStats{}, err
	}
	defer closeSink()
	if err := awaitStreams(ctx, dst, r.device, r.opts.Timeout); err != nil {
		err = fmt.Errorf("%s: %w", r.who(), err)
		r.Abort(err)
		return stages.RoundStats{}, err
	}
	return r.Receive(ctx, sink)
}

// into checks dst and returns the sink that writes into it, and what
// releases the sink after the round.
func (r *Receiver) into(dst []Ref) (stages.Sink, func(), error) {
	cuda, _ := r.dev.(*gpu.CUDADevice)
	host := &hostInto{refs: make(map[string]*Ref, len(dst))}
	tensors := make(map[string]*sink.DeviceTensor, len(dst))
	for i := range dst {
		ref := &dst[i]
		if _, dup := host.refs[ref.Name]; dup {
			return nil, nil, fmt.Errorf("%w: tensor %q is handed in twice; give each destination tensor once", ErrConfig, ref.Name)
		}
		host.refs[ref.Name] = ref
		dt, size, err := ref.layout()
		if err != nil {
			return nil, nil, err
		}
		switch {
		case cuda == nil && !ref.onHost(size):
			return nil, nil, fmt.Errorf("%w: tensor %q is on cuda:%d, but this receiver's buckets are in host memory (%s); receive into host tensors, or receive() and copy", ErrConfig, ref.Name, ref.Device, r.desc.Name)
		case cuda != nil && size > 0 && ref.onHost(size):
			return nil, nil, fmt.Errorf("%w: tensor %q is in host memory, but this receiver's buckets are on %s; receive into tensors on that GPU, or receive() and copy", ErrConfig, ref.Name, cuda.Name())
		case cuda != nil && size > 0 && ref.Device != cuda.Ordinal():
			return nil, nil, fmt.Errorf("%w: tensor %q is on cuda:%d, but this receiver's buckets are on %s; receive into tensors on that GPU, or receive() and copy", ErrConfig, ref.Name, ref.Device, cuda.Name())
		}
		if cuda == nil {
			continue
		}
		t := &sink.DeviceTensor{DType: dt, Shape: slices.Clone(ref.Shape)}
		if size > 0 {
			if t.Buf, err = cuda.View(ref.Addr, int(size)); err != nil {
				return nil, nil, fmt.Errorf("%w: tensor %q: %v", ErrConfig, ref.Name, err)
			}
		}
		tensors[ref.Name] = t
	}
	if cuda == nil {
		return host, func() {}, nil
	}
	m, err := sink.NewDeviceModelOver(cuda, tensors)
	if err != nil {
		return nil, nil, err
	}
	return m, func() { m.Close() }, nil
}

// device returns the receiver's own GPU: the only one ReceiveInto writes
// to (into refuses tensors on any other).
func (r *Receiver) device(ordinal int) (*gpu.CUDADevice, error) {
	if d, ok := r.dev.(*gpu.CUDADevice); ok && d.Ordinal() == ordinal {
		return d, nil
	}
	return nil, fmt.Errorf("%w: cuda:%d is not this receiver's GPU", ErrConfig, ordinal)
}

// hostInto is ReceiveInto's sink on a host: each entry's bytes are copied
// into the caller's host tensor of its name.
type hostInto struct{ refs map[string]*Ref }

func (h *hostInto) Load(_ context.Context, e *wire.Entry, data []byte) error {
	ref := h.refs[e.Name]
	if ref == nil {
		return fmt.Errorf("%w: received tensor %q (%s%v), which the tensors handed in do not hold", ErrConfig, e.Name, e.DType, e.Shape)
	}
	dt, _ := dtype.Parse(ref.DType) // checked by into
	if dt != e.DType || !slices.Equal(ref.Shape, e.Shape) {
		return fmt.Errorf("%w: received tensor %q is %s%v, the one handed in is %s%v", ErrConfig, e.Name, e.DType, e.Shape, dt, ref.Shape)
	}
	if e.Chunk < 0 || e.Chunk+int64(len(data)) > int64(len(ref.Data)) {
		return fmt.Errorf("received tensor %q: bytes %d..%d of a tensor of %d", e.Name, e.Chunk, e.Chunk+int64(len(data)), len(ref.Data))
	}
	copy(ref.Data[e.Chunk:], data)
	return nil
}

func (h *hostInto) Commit(context.Context, uint64) error { return nil }
