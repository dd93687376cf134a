package gpu

// The staging ring's side on a real GPU: pinned slots of a Stream's
// device, and the copies (and casts) out of them queued on the stream.
// staging.go holds the ring itself, which tests drive through a fake.

import (
	"context"
	"errors"
	"fmt"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/mem"
)

// streamStaging is the stagingGPU of a StagingRing: pinned memory of the
// stream's device, copies on the stream, queued with one
// cuMemcpyBatchAsync per slot.
//
// Conversions (stageCopy.to set) go through device scratch memory: the
// source bytes are copied from the slot to the same offset of the slot's
// scratch region, then the cast kernel converts them into the destination,
// both on the stream before the slot's event, so a scratch region is
// rewritten only once its slot is.
type streamStaging struct {
	s       *Stream
	perCopy bool
	batch   CopyBatch

	// caster converts, created at the first conversion; scratch holds
	// their source bytes, one region of slotLen per slot, allocated at
	// the first conversion; bases are the addresses of the slots alloc
	// returned, in order: the k-th slot's region is scratch[k*slotLen:].
	caster  *Caster
	scratch mem.Buffer
	bases   []uint64
	slotLen int
}

// scratchAt returns the scratch address of staging address src.
func (g *streamStaging) scratchAt(ctx context.Context, src uint64) (uint64, error) {
	for k, base := range g.bases {
		if src >= base && src < base+uint64(g.slotLen) {
			if g.scratch == nil || (k+1)*g.slotLen > g.scratch.Len() {
				if err := g.growScratch(ctx); err != nil {
					return 0, err
				}
			}
			return g.scratch.DevicePtr() + uint64(k*g.slotLen) + (src - base), nil
		}
	}
	return 0, fmt.Errorf("gpu: staging address %#x outside every slot", src)
}

// growScratch (re)allocates the scratch memory for every slot allocated so
// far, waiting first for the work queued on the stream (which may read
// the old memory).
func (g *streamStaging) growScratch(ctx context.Context) error {
	if old := g.scratch; old != nil {
		if err := g.s.Sync(ctx); err != nil {
			return fmt.Errorf("gpu: waiting to replace the cast scratch memory: %w", err)
		}
		if err := old.Free(); err != nil {
			return err
		}
		g.scratch = nil
	}
	n := max(len(g.bases), StagingSlots) * g.slotLen
	buf, err := g.s.d.Alloc(n)
	if err != nil {
		return fmt.Errorf("gpu: allocating %d bytes of device memory to convert staged host bytes on the GPU: %w", n, err)
	}
	g.scratch = buf
	return nil
}

func (g *streamStaging) alloc(n int) ([]byte, uint64, func() error, error) {
	b, err := g.s.d.AllocPinned(n)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("gpu: allocating %d bytes of pinned staging memory: %w", n, err)
	}
	addr, ok := Address(b)
	if !ok {
		return nil, 0, nil, errors.Join(fmt.Errorf("gpu: pinned staging memory of %s has no address", g.s.d.Name()), b.Free())
	}
	g.bases = append(g.bases, addr)
	g.slotLen = n
	return b.Host(), addr, b.Free, nil
}

func (g *streamStaging) queue(ctx context.Context, cs []stageCopy) error {
	g.batch.Reset()
	g.batch.PerCopy = g.perCopy
	casts := 0
	for _, c := range cs {
		if c.to != dtype.Invalid {
			casts++
			continue
		}
		g.batch.Add(c.dst, c.src, c.n)
	}
	if err := g.s.CopyBatch(&g.batch); err != nil {
		return err
	}
	if casts == 0 {
		return nil
	}
	if g.caster == nil {
		g.caster = g.s.NewCaster()
	}
	for _, c := range cs {
		if c.to == dtype.Invalid {
			continue
		}
		at, err := g.scratchAt(ctx, c.src)
		if err != nil {
			return err
		}
		g.batch.Add(at, c.src, c.n)
	}
	if err := g.s.CopyBatch(&g.batch); err != nil {
		return err
	}
	for _, c := range cs {
		if c.to == dtype.Invalid {
			continue
		}
		at, _ := g.scratchAt(ctx, c.src) // allocated by the loop above
		if err := g.caster.Add(c.dst, at, c.n/int64(c.from.Size()), c.from, c.to); err != nil {
			g.caster.Reset()
			return err
		}
	}
	return g.caster.Flush(ctx)
}

func (g *streamStaging) record() (stagingEvent, error) {
	ev, err := g.s.Record()
	if err != nil {
		return nil, err
	}
	return ev, nil
}

func (g *streamStaging) sync(ctx context.Context) error { return g.s.Sync(ctx) }

func (g *streamStaging) close(ctx context.Context) error {
	var errs []error
	if g.caster != nil {
		errs = append(errs, g.caster.Close(ctx))
		g.caster = nil
	}
	if g.scratch != nil {
		errs = append(errs, g.scratch.Free())
		g.scratch = nil
	}
	return errors.Join(errs...)
}
