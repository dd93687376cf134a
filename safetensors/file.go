package safetensors

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
)

// File is an open safetensors file whose header has been read and
// validated. Its tensor bytes are read on demand (ReadAt, Section); the file
// is never read whole. A File is safe for concurrent use.
type File struct {
	path   string
	f      *os.File
	size   int64
	hdr    *Header
	byName map[string]int
}

// Open opens path, reads its header and validates it against the file: the
// header length, the header itself (see ParseHeader), and that the data
// region is exactly as long as the header says. No tensor bytes are read.
func Open(path string, opts ...Option) (*File, error) {
	o := buildOptions(opts)
	f, err := os.Open(path)
	if err != nil {
		return nil, &Error{File: path, Err: err}
	}
	sf, err := openFile(path, f, o.limits)
	if err != nil {
		f.Close()
		return nil, err
	}
	return sf, nil
}

func openFile(path string, f *os.File, lim Limits) (*File, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, &Error{File: path, Err: err}
	}
	if !st.Mode().IsRegular() {
		return nil, &Error{File: path, Err: fmt.Errorf("not a regular file (%s)", st.Mode().Type())}
	}
	size := st.Size()
	if size < 8 {
		return nil, errorf(path, "", ErrTruncated, "file is %d bytes, too short for the 8-byte header length", size)
	}
	var lenBuf [8]byte
	if _, err := f.ReadAt(lenBuf[:], 0); err != nil {
		return nil, &Error{File: path, Err: fmt.Errorf("reading the header length: %w", err)}
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > uint64(lim.MaxHeaderBytes) {
		return nil, errorf(path, "", ErrHeaderSize, "header length is %d bytes, more than the limit of %d; the file is corrupt or not safetensors",
			n, lim.MaxHeaderBytes)
	}
	if n > uint64(size-8) {
		return nil, errorf(path, "", ErrHeaderSize, "header length is %d bytes but the file has only %d bytes after the length; the file is truncated or not safetensors",
			n, size-8)
	}
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, 8); err != nil {
		return nil, &Error{File: path, Err: fmt.Errorf("reading the header: %w", err)}
	}
	hdr, err := parseHeader(buf, lim)
	if err != nil {
		return nil, withFile(err, path)
	}
	have := size - hdr.DataOffset()
	if have < hdr.DataSize {
		// Name the first tensor that does not fit.
		for _, t := range hdr.Tensors {
			if t.Offset+t.Size > size {
				return nil, errorf(path, t.Name, ErrTruncated, "file is %d bytes but the header says the data region ends at byte %d (this tensor ends at %d); the file was cut short, copy it again",
					size, hdr.DataOffset()+hdr.DataSize, t.Offset+t.Size)
			}
		}
	}
	if have > hdr.DataSize {
		return nil, errorf(path, "", ErrGap, "%d bytes after the last tensor (at byte %d) belong to no tensor; the data region must end with the last tensor",
			have-hdr.DataSize, hdr.DataOffset()+hdr.DataSize)
	}
	sf := &File{path: path, f: f, size: size, hdr: hdr, byName: make(map[string]int, len(hdr.Tensors))}
	for i, t := range hdr.Tensors {
		sf.byName[t.Name] = i
	}
	return sf, nil
}

// Path returns the path the file was opened with.
func (f *File) Path() string { return f.path }

// Size returns the file's size in bytes.
func (f *File) Size() int64 { return f.size }

// HeaderLen returns N, the length of the JSON header with its padding.
func (f *File) HeaderLen() int64 { return f.hdr.HeaderLen }

// DataOffset returns the absolute offset of the data region (8 + N).
func (f *File) DataOffset() int64 { return f.hdr.DataOffset() }

// Tensors returns the tensors in data-offset order. The slice is a copy;
// the shapes are shared and must not be modified.
func (f *File) Tensors() []Tensor { return slices.Clone(f.hdr.Tensors) }

// Len returns the number of tensors.
func (f *File) Len() int { return len(f.hdr.Tensors) }

// Infos returns the TensorInfo of every tensor in data-offset order: what
// Create needs to write the same layout again.
func (f *File) Infos() []TensorInfo {
	out := make([]TensorInfo, len(f.hdr.Tensors))
	for i, t := range f.hdr.Tensors {
		out[i] = t.Info()
	}
	return out
}

// Tensor returns the tensor called name.
func (f *File) Tensor(name string) (Tensor, bool) {
	i, ok := f.byName[name]
	if !ok {
		return Tensor{}, false
	}
	return f.hdr.Tensors[i], true
}

// Metadata returns a copy of the "__metadata__" map, or nil when the file
// has none.
func (f *File) Metadata() map[string]string { return maps.Clone(f.hdr.Metadata) }

// MetadataKeys returns the metadata keys in the order the header lists
// them (give it to WithMetadataOrder to write the same header again).
func (f *File) MetadataKeys() []string { return slices.Clone(f.hdr.MetadataKeys) }

// ReadAt reads from the file at the absolute offset off (io.ReaderAt).
func (f *File) ReadAt(p []byte, off int64) (int, error) { return f.f.ReadAt(p, off) }

// Section returns a reader of the bytes of the tensor called name.
func (f *File) Section(name string) (*io.SectionReader, error) {
	t, ok := f.Tensor(name)
	if !ok {
		return nil, errorf(f.path, name, ErrNotFound, "no tensor of that name in this file")
	}
	return io.NewSectionReader(f.f, t.Offset, t.Size), nil
}

// ReadTensor reads the bytes of the tensor called name into dst, which
// must be exactly the tensor's size.
func (f *File) ReadTensor(name string, dst []byte) error {
	t, ok := f.Tensor(name)
	if !ok {
		return errorf(f.path, name, ErrNotFound, "no tensor of that name in this file")
	}
	if int64(len(dst)) != t.Size {
		return &Error{File: f.path, Tensor: name, Err: fmt.Errorf("destination is %d bytes, the tensor is %d", len(dst), t.Size)}
	}
	if _, err := f.f.ReadAt(dst, t.Offset); err != nil {
		if errors.Is(err, io.EOF) {
			err = fmt.Errorf("%w: the file shrank after it was opened", ErrTruncated)
		}
		return &Error{File: f.path, Tensor: name, Err: err}
	}
	return nil
}

// Close closes the file. It is idempotent.
func (f *File) Close() error {
	err := f.f.Close()
	if errors.Is(err, os.ErrClosed) {
		return nil
	}
	return err
}
