package safetensors

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"unicode/utf8"
)

// Writer writes one safetensors file. Create writes the header; the caller
// then writes every tensor's bytes, sequentially with Write or at any
// offsets with WriteAt / WriteTensorAt (also from several goroutines at
// once); Close checks that every byte was written exactly once and moves
// the file into place.
//
// The file is written under a temporary name in the destination directory
// and renamed to its path by a successful Close, so a reader never sees a
// half-written file at path. Close on failure, or Abort, removes it.
type Writer struct {
	path, tmp string
	fs        FS
	f         FSFile
	tensors   []Tensor
	byName    map[string]int
	dataStart int64
	dataSize  int64
	sync      bool

	inflight sync.WaitGroup
	mu       sync.Mutex
	done     spans // written ranges, relative to the data region
	cursor   int64 // next position of Write, relative to the data region
	err      error // first failure; later writes fail with it
	closed   bool
	closeErr error
}

// Create starts a safetensors file at path holding tensors in the order
// given, with data offsets assigned contiguously in that order, and
// metadata (nil writes no "__metadata__" key; an empty non-nil map writes
// an empty one). The header is written as the reference implementation
// writes it (see the package documentation), padded with spaces to a
// multiple of 8 bytes. Options: WithMetadataOrder, WithLimits, WithoutSync.
func Create(path string, tensors []TensorInfo, metadata map[string]string, opts ...Option) (*Writer, error) {
	o := buildOptions(opts)
	keys, err := checkLayout(tensors, metadata, o)
	if err != nil {
		return nil, withFile(err, path)
	}
	if metadata != nil {
		if n := len(appendMetadata(nil, metadata, keys)); int64(n) > o.limits.MaxMetadataBytes {
			return nil, errorf(path, "", ErrLimit, "%s would be %d bytes, more than the limit of %d (Limits.MaxMetadataBytes)", MetadataKey, n, o.limits.MaxMetadataBytes)
		}
	}
	hdr, begins, dataSize, err := encodeHeader(tensors, metadata, keys)
	if err != nil {
		return nil, withFile(err, path)
	}
	if int64(len(hdr)-8) > o.limits.MaxHeaderBytes {
		return nil, errorf(path, "", ErrHeaderSize, "the header would be %d bytes, more than the limit of %d", len(hdr)-8, o.limits.MaxHeaderBytes)
	}
	dataStart := int64(len(hdr))
	w := &Writer{
		path:      path,
		tensors:   make([]Tensor, len(tensors)),
		byName:    make(map[string]int, len(tensors)),
		dataStart: dataStart,
		dataSize:  dataSize,
		sync:      !o.noSync,
		fs:        o.fs,
	}
	for i, t := range tensors {
		n, _ := t.DType.Bytes(t.Shape) // checked by checkLayout
		w.tensors[i] = Tensor{Name: t.Name, DType: t.DType, Shape: slices.Clone(t.Shape), Offset: dataStart + begins[i], Size: n}
		w.byName[t.Name] = i
	}
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := o.fs.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return nil, &Error{File: path, Err: err}
	}
	w.f, w.tmp = f, f.Name()
	fail := func(err error) (*Writer, error) {
		f.Close()
		o.fs.Remove(w.tmp)
		return nil, &Error{File: path, Err: err}
	}
	if err := f.Chmod(0o644); err != nil {
		return fail(err)
	}
	if _, err := f.WriteAt(hdr, 0); err != nil {
		return fail(err)
	}
	if err := f.Truncate(dataStart + dataSize); err != nil {
		return fail(err)
	}
	return w, nil
}

// checkLayout validates what Create is given and returns the metadata key
// order to write.
func checkLayout(tensors []TensorInfo, metadata map[string]string, o options) ([]string, error) {
	lim := o.limits
	if len(tensors) > lim.MaxTensors {
		return nil, errorf("", "", ErrLimit, "%d tensors, more than the limit of %d", len(tensors), lim.MaxTensors)
	}
	seen := make(map[string]struct{}, len(tensors))
	for _, t := range tensors {
		switch {
		case t.Name == "":
			return nil, errorf("", "", ErrName, "a tensor has an empty name")
		case t.Name == MetadataKey:
			return nil, errorf("", t.Name, ErrName, "%q is reserved for the metadata map", MetadataKey)
		case !utf8.ValidString(t.Name):
			return nil, errorf("", t.Name, ErrName, "name is not valid UTF-8")
		case len(t.Name) > lim.MaxNameBytes:
			return nil, errorf("", t.Name, ErrLimit, "name is %d bytes, more than the limit of %d", len(t.Name), lim.MaxNameBytes)
		case !t.DType.Valid():
			return nil, errorf("", t.Name, ErrDType, "invalid dtype %v", t.DType)
		case len(t.Shape) > lim.MaxRank:
			return nil, errorf("", t.Name, ErrLimit, "shape has %d dimensions, more than the limit of %d", len(t.Shape), lim.MaxRank)
		}
		if _, dup := seen[t.Name]; dup {
			return nil, errorf("", t.Name, ErrDuplicate, "the tensor list names this tensor twice")
		}
		seen[t.Name] = struct{}{}
		for _, d := range t.Shape {
			if d < 0 {
				return nil, errorf("", t.Name, ErrNegativeDim, "shape %v has a negative dimension", t.Shape)
			}
		}
		if _, err := t.DType.Bytes(t.Shape); err != nil {
			return nil, errorf("", t.Name, ErrShape, "%v", err)
		}
	}
	for k, v := range metadata {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return nil, errorf("", "", ErrHeaderJSON, "metadata key %q or its value is not valid UTF-8", shorten(k))
		}
	}
	if o.metadataOrder == nil {
		return slices.Sorted(maps.Keys(metadata)), nil
	}
	keys := o.metadataOrder
	ok := len(keys) == len(metadata)
	seenKey := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		if _, in := metadata[k]; !in {
			ok = false
		}
		if _, dup := seenKey[k]; dup {
			ok = false
		}
		seenKey[k] = struct{}{}
	}
	if !ok {
		return nil, errorf("", "", ErrHeaderJSON, "metadata order %q does not list the %d metadata keys exactly once", keys, len(metadata))
	}
	return keys, nil
}

// Path returns the final path of the file.
func (w *Writer) Path() string { return w.path }

// DataOffset returns the absolute offset of the data region.
func (w *Writer) DataOffset() int64 { return w.dataStart }

// Size returns the size the file will have.
func (w *Writer) Size() int64 { return w.dataStart + w.dataSize }

// Tensors returns the tensors with their assigned absolute offsets, in
// file order. The shapes are shared and must not be modified.
func (w *Writer) Tensors() []Tensor { return slices.Clone(w.tensors) }

// Tensor returns the tensor called name with its assigned offset.
func (w *Writer) Tensor(name string) (Tensor, bool) {
	i, ok := w.byName[name]
	if !ok {
		return Tensor{}, false
	}
	return w.tensors[i], true
}

// reserve claims the data-region range [rel, rel+n) for a write in flight.
func (w *Writer) reserve(tensor string, rel, n int64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reserveLocked(tensor, rel, n)
}

func (w *Writer) reserveLocked(tensor string, rel, n int64) error {
	switch {
	case w.closed:
		return errorf(w.path, tensor, ErrWrite, "write after Close or Abort")
	case w.err != nil:
		return &Error{File: w.path, Tensor: tensor, Err: fmt.Errorf("%w: the writer failed earlier: %w", ErrWrite, w.err)}
	case rel < 0 || n > w.dataSize-rel:
		return errorf(w.path, tensor, ErrWrite, "bytes [%d, %d) of the data region are outside it (it has %d bytes)", rel, rel+n, w.dataSize)
	}
	if err := w.done.add(rel, rel+n); err != nil {
		return errorf(w.path, tensor, ErrWrite, "bytes [%d, %d) of the data region (at file offset %d): %v", rel, rel+n, w.dataStart+rel, err)
	}
	w.inflight.Add(1)
	return nil
}

func (w *Writer) pwrite(tensor string, p []byte, rel int64) (int, error) {
	defer w.inflight.Done()
	n, err := w.f.WriteAt(p, w.dataStart+rel)
	if err != nil {
		w.mu.Lock()
		if w.err == nil {
			w.err = err
		}
		w.mu.Unlock()
		return n, &Error{File: w.path, Tensor: tensor, Err: err}
	}
	return n, nil
}

// Write writes the data region sequentially: the bytes of the first tensor,
// then of the second, and so on, in any chunk sizes (io.Writer). It may be
// mixed with WriteAt only on disjoint ranges.
func (w *Writer) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	w.mu.Lock()
	rel := w.cursor
	t := w.tensorAt(rel)
	err := w.reserveLocked(t, rel, int64(len(p)))
	if err == nil {
		w.cursor = rel + int64(len(p))
	}
	w.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return w.pwrite(t, p, rel)
}

// WriteAt writes p at the absolute file offset off, which must lie inside
// the data region (io.WriterAt). Each byte may be written once. It is safe
// to call from several goroutines on disjoint ranges.
func (w *Writer) WriteAt(p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	rel := off - w.dataStart
	t := w.tensorAt(rel)
	if err := w.reserve(t, rel, int64(len(p))); err != nil {
		return 0, err
	}
	return w.pwrite(t, p, rel)
}

// WriteTensorAt writes p at offset off within the tensor called name; the
// write must stay inside that tensor.
func (w *Writer) WriteTensorAt(name string, p []byte, off int64) error {
	t, ok := w.Tensor(name)
	if !ok {
		return errorf(w.path, name, ErrNotFound, "the file being written has no tensor of that name")
	}
	if off < 0 || int64(len(p)) > t.Size-off {
		return errorf(w.path, name, ErrWrite, "bytes [%d, %d) are outside the tensor's %d bytes", off, off+int64(len(p)), t.Size)
	}
	if len(p) == 0 {
		return nil
	}
	rel := t.Offset - w.dataStart + off
	if err := w.reserve(name, rel, int64(len(p))); err != nil {
		return err
	}
	_, err := w.pwrite(name, p, rel)
	return err
}

// CopyTensor reads exactly the size of the tensor called name from r and
// writes it as that tensor's bytes, in chunks of at most 1 MiB, checking ctx
// between chunks.
func (w *Writer) CopyTensor(ctx context.Context, name string, r io.Reader) (int64, error) {
	t, ok := w.Tensor(name)
	if !ok {
		return 0, errorf(w.path, name, ErrNotFound, "the file being written has no tensor of that name")
	}
	buf := make([]byte, min(t.Size, 1<<20))
	var done int64
	for done < t.Size {
		if err := ctx.Err(); err != nil {
			return done, &Error{File: w.path, Tensor: name, Err: fmt.Errorf("copy stopped after %d of %d bytes: %w", done, t.Size, err)}
		}
		n, err := io.ReadFull(r, buf[:min(int64(len(buf)), t.Size-done)])
		if n > 0 {
			if werr := w.WriteTensorAt(name, buf[:n], done); werr != nil {
				return done, werr
			}
			done += int64(n)
		}
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return done, errorf(w.path, name, ErrWrite, "the source gave %d of the tensor's %d bytes", done, t.Size)
			}
			return done, &Error{File: w.path, Tensor: name, Err: err}
		}
	}
	return done, nil
}

// tensorAt names the tensor holding data-region byte rel, for messages.
func (w *Writer) tensorAt(rel int64) string {
	off := w.dataStart + rel
	i := sort.Search(len(w.tensors), func(i int) bool { return w.tensors[i].Offset+w.tensors[i].Size > off })
	if i < len(w.tensors) && w.tensors[i].Offset <= off {
		return w.tensors[i].Name
	}
	return ""
}

// Close waits for writes in flight, checks that every byte of every tensor
// was written, syncs the file and renames it to its path. If anything is
// missing or failed it removes the temporary file and returns an *Error
// (ErrIncomplete names the first tensor with missing bytes). Close is
// idempotent: later calls return the first call's result.
func (w *Writer) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return w.closeErr
	}
	w.closed = true
	w.mu.Unlock()
	w.inflight.Wait()
	w.closeErr = w.finish()
	return w.closeErr
}

func (w *Writer) finish() error {
	w.mu.Lock()
	err := w.err
	missing, hasGap := w.done.firstGap(w.dataSize)
	w.mu.Unlock()
	if err == nil && hasGap {
		t, _ := w.Tensor(w.tensorAt(missing))
		err = errorf(w.path, t.Name, ErrIncomplete, "byte %d of the tensor (file offset %d) and possibly more were never written; %d of %d data bytes written",
			w.dataStart+missing-t.Offset, w.dataStart+missing, w.done.total(), w.dataSize)
	}
	if err == nil && w.sync {
		err = w.f.Sync()
	}
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = w.fs.Rename(w.tmp, w.path)
	}
	if err != nil {
		w.fs.Remove(w.tmp)
		return withFile(err, w.path)
	}
	return nil
}

// Abort stops writing and removes the temporary file; the destination path
// is left as it was. It waits for writes in flight. After a successful
// Close it does nothing.
func (w *Writer) Abort() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	w.closeErr = errorf(w.path, "", ErrWrite, "aborted")
	w.mu.Unlock()
	w.inflight.Wait()
	w.f.Close()
	if err := w.fs.Remove(w.tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return &Error{File: w.path, Err: err}
	}
	return nil
}

// spans is a sorted set of disjoint, non-adjacent half-open ranges.
type spans []span

type span struct{ start, end int64 }

// add inserts [a, b); it fails if any byte of it is already present.
func (s *spans) add(a, b int64) error {
	if a >= b {
		return nil
	}
	v := *s
	i := sort.Search(len(v), func(i int) bool { return v[i].end > a })
	if i < len(v) && v[i].start < b {
		return fmt.Errorf("overlap bytes [%d, %d) already written", max(a, v[i].start), min(b, v[i].end))
	}
	left := i > 0 && v[i-1].end == a
	right := i < len(v) && v[i].start == b
	switch {
	case left && right:
		v[i-1].end = v[i].end
		*s = slices.Delete(v, i, i+1)
	case left:
		v[i-1].end = b
	case right:
		v[i].start = a
	default:
		*s = slices.Insert(v, i, span{a, b})
	}
	return nil
}

// firstGap returns the first byte in [0, size) not covered.
func (s spans) firstGap(size int64) (int64, bool) {
	if size == 0 {
		return 0, false
	}
	if len(s) == 0 || s[0].start > 0 {
		return 0, true
	}
	if s[0].end < size {
		return s[0].end, true
	}
	return 0, false
}

func (s spans) total() int64 {
	var n int64
	for _, r := range s {
		n += r.end - r.start
	}
	return n
}
