package gpu

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// TestGPUElapsed times a 256 MiB device-to-device copy between two timed
// events: the GPU time is positive, below the host's wall time around the
// whole wait, and about what a copy of that size takes (more than 10 µs at
// any speed an H200 reaches); an event from Record keeps no time.
func TestGPUElapsed(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	const n = 256 << 20
	src, dst := alloc(t, d, n), alloc(t, d, n)
	host := time.Now()
	start, err := s.RecordTimed()
	if err != nil {
		t.Fatal(err)
	}
	defer start.Close()
	if err := s.CopyDtoD(dst, 0, src, 0, n); err != nil {
		t.Fatal(err)
	}
	end, err := s.RecordTimed()
	if err != nil {
		t.Fatal(err)
	}
	defer end.Close()
	untimed, err := s.Record()
	if err != nil {
		t.Fatal(err)
	}
	defer untimed.Close()
	syncStream(t, s)
	wall := time.Since(host)
	gpuTime, err := Elapsed(start, end)
	if err != nil {
		t.Fatal(err)
	}
	if gpuTime < 10*time.Microsecond || gpuTime > wall {
		t.Fatalf("a 256 MiB copy took %v on the GPU, %v on the host around it", gpuTime, wall)
	}
	if back, err := Elapsed(end, start); err != nil || back != -gpuTime {
		t.Fatalf("Elapsed(end, start) = %v, %v; want %v", back, err, -gpuTime)
	}
	if _, err := Elapsed(start, untimed); err == nil {
		t.Fatal("Elapsed to an event that keeps no time succeeded")
	}
	t.Logf("256 MiB copied in %v on the GPU (%.0f GB/s), %v on the host", gpuTime, 2*n/gpuTime.Seconds()/1e9, wall)
}

// TestGPUReadback reads device memory back through a Readback: after the
// buffer's fence, the bytes asked for, the pinned memory reused for a
// smaller read and grown for a larger buffer.
func TestGPUReadback(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	small, large := alloc(t, d, 1<<20), alloc(t, d, 4<<20)
	want := pattern(4<<20, 3)
	if err := s.CopyHtoD(large, 0, want); err != nil {
		t.Fatal(err)
	}
	fence, err := s.Record()
	if err != nil {
		t.Fatal(err)
	}
	defer fence.Close()
	if err := s.CopyHtoD(small, 0, want[:1<<20]); err != nil {
		t.Fatal(err)
	}
	syncStream(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := d.NewReadback()
	defer func() {
		if err := r.Close(ctx); err != nil {
			t.Error(err)
		}
	}()
	got, err := r.Read(ctx, small, 1000)
	if err != nil || !bytes.Equal(got, want[:1000]) {
		t.Fatalf("Read of 1000 bytes: %v", err)
	}
	got, err = r.Read(ctx, WithFence(large, fence), 4<<20)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("Read of a fenced 4 MiB buffer: %v", err)
	}
	if _, err := r.Read(ctx, small, 2<<20); err == nil {
		t.Fatal("a read past the buffer's end succeeded")
	}
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Read(ctx, small, 10); err != nil {
		t.Fatalf("Read after Close (a new stream and buffer): %v", err)
	}
}
