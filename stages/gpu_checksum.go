package stages

import (
	"context"
	"errors"
	"fmt"

	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
)

// Checksums of device buckets.
//
// A device bucket's checksum is computed where its bytes are, by the GPU
// checksum kernel (gpu.Checksummer), which gives checksum.Sum's value:
//
//   - on the root, pack queues it on the copy stream right after the
//     bucket's ready event, so the broadcast does not wait for it, and the
//     bucket carries the pending sum; Publish waits for it (the bucket's
//     copies and the kernel) before it sends the bucket's metadata;
//   - on a receiver, Load queues it on its own stream after the bucket has
//     arrived, and compares before handing any view to the sink.
//
// Where the kernel cannot be used (gpu.ErrNoChecksumKernel says why), both
// sides copy the bucket to pinned host memory and use checksum.SumParallel
// instead: slower, never skipped.

// queueSum queues the checksum of b's filled bytes on the copy stream,
// after everything queued before (the bucket's copies). b then carries the
// pending sum, which Publish waits for; releasing b gives it back. When
// the kernel is unavailable b is left for Publish to sum on the host.
func (f *deviceFill) queueSum(b *Bucket) error {
	b.Meta.HasChecksum = true
	if f.sums == nil && f.sumsWhy == nil {
		f.sums, f.sumsWhy = f.stream.NewChecksummer()
		if f.sumsWhy != nil && !errors.Is(f.sumsWhy, gpu.ErrNoChecksumKernel) {
			err := f.sumsWhy
			f.sums, f.sumsWhy = nil, nil
			return fmt.Errorf("pack: bucket %d: %w", b.Meta.Seq, err)
		}
	}
	if f.sums == nil {
		return nil // Publish sums it on the host
	}
	ps, err := f.sums.Queue(gpu.Unfence(b.Buf), b.Meta.Length)
	if err != nil {
		return fmt.Errorf("pack: queueing bucket %d's checksum: %w", b.Meta.Seq, err)
	}
	b.sum = ps
	put := b.put
	b.put = func(buf mem.Buffer) {
		ps.Close()
		if put != nil {
			put(buf)
		}
	}
	return nil
}

// completeSum fills in the checksum of a device bucket that pack marked
// HasChecksum: the pending GPU sum's value, or, without the kernel, the
// sum of the bytes copied to the host through st (after the bucket's
// fence).
func completeSum(ctx context.Context, b *Bucket, st *hostStaging) error {
	m := &b.Meta
	if !m.HasChecksum || b.Buf.Host() != nil {
		return nil
	}
	if b.sum != nil {
		v, err := b.sum.Wait(ctx)
		if err != nil {
			return fmt.Errorf("checksum of bucket %d (version %d): %w", m.Seq, m.Version, err)
		}
		m.Checksum = v
		return nil
	}
	host, err := st.fetch(ctx, b)
	if err != nil {
		return fmt.Errorf("checksum of bucket %d (version %d) on the host: %w", m.Seq, m.Version, err)
	}
	m.Checksum = checksum.SumParallel(host)
	return nil
}

// checkDeviceSum compares a received device bucket's checksum, computed by
// the GPU kernel on st's stream, with the one the root sent. It reports
// false, checking nothing, when the kernel is unavailable: the caller then
// checks the bytes on the host.
func checkDeviceSum(ctx context.Context, b *Bucket, st *hostStaging) (bool, error) {
	m := &b.Meta
	sums, err := st.checksummer(b)
	if err != nil || sums == nil {
		return false, err
	}
	ps, err := sums.Queue(gpu.Unfence(b.Buf), m.Length)
	if err != nil {
		return false, fmt.Errorf("queueing bucket %d's checksum: %w", m.Seq, err)
	}
	defer ps.Close()
	sum, err := ps.Wait(ctx)
	if err != nil {
		return false, fmt.Errorf("checksum of bucket %d (version %d): %w", m.Seq, m.Version, err)
	}
	return true, sumMismatch(m, sum)
}

// sumMismatch is the error of a bucket whose bytes sum to got instead of
// the checksum the root sent, or nil when they agree.
func sumMismatch(m *BucketMeta, got uint64) error {
	if got == m.Checksum {
		return nil
	}
	return fmt.Errorf("bucket %d (version %d, %d bytes) failed its checksum: got %x, root sent %x; tensors in it: %s",
		m.Seq, m.Version, m.Length, got, m.Checksum, entryNames(m.Entries, 8))
}
