//go:build cgo

package main

// #include <stdlib.h>
import "C"

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/weightcast/weightcast/mem"
)

// cHost is a mem.Device of C memory (calloc): host bucket buffers whose
// views may be handed to C, as Go memory may not be.
type cHost struct{}

func (cHost) Name() string   { return "host" }
func (cHost) Kind() mem.Kind { return mem.KindHost }

// Alloc returns n zeroed bytes of C memory.
func (cHost) Alloc(n int) (mem.Buffer, error) {
	p := C.calloc(C.size_t(max(n, 1)), 1)
	if p == nil {
		return nil, fmt.Errorf("allocating %d bytes of host memory: out of memory", n)
	}
	return &cBuffer{p: p, n: n}, nil
}

type cBuffer struct {
	mu sync.Mutex
	p  unsafe.Pointer
	n  int
}

func (b *cBuffer) Len() int           { return b.n }
func (b *cBuffer) DevicePtr() uint64  { return 0 }
func (b *cBuffer) Device() mem.Device { return cHost{} }
func (b *cBuffer) Host() []byte       { return unsafe.Slice((*byte)(b.p), b.n) }
func (b *cBuffer) address() uintptr   { return uintptr(b.p) }
func (b *cBuffer) String() string     { return fmt.Sprintf("C memory, %d bytes", b.n) }

// Free returns the memory; a second call does nothing.
func (b *cBuffer) Free() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.p != nil {
		C.free(b.p)
		b.p = nil
	}
	return nil
}
