package gpu

import (
	"bytes"
	"fmt"
	"testing"
)

// TestCopyBatchGPU queues a batch mixing pinned-host-to-device and
// device-to-device copies, through cuMemcpyBatchAsync and through the
// per-copy fallback, and checks every byte.
func TestCopyBatchGPU(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	const n = 1 << 20
	pinned := alloc(t, d.PinnedHost(), n)
	src := alloc(t, d, n)
	want := pattern(2*n, 11)
	copy(pinned.Host(), want[:n])
	if err := s.CopyHtoD(src, 0, want[n:]); err != nil {
		t.Fatal(err)
	}
	syncStream(t, s)
	hp, ok := Address(pinned)
	if !ok {
		t.Fatal("no address for pinned memory")
	}
	for _, perCopy := range []bool{false, true} {
		t.Run(fmt.Sprintf("perCopy=%v", perCopy), func(t *testing.T) {
			dst := alloc(t, d, 2*n)
			if err := s.Memset(dst, 0, 2*n, 0); err != nil {
				t.Fatal(err)
			}
			b := CopyBatch{PerCopy: perCopy}
			// 1000 small copies of odd sizes in a scattered order, then
			// two large ones.
			const small = 1000
			for i := range small {
				j := (i * 617) % small
				off := uint64(j * 1000)
				b.Add(dst.DevicePtr()+off, hp+off, 1000)
			}
			b.Add(dst.DevicePtr()+small*1000, hp+small*1000, n-small*1000)
			b.Add(dst.DevicePtr()+n, src.DevicePtr(), n)
			if err := s.CopyBatch(&b); err != nil {
				t.Fatal(err)
			}
			if b.Len() != 0 {
				t.Fatal("CopyBatch did not empty the batch")
			}
			got := make([]byte, 2*n)
			if err := s.CopyDtoH(got, dst, 0); err != nil {
				t.Fatal(err)
			}
			syncStream(t, s)
			if !bytes.Equal(got, want) {
				t.Fatalf("byte %d differs", diffAt(got, want))
			}
			path, failure := LastBatchPath()
			t.Logf("queued with %v (batch failure so far: %v)", path, failure)
			if perCopy && path != BatchPerCopy {
				t.Errorf("PerCopy batch queued with %v", path)
			}
			if v, _ := DriverVersion(); !perCopy && v >= 12080 && path == BatchPerCopy {
				t.Errorf("driver %d has cuMemcpyBatchAsync, but the batch fell back to per-copy calls: %v", v, failure)
			}
		})
	}
}

// BenchmarkCopyBatch4KiB queues 100,000 copies of 4 KiB between scattered
// device addresses per operation, batched and per copy, and reports the
// cost per copy (queueing plus execution).
func BenchmarkCopyBatch4KiB(b *testing.B) {
	d := testDevice(b)
	s := testStream(b, d)
	const count, size = 100_000, 4 << 10
	src := alloc(b, d, count*2*size) // every other 4 KiB: no copy merges
	dst := alloc(b, d, count*2*size)
	for _, perCopy := range []bool{false, true} {
		b.Run(fmt.Sprintf("perCopy=%v", perCopy), func(b *testing.B) {
			benchScattered(b, s, src, dst, count, size, &CopyBatch{PerCopy: perCopy}, s.CopyBatch)
		})
	}
}
