package gpu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/mem"
)

// The tests below need a GPU; they skip, saying why, where CUDA is absent.

func skipWithoutCUDA(tb testing.TB) {
	tb.Helper()
	err := OpenCUDA()
	if errors.Is(err, ErrNoDriver) || errors.Is(err, ErrNoDevice) {
		tb.Skipf("skipping: needs a CUDA GPU: %v", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
}

func testDevice(tb testing.TB) *CUDADevice {
	tb.Helper()
	skipWithoutCUDA(tb)
	d, err := NewCUDADevice(0)
	if err != nil {
		tb.Fatal(err)
	}
	closeAtEnd(tb, d.Close)
	return d
}

func testStream(tb testing.TB, d *CUDADevice) *Stream {
	tb.Helper()
	s, err := d.NewStream()
	if err != nil {
		tb.Fatal(err)
	}
	closeAtEnd(tb, s.Close)
	return s
}

// testKernel returns what open makes on s (a Caster, Checksummer or
// Gather), failing the test where open says that the named kernel is
// unavailable, and closes it, bounded by 30 s, when the test ends.
func testKernel[K interface{ Close(context.Context) error }](tb testing.TB, s *Stream, name string, open func() (K, error)) K {
	tb.Helper()
	k, err := open()
	if err != nil {
		tb.Fatalf("the %s kernel is unavailable on %s: %v", name, s.Device().Name(), err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := k.Close(ctx); err != nil {
			tb.Error(err)
		}
	})
	return k
}

func alloc(tb testing.TB, d mem.Device, n int) mem.Buffer {
	tb.Helper()
	b, err := d.Alloc(n)
	if err != nil {
		tb.Fatal(err)
	}
	closeAtEnd(tb, b.Free)
	return b
}

// closeAtEnd runs close when tb ends and fails tb where it fails.
func closeAtEnd(tb testing.TB, close func() error) {
	tb.Cleanup(func() {
		if err := close(); err != nil {
			tb.Error(err)
		}
	})
}

func pattern(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// uploaded returns n pattern bytes (pattern(n, seed)) and device memory of
// d, freed when tb ends, that a copy queued on s fills with them.
func uploaded(tb testing.TB, d *CUDADevice, s *Stream, n int, seed uint64) ([]byte, mem.Buffer) {
	tb.Helper()
	host := pattern(n, seed)
	buf := alloc(tb, d, n)
	if err := s.CopyHtoD(buf, 0, host); err != nil {
		tb.Fatal(err)
	}
	return host, buf
}

func syncStream(tb testing.TB, s *Stream) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Sync(ctx); err != nil {
		tb.Fatal(err)
	}
}

func TestCUDADeviceInfo(t *testing.T) {
	d := testDevice(t)
	n, err := DeviceCount()
	if err != nil || n < 1 {
		t.Fatalf("DeviceCount = %d, %v", n, err)
	}
	v, err := DriverVersion()
	if err != nil || v < 11000 {
		t.Fatalf("DriverVersion = %d, %v", v, err)
	}
	if d.Kind() != mem.KindCUDA || !strings.Contains(d.Name(), "cuda:0") {
		t.Fatalf("Kind %q Name %q", d.Kind(), d.Name())
	}
	free, total, err := d.MemInfo()
	if err != nil || free == 0 || free > total {
		t.Fatalf("MemInfo = %d free of %d, %v", free, total, err)
	}
	t.Logf("%s: %d device(s), driver CUDA %d.%d, %.1f of %.1f GiB free",
		d.Name(), n, v/1000, v%1000/10, float64(free)/(1<<30), float64(total)/(1<<30))
	if _, err := NewCUDADevice(n); err == nil {
		t.Fatalf("NewCUDADevice(%d) of %d devices succeeded", n, n)
	}
}

func TestCUDAMemInfoTracksAlloc(t *testing.T) {
	d := testDevice(t)
	before, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.Alloc(1 << 30)
	if err != nil {
		t.Fatal(err)
	}
	during, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	// Other processes may allocate meanwhile; the 1 GiB must show up.
	if before < during || before-during < 1<<29 {
		t.Fatalf("free memory went from %d to %d after allocating 1 GiB", before, during)
	}
}

func TestCUDACopyRoundTrip(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	const n = 8<<20 + 13
	src := pattern(n, 1)
	a, b := alloc(t, d, n), alloc(t, d, n)
	if a.Host() != nil || a.DevicePtr() == 0 || a.Len() != n || a.Device() != mem.Device(d) {
		t.Fatalf("device buffer: host %v ptr %#x len %d", a.Host() != nil, a.DevicePtr(), a.Len())
	}
	if err := s.CopyHtoD(a, 0, src); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyDtoD(b, 0, a, 0, n); err != nil {
		t.Fatal(err)
	}
	// A shifted copy inside b: b[100:1100] = a[5000:6000].
	if err := s.CopyDtoD(b, 100, a, 5000, 1000); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := s.CopyDtoH(got, b, 0); err != nil {
		t.Fatal(err)
	}
	syncStream(t, s)
	want := append([]byte(nil), src...)
	copy(want[100:1100], src[5000:6000])
	if !bytes.Equal(got, want) {
		t.Fatalf("round trip differs at byte %d", diffAt(got, want))
	}
	// Partial reads at an offset.
	part := make([]byte, 4096)
	if err := s.CopyDtoH(part, a, n-4096); err != nil {
		t.Fatal(err)
	}
	syncStream(t, s)
	if !bytes.Equal(part, src[n-4096:]) {
		t.Fatal("tail read differs")
	}
}

func TestCUDAPinned(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	const n = 32 << 20
	in := alloc(t, d.PinnedHost(), n)
	out, err := d.AllocPinned(n)
	if err != nil {
		t.Fatal(err)
	}
	if !IsPinned(in) || !IsPinned(out) || len(in.Host()) != n || in.DevicePtr() != 0 || in.Device().Kind() != mem.KindHost {
		t.Fatalf("pinned buffer: pinned %v host %d ptr %#x kind %s", IsPinned(in), len(in.Host()), in.DevicePtr(), in.Device().Kind())
	}
	copy(in.Host(), pattern(n, 2))
	dev := alloc(t, d, n)
	if err := s.CopyHtoD(dev, 0, in.Host()); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyDtoH(out.Host(), dev, 0); err != nil {
		t.Fatal(err)
	}
	syncStream(t, s)
	if !bytes.Equal(in.Host(), out.Host()) {
		t.Fatalf("pinned round trip differs at byte %d", diffAt(in.Host(), out.Host()))
	}
	if err := out.Free(); err != nil {
		t.Fatal(err)
	}
	if err := out.Free(); err != nil || out.Host() != nil {
		t.Fatalf("second Free: %v, host %v", err, out.Host() != nil)
	}
}

func TestCUDAMemset(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	const n = 1 << 20
	b := alloc(t, d, n)
	if err := s.Memset(b, 0, n, 0xAB); err != nil {
		t.Fatal(err)
	}
	if err := s.Memset(b, 1000, 24, 0x00); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := s.CopyDtoH(got, b, 0); err != nil {
		t.Fatal(err)
	}
	syncStream(t, s)
	for i, v := range got {
		want := byte(0xAB)
		if i >= 1000 && i < 1024 {
			want = 0
		}
		if v != want {
			t.Fatalf("byte %d = %#x, want %#x", i, v, want)
		}
	}
}

// TestCUDAEventOrdering chains two streams with an event: stream 2 reads
// what stream 1 writes, and must see it only because it waits on the event.
func TestCUDAEventOrdering(t *testing.T) {
	d := testDevice(t)
	s1, s2 := testStream(t, d), testStream(t, d)
	const n = 256 << 20
	src := alloc(t, d.PinnedHost(), n)
	copy(src.Host(), pattern(n, 3))
	a, b := alloc(t, d, n), alloc(t, d, n)
	out := alloc(t, d.PinnedHost(), n)

	if err := s1.Memset(a, 0, n, 0); err != nil {
		t.Fatal(err)
	}
	if err := s1.CopyHtoD(a, 0, src.Host()); err != nil {
		t.Fatal(err)
	}
	e, err := s1.Record()
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := s2.WaitEvent(e); err != nil {
		t.Fatal(err)
	}
	if err := s2.CopyDtoD(b, 0, a, 0, n); err != nil {
		t.Fatal(err)
	}
	if err := s2.CopyDtoH(out.Host(), b, 0); err != nil {
		t.Fatal(err)
	}
	e2, err := s2.Record()
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e2.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if done, err := e.Query(); err != nil || !done {
		t.Fatalf("first event not done after the second: %v, %v", done, err)
	}
	if done, err := s2.Query(); err != nil || !done {
		t.Fatalf("stream 2 busy after its last event: %v, %v", done, err)
	}
	if !bytes.Equal(out.Host(), src.Host()) {
		t.Fatalf("stream 2 read stale data at byte %d", diffAt(out.Host(), src.Host()))
	}
}

func TestCUDASyncDeadline(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	const n = 1 << 30
	a, b := alloc(t, d, n), alloc(t, d, n)
	for range 20 { // about 20 ms of copying
		if err := s.CopyDtoD(b, 0, a, 0, n); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Microsecond)
	defer cancel()
	err := s.Sync(ctx)
	var we *WaitError
	if !errors.As(err, &we) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Sync with an expired deadline = %v, want a *WaitError", err)
	}
	t.Logf("expected: %v", err)
	syncStream(t, s) // drain before the buffers are freed
}

func TestCUDAMisuse(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	if _, err := d.Alloc(0); err == nil {
		t.Error("Alloc(0) succeeded")
	}
	b := alloc(t, d, 1024)
	if err := s.CopyHtoD(b, 1000, make([]byte, 100)); err == nil {
		t.Error("copy past the end succeeded")
	}
	if err := s.CopyDtoH(make([]byte, 10), b, -1); err == nil {
		t.Error("copy at a negative offset succeeded")
	}
	h, _ := mem.Host{}.Alloc(16)
	if err := s.CopyHtoD(h, 0, make([]byte, 16)); err == nil {
		t.Error("device copy into a Go host buffer succeeded")
	}
	if _, err := d.ExportIPC(h); err == nil {
		t.Error("ExportIPC of a host buffer succeeded")
	}
	c, err := d.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Free(); err != nil {
		t.Fatal(err)
	}
	if err := s.Memset(c, 0, 64, 1); !errors.Is(err, mem.ErrFreed) {
		t.Errorf("memset of a freed buffer: %v, want ErrFreed", err)
	}
	unlock, err := d.LockContext()
	if err != nil {
		t.Fatal(err)
	}
	unlock()
	unlock()
}

const ipcChildEnv = "WEIGHTCAST_GPU_IPC_CHILD"

// TestCUDAIPC exports a buffer to a child process (this test binary run
// again), which checks the bytes and overwrites the first half.
func TestCUDAIPC(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	const n = 64 << 20
	src := pattern(n, 4)
	b := alloc(t, d, n)
	if err := s.CopyHtoD(b, 0, src); err != nil {
		t.Fatal(err)
	}
	syncStream(t, s)
	h, err := d.ExportIPC(b)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^TestCUDAIPCChild$", "-test.v")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s:%d", ipcChildEnv, h, n))
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "--- PASS: TestCUDAIPCChild") {
		t.Fatalf("child did not run its check:\n%s", out)
	}
	t.Logf("child process ran in %v", time.Since(start).Round(time.Millisecond))
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "opened") {
			t.Log("child:", strings.TrimSpace(line))
		}
	}
	got := make([]byte, n)
	if err := s.CopyDtoH(got, b, 0); err != nil {
		t.Fatal(err)
	}
	syncStream(t, s)
	for i := range n / 2 {
		if got[i] != 0x5A {
			t.Fatalf("byte %d = %#x, want the child's 0x5a", i, got[i])
		}
	}
	if !bytes.Equal(got[n/2:], src[n/2:]) {
		t.Fatal("the child changed the second half")
	}
}

// TestCUDAIPCChild is the child side of TestCUDAIPC; it skips unless run
// by it.
func TestCUDAIPCChild(t *testing.T) {
	arg := os.Getenv(ipcChildEnv)
	if arg == "" {
		t.Skip("runs only as the child process of TestCUDAIPC")
	}
	hs, ns, _ := strings.Cut(arg, ":")
	h, err := ParseIPCHandle(hs)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(ns)
	if err != nil {
		t.Fatal(err)
	}
	d := testDevice(t)
	s := testStream(t, d)
	start := time.Now()
	b, err := d.OpenIPC(h, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("opened %d bytes in %v", n, time.Since(start))
	got := make([]byte, n)
	if err := s.CopyDtoH(got, b, 0); err != nil {
		t.Fatal(err)
	}
	syncStream(t, s)
	if want := pattern(n, 4); !bytes.Equal(got, want) {
		t.Fatalf("child read differs at byte %d", diffAt(got, want))
	}
	if err := s.Memset(b, 0, n/2, 0x5A); err != nil {
		t.Fatal(err)
	}
	syncStream(t, s)
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
}
