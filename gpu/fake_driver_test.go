package gpu_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/gpu/gputest"
)

// TestFakeDriver runs the package's entry points against a stand-in
// libcuda.so.1 built from C (gputest.RunWithFakes), which refuses handles
// it did not make, calls without the context current and launches whose
// grid does not match their arguments: it checks what crosses the cgo
// layer on machines without a GPU. The GPU tests check the same calls on
// the real driver.
func TestFakeDriver(t *testing.T) { gputest.RunWithFakes(t, "TestFakeDriverChild") }

// TestFakeDriverChild is the child side of TestFakeDriver.
func TestFakeDriverChild(t *testing.T) {
	gputest.InFakeChild(t)
	os.Setenv("FAKECUDA_WAIT64", "1") // before the device is asked
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if v, err := gpu.DriverVersion(); err != nil || v != 13000 {
		t.Fatalf("DriverVersion = %d, %v; want the stand-in's 13000", v, err)
	}
	d := gputest.Open(t, 0)
	if !strings.Contains(d.Name(), "Fake CUDA device (cuda:0)") {
		t.Fatalf("opened %q, not the stand-in driver's device", d.Name())
	}
	if free, total, err := d.MemInfo(); err != nil || free != 1<<29 || total != 1<<30 {
		t.Fatalf("MemInfo = %d, %d, %v", free, total, err)
	}
	if n, err := d.Multiprocessors(); err != nil || n != 4 {
		t.Fatalf("Multiprocessors = %d, %v", n, err)
	}
	if got, want := d.MPS(), os.Getenv("FAKECUDA_MPS") == "1"; got != want {
		t.Fatalf("MPS() = %v with FAKECUDA_MPS=%q", got, os.Getenv("FAKECUDA_MPS"))
	}
	if msg := gpu.CUDAResult(201).Error(); !strings.Contains(msg, "fake: no context current") {
		t.Fatalf("CUDAResult(201).Error() = %q, lacks the driver's description", msg)
	}
	s := gputest.Stream(t, d)

	// Copies and memsets, with the context made current by every call
	// (the stand-in's current context is per thread, like the driver's).
	const n = 1<<16 + 5
	want := bytes.Repeat([]byte("weightcast"), n/10+1)[:n]
	a, b := gputest.Alloc(t, d, n), gputest.Alloc(t, d, n)
	gputest.Upload(t, s, a, 0, want)
	if err := s.CopyDtoD(b, 0, a, 0, n); err != nil {
		t.Fatal(err)
	}
	if err := s.Memset(b, 1, 3, 'X'); err != nil {
		t.Fatal(err)
	}
	got := gputest.Download(t, s, b, 0, n)
	if !bytes.Equal(got[:1], want[:1]) || string(got[1:4]) != "XXX" || !bytes.Equal(got[4:], want[4:]) {
		t.Fatal("copy and memset through the stand-in driver changed the wrong bytes")
	}

	// Events.
	ev, err := s.Record()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WaitEvent(ev); err != nil {
		t.Fatal(err)
	}
	if err := ev.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ev.Close(); err != nil {
		t.Fatal(err)
	}

	// Stream memory operations: the word and the value cross the cgo
	// layer intact, and the wait compares cyclically (the stand-in
	// refuses a wait that is not met already).
	word := gputest.Alloc(t, d, 8)
	gputest.Fill(t, s, word, 0)
	w, _ := gpu.Address(word)
	if err := s.WriteValue(w+4, 0x80000005); err != nil {
		t.Fatal(err)
	}
	if got := gputest.Download(t, s, word, 0, 8); !bytes.Equal(got, []byte{0, 0, 0, 0, 5, 0, 0, 0x80}) {
		t.Fatalf("WriteValue(0x80000005) at byte 4 left % x", got)
	}
	for _, c := range []struct {
		v  uint32
		ok bool
	}{
		{0x80000005, true}, {0x80000004, true},
		{0x00000006, true},  // 2^31-1 behind
		{0x80000006, false}, // one ahead
		{0x00000004, false}, // 2^31+1 behind is 2^31-1 ahead
	} {
		if err := s.WaitValue(w+4, c.v); (err == nil) != c.ok {
			t.Errorf("WaitValue(%#x) on a word of 0x80000005: %v, want met %v", c.v, err, c.ok)
		}
	}

	// 64-bit words: waits compare cyclically over 64 bits, a plain write
	// may lower a word, a raise (the one-thread kernel) never does.
	if !d.StreamMemOps64() {
		t.Fatal("StreamMemOps64() = false on the stand-in with FAKECUDA_WAIT64=1")
	}
	if err := s.WriteValue64(w, 7<<32|3); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		v, want uint64
	}{{7<<32 | 1, 7<<32 | 3}, {8 << 32, 8 << 32}, {7<<32 | 0xffffffff, 8 << 32}} {
		if err := s.RaiseValue64(w, c.v); err != nil {
			t.Fatal(err)
		}
		if got := binary.LittleEndian.Uint64(gputest.Download(t, s, word, 0, 8)); got != c.want {
			t.Fatalf("RaiseValue64(%#x) left %#x, want %#x", c.v, got, c.want)
		}
	}
	if err := s.WaitValue64(w, 8<<32); err != nil {
		t.Errorf("WaitValue64 of the word's value: %v", err)
	}
	if err := s.WaitValue64(w, 8<<32|1); err == nil {
		t.Error("WaitValue64 one past the word's value was met")
	}
	if err := s.RaiseValue64(w+4, 1); err == nil || !strings.Contains(err.Error(), "8-byte aligned") {
		t.Errorf("RaiseValue64 of a misaligned word: %v", err)
	}

	// Timed events: Elapsed reads the stand-in's clock (1 ms per
	// recording of a timed event) back through its float out-parameter;
	// an event from Record keeps no time.
	t0, err := s.RecordTimed()
	if err != nil {
		t.Fatal(err)
	}
	defer t0.Close()
	untimed, err := s.Record()
	if err != nil {
		t.Fatal(err)
	}
	defer untimed.Close()
	t1, err := s.RecordTimed()
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Close()
	if d, err := gpu.Elapsed(t0, t1); err != nil || d != time.Millisecond {
		t.Fatalf("Elapsed = %v, %v; want the stand-in's 1ms", d, err)
	}
	if d, err := gpu.Elapsed(t1, t0); err != nil || d != -time.Millisecond {
		t.Fatalf("Elapsed backwards = %v, %v; want -1ms", d, err)
	}
	if _, err := gpu.Elapsed(t0, untimed); err == nil {
		t.Fatal("Elapsed to an event that keeps no time succeeded")
	}

	// Batched copies: the batch call and the per-copy loop, from pinned
	// host memory and between device buffers.
	pinned := gputest.Alloc(t, d.PinnedHost(), n)
	if !gpu.IsPinned(pinned) {
		t.Fatal("PinnedHost's buffer is not pinned")
	}
	copy(pinned.Host(), want)
	src, _ := gpu.Address(pinned)
	for _, perCopy := range []bool{false, true} {
		gputest.Fill(t, s, b, 0)
		cb := gpu.CopyBatch{PerCopy: perCopy}
		cb.Add(b.DevicePtr(), src, 100)
		cb.Add(b.DevicePtr()+100, a.DevicePtr()+100, n-100)
		if err := s.CopyBatch(&cb); err != nil {
			t.Fatal(err)
		}
		path, failure := gpu.LastBatchPath()
		if wantPath := map[bool]gpu.BatchPath{false: gpu.BatchV2, true: gpu.BatchPerCopy}[perCopy]; path != wantPath || failure != nil {
			t.Fatalf("PerCopy %v: copies queued by %v (batch failure %v), want %v", perCopy, path, failure, wantPath)
		}
		if got := gputest.Download(t, s, b, 0, n); !bytes.Equal(got, want) {
			t.Fatalf("PerCopy %v: batched copies differ at byte %d", perCopy, gputest.FirstDiff(got, want))
		}
	}

	// IPC: the 64-byte handle, passed by value to cuIpcOpenMemHandle (the
	// stand-in, unlike the driver, opens handles of its own process).
	h, err := d.ExportIPC(a)
	if err != nil {
		t.Fatal(err)
	}
	opened, err := d.OpenIPC(h, n)
	if err != nil {
		t.Fatal(err)
	}
	if opened.DevicePtr() != a.DevicePtr() {
		t.Fatalf("OpenIPC mapped %#x, want the exported %#x", opened.DevicePtr(), a.DevicePtr())
	}
	if err := opened.Free(); err != nil {
		t.Fatal(err)
	}

	// Memory allocated elsewhere, exported by address: Allocation finds
	// the allocation that holds an address inside it (both
	// out-parameters of cuMemGetAddressRange_v2), ExportAddress exports
	// its base, and an address in no allocation is refused.
	info, err := d.Allocation(a.DevicePtr() + 1000)
	if err != nil || info.Base != a.DevicePtr() || info.Size != n || info.ID == 0 {
		t.Fatalf("Allocation(inside) = %+v, %v; want base %#x, size %d and an id", info, err, a.DevicePtr(), n)
	}
	if infoB, err := d.Allocation(b.DevicePtr()); err != nil || infoB.ID == info.ID {
		t.Fatalf("Allocation of another buffer = %+v, %v; want another id than %d", infoB, err, info.ID)
	}
	if id, err := d.AllocationID(a.DevicePtr() + 5); err != nil || id != info.ID {
		t.Fatalf("AllocationID = %d, %v; want %d", id, err, info.ID)
	}
	if h2, err := d.ExportAddress(info.Base); err != nil || h2 != h {
		t.Fatalf("ExportAddress = %v, %v; want the handle ExportIPC gave", h2, err)
	}
	if _, err := d.Allocation(8); !errors.Is(err, gpu.ErrNotExportable) || !strings.Contains(err.Error(), "cuMemGetAddressRange_v2") {
		t.Fatalf("Allocation(8) = %v, want ErrNotExportable naming the call", err)
	}
	if u, err := d.UUID(); err != nil || string(u[:]) != "fake-cuda-uuid-0" {
		t.Fatalf("UUID = %q, %v; want the stand-in's", u, err)
	}

	// The gather kernel: the stand-in runs wc_gather, so the self-test at
	// load passes only if the launch's grid and arguments arrive intact.
	g := s.NewGather()
	if ok, why := g.Kernel(); !ok {
		t.Fatalf("gather kernel unavailable on the stand-in driver: %v", why)
	}
	gputest.Fill(t, s, b, 0)
	var cb gpu.CopyBatch
	for off := int64(0); off < n; off += 4096 {
		cb.Add(b.DevicePtr()+uint64(off), a.DevicePtr()+uint64(off), min(4096, n-off))
	}
	if err := g.Copy(ctx, &cb); err != nil {
		t.Fatal(err)
	}
	if path, why := gpu.LastGatherPath(); path != gpu.GatherKernel {
		t.Fatalf("Gather.Copy went through %v: %v", path, why)
	}
	if got := gputest.Download(t, s, b, 0, n); !bytes.Equal(got, want) {
		t.Fatalf("gathered copies differ at byte %d", gputest.FirstDiff(got, want))
	}
	if err := g.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// A layout sum without its kernel (the stand-in lacks it): the
	// copies through the gather kernel, the pieces read back to the host
	// and summed there.
	g = s.NewGather()
	if ok, why := g.LayoutKernel(); ok || !errors.Is(why, gpu.ErrNoGatherLayoutKernel) {
		t.Fatalf("LayoutKernel() = %v, %v on the stand-in driver", ok, why)
	}
	gputest.Fill(t, s, b, 0)
	var l gpu.Layout
	layout := make([]byte, 3*4096)
	l.Add(4096, a.DevicePtr()+3, 1000, b.DevicePtr()+64)
	l.Add(0, a.DevicePtr()+8000, 77, 0)
	copy(layout[4096:], want[3:1003])
	copy(layout[0:], want[8000:8077])
	ps, err := g.CopySumLayout(ctx, &l, int64(len(layout)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if sum, err := ps.Wait(ctx); err != nil || sum != checksum.Sum(layout) {
		t.Fatalf("CopySumLayout on the host = %#x, %v; want %#x", sum, err, checksum.Sum(layout))
	}
	ps.Close()
	if got := gputest.Download(t, s, b, 64, 1000); !bytes.Equal(got, want[3:1003]) {
		t.Fatalf("CopySumLayout's copy differs at byte %d", gputest.FirstDiff(got, want[3:1003]))
	}
	if err := g.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// The checksum kernel's entry is missing from the stand-in: the
	// kernel is unavailable, and the error says which call failed.
	if _, err := s.NewChecksummer(); !errors.Is(err, gpu.ErrNoChecksumKernel) || !strings.Contains(err.Error(), "cuModuleGetFunction") {
		t.Fatalf("NewChecksummer: %v, want ErrNoChecksumKernel from cuModuleGetFunction", err)
	}

	unlock, err := d.LockContext()
	if err != nil {
		t.Fatal(err)
	}
	unlock()

	// Memory freed while another goroutine still copies out of it (a
	// root's bucket buffer, say, freed before a receiver's copy): the
	// stand-in, like the driver, refuses such copies with
	// CUDA_ERROR_INVALID_VALUE and moves nothing, rather than read or
	// write freed memory; so it does a copy that runs past the end of its
	// allocation.
	dead, err := d.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	at := dead.DevicePtr()
	if err := dead.Free(); err != nil {
		t.Fatal(err)
	}
	gputest.Fill(t, s, b, 7)
	for _, c := range []struct {
		what     string
		dst, src uint64
	}{
		{"from freed memory", b.DevicePtr(), at},
		{"into freed memory", at, a.DevicePtr()},
		{"past the end of the source", b.DevicePtr(), a.DevicePtr() + 1},
	} {
		if err := s.CopyDtoDPtr(c.dst, c.src, n); !errors.Is(err, gpu.CUDAErrorInvalidValue) {
			t.Errorf("a copy %s: %v; want CUDA_ERROR_INVALID_VALUE", c.what, err)
		}
	}
	if err := s.CopyDtoHPtr(make([]byte, n), at); !errors.Is(err, gpu.CUDAErrorInvalidValue) {
		t.Errorf("a copy from freed memory to the host: %v; want CUDA_ERROR_INVALID_VALUE", err)
	}
	if got := gputest.Download(t, s, b, 0, n); !bytes.Equal(got, bytes.Repeat([]byte{7}, n)) {
		t.Fatalf("a refused copy changed byte %d of its destination", gputest.FirstDiff(got, bytes.Repeat([]byte{7}, n)))
	}

	// The gather kernel reading freed memory faults, and the fault loses
	// the context, as on a GPU: every later call fails (this is the
	// test's last use of the device; closing it at the end fails too).
	g = s.NewGather()
	cb.Reset()
	cb.Add(b.DevicePtr(), at, 4096)
	if err := g.Copy(ctx, &cb); !errors.Is(err, gpu.CUDAResult(700)) {
		t.Fatalf("gathering from freed memory: %v; want CUDA_ERROR_ILLEGAL_ADDRESS (700)", err)
	}
	if err := s.Memset(b, 0, 1, 0); !errors.Is(err, gpu.CUDAResult(700)) {
		t.Fatalf("a memset after the fault: %v; want CUDA_ERROR_ILLEGAL_ADDRESS (700)", err)
	}
}

// TestFakeDriverMPS checks that MPS reads the driver's
// CU_DEVICE_ATTRIBUTE_MPS_ENABLED: the stand-in reports it as
// FAKECUDA_MPS says (TestFakeDriverChild sees a driver that does not know
// the attribute, which MPS takes for no MPS).
func TestFakeDriverMPS(t *testing.T) {
	t.Setenv("FAKECUDA_MPS", "1")
	gputest.RunWithFakes(t, "TestFakeDriverMPSChild")
}

// TestFakeDriverMPSChild is the child side of TestFakeDriverMPS.
func TestFakeDriverMPSChild(t *testing.T) {
	gputest.InFakeChild(t)
	if d := gputest.Open(t, 0); !d.MPS() {
		t.Fatal("MPS() = false where the driver reports CU_DEVICE_ATTRIBUTE_MPS_ENABLED = 1")
	}
}
