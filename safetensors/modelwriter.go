package safetensors

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"sync"
)

// ModelLayout describes a checkpoint to write: its shards and, optionally,
// its index file.
type ModelLayout struct {
	// Shards are written in this order, each under its Name.
	Shards []ShardLayout
	// IndexName is the base name of the index file to write, or "" for
	// none. The index's weight_map is built from Shards.
	IndexName string
	// IndexMetadata is the index's "metadata" object (see Index.Metadata).
	IndexMetadata map[string]any
	// IndexExtra holds other top-level index keys to write.
	IndexExtra map[string]any
}

// ShardLayout describes one shard: its file name, its tensors in file
// order and its metadata (see Create and WithMetadataOrder).
type ShardLayout struct {
	Name         string
	Tensors      []TensorInfo
	Metadata     map[string]string
	MetadataKeys []string
}

// PlanShards splits tensors, in order, into shards of at most maxShardBytes
// data bytes (a tensor larger than that gets a shard of its own), named as
// Hugging Face names them: model.safetensors when one shard suffices (and
// then no index), else model-00001-of-0000N.safetensors with
// model.safetensors.index.json whose metadata holds total_size. Every shard
// gets metadata.
func PlanShards(tensors []TensorInfo, metadata map[string]string, maxShardBytes int64) (ModelLayout, error) {
	if maxShardBytes <= 0 {
		return ModelLayout{}, errorf("", "", ErrLimit, "max shard size %d must be positive", maxShardBytes)
	}
	var (
		groups [][]TensorInfo
		cur    []TensorInfo
		curN   int64
		total  int64
	)
	for _, t := range tensors {
		n, err := t.DType.Bytes(t.Shape)
		if err != nil {
			return ModelLayout{}, errorf("", t.Name, ErrShape, "%v", err)
		}
		if len(cur) > 0 && curN+n > maxShardBytes {
			groups = append(groups, cur)
			cur, curN = nil, 0
		}
		cur = append(cur, t)
		curN += n
		total += n
	}
	if len(cur) > 0 || len(groups) == 0 {
		groups = append(groups, cur)
	}
	var l ModelLayout
	for i, g := range groups {
		name := "model.safetensors"
		if len(groups) > 1 {
			name = fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(groups))
		}
		l.Shards = append(l.Shards, ShardLayout{Name: name, Tensors: g, Metadata: metadata})
	}
	if len(groups) > 1 {
		l.IndexName = IndexFileName
		l.IndexMetadata = map[string]any{"total_size": json.Number(strconv.FormatInt(total, 10))}
	}
	return l, nil
}

// ModelWriter writes the shards of a checkpoint and its index. Tensor bytes
// are routed by tensor name to the shard that holds them.
type ModelWriter struct {
	dir    string
	layout ModelLayout
	shards []*Writer
	byName map[string]int
	opts   []Option // for the index

	mu       sync.Mutex
	closed   bool
	closeErr error
}

// CreateModel starts writing the checkpoint described by layout into the
// directory dir (which must exist). Each shard is created as by Create;
// Close finishes the shards and then writes the index, so the index, which
// readers look for first, appears only once every shard is complete. To
// mirror a source checkpoint, pass src.Layout().
func CreateModel(dir string, layout ModelLayout, opts ...Option) (*ModelWriter, error) {
	w := &ModelWriter{dir: dir, layout: layout, byName: map[string]int{}, opts: opts}
	names := map[string]bool{}
	for si, s := range layout.Shards {
		if !validShardName(s.Name) {
			return nil, errorf(dir, "", ErrIndex, "shard name %q is not a plain file name", s.Name)
		}
		if names[s.Name] {
			return nil, errorf(dir, "", ErrIndex, "shard name %q appears twice", s.Name)
		}
		names[s.Name] = true
		for _, t := range s.Tensors {
			if _, dup := w.byName[t.Name]; dup {
				return nil, errorf(filepath.Join(dir, s.Name), t.Name, ErrDuplicate, "this tensor is also in shard %s", layout.Shards[w.byName[t.Name]].Name)
			}
			w.byName[t.Name] = si
		}
	}
	if layout.IndexName != "" && !validShardName(layout.IndexName) {
		return nil, errorf(dir, "", ErrIndex, "index name %q is not a plain file name", layout.IndexName)
	}
	for _, s := range layout.Shards {
		o := append([]Option{}, opts...)
		if s.MetadataKeys != nil {
			o = append(o, WithMetadataOrder(s.MetadataKeys))
		}
		sw, err := Create(filepath.Join(dir, s.Name), s.Tensors, s.Metadata, o...)
		if err != nil {
			w.abortShards()
			return nil, err
		}
		w.shards = append(w.shards, sw)
	}
	return w, nil
}

// Shards returns the shard writers, in layout order.
func (w *ModelWriter) Shards() []*Writer { return append([]*Writer(nil), w.shards...) }

// Tensor returns the tensor called name with its offset in its shard, and
// the shard's index in Shards.
func (w *ModelWriter) Tensor(name string) (Tensor, int, bool) {
	i, ok := w.byName[name]
	if !ok {
		return Tensor{}, 0, false
	}
	t, _ := w.shards[i].Tensor(name)
	return t, i, true
}

// WriteTensorAt writes p at offset off within the tensor called name, in
// whichever shard holds it (see Writer.WriteTensorAt).
func (w *ModelWriter) WriteTensorAt(name string, p []byte, off int64) error {
	i, ok := w.byName[name]
	if !ok {
		return errorf(w.dir, name, ErrNotFound, "the checkpoint being written has no tensor of that name")
	}
	return w.shards[i].WriteTensorAt(name, p, off)
}

// CopyTensor copies the tensor called name from r (see Writer.CopyTensor).
func (w *ModelWriter) CopyTensor(ctx context.Context, name string, r io.Reader) (int64, error) {
	i, ok := w.byName[name]
	if !ok {
		return 0, errorf(w.dir, name, ErrNotFound, "the checkpoint being written has no tensor of that name")
	}
	return w.shards[i].CopyTensor(ctx, name, r)
}

// Close closes every shard (see Writer.Close) and, when they all succeed,
// writes the index. On the first failure it aborts the shards not yet
// closed and returns the error. It is idempotent.
func (w *ModelWriter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return w.closeErr
	}
	w.closed = true
	for i, s := range w.shards {
		if err := s.Close(); err != nil {
			for _, rest := range w.shards[i+1:] {
				rest.Abort()
			}
			w.closeErr = err
			return err
		}
	}
	if w.layout.IndexName != "" {
		idx := &Index{Metadata: w.layout.IndexMetadata, Extra: w.layout.IndexExtra, WeightMap: map[string]string{}}
		for _, s := range w.layout.Shards {
			for _, t := range s.Tensors {
				idx.WeightMap[t.Name] = s.Name
			}
		}
		w.closeErr = WriteFileAtomic(filepath.Join(w.dir, w.layout.IndexName), idx.Marshal(), w.opts...)
	}
	return w.closeErr
}

// Abort aborts every shard not yet closed (see Writer.Abort).
func (w *ModelWriter) Abort() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	w.closeErr = errorf(w.dir, "", ErrWrite, "aborted")
	return w.abortShards()
}

func (w *ModelWriter) abortShards() error {
	var errs []error
	for _, s := range w.shards {
		errs = append(errs, s.Abort())
	}
	return errors.Join(errs...)
}

// WriteFileAtomic writes b to a temporary file next to path, syncs it
// (unless WithoutSync) and renames it to path, so that path holds either its
// old content or b. On failure it removes the temporary file. It writes
// through WithFS's file system.
func WriteFileAtomic(path string, b []byte, opts ...Option) error {
	o := buildOptions(opts)
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := o.fs.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return &Error{File: path, Err: err}
	}
	tmp := f.Name()
	err = f.Chmod(0o644)
	if err == nil {
		_, err = f.Write(b)
	}
	if err == nil && !o.noSync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = o.fs.Rename(tmp, path)
	}
	if err != nil {
		o.fs.Remove(tmp)
		return &Error{File: path, Err: err}
	}
	return nil
}
