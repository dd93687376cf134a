// Package faultfs is a file system for tests that real disks' failures
// cannot be produced on demand for: Disk, the operating system's files
// behind a capacity, which fails writes with ENOSPC once it is full, as a
// full disk does, and frees space when files are removed.
package faultfs

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/weightcast/weightcast/safetensors"
)

// Disk is a safetensors.FS over the operating system's files that holds at
// most Capacity bytes of file data written through it. A write past the
// capacity writes what fits and fails with ENOSPC (a *fs.PathError, as
// the operating system's). Each file's data counts as the bytes written to
// it (truncation to a larger size, as on Linux, takes no space); removing
// a file, a directory or renaming a file over another frees its bytes.
// Files not written through the Disk take no space of it. Safe for
// concurrent use.
type Disk struct {
	mu       sync.Mutex
	capacity int64
	used     map[string]int64 // bytes of each file written through the Disk
	total    int64
}

// New returns an empty Disk of capacity bytes.
func New(capacity int64) *Disk { return &Disk{capacity: capacity, used: map[string]int64{}} }

// Used returns the bytes the Disk's files take.
func (d *Disk) Used() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.total
}

// SetCapacity changes the capacity (files already written stay).
func (d *Disk) SetCapacity(c int64) {
	d.mu.Lock()
	d.capacity = c
	d.mu.Unlock()
}

func key(name string) string {
	abs, err := filepath.Abs(name)
	if err != nil {
		return filepath.Clean(name)
	}
	return abs
}

// take claims up to n bytes for the file at k and returns how many it got.
func (d *Disk) take(k string, n int) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	got := int64(n)
	if room := d.capacity - d.total; got > room {
		got = max(room, 0)
	}
	d.used[k] += got
	d.total += got
	return int(got)
}

// give frees what take claimed but was not written.
func (d *Disk) give(k string, n int) {
	d.mu.Lock()
	d.used[k] -= int64(n)
	d.total -= int64(n)
	d.mu.Unlock()
}

// free forgets every file at k or under it.
func (d *Disk) free(k string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for p, n := range d.used {
		if p == k || strings.HasPrefix(p, k+string(filepath.Separator)) {
			d.total -= n
			delete(d.used, p)
		}
	}
}

// CreateTemp creates a file as os.CreateTemp does.
func (d *Disk) CreateTemp(dir, pattern string) (safetensors.FSFile, error) {
	f, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return nil, err
	}
	return &file{File: f, d: d, key: key(f.Name())}, nil
}

// Open opens a file for reading as os.Open does.
func (d *Disk) Open(name string) (safetensors.FSFile, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	return &file{File: f, d: d, key: key(name)}, nil
}

// MkdirAll is os.MkdirAll.
func (d *Disk) MkdirAll(path string, perm fs.FileMode) error { return os.MkdirAll(path, perm) }

// MkdirTemp is os.MkdirTemp.
func (d *Disk) MkdirTemp(dir, pattern string) (string, error) { return os.MkdirTemp(dir, pattern) }

// Rename is os.Rename; the bytes of what newpath held are freed.
func (d *Disk) Rename(oldpath, newpath string) error {
	if err := os.Rename(oldpath, newpath); err != nil {
		return err
	}
	ok, nk := key(oldpath), key(newpath)
	d.free(nk)
	d.mu.Lock()
	defer d.mu.Unlock()
	for p, n := range d.used {
		if p == ok || strings.HasPrefix(p, ok+string(filepath.Separator)) {
			delete(d.used, p)
			d.used[nk+strings.TrimPrefix(p, ok)] = n
		}
	}
	return nil
}

// Remove is os.Remove; the file's bytes are freed.
func (d *Disk) Remove(name string) error {
	if err := os.Remove(name); err != nil {
		return err
	}
	d.free(key(name))
	return nil
}

// RemoveAll is os.RemoveAll; the bytes of everything under path are freed.
func (d *Disk) RemoveAll(path string) error {
	err := os.RemoveAll(path)
	d.free(key(path))
	return err
}

// file is an open file of a Disk.
type file struct {
	*os.File
	d   *Disk
	key string
}

func (f *file) write(p []byte, do func([]byte) (int, error)) (int, error) {
	got := f.d.take(f.key, len(p))
	n, err := do(p[:got])
	f.d.give(f.key, got-n)
	if err == nil && got < len(p) {
		err = &fs.PathError{Op: "write", Path: f.Name(), Err: syscall.ENOSPC}
	}
	return n, err
}

func (f *file) Write(p []byte) (int, error) { return f.write(p, f.File.Write) }

func (f *file) WriteAt(p []byte, off int64) (int, error) {
	return f.write(p, func(q []byte) (int, error) { return f.File.WriteAt(q, off) })
}
