//go:build cgo

package main

// #include <stdlib.h>
// #include "weightcast.h"
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/weightcast/weightcast"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/sink"
)

// wc_next_views: a batch described as views of regions (weightcast.h),
// the form the Python package reads. Where wc_next's records carry each
// tensor's address, these carry the memory it lies in (a region, which
// recurs from bucket to bucket: the pool's buckets, the buffers split
// tensors are assembled in, the sender's allocations mapped here) and its
// offset there, all in 8-byte fields: a caller views each region once,
// keeps that view, and slices every tensor out of it, reading a bucket's
// descriptors as one array of integers — no work per tensor beyond the
// slice.

//export wc_next_views
func wc_next_views(handle C.int64_t, stream C.uint64_t, timeoutMS C.int32_t, out *C.wc_views) C.int {
	return status(func() (int, error) {
		h, err := lookup[*receiverHandle](int64(handle))
		if err != nil {
			return 0, err
		}
		if out == nil {
			return 0, fmt.Errorf("%w: wc_next_views: out is NULL", weightcast.ErrConfig)
		}
		code, c, err := h.nextAs(uintptr(stream), int32(timeoutMS), func(b *sink.Batch) cMemory { return newCViews(b) })
		if v, ok := c.(*cViews); ok {
			*out = v.v
		}
		return code, err
	})
}

// cViews is a batch described in C memory for wc_next_views: the
// wc_views, its views, regions, names and dims. Freed when the batch is
// released.
type cViews struct {
	v                           C.wc_views
	views, regions, names, dims unsafe.Pointer
}

// regionKey identifies a region: its range and device.
type regionKey struct {
	base, n uint64
	device  int64
}

// newCViews describes b in C memory.
func newCViews(b *sink.Batch) *cViews {
	var nameLen, ndims int
	for _, v := range b.Views {
		nameLen += len(v.Entry.Name)
		ndims += len(v.Entry.Shape)
	}
	regions, where := viewRegions(b)
	c := &cViews{
		views:   cAlloc(len(b.Views) * int(unsafe.Sizeof(C.wc_view{}))),
		regions: cAlloc(len(regions) * int(unsafe.Sizeof(C.wc_region{}))),
		names:   cAlloc(nameLen),
		dims:    cAlloc(ndims * 8),
	}
	vs := unsafe.Slice((*C.wc_view)(c.views), max(len(b.Views), 1))
	rs := unsafe.Slice((*C.wc_region)(c.regions), max(len(regions), 1))
	names := unsafe.Slice((*byte)(c.names), max(nameLen, 1))
	dims := unsafe.Slice((*C.int64_t)(c.dims), max(ndims, 1))
	for i, r := range regions {
		rs[i] = C.wc_region{base: C.uint64_t(r.base), len: C.uint64_t(r.n), device: C.int64_t(r.device)}
	}
	var no, do int
	for i, v := range b.Views {
		e := v.Entry
		t := &vs[i]
		t.region, t.offset, t.nbytes = C.int64_t(where[i].region), C.uint64_t(where[i].off), C.uint64_t(e.Size)
		t.name, t.name_len = C.int64_t(no), C.int64_t(len(e.Name))
		no += copy(names[no:], e.Name)
		t.dims, t.ndim = C.int64_t(do), C.int64_t(len(e.Shape))
		for _, d := range e.Shape {
			dims[do] = C.int64_t(d)
			do++
		}
		s := e.DType.String()
		for j := 0; j < len(s) && j < len(t.dtype); j++ {
			t.dtype[j] = C.char(s[j])
		}
	}
	c.v = C.wc_views{
		views: (*C.wc_view)(c.views), n: C.int64_t(len(b.Views)),
		regions: (*C.wc_region)(c.regions), nregions: C.int64_t(len(regions)),
		names: (*C.char)(c.names), names_len: C.int64_t(nameLen),
		dims: (*C.int64_t)(c.dims), ndims: C.int64_t(ndims),
		version: C.uint64_t(b.Version), index: C.int64_t(b.Index),
	}
	return c
}

// placed is where one view's bytes lie: a region's index (-1: no bytes)
// and the offset there.
type placed struct {
	region int
	off    uint64
}

// viewRegions returns the regions b's views lie in and where each view
// lies. A device view's region is its whole buffer (the bucket, an
// assembly buffer, a mapped allocation of the sender's); host views of
// the bucket share the range from the first byte of any of them to the
// last (the bucket's buffer is not in the batch), and each assembled host
// view is a region of its own.
func viewRegions(b *sink.Batch) ([]regionKey, []placed) {
	where := make([]placed, len(b.Views))
	var regions []regionKey
	index := map[regionKey]int{}
	add := func(k regionKey) int {
		i, ok := index[k]
		if !ok {
			i = len(regions)
			index[k] = i
			regions = append(regions, k)
		}
		return i
	}
	var lo, hi uint64 // the host bucket's views
	for i, v := range b.Views {
		where[i].region = -1
		switch {
		case v.Device != nil: // of no bytes too: the region says the device
			k := regionKey{base: v.Device.DevicePtr(), n: uint64(v.Device.Len()), device: -1}
			if d, ok := gpu.Unfence(v.Device).Device().(*gpu.CUDADevice); ok {
				k.device = int64(d.Ordinal())
			}
			where[i] = placed{add(k), uint64(v.Offset)}
		case v.Entry.Size == 0:
		case b.Assembled[i]:
			where[i] = placed{add(regionKey{base: hostAddr(v.Data), n: uint64(len(v.Data)), device: -1}), 0}
		default:
			a := hostAddr(v.Data)
			if lo == 0 || a < lo {
				lo = a
			}
			hi = max(hi, a+uint64(len(v.Data)))
		}
	}
	if hi > 0 {
		bucket := add(regionKey{base: lo, n: hi - lo, device: -1})
		for i, v := range b.Views {
			if v.Device == nil && v.Entry.Size > 0 && !b.Assembled[i] {
				where[i] = placed{bucket, hostAddr(v.Data) - lo}
			}
		}
	}
	return regions, where
}

func hostAddr(data []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&data[0]))) }

func (c *cViews) free() {
	if c == nil {
		return
	}
	C.free(c.views)
	C.free(c.regions)
	C.free(c.names)
	C.free(c.dims)
	c.views, c.regions, c.names, c.dims = nil, nil, nil, nil
}
