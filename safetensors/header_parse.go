package safetensors

// The header's JSON reader: a small parser that keeps the order of keys,
// rejects duplicates, bounds nesting and reports positions (ParseHeader in
// header.go builds the Header from what it reads).

import (
	"bytes"
	"strconv"
	"unicode/utf8"
)

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
