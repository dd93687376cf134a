//go:build cgo

package main

// #include <stdlib.h>
// #include "weightcast.h"
import "C"

import (
	"unsafe"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/sink"
)

// cBatch is a batch described in C memory for wc_next: the wc_batch, its
// tensors, names and dims. Freed when the batch is released.
type cBatch struct {
	b       C.wc_batch
	tensors unsafe.Pointer
	names   unsafe.Pointer
	dims    unsafe.Pointer
}

func cAlloc(n int) unsafe.Pointer { return C.calloc(C.size_t(max(n, 1)), 1) }

// newCBatch describes b in C memory.
func newCBatch(b *sink.Batch) *cBatch {
	var nameLen, ndims int
	for _, v := range b.Views {
		nameLen += len(v.Entry.Name)
		ndims += len(v.Entry.Shape)
	}
	c := &cBatch{
		tensors: cAlloc(len(b.Views) * int(unsafe.Sizeof(C.wc_tensor{}))),
		names:   cAlloc(nameLen),
		dims:    cAlloc(ndims * 8),
	}
	ts := unsafe.Slice((*C.wc_tensor)(c.tensors), max(len(b.Views), 1))
	names := unsafe.Slice((*byte)(c.names), max(nameLen, 1))
	dims := unsafe.Slice((*C.int64_t)(c.dims), max(ndims, 1))
	var no, do int
	for i, v := range b.Views {
		e := v.Entry
		t := &ts[i]
		t.nbytes = C.uint64_t(e.Size)
		t.device = -1
		if v.Device != nil {
			t.data = C.uint64_t(v.Device.DevicePtr() + uint64(v.Offset))
			if d, ok := gpu.Unfence(v.Device).Device().(*gpu.CUDADevice); ok {
				t.device = C.int32_t(d.Ordinal())
			}
		} else if len(v.Data) > 0 {
			t.data = C.uint64_t(uintptr(unsafe.Pointer(&v.Data[0])))
		}
		t.name, t.name_len = C.int32_t(no), C.int32_t(len(e.Name))
		no += copy(names[no:], e.Name)
		t.dims, t.ndim = C.int64_t(do), C.int32_t(len(e.Shape))
		for _, d := range e.Shape {
			dims[do] = C.int64_t(d)
			do++
		}
		s := e.DType.String()
		for j := 0; j < len(s) && j < len(t.dtype)-1; j++ {
			t.dtype[j] = C.char(s[j])
		}
	}
	c.b.tensors = (*C.wc_tensor)(c.tensors)
	c.b.n = C.int64_t(len(b.Views))
	c.b.names = (*C.char)(c.names)
	c.b.names_len = C.int64_t(nameLen)
	c.b.dims = (*C.int64_t)(c.dims)
	c.b.ndims = C.int64_t(ndims)
	c.b.version = C.uint64_t(b.Version)
	c.b.index = C.int64_t(b.Index)
	c.b.base, c.b.base_len, c.b.device = bucketOf(b, ts)
	return c
}

// bucketOf returns the range of the bucket that the batch's views not
// assembled elsewhere lie in, so that a caller can view it as one array
// and slice the tensors out of it.
func bucketOf(b *sink.Batch, ts []C.wc_tensor) (base, n C.uint64_t, device C.int32_t) {
	var lo, hi uint64
	device = -1
	for i := range b.Views {
		t := &ts[i]
		if b.Assembled[i] || t.nbytes == 0 {
			continue
		}
		start, end := uint64(t.data), uint64(t.data)+uint64(t.nbytes)
		if lo == 0 || start < lo {
			lo = start
		}
		hi = max(hi, end)
		device = t.device
	}
	return C.uint64_t(lo), C.uint64_t(hi - lo), device
}

func (c *cBatch) free() {
	if c == nil {
		return
	}
	C.free(c.tensors)
	C.free(c.names)
	C.free(c.dims)
	c.tensors, c.names, c.dims = nil, nil, nil
}
