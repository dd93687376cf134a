package sink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/weightcast/weightcast/safetensors"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/wire"
)

// stagingPrefix starts the name of the hidden directory a Safetensors sink
// writes a round into before moving its files into place.
const stagingPrefix = ".weightcast-round-"

// sinkWriteSize is the most bytes a Safetensors sink writes with one
// system call. Writing a 64 MiB bucket entry with a single pwrite ran at
// half the speed of writing it 1 MiB at a time (Linux, ext4, page cache;
// BenchmarkWriteSafetensors).
const sinkWriteSize = 1 << 20

// SafetensorsOption adjusts WriteSafetensors.
type SafetensorsOption func(*safetensorsOptions)

type safetensorsOptions struct {
	noSync   bool
	fileName string
	fs       safetensors.FS
	config   string // SafetensorsConfig
}

// SafetensorsWithoutSync skips the fsync of each file and of the directory.
// Use it for scratch output only: a crash may leave empty or partial files.
func SafetensorsWithoutSync() SafetensorsOption {
	return func(o *safetensorsOptions) { o.noSync = true }
}

// SafetensorsWithFS makes the sink write through fsys instead of the
// operating system's file system (safetensors.OS), for tests that inject
// faults such as a full disk.
func SafetensorsWithFS(fsys safetensors.FS) SafetensorsOption {
	return func(o *safetensorsOptions) { o.fs = fsys }
}

// SafetensorsFileName names the single file written for a round whose
// source is not a checkpoint (a synthetic model, a list of tensors). The
// default is model.safetensors.
func SafetensorsFileName(name string) SafetensorsOption {
	return func(o *safetensorsOptions) { o.fileName = name }
}

// WriteSafetensors returns a stages.Sink that writes each round it receives
// as a safetensors checkpoint in the directory dir (created if needed).
//
// When the round's source is a checkpoint (its SourceInfo lists shards, as
// a source.Checkpoint's does), the sink mirrors it: the same file names,
// the same tensors in the same order in each file, the same __metadata__ in
// the same key order, and a model.safetensors.index.json with the same
// "metadata" when the source had an index or more than one file. Without a
// cast the files are then byte-identical to the source's (for files written
// by the reference implementation or package safetensors); after a
// stages.Cast the headers carry the received dtypes. For any other source
// it writes one file (model.safetensors, see SafetensorsFileName) holding
// the tensors in the order received. With the model's config.json
// (SafetensorsConfig), or one already in dir, it writes config.json too,
// describing an FP8 round for transformers.
//
// The files are streamed to disk as chunks arrive; no tensor is held in
// memory. A file's header depends on the dtype and shape of every tensor in
// it. When the round's SourceInfo announces them (ShardInfo.DTypes and
// Shapes, as a Checkpoint's and a Cast's do), the sink creates each file
// with its header when the file's first tensor arrives and writes every
// chunk in place, so each byte is written once; a tensor that arrives with
// another dtype or shape than announced fails the round with an error
// naming it. Without them (an older sender), the bytes of a file's tensors
// before its last one are spooled to a temporary file and copied behind
// the header once the last tensor's first chunk arrives (most bytes are
// then written twice); the last tensor is written in place.
//
// A round is written into a hidden directory inside dir (named
// .weightcast-round-*). Each finished file is synced there. Commit (this
// rank has every bucket) checks that every file was completed and writes
// the index there; Committed (every receiver has every bucket: the version
// is the group's) renames the files into dir (the index last), removes
// files of this sink's earlier rounds that the new round does not have,
// and syncs dir. So dir only ever holds versions the group committed, and
// the sink HoldsShadowed: a round that fails anywhere before Committed
// leaves dir's earlier files untouched. Only a failure during Committed's
// renames (or a crash then) can leave a mix of two rounds' files; Holding
// reports HoldsInPlace after such a failure. It needs a Receiver,
// or a caller of Committed, to install a round: with a pipeline's Load
// stage alone nothing becomes visible.
//
// Nothing of a failed round stays behind: the sink removes the round's
// directory, with its spool files, as soon as one of its own calls fails
// (a full disk, a round that does not match its description), and a
// Receiver whose round fails elsewhere calls Abort before its Sync
// returns.
//
// Tensors must arrive in source order (as Pack sends them); a tensor
// missing, unexpected or out of order fails the round with an error naming
// it, since the files could not mirror the source.
func WriteSafetensors(dir string, opts ...SafetensorsOption) *Safetensors {
	o := safetensorsOptions{fileName: "model.safetensors"}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	fsys := o.fs
	if fsys == nil {
		fsys = safetensors.OS
	}
	return &Safetensors{dir: dir, opts: o, fs: fsys}
}

// Safetensors is the stages.Sink returned by WriteSafetensors; it is a
// stages.Beginner, Committer, Holder and Aborter. Its methods may be called
// from several goroutines, one at a time (the load stage, then the
// Receiver).
type Safetensors struct {
	dir  string
	opts safetensorsOptions
	fs   safetensors.FS

	mu      sync.Mutex
	round   *stRound // the round being written, nil between rounds
	written []string // base names of the files the last install put in dir
	mixed   bool     // an install failed part way: dir holds two rounds' files
	copyBuf []byte
}

// stRound is one round being written.
type stRound struct {
	version uint64
	staging string
	shards  []*stShard
	cur     int // the shard receiving tensors
	index   []byte
	// indexName is the index file to write, or "".
	indexName string
	// open is true when the round's layout is not known: every tensor
	// goes to a single shard, written at Commit.
	open bool
	// finished: Commit has completed every file and the index.
	finished bool
	// config is the model's configuration staged with the round
	// (safetensors_config.go), or "".
	config string
}

// stShard is one file of a round.
type stShard struct {
	name string
	want []string // tensor names in file order (nil when open)
	// layout is every tensor of the file with its dtype and shape when
	// the source announced them, else nil (the header waits for the
	// file's last tensor).
	layout   []safetensors.TensorInfo
	meta     map[string]string
	metaKeys []string

	infos    []safetensors.TensorInfo // tensors received so far
	rel      int64                    // data-region offset of the tensor being received
	dataLen  int64                    // data-region bytes laid out so far
	next     int                      // tensors completed
	inTensor bool                     // a tensor's chunks are arriving

	spill safetensors.FSFile  // bytes received while the header is unknown
	w     *safetensors.Writer // once the header is known
	done  bool
}

// Begin starts writing round version as described by info (nil or without
// shards: one file). It abandons a round begun and never committed.
func (s *Safetensors) Begin(ctx context.Context, version uint64, info *wire.SourceInfo) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.abortLocked(); err != nil {
		return err
	}
	if err := s.fs.MkdirAll(s.dir, 0o755); err != nil {
		return fmt.Errorf("safetensors sink: %w", err)
	}
	staging, err := s.fs.MkdirTemp(s.dir, stagingPrefix+"*")
	if err != nil {
		return fmt.Errorf("safetensors sink: creating the round's directory: %w", err)
	}
	r := &stRound{version: version, staging: staging}
	s.round = r
	return s.failLocked(s.begin(ctx, r, info))
}

func (s *Safetensors) begin(ctx context.Context, r *stRound, info *wire.SourceInfo) error {
	if err := s.plan(r, info); err != nil {
		return err
	}
	// Files with no tensors are complete already.
	for _, sh := range r.shards {
		if !r.open && len(sh.want) == 0 {
			if err := s.openWriter(ctx, r, sh, nil, 0); err != nil {
				return err
			}
			if err := s.closeShard(sh); err != nil {
				return err
			}
		}
	}
	r.skipDone()
	return nil
}

// failLocked abandons the round when err is not nil, so that a failed call
// leaves none of the round's files behind, and returns err (with the
// clean-up's own failure, if any).
func (s *Safetensors) failLocked(err error) error {
	if err == nil {
		return nil
	}
	if aerr := s.abortLocked(); aerr != nil {
		return fmt.Errorf("%w; removing the failed round's files: %v", err, aerr)
	}
	return err
}

// plan lays out the round's files from info, checking what came from the
// wire: plain, distinct file names and tensor names seen once.
func (s *Safetensors) plan(r *stRound, info *wire.SourceInfo) error {
	if info == nil || len(info.Shards) == 0 {
		if !plainName(s.opts.fileName) {
			return fmt.Errorf("safetensors sink: file name %q is not a plain file name", s.opts.fileName)
		}
		sh := &stShard{name: s.opts.fileName}
		if info != nil {
			sh.meta, sh.metaKeys = info.Metadata, info.MetadataKeys
		}
		r.shards, r.open = []*stShard{sh}, true
		return nil
	}
	files := map[string]bool{}
	tensors := map[string]string{}
	for _, si := range info.Shards {
		switch {
		case !plainName(si.File):
			return fmt.Errorf("safetensors sink: the source names a file %q, which is not a plain file name", si.File)
		case files[si.File]:
			return fmt.Errorf("safetensors sink: the source names file %q twice", si.File)
		}
		files[si.File] = true
		for _, t := range si.Tensors {
			if other, dup := tensors[t]; dup {
				return fmt.Errorf("safetensors sink: the source lists tensor %q in %s and again in %s", t, other, si.File)
			}
			tensors[t] = si.File
		}
		sh := &stShard{name: si.File, want: si.Tensors, meta: info.Metadata, metaKeys: info.MetadataKeys}
		layout, err := shardLayout(si)
		if err != nil {
			return err
		}
		sh.layout = layout
		if si.Metadata != nil {
			sh.meta, sh.metaKeys = si.Metadata, si.MetadataKeys
		}
		r.shards = append(r.shards, sh)
	}
	if len(info.Shards) > 1 || info.IndexMetadata != nil {
		r.indexName = safetensors.IndexFileName
		if files[r.indexName] {
			return fmt.Errorf("safetensors sink: the source has a file named %s, the name of the index", r.indexName)
		}
		idx := &safetensors.Index{WeightMap: map[string]string{}}
		for t, f := range tensors {
			idx.WeightMap[t] = f
		}
		if info.IndexMetadata != nil {
			dec := json.NewDecoder(bytes.NewReader(info.IndexMetadata))
			dec.UseNumber()
			if err := dec.Decode(&idx.Metadata); err != nil || idx.Metadata == nil {
				return fmt.Errorf("safetensors sink: the source's index metadata is not a JSON object: %.80q", info.IndexMetadata)
			}
		}
		r.index = idx.Marshal()
	}
	return nil
}

// shardLayout returns the tensors of si with their announced dtypes and
// shapes, nil when si announces none, and an error when the announcement
// is malformed.
func shardLayout(si wire.ShardInfo) ([]safetensors.TensorInfo, error) {
	if len(si.DTypes) == 0 && len(si.Shapes) == 0 {
		return nil, nil
	}
	if len(si.DTypes) != len(si.Tensors) || len(si.Shapes) != len(si.Tensors) {
		return nil, fmt.Errorf("safetensors sink: the source lists %d tensors in %s with %d dtypes and %d shapes; it must give one of each per tensor, or none",
			len(si.Tensors), si.File, len(si.DTypes), len(si.Shapes))
	}
	layout := make([]safetensors.TensorInfo, len(si.Tensors))
	for i, name := range si.Tensors {
		dt, shape := si.DTypes[i], si.Shapes[i]
		if len(shape) > wire.MaxRank {
			return nil, fmt.Errorf("safetensors sink: the source announces tensor %q in %s with %d dimensions; the limit is %d", name, si.File, len(shape), wire.MaxRank)
		}
		if _, err := dt.Bytes(shape); err != nil {
			return nil, fmt.Errorf("safetensors sink: the source announces tensor %q in %s as %s%v: %w", name, si.File, dt, shape, err)
		}
		layout[i] = safetensors.TensorInfo{Name: name, DType: dt, Shape: slices.Clone(shape)}
	}
	return layout, nil
}

// plainName reports whether name can be a file directly in the sink's
// directory, and is not one of the sink's own hidden names.
func plainName(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, `/\`+"\x00") &&
		filepath.Base(name) == name && !strings.HasPrefix(name, stagingPrefix) && !strings.HasPrefix(name, ".spill-")
}

// skipDone moves cur past completed shards.
func (r *stRound) skipDone() {
	for r.cur < len(r.shards) && r.shards[r.cur].done {
		r.cur++
	}
}

// Load writes one entry's bytes into its file.
func (s *Safetensors) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.round == nil:
		return fmt.Errorf("safetensors sink: tensor %q arrived before Begin (the load stage calls Begin with a round's first bucket)", e.Name)
	case s.round.finished:
		return s.failLocked(fmt.Errorf("safetensors sink: tensor %q arrived after the round's Commit", e.Name))
	}
	return s.failLocked(s.load(ctx, s.round, e, data))
}

func (s *Safetensors) load(ctx context.Context, r *stRound, e *wire.Entry, data []byte) error {
	if r.cur >= len(r.shards) {
		return fmt.Errorf("safetensors sink: tensor %q arrived after every file of the source was complete; the round does not match its source description", e.Name)
	}
	sh := r.shards[r.cur]
	if !sh.inTensor {
		if e.Chunk != 0 {
			return fmt.Errorf("safetensors sink: tensor %q: chunk at byte %d arrived before its first chunk", e.Name, e.Chunk)
		}
		if !r.open && e.Name != sh.want[sh.next] {
			return fmt.Errorf("safetensors sink: tensor %q arrived where %s expects %q (tensor %d of %d); tensors must arrive in source order, all of them",
				e.Name, sh.name, sh.want[sh.next], sh.next+1, len(sh.want))
		}
		if sh.layout != nil {
			if want := sh.layout[sh.next]; e.DType != want.DType || !slices.Equal(e.Shape, want.Shape) {
				return fmt.Errorf("safetensors sink: tensor %q arrived as %s%v, but the round's source description announces it as %s%v in %s; the sender's description does not match what it sends",
					e.Name, e.DType, e.Shape, want.DType, want.Shape, sh.name)
			}
		}
		sh.infos = append(sh.infos, safetensors.TensorInfo{Name: e.Name, DType: e.DType, Shape: slices.Clone(e.Shape)})
		sh.rel, sh.inTensor = sh.dataLen, true
		sh.dataLen += e.Total
		switch {
		case sh.w != nil:
		case sh.layout != nil:
			// The header is announced: write the whole file in place.
			if err := s.openWriter(ctx, r, sh, sh.layout, 0); err != nil {
				return err
			}
		case !r.open && sh.next == len(sh.want)-1:
			// The last tensor of the file: its header is known now.
			if err := s.openWriter(ctx, r, sh, sh.infos, sh.rel); err != nil {
				return err
			}
		}
	} else {
		last := sh.infos[len(sh.infos)-1]
		if e.Name != last.Name {
			return fmt.Errorf("safetensors sink: tensor %q arrived while tensor %q was incomplete", e.Name, last.Name)
		}
	}
	for done := 0; done < len(data); {
		p := data[done:min(done+sinkWriteSize, len(data))]
		at := e.Chunk + int64(done)
		var err error
		switch {
		case sh.layout != nil:
			err = sh.w.WriteTensorAt(e.Name, p, at)
		case sh.w != nil:
			_, err = sh.w.WriteAt(p, sh.w.DataOffset()+sh.rel+at)
		default:
			err = s.spillWrite(r, sh, p, sh.rel+at)
		}
		if err != nil {
			return fmt.Errorf("safetensors sink: writing tensor %q: %w", e.Name, err)
		}
		done += len(p)
	}
	if !e.Complete() {
		return nil
	}
	sh.inTensor = false
	sh.next++
	if !r.open && sh.next == len(sh.want) {
		if err := s.closeShard(sh); err != nil {
			return err
		}
		r.skipDone()
	}
	return nil
}

func (s *Safetensors) spillWrite(r *stRound, sh *stShard, data []byte, off int64) error {
	if sh.spill == nil {
		f, err := s.fs.CreateTemp(r.staging, ".spill-*")
		if err != nil {
			return err
		}
		sh.spill = f
	}
	_, err := sh.spill.WriteAt(data, off)
	return err
}

// openWriter creates the shard's file holding tensors in the staging
// directory now that its header is known, and copies the first spooled
// bytes of the data region behind it.
func (s *Safetensors) openWriter(ctx context.Context, r *stRound, sh *stShard, tensors []safetensors.TensorInfo, spooled int64) error {
	var opts []safetensors.Option
	if sh.metaKeys != nil {
		opts = append(opts, safetensors.WithMetadataOrder(sh.metaKeys))
	}
	opts = append(opts, s.fileOptions()...)
	w, err := safetensors.Create(filepath.Join(r.staging, sh.name), tensors, sh.meta, opts...)
	if err != nil {
		return fmt.Errorf("safetensors sink: %w", err)
	}
	sh.w = w
	if sh.spill == nil {
		return nil
	}
	if s.copyBuf == nil {
		s.copyBuf = make([]byte, 1<<20)
	}
	for off := int64(0); off < spooled; {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := min(int64(len(s.copyBuf)), spooled-off)
		if _, err := sh.spill.ReadAt(s.copyBuf[:n], off); err != nil {
			return fmt.Errorf("safetensors sink: reading back the spooled bytes of %s: %w", sh.name, err)
		}
		if _, err := w.WriteAt(s.copyBuf[:n], w.DataOffset()+off); err != nil {
			return fmt.Errorf("safetensors sink: %w", err)
		}
		off += n
	}
	return s.dropSpill(sh)
}

// fileOptions are the options of every file the sink writes.
func (s *Safetensors) fileOptions() []safetensors.Option {
	opts := []safetensors.Option{safetensors.WithFS(s.fs)}
	if s.opts.noSync {
		opts = append(opts, safetensors.WithoutSync())
	}
	return opts
}

func (s *Safetensors) dropSpill(sh *stShard) error {
	if sh.spill == nil {
		return nil
	}
	sh.spill.Close()
	err := s.fs.Remove(sh.spill.Name())
	sh.spill = nil
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// closeShard finishes the shard's file in the staging directory.
func (s *Safetensors) closeShard(sh *stShard) error {
	if err := sh.w.Close(); err != nil {
		return fmt.Errorf("safetensors sink: %w", err)
	}
	sh.done = true
	return nil
}

// Commit finishes the round in the staging directory: every file
// complete, the index written. The round is then ready for Committed,
// which puts it in place; until then dir holds the version before it.
func (s *Safetensors) Commit(ctx context.Context, version uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.round
	switch {
	case r == nil:
		return fmt.Errorf("safetensors sink: commit of version %d without a round begun", version)
	case r.finished:
		return fmt.Errorf("safetensors sink: version %d committed twice", version)
	}
	return s.failLocked(s.finishRound(ctx, r))
}

// finishRound completes the files and writes the index in the round's
// directory.
func (s *Safetensors) finishRound(ctx context.Context, r *stRound) error {
	if r.open {
		sh := r.shards[0]
		if sh.inTensor {
			return fmt.Errorf("safetensors sink: round %d ended with tensor %q incomplete", r.version, sh.infos[len(sh.infos)-1].Name)
		}
		if err := s.openWriter(ctx, r, sh, sh.infos, sh.dataLen); err != nil {
			return err
		}
		if err := s.closeShard(sh); err != nil {
			return err
		}
	}
	for _, sh := range r.shards {
		switch {
		case sh.done:
		case sh.inTensor:
			return fmt.Errorf("safetensors sink: round %d ended with %s incomplete: tensor %q arrived in part", r.version, sh.name, sh.want[sh.next])
		default:
			return fmt.Errorf("safetensors sink: round %d ended with %s incomplete: tensor %q never arrived (%d of %d tensors of the file received)",
				r.version, sh.name, sh.want[sh.next], sh.next, len(sh.want))
		}
	}
	if r.indexName != "" {
		if err := safetensors.WriteFileAtomic(filepath.Join(r.staging, r.indexName), r.index, s.fileOptions()...); err != nil {
			return fmt.Errorf("safetensors sink: %w", err)
		}
	}
	if err := s.stageConfig(r); err != nil {
		return err
	}
	r.finished = true
	return nil
}

// Committed puts the round of version, which Commit finished, in place:
// its files are renamed into dir (the index last), files of the sink's
// earlier rounds that it does not have are removed, and dir is synced.
func (s *Safetensors) Committed(ctx context.Context, version uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.round
	switch {
	case r == nil || !r.finished:
		return fmt.Errorf("safetensors sink: version %d committed by the group before this sink finished it (Commit)", version)
	case r.version != version:
		return s.failLocked(fmt.Errorf("safetensors sink: the group committed version %d, but this sink holds version %d", version, r.version))
	}
	return s.failLocked(s.replace(r))
}

// replace renames the finished round's files into the directory.
func (s *Safetensors) replace(r *stRound) error {
	var names []string
	for _, sh := range r.shards {
		names = append(names, sh.name)
	}
	if r.config != "" {
		names = append(names, r.config)
	}
	if r.indexName != "" {
		names = append(names, r.indexName) // renamed last
	}
	for i, n := range names {
		if err := s.fs.Rename(filepath.Join(r.staging, n), filepath.Join(s.dir, n)); err != nil {
			if i > 0 {
				s.mixed = true
			}
			return fmt.Errorf("safetensors sink: moving %s into place: %w", n, err)
		}
	}
	s.mixed = false
	var errs []error
	for _, old := range s.written {
		if !slices.Contains(names, old) && old != configName { // a config.json stays
			if err := s.fs.Remove(filepath.Join(s.dir, old)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	s.written = names
	errs = append(errs, s.fs.Remove(r.staging), s.syncDir())
	s.round = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("safetensors sink: round %d is in place, but: %w", r.version, err)
	}
	return nil
}

// Holding is HoldsShadowed: a round reaches dir only in Committed, so a
// failed round leaves dir's files as the last install put them; after an
// install that failed part way, dir mixes two rounds: HoldsInPlace.
func (s *Safetensors) Holding() stages.Holding {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mixed {
		return stages.HoldsInPlace
	}
	return stages.HoldsShadowed
}

func (s *Safetensors) syncDir() error {
	if s.opts.noSync {
		return nil
	}
	d, err := s.fs.Open(s.dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// Abort abandons a round begun and not put in place, removing its files;
// the directory keeps the last committed round. A Receiver calls it when
// its round fails; call it yourself after a failed round of a pipeline of
// your own (the next Begin does it otherwise).
func (s *Safetensors) Abort() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.abortLocked()
}

func (s *Safetensors) abortLocked() error {
	r := s.round
	if r == nil {
		return nil
	}
	s.round = nil
	var errs []error
	for _, sh := range r.shards {
		errs = append(errs, s.dropSpill(sh))
		if sh.w != nil {
			errs = append(errs, sh.w.Abort())
		}
	}
	errs = append(errs, s.fs.RemoveAll(r.staging))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("safetensors sink: removing the unfinished round's directory %s: %w", r.staging, err)
	}
	return nil
}

// Files returns the paths of the files the last committed round wrote, in
// order (the index last).
func (s *Safetensors) Files() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, len(s.written))
	for i, n := range s.written {
		out[i] = filepath.Join(s.dir, n)
	}
	return out
}
