package main

import (
	"context"
	"fmt"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/stages"
	_ "github.com/weightcast/weightcast/transport/ipc"   // registers "ipc"
	_ "github.com/weightcast/weightcast/transport/ncclx" // registers "nccl"
)

// rankDevice names the device a rank's buckets live on for a transport,
// as weightcast.Options.Device: host memory ("cpu") for tcp and inproc, a
// GPU for ipc and nccl: GPU devices[i mod len(devices)] (all visible GPUs
// when --devices is empty), where i is the rank for ranks launched together
// here and LOCAL_RANK for ranks started across hosts.
func rankDevice(c *config, transportName string, rank int) (string, error) {
	switch transportName {
	case "tcp", "inproc":
		return "cpu", nil
	}
	devices, err := c.gpuList()
	if err != nil {
		return "", err
	}
	// Ranks launched together on this host take GPUs by rank; a rank
	// started by hand or by torchrun takes the GPU of its local rank.
	local := rank
	if c.localRank >= 0 {
		local = c.localRank
	}
	if transportName == "nccl" && c.child && len(devices) < c.ranks {
		return "", fmt.Errorf("--transport nccl needs one GPU per rank: %d ranks but %d GPUs (%v); use --transport ipc, fewer --ranks or more --devices", c.ranks, len(devices), devices)
	}
	if transportName == "nccl" && local >= len(devices) {
		return "", fmt.Errorf("--transport nccl needs one GPU per rank: this rank's local index is %d but only %d GPUs are visible (%v); set LOCAL_RANK or --devices", local, len(devices), devices)
	}
	return fmt.Sprintf("cuda:%d", devices[local%len(devices)]), nil
}

// gpuList is --devices, or every visible GPU.
func (c *config) gpuList() ([]int, error) {
	n, err := gpu.DeviceCount()
	if err != nil {
		return nil, err
	}
	if len(c.devices) == 0 {
		out := make([]int, n)
		for i := range out {
			out[i] = i
		}
		if n == 0 {
			return nil, fmt.Errorf("no GPU visible; use --transport tcp")
		}
		return out, nil
	}
	for _, d := range c.devices {
		if d >= n {
			return nil, fmt.Errorf("--devices names GPU %d but only %d are visible (0..%d)", d, n, n-1)
		}
	}
	return c.devices, nil
}

// deviceModel is a synthetic model materialized in device memory, as a
// trainer's weights are: one allocation, each tensor a view into it. Its
// bytes are generated on the host and copied in before each round, outside
// the timed sync.
type deviceModel struct {
	dev     *gpu.CUDADevice
	buf     mem.Buffer
	tensors stages.Tensors
}

func newDeviceModel(dev *gpu.CUDADevice, m model) (*deviceModel, error) {
	var total int64
	offs := make([]int64, len(m.List()))
	for i, t := range m.List() {
		offs[i] = total
		n, _ := t.Size()
		total += (n + stages.Align - 1) &^ (stages.Align - 1)
	}
	buf, err := dev.Alloc(int(max(total, 1)))
	if err != nil {
		return nil, fmt.Errorf("allocating the sender's %d-byte model on %s: %w", total, dev.Name(), err)
	}
	d := &deviceModel{dev: dev, buf: buf}
	for i, t := range m.List() {
		d.tensors = append(d.tensors, &stages.Tensor{Name: t.Name, DType: t.DType, Shape: t.Shape, Device: buf, DeviceOffset: offs[i]})
	}
	return d, nil
}

// fill copies the bytes of m (a model with the same layout) into the
// device tensors.
func (d *deviceModel) fill(ctx context.Context, m model) error {
	s, err := d.dev.NewStream()
	if err != nil {
		return err
	}
	defer s.Close()
	scratch := make([]byte, 64<<20)
	for i, t := range m.List() {
		n, _ := t.Size()
		for off := int64(0); off < n; off += int64(len(scratch)) {
			part := scratch[:min(int64(len(scratch)), n-off)]
			if err := t.ReadAt(part, off); err != nil {
				return err
			}
			if err := s.CopyHtoD(d.buf, int(d.tensors[i].DeviceOffset+off), part); err != nil {
				return err
			}
		}
	}
	return s.Sync(ctx)
}

func (d *deviceModel) close() { d.buf.Free() }
