package stages

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mac"
	"github.com/weightcast/weightcast/wire"
)

// The bucket MAC and the signed metadata.
//
// With a group secret (SenderConfig.Auth, ReceiverConfig.Auth: the run's
// keys), every bucket's filled bytes carry a MAC, keyed BLAKE3 under the
// run's bucket key (mac.Sum with auth.Keys.BucketKey) or, where the sender
// is given it (SenderConfig.BucketMAC), Poly1305-AES under the run's
// Poly1305-AES key and a random nonce per bucket (mac.PolySum with
// auth.Keys.BucketPolyKey; chooseMAC draws the nonce into the metadata,
// and every later step computes the MAC the metadata names), and every message
// of the metadata bus, bucket metadata and commit messages alike, is signed
// with HMAC-SHA256 under the run's message key over its sequence number and
// bytes (auth.Keys.MessageMAC). The metadata carries the bucket's MAC, so
// one signature covers the bucket's sequence number, version, length,
// is_last, entries and bytes. Without a secret nothing of this happens and
// the wire is unchanged. docs/protocol.md gives the wire form.
//
// Each step has one place, beside the checksum's:
//
//   - pack computes the MAC where the bytes are: on every core for a host
//     bucket (macHost); for a device bucket the GPU MAC kernels, queued on a
//     stream of its own after the bucket's ready event, so that neither the
//     copies of the next bucket nor the transport's broadcast on the GPU
//     wait for it (deviceFill.queueMAC). Where the kernel is unavailable,
//     the bucket is copied back and its MAC computed on the CPU.
//   - publish waits for a pending MAC and signs the metadata (awaitMAC,
//     wire.Seal); the root signs its commit message the same way.
//   - subscribe and AwaitCommit open every message (wire.Open): a message
//     that is not signed, or whose signature does not verify, fails the
//     round naming the bucket or the version.
//   - unpack checks the bytes' MAC, on the GPU for a device bucket, before
//     any sink sees the bucket (bucketCheck.checkMAC), also where the
//     checksum is left to load's copies, and in a buffer borrowed from the
//     root (transport.Lender). A mismatch fails the round there, so the
//     version is committed nowhere and the last committed one stays.
//
// A direct bucket (direct.go) has no bytes of its own: its MAC is that of
// the bucket as pack would fill it with zeros between the entries, which
// start on MAC chunks (1 KiB) there, computed where the entries lie
// (gpu.Gather.CopyMACLayout or CopyPolyLayout, layoutMAC). It takes the place of the
// checksum, which it proves more than (a direct bucket with a MAC carries
// no checksum):
//
//   - pack computes it from the sender's tensors, on the copy stream
//     (deviceFill.macDirect), where the checksum would have been summed;
//   - each receiver computes it in the pass that reads the entries: the
//     copies that gather them into its buffer (gatherDirect), the pass
//     over them for an InPlaceReader (sumInPlace), or load's copies into
//     the round's one DeviceTarget (copyToTarget, as that sink's checksum
//     is); unpack, or load for a DeviceTarget, compares (verifyMAC).

// bucketKey is the run's keyed-BLAKE3 bucket key.
func bucketKey(keys *auth.Keys) *mac.Key {
	k := mac.Key(keys.BucketKey())
	return &k
}

// polyKey is the run's Poly1305-AES bucket key, made once per run's keys
// (its AES schedule and powers of r take microseconds, every bucket of
// the run uses it) and kept for the last keys asked for: a process runs
// one run at a time, and a key is safe for concurrent use.
func polyKey(keys *auth.Keys) *mac.PolyKey {
	lastPolyKey.Lock()
	defer lastPolyKey.Unlock()
	if lastPolyKey.keys != keys {
		b := keys.BucketPolyKey()
		lastPolyKey.keys, lastPolyKey.key = keys, mac.NewPolyKey(&b)
	}
	return lastPolyKey.key
}

// lastPolyKey is polyKey's one entry.
var lastPolyKey struct {
	sync.Mutex
	keys *auth.Keys
	key  *mac.PolyKey
}

// chooseMAC marks b, of a signed round, to carry a MAC of kind: the
// sender's one place that says which. For Poly1305-AES it draws the
// bucket's nonce into its metadata; every later step, the sender's and
// the receivers', computes the MAC that the metadata says (MACNonce).
func chooseMAC(b *Bucket, keys *auth.Keys, kind mac.Kind) {
	b.auth, b.Meta.HasMAC, b.Meta.MACNonce = keys, true, nil
	if kind == mac.Poly1305AES {
		n := mac.RandomNonce()
		b.Meta.MACNonce = &n
	}
}

// hostMAC returns the MAC under keys of data, a bucket's filled bytes, of
// the kind m says, computed on the CPU.
func hostMAC(m *wire.BucketMeta, keys *auth.Keys, data []byte) mac.Tag {
	if m.MACNonce != nil {
		return mac.PolySumParallel(polyKey(keys), m.MACNonce, data).AsTag()
	}
	return mac.SumParallel(bucketKey(keys), data)
}

// macHost computes host bucket b's MAC of kind of data, its filled bytes,
// when the round is signed (keys set), and marks b signed.
func macHost(b *Bucket, keys *auth.Keys, kind mac.Kind, data []byte) {
	if keys == nil {
		return
	}
	chooseMAC(b, keys, kind)
	b.Meta.MAC = hostMAC(&b.Meta, keys, data)
}

// queueMAC queues, when the round is signed (keys set), the MAC of kind
// of device bucket b's filled bytes on the MAC's own stream, after b's
// ready event (its fence), and marks b signed. b then carries the pending
// MAC, which publish waits for, or queueMAC itself when wait is set;
// releasing b gives it back.
func (f *deviceFill) queueMAC(ctx context.Context, b *Bucket, keys *auth.Keys, kind mac.Kind, wait bool) error {
	if keys == nil {
		return nil
	}
	m := &b.Meta
	switch {
	case m.Direct != nil:
		return fmt.Errorf("pack: bucket %d is direct, which a group with a secret cannot send: it has no bytes of its own to compute a MAC of; pack every bucket (PackConfig.Direct false)", m.Seq)
	case gpu.FenceOf(b.Buf) == nil:
		return fmt.Errorf("pack: bucket %d has no ready event to order its MAC after", m.Seq)
	}
	chooseMAC(b, keys, kind)
	p, err := f.macs.queue(ctx, f.stream.Device(), b, keys)
	if err != nil {
		return fmt.Errorf("pack: the MAC of bucket %d (version %d): %w", m.Seq, m.Version, err)
	}
	b.mac = p
	b.whenReleased(p.close)
	if wait {
		return awaitMAC(ctx, b)
	}
	return nil
}

// awaitMAC completes b's MAC if it is pending on the GPU.
func awaitMAC(ctx context.Context, b *Bucket) error {
	if b.mac == nil {
		return nil
	}
	tag, err := b.mac.wait(ctx)
	if err != nil {
		return fmt.Errorf("the MAC of bucket %d (version %d): %w", b.Meta.Seq, b.Meta.Version, err)
	}
	b.Meta.MAC = tag
	return nil
}

// checkMAC compares, when b's round is signed (b.auth), the MAC of b's
// filled bytes with the one the root sent: the one receive computed for a
// direct bucket (b.mac), data's for a host bucket (data is nil for a
// device bucket), else one computed on b's GPU.
func (c *bucketCheck) checkMAC(ctx context.Context, b *Bucket, data []byte) error {
	if b.auth == nil {
		return nil
	}
	m := &b.Meta
	if !m.HasMAC {
		return fmt.Errorf("bucket %d (version %d) carries no MAC: %w: this rank has a group secret, the root sent the bucket without one", m.Seq, m.Version, auth.ErrFailed)
	}
	var got mac.Tag
	var err error
	switch {
	case b.mac != nil:
		if got, err = b.mac.wait(ctx); err != nil {
			return fmt.Errorf("the MAC of direct bucket %d (version %d): %w", m.Seq, m.Version, err)
		}
	case data != nil:
		got = hostMAC(m, b.auth, data)
	default:
		dev, err := c.device(b)
		if err != nil {
			return err
		}
		p, err := dev.macs.queue(ctx, dev.dev, b, b.auth)
		if err != nil {
			return fmt.Errorf("the MAC of bucket %d (version %d): %w", m.Seq, m.Version, err)
		}
		defer p.close()
		if got, err = p.wait(ctx); err != nil {
			return fmt.Errorf("the MAC of bucket %d (version %d): %w", m.Seq, m.Version, err)
		}
	}
	return verifyMAC(m, got)
}

// verifyMAC reports a bucket whose bytes' MAC, got, is not the one the
// root sent: the one place where a mismatch is found and told, for MACs
// computed by unpack, receive and load's copies.
func verifyMAC(m *wire.BucketMeta, got mac.Tag) error {
	if got.Equal(m.MAC) {
		return nil
	}
	return fmt.Errorf("bucket %d (version %d, %d bytes) failed its MAC: %w: its bytes are not the ones the root sent, so they were changed on the way (the checksum does not catch a change made on purpose); tensors in it: %s",
		m.Seq, m.Version, m.Length, auth.ErrFailed, entryNames(m.Entries, 8))
}

// layoutMAC queues, on s, the stream of g, the MAC under keys of direct
// bucket b, of the kind its metadata says: the layout l of its entries,
// read where they lie and copied where l says (gpu.Gather.CopyMACLayout
// or CopyPolyLayout with sm's kernels of s, or on the host where they are
// unavailable).
func layoutMAC(ctx context.Context, g *gpu.Gather, sm *streamMACer, s *gpu.Stream, b *Bucket, l *gpu.Layout, keys *auth.Keys) (*pendingMAC, error) {
	m := &b.Meta
	if m.MACNonce != nil {
		polys, err := sm.poly(s)
		if err != nil {
			return nil, err
		}
		p, err := g.CopyPolyLayout(ctx, l, m.Length, polys, polyKey(keys), m.MACNonce)
		if err != nil {
			return nil, fmt.Errorf("the MAC of direct bucket %d (version %d): %w", m.Seq, m.Version, err)
		}
		return &pendingMAC{poly: p}, nil
	}
	macs, err := sm.get(s)
	if err != nil {
		return nil, err
	}
	p, err := g.CopyMACLayout(ctx, l, m.Length, macs, bucketKey(keys))
	if err != nil {
		return nil, fmt.Errorf("the MAC of direct bucket %d (version %d): %w", m.Seq, m.Version, err)
	}
	return &pendingMAC{p: p}, nil
}

// queueLayoutMAC queues direct bucket b's MAC with layoutMAC; b then
// carries it (b.mac), and releasing b gives it back.
func queueLayoutMAC(ctx context.Context, g *gpu.Gather, sm *streamMACer, s *gpu.Stream, b *Bucket, l *gpu.Layout, keys *auth.Keys) error {
	p, err := layoutMAC(ctx, g, sm, s, b, l, keys)
	if err != nil {
		return err
	}
	b.mac = p
	b.whenReleased(b.mac.close)
	return nil
}

// streamMACer holds the MAC kernels of one stream, keyed BLAKE3's
// (gpu.MACer) and Poly1305-AES's (gpu.PolyMACer), each made at its first
// use; where one is unavailable it stays nil (why, whyPoly say why) and
// those MACs are computed on the host. Its zero value is ready to use.
type streamMACer struct {
	m                 *gpu.MACer
	why               error
	polys             *gpu.PolyMACer
	whyPoly           error
	madeMAC, madePoly bool
}

// get returns the MACer of s, or nil where the kernels are unavailable.
func (sm *streamMACer) get(s *gpu.Stream) (*gpu.MACer, error) {
	if !sm.madeMAC {
		m, err := s.NewMACer()
		switch {
		case err == nil:
			sm.m = m
		case errors.Is(err, gpu.ErrNoMACKernel):
			sm.why = err
		default:
			return nil, err
		}
		sm.madeMAC = true
	}
	return sm.m, nil
}

// poly returns the PolyMACer of s, or nil where the kernels are
// unavailable.
func (sm *streamMACer) poly(s *gpu.Stream) (*gpu.PolyMACer, error) {
	if !sm.madePoly {
		m, err := s.NewPolyMACer()
		switch {
		case err == nil:
			sm.polys = m
		case errors.Is(err, gpu.ErrNoPolyKernel):
			sm.whyPoly = err
		default:
			return nil, err
		}
		sm.madePoly = true
	}
	return sm.polys, nil
}

// close frees the kernels' memory once no launch uses it, bounded by ctx;
// where that wait fails it keeps what it could not free, for a later
// close to retry.
func (sm *streamMACer) close(ctx context.Context) error {
	if sm.m != nil {
		if err := sm.m.Close(ctx); err != nil {
			return err
		}
		sm.m = nil
	}
	if sm.polys != nil {
		if err := sm.polys.Close(ctx); err != nil {
			return err
		}
	}
	*sm = streamMACer{}
	return nil
}

// pendingMAC is the MAC of a device bucket: pending on the GPU, keyed
// BLAKE3 (p) or Poly1305-AES (poly), or computed on the host where the
// kernels are unavailable (tag).
type pendingMAC struct {
	p    *gpu.PendingMAC
	poly *gpu.PendingPolyMAC
	tag  mac.Tag
}

func (p *pendingMAC) wait(ctx context.Context) (mac.Tag, error) {
	switch {
	case p.p != nil:
		return p.p.Wait(ctx)
	case p.poly != nil:
		t, err := p.poly.Wait(ctx)
		return t.AsTag(), err
	}
	return p.tag, nil
}

func (p *pendingMAC) close() {
	if p.p != nil {
		p.p.Close()
	}
	if p.poly != nil {
		p.poly.Close()
	}
}

// deviceMAC computes the MACs of device buckets on a stream of its own,
// made at the first: with the GPU MAC kernel (gpu.MACer) or, where that is
// unavailable (gpu.NewMACer says why), on the CPU after copying the bucket
// back. Its zero value is ready to use; close frees what it made. It is
// used by one goroutine at a time, for buckets of one GPU.
type deviceMAC struct {
	dev      *gpu.CUDADevice
	stream   *gpu.Stream   // nil until the first MAC
	macs     streamMACer   // the stream's MACer, or why the kernel is unavailable
	readback *gpu.Readback // nil until needed
}

// queue queues the MAC under keys of device bucket b's filled bytes, of
// the kind its metadata says, after b's fence, on the stream of d, of
// dev, b's GPU.
func (d *deviceMAC) queue(ctx context.Context, dev *gpu.CUDADevice, b *Bucket, keys *auth.Keys) (*pendingMAC, error) {
	m := &b.Meta
	n := m.Length
	if n == 0 {
		return &pendingMAC{tag: hostMAC(m, keys, nil)}, nil
	}
	if d.stream == nil {
		s, err := dev.NewStream()
		if err != nil {
			return nil, err
		}
		d.dev, d.stream = dev, s
	}
	var why error // why the MAC is computed on the host
	if m.MACNonce != nil {
		polys, err := d.macs.poly(d.stream)
		if err != nil {
			return nil, err
		}
		if polys != nil {
			p, err := polys.Queue(b.Buf, n, polyKey(keys), m.MACNonce) // after b's fence
			if err != nil {
				return nil, err
			}
			return &pendingMAC{poly: p}, nil
		}
		why = d.macs.whyPoly
	} else {
		macer, err := d.macs.get(d.stream)
		if err != nil {
			return nil, err
		}
		if macer != nil {
			p, err := macer.Queue(b.Buf, n, bucketKey(keys)) // after b's fence
			if err != nil {
				return nil, err
			}
			return &pendingMAC{p: p}, nil
		}
		why = d.macs.why
	}
	if d.readback == nil {
		d.readback = d.dev.NewReadback()
	}
	host, err := d.readback.Read(ctx, b.Buf, int(n)) // after b's fence
	if err != nil {
		return nil, fmt.Errorf("on the host (%v): %w", why, err)
	}
	return &pendingMAC{tag: hostMAC(m, keys, host)}, nil
}

// close frees the stream, the kernel's memory and the pinned memory once
// nothing queued on them runs, bounded by ctx or, once ctx is done, by
// finalWait. On a failed wait it frees nothing a MAC may still use.
func (d *deviceMAC) close(ctx context.Context) error {
	ctx, cancel := bounded(ctx)
	defer cancel()
	var errs []error
	if d.readback != nil {
		errs = append(errs, d.readback.Close(ctx))
		d.readback = nil
	}
	if d.stream == nil {
		return errors.Join(errs...)
	}
	if err := d.stream.Sync(ctx); err != nil {
		return errors.Join(append(errs, fmt.Errorf("a bucket MAC still running; leaving its memory allocated: %w", err))...)
	}
	errs = append(errs, d.macs.close(ctx), d.stream.Close())
	d.stream = nil
	return errors.Join(errs...)
}
