package gpu

import (
	"context"
	"testing"
	"time"
)

// TestGPURecordOn checks that an event recorded through RecordOn on a
// stream's raw handle orders another stream's work after it: a copy queued
// on b after waiting for the event sees the memset queued on a.
func TestGPURecordOn(t *testing.T) {
	d := testDevice(t)
	const n = 64 << 20
	buf, err := d.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, buf.Free)
	a, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, a.Close)
	b, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	closeAtEnd(t, b.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, v := range []byte{7, 9} {
		if err := a.Memset(buf, 0, n, v); err != nil {
			t.Fatal(err)
		}
		ev, err := d.RecordOn(a.Handle())
		if err != nil {
			t.Fatal(err)
		}
		if err := b.WaitEvent(ev); err != nil {
			t.Fatal(err)
		}
		host := make([]byte, n)
		if err := b.CopyDtoH(host, buf, 0); err != nil {
			t.Fatal(err)
		}
		if err := b.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if err := ev.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		ev.Close()
		for i, got := range host {
			if got != v {
				t.Fatalf("byte %d is %d after the memset to %d: the event did not order the copy", i, got, v)
			}
		}
	}
	// The legacy default stream (handle 0) takes an event too.
	ev, err := d.RecordOn(0)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	if err := ev.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}
