package stages

import (
	"context"
	"fmt"
	"io"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/wire"
)

// Tensor is one named array of weights as a Source yields it. Its bytes are
// in Data, read on demand through Reader (a file, a generator), so that a
// source never needs to hold the whole model, or in device memory (Device),
// where only device buckets take them.
type Tensor struct {
	Name string
	// DType is the tensor's dtype as it travels: in buckets, in their
	// metadata and at the receivers.
	DType dtype.DType
	Shape []int64
	// SourceDType, when set and not DType, is the dtype of the bytes the
	// tensor holds (in Data, Reader or Device): Pack converts them to
	// DType as it copies them into buckets, on the CPU for host buckets
	// and with the GPU cast kernel for device buckets. Cast sets it; the
	// conversions are those between floating dtypes that package cast
	// supports.
	SourceDType dtype.DType
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

	// quant, set by Quantize, makes the tensor one of the two a quantized
	// weight becomes (role: its codes or its scales); Data, Reader and
	// Device are then unset, the bytes being computed from quant's weight.
	quant *quantized
	role  quantRole
}

// Casts reports whether Pack converts the tensor's bytes from SourceDType
// to DType.
func (t *Tensor) Casts() bool { return t.SourceDType != dtype.Invalid && t.SourceDType != t.DType }

// held returns the dtype of the bytes the tensor holds.
func (t *Tensor) held() dtype.DType {
	if t.Casts() {
		return t.SourceDType
	}
	return t.DType
}

// Size returns the tensor's byte length as it travels, from its dtype and
// shape.
func (t *Tensor) Size() (int64, error) {
	n, err := t.DType.Bytes(t.Shape)
	if err != nil {
		return 0, fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	return n, nil
}

// heldSize returns the byte length of what the tensor holds (its source
// bytes, for a tensor that casts).
func (t *Tensor) heldSize() (int64, error) {
	n, err := t.held().Bytes(t.Shape)
	if err != nil {
		return 0, fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	return n, nil
}

// ReadAt copies the tensor's bytes as they travel, starting at off, into
// p: for a tensor that casts, its source bytes converted to DType (off and
// len(p) then count whole elements of DType).
func (t *Tensor) ReadAt(p []byte, off int64) error {
	if t.quant != nil {
		return t.readQuant(p, off)
	}
	if t.Casts() {
		return t.readCast(p, off)
	}
	return t.readHeld(p, off)
}

// readHeld copies the bytes the tensor holds, starting at off, into p.
func (t *Tensor) readHeld(p []byte, off int64) error {
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

// heldBytes is a tensor read as the bytes it holds (for a tensor that
// casts, its source bytes), as the staging ring reads what the GPU
// converts.
type heldBytes struct{ t *Tensor }

func (h heldBytes) ReadAt(p []byte, off int64) error { return h.t.readHeld(p, off) }

var (
	_ gpu.StagingSource = (*Tensor)(nil)
	_ gpu.StagingSource = heldBytes{}
)

// Validate checks that the tensor can be sent: a name, a known dtype, a
// shape with no negative dimension, a conversion Pack can make, and Data
// (when set) of the byte length its shape and held dtype give.
func (t *Tensor) Validate() (size int64, err error) {
	if t.Name == "" {
		return 0, fmt.Errorf("tensor with empty name (dtype %s, shape %v): every tensor needs a unique name", t.DType, t.Shape)
	}
	if len(t.Name) > wire.MaxNameLen {
		return 0, fmt.Errorf("tensor name of %d bytes exceeds the limit of %d: %.40q...", len(t.Name), wire.MaxNameLen, t.Name)
	}
	if len(t.Shape) > wire.MaxRank {
		return 0, fmt.Errorf("tensor %q has %d dimensions; the limit is %d", t.Name, len(t.Shape), wire.MaxRank)
	}
	size, err = t.Size()
	if err != nil {
		return 0, err
	}
	if t.quant != nil {
		return size, t.validateQuant()
	}
	if t.Casts() && !castable(t.SourceDType, t.DType) {
		return 0, fmt.Errorf("tensor %q: pack cannot convert %s to %s; conversions are between F32, BF16 and F16 (see Cast)", t.Name, t.SourceDType, t.DType)
	}
	held, err := t.heldSize()
	if err != nil {
		return 0, err
	}
	if t.Data != nil && int64(len(t.Data)) != held {
		return 0, fmt.Errorf("tensor %q: %s%v needs %d bytes, Data has %d", t.Name, t.held(), t.Shape, held, len(t.Data))
	}
	if t.Device != nil {
		if err := t.validateDevice(held); err != nil {
			return 0, err
		}
	}
	return size, nil
}

// validateDevice checks a device tensor: its bytes only in Device, which
// the GPU can address, and inside it.
func (t *Tensor) validateDevice(held int64) error {
	if t.Data != nil || t.Reader != nil {
		return fmt.Errorf("tensor %q sets Device and also Data or Reader; give its bytes one way", t.Name)
	}
	if _, ok := gpu.Address(t.Device); !ok {
		return fmt.Errorf("tensor %q: its Device buffer on %s is not memory the GPU can address (device or pinned host memory)", t.Name, t.Device.Device().Name())
	}
	if t.DeviceOffset < 0 || t.DeviceOffset > int64(t.Device.Len())-held {
		return fmt.Errorf("tensor %q: %d bytes at offset %d lie outside its %d-byte device buffer", t.Name, held, t.DeviceOffset, t.Device.Len())
	}
	return nil
}

// Source yields the tensors of a model, in a stable order, once per call
// to Tensors. emit may block (the pipeline applies back-pressure); when it
// returns an error, Tensors must stop and return that error.
type Source interface {
	Tensors(ctx context.Context, emit func(*Tensor) error) error
}

// Lookuper finds a tensor by name: a source that can (source.Synthetic's
// model, a source.Checkpoint, and Cast and Quantize over one), which
// sink.Verify and sink.DeviceModel.Verify compare received bytes with.
type Lookuper interface {
	Lookup(name string) (*Tensor, bool)
}

// onDevice reports whether b is memory that only the GPU reads (device
// memory rather than host bytes).
func onDevice(b mem.Buffer) bool { return b.Host() == nil && b.DevicePtr() != 0 }

// cudaDeviceOf returns the CUDA device that owns b.
func cudaDeviceOf(b mem.Buffer) (*gpu.CUDADevice, error) {
	d, ok := gpu.Unfence(b).Device().(*gpu.CUDADevice)
	if !ok {
		return nil, fmt.Errorf("buffer on %s is not CUDA device memory", b.Device().Name())
	}
	return d, nil
}
