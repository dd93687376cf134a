package gpu

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/mem"
)

// These tests need no GPU: they run everywhere.

func TestCUDAResultNames(t *testing.T) {
	cases := []struct {
		r    CUDAResult
		name string
	}{
		{0, "CUDA_SUCCESS"},
		{1, "CUDA_ERROR_INVALID_VALUE"},
		{2, "CUDA_ERROR_OUT_OF_MEMORY"},
		{100, "CUDA_ERROR_NO_DEVICE"},
		{201, "CUDA_ERROR_INVALID_CONTEXT"},
		{400, "CUDA_ERROR_INVALID_HANDLE"},
		{600, "CUDA_ERROR_NOT_READY"},
		{700, "CUDA_ERROR_ILLEGAL_ADDRESS"},
		{999, "CUDA_ERROR_UNKNOWN"},
		{12345, "CUDA_ERROR_12345"},
	}
	for _, c := range cases {
		if got := c.r.Name(); got != c.name {
			t.Errorf("CUDAResult(%d).Name() = %q, want %q", int(c.r), got, c.name)
		}
		if msg := c.r.Error(); !strings.HasPrefix(msg, c.name) {
			t.Errorf("CUDAResult(%d).Error() = %q, want prefix %q", int(c.r), msg, c.name)
		}
	}
	seen := map[string]CUDAResult{}
	for r, n := range cudaResultNames {
		if !strings.HasPrefix(n, "CUDA_") {
			t.Errorf("name %q of %d lacks the CUDA_ prefix", n, r)
		}
		if prev, dup := seen[n]; dup {
			t.Errorf("name %q used by %d and %d", n, prev, r)
		}
		seen[n] = r
	}
}

func TestCUDAResultIs(t *testing.T) {
	var err error = &Error{Op: "cuInit", Device: -1, Result: CUDAErrorNoDevice}
	if !errors.Is(err, ErrNoDevice) {
		t.Errorf("%v does not match ErrNoDevice", err)
	}
	if errors.Is(err, ErrMissingSymbol) {
		t.Errorf("%v matches ErrMissingSymbol", err)
	}
	var r CUDAResult
	if !errors.As(err, &r) || r != CUDAErrorNoDevice {
		t.Errorf("errors.As(%v) = %v", err, r)
	}
	err = &Error{Op: "cuMemAlloc_v2", Device: 3, Detail: "42 bytes", Result: resultFunctionNotFound}
	if !errors.Is(err, ErrMissingSymbol) {
		t.Errorf("%v does not match ErrMissingSymbol", err)
	}
	if want := "gpu: cuMemAlloc_v2 on cuda:3 (42 bytes): function not found"; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("Error() = %q, want prefix %q", err, want)
	}
}

// TestNoDriver checks what a machine without the driver sees: every entry
// point fails with ErrNoDriver, and the dispatch table answers "function not
// found" instead of crashing.
func TestNoDriver(t *testing.T) {
	err := OpenCUDA()
	if err == nil || errors.Is(err, ErrNoDevice) {
		t.Skip("the CUDA driver is installed here; nothing to check")
	}
	if !errors.Is(err, ErrNoDriver) {
		t.Fatalf("OpenCUDA: %v, want ErrNoDriver", err)
	}
	if !strings.Contains(err.Error(), DriverLibrary) {
		t.Errorf("error %q does not name %s", err, DriverLibrary)
	}
	if _, err := DeviceCount(); !errors.Is(err, ErrNoDriver) {
		t.Errorf("DeviceCount: %v, want ErrNoDriver", err)
	}
	if _, err := NewCUDADevice(0); !errors.Is(err, ErrNoDriver) {
		t.Errorf("NewCUDADevice: %v, want ErrNoDriver", err)
	}
	if _, err := DriverVersion(); !errors.Is(err, ErrNoDriver) {
		t.Errorf("DriverVersion: %v, want ErrNoDriver", err)
	}
	if _, err := driverVersion(); !errors.Is(err, ErrMissingSymbol) {
		t.Errorf("shim call with an empty table: %v, want ErrMissingSymbol", err)
	}
}

func TestPoll(t *testing.T) {
	calls := 0
	err := Poll(context.Background(), func() (bool, error) { calls++; return calls == 100, nil })
	if err != nil || calls != 100 {
		t.Fatalf("Poll = %v after %d calls, want nil after 100", err, calls)
	}

	boom := errors.New("boom")
	if err := Poll(context.Background(), func() (bool, error) { return false, boom }); err != boom {
		t.Fatalf("Poll = %v, want the query's error", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = Poll(ctx, func() (bool, error) { return false, nil })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Poll = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Poll took %v to notice a 20ms deadline", d)
	}
}

func TestPollLongWait(t *testing.T) {
	// Past the fine-polling phase, Poll sleeps on a timer and still ends
	// with the context.
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Millisecond)
	defer cancel()
	start := time.Now()
	calls := 0
	err := Poll(ctx, func() (bool, error) { calls++; return false, nil })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Poll = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Poll took %v to notice a 120ms deadline", d)
	}
	t.Logf("%d checks in %v", calls, time.Since(start).Round(time.Millisecond))
}

// BenchmarkPollOvershoot reports how late Poll notices work that finishes
// 500µs after the wait starts.
func BenchmarkPollOvershoot(b *testing.B) {
	const wait = 500 * time.Microsecond
	var late time.Duration
	for range b.N {
		start := time.Now()
		_ = Poll(context.Background(), func() (bool, error) { return time.Since(start) >= wait, nil })
		late += time.Since(start) - wait
	}
	b.ReportMetric(float64(late.Nanoseconds())/1e3/float64(b.N), "µs-late/op")
}

func TestWaitError(t *testing.T) {
	d := &CUDADevice{ordinal: 3}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	err := d.wait(ctx, "stream sync", func() (bool, error) { return false, nil })
	var we *WaitError
	if !errors.As(err, &we) || we.Device != 3 || we.Op != "stream sync" {
		t.Fatalf("wait = %#v, want a *WaitError for cuda:3", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v does not match DeadlineExceeded", err)
	}
	if !strings.Contains(err.Error(), "stream sync on cuda:3") {
		t.Errorf("message %q does not say what waited", err)
	}
	// Work that is done wins over an ended context.
	cancel()
	if err := d.wait(ctx, "event wait", func() (bool, error) { return true, nil }); err != nil {
		t.Fatalf("wait on finished work = %v", err)
	}
}

func TestIPCHandleString(t *testing.T) {
	var h IPCHandle
	for i := range h {
		h[i] = byte(i * 3)
	}
	got, err := ParseIPCHandle(h.String())
	if err != nil || got != h {
		t.Fatalf("ParseIPCHandle(String()) = %v, %v", got, err)
	}
	if _, err := ParseIPCHandle("abcd"); err == nil {
		t.Fatal("ParseIPCHandle accepted a short handle")
	}
}

func TestIsPinnedHost(t *testing.T) {
	b, _ := mem.Host{}.Alloc(8)
	if IsPinned(b) {
		t.Fatal("a Go host buffer reports pinned")
	}
	if _, err := devRange(b, 0, 8); err == nil {
		t.Fatal("a host buffer passed as device memory")
	}
}

// BenchmarkDriverCall measures a call into the driver layer that returns at
// once (cuDriverGetVersion; where no driver is loaded the C shim's NULL
// check answers): the cost of crossing into C and back that every driver
// call pays, and what a cgo-free loader would have to match.
func BenchmarkDriverCall(b *testing.B) {
	for b.Loop() {
		_, _ = cuDriverGetVersion()
	}
}

// TestDriverCallsAllocateNothing checks that calls through the shims keep
// their out-parameters and argument arrays on the stack (cgo's noescape
// and nocallback), so steady copy and launch loops allocate nothing. The
// calls with made-up handles run only where no driver is loaded (the
// shims answer before reaching it).
func TestDriverCallsAllocateNothing(t *testing.T) {
	calls := map[string]func(){
		"cuDriverGetVersion": func() { _, _ = cuDriverGetVersion() },
	}
	if OpenCUDA() != nil {
		addrs := []uint64{8}
		calls["copyBatch"] = func() { _, _, _ = copyBatch(0, addrs, addrs, addrs, 0, false) }
		calls["cuLaunchKernel"] = func() { _ = cuLaunchKernel(0, 0, 1, 1, 0, 1, 2, 3) }
		calls["cuEventCreate"] = func() { _, _ = cuEventCreate(0) }
	}
	for name, f := range calls {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s allocates %v times a call", name, n)
		}
	}
}
