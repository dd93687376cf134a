package stages

import (
	"context"
	"strings"
	"testing"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
)

// fakeDevice is device memory as far as Validate can tell (an address, no
// host bytes); nothing may copy from it.
type fakeDevice struct{ n int }

func (f fakeDevice) Len() int           { return f.n }
func (f fakeDevice) Host() []byte       { return nil }
func (f fakeDevice) DevicePtr() uint64  { return 0x7f0000000000 }
func (f fakeDevice) Device() mem.Device { return mem.Host{} }
func (f fakeDevice) Free() error        { return nil }

// These need no GPU.

func TestDeviceTensorValidate(t *testing.T) {
	buf := fakeDevice{n: 1024}
	good := &Tensor{Name: "w", DType: dtype.F32, Shape: []int64{16}, Device: buf, DeviceOffset: 960}
	if size, err := good.Validate(); err != nil || size != 64 {
		t.Fatalf("Validate = %d, %v", size, err)
	}
	bad := []struct {
		t    Tensor
		want string
	}{
		{Tensor{Name: "w", DType: dtype.F32, Shape: []int64{16}, Device: buf, DeviceOffset: 961}, "outside"},
		{Tensor{Name: "w", DType: dtype.F32, Shape: []int64{16}, Device: buf, DeviceOffset: -1}, "outside"},
		{Tensor{Name: "w", DType: dtype.F32, Shape: []int64{16}, Device: buf, Data: make([]byte, 64)}, "one way"},
		{Tensor{Name: "w", DType: dtype.F32, Shape: []int64{16}, Device: hostBuf(64)}, "not memory the GPU can address"},
	}
	for _, c := range bad {
		if _, err := c.t.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v, want an error about %q", c.t, err, c.want)
		}
	}
	if err := good.ReadAt(make([]byte, 4), 0); err == nil || !strings.Contains(err.Error(), "device buckets") {
		t.Errorf("ReadAt of a device tensor: %v", err)
	}
}

// TestDeviceTensorIntoHostBuckets: host buckets cannot take device
// tensors, and say what to do.
func TestDeviceTensorIntoHostBuckets(t *testing.T) {
	pool, err := NewPool(mem.Host{}, 2, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	p := pipeline.New("host pack")
	src := tensorList{{Name: "w", DType: dtype.F32, Shape: []int64{16}, Device: fakeDevice{n: 64}}}
	Load(p, Unpack(p, Pack(p, Iterate(p, src), PackConfig{Pool: pool})), newMemModel())
	err = p.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "device buckets") {
		t.Fatalf("packing a device tensor into host buckets: %v", err)
	}
	if pool.Held() != 0 {
		t.Fatalf("%d buffers still held", pool.Held())
	}
}

func hostBuf(n int) mem.Buffer {
	b, _ := mem.Host{}.Alloc(n)
	return b
}

// TestDeviceFillMerges checks the copies queued for device tensors without
// a GPU (nothing is handed to the driver below flushEvery copies): tensors
// that follow each other in one source buffer, across the alignment
// padding that the bucket layout also has, become one copy; tensors of
// another buffer, or with a different gap, do not.
func TestDeviceFillMerges(t *testing.T) {
	src := fakeDevice{n: 1 << 20} // at 0x7f0000000000
	other := otherFake{fakeDevice{n: 1 << 20}}
	bucket := otherFake{fakeDevice{n: 1 << 20}}
	bucketBase := bucket.DevicePtr()
	f := &deviceFill{}
	ctx := context.Background()
	add := func(buf mem.Buffer, srcOff, dstOff, n int64) {
		t.Helper()
		tn := &Tensor{Name: "x", DType: dtype.U8, Shape: []int64{n}, Device: buf, DeviceOffset: srcOff}
		if err := f.copyIn(ctx, tn, bucket, dstOff, n, 0); err != nil {
			t.Fatal(err)
		}
	}
	add(src, 0, 0, 100)     // bucket [0,100)
	add(src, 128, 128, 50)  // padding 28 on both sides: merged
	add(src, 178, 192, 10)  // gaps differ (0 vs 14): new copy
	add(other, 202, 202, 8) // another buffer: new copy
	if f.batch.Len() != 3 || f.batch.Bytes() != 100+28+50+10+8 {
		t.Fatalf("%d copies of %d bytes; want 3 copies of %d", f.batch.Len(), f.batch.Bytes(), 100+28+50+10+8)
	}
	dst, s, n, _ := f.batch.Last()
	if dst != bucketBase+202 || s != other.DevicePtr()+202 || n != 8 {
		t.Fatalf("last copy %#x <- %#x (%d bytes)", dst, s, n)
	}

	// Two allocations that touch in the address space: the end of one and
	// the start of the next must stay two copies (the driver refuses a
	// copy across allocations).
	f = &deviceFill{}
	first := fakeDevice{n: 1 << 20}
	next := adjacentFake{fakeDevice{n: 1 << 20}}
	add(first, 1<<20-64, 0, 64)
	add(next, 0, 64, 64)
	if f.batch.Len() != 2 {
		t.Fatalf("copies from two adjacent allocations merged into %d copy", f.batch.Len())
	}
}

// adjacentFake is device memory that starts where a fakeDevice of 1 MiB
// ends.
type adjacentFake struct{ fakeDevice }

func (a adjacentFake) DevicePtr() uint64 { return 0x7f0000000000 + 1<<20 }

// otherFake is device memory at another address.
type otherFake struct{ fakeDevice }

func (o otherFake) DevicePtr() uint64 { return 0x7e0000000000 }

// farFake is memory of another device (as another GPU's, or pinned host
// memory, which the gather kernel does not read).
type farFake struct{ fakeDevice }

func (f farFake) DevicePtr() uint64  { return 0x7d0000000000 }
func (f farFake) Device() mem.Device { return farDevice{} }

type farDevice struct{ mem.Host }

func (farDevice) Name() string { return "another device" }

// TestDeviceFillRoutes checks, without a GPU (nothing reaches the driver
// below flushEvery copies), which queue each device copy joins: copies
// shorter than the plan's gatherBelow, out of memory the kernel can read,
// go to the gather kernel's queue and merge there as on the copy engine's;
// longer copies, and copies out of memory the kernel cannot read (another
// GPU, pinned host memory), go to the copy engine.
func TestDeviceFillRoutes(t *testing.T) {
	src := fakeDevice{n: 4 << 20} // at 0x7f0000000000
	far := farFake{fakeDevice{n: 1 << 20}}
	bucket := otherFake{fakeDevice{n: 8 << 20}}
	f := &deviceFill{plan: devicePlan{gatherBelow: 1 << 20}, gather: &gpu.Gather{}}
	ctx := context.Background()
	add := func(buf mem.Buffer, srcOff, dstOff, n int64) {
		t.Helper()
		tn := &Tensor{Name: "x", DType: dtype.U8, Shape: []int64{n}, Device: buf, DeviceOffset: srcOff}
		if err := f.copyIn(ctx, tn, bucket, dstOff, n, 0); err != nil {
			t.Fatal(err)
		}
	}
	add(src, 0, 0, 100)             // kernel
	add(src, 128, 128, 50)          // kernel, merged across the padding
	add(src, 1<<20, 1<<20, 1<<20)   // as long as gatherBelow: copy engine
	add(far, 0, 3<<20, 4096)        // not readable by the kernel: copy engine
	add(src, 3<<20, 4<<20, 1<<20-1) // kernel
	if f.kbatch.Len() != 2 || f.kbatch.Bytes() != 178+1<<20-1 {
		t.Fatalf("kernel queue: %d copies of %d bytes; want 2 of %d", f.kbatch.Len(), f.kbatch.Bytes(), 178+1<<20-1)
	}
	if f.batch.Len() != 2 || f.batch.Bytes() != 1<<20+4096 {
		t.Fatalf("copy engine queue: %d copies of %d bytes; want 2 of %d", f.batch.Len(), f.batch.Bytes(), 1<<20+4096)
	}
	dst, s, n, _ := f.kbatch.Last()
	if dst != bucket.DevicePtr()+4<<20 || s != src.DevicePtr()+3<<20 || n != 1<<20-1 {
		t.Fatalf("last kernel copy %#x <- %#x (%d bytes)", dst, s, n)
	}

	// With the kernel off (a plan of 0), everything goes to the copy
	// engine.
	f = &deviceFill{plan: devicePlan{}, gather: &gpu.Gather{}}
	add(src, 0, 0, 100)
	if f.kbatch.Len() != 0 || f.batch.Len() != 1 {
		t.Fatalf("without the kernel: %d kernel copies, %d copy engine copies", f.kbatch.Len(), f.batch.Len())
	}
}
