package stages

import (
	"context"
	"errors"
	"fmt"

	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/wire"
)

// The unpack stage: a received bucket checked and turned into views.
//
// Every received bucket is checked here, in one place, before any sink
// sees it: its entries (the chunks of a split tensor in order, no tensor
// twice, every split tensor complete at the end of the round) and its
// checksum, where its bytes are: on the CPU for a host bucket; for a
// device bucket by the GPU checksum kernel, or on the CPU after copying it
// back where the kernel is unavailable. One exception, decided here too
// (checkAtLoad): a device bucket whose only sink is a DeviceTarget on the
// GPU is not read a second time for its checksum; load computes it in the
// copies that move the bucket into the sink (gpu.Gather.CopySum, SumSrc)
// and reports it through the same function (verifySum) before the bucket
// is acknowledged. A mismatch found then leaves the sink's tensors holding
// part of the round, which Receiver.State reports as partial, as for any
// round that fails after reaching an in-place sink. A direct bucket (read
// where it lies in the sender's memory, see direct.go) is checked the same
// ways: from the sum that receive's copies computed when it gathered the
// bucket into this rank's buffer; left in place for load to copy into a
// DeviceTarget, by load's copies; or, left in place for an InPlaceReader
// (Views, whose consumer copies the views out itself), from a sum receive
// computed there in a pass that only reads the entries, checked here
// before the sink sees any of them.
//
// With a group secret every bucket's MAC is checked here too, before any
// sink sees it, even where its checksum is left to load (mac.go). Such a
// group has no direct buckets: they have no bytes of their own for the
// sender to compute a MAC of.
//
// A host bucket's views are slices of its bytes; a device bucket's are
// device ranges (View.Device), which load hands to device sinks as they
// are and copies to the host for the others.

// View is one entry of a received bucket with its bytes.
type View struct {
	Entry *wire.Entry
	// Data is the entry's bytes inside the bucket buffer: valid only
	// until the bucket is released. Nil for a device bucket.
	Data []byte
	// Device and Offset place the entry's bytes in a device bucket
	// (Device[Offset:Offset+Entry.Size]); Device is nil for host buckets.
	Device mem.Buffer
	Offset int64
}

// Unpacked is a received bucket turned into views of its entries.
type Unpacked struct {
	Bucket *Bucket
	Views  []View
	// sumAtLoad: the bucket's checksum is left to load's copies (see
	// checkAtLoad); macAtLoad: a direct bucket's MAC is (see mac.go);
	// unpack checked everything else.
	sumAtLoad, macAtLoad bool
}

// Release gives the bucket's buffer back.
func (u *Unpacked) Release() { u.Bucket.Release() }

// ByteSize is the bucket's filled length.
func (u *Unpacked) ByteSize() int64 { return u.Bucket.Meta.Length }

// Unpack adds the stage that checks each received bucket (its checksum, and
// that chunks of split tensors arrive in order and complete by the end of
// the round, and that no tensor arrives twice) and turns it into views.
// For device buckets with checksums the stage makes its own GPU state (a
// stream, the checksum kernel's slots) and frees it when it returns; a
// Loader keeps it between rounds instead.
func Unpack(p *pipeline.Pipeline, in *pipeline.Stream[*Bucket]) *pipeline.Stream[*Unpacked] {
	return unpackStage(p, in, nil, nil)
}

// Unpack adds the stage that Unpack adds, checking device buckets with the
// Loader's GPU state, for the Loader's Load stage into sink: where sink is
// one DeviceTarget, the checksums of device buckets are left to Load,
// which computes them in its copies.
func (ld *Loader) Unpack(p *pipeline.Pipeline, in *pipeline.Stream[*Bucket], sink Sink) *pipeline.Stream[*Unpacked] {
	return unpackStage(p, in, ld, sink)
}

func unpackStage(p *pipeline.Pipeline, in *pipeline.Stream[*Bucket], ld *Loader, sink Sink) *pipeline.Stream[*Unpacked] {
	return pipeline.Stage(p, "unpack", in, 1, func(ctx context.Context, in *pipeline.Input[*Bucket], out *pipeline.Output[*Unpacked]) (err error) {
		own := ld == nil
		if own {
			ld = NewLoader()
			defer func() { err = errors.Join(err, ld.Close()) }()
		}
		c, err := ld.takeCheck()
		if err != nil {
			return err
		}
		if !own && sink != nil {
			c.target, c.ld = fusedTarget(sink), ld
		}
		defer func() { err = errors.Join(err, ld.keepCheck(ctx, c, err != nil)) }()
		for b := range in.All() {
			u, err := c.unpack(ctx, b)
			if err != nil {
				// The failure first, then the release: a lent bucket's
				// release tells the root this rank did not load it.
				pipeline.Fail(ctx, err)
				b.Release()
				return err
			}
			if err := out.Send(u); err != nil {
				return err
			}
		}
		return in.Err()
	})
}

// bucketCheck checks the buckets of one round (see unpack). It is used by
// the unpack goroutine only.
type bucketCheck struct {
	// got is each tensor's bytes received so far this round; maxTensors
	// bounds its size.
	got        map[string]progress
	maxTensors int
	// dev checks device buckets' checksums; nil until the first.
	dev *deviceCheck
	// target is the round's sink when it is one DeviceTarget, whose
	// copies out of device buckets compute their checksums (ld's load
	// stage makes them); nil otherwise.
	target DeviceTarget
	ld     *Loader
}

func newBucketCheck(dev *deviceCheck) *bucketCheck {
	return &bucketCheck{got: map[string]progress{}, maxTensors: wire.MaxTensors, dev: dev}
}

// progress counts the bytes of one tensor received so far in a round.
type progress struct{ have, total int64 }

// unpack checks b and makes views of its entries.
func (c *bucketCheck) unpack(ctx context.Context, b *Bucket) (*Unpacked, error) {
	m := &b.Meta
	span := pipeline.StartSpan(ctx, fmt.Sprintf("bucket %d", m.Seq), map[string]any{"bucket": m.Seq, "round": m.Version})
	defer span.End()
	host := b.Buf.Host()
	var data []byte // nil for a device bucket: its views are device views
	if host == nil && !onDevice(b.Buf) {
		return nil, fmt.Errorf("unpack: bucket %d is in a buffer on %s that neither the host nor the GPU can address", m.Seq, b.Buf.Device().Name())
	}
	if host != nil {
		data = host[:m.Length]
	}
	u := &Unpacked{Bucket: b, Views: make([]View, len(m.Entries))}
	switch {
	case !m.HasChecksum:
	case b.sum != nil:
		// Gathered from the sender's memory by receive, which computed
		// the checksum in the same pass, or left there for an
		// InPlaceReader with the checksum read there by receive.
		got, err := b.sum.Wait(ctx)
		if err == nil {
			err = verifySum(m, got)
		}
		if err != nil {
			return nil, err
		}
	case b.srcs != nil:
		// Left where it lies in the sender's memory for load to copy
		// (receiveDirect): only load's copies read it.
		u.sumAtLoad = true
	case c.checkAtLoad(b):
		u.sumAtLoad = true
	default:
		if err := c.checkSum(ctx, b, data); err != nil {
			return nil, err
		}
		// The span covers reading every byte: a rate is a rate.
		span.Args(map[string]any{"bytes": m.Length})
	}
	switch {
	case b.auth != nil && m.HasMAC && b.srcs != nil && b.mac == nil:
		// Left where it lies in the sender's memory for load to copy
		// (receiveDirect): load's copies compute its MAC.
		u.macAtLoad = true
	default:
		if err := c.checkMAC(ctx, b, data); err != nil {
			return nil, err
		}
	}
	for i := range m.Entries {
		e := &m.Entries[i]
		pr, seen := c.got[e.Name]
		have := pr.have
		switch {
		case seen && have == pr.total:
			return nil, fmt.Errorf("tensor %q arrived twice in round %d (again in bucket %d)", e.Name, m.Version, m.Seq)
		case e.Chunk != have:
			return nil, fmt.Errorf("tensor %q: bucket %d carries bytes [%d, %d) but %d bytes had arrived; chunks out of order", e.Name, m.Seq, e.Chunk, e.Chunk+e.Size, have)
		case !seen && len(c.got) >= c.maxTensors:
			return nil, fmt.Errorf("round %d carries more than %d tensors (bucket %d); the limit keeps a receiver's bookkeeping bounded", m.Version, c.maxTensors, m.Seq)
		}
		c.got[e.Name] = progress{have + e.Size, e.Total}
		switch {
		case data != nil:
			u.Views[i] = View{Entry: e, Data: data[e.Offset : e.Offset+e.Size]}
		case b.srcs != nil && b.srcs[i].buf != nil:
			u.Views[i] = View{Entry: e, Device: b.srcs[i].buf, Offset: b.srcs[i].off}
		default:
			u.Views[i] = View{Entry: e, Device: b.Buf, Offset: e.Offset}
		}
	}
	if m.IsLast {
		for name, pr := range c.got {
			if pr.have != pr.total {
				return nil, fmt.Errorf("round %d ended with tensor %q incomplete (%d of %d bytes)", m.Version, name, pr.have, pr.total)
			}
		}
	}
	return u, nil
}

// checkAtLoad decides where received device bucket b's checksum is
// computed: in load's copies into the round's one DeviceTarget, where the
// Loader can fuse the sum into them on b's GPU (it has the checksum
// kernel's slots there), instead of a pass over the bucket here.
func (c *bucketCheck) checkAtLoad(b *Bucket) bool {
	return c.target != nil && onDevice(b.Buf) && c.ld.canSumAtLoad(b.Buf)
}

// checkSum compares the checksum of b's filled bytes with the one the root
// sent: data's for a host bucket (data is nil for a device bucket), else
// the GPU's.
func (c *bucketCheck) checkSum(ctx context.Context, b *Bucket, data []byte) error {
	m := &b.Meta
	var got uint64
	if data != nil {
		got = checksum.SumParallel(data)
	} else {
		dev, err := c.device(b)
		if err != nil {
			return err
		}
		if got, err = dev.sum(ctx, b); err != nil {
			return fmt.Errorf("checksum of bucket %d (version %d): %w", m.Seq, m.Version, err)
		}
	}
	return verifySum(m, got)
}

// verifySum reports a bucket whose bytes' checksum, got, is not the one
// the root sent: the one place where a mismatch is found and told, for
// sums computed here and by load's copies.
func verifySum(m *wire.BucketMeta, got uint64) error {
	if got == m.Checksum {
		return nil
	}
	return fmt.Errorf("bucket %d (version %d, %d bytes) %w: got %x, root sent %x; tensors in it: %s",
		m.Seq, m.Version, m.Length, ErrChecksum, got, m.Checksum, entryNames(m.Entries, 8))
}

func entryNames(es []wire.Entry, limit int) string {
	s := ""
	for i, e := range es {
		if i == limit {
			return s + fmt.Sprintf(" and %d more", len(es)-limit)
		}
		if i > 0 {
			s += ", "
		}
		s += e.Name
	}
	return s
}
