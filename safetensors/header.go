package safetensors

import (
	"bytes"
	"math"
	"slices"
	"sort"
	"unicode/utf8"

	"github.com/weightcast/weightcast/dtype"
)

// MetadataKey is the reserved header key that holds the string-to-string
// metadata map. No tensor may have this name.
const MetadataKey = "__metadata__"

// Limits bound what a header may hold, so that a hostile or broken file
// cannot make the reader allocate without end. A zero field takes its
// default.
type Limits struct {
	// MaxHeaderBytes bounds the JSON header. Default 100,000,000, the limit
	// of the reference implementation.
	MaxHeaderBytes int64
	// MaxTensors bounds the tensors of one file. Default 1,048,576.
	MaxTensors int
	// MaxNameBytes bounds a tensor name in bytes. Default 4096.
	MaxNameBytes int
	// MaxRank bounds the number of dimensions of a shape. Default 64.
	MaxRank int
	// MaxMetadataBytes bounds the "__metadata__" object, counted as the
	// bytes of its JSON in the header. Default 16 MiB: metadata is meant
	// for short strings (format=pt, a config), and a reader that carries
	// it along (weightcast sends it to every receiver with each round)
	// should not hold tens of megabytes of it per file.
	MaxMetadataBytes int64
}

// Default limits.
const (
	DefaultMaxHeaderBytes = 100_000_000
	DefaultMaxTensors     = 1 << 20
	DefaultMaxNameBytes   = 4096
	DefaultMaxRank        = 64
	// DefaultMaxMetadataBytes is Limits.MaxMetadataBytes's default.
	DefaultMaxMetadataBytes = 16 << 20
)

// withDefaults fills the zero fields of l.
func (l Limits) withDefaults() Limits {
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if l.MaxTensors <= 0 {
		l.MaxTensors = DefaultMaxTensors
	}
	if l.MaxNameBytes <= 0 {
		l.MaxNameBytes = DefaultMaxNameBytes
	}
	if l.MaxRank <= 0 {
		l.MaxRank = DefaultMaxRank
	}
	if l.MaxMetadataBytes <= 0 {
		l.MaxMetadataBytes = DefaultMaxMetadataBytes
	}
	return l
}

// Option adjusts Open, OpenModel, Create and CreateModel. An option that
// does not concern the call it is given to is ignored.
type Option func(*options)

type options struct {
	limits        Limits
	metadataOrder []string
	noSync        bool
	fs            FS
}

func buildOptions(opts []Option) options {
	var o options
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	o.limits = o.limits.withDefaults()
	if o.fs == nil {
		o.fs = OS
	}
	return o
}

// WithLimits sets the limits a header is checked against, when reading and
// when writing. Zero fields keep their defaults.
func WithLimits(l Limits) Option { return func(o *options) { o.limits = l } }

// WithMetadataOrder gives Create the order in which to write the metadata
// keys; keys must list every key of the metadata map exactly once. Without
// it the keys are written sorted. File.MetadataKeys gives a source file's
// order.
func WithMetadataOrder(keys []string) Option {
	return func(o *options) { o.metadataOrder = slices.Clone(keys) }
}

// WithoutSync makes Writer.Close (and WriteFileAtomic) skip the fsync
// before the file is renamed into place. Use it for scratch files only.
func WithoutSync() Option { return func(o *options) { o.noSync = true } }

// TensorInfo describes a tensor to be written: what Create needs.
type TensorInfo struct {
	Name  string
	DType dtype.DType
	Shape []int64
}

// Tensor is a tensor of a file: its description and where its bytes lie.
type Tensor struct {
	Name  string
	DType dtype.DType
	Shape []int64
	// Offset is the absolute file offset of the tensor's first byte.
	Offset int64
	// Size is the tensor's length in bytes.
	Size int64
}

// Info returns the TensorInfo of t.
func (t Tensor) Info() TensorInfo {
	return TensorInfo{Name: t.Name, DType: t.DType, Shape: slices.Clone(t.Shape)}
}

// Header is a parsed and validated safetensors header.
type Header struct {
	// Tensors lists the tensors in data order (by data offsets; tensors of
	// size zero at the same offset keep their header order).
	Tensors []Tensor
	// Metadata is the "__metadata__" map, or nil when the header has none
	// (or has null).
	Metadata map[string]string
	// MetadataKeys lists the metadata keys in header order.
	MetadataKeys []string
	// HeaderLen is N, the length of the JSON header with its padding.
	HeaderLen int64
	// DataSize is the length of the data region the header describes.
	DataSize int64
}

// DataOffset returns the absolute file offset where the data region starts.
func (h *Header) DataOffset() int64 { return 8 + h.HeaderLen }

// ParseHeader parses and validates the JSON header of a safetensors file:
// the N bytes that follow the 8-byte length. It checks everything that can
// be checked without the file: JSON syntax, dtypes, shapes against offsets,
// that the tensors cover the data region [0, DataSize) contiguously, with
// no overlap and no gap, and the limits. Errors are *Error values naming the
// tensor; File is left empty.
func ParseHeader(b []byte, opts ...Option) (*Header, error) {
	o := buildOptions(opts)
	return parseHeader(b, o.limits)
}

type rawTensor struct {
	name             string
	dtype            string
	shape            []int64
	begin, end       int64
	hasD, hasS, hasO bool
	order            int
}

// parseHeader is ParseHeader with filled limits.
func parseHeader(b []byte, lim Limits) (*Header, error) {
	if int64(len(b)) > lim.MaxHeaderBytes {
		return nil, errorf("", "", ErrHeaderSize, "header is %d bytes, more than the limit of %d", len(b), lim.MaxHeaderBytes)
	}
	if !utf8.Valid(b) {
		return nil, errorf("", "", ErrHeaderJSON, "header is not valid UTF-8")
	}
	p := &parser{b: b, lim: lim}
	raws, meta, keys, err := p.parseTop()
	if err != nil {
		return nil, err
	}
	h := &Header{Metadata: meta, MetadataKeys: keys, HeaderLen: int64(len(b))}
	h.Tensors = make([]Tensor, 0, len(raws))
	dataStart := 8 + int64(len(b))
	for i := range raws {
		r := &raws[i]
		d, err := dtype.Parse(r.dtype)
		if err != nil || d.String() != r.dtype {
			return nil, errorf("", r.name, ErrDType, "dtype %q is not one this package knows (known: %s)", r.dtype, knownDTypes())
		}
		if len(r.shape) > lim.MaxRank {
			return nil, errorf("", r.name, ErrLimit, "shape has %d dimensions, more than the limit of %d", len(r.shape), lim.MaxRank)
		}
		if r.begin > r.end {
			return nil, errorf("", r.name, ErrOffsets, "data_offsets [%d, %d] end before they begin", r.begin, r.end)
		}
		n, err := d.Bytes(r.shape)
		if err != nil {
			return nil, errorf("", r.name, ErrShape, "shape %v of %s: %v", r.shape, d, err)
		}
		if n != r.end-r.begin {
			return nil, errorf("", r.name, ErrShape, "shape %v of %s needs %d bytes but data_offsets [%d, %d] hold %d",
				r.shape, d, n, r.begin, r.end, r.end-r.begin)
		}
		if r.end > math.MaxInt64-dataStart {
			return nil, errorf("", r.name, ErrOffsets, "data_offsets [%d, %d] are past any possible file size", r.begin, r.end)
		}
		h.Tensors = append(h.Tensors, Tensor{Name: r.name, DType: d, Shape: r.shape, Offset: r.begin, Size: n})
	}
	// Data order: by (begin, end), ties in header order (stable).
	sort.SliceStable(h.Tensors, func(i, j int) bool {
		a, c := h.Tensors[i], h.Tensors[j]
		if a.Offset != c.Offset {
			return a.Offset < c.Offset
		}
		return a.Size < c.Size
	})
	var cursor int64
	for i := range h.Tensors {
		t := &h.Tensors[i]
		switch {
		case t.Offset < cursor:
			prev := h.Tensors[i-1]
			return nil, errorf("", t.Name, ErrOverlap, "bytes [%d, %d) overlap tensor %q at [%d, %d)",
				t.Offset, t.Offset+t.Size, shorten(prev.Name), prev.Offset, prev.Offset+prev.Size)
		case t.Offset > cursor:
			return nil, errorf("", t.Name, ErrGap, "bytes [%d, %d) before this tensor belong to no tensor; the data region must be covered contiguously",
				cursor, t.Offset)
		}
		cursor = t.Offset + t.Size
		t.Offset += dataStart
	}
	h.DataSize = cursor
	return h, nil
}

func knownDTypes() string {
	var b bytes.Buffer
	for i, d := range dtype.All() {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(d.String())
	}
	return b.String()
}
