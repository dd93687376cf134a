//go:build cgo

package main

// #include <stdint.h>
// #include "weightcast.h"
import "C"

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"unsafe"

	"github.com/weightcast/weightcast"
	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/route"
	"github.com/weightcast/weightcast/stages"
)

// A routed group's rounds (Options.Senders above 0): a sender hands its
// shards (wc_send_shards), a receiver receives into C memory
// (wc_receive_shards) and reads what it holds (wc_shards). See
// weightcast.h.

// shardJSON is one shard as wc_send_shards and wc_shards spell it.
type shardJSON struct {
	Name   string  `json:"name"`
	DType  string  `json:"dtype"`
	Shape  []int64 `json:"shape"`
	Offset []int64 `json:"offset"`
	Size   []int64 `json:"size"`
	Data   uint64  `json:"data,omitempty"` // wc_shards: the address of its bytes
	Bytes  int64   `json:"nbytes,omitempty"`
	// Device is the CUDA ordinal of device memory, or -1 (absent: 0 in
	// wc_send_shards means cuda:0 only when given) for host memory.
	Device *int `json:"device,omitempty"`
}

// maxShardsJSON bounds wc_send_shards' layout: 64 MiB.
const maxShardsJSON = 64 << 20

// decodeShards reads wc_send_shards' arguments: the layout as JSON and
// the address of each shard's host bytes, which stay the caller's until
// the round ends.
func decodeShards(layout string, data *C.uint64_t, n C.int64_t, dev *gpu.CUDADevice) ([]route.Local, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: wc_send_shards: %s", weightcast.ErrConfig, fmt.Sprintf(format, args...))
	}
	if len(layout) > maxShardsJSON {
		return nil, bad("a layout of %d bytes exceeds the %d-byte limit", len(layout), maxShardsJSON)
	}
	var js []shardJSON
	dec := json.NewDecoder(bytes.NewReader([]byte(layout)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&js); err != nil {
		return nil, bad("the layout is not a JSON array of shards {name, dtype, shape, offset, size}: %v", err)
	}
	if int64(len(js)) != int64(n) || n > 0 && data == nil {
		return nil, bad("%d shards in the layout, %d addresses", len(js), n)
	}
	addrs := unsafe.Slice((*uint64)(unsafe.Pointer(data)), int(n))
	out := make([]route.Local, len(js))
	for i, s := range js {
		dt, err := dtype.Parse(s.DType)
		if err != nil {
			return nil, bad("shard %s: %v", s.Name, err)
		}
		l := route.Local{Shard: route.Shard{Name: s.Name, DType: dt, Shape: s.Shape, Offset: s.Offset, Size: s.Size}}
		nb := l.Bytes()
		if nb > 0 && addrs[i] == 0 {
			return nil, bad("shard %s: no address for its %d bytes", s.Name, nb)
		}
		switch {
		case s.Device != nil && *s.Device >= 0:
			if dev == nil || dev.Ordinal() != *s.Device {
				return nil, bad("shard %s is on cuda:%d, but this rank's buckets are %s: hand the shards on the rank's GPU, or host tensors", s.Name, *s.Device, where(dev))
			}
			if l.Buffer, err = dev.View(addrs[i], int(nb)); err != nil {
				return nil, bad("shard %s: %v", s.Name, err)
			}
		case dev != nil:
			return nil, bad("shard %s is in host memory, but this rank's buckets are on %s: hand CUDA tensors of that GPU", s.Name, dev.Name())
		case nb > 0:
			l.Data = hostBytes(C.uint64_t(addrs[i]), C.uint64_t(nb))
		default:
			l.Data = []byte{}
		}
		out[i] = l
	}
	return out, nil
}

// where says where a rank's buckets live.
func where(dev *gpu.CUDADevice) string {
	if dev == nil {
		return "in host memory"
	}
	return "on " + dev.Name()
}

// roundStats is a routed round's stats in the runner's terms.
func roundStats(st route.Stats) stages.RoundStats {
	return stages.RoundStats{Version: st.Version, Bytes: st.BytesSent + st.BytesReceived, Buckets: st.Buckets, Duration: st.Duration}
}

//export wc_send_shards
func wc_send_shards(handle C.int64_t, version C.uint64_t, layout *C.char, data *C.uint64_t, n C.int64_t) C.int {
	return status(func() (int, error) {
		h, err := lookup[*senderHandle](int64(handle))
		if err != nil {
			return 0, err
		}
		dev, _ := h.s.Device().(*gpu.CUDADevice)
		shards, err := decodeShards(C.GoString(layout), data, n, dev)
		if err != nil {
			h.s.Abort(err) // the others fail with the cause
			return 0, err
		}
		return wcOK, h.start("sending another", false, func() (stages.RoundStats, error) {
			st, err := h.s.SendShards(context.Background(), shards, uint64(version))
			h.setRouted(st)
			return roundStats(st), err
		})
	})
}

//export wc_receive_shards
func wc_receive_shards(handle C.int64_t) C.int {
	return status(func() (int, error) {
		h, err := lookup[*receiverHandle](int64(handle))
		if err != nil {
			return 0, err
		}
		h.mu.Lock()
		if h.shards == nil {
			h.shards = &route.Shards{Device: cHost{}}
			if h.dev != nil {
				h.shards.Device = h.dev // the shards stay on the rank's GPU
			}
		}
		dest := h.shards
		h.mu.Unlock()
		return wcOK, h.start("receiving another", true, func() (stages.RoundStats, error) {
			st, err := h.r.ReceiveShards(context.Background(), dest)
			h.setRouted(st)
			return roundStats(st), err
		})
	})
}

//export wc_shards
func wc_shards(handle C.int64_t, buf *C.char, capacity C.int64_t) C.int64_t {
	var text string
	code := call(setErr, func() (int, error) {
		h, err := lookup[*receiverHandle](int64(handle))
		if err != nil {
			return 0, err
		}
		text, err = h.shardsJSON()
		return wcOK, err
	})
	if code < 0 {
		return C.int64_t(code)
	}
	copyOut(text, buf, capacity)
	return C.int64_t(len(text))
}

// shardsJSON lists the committed version's shards with the addresses of
// their bytes (C memory).
func (h *receiverHandle) shardsJSON() (string, error) {
	h.mu.Lock()
	sh := h.shards
	h.mu.Unlock()
	out := []shardJSON{}
	if sh != nil {
		for _, r := range sh.All() {
			nb := r.Slice.Elements() * int64(r.Tensor.DType.Size())
			ord := -1
			s := shardJSON{Name: r.Tensor.Name, DType: r.Tensor.DType.String(), Shape: r.Tensor.Shape, Offset: r.Slice.Offset, Size: r.Slice.Size, Bytes: nb, Device: &ord}
			switch b := r.Buffer.(type) {
			case *cBuffer:
				s.Data = uint64(b.address())
			default:
				s.Data, _ = gpu.Address(b)
				ord = h.dev.Ordinal()
			}
			out = append(out, s)
		}
	}
	b, err := json.Marshal(out)
	return string(b), err
}

// routedStats is what info adds for a routed round.
type routedStats struct {
	sent, received int64
	plan           string
	waited         float64
	ok             bool
}

func (r *roundRunner) setRouted(st route.Stats) {
	r.mu.Lock()
	r.routed = routedStats{sent: st.BytesSent, received: st.BytesReceived, plan: st.Plan, waited: st.Waited.Seconds(), ok: st.Plan != ""}
	r.mu.Unlock()
}
