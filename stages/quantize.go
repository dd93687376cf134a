package stages

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/quant"
	"github.com/weightcast/weightcast/wire"
)

// QuantizeConfig chooses a rollout quantization (see package quant).
type QuantizeConfig struct {
	// Scheme is quant.FP8Block, or quant.None to send every tensor as it
	// is.
	Scheme quant.Scheme
	// Include and Exclude are the patterns of quant.Selector: names to
	// quantize besides the default's 2-D linear weights, and names to
	// leave as they are (Exclude wins).
	Include []string
	Exclude []string
}

// Quantize returns a Source that yields src's tensors with the weights
// cfg's Selector picks quantized: each picked weight W, [rows, cols] of
// F32, BF16 or F16, becomes two tensors in its place, W itself as F8_E4M3
// (same name and shape) and W_scale_inv (quant.ScaleSuffix), F32
// [ceil(rows/128), ceil(cols/128)], which the receivers see as ordinary
// tensors. Every other tensor passes through unchanged (FP8 ones
// included); wrap the result in Cast to cast those. With quant.None,
// Quantize returns src itself.
//
// The codes and scales are computed as Pack copies them, from the
// weight's own bytes. A weight in host memory (Data or Reader) is
// quantized on the CPU (package quant, by the goroutines that read the
// tensor), whether the buckets are host or device memory: through
// Tensor.ReadAt, a range of codes reads the weight's rows it needs once,
// after the scales of their block rows, which each reading computes once
// and the scale tensor reuses. A weight in device memory (Tensor.Device)
// is quantized on the GPU as Pack fills device buckets (gpu.Quantizer, on
// Pack's copy stream): each chunk of codes straight into its bucket,
// the scales into scratch memory, from which the scale tensor is copied.
// Both give the same bytes. A device weight needs device buckets on its
// own GPU; elsewhere, or where the kernel is unavailable, the round fails
// with an error naming it. Tensors are quantized from the values they
// hold: compose with Cast as Quantize(Cast(src, to), cfg), so that the
// tensors left as they are are cast to the rollout dtype and the picked
// weights are quantized from their source dtype.
//
// The result describes itself as src does (Describer), with each picked
// weight's dtype rewritten and its scale tensor listed after it, and
// finds tensors as src does (Lookup). A pattern that does not compile,
// an unknown scheme, or a tensor that an Include pattern forces but that
// cannot be quantized (Tensors fails naming it) is an error.
func Quantize(src Source, cfg QuantizeConfig) (Source, error) {
	switch cfg.Scheme {
	case quant.None:
		if len(cfg.Include) > 0 || len(cfg.Exclude) > 0 {
			return nil, fmt.Errorf("quantize: include and exclude patterns given without a scheme (use %q)", quant.FP8Block)
		}
		return src, nil
	case quant.FP8Block:
	default:
		return nil, fmt.Errorf("quantize: unknown scheme %q (known: %s)", cfg.Scheme, quant.FP8Block)
	}
	sel, err := quant.NewSelector(cfg.Include, cfg.Exclude)
	if err != nil {
		return nil, err
	}
	return &quantSource{src: src, sel: sel}, nil
}

type quantSource struct {
	src Source
	sel *quant.Selector

	mu      sync.Mutex
	infoSrc *wire.SourceInfo
	info    *wire.SourceInfo
}

// quantized is what the two tensors of one quantized weight share: the
// weight as the source gave it and the scales of its blocks, computed
// block row by block row, at most once each.
type quantized struct {
	w          *Tensor // the weight; its held bytes are what is quantized
	from       dtype.DType
	rows, cols int64
	nbr, nbc   int64

	scales  []uint32 // nbr × nbc, row-major; block row i valid once rowDone[i] ran
	rowDone []blockRow
}

type blockRow struct {
	once sync.Once
	err  error
}

// quantRole says which of a quantized weight's tensors a Tensor is.
type quantRole uint8

const (
	quantCodes quantRole = iota + 1
	quantScales
)

// Tensors emits src's tensors, each picked weight as its codes and then
// its scales.
func (q *quantSource) Tensors(ctx context.Context, emit func(*Tensor) error) error {
	return q.src.Tensors(ctx, func(t *Tensor) error {
		codes, scales, err := q.wrap(t)
		if err != nil {
			return err
		}
		if codes == nil {
			return emit(t)
		}
		if err := emit(codes); err != nil {
			return err
		}
		return emit(scales)
	})
}

// wrap returns the codes and scale tensors of t, or nils when t is not
// quantized.
func (q *quantSource) wrap(t *Tensor) (codes, scales *Tensor, err error) {
	if t.quant != nil {
		return nil, nil, nil // quantized already (Quantize twice)
	}
	ok, err := q.sel.Select(t.Name, t.held(), t.Shape)
	if err != nil || !ok {
		return nil, nil, err
	}
	if _, err := t.Validate(); err != nil {
		return nil, nil, err
	}
	return newQuantized(t)
}

// newQuantized returns the tensors of weight t quantized.
func newQuantized(t *Tensor) (codes, scales *Tensor, err error) {
	rows, cols := t.Shape[0], t.Shape[1]
	if len(t.Name)+len(quant.ScaleSuffix) > wire.MaxNameLen {
		return nil, nil, fmt.Errorf("quantize: tensor %q: the name of its scales would exceed the limit of %d bytes", t.Name, wire.MaxNameLen)
	}
	nbr, nbc := quant.ScaleShape(rows, cols)
	q := &quantized{w: t, from: t.held(), rows: rows, cols: cols, nbr: nbr, nbc: nbc,
		scales: make([]uint32, nbr*nbc), rowDone: make([]blockRow, nbr)}
	codes = &Tensor{Name: t.Name, DType: dtype.F8E4M3, Shape: slices.Clone(t.Shape), quant: q, role: quantCodes}
	scales = &Tensor{Name: t.Name + quant.ScaleSuffix, DType: dtype.F32, Shape: []int64{nbr, nbc}, quant: q, role: quantScales}
	return codes, scales, nil
}

// SourceInfo returns src's description with each picked weight's dtype
// F8_E4M3 and its scale tensor listed right after it, or nil when src has
// none. Shards that do not list their tensors' dtypes and shapes are
// described as src describes them. The result is shared and must not be
// modified.
func (q *quantSource) SourceInfo() *wire.SourceInfo {
	d, ok := q.src.(Describer)
	if !ok {
		return nil
	}
	info := d.SourceInfo()
	q.mu.Lock()
	defer q.mu.Unlock()
	if info != q.infoSrc {
		q.infoSrc, q.info = info, q.describe(info)
	}
	return q.info
}

func (q *quantSource) describe(info *wire.SourceInfo) *wire.SourceInfo {
	if info == nil {
		return nil
	}
	out := *info
	out.Shards = slices.Clone(info.Shards)
	for i, sh := range info.Shards {
		if len(sh.DTypes) != len(sh.Tensors) || len(sh.Shapes) != len(sh.Tensors) {
			continue
		}
		var ns wire.ShardInfo = sh
		ns.Tensors, ns.DTypes, ns.Shapes = nil, nil, nil
		for j, name := range sh.Tensors {
			picked, err := q.sel.Select(name, sh.DTypes[j], sh.Shapes[j])
			if err != nil || !picked {
				ns.Tensors, ns.DTypes, ns.Shapes = append(ns.Tensors, name), append(ns.DTypes, sh.DTypes[j]), append(ns.Shapes, sh.Shapes[j])
				continue
			}
			nbr, nbc := quant.ScaleShape(sh.Shapes[j][0], sh.Shapes[j][1])
			ns.Tensors = append(ns.Tensors, name, name+quant.ScaleSuffix)
			ns.DTypes = append(ns.DTypes, dtype.F8E4M3, dtype.F32)
			ns.Shapes = append(ns.Shapes, sh.Shapes[j], []int64{nbr, nbc})
		}
		out.Shards[i] = ns
	}
	return &out
}

// Lookup returns src's tensor called name as Tensors yields it: a picked
// weight's codes under its own name, its scales under name +
// quant.ScaleSuffix.
func (q *quantSource) Lookup(name string) (*Tensor, bool) {
	l, ok := q.src.(Lookuper)
	if !ok {
		return nil, false
	}
	if t, ok := l.Lookup(name); ok {
		codes, _, err := q.wrap(t)
		switch {
		case err != nil:
			return nil, false
		case codes != nil:
			return codes, true
		}
		return t, true
	}
	base, ok := strings.CutSuffix(name, quant.ScaleSuffix)
	if !ok {
		return nil, false
	}
	t, ok := l.Lookup(base)
	if !ok {
		return nil, false
	}
	_, scales, err := q.wrap(t)
	if err != nil || scales == nil {
		return nil, false
	}
	return scales, true
}

// blockRowScales computes the scales of block row i once (later calls
// wait for the first and return its result).
func (q *quantized) blockRowScales(i int64) error {
	br := &q.rowDone[i]
	br.once.Do(func() {
		m := make([]uint32, q.nbc)
		first, end := i*quant.Block*q.cols, min(q.rows, (i+1)*quant.Block)*q.cols
		if err := q.readWeight(first, end, func(buf []byte, at int64) error {
			return quant.FoldAmax(m, buf, q.from, int(q.cols), at)
		}); err != nil {
			br.err = err
			return
		}
		for j, v := range m {
			q.scales[i*q.nbc+int64(j)] = quant.ScaleOf(v)
		}
	})
	return br.err
}

// readWeight reads the weight's elements [first, end) in pieces, calling
// fn with each piece's bytes and its first element.
func (q *quantized) readWeight(first, end int64, fn func(buf []byte, at int64) error) error {
	es := int64(q.from.Size())
	bp := scratchPool.Get().(*[]byte)
	defer scratchPool.Put(bp)
	step := int64(len(*bp)) / es
	for at := first; at < end; at += step {
		k := min(step, end-at)
		buf := (*bp)[:k*es]
		if err := q.w.readHeld(buf, at*es); err != nil {
			return err
		}
		if err := fn(buf, at); err != nil {
			return fmt.Errorf("quantize %q: %w", q.w.Name, err)
		}
	}
	return nil
}

// readQuant fills p with the quantized tensor's bytes from off: codes,
// or scales (little-endian float32 bits).
func (t *Tensor) readQuant(p []byte, off int64) error {
	q := t.quant
	if q.w.Device != nil && len(p) > 0 {
		return q.onDevice()
	}
	size, err := t.Size()
	if err != nil {
		return err
	}
	if off < 0 || off+int64(len(p)) > size {
		return fmt.Errorf("tensor %q: read of %d bytes at %d outside its %d bytes", t.Name, len(p), off, size)
	}
	if len(p) == 0 {
		return nil
	}
	if t.role == quantScales {
		if off%4 != 0 || len(p)%4 != 0 {
			return fmt.Errorf("tensor %q: read of %d bytes at %d is not whole float32 scales", t.Name, len(p), off)
		}
		first, n := off/4, int64(len(p))/4
		for i := first / q.nbc; i <= (first+n-1)/q.nbc; i++ {
			if err := q.blockRowScales(i); err != nil {
				return err
			}
		}
		for k := range n {
			binary.LittleEndian.PutUint32(p[4*k:], q.scales[first+k])
		}
		return nil
	}
	first, end := off, off+int64(len(p))
	br0, br1 := first/q.cols/quant.Block, (end-1)/q.cols/quant.Block
	for i := br0; i <= br1; i++ {
		if err := q.blockRowScales(i); err != nil {
			return err
		}
	}
	return q.readWeight(first, end, func(buf []byte, at int64) error {
		n := int64(len(buf)) / int64(q.from.Size())
		return quant.Encode(p[at-first:at-first+n], buf, q.from, int(q.cols), at, q.scales[at/q.cols/quant.Block*q.nbc:])
	})
}

// validateQuant checks a quantized tensor: its dtype, shape and bytes
// source left as Quantize made them, its weight still valid.
func (t *Tensor) validateQuant() error {
	q := t.quant
	if t.Data != nil || t.Reader != nil || t.Device != nil || t.Casts() {
		return fmt.Errorf("tensor %q is quantized (its bytes are computed from its weight); it must not set Data, Reader, Device or SourceDType", t.Name)
	}
	want, shape := dtype.F8E4M3, []int64{q.rows, q.cols}
	if t.role == quantScales {
		want, shape = dtype.F32, []int64{q.nbr, q.nbc}
	}
	if t.DType != want || !slices.Equal(t.Shape, shape) {
		return fmt.Errorf("tensor %q is quantized as %s%v; it was changed to %s%v", t.Name, want, shape, t.DType, t.Shape)
	}
	_, err := q.w.Validate()
	return err
}

// onDevice is the error for a weight in device memory read on the host:
// the GPU quantizes it, as Pack fills device buckets.
func (q *quantized) onDevice() error {
	return fmt.Errorf("quantize: tensor %q is in device memory on %s, which is quantized on the GPU as it is packed into device buckets (a Pool allocated on a CUDA device), not read on the host",
		q.w.Name, q.w.Device.Device().Name())
}
