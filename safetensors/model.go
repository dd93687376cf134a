package safetensors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// IndexFileName is the index file name Hugging Face checkpoints use.
const IndexFileName = "model.safetensors.index.json"

// Index is a sharded checkpoint's index file: {"metadata": {...},
// "weight_map": {tensor: shard file name}}.
type Index struct {
	// Metadata is the "metadata" object, decoded with numbers kept as
	// json.Number so that they are written back as they were; nil when
	// the index has none.
	Metadata map[string]any
	// WeightMap maps every tensor name to the base name of its shard.
	WeightMap map[string]string
	// Extra holds any other top-level keys, decoded like Metadata.
	Extra map[string]any
}

// ParseIndex decodes an index file's bytes.
func ParseIndex(b []byte) (*Index, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var top map[string]any
	if err := dec.Decode(&top); err != nil {
		return nil, fmt.Errorf("%w: not a JSON object: %v", ErrIndex, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: data after the JSON object", ErrIndex)
	}
	if top == nil {
		return nil, fmt.Errorf("%w: the index is null, want an object", ErrIndex)
	}
	idx := &Index{WeightMap: map[string]string{}}
	wm, ok := top["weight_map"].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%w: no \"weight_map\" object", ErrIndex)
	}
	for name, v := range wm {
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("%w: weight_map[%q] is not a file name", ErrIndex, shorten(name))
		}
		idx.WeightMap[name] = s
	}
	switch m := top["metadata"].(type) {
	case map[string]any:
		idx.Metadata = m
	case nil:
	default:
		return nil, fmt.Errorf("%w: \"metadata\" is not an object", ErrIndex)
	}
	for k, v := range top {
		if k == "weight_map" || k == "metadata" {
			continue
		}
		if idx.Extra == nil {
			idx.Extra = map[string]any{}
		}
		idx.Extra[k] = v
	}
	return idx, nil
}

// Marshal encodes the index as the Hugging Face libraries write it: Python's
// json.dumps(index, indent=2, sort_keys=True) followed by a newline.
func (x *Index) Marshal() []byte {
	top := map[string]any{}
	for k, v := range x.Extra {
		top[k] = v
	}
	if x.Metadata != nil {
		top["metadata"] = x.Metadata
	}
	wm := make(map[string]any, len(x.WeightMap))
	for k, v := range x.WeightMap {
		wm[k] = v
	}
	top["weight_map"] = wm
	b := appendPyJSON(nil, top, 0)
	return append(b, '\n')
}

// appendPyJSON writes v as Python's json.dumps(indent=2, sort_keys=True,
// ensure_ascii=True) does.
func appendPyJSON(b []byte, v any, depth int) []byte {
	nl := func(b []byte, d int) []byte {
		b = append(b, '\n')
		for range d {
			b = append(b, ' ', ' ')
		}
		return b
	}
	switch v := v.(type) {
	case nil:
		return append(b, "null"...)
	case bool:
		if v {
			return append(b, "true"...)
		}
		return append(b, "false"...)
	case json.Number:
		return append(b, v...)
	case string:
		return appendPyString(b, v)
	case map[string]any:
		if len(v) == 0 {
			return append(b, "{}"...)
		}
		b = append(b, '{')
		for i, k := range slices.Sorted(maps.Keys(v)) {
			if i > 0 {
				b = append(b, ',')
			}
			b = nl(b, depth+1)
			b = appendPyString(b, k)
			b = append(b, ':', ' ')
			b = appendPyJSON(b, v[k], depth+1)
		}
		b = nl(b, depth)
		return append(b, '}')
	case []any:
		if len(v) == 0 {
			return append(b, "[]"...)
		}
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = nl(b, depth+1)
			b = appendPyJSON(b, e, depth+1)
		}
		b = nl(b, depth)
		return append(b, ']')
	default:
		// Values built in Go (ints, floats) go through encoding/json.
		j, err := json.Marshal(v)
		if err != nil {
			return append(b, "null"...)
		}
		return append(b, j...)
	}
}

// appendPyString escapes like Python's json with ensure_ascii=True:
// \" \\ \n \r \t \b \f, every other byte outside ' '..'~' as \uxxxx
// (lower-case hex, UTF-16 surrogate pairs above U+FFFF).
func appendPyString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	u := func(b []byte, r rune) []byte {
		return append(b, '\\', 'u', hex[r>>12&0xF], hex[r>>8&0xF], hex[r>>4&0xF], hex[r&0xF])
	}
	b = append(b, '"')
	for _, r := range s {
		switch {
		case r == '"':
			b = append(b, '\\', '"')
		case r == '\\':
			b = append(b, '\\', '\\')
		case r == '\n':
			b = append(b, '\\', 'n')
		case r == '\r':
			b = append(b, '\\', 'r')
		case r == '\t':
			b = append(b, '\\', 't')
		case r == '\b':
			b = append(b, '\\', 'b')
		case r == '\f':
			b = append(b, '\\', 'f')
		case r >= ' ' && r <= '~':
			b = append(b, byte(r))
		case r > 0xFFFF:
			r -= 0x10000
			b = u(b, 0xD800+(r>>10))
			b = u(b, 0xDC00+(r&0x3FF))
		default:
			b = u(b, r)
		}
	}
	return append(b, '"')
}

// ModelTensor is a tensor of a model and the shard that holds it.
type ModelTensor struct {
	Tensor
	// Shard is the index of the shard in Model.Shards.
	Shard int
}

// Model is an open checkpoint: one safetensors file, or the shards of a
// directory. Its tensors are listed in a stable order: shard order (shard
// file names sorted), then data offset.
type Model struct {
	path      string
	dir       string
	indexPath string
	index     *Index
	names     []string
	shards    []*File
	tensors   []ModelTensor
	byName    map[string]int
}

// OpenModel opens a checkpoint. path may be
//   - a .safetensors file: a model of one shard;
//   - an index file (*.safetensors.index.json): the shards it names;
//   - a directory holding model.safetensors.index.json (or exactly one
//     other *.safetensors.index.json): the shards that index names, other
//     .safetensors files in the directory are ignored;
//   - a directory without an index: every *.safetensors file in it whose
//     name does not start with a dot.
//
// Every shard's header is read and validated (see Open). With an index,
// OpenModel also checks that each shard named exists, that no tensor is in
// two shards, and that the weight_map agrees exactly with the shards'
// contents. Errors are *Error values naming the file and the tensor.
func OpenModel(path string, opts ...Option) (*Model, error) {
	o := buildOptions(opts)
	st, err := os.Stat(path)
	if err != nil {
		return nil, &Error{File: path, Err: err}
	}
	m := &Model{path: path}
	if !st.IsDir() {
		m.dir = filepath.Dir(path)
		if strings.HasSuffix(path, ".index.json") {
			return m.openIndexed(path, o)
		}
		f, err := Open(path, opts...)
		if err != nil {
			return nil, err
		}
		m.names = []string{filepath.Base(path)}
		m.shards = []*File{f}
		return m.collect()
	}
	m.dir = path
	indexes, err := filepath.Glob(filepath.Join(globEscape(path), "*.safetensors.index.json"))
	if err != nil {
		return nil, &Error{File: path, Err: err}
	}
	switch preferred := filepath.Join(path, IndexFileName); {
	case slices.Contains(indexes, preferred):
		return m.openIndexed(preferred, o)
	case len(indexes) == 1:
		return m.openIndexed(indexes[0], o)
	case len(indexes) > 1:
		return nil, errorf(path, "", ErrIndex, "several index files (%s); open the one you want", strings.Join(baseNames(indexes), ", "))
	}
	files, err := filepath.Glob(filepath.Join(globEscape(path), "*.safetensors"))
	if err != nil {
		return nil, &Error{File: path, Err: err}
	}
	for _, f := range files {
		if name := filepath.Base(f); !strings.HasPrefix(name, ".") {
			m.names = append(m.names, name)
		}
	}
	if len(m.names) == 0 {
		return nil, &Error{File: path, Err: fmt.Errorf("%w: no .safetensors files and no index in this directory", fs.ErrNotExist)}
	}
	slices.Sort(m.names)
	if err := m.openShards(opts); err != nil {
		return nil, err
	}
	return m.collect()
}

func globEscape(p string) string {
	r := strings.NewReplacer(`*`, `\*`, `?`, `\?`, `[`, `\[`, `\`, `\\`)
	return r.Replace(p)
}

func baseNames(paths []string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = filepath.Base(p)
	}
	return out
}

func (m *Model) openShards(opts []Option) error {
	for _, name := range m.names {
		f, err := Open(filepath.Join(m.dir, name), opts...)
		if err != nil {
			m.Close()
			return err
		}
		m.shards = append(m.shards, f)
	}
	return nil
}

func (m *Model) openIndexed(indexPath string, o options) (*Model, error) {
	m.indexPath = indexPath
	f, err := os.Open(indexPath)
	if err != nil {
		return nil, &Error{File: indexPath, Err: err}
	}
	b, err := io.ReadAll(io.LimitReader(f, o.limits.MaxHeaderBytes+1))
	f.Close()
	if err != nil {
		return nil, &Error{File: indexPath, Err: err}
	}
	if int64(len(b)) > o.limits.MaxHeaderBytes {
		return nil, errorf(indexPath, "", ErrIndex, "index file is larger than the limit of %d bytes", o.limits.MaxHeaderBytes)
	}
	idx, err := ParseIndex(b)
	if err != nil {
		return nil, &Error{File: indexPath, Err: err}
	}
	m.index = idx
	firstTensor := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(idx.WeightMap)) {
		shard := idx.WeightMap[name]
		if !validShardName(shard) {
			return nil, errorf(indexPath, name, ErrIndex, "shard %q is not a plain file name in the index's directory", shard)
		}
		if _, ok := firstTensor[shard]; !ok {
			firstTensor[shard] = name
			m.names = append(m.names, shard)
		}
	}
	slices.Sort(m.names)
	for _, shard := range m.names {
		p := filepath.Join(m.dir, shard)
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			return nil, errorf(p, firstTensor[shard], ErrMissingShard, "the index %s maps this tensor to shard %s, which does not exist; download the missing shard",
				filepath.Base(indexPath), shard)
		}
	}
	if err := m.openShards([]Option{WithLimits(o.limits)}); err != nil {
		return nil, err
	}
	if _, err := m.collect(); err != nil {
		return nil, err
	}
	// The weight_map must agree with the shards exactly.
	for _, t := range m.tensors {
		shard := m.names[t.Shard]
		mapped, ok := idx.WeightMap[t.Name]
		switch {
		case !ok:
			m.Close()
			return nil, errorf(indexPath, t.Name, ErrIndexMismatch, "shard %s holds this tensor but the weight_map does not list it", shard)
		case mapped != shard:
			m.Close()
			return nil, errorf(indexPath, t.Name, ErrIndexMismatch, "the weight_map maps this tensor to %s but shard %s holds it", mapped, shard)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(idx.WeightMap)) {
		if _, ok := m.byName[name]; !ok {
			m.Close()
			return nil, errorf(indexPath, name, ErrIndexMismatch, "the weight_map maps this tensor to %s but that shard does not hold it", idx.WeightMap[name])
		}
	}
	return m, nil
}

func validShardName(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsAny(s, `/\`) && filepath.Base(s) == s && !filepath.IsAbs(s)
}

// collect lists the tensors of every shard and rejects duplicates.
func (m *Model) collect() (*Model, error) {
	m.byName = map[string]int{}
	for si, f := range m.shards {
		for _, t := range f.hdr.Tensors {
			if prev, dup := m.byName[t.Name]; dup {
				other := m.names[m.tensors[prev].Shard]
				m.Close()
				return nil, errorf(f.Path(), t.Name, ErrDuplicate, "this tensor is also in shard %s; a tensor may be in one shard only", other)
			}
			m.byName[t.Name] = len(m.tensors)
			m.tensors = append(m.tensors, ModelTensor{Tensor: t, Shard: si})
		}
	}
	return m, nil
}

// Path returns the path OpenModel was given.
func (m *Model) Path() string { return m.path }

// Dir returns the directory holding the shards.
func (m *Model) Dir() string { return m.dir }

// IndexPath returns the index file used, or "" when there is none.
func (m *Model) IndexPath() string { return m.indexPath }

// Index returns the parsed index, or nil when there is none. It is shared
// and must not be modified.
func (m *Model) Index() *Index { return m.index }

// Shards returns the open shard files, in shard order.
func (m *Model) Shards() []*File { return slices.Clone(m.shards) }

// ShardNames returns the shards' base file names, in shard order.
func (m *Model) ShardNames() []string { return slices.Clone(m.names) }

// Tensors returns every tensor: shard order, then data offset.
func (m *Model) Tensors() []ModelTensor { return slices.Clone(m.tensors) }

// Len returns the number of tensors.
func (m *Model) Len() int { return len(m.tensors) }

// Tensor returns the tensor called name.
func (m *Model) Tensor(name string) (ModelTensor, bool) {
	i, ok := m.byName[name]
	if !ok {
		return ModelTensor{}, false
	}
	return m.tensors[i], true
}

// Section returns a reader of the bytes of the tensor called name.
func (m *Model) Section(name string) (*io.SectionReader, error) {
	t, ok := m.Tensor(name)
	if !ok {
		return nil, errorf(m.path, name, ErrNotFound, "no tensor of that name in this model")
	}
	return m.shards[t.Shard].Section(name)
}

// ReadTensor reads the tensor called name into dst, which must be exactly
// its size.
func (m *Model) ReadTensor(name string, dst []byte) error {
	t, ok := m.Tensor(name)
	if !ok {
		return errorf(m.path, name, ErrNotFound, "no tensor of that name in this model")
	}
	return m.shards[t.Shard].ReadTensor(name, dst)
}

// Close closes every shard. It is idempotent.
func (m *Model) Close() error {
	var errs []error
	for _, f := range m.shards {
		errs = append(errs, f.Close())
	}
	return errors.Join(errs...)
}

// Layout returns what CreateModel needs to write this model again with the
// same shard names, tensor order, metadata and index.
func (m *Model) Layout() ModelLayout {
	l := ModelLayout{Shards: make([]ShardLayout, len(m.shards))}
	for i, f := range m.shards {
		l.Shards[i] = ShardLayout{Name: m.names[i], Tensors: f.Infos(), Metadata: f.Metadata(), MetadataKeys: f.MetadataKeys()}
	}
	if m.index != nil {
		l.IndexName = filepath.Base(m.indexPath)
		l.IndexMetadata = m.index.Metadata
		l.IndexExtra = m.index.Extra
	}
	return l
}
