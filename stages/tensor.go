package stages

import (
	"context"
	"fmt"
	"io"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/mem"
)

// Tensor is one named array of weights as a Source yields it. Its bytes are
// in Data, read on demand through Reader (a file, a generator), so that a
// source never needs to hold the whole model, or in device memory (Device),
// where only device buckets take them.
type Tensor struct {
	Name  string
	DType dtype.DType
	Shape []int64
	// Data holds the tensor's bytes in host memory, or is nil when Reader
	// supplies them.
	Data []byte
	// Reader supplies the bytes when Data is nil; ReadAt must fill the
	// whole slice it is given. Pack calls it from several goroutines at
	// once, for different ranges of a large tensor, as io.ReaderAt allows.
	Reader io.ReaderAt
	// Device, when set, holds the tensor's bytes in device memory at
	// DeviceOffset (Data and Reader stay nil). Pack copies them into
	// device buckets on the GPU; the memory must stay allocated and
	// unchanged until the round that packs it has broadcast it. Wrap
	// memory allocated elsewhere with (*gpu.CUDADevice).View.
	Device       mem.Buffer
	DeviceOffset int64
}

// Size returns the tensor's byte length from its dtype and shape.
func (t *Tensor) Size() (int64, error) {
	n, err := t.DType.Bytes(t.Shape)
	if err != nil {
		return 0, fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	return n, nil
}

// ReadAt copies the tensor's bytes starting at off into p.
func (t *Tensor) ReadAt(p []byte, off int64) error {
	if t.Device != nil && t.Data == nil && len(p) > 0 {
		return fmt.Errorf("tensor %q is in device memory on %s: pack it into device buckets (a Pool allocated on a CUDA device)", t.Name, t.Device.Device().Name())
	}
	if t.Data != nil {
		if off < 0 || off+int64(len(p)) > int64(len(t.Data)) {
			return fmt.Errorf("tensor %q: read of %d bytes at %d outside its %d bytes", t.Name, len(p), off, len(t.Data))
		}
		copy(p, t.Data[off:])
		return nil
	}
	if t.Reader == nil {
		if len(p) == 0 {
			return nil
		}
		return fmt.Errorf("tensor %q has neither Data nor Reader", t.Name)
	}
	n, err := t.Reader.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("tensor %q: reading %d bytes at %d: %w", t.Name, len(p), off, err)
}

// Validate checks that the tensor can be sent: a name, a known dtype, a
// shape with no negative dimension, and Data (when set) of the shape's
// byte length.
func (t *Tensor) Validate() (size int64, err error) {
	if t.Name == "" {
		return 0, fmt.Errorf("tensor with empty name (dtype %s, shape %v): every tensor needs a unique name", t.DType, t.Shape)
	}
	if len(t.Name) > MaxNameLen {
		return 0, fmt.Errorf("tensor name of %d bytes exceeds the limit of %d: %.40q...", len(t.Name), MaxNameLen, t.Name)
	}
	if len(t.Shape) > MaxRank {
		return 0, fmt.Errorf("tensor %q has %d dimensions; the limit is %d", t.Name, len(t.Shape), MaxRank)
	}
	size, err = t.Size()
	if err != nil {
		return 0, err
	}
	if t.Data != nil && int64(len(t.Data)) != size {
		return 0, fmt.Errorf("tensor %q: %s%v needs %d bytes, Data has %d", t.Name, t.DType, t.Shape, size, len(t.Data))
	}
	if t.Device != nil {
		if err := t.validateDevice(size); err != nil {
			return 0, err
		}
	}
	return size, nil
}

// Source yields the tensors of a model, in a stable order, once per call
// to Tensors. emit may block (the pipeline applies back-pressure); when it
// returns an error, Tensors must stop and return that error.
type Source interface {
	Tensors(ctx context.Context, emit func(*Tensor) error) error
}

// Tensors is a Source over a fixed list of tensors.
type Tensors []*Tensor

// Tensors emits each tensor of the list in order.
func (ts Tensors) Tensors(ctx context.Context, emit func(*Tensor) error) error {
	for _, t := range ts {
		if err := emit(t); err != nil {
			return err
		}
	}
	return nil
}
