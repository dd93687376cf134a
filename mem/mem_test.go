package mem

import "testing"

func TestHostAlloc(t *testing.T) {
	var d Device = Host{}
	b, err := d.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if b.Len() != 1<<20 || len(b.Host()) != 1<<20 || b.DevicePtr() != 0 || b.Device().Kind() != KindHost {
		t.Fatalf("unexpected buffer: len %d host %d ptr %d", b.Len(), len(b.Host()), b.DevicePtr())
	}
	b.Host()[5] = 7
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	if err := b.Free(); err != nil {
		t.Fatal("second Free:", err)
	}
	if _, err := d.Alloc(-1); err == nil {
		t.Fatal("Alloc(-1) succeeded")
	}
}
