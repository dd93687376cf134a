package stages

import (
	"context"
	"errors"
	"sync"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/wire"
)

// MinBucketSize is the smallest bucket size a sender accepts.
const MinBucketSize = 1 << 10

// Describer is implemented by Sources that can describe themselves; the
// sender puts the description in the first bucket of each round.
type Describer interface {
	SourceInfo() *wire.SourceInfo
}

// Bucket is a bucket buffer with its metadata, travelling through a
// pipeline. The stage that finishes with it last calls Release, which gives
// the buffer back to its Pool; the pipeline releases buckets dropped by a
// failure.
type Bucket struct {
	Meta wire.BucketMeta
	// Buf holds the bucket's bytes. A device bucket's buffer travels
	// fenced (gpu.WithFence) while pack's copies into it may be running.
	Buf mem.Buffer
	// Ack, when set, tells the root that this receiver has loaded the
	// bucket (the metadata bus acknowledgement).
	Ack  func() error
	once sync.Once
	put  func(mem.Buffer)
	// pool, on a receiver, is the pool a direct bucket made without a
	// buffer (Pool.directBucket) takes one from if it needs one
	// (ownBuffer); nil otherwise.
	pool *Pool
	// sum is the checksum of a device bucket being computed on the GPU,
	// which Publish waits for (on a receiver, the checksum of a direct
	// bucket gathered into Buf, which unpack checks); nil otherwise.
	sum *gpu.PendingSum
	// delivered: the load stage handed the bucket to its sinks and
	// acknowledged it (a lent buffer is then given back as done).
	delivered bool
	// srcs, on a receiver, are a direct bucket's entries where they lie
	// in the sender's memory, mapped here (one per entry, nil for an
	// entry of no bytes), when the round's sink copies them from there
	// itself; nil when Buf holds the bucket's bytes.
	srcs []directView
	// turn, on a receiver that takes turns, is a direct bucket's place
	// in its round's turns (turns.go); nil otherwise.
	turn *bucketTurn
	// auth, set when the bucket's round is signed (the group has a
	// secret), holds the run's keys: Publish signs the bucket's metadata
	// with them, unpack checks its MAC. mac is a device bucket's MAC
	// being computed on the GPU, which Publish waits for; nil otherwise.
	auth *auth.Keys
	mac  *pendingMAC
}

// directView is where an entry of a direct bucket lies in this process:
// buf[off:], a mapping of the sender's allocation.
type directView struct {
	buf mem.Buffer
	off int64
}

// ownBuffer gives b, a direct bucket made without a buffer
// (Pool.directBucket), a buffer of its pool to gather its entries into,
// waiting while every buffer is in use; Release gives it back. It does
// nothing for a bucket that has its buffer.
func (b *Bucket) ownBuffer(ctx context.Context) error {
	if b.pool == nil || b.put != nil {
		return nil
	}
	buf, err := b.pool.Get(ctx)
	if err != nil {
		return err
	}
	b.Buf, b.put = buf, b.pool.Put
	return nil
}

// Bytes returns the filled part of a host-memory bucket.
func (b *Bucket) Bytes() []byte { return b.Buf.Host()[:b.Meta.Length] }

// ByteSize is the number of filled bytes; it lets the pipeline count bytes.
func (b *Bucket) ByteSize() int64 { return b.Meta.Length }

// Release gives the bucket's buffer, without its fence, back to its pool.
// Only the first call has an effect.
func (b *Bucket) Release() {
	b.once.Do(func() {
		if b.put != nil {
			b.put(gpu.Unfence(b.Buf))
		}
	})
}

// errNotDelivered is how a receiver gives back a lent buffer of a bucket
// it did not load: its round failed first.
var errNotDelivered = errors.New("this rank did not load the bucket: its round failed first")

// lend makes buf, the root's buffer (transport.Lender), b's buffer until b
// is released: Release then gives buf back to the root, as done once the
// load stage delivered b and as failed otherwise, and b's own buffer back
// to its pool.
func (b *Bucket) lend(buf mem.Buffer, release func(error) error) {
	own, put := b.Buf, b.put
	b.Buf = buf
	b.put = func(mem.Buffer) {
		var cause error
		if !b.delivered {
			cause = errNotDelivered
		}
		release(cause) // a failure to tell the root fails its round there
		if put != nil {
			put(own)
		}
	}
}

// whenReleased has Release call f before it gives the buffer back (to
// destroy a fence's event, give a pending checksum's slot back).
func (b *Bucket) whenReleased(f func()) {
	put := b.put
	b.put = func(buf mem.Buffer) {
		f()
		if put != nil {
			put(buf)
		}
	}
}
