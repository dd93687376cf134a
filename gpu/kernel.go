package gpu

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/weightcast/weightcast/mem"
)

// deviceKernels holds, for one device, the package's kernels (each loaded
// and self-tested once, at first use), the spare descriptor memory of
// closed Gathers and Casters, and the multiprocessor count.
type deviceKernels struct {
	gather, checksum, cast, gatherSum, gatherLayout, quant onceKernel
	mac                                                    onceMAC
	gatherSpare, castSpare, sumSpare, layoutSpare          descSpares
	macLayoutSpare                                         descSpares
	quantInt                                               error // why quant is quant_int.ptx (nil: quant.ptx)

	smOnce sync.Once
	sms    int
	smErr  error

	mpsOnce sync.Once
	mps     bool

	raise        onceKernel
	poly         onceKernel
	polyLayout   onceKernel
	memOps64Once sync.Once
	memOps64     bool
}

// onceKernel is a kernel loaded at first use: the kernel, or why it is
// unavailable.
type onceKernel struct {
	once sync.Once
	k    *loadedKernel // nil where unavailable, and once unloaded
	err  error
}

// get loads the kernel with load the first time it is called, and returns
// what that gave.
func (o *onceKernel) get(load func() (*loadedKernel, error)) (*loadedKernel, error) {
	o.once.Do(func() { o.k, o.err = load() })
	return o.k, o.err
}

// unload unloads the kernel's module, if loaded, from d's context; name
// says which kernel in the error.
func (o *onceKernel) unload(d *CUDADevice, name string) error {
	k := o.k
	if k == nil {
		return nil
	}
	o.k = nil
	if err := k.unload(d); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// loadedKernel is one kernel of a PTX module loaded into a device's
// context.
type loadedKernel struct {
	mod cuModule
	fn  cuFunction
}

// unload unloads k's module from d's context.
func (k *loadedKernel) unload(d *CUDADevice) error {
	if r := cuModuleUnload(d.ctx, k.mod); r != 0 {
		return d.err("cuModuleUnload", "", r)
	}
	return nil
}

// Some kernels' PTX is generated (ptx_gen_test.go); this rewrites it.
//go:generate go test -run ^TestPTXGenerated$ -write-ptx

// loadPTX loads the PTX text src (file names it in errors) into d's
// context and looks up its kernel entry. Errors wrap unavailable.
func (d *CUDADevice) loadPTX(file, src, entry string, unavailable error) (*loadedKernel, error) {
	if err := d.checkOpen(); err != nil {
		return nil, fmt.Errorf("%w: %w", unavailable, err)
	}
	mod, log, r := moduleLoad(d.ctx, src)
	if r != 0 {
		err := fmt.Errorf("%w on %s: %w", unavailable, d.Name(), d.err("cuModuleLoadDataEx", file, r))
		if msg := strings.TrimSpace(log); msg != "" {
			err = fmt.Errorf("%w; the PTX compiler said: %s", err, msg)
		}
		return nil, err
	}
	fn, r := cuModuleGetFunction(d.ctx, mod, entry)
	if r != 0 {
		cuModuleUnload(d.ctx, mod)
		return nil, fmt.Errorf("%w on %s: %w", unavailable, d.Name(), d.err("cuModuleGetFunction", entry, r))
	}
	return &loadedKernel{mod: mod, fn: fn}, nil
}

// selfTested returns k when its self-test passed; otherwise it unloads k
// (unless a launch may still be running: a wait that gave up keeps the
// module loaded) and returns the test's error, wrapping unavailable.
func (d *CUDADevice) selfTested(k *loadedKernel, err error, unavailable error) (*loadedKernel, error) {
	if err == nil {
		return k, nil
	}
	var werr *WaitError
	if !errors.As(err, &werr) {
		cuModuleUnload(d.ctx, k.mod)
	}
	return nil, fmt.Errorf("%w on %s: self-test failed: %w", unavailable, d.Name(), err)
}

// selfTest runs check, a kernel's self-test, bounded by wait, on a new
// stream and new device buffers of the given sizes, with the Gather,
// Caster or Checksummer that open makes on the stream. Then it waits for
// the stream and, only once that has succeeded (so that no launch may
// still use them), closes what open made, frees the buffers and closes
// the stream.
func selfTest[K interface{ Close(context.Context) error }](d *CUDADevice, wait time.Duration, sizes []int,
	open func(s *Stream) K, check func(ctx context.Context, s *Stream, k K, bufs []mem.Buffer) error) (err error) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	s, err := d.NewStream()
	if err != nil {
		return err
	}
	var bufs []mem.Buffer
	for _, n := range sizes {
		b, err := d.Alloc(n)
		if err != nil {
			for _, b := range bufs {
				b.Free()
			}
			s.Close()
			return err
		}
		bufs = append(bufs, b)
	}
	k := open(s)
	defer func() {
		// Free nothing that a launch may still use.
		if serr := s.Sync(ctx); serr != nil {
			err = errors.Join(err, serr)
			return
		}
		errs := []error{err, k.Close(ctx)}
		for _, b := range bufs {
			errs = append(errs, b.Free())
		}
		err = errors.Join(append(errs, s.Close())...)
	}()
	return check(ctx, s, k, bufs)
}

// deviceBytes checks that the first n bytes of buf are live device memory
// of d that a kernel may read, and returns their address; what names the
// work in errors ("checksum", "MAC"), host says what to do with host
// memory instead.
func deviceBytes(d *CUDADevice, buf mem.Buffer, n int64, what, host string) (uint64, error) {
	if db, ok := Unfence(buf).(*deviceBuffer); ok && db.freed {
		return 0, fmt.Errorf("gpu: %s on cuda:%d: %w", what, d.ordinal, mem.ErrFreed)
	}
	p := buf.DevicePtr()
	if p == 0 {
		return 0, fmt.Errorf("gpu: %s on cuda:%d: the %s buffer is not device memory; %s", what, d.ordinal, buf.Device().Name(), host)
	}
	if dev, ok := buf.Device().(*CUDADevice); !ok || dev != d {
		return 0, fmt.Errorf("gpu: %s on cuda:%d: the buffer is memory of %s; queue it on a stream of that device", what, d.ordinal, buf.Device().Name())
	}
	if n < 0 || n > int64(buf.Len()) {
		return 0, fmt.Errorf("gpu: %s on cuda:%d: %d bytes of a %d-byte buffer", what, d.ordinal, n, buf.Len())
	}
	return p, nil
}

// Multiprocessors returns the device's number of streaming multiprocessors
// (132 on an H200), which sizes kernel grids.
func (d *CUDADevice) Multiprocessors() (int, error) {
	k := &d.kernels
	k.smOnce.Do(func() {
		v, r := cuDeviceGetAttribute(attrMultiprocessorCount, d.dev)
		if r != 0 {
			k.smErr = d.err("cuDeviceGetAttribute", "multiprocessor count", r)
			return
		}
		k.sms = v
	})
	return k.sms, k.smErr
}

// MPS reports whether this process's context on the device is shared
// through the CUDA Multi-Process Service (an operator started
// nvidia-cuda-mps-control for the GPU): then kernels of the processes that
// share the GPU run at the same time, where without it they take turns
// (time slices) while copy-engine copies still overlap. A driver too old
// to say (before CUDA 12.3) reports false. It is asked once per device.
func (d *CUDADevice) MPS() bool {
	k := &d.kernels
	k.mpsOnce.Do(func() {
		v, r := cuDeviceGetAttribute(attrMPSEnabled, d.dev)
		k.mps = r == 0 && v == 1
	})
	return k.mps
}

// unloadKernels frees the spare descriptor memory and unloads the gather,
// checksum, cast, fused gather and checksum, layout, quantize, MAC, raise and Poly1305 modules, if loaded,
// before Close releases the context.
func (d *CUDADevice) unloadKernels() error {
	k := &d.kernels
	return errors.Join(k.gatherSpare.free(), k.gather.unload(d, "gather"),
		k.castSpare.free(), k.checksum.unload(d, "checksum"), k.cast.unload(d, "cast"),
		k.sumSpare.free(), k.gatherSum.unload(d, "fused gather and checksum"),
		k.layoutSpare.free(), k.gatherLayout.unload(d, "gather and layout checksum"),
		k.quant.unload(d, "quantize"), k.macLayoutSpare.free(), k.mac.unload(d),
		k.raise.unload(d, "raise"), k.poly.unload(d, "Poly1305"),
		k.polyLayout.unload(d, "Poly1305 layout"))
}

// launch queues kernel k on s over a grid of blocks×threads with the
// kernel's parameters args, in order (see cuLaunchKernel). Callers say
// which launch failed around the error, so that a launch allocates
// nothing.
func (s *Stream) launch(k *loadedKernel, blocks, threads int, args ...uint64) error {
	if blocks <= 0 || blocks >= 1<<31 || len(args) > maxKernelArgs {
		return fmt.Errorf("gpu: a launch of %d blocks with %d parameters", blocks, len(args))
	}
	if r := cuLaunchKernel(s.d.ctx, k.fn, uint32(blocks), uint32(threads), s.s, args...); r != 0 {
		return s.d.err("cuLaunchKernel", "", r)
	}
	return nil
}

// newEvent creates an event without recording it; recordOn records it.
func (d *CUDADevice) newEvent() (*Event, error) {
	e, r := cuEventCreate(d.ctx)
	if r != 0 {
		return nil, d.err("cuEventCreate", "", r)
	}
	return &Event{d: d, e: e}, nil
}

// recordOn records e again, at the current end of s (an event may be
// recorded many times; a wait sees the latest recording).
func (e *Event) recordOn(s *Stream) error {
	if e.closed {
		return fmt.Errorf("gpu: event of cuda:%d used after Close", e.d.ordinal)
	}
	if r := cuEventRecord(s.d.ctx, e.e, s.s); r != 0 {
		return s.d.err("cuEventRecord", "", r)
	}
	return nil
}
