package faultfs

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestDisk(t *testing.T) {
	dir := t.TempDir()
	d := New(10)
	f, err := d.CreateTemp(dir, "a-*")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if n, err := f.Write([]byte("0123456")); n != 7 || err != nil {
		t.Fatalf("write within capacity: %d, %v", n, err)
	}
	n, err := f.WriteAt([]byte("abcdef"), 7)
	if n != 3 || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write past capacity: %d, %v; want 3 bytes and ENOSPC", n, err)
	}
	if b, _ := os.ReadFile(f.Name()); string(b) != "0123456abc" {
		t.Fatalf("file holds %q", b)
	}
	// Renaming over another file frees that file's bytes; removing the
	// directory frees the rest.
	sub := filepath.Join(dir, "sub")
	d.MkdirAll(sub, 0o755)
	moved := filepath.Join(sub, "b")
	if err := d.Rename(f.Name(), moved); err != nil || d.Used() != 10 {
		t.Fatalf("rename: %v, used %d", err, d.Used())
	}
	if err := d.RemoveAll(sub); err != nil || d.Used() != 0 {
		t.Fatalf("remove all: %v, used %d", err, d.Used())
	}
	if _, err := f.Write([]byte("0123456789")); err != nil {
		t.Fatalf("write after space was freed: %v", err)
	}
}
