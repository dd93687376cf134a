package stages

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/wire"
)

// Direct buckets: receivers on the sender's GPU read its tensors in place.
//
// When every receiver shares the sender's GPU and can map its memory (the
// endpoint says so: transport.DirectReader), packing device tensors into
// buckets only to have every receiver copy them out again costs a copy of
// the model, and a bucket's worth of memory bandwidth per receiver. So the
// sender lays buckets out as it always does (entries, offsets, lengths,
// sequence numbers, acknowledgements and commits unchanged) but leaves
// them unfilled: each entry says where its bytes lie in the sender's
// memory (Entry.Src: an allocation and an offset) and the bucket lists the
// allocations with their CUDA IPC handles (BucketMeta.Direct). Each
// receiver maps every allocation once (kept across rounds while rounds
// use it, the rest freed by its Close) and copies the entries straight
// into its model. No byte moves
// on the byte transport.
//
// The sender exports each allocation once (cuMemGetAddressRange to find
// it, cuIpcGetMemHandle to export it) and keeps the handle across rounds,
// keyed by the allocation's unique id, checked once per allocation per
// round (a freed allocation's address taken by a new one gets a new
// handle). Memory CUDA IPC cannot share (PyTorch's expandable segments, a
// stream-ordered pool) is packed into buckets as before; the Sender says so
// once in its log. So are tensors that cast, tensors on another GPU and
// host tensors: a bucket that takes one of them is packed whole.
//
// The checksum of a direct bucket is that of the bucket as pack would
// fill it with zeros between the entries. The sender computes it itself
// from its tensors, a pass that only reads them (gpu.Gather.CopySumLayout
// without destinations): one read of the model per round, whatever the
// number of receivers, in place of the pack's copy. Each receiver computes
// the same sum in the copies that read the tensors into its model, and
// compares (verifySum). With a group secret the bucket's MAC, computed
// the same ways over its entries (placed on 1 KiB chunks), takes the
// checksum's place (mac.go). The sender's tensors must stay unchanged
// until Sync returns: the receivers read them until their last
// acknowledgement.
//
// A direct bucket holds no buffer of the sender's pool (it has no bytes
// there; pack takes one only if the bucket turns into one it fills), so
// pack lays out a direct round without waiting for the receivers. Where
// the GPU is not shared through MPS, the Sender's publish stage then holds
// each run of direct buckets until the GPU has summed all of them
// (Sender.sumsFirst): the sender's checksum kernels and the receivers'
// copy kernels are of different processes and would otherwise take turns
// with each other bucket by bucket. For the same reason the receivers, where
// several share the GPU, copy the round in turns of several buckets, one
// receiver after another (turns.go).

// directPiece is one entry of a direct bucket as the sender's pack
// placed it: n bytes at addr (in the allocation at base), at byte at of
// the bucket.
type directPiece struct {
	at, n      int64
	addr, base uint64
}

// exported is one of the sender's allocations exported with CUDA IPC.
type exported struct {
	info   gpu.AllocationInfo
	handle gpu.IPCHandle
	round  uint64 // the last round (pack's version) that checked its id
}

// exports is a sender's cache of exported allocations, sorted by base. It
// is used by one pack goroutine at a time.
type exports struct {
	dev    *gpu.CUDADevice
	allocs []*exported
	warned bool // memory that cannot be exported was reported
}

// find returns the cached allocation that holds addr, or nil.
func (x *exports) find(addr uint64) *exported {
	i, _ := slices.BinarySearchFunc(x.allocs, addr, func(e *exported, a uint64) int { return cmpU64(e.info.Base, a+1) })
	if i == 0 {
		return nil
	}
	e := x.allocs[i-1]
	if addr-e.info.Base < uint64(e.info.Size) {
		return e
	}
	return nil
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// lookup returns the exported allocation that holds addr, checked this
// round: a cached one whose id is unchanged, or the allocation found and
// exported now. Its error matches gpu.ErrNotExportable for memory CUDA
// IPC cannot share.
func (x *exports) lookup(addr uint64, round uint64) (*exported, error) {
	e := x.find(addr)
	if e != nil && e.round == round {
		return e, nil
	}
	if e != nil {
		if id, err := x.dev.AllocationID(addr); err == nil && id == e.info.ID {
			e.round = round
			return e, nil
		}
	}
	info, err := x.dev.Allocation(addr)
	if err != nil {
		return nil, err
	}
	h, err := x.dev.ExportAddress(info.Base)
	if err != nil {
		return nil, err
	}
	ne := &exported{info: info, handle: h, round: round}
	// Drop what the new allocation overlaps (freed allocations).
	x.allocs = slices.DeleteFunc(x.allocs, func(o *exported) bool {
		return o.info.Base < info.Base+uint64(info.Size) && info.Base < o.info.Base+uint64(o.info.Size)
	})
	i, _ := slices.BinarySearchFunc(x.allocs, info.Base, func(o *exported, b uint64) int { return cmpU64(o.info.Base, b) })
	x.allocs = slices.Insert(x.allocs, i, ne)
	return ne, nil
}

// directSource places chunk [chunk, chunk+n) of device tensor t, which
// must lie on the bucket's GPU, in its exported allocation; ok is false
// for a tensor a direct bucket cannot take (host bytes, a cast, another
// GPU, memory CUDA IPC cannot share: the last said once to the Sender's
// logger).
func (pk *Packer) directSource(t *Tensor, bucket mem.Buffer, chunk int64, round uint64) (p directPiece, e *exported, ok bool, err error) {
	if t.Device == nil || t.Casts() || !sameGPU(t.Device, bucket) {
		return p, nil, false, nil
	}
	base, _ := gpu.Address(t.Device) // checked by Validate
	addr := base + uint64(t.DeviceOffset+chunk)
	if pk.exports == nil {
		dev, err := cudaDeviceOf(bucket)
		if err != nil {
			return p, nil, false, err
		}
		pk.exports = &exports{dev: dev}
	}
	e, err = pk.exports.lookup(addr, round)
	if errors.Is(err, gpu.ErrNotExportable) {
		if !pk.exports.warned {
			pk.exports.warned = true
			logger := pk.logger
			if logger == nil {
				logger = slog.Default()
			}
			logger.Warn("weightcast: a tensor is in memory that CUDA IPC cannot share; such tensors go through buckets, the others are read in place (said once)", "tensor", t.Name, "reason", err)
		}
		return p, nil, false, nil
	}
	if err != nil {
		return p, nil, false, fmt.Errorf("pack: tensor %q: %w", t.Name, err)
	}
	return directPiece{addr: addr, base: base}, e, true, nil
}

// allocIndex returns the index in m.Direct.Allocs of e, adding it.
func allocIndex(m *wire.BucketMeta, e *exported) int {
	addr := strconv.FormatUint(e.info.Base, 16)
	for i, a := range m.Direct.Allocs {
		if a.Addr == addr {
			return i
		}
	}
	m.Direct.Allocs = append(m.Direct.Allocs, wire.DirectAlloc{Handle: e.handle.String(), Size: e.info.Size, Addr: addr})
	return len(m.Direct.Allocs) - 1
}

// newDirectInfo is the DirectInfo of a bucket of this process.
func newDirectInfo() *wire.DirectInfo {
	return &wire.DirectInfo{PID: os.Getpid(), Allocs: []wire.DirectAlloc{}}
}

// mappings is a receiver's cache of the sender's allocations, mapped on
// its GPU: opened from their handles once and kept from round to round
// while rounds use them (a mapping no bucket of the last round used is
// closed at the next round's first direct bucket: the sender freed or no
// longer sends that memory), or, in the sender's own process, viewed at
// their addresses. It is used by one receive goroutine at a time; close
// unmaps them all.
type mappings struct {
	dev     *gpu.CUDADevice
	opened  map[string]*mapping // by handle
	version uint64              // the round of the last bucket mapped
}

// mapping is one of the sender's allocations mapped here, and the last
// round (model version) whose buckets used it.
type mapping struct {
	buf  mem.Buffer
	used uint64
}

// views places each entry of the direct bucket m in this process. The
// first direct bucket of a round first closes the mappings that the
// round before did not use: no copy reads them any more (that round
// ended before this one began).
// It also returns the device address here of the turns' words, if the
// bucket has turns.
func (mp *mappings) views(m *wire.BucketMeta) (views []directView, words uint64, err error) {
	if m.Version != mp.version {
		if err := mp.prune(mp.version); err != nil {
			return nil, 0, fmt.Errorf("bucket %d: %w", m.Seq, err)
		}
		mp.version = m.Version
	}
	d := m.Direct
	bufs := make([]mem.Buffer, len(d.Allocs))
	for i, a := range d.Allocs {
		b, err := mp.open(d.PID, a, m.Version)
		if err != nil {
			return nil, 0, fmt.Errorf("bucket %d: mapping the sender's allocation %d (%d bytes) on %s: %w", m.Seq, i, a.Size, mp.dev.Name(), err)
		}
		bufs[i] = b
	}
	out := make([]directView, len(m.Entries))
	for i := range m.Entries {
		if src := m.Entries[i].Src; src != nil {
			out[i] = directView{buf: bufs[src.Alloc], off: src.Offset}
		}
	}
	if d.Turns != nil {
		words, _ = gpu.Address(bufs[d.Turns.Alloc])
	}
	return out, words, nil
}

// open returns allocation a of the sender with process id pid, mapped, for
// round version.
func (mp *mappings) open(pid int, a wire.DirectAlloc, version uint64) (mem.Buffer, error) {
	if pid == os.Getpid() {
		addr, _ := strconv.ParseUint(a.Addr, 16, 64) // checked by DecodeMeta
		return mp.dev.View(addr, int(a.Size))
	}
	if mm, ok := mp.opened[a.Handle]; ok {
		if int64(mm.buf.Len()) != a.Size {
			return nil, fmt.Errorf("the allocation %.16s… changed size from %d to %d bytes", a.Handle, mm.buf.Len(), a.Size)
		}
		mm.used = version
		return mm.buf, nil
	}
	h, err := gpu.ParseIPCHandle(a.Handle)
	if err != nil {
		return nil, err
	}
	b, err := mp.dev.OpenIPC(h, int(a.Size))
	if err != nil {
		return nil, err
	}
	if mp.opened == nil {
		mp.opened = map[string]*mapping{}
	}
	mp.opened[a.Handle] = &mapping{buf: b, used: version}
	return b, nil
}

// prune closes the mappings that no bucket of round last used.
func (mp *mappings) prune(last uint64) error {
	var errs []error
	for h, mm := range mp.opened {
		if mm.used < last {
			errs = append(errs, mm.buf.Free())
			delete(mp.opened, h)
		}
	}
	return errors.Join(errs...)
}

// close unmaps every allocation; no copy may read them any more.
func (mp *mappings) close() error {
	var errs []error
	for _, mm := range mp.opened {
		errs = append(errs, mm.buf.Free())
	}
	mp.opened = nil
	return errors.Join(errs...)
}

// directLayout places the direct bucket u's entries in a layout of the
// bucket, read where they lie (u.Bucket.srcs), copied to dst(i) for each
// entry i unless it returns 0.
func directLayout(u *Unpacked, l *gpu.Layout, dst func(i int) (uint64, error)) error {
	for i, v := range u.Views {
		e := v.Entry
		if e.Size == 0 {
			continue
		}
		from, ok := gpu.Address(v.Device)
		if !ok {
			return fmt.Errorf("tensor %q: the sender's memory is not mapped here", e.Name)
		}
		to, err := dst(i)
		if err != nil {
			return err
		}
		l.Add(e.Offset, from+uint64(v.Offset), e.Size, to)
	}
	return nil
}

// gatherDirect copies direct bucket b's entries from where they lie (srcs)
// into b's own buffer, as pack would have filled it, with the bucket's
// checksum, or in a signed round its MAC, computed in the same pass when
// it has one, and waits for the copies; b then carries the checksum or
// the MAC for unpack to check.
func (c *gpuCopier) gatherDirect(ctx context.Context, b *Bucket, srcs []directView) error {
	m := &b.Meta
	dst, _ := gpu.Address(b.Buf)
	var l gpu.Layout
	var cb gpu.CopyBatch
	for i := range m.Entries {
		e := &m.Entries[i]
		if e.Size == 0 {
			continue
		}
		from, ok := gpu.Address(srcs[i].buf)
		if !ok {
			return fmt.Errorf("bucket %d: tensor %q: the sender's memory is not mapped here", m.Seq, e.Name)
		}
		from += uint64(srcs[i].off)
		l.Add(e.Offset, from, e.Size, dst+uint64(e.Offset))
		cb.Add(dst+uint64(e.Offset), from, e.Size)
	}
	switch {
	case b.auth != nil && m.HasMAC:
		if err := queueLayoutMAC(ctx, c.gather, &c.macs, c.stream, b, &l, b.auth); err != nil {
			return fmt.Errorf("bucket %d: %w", m.Seq, err)
		}
		if _, err := b.mac.wait(ctx); err != nil { // the copies have landed when the MAC is in
			return fmt.Errorf("the MAC of direct bucket %d (version %d): %w", m.Seq, m.Version, err)
		}
		return nil
	case !m.HasChecksum:
		if err := c.gather.Copy(ctx, &cb); err != nil {
			return fmt.Errorf("bucket %d: copying from the sender's memory: %w", m.Seq, err)
		}
		return c.sync(ctx)
	}
	ps, err := c.gather.CopySumLayout(ctx, &l, m.Length, c.sums)
	if err != nil {
		return fmt.Errorf("bucket %d: copying from the sender's memory with its checksum: %w", m.Seq, err)
	}
	b.sum = ps
	b.whenReleased(ps.Close)
	if _, err := ps.Wait(ctx); err != nil { // the copies have landed when the sum is in
		return fmt.Errorf("bucket %d: copying from the sender's memory with its checksum: %w", m.Seq, err)
	}
	return nil
}

// InPlaceReader is a Sink that takes the device views of a direct bucket
// where they lie in the sender's memory rather than gathered into this
// rank's bucket first: one whose consumer copies every view out itself
// (sink.Views, for receive() loops that copy into a rollout engine's
// parameters), so that a gather would only add a copy of the model. When
// the round's sink is one that says so, the receive stage leaves direct
// buckets in place and sums them there, in a pass that only reads the
// entries (gpu.Gather.CopySumLayout without destinations, as the sender
// computed the sum), and unpack checks that sum before the sink sees any
// view: a changed byte fails the round naming the bucket's tensors before
// the consumer gets one. The sender's tensors stay unchanged until its
// Sync returns (direct rounds' rule), which covers the consumer's reads.
type InPlaceReader interface {
	Sink
	// ReadsInPlace reports whether the sink takes direct buckets' views
	// in place.
	ReadsInPlace() bool
}

// readsInPlace reports whether sink's one leaf is an InPlaceReader that
// takes views in place.
func readsInPlace(sink Sink) bool {
	ls := leaves(sink)
	if len(ls) != 1 {
		return false
	}
	r, ok := ls[0].(InPlaceReader)
	return ok && r.ReadsInPlace()
}

// directUse says what the receive stage does with a direct bucket.
type directUse int

const (
	// directGather: gathered into this rank's buffer, its checksum
	// computed in the same pass (gatherDirect).
	directGather directUse = iota
	// directLeave: left where it lies for load's copies into the
	// round's one DeviceTarget, which compute its checksum.
	directLeave
	// directSum: left where it lies for an InPlaceReader, its checksum
	// read there (sumInPlace).
	directSum
)

// sumInPlace queues the checksum of direct bucket b as pack would fill it,
// or in a signed round its MAC, read from its entries where they lie
// (srcs) without copying them, when b has one; b then carries it for
// unpack to check, which waits for it.
func (c *gpuCopier) sumInPlace(ctx context.Context, b *Bucket, srcs []directView) error {
	m := &b.Meta
	signed := b.auth != nil && m.HasMAC
	if !m.HasChecksum && !signed {
		return nil
	}
	var l gpu.Layout
	for i := range m.Entries {
		e := &m.Entries[i]
		if e.Size == 0 {
			continue
		}
		from, ok := gpu.Address(srcs[i].buf)
		if !ok {
			return fmt.Errorf("bucket %d: tensor %q: the sender's memory is not mapped here", m.Seq, e.Name)
		}
		l.Add(e.Offset, from+uint64(srcs[i].off), e.Size, 0)
	}
	if signed {
		if err := queueLayoutMAC(ctx, c.gather, &c.macs, c.stream, b, &l, b.auth); err != nil {
			return fmt.Errorf("bucket %d: %w", m.Seq, err)
		}
		return nil
	}
	ps, err := c.gather.CopySumLayout(ctx, &l, m.Length, c.sums)
	if err != nil {
		return fmt.Errorf("bucket %d: the checksum of the sender's memory: %w", m.Seq, err)
	}
	b.sum = ps
	b.whenReleased(ps.Close)
	return nil
}
