package stages

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/weightcast/weightcast/cast"
	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/quant"
	"github.com/weightcast/weightcast/wire"
)

// castScratch is the most source bytes a cast reader converts at once.
const castScratch = 256 << 10

var scratchPool = sync.Pool{New: func() any { b := make([]byte, castScratch); return &b }}

// Cast returns a Source that yields src's tensors with their floating-point
// elements converted to the dtype to: the rollout dtype of an RL setup
// (verl's rollout_dtype). With to = BF16 or F16, F32 tensors become to and
// tensors of the other 16-bit type become to; with to = F32, BF16 and F16
// tensors are widened (exactly). Tensors of other dtypes (integers, F64,
// FP8), the scales of FP8 weights (names ending in quant.ScaleSuffix,
// "_scale_inv", which stay F32 as FP8 checkpoints keep them) and tensors
// already of dtype to pass through unchanged; so does
// every tensor when to is dtype.Invalid (Cast then returns src itself).
// Any other to makes Tensors fail.
//
// A cast tensor is a copy of the source's with DType set to to and
// SourceDType to the dtype of its bytes (see Tensor): it keeps its name,
// shape and bytes, so the bucket metadata and the receivers see the dtype
// to on the wire, and Pack converts as it fills buckets. Into host
// buckets, and through Tensor.ReadAt, the conversion runs chunk by chunk
// through a scratch buffer of at most 256 KiB, so the tensor is never
// held whole; into device buckets the GPU cast kernel converts, from the
// tensor's device memory or from its host bytes staged to the GPU. A
// tensor that casts already is converted once, from its SourceDType.
//
// The result describes itself as src does (Describer, with the checkpoint
// metadata unchanged and each cast tensor's announced dtype set to to) and
// finds tensors as src does (Lookup, returning the cast tensor), when src
// supports those.
func Cast(src Source, to dtype.DType) Source {
	if to == dtype.Invalid {
		return src
	}
	return &castSource{src: src, to: to}
}

type castSource struct {
	src Source
	to  dtype.DType

	mu      sync.Mutex
	infoSrc *wire.SourceInfo // the src description info was derived from
	info    *wire.SourceInfo
}

// isScales reports whether name is that of an FP8 weight's scales, which
// Cast leaves as they are.
func isScales(name string) bool { return strings.HasSuffix(name, quant.ScaleSuffix) }

// castable reports whether Cast converts tensors of from to to.
func castable(from, to dtype.DType) bool {
	return from != to && from.IsFloat() && cast.Supported(from, to)
}

// Tensors emits src's tensors, the castable ones wrapped.
func (c *castSource) Tensors(ctx context.Context, emit func(*Tensor) error) error {
	switch c.to {
	case dtype.BF16, dtype.F16, dtype.F32:
	default:
		return fmt.Errorf("cast to %s: the rollout dtype must be BF16, F16 or F32", c.to)
	}
	return c.src.Tensors(ctx, func(t *Tensor) error {
		ct, err := c.wrap(t)
		if err != nil {
			return err
		}
		return emit(ct)
	})
}

func (c *castSource) wrap(t *Tensor) (*Tensor, error) {
	if t.quant != nil || isScales(t.Name) {
		return t, nil // FP8 codes and their scales keep their dtypes
	}
	from := t.held()
	if !castable(from, c.to) {
		if from == c.to && t.Casts() {
			ct := *t // cast back to its own dtype: no conversion left
			ct.DType, ct.SourceDType = c.to, dtype.Invalid
			return &ct, nil
		}
		return t, nil
	}
	if _, err := t.Validate(); err != nil {
		return nil, err
	}
	ct := *t
	ct.DType, ct.SourceDType = c.to, from
	return &ct, nil
}

// SourceInfo returns src's description with the dtypes of the tensors it
// casts rewritten to the cast dtype, or nil when src has none. The result
// is shared and must not be modified.
func (c *castSource) SourceInfo() *wire.SourceInfo {
	d, ok := c.src.(Describer)
	if !ok {
		return nil
	}
	info := d.SourceInfo()
	c.mu.Lock()
	defer c.mu.Unlock()
	if info != c.infoSrc {
		c.infoSrc, c.info = info, castInfo(info, c.to)
	}
	return c.info
}

// castInfo returns a copy of info whose shard dtypes are those Cast gives
// the tensors (info itself when nothing changes).
func castInfo(info *wire.SourceInfo, to dtype.DType) *wire.SourceInfo {
	if info == nil {
		return nil
	}
	var out *wire.SourceInfo
	for i, sh := range info.Shards {
		for j, dt := range sh.DTypes {
			if !castable(dt, to) || (j < len(sh.Tensors) && isScales(sh.Tensors[j])) {
				continue
			}
			if out == nil {
				cp := *info
				cp.Shards = slices.Clone(info.Shards)
				out = &cp
			}
			if &out.Shards[i].DTypes[0] == &info.Shards[i].DTypes[0] {
				out.Shards[i].DTypes = slices.Clone(sh.DTypes)
			}
			out.Shards[i].DTypes[j] = to
		}
	}
	if out == nil {
		return info
	}
	return out
}

// Lookup returns src's tensor called name, cast as Tensors casts it.
func (c *castSource) Lookup(name string) (*Tensor, bool) {
	l, ok := c.src.(Lookuper)
	if !ok {
		return nil, false
	}
	t, ok := l.Lookup(name)
	if !ok {
		return nil, false
	}
	ct, err := c.wrap(t)
	if err != nil {
		return nil, false
	}
	return ct, true
}

// readCast fills p with the tensor's source elements converted to DType,
// starting at output byte off. off and len(p) must be whole elements of
// DType (Pack splits tensors on 64-byte boundaries, so they are).
func (t *Tensor) readCast(p []byte, off int64) error {
	from, to := t.SourceDType, t.DType
	es, eo := int64(from.Size()), int64(to.Size())
	if off < 0 || off%eo != 0 || int64(len(p))%eo != 0 {
		return fmt.Errorf("cast %s→%s of tensor %q: read of %d bytes at %d is not on %d-byte element boundaries", from, to, t.Name, len(p), off, eo)
	}
	size, err := t.heldSize()
	if err != nil {
		return err
	}
	elems := int64(len(p)) / eo
	soff := off / eo * es
	if soff+elems*es > size {
		return fmt.Errorf("cast %s→%s of tensor %q: read of %d bytes at %d is past the tensor's end", from, to, t.Name, len(p), off)
	}
	if elems == 0 {
		return nil
	}
	switch {
	case t.Data != nil:
		if err := cast.Convert(p, to, t.Data[soff:soff+elems*es], from); err != nil {
			return fmt.Errorf("tensor %q: %w", t.Name, err)
		}
	case es == eo:
		// Same width: read the source into p and convert in place.
		if err := t.readHeld(p, soff); err != nil {
			return err
		}
		if err := cast.Convert(p, to, p, from); err != nil {
			return fmt.Errorf("tensor %q: %w", t.Name, err)
		}
	default:
		bp := scratchPool.Get().(*[]byte)
		defer scratchPool.Put(bp)
		buf := *bp
		step := int64(len(buf)) / es // elements per pass
		for done := int64(0); done < elems; {
			k := min(step, elems-done)
			in := buf[:k*es]
			if err := t.readHeld(in, soff+done*es); err != nil {
				return err
			}
			if err := cast.Convert(p[done*eo:(done+k)*eo], to, in, from); err != nil {
				return fmt.Errorf("tensor %q: %w", t.Name, err)
			}
			done += k
		}
	}
	return nil
}
