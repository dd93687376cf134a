package safetensors

import (
	"bytes"
	"encoding/binary"
	"math"
	"slices"
	"sort"
	"strconv"
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

// parser is a small JSON parser for the safetensors header. It keeps the
// order of keys, rejects duplicates, and reports positions.
type parser struct {
	b   []byte
	i   int
	lim Limits
}

const maxSkipDepth = 64

func (p *parser) syntax(format string, args ...any) *Error {
	e := errorf("", "", ErrHeaderJSON, format, args...)
	e.Err = fmtAt(e.Err, p.i)
	return e
}

func (p *parser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *parser) peek() byte {
	if p.i < len(p.b) {
		return p.b[p.i]
	}
	return 0
}

func (p *parser) expect(c byte) error {
	p.ws()
	if p.i >= len(p.b) {
		return p.syntax("unexpected end of header, want %q", c)
	}
	if p.b[p.i] != c {
		return p.syntax("unexpected %q, want %q", p.b[p.i], c)
	}
	p.i++
	return nil
}

// object parses the JSON object that comes next, calling member for each
// key with the parser at the key's value, which member must consume. where
// names the object in errors.
func (p *parser) object(where string, member func(key string) error) error {
	if err := p.expect('{'); err != nil {
		return err
	}
	p.ws()
	if p.peek() == '}' {
		p.i++
		return nil
	}
	for {
		p.ws()
		key, err := p.str()
		if err != nil {
			return err
		}
		if err := p.expect(':'); err != nil {
			return err
		}
		p.ws()
		if err := member(key); err != nil {
			return err
		}
		p.ws()
		if p.i >= len(p.b) {
			return p.syntax("unexpected end of header inside %s", where)
		}
		c := p.b[p.i]
		p.i++
		if c == '}' {
			return nil
		}
		if c != ',' {
			p.i--
			return p.syntax("unexpected %q in %s, want ',' or '}'", c, where)
		}
	}
}

// parseTop parses the top-level object.
func (p *parser) parseTop() ([]rawTensor, map[string]string, []string, error) {
	var (
		raws     []rawTensor
		meta     map[string]string
		keys     []string
		seenMeta bool
		names    = map[string]struct{}{}
	)
	err := p.object("the top-level object", func(key string) error {
		if key == MetadataKey {
			if seenMeta {
				return p.syntax("%q appears twice", MetadataKey)
			}
			seenMeta = true
			var err error
			meta, keys, err = p.metadata()
			return err
		}
		if key == "" {
			return errorf("", "", ErrName, "a tensor has an empty name")
		}
		if len(key) > p.lim.MaxNameBytes {
			return errorf("", key, ErrLimit, "name is %d bytes, more than the limit of %d", len(key), p.lim.MaxNameBytes)
		}
		if _, dup := names[key]; dup {
			return errorf("", key, ErrDuplicate, "the header lists this tensor twice")
		}
		if len(raws) >= p.lim.MaxTensors {
			return errorf("", key, ErrLimit, "more than the limit of %d tensors", p.lim.MaxTensors)
		}
		names[key] = struct{}{}
		r, err := p.tensor(key)
		if err != nil {
			return err
		}
		r.order = len(raws)
		raws = append(raws, r)
		return nil
	})
	if err != nil {
		return nil, nil, nil, err
	}
	p.ws()
	if p.i != len(p.b) {
		return nil, nil, nil, p.syntax("unexpected %q after the header object (only space padding may follow)", p.b[p.i])
	}
	return raws, meta, keys, nil
}

func (p *parser) metadata() (map[string]string, []string, error) {
	if p.lit("null") {
		return nil, nil, nil
	}
	// Measure the object before decoding any of it: an oversized one
	// fails without a copy of its strings.
	if n := p.extent(); p.peek() == '{' && int64(n) > p.lim.MaxMetadataBytes {
		return nil, nil, errorf("", "", ErrLimit, "%s is %d bytes, more than the limit of %d (Limits.MaxMetadataBytes); metadata is meant for short strings such as format=pt: remove its large values from the file (they are not weights), or raise the limit",
			MetadataKey, n, p.lim.MaxMetadataBytes)
	}
	meta := map[string]string{}
	keys := []string{}
	err := p.object(MetadataKey, func(k string) error {
		if p.peek() != '"' {
			return p.syntax("%s value of key %q is not a string; metadata maps strings to strings", MetadataKey, shorten(k))
		}
		v, err := p.str()
		if err != nil {
			return err
		}
		if _, dup := meta[k]; dup {
			return p.syntax("%s key %q appears twice", MetadataKey, shorten(k))
		}
		meta[k] = v
		keys = append(keys, k)
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return meta, keys, nil
}

// extent returns the length in bytes of the object or array that starts at
// p.i (p.peek() is '{' or '['), found by matching brackets outside strings; it allocates nothing and
// does not move p.i. A malformed value's extent is where the scan stopped
// (the parse that follows reports what is wrong).
func (p *parser) extent() int {
	depth, inStr := 0, false
	for i := p.i; i < len(p.b); i++ {
		c := p.b[i]
		switch {
		case inStr && c == '\\':
			i++ // the escaped byte; \u's hex digits are plain bytes
		case c == '"':
			inStr = !inStr
		case inStr:
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			if depth--; depth == 0 {
				return i + 1 - p.i
			}
		}
	}
	return len(p.b) - p.i
}

func (p *parser) tensor(name string) (rawTensor, error) {
	r := rawTensor{name: name}
	tagged := func(err error) error {
		if e, ok := err.(*Error); ok && e.Tensor == "" {
			e.Tensor = name
		}
		return err
	}
	err := p.object("a tensor entry", func(k string) error {
		var err error
		dup := false
		switch k {
		case "dtype":
			dup, r.hasD = r.hasD, true
			if !dup {
				if p.peek() != '"' {
					return p.syntax("dtype is not a string")
				}
				r.dtype, err = p.str()
			}
		case "shape":
			dup, r.hasS = r.hasS, true
			if !dup {
				r.shape, err = p.uints(name, "shape", -1)
			}
		case "data_offsets":
			dup, r.hasO = r.hasO, true
			if !dup {
				var off []int64
				if off, err = p.uints(name, "data_offsets", 2); err == nil {
					r.begin, r.end = off[0], off[1]
				}
			}
		default:
			// The reference reader ignores fields it does not know.
			err = p.skip(0)
		}
		if err == nil && dup {
			err = p.syntax("field %q appears twice", k)
		}
		return err
	})
	if err != nil {
		return r, tagged(err)
	}
	switch {
	case !r.hasD:
		return r, tagged(p.syntax("tensor entry has no \"dtype\""))
	case !r.hasS:
		return r, tagged(p.syntax("tensor entry has no \"shape\""))
	case !r.hasO:
		return r, tagged(p.syntax("tensor entry has no \"data_offsets\""))
	}
	return r, nil
}

// uints parses an array of non-negative integers; want is the required
// length, or -1 for any length up to MaxRank.
func (p *parser) uints(name, field string, want int) ([]int64, error) {
	if err := p.expect('['); err != nil {
		return nil, err
	}
	out := []int64{}
	p.ws()
	if p.peek() == ']' {
		p.i++
	} else {
		for {
			p.ws()
			if want < 0 && len(out) >= p.lim.MaxRank {
				return nil, errorf("", name, ErrLimit, "shape has more than the limit of %d dimensions", p.lim.MaxRank)
			}
			if want >= 0 && len(out) >= want {
				return nil, p.syntax("%s has more than %d values", field, want)
			}
			v, err := p.uint(name, field)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
			p.ws()
			if p.i >= len(p.b) {
				return nil, p.syntax("unexpected end of header inside %s", field)
			}
			c := p.b[p.i]
			p.i++
			if c == ']' {
				break
			}
			if c != ',' {
				p.i--
				return nil, p.syntax("unexpected %q in %s, want ',' or ']'", c, field)
			}
		}
	}
	if want >= 0 && len(out) != want {
		return nil, p.syntax("%s has %d values, want %d", field, len(out), want)
	}
	return out, nil
}

// uint parses one JSON integer that must be >= 0 and fit in int64.
func (p *parser) uint(name, field string) (int64, error) {
	start := p.i
	neg := p.peek() == '-'
	if neg {
		p.i++
	}
	ds := p.i
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
	}
	digits := string(p.b[ds:p.i])
	if digits == "" {
		p.i = start
		return 0, p.syntax("%s holds a value that is not an integer", field)
	}
	if len(digits) > 1 && digits[0] == '0' {
		p.i = start
		return 0, p.syntax("%s holds a number with a leading zero", field)
	}
	if c := p.peek(); c == '.' || c == 'e' || c == 'E' {
		p.i = start
		return 0, p.syntax("%s holds a number that is not an integer", field)
	}
	if neg {
		if field == "shape" {
			return 0, errorf("", name, ErrNegativeDim, "shape has the negative dimension -%s", digits)
		}
		return 0, errorf("", name, ErrOffsets, "%s holds the negative value -%s", field, digits)
	}
	v, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		if field == "shape" {
			return 0, errorf("", name, ErrShape, "dimension %s does not fit in 63 bits", digits)
		}
		return 0, errorf("", name, ErrOffsets, "%s value %s does not fit in 63 bits", field, digits)
	}
	return v, nil
}

// lit consumes the literal s if it is next.
func (p *parser) lit(s string) bool {
	if bytes.HasPrefix(p.b[p.i:], []byte(s)) {
		p.i += len(s)
		return true
	}
	return false
}

// str parses a JSON string at p.i (after optional whitespace is skipped by
// the caller). The header is known to be valid UTF-8.
func (p *parser) str() (string, error) {
	if p.peek() != '"' {
		if p.i >= len(p.b) {
			return "", p.syntax("unexpected end of header, want a string")
		}
		return "", p.syntax("unexpected %q, want a string", p.b[p.i])
	}
	p.i++
	start := p.i
	// Fast path: no escapes.
	for p.i < len(p.b) {
		c := p.b[p.i]
		if c == '"' {
			s := string(p.b[start:p.i])
			p.i++
			return s, nil
		}
		if c == '\\' {
			break
		}
		if c < 0x20 {
			return "", p.syntax("control character 0x%02x inside a string", c)
		}
		p.i++
	}
	buf := append([]byte(nil), p.b[start:p.i]...)
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			return string(buf), nil
		case c < 0x20:
			return "", p.syntax("control character 0x%02x inside a string", c)
		case c != '\\':
			buf = append(buf, c)
			p.i++
			continue
		}
		p.i++
		if p.i >= len(p.b) {
			break
		}
		e := p.b[p.i]
		p.i++
		switch e {
		case '"', '\\', '/':
			buf = append(buf, e)
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			r, err := p.hex4()
			if err != nil {
				return "", err
			}
			if r >= 0xD800 && r < 0xDC00 {
				if !p.lit(`\u`) {
					return "", p.syntax("lone UTF-16 surrogate \\u%04x in a string", r)
				}
				r2, err := p.hex4()
				if err != nil {
					return "", err
				}
				if r2 < 0xDC00 || r2 >= 0xE000 {
					return "", p.syntax("invalid UTF-16 surrogate pair \\u%04x\\u%04x in a string", r, r2)
				}
				r = 0x10000 + (r-0xD800)<<10 + (r2 - 0xDC00)
			} else if r >= 0xDC00 && r < 0xE000 {
				return "", p.syntax("lone UTF-16 surrogate \\u%04x in a string", r)
			}
			buf = utf8.AppendRune(buf, r)
		default:
			p.i--
			return "", p.syntax("invalid escape \\%c in a string", e)
		}
	}
	return "", p.syntax("unexpected end of header inside a string")
}

func (p *parser) hex4() (rune, error) {
	if p.i+4 > len(p.b) {
		return 0, p.syntax("short \\u escape")
	}
	var r rune
	for _, c := range p.b[p.i : p.i+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c-'a') + 10
		case c >= 'A' && c <= 'F':
			r |= rune(c-'A') + 10
		default:
			return 0, p.syntax("bad hex digit %q in a \\u escape", c)
		}
	}
	p.i += 4
	return r, nil
}

// skip consumes any JSON value (for fields the reader ignores).
func (p *parser) skip(depth int) error {
	if depth > maxSkipDepth {
		return p.syntax("value nested deeper than %d levels", maxSkipDepth)
	}
	p.ws()
	switch c := p.peek(); {
	case c == '"':
		_, err := p.str()
		return err
	case c == '{' || c == '[':
		closing := byte('}')
		if c == '[' {
			closing = ']'
		}
		p.i++
		p.ws()
		if p.peek() == closing {
			p.i++
			return nil
		}
		for {
			p.ws()
			if c == '{' {
				if _, err := p.str(); err != nil {
					return err
				}
				if err := p.expect(':'); err != nil {
					return err
				}
			}
			if err := p.skip(depth + 1); err != nil {
				return err
			}
			p.ws()
			if p.i >= len(p.b) {
				return p.syntax("unexpected end of header inside a value")
			}
			n := p.b[p.i]
			p.i++
			if n == closing {
				return nil
			}
			if n != ',' {
				p.i--
				return p.syntax("unexpected %q inside a value", n)
			}
		}
	case c == 't':
		if p.lit("true") {
			return nil
		}
	case c == 'f':
		if p.lit("false") {
			return nil
		}
	case c == 'n':
		if p.lit("null") {
			return nil
		}
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	}
	if p.i >= len(p.b) {
		return p.syntax("unexpected end of header, want a value")
	}
	return p.syntax("unexpected %q, want a value", p.b[p.i])
}

// number consumes a JSON number following the JSON grammar.
func (p *parser) number() error {
	digits := func() int {
		s := p.i
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			p.i++
		}
		return p.i - s
	}
	if p.peek() == '-' {
		p.i++
	}
	if p.peek() == '0' {
		p.i++
	} else if digits() == 0 {
		return p.syntax("malformed number")
	}
	if p.peek() == '.' {
		p.i++
		if digits() == 0 {
			return p.syntax("malformed number")
		}
	}
	if c := p.peek(); c == 'e' || c == 'E' {
		p.i++
		if c := p.peek(); c == '+' || c == '-' {
			p.i++
		}
		if digits() == 0 {
			return p.syntax("malformed number")
		}
	}
	return nil
}

// appendMetadata appends the "__metadata__" object of meta, keys in the
// order given, as the reference implementation writes it.
func appendMetadata(b []byte, meta map[string]string, keys []string) []byte {
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendSerdeString(b, k)
		b = append(b, ':')
		b = appendSerdeString(b, meta[k])
	}
	return append(b, '}')
}

// encodeHeader serializes a header the way the reference implementation
// does (see doc.go) and returns the 8-byte length, the padded JSON, and the
// data-region-relative begin offset of each tensor.
func encodeHeader(tensors []TensorInfo, meta map[string]string, keys []string) ([]byte, []int64, int64, error) {
	var b []byte
	b = append(b, 0, 0, 0, 0, 0, 0, 0, 0, '{')
	first := true
	if meta != nil {
		b = append(b, '"')
		b = append(b, MetadataKey...)
		b = append(b, `":`...)
		b = appendMetadata(b, meta, keys)
		first = false
	}
	begins := make([]int64, len(tensors))
	var off int64
	for i, t := range tensors {
		n, err := t.DType.Bytes(t.Shape)
		if err != nil {
			return nil, nil, 0, errorf("", t.Name, ErrShape, "%v", err)
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendSerdeString(b, t.Name)
		b = append(b, `:{"dtype":"`...)
		b = append(b, t.DType.String()...)
		b = append(b, `","shape":[`...)
		for j, d := range t.Shape {
			if j > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, d, 10)
		}
		b = append(b, `],"data_offsets":[`...)
		b = strconv.AppendInt(b, off, 10)
		b = append(b, ',')
		if n > math.MaxInt64-off {
			return nil, nil, 0, errorf("", t.Name, ErrShape, "total data size overflows int64")
		}
		begins[i] = off
		off += n
		b = strconv.AppendInt(b, off, 10)
		b = append(b, "]}"...)
	}
	b = append(b, '}')
	for (len(b)-8)%8 != 0 {
		b = append(b, ' ')
	}
	binary.LittleEndian.PutUint64(b[:8], uint64(len(b)-8))
	return b, begins, off, nil
}

// appendSerdeString appends s as a JSON string escaped exactly as
// serde_json does: '"' and '\\' escaped, the control characters below 0x20
// as \b \t \n \f \r or \u00xx with lower-case hex, everything else (DEL,
// non-ASCII, '<', '&', U+2028) written raw.
func appendSerdeString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"':
			b = append(b, '\\', '"')
		case '\\':
			b = append(b, '\\', '\\')
		case '\b':
			b = append(b, '\\', 'b')
		case '\t':
			b = append(b, '\\', 't')
		case '\n':
			b = append(b, '\\', 'n')
		case '\f':
			b = append(b, '\\', 'f')
		case '\r':
			b = append(b, '\\', 'r')
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// referenceRank is the position of each dtype in the reference
// implementation's Dtype enum (safetensors/src/tensor.rs), which is ordered
// by alignment: BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3,
// F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64. Only the
// relative order of the dtypes this package knows matters.
var referenceRank = map[dtype.DType]int{
	dtype.BOOL: 0, dtype.U8: 4, dtype.I8: 5, dtype.F8E5M2: 6, dtype.F8E4M3: 7,
	dtype.I16: 9, dtype.U16: 10, dtype.F16: 11, dtype.BF16: 12, dtype.I32: 13,
	dtype.U32: 14, dtype.F32: 15, dtype.F64: 17, dtype.I64: 18, dtype.U64: 19,
}

// SortLikeReference sorts tensors in the order the reference writer
// (Python/Rust safetensors save_file) lays them out: by dtype, widest
// alignment first in the reference's enum order, then by name (byte order).
// Create with the sorted list writes what the reference would write.
func SortLikeReference(tensors []TensorInfo) {
	sort.SliceStable(tensors, func(i, j int) bool {
		a, b := referenceRank[tensors[i].DType], referenceRank[tensors[j].DType]
		if a != b {
			return a > b
		}
		return tensors[i].Name < tensors[j].Name
	})
}
