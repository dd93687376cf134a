package source

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/safetensors"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/wire"
)

// ErrChanged is wrapped by the errors of a Checkpoint whose files were
// truncated, modified or replaced after it was opened. The round that sees
// it fails; open the checkpoint again.
var ErrChanged = errors.New("checkpoint changed on disk after it was opened")

// CheckpointOption adjusts OpenCheckpoint.
type CheckpointOption func(*checkpointOptions)

type checkpointOptions struct {
	readAhead int64
	limits    safetensors.Limits
}

// WithReadAhead turns on read-ahead: before each read, a Checkpoint asks
// the kernel to start reading up to bytes beyond it (posix_fadvise
// POSIX_FADV_WILLNEED, Linux only), across file boundaries, so that the
// disk reads the next tensors while the current ones are packed. It holds
// no memory of this process: the pages go to the page cache. 0 (the
// default) leaves reading ahead to the kernel.
//
// It is off by default because it did not help where it was measured: a
// round reads each tensor with one large pread while the previous bucket
// is being sent, which already overlaps the disk with the transfer, and a
// cold 1 GiB checkpoint synced at the speed of a plain sequential read
// without it, and 10-15% slower with a 16 or 64 MiB window (virtio disks;
// from the page cache it made no difference). It may help on storage
// where one reader cannot keep the device busy (network file systems);
// measure with BenchmarkCheckpoint before turning it on.
func WithReadAhead(bytes int64) CheckpointOption {
	return func(o *checkpointOptions) { o.readAhead = max(0, bytes) }
}

// WithCheckpointLimits sets the limits the safetensors headers are checked
// against (see safetensors.Limits).
func WithCheckpointLimits(l safetensors.Limits) CheckpointOption {
	return func(o *checkpointOptions) { o.limits = l }
}

// Checkpoint is a stages.Source over a safetensors checkpoint on disk: one
// .safetensors file, or a Hugging Face directory of shards with its
// model.safetensors.index.json (anything safetensors.OpenModel opens).
//
// It streams: each Tensor it yields has a Reader over that tensor's byte
// range in its file, so Pack reads the bytes straight into a bucket (the
// kernel's page cache is the only staging) and the model is never held in
// memory. Tensors come in shard order, then file offset. A Checkpoint
// describes itself (SourceInfo, a stages.Describer) so that a receiver can
// write the same files back (sink.WriteSafetensors).
//
// The files are opened once and read in every round. If one is truncated,
// modified or replaced in place while the Checkpoint is open, reads fail
// with an error wrapping ErrChanged that names the file and the tensor,
// and the round fails; a file replaced by renaming a new one over
// it is not seen (the open file is still read). A Checkpoint is safe for
// concurrent use. Close it when done.
type Checkpoint struct {
	path    string
	files   []*ckptFile
	tensors []*stages.Tensor
	byName  map[string]int
	info    *wire.SourceInfo
	size    int64
	ra      *readAhead

	closeOnce sync.Once
	closeErr  error
}

// ckptFile is one open shard.
type ckptFile struct {
	path  string
	f     *os.File
	size  int64
	mtime time.Time
	// data is the absolute byte range of the data region; vstart is where
	// it begins in the checkpoint's virtual concatenation of data regions.
	dataOff, dataEnd, vstart int64
}

// OpenCheckpoint opens the checkpoint at path (a .safetensors file, an
// index file, or a directory) and validates every header (see
// safetensors.OpenModel); errors name the file and the tensor. It reads no
// tensor bytes.
func OpenCheckpoint(path string, opts ...CheckpointOption) (*Checkpoint, error) {
	var o checkpointOptions
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	m, err := safetensors.OpenModel(path, safetensors.WithLimits(o.limits))
	if err != nil {
		return nil, err
	}
	defer m.Close()
	c := &Checkpoint{path: path, byName: map[string]int{}}
	shards, names := m.Shards(), m.ShardNames()
	var vpos int64
	for _, sf := range shards {
		cf, err := openShard(sf, vpos, o.limits)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.files = append(c.files, cf)
		vpos += cf.dataEnd - cf.dataOff
	}
	c.size = vpos
	if o.readAhead > 0 && fadviseSupported {
		c.ra = &readAhead{window: o.readAhead, files: c.files, total: vpos}
	}
	for _, mt := range m.Tensors() {
		cf := c.files[mt.Shard]
		c.byName[mt.Name] = len(c.tensors)
		c.tensors = append(c.tensors, &stages.Tensor{
			Name: mt.Name, DType: mt.DType, Shape: mt.Shape,
			Reader: &ckptReader{c: c, file: cf, name: mt.Name, off: mt.Offset, size: mt.Size},
		})
	}
	c.info, err = describe(m, shards, names)
	if err == nil {
		err = checkDescription(path, c.info)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// maxDescription is the most bytes a Checkpoint's encoded SourceInfo may
// take: it travels in the metadata of every round's first bucket, which
// receivers refuse past MaxMetaSize, and leaves the rest of that room to
// the bucket's own entries.
const maxDescription = wire.MaxMetaSize / 2

// checkDescription refuses, at open, a checkpoint whose description could
// not reach the receivers, instead of failing each round late.
func checkDescription(path string, info *wire.SourceInfo) error {
	b, err := json.Marshal(info)
	if err != nil {
		return &safetensors.Error{File: path, Err: fmt.Errorf("encoding the checkpoint's description: %w", err)}
	}
	if len(b) > maxDescription {
		return &safetensors.Error{File: path, Err: fmt.Errorf("%w: the checkpoint's description (its metadata and every file's tensor names, dtypes and shapes) encodes to %d bytes, more than the %d bytes it may take in a round's first bucket metadata (receivers decode at most %d); shorten its __metadata__ or split its tensors over several checkpoints",
			safetensors.ErrLimit, len(b), maxDescription, wire.MaxMetaSize)}
	}
	return nil
}

// openShard opens the file of sf a second time for this Checkpoint's own
// reads and checks that it is the file whose header sf validated: a file
// replaced between the two opens is refused.
func openShard(sf *safetensors.File, vstart int64, lim safetensors.Limits) (*ckptFile, error) {
	path := sf.Path()
	f, err := os.Open(path)
	if err != nil {
		return nil, &safetensors.Error{File: path, Err: err}
	}
	fail := func(err error) (*ckptFile, error) {
		f.Close()
		return nil, &safetensors.Error{File: path, Err: err}
	}
	st, err := f.Stat()
	if err != nil {
		return fail(err)
	}
	changed := fmt.Errorf("%w: the file was modified or replaced while it was being opened; open the checkpoint again", ErrChanged)
	if st.Size() != sf.Size() {
		return fail(changed)
	}
	hdr := make([]byte, sf.DataOffset()-8)
	if _, err := f.ReadAt(hdr, 8); err != nil {
		return fail(changed)
	}
	h, err := safetensors.ParseHeader(hdr, safetensors.WithLimits(lim))
	if err != nil || !sameHeader(h, sf) {
		return fail(changed)
	}
	cf := &ckptFile{path: path, f: f, size: st.Size(), mtime: st.ModTime(), dataOff: h.DataOffset(), dataEnd: h.DataOffset() + h.DataSize, vstart: vstart}
	return cf, nil
}

func sameHeader(h *safetensors.Header, sf *safetensors.File) bool {
	ts := sf.Tensors()
	if h.HeaderLen != sf.HeaderLen() || len(h.Tensors) != len(ts) || !maps.Equal(h.Metadata, sf.Metadata()) || !slices.Equal(h.MetadataKeys, sf.MetadataKeys()) {
		return false
	}
	for i, t := range h.Tensors {
		u := ts[i]
		if t.Name != u.Name || t.DType != u.DType || t.Offset != u.Offset || t.Size != u.Size || !slices.Equal(t.Shape, u.Shape) {
			return false
		}
	}
	return true
}

// describe builds the SourceInfo of an open model.
func describe(m *safetensors.Model, shards []*safetensors.File, names []string) (*wire.SourceInfo, error) {
	info := &wire.SourceInfo{Format: "safetensors"}
	first := shards[0]
	info.Metadata, info.MetadataKeys = first.Metadata(), first.MetadataKeys()
	for i, sf := range shards {
		n := sf.Len()
		si := wire.ShardInfo{File: names[i], Tensors: make([]string, 0, n), DTypes: make([]dtype.DType, 0, n), Shapes: make([][]int64, 0, n)}
		for _, t := range sf.Tensors() {
			si.Tensors = append(si.Tensors, t.Name)
			si.DTypes = append(si.DTypes, t.DType)
			si.Shapes = append(si.Shapes, append([]int64{}, t.Shape...)) // [] for a scalar, not null
		}
		if md, keys := sf.Metadata(), sf.MetadataKeys(); !maps.Equal(md, info.Metadata) || !slices.Equal(keys, info.MetadataKeys) {
			si.Metadata, si.MetadataKeys = md, keys
		}
		info.Shards = append(info.Shards, si)
	}
	if idx := m.Index(); idx != nil && idx.Metadata != nil {
		raw, err := json.Marshal(idx.Metadata)
		if err != nil {
			return nil, &safetensors.Error{File: m.IndexPath(), Err: fmt.Errorf("encoding the index metadata: %w", err)}
		}
		info.IndexMetadata = raw
	}
	return info, nil
}

// Tensors emits every tensor of the checkpoint: shard order, then file
// offset. It first checks that no file changed since it was opened.
func (c *Checkpoint) Tensors(ctx context.Context, emit func(*stages.Tensor) error) error {
	for _, cf := range c.files {
		if err := cf.check(""); err != nil {
			return err
		}
	}
	for _, t := range c.tensors {
		if err := emit(t); err != nil {
			return err
		}
	}
	return nil
}

// SourceInfo describes the checkpoint: format "safetensors", the first
// file's __metadata__ with its key order, each file with its tensors in
// file order with their dtypes and shapes (and its own metadata where it
// differs from the first's), and
// the index's "metadata" object. The result is shared and must not be
// modified.
func (c *Checkpoint) SourceInfo() *wire.SourceInfo { return c.info }

// Lookup returns the tensor called name (for sink.Verify).
func (c *Checkpoint) Lookup(name string) (*stages.Tensor, bool) {
	i, ok := c.byName[name]
	if !ok {
		return nil, false
	}
	return c.tensors[i], true
}

// List returns every tensor in the order Tensors emits them. The slice is
// a copy; the tensors are shared and must not be modified.
func (c *Checkpoint) List() []*stages.Tensor { return slices.Clone(c.tensors) }

// Len is the number of tensors.
func (c *Checkpoint) Len() int { return len(c.tensors) }

// Size is the total byte length of the tensors.
func (c *Checkpoint) Size() int64 { return c.size }

// Path is the path the checkpoint was opened with.
func (c *Checkpoint) Path() string { return c.path }

// Close closes the files. It is idempotent; reads after Close fail.
func (c *Checkpoint) Close() error {
	c.closeOnce.Do(func() {
		var errs []error
		for _, cf := range c.files {
			errs = append(errs, cf.f.Close())
		}
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}

// check fails when the file's size or modification time differ from when
// it was opened, with an error naming the file and tensor (if any).
func (cf *ckptFile) check(tensor string) error {
	if err := cf.changed(); err != nil {
		return &safetensors.Error{File: cf.path, Tensor: tensor, Err: err}
	}
	return nil
}

func (cf *ckptFile) changed() error {
	st, err := cf.f.Stat()
	if err != nil {
		return err
	}
	if st.Size() != cf.size || !st.ModTime().Equal(cf.mtime) {
		return fmt.Errorf("%w: it was %d bytes modified at %s, it is now %d bytes modified at %s; open the checkpoint again",
			ErrChanged, cf.size, cf.mtime.Format(time.RFC3339Nano), st.Size(), st.ModTime().Format(time.RFC3339Nano))
	}
	return nil
}

// ckptReader reads one tensor's bytes from its file.
type ckptReader struct {
	c         *Checkpoint
	file      *ckptFile
	name      string
	off, size int64 // absolute offset and length in the file
}

// ReadAt reads p at offset off within the tensor. Reading the tensor's last
// byte also checks that the file did not change since it was opened, so a
// file modified in place under a running round fails that round.
func (r *ckptReader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off > r.size || int64(len(p)) > r.size-off {
		return 0, &safetensors.Error{File: r.file.path, Tensor: r.name, Err: fmt.Errorf("read of %d bytes at %d is outside the tensor's %d bytes", len(p), off, r.size)}
	}
	if len(p) == 0 {
		return 0, nil
	}
	abs := r.off + off
	if ra := r.c.ra; ra != nil {
		ra.reading(r.file.vstart+abs-r.file.dataOff, int64(len(p)))
	}
	n, err := r.file.f.ReadAt(p, abs)
	if n < len(p) {
		if err == nil || errors.Is(err, io.EOF) {
			err = r.file.changed()
			if err == nil {
				err = ErrChanged
			}
			err = fmt.Errorf("%w (%w: read %d of %d bytes at file offset %d)", err, safetensors.ErrTruncated, n, len(p), abs)
		}
		return n, &safetensors.Error{File: r.file.path, Tensor: r.name, Err: err}
	}
	if off+int64(n) == r.size {
		if err := r.file.check(r.name); err != nil {
			return 0, err // n = 0: Tensor.ReadAt ignores errors of full reads
		}
	}
	return n, nil
}

// readAhead asks the kernel to read a window of the checkpoint ahead of
// the bytes being read, across file boundaries, in the order Tensors emits
// them. It holds no data: the pages go to the page cache.
type readAhead struct {
	window int64
	files  []*ckptFile
	total  int64 // virtual length: all data regions end to end

	mu       sync.Mutex
	from     int64 // virtual offset of the last read
	advised  int64 // virtual offset up to which read-ahead was asked
	requests int64 // advice calls made, for tests
}

// reading is called before a read of n bytes at virtual offset v. When less
// than half the window lies advised beyond the read, it advises up to a
// whole window beyond it (the read itself included, so a cold read is
// queued in one go). A read before the last one, or past the advised range,
// restarts the window there (a new round, another reader).
func (ra *readAhead) reading(v, n int64) {
	end := v + n
	ra.mu.Lock()
	if v < ra.from || v > ra.advised {
		ra.advised = v
	}
	ra.from = v
	if ra.advised-end >= ra.window/2 || ra.advised >= ra.total {
		ra.mu.Unlock()
		return
	}
	lo, hi := max(ra.advised, end), min(end+ra.window, ra.total)
	ra.advised = hi
	ra.requests++
	ra.mu.Unlock()
	for _, cf := range ra.files {
		flen := cf.dataEnd - cf.dataOff
		a, b := max(lo, cf.vstart), min(hi, cf.vstart+flen)
		if a < b {
			// A hint: a failure costs only the overlap it would have bought.
			_ = fadviseWillNeed(cf.f, cf.dataOff+a-cf.vstart, b-a)
		}
	}
}
