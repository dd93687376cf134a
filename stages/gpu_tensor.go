package stages

import (
	"fmt"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
)

// validateDevice checks a device tensor: its bytes only in Device, which
// the GPU can address, and inside it.
func (t *Tensor) validateDevice(size int64) error {
	if t.Data != nil || t.Reader != nil {
		return fmt.Errorf("tensor %q sets Device and also Data or Reader; give its bytes one way", t.Name)
	}
	if _, ok := gpu.Address(t.Device); !ok {
		return fmt.Errorf("tensor %q: its Device buffer on %s is not memory the GPU can address (device or pinned host memory)", t.Name, t.Device.Device().Name())
	}
	if t.DeviceOffset < 0 || t.DeviceOffset > int64(t.Device.Len())-size {
		return fmt.Errorf("tensor %q: %d bytes at offset %d lie outside its %d-byte device buffer", t.Name, size, t.DeviceOffset, t.Device.Len())
	}
	return nil
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
