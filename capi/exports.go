//go:build cgo

package main

// #include <stdlib.h>
// #include "weightcast.h"
// #include "shim.h"
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/weightcast/weightcast"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/wire"
)

// The exported functions: each converts its C arguments, runs its Go body
// through call (panics recovered, errors to the thread's last error), and
// returns the status. See weightcast.h.

func setErr(text, field string) {
	cs, cf := C.CString(text), C.CString(field)
	defer C.free(unsafe.Pointer(cs))
	defer C.free(unsafe.Pointer(cf))
	C.wc_set_error(cs, cf)
}

func status(body func() (int, error)) C.int { return C.int(call(setErr, body)) }

//export wc_open_sender
func wc_open_sender(config *C.char, handle *C.int64_t) C.int {
	return status(func() (int, error) {
		if handle == nil {
			return 0, fmt.Errorf("%w: wc_open_sender: handle is NULL", weightcast.ErrConfig)
		}
		h, err := openSender(C.GoString(config))
		*handle = C.int64_t(h)
		return wcOK, err
	})
}

//export wc_open_receiver
func wc_open_receiver(config *C.char, handle *C.int64_t) C.int {
	return status(func() (int, error) {
		if handle == nil {
			return 0, fmt.Errorf("%w: wc_open_receiver: handle is NULL", weightcast.ErrConfig)
		}
		h, err := openReceiver(C.GoString(config))
		*handle = C.int64_t(h)
		return wcOK, err
	})
}

//export wc_interrupt
func wc_interrupt(reason *C.char) C.int {
	return status(func() (int, error) {
		return opens.interrupt(C.GoString(reason)), nil
	})
}

//export wc_send
func wc_send(handle C.int64_t, version C.uint64_t, tensors *C.wc_tensor, n C.int64_t, names *C.char, namesLen C.int64_t, dims *C.int64_t, ndims C.int64_t) C.int {
	return status(func() (int, error) {
		h, err := lookup[*senderHandle](int64(handle))
		if err != nil {
			return 0, err
		}
		refs, err := decodeRefs(tensors, n, names, namesLen, dims, ndims)
		if err != nil {
			h.s.Abort(err) // the receivers fail with the cause
			return 0, err
		}
		return wcOK, h.send(uint64(version), refs)
	})
}

//export wc_wait
func wc_wait(handle C.int64_t, timeoutMS C.int32_t) C.int {
	return status(func() (int, error) {
		if r, err := lookup[*receiverHandle](int64(handle)); err == nil {
			return r.waitInto(int32(timeoutMS))
		}
		h, err := lookup[*senderHandle](int64(handle))
		if err != nil {
			return 0, err
		}
		return h.wait(int32(timeoutMS))
	})
}

//export wc_receive_into
func wc_receive_into(handle C.int64_t, tensors *C.wc_tensor, n C.int64_t, names *C.char, namesLen C.int64_t, dims *C.int64_t, ndims C.int64_t) C.int {
	return status(func() (int, error) {
		h, err := lookup[*receiverHandle](int64(handle))
		if err != nil {
			return 0, err
		}
		refs, err := decodeRefs(tensors, n, names, namesLen, dims, ndims)
		if err != nil {
			h.r.Abort(err) // the others fail with the cause
			return 0, err
		}
		return wcOK, h.receiveInto(refs)
	})
}

//export wc_receive
func wc_receive(handle C.int64_t) C.int {
	return status(func() (int, error) {
		h, err := lookup[*receiverHandle](int64(handle))
		if err != nil {
			return 0, err
		}
		return wcOK, h.receive()
	})
}

//export wc_next
func wc_next(handle C.int64_t, stream C.uint64_t, timeoutMS C.int32_t, out *C.wc_batch) C.int {
	return status(func() (int, error) {
		h, err := lookup[*receiverHandle](int64(handle))
		if err != nil {
			return 0, err
		}
		if out == nil {
			return 0, fmt.Errorf("%w: wc_next: out is NULL", weightcast.ErrConfig)
		}
		code, b, err := h.next(uintptr(stream), int32(timeoutMS))
		if b != nil {
			*out = b.b
		}
		return code, err
	})
}

//export wc_abort
func wc_abort(handle C.int64_t, reason *C.char) C.int {
	return status(func() (int, error) {
		text := "aborted by the caller"
		if reason != nil {
			text = C.GoString(reason)
		}
		return wcOK, abort(int64(handle), text)
	})
}

//export wc_committed
func wc_committed(handle C.int64_t, version *C.uint64_t) C.int {
	return status(func() (int, error) {
		var v uint64
		if s, err := lookup[*senderHandle](int64(handle)); err == nil {
			v = s.s.Committed()
		} else if r, rerr := lookup[*receiverHandle](int64(handle)); rerr == nil {
			v = r.r.Committed()
		} else {
			return 0, err
		}
		if version != nil {
			*version = C.uint64_t(v)
		}
		return wcOK, nil
	})
}

//export wc_state
func wc_state(handle C.int64_t, state *C.int32_t) C.int {
	return status(func() (int, error) {
		h, err := lookup[*receiverHandle](int64(handle))
		if err != nil {
			return 0, err
		}
		if state != nil {
			*state = 0
			if h.r.State() == stages.StatePartial {
				*state = 1
			}
		}
		return wcOK, nil
	})
}

//export wc_info
func wc_info(handle C.int64_t, buf *C.char, capacity C.int64_t) C.int64_t {
	var text string
	code := call(setErr, func() (int, error) {
		var err error
		text, err = info(int64(handle))
		return wcOK, err
	})
	if code < 0 {
		return C.int64_t(code)
	}
	copyOut(text, buf, capacity)
	return C.int64_t(len(text))
}

//export wc_close
func wc_close(handle C.int64_t) C.int {
	return status(func() (int, error) { return wcOK, closeHandle(int64(handle)) })
}

//export wc_last_error
func wc_last_error(buf *C.char, capacity C.int64_t) C.int64_t {
	return C.wc_copy_error(buf, capacity, 0)
}

//export wc_last_error_field
func wc_last_error_field(buf *C.char, capacity C.int64_t) C.int64_t {
	return C.wc_copy_error(buf, capacity, 1)
}

// copyOut copies text into buf, NUL-terminated, truncated to capacity.
func copyOut(text string, buf *C.char, capacity C.int64_t) {
	if buf == nil || capacity <= 0 {
		return
	}
	dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(capacity))
	n := copy(dst[:len(dst)-1], text)
	dst[n] = 0
}

// decodeRefs reads the descriptors of a round; nothing of C's is kept but
// the tensors' own memory, which stays the caller's until the round ends.
func decodeRefs(tensors *C.wc_tensor, n C.int64_t, names *C.char, namesLen C.int64_t, dims *C.int64_t, ndims C.int64_t) ([]weightcast.Ref, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: wc_send: %s", weightcast.ErrConfig, fmt.Sprintf(format, args...))
	}
	if n < 0 || namesLen < 0 || ndims < 0 || n > 0 && tensors == nil || namesLen > 0 && names == nil || ndims > 0 && dims == nil {
		return nil, bad("arrays and lengths disagree (n %d, names_len %d, ndims %d)", n, namesLen, ndims)
	}
	if n > wire.MaxTensors {
		return nil, bad("%d tensors is more than the %d a round may carry", n, wire.MaxTensors)
	}
	var ts []C.wc_tensor
	var nb []byte
	var ds []C.int64_t
	if n > 0 {
		ts = unsafe.Slice(tensors, int(n))
	}
	if namesLen > 0 {
		nb = unsafe.Slice((*byte)(unsafe.Pointer(names)), int(namesLen))
	}
	if ndims > 0 {
		ds = unsafe.Slice(dims, int(ndims))
	}
	refs := make([]weightcast.Ref, len(ts))
	for i := range ts {
		t := &ts[i]
		if t.name < 0 || t.name_len < 0 || int64(t.name)+int64(t.name_len) > int64(len(nb)) {
			return nil, bad("tensor %d: its name [%d, +%d) lies outside the %d bytes of names", i, t.name, t.name_len, len(nb))
		}
		if t.dims < 0 || t.ndim < 0 || t.ndim > wire.MaxRank || int64(t.dims)+int64(t.ndim) > int64(len(ds)) {
			return nil, bad("tensor %d: its %d dims at %d lie outside the %d dims given", i, t.ndim, t.dims, len(ds))
		}
		r := &refs[i]
		r.Name = string(nb[t.name : t.name+t.name_len])
		r.DType = C.GoString(&t.dtype[0])
		r.Shape = make([]int64, t.ndim)
		for j := range r.Shape {
			r.Shape[j] = int64(ds[int(t.dims)+j])
		}
		r.Strided = t.flags&1 != 0
		switch {
		case t.device >= 0:
			r.Addr, r.Device, r.Stream, r.Bytes = uint64(t.data), int(t.device), uintptr(t.stream), int64(t.nbytes)
		case t.nbytes == 0:
			r.Data = []byte{}
		case t.data == 0:
			return nil, bad("tensor %q: %d bytes at address 0", r.Name, t.nbytes)
		default:
			r.Data = hostBytes(t.data, t.nbytes)
		}
	}
	return refs, nil
}

// hostBytes views n bytes of host memory at addr, an address C handed in.
func hostBytes(addr, n C.uint64_t) []byte {
	return unsafe.Slice((*byte)(C.wc_ptr(addr)), int(n))
}
