package stages

// The conversions deviceFill queues on the GPU as it fills device buckets:
// casts (gpu.Caster) and FP8 block quantization (gpu.Quantizer), with the
// device scratch memory they need.

import (
	"errors"
	"fmt"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
)

// quantIn queues bytes [chunk, chunk+n) of t, one of the two tensors of a
// device weight that Quantize picked, into the bucket at dst, on the copy
// stream, so that the bucket's ready event, checksum and MAC come after:
// the codes straight from the weight by the quantize kernel, which also
// writes the scales of the blocks the chunk touches into f.qscales; the
// scales copied from there (after a launch that computes them all, in
// case the codes did not go through f). Both are queued at once, not
// collected: the scratch is then reused in stream order by the next
// weight.
func (f *deviceFill) quantIn(t *Tensor, bucket mem.Buffer, dst uint64, n, chunk int64) error {
	q := t.quant
	if n == 0 {
		return nil
	}
	if !sameGPU(q.w.Device, bucket) {
		return fmt.Errorf("pack: quantize %q on the GPU: the weight is memory of %s and the buckets are on %s; hand it in on the buckets' GPU, or in host memory",
			q.w.Name, q.w.Device.Device().Name(), bucket.Device().Name())
	}
	if f.quantizer == nil {
		f.quantizer = f.stream.NewQuantizer()
	}
	if ok, why := f.quantizer.Kernel(); !ok {
		return fmt.Errorf("pack: quantize %q on the GPU: %w; hand the weight in host memory, or leave it out with an exclude pattern", q.w.Name, why)
	}
	if err := f.quantScratch(q); err != nil {
		return err
	}
	base, _ := gpu.Address(q.w.Device) // checked by Validate
	job := gpu.QuantJob{Src: base + uint64(q.w.DeviceOffset), From: q.from, Rows: q.rows, Cols: q.cols, Scales: f.qscales.DevicePtr()}
	if t.role == quantCodes {
		job.First, job.End, job.Dst = chunk, chunk+n, dst
		if err := f.quantizer.Queue(job); err != nil {
			return fmt.Errorf("pack: quantize %q: %w", q.w.Name, err)
		}
		f.qcoded += n
		return nil
	}
	if f.qcoded != q.rows*q.cols {
		if err := f.quantizer.Queue(job); err != nil { // the scales only
			return fmt.Errorf("pack: scales of %q: %w", q.w.Name, err)
		}
		f.qcoded = q.rows * q.cols
	}
	if err := f.stream.CopyDtoDPtr(dst, f.qscales.DevicePtr()+uint64(chunk), int(n)); err != nil {
		return fmt.Errorf("pack: copying the scales of %q into a device bucket: %w", q.w.Name, err)
	}
	return nil
}

// quantScratch makes f.qscales hold the scales of q: from q's first
// tensor on, and large enough (at least 1 MiB, so that it rarely grows).
func (f *deviceFill) quantScratch(q *quantized) error {
	if f.qw == q {
		return nil
	}
	need := int(4 * q.nbr * q.nbc)
	if f.qscales == nil || f.qscales.Len() < need {
		b, err := f.stream.Device().Alloc(max(need, 1<<20))
		if err != nil {
			return fmt.Errorf("pack: scratch memory for the scales of %q: %w", q.w.Name, err)
		}
		if f.qscales != nil {
			f.qspent = append(f.qspent, f.qscales) // launches queued may still write it
		}
		f.qscales = b
	}
	f.qw, f.qcoded = q, 0
	return nil
}

// freeSpent frees the scratch memory outgrown; the copies must have
// settled.
func (f *deviceFill) freeSpent() error {
	var errs []error
	for _, b := range f.qspent {
		errs = append(errs, b.Free())
	}
	f.qspent = nil
	return errors.Join(errs...)
}

// castKernel reports whether the GPU cast kernel is usable.
func (f *deviceFill) castKernel() bool {
	if f.caster == nil {
		f.caster = f.stream.NewCaster()
	}
	ok, _ := f.caster.Kernel()
	return ok
}

// castIn queues the conversion of device tensor t, output bytes [chunk,
// chunk+n), into the bucket at dst, by the GPU cast kernel.
func (f *deviceFill) castIn(t *Tensor, dst uint64, n, chunk int64) error {
	from, to := t.SourceDType, t.DType
	es, eo := int64(from.Size()), int64(to.Size())
	if chunk%eo != 0 || n%eo != 0 {
		return fmt.Errorf("pack: cast %s→%s of tensor %q: %d bytes at %d are not whole elements", from, to, t.Name, n, chunk)
	}
	if n == 0 {
		return nil
	}
	if f.caster == nil {
		f.caster = f.stream.NewCaster()
	}
	base, _ := gpu.Address(t.Device) // checked by Validate
	src := base + uint64(t.DeviceOffset+chunk/eo*es)
	if err := f.caster.Add(dst, src, n/eo, from, to); err != nil {
		return fmt.Errorf("pack: tensor %q: %w", t.Name, err)
	}
	return nil
}
