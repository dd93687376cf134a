package gpu

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// raisePTX is the kernel of RaiseValue64, hand-written PTX with its CUDA
// C in a comment at the top of the file.
//
//go:embed raise.ptx
var raisePTX string

// raiseCheckWait bounds the self-test that runs when the kernel is loaded.
const raiseCheckWait = 10 * time.Second

// ErrNoRaiseKernel is matched (errors.Is) by the error RaiseValue64
// returns when its kernel cannot be used: the driver lacks a function, the
// PTX did not compile for this GPU or the kernel failed its self-test. The
// error says which.
var ErrNoRaiseKernel = errors.New("gpu: raise kernel unavailable")

// StreamMemOps64 reports whether the device runs 64-bit stream memory
// operations (WaitValue64, WriteValue64). It is asked once per device.
func (d *CUDADevice) StreamMemOps64() bool {
	k := &d.kernels
	k.memOps64Once.Do(func() {
		v, r := cuDeviceGetAttribute(attrStreamMemOps64, d.dev)
		k.memOps64 = r == 0 && v == 1
	})
	return k.memOps64
}

// RaiseValue64 queues on s an atomic maximum of the 64-bit word at device
// address addr (8-byte aligned) with v, once the work queued on s before
// it has finished: the word becomes the larger of the two. Unlike a plain
// write (WriteValue64), a raise never lowers the word, whenever it lands,
// so that any process that maps the word may raise it at any time without
// undoing a later raise. It is a one-thread kernel of the stream's
// context; where the kernel is unavailable the error matches
// ErrNoRaiseKernel. The maximum is unsigned while WaitValue64 compares
// cyclically: keep a word's values within 2^63 of each other.
func (s *Stream) RaiseValue64(addr, v uint64) error {
	if err := s.check(); err != nil {
		return err
	}
	k, err := s.d.raiseKernel()
	if err != nil {
		return err
	}
	return s.raise(k, addr, v)
}

func (s *Stream) raise(k *loadedKernel, addr, v uint64) error {
	if addr%8 != 0 {
		return fmt.Errorf("gpu: raising the word at %#x: a 64-bit word must be 8-byte aligned", addr)
	}
	if err := s.launch(k, 1, 1, addr, v); err != nil {
		return fmt.Errorf("gpu: raising the word at %#x: %w", addr, err)
	}
	return nil
}

// raiseKernel loads the raise kernel into d's context once, and checks it
// before anything else may use it.
func (d *CUDADevice) raiseKernel() (*loadedKernel, error) {
	return d.kernels.raise.get(func() (*loadedKernel, error) {
		k, err := d.loadPTX("raise.ptx", raisePTX, "wc_raise", ErrNoRaiseKernel)
		if err != nil {
			return nil, err
		}
		return d.selfTested(k, d.checkRaise(k), ErrNoRaiseKernel)
	})
}

// checkRaise raises a word of 5 to 3, 9 and 7, on a stream of its own,
// and checks that it ends at 9: raised, never lowered.
func (d *CUDADevice) checkRaise(k *loadedKernel) (err error) {
	ctx, cancel := context.WithTimeout(context.Background(), raiseCheckWait)
	defer cancel()
	s, err := d.NewStream()
	if err != nil {
		return err
	}
	buf, err := d.Alloc(8)
	if err != nil {
		s.Close()
		return err
	}
	defer func() {
		// Free nothing that a launch may still use.
		if serr := s.Sync(ctx); serr != nil {
			err = errors.Join(err, serr)
			return
		}
		err = errors.Join(err, buf.Free(), s.Close())
	}()
	word := buf.DevicePtr()
	if err := s.CopyHtoD(buf, 0, binary.LittleEndian.AppendUint64(nil, 5)); err != nil {
		return err
	}
	for _, v := range []uint64{3, 9, 7} {
		if err := s.raise(k, word, v); err != nil {
			return err
		}
	}
	got := make([]byte, 8)
	if err := s.CopyDtoH(got, buf, 0); err != nil {
		return err
	}
	if err := s.Sync(ctx); err != nil {
		return err
	}
	if v := binary.LittleEndian.Uint64(got); v != 9 {
		return fmt.Errorf("a word of 5 raised to 3, 9 and 7 is %d, not 9", v)
	}
	return nil
}
