package wire

import (
	"encoding/json"
	"math"
	"unicode/utf8"

	"github.com/weightcast/weightcast/dtype"
)

// decodeCanonical parses bucket metadata in the form senders write
// (EncodeMeta: keys as docs/protocol.md names them, each once, strings
// without escapes, integers as plain digits), without encoding/json's
// reflection: a receiver decodes every bucket's metadata before its bytes
// can move, and encoding/json took 210 µs for a 1 GiB direct bucket of 37
// tensors on the GPU machine's CPU (docs/benchmarks.md, "Bucket metadata:
// encoding and decoding"). It reports false for anything else — another
// key, a null, an escape, a fraction or an exponent, bytes that are not
// JSON — and then DecodeMeta parses the message with
// encoding/json, which decides what it means or says what is wrong with
// it. So this parser never rejects and never reports an error: where it
// returns true, encoding/json would have built the same BucketMeta
// (FuzzDecodeCanonical checks it). The round's model description
// (BucketMeta.Source), in a round's first message only, is handed to
// encoding/json on its own.
func decodeCanonical(b []byte) (*BucketMeta, bool) {
	d := metaDecoder{b: b}
	m := new(BucketMeta)
	if !d.meta(m) || m.setMAC(d.tag, d.nonce) != nil {
		return nil, false
	}
	d.ws()
	return m, d.i == len(d.b)
}

// metaDecoder reads JSON from b at i; every method reports false where
// the input leaves the canonical form.
type metaDecoder struct {
	b []byte
	i int
	// tag and nonce are the bucket MAC's members, nil where absent: which
	// MAC "bucket_mac" holds depends on "mac_nonce", which may follow it.
	tag, nonce *string
}

// ws skips JSON whitespace.
func (d *metaDecoder) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// eat consumes c, after whitespace.
func (d *metaDecoder) eat(c byte) bool {
	d.ws()
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

// raw reads a string without escapes or control characters, in valid
// UTF-8, and returns its bytes (aliasing b).
func (d *metaDecoder) raw() ([]byte, bool) {
	if !d.eat('"') {
		return nil, false
	}
	start, ascii := d.i, true
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			s := d.b[start:d.i]
			d.i++
			return s, ascii || utf8.Valid(s)
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= 0x80:
			ascii = false
		}
		d.i++
	}
	return nil, false
}

// readString reads a string as raw does.
func (d *metaDecoder) readString() (string, bool) {
	s, ok := d.raw()
	return string(s), ok
}

// digits reads an integer as JSON writes it, without fraction or
// exponent: its sign and its digits (no leading zero but for 0 itself),
// at most 20 of them.
func (d *metaDecoder) digits() (neg bool, ds []byte, ok bool) {
	d.ws()
	if d.i < len(d.b) && d.b[d.i] == '-' {
		neg = true
		d.i++
	}
	start := d.i
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		d.i++
	}
	ds = d.b[start:d.i]
	if len(ds) == 0 || (ds[0] == '0' && len(ds) > 1) || len(ds) > 20 {
		return false, nil, false
	}
	if d.i < len(d.b) {
		switch d.b[d.i] {
		case '.', 'e', 'E':
			return false, nil, false
		}
	}
	return neg, ds, true
}

// magnitude is the value of decimal digits, false where it passes
// uint64's range.
func magnitude(ds []byte) (uint64, bool) {
	var v uint64
	for _, c := range ds {
		if v > (1<<64-1)/10 || v*10 > 1<<64-1-uint64(c-'0') {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	return v, true
}

// readInt64 reads an integer in int64's range.
func (d *metaDecoder) readInt64() (int64, bool) {
	neg, ds, ok := d.digits()
	if !ok {
		return 0, false
	}
	v, ok := magnitude(ds)
	switch {
	case ok && neg && v <= 1<<63:
		return int64(-v), true // -(1<<63) wraps to itself, as it should
	case ok && !neg && v < 1<<63:
		return int64(v), true
	}
	return 0, false
}

// readUint64 reads a non-negative integer in uint64's range.
func (d *metaDecoder) readUint64() (uint64, bool) {
	neg, ds, ok := d.digits()
	if !ok || neg {
		return 0, false
	}
	return magnitude(ds)
}

// readInt reads an integer in int's range.
func (d *metaDecoder) readInt() (int, bool) {
	v, ok := d.readInt64()
	return int(v), ok && int64(int(v)) == v
}

// readBool reads true or false.
func (d *metaDecoder) readBool() (bool, bool) {
	d.ws()
	for _, w := range []string{"true", "false"} {
		if len(d.b)-d.i >= len(w) && string(d.b[d.i:d.i+len(w)]) == w {
			d.i += len(w)
			return w == "true", true
		}
	}
	return false, false
}

// object reads an object, field reading each member's value (false for a
// key it does not know); a key met twice leaves the canonical form.
func (d *metaDecoder) object(field func(key []byte) bool) bool {
	if !d.eat('{') {
		return false
	}
	if d.eat('}') {
		return true
	}
	var seen [16][]byte // no object of the metadata has more keys
	for n := 0; ; n++ {
		k, ok := d.raw()
		if !ok || n == len(seen) || !d.eat(':') {
			return false
		}
		for _, s := range seen[:n] {
			if string(s) == string(k) {
				return false
			}
		}
		seen[n] = k
		if !field(k) {
			return false
		}
		if d.eat('}') {
			return true
		}
		if !d.eat(',') {
			return false
		}
	}
}

// text reads a string and hands it to parse, which fails where the
// string is not what the field holds.
func (d *metaDecoder) text(parse func(string) error) bool {
	s, ok := d.raw()
	return ok && parse(string(s)) == nil
}

// array reads an array, elem reading each element; an empty array is
// an empty slice, not nil, for the caller to make (as encoding/json).
func (d *metaDecoder) array(elem func() bool) bool {
	if !d.eat('[') {
		return false
	}
	if d.eat(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		if d.eat(']') {
			return true
		}
		if !d.eat(',') {
			return false
		}
	}
}

// objectBytes passes over one JSON object and returns its bytes, for
// encoding/json to read: from its brace to the one that closes it,
// whatever lies between but the quotes of its strings.
func (d *metaDecoder) objectBytes() ([]byte, bool) {
	d.ws()
	start, depth := d.i, 0
	for d.i < len(d.b) {
		c := d.b[d.i]
		d.i++
		switch {
		case d.i == start+1 && c != '{':
			return nil, false
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			if depth--; depth == 0 {
				return d.b[start:d.i], true
			}
		case c == '"':
			for d.i < len(d.b) && d.b[d.i] != '"' {
				if d.b[d.i] == '\\' {
					d.i++
				}
				d.i++
			}
			d.i++ // the closing quote, or past the end
		}
	}
	return nil, false
}

// meta reads the top-level object.
func (d *metaDecoder) meta(m *BucketMeta) bool {
	return d.object(func(k []byte) (ok bool) {
		switch string(k) {
		case "seq":
			m.Seq, ok = d.readUint64()
		case "index":
			m.Index, ok = d.readInt()
		case "version":
			m.Version, ok = d.readUint64()
		case "length":
			m.Length, ok = d.readInt64()
		case "is_last":
			m.IsLast, ok = d.readBool()
		case "entries":
			m.Entries = []Entry{}
			ok = d.array(func() bool {
				m.Entries = append(m.Entries, Entry{})
				return d.entry(&m.Entries[len(m.Entries)-1])
			})
		case "direct":
			m.Direct = new(DirectInfo)
			ok = d.direct(m.Direct)
		case "checksum":
			m.HasChecksum = true
			ok = d.text(func(s string) (err error) { m.Checksum, err = ParseChecksum(s); return err })
		case "bucket_mac":
			ok = d.tag == nil && d.text(func(s string) error { d.tag = &s; return nil })
		case "mac_nonce":
			ok = d.nonce == nil && d.text(func(s string) error { d.nonce = &s; return nil })
		case "source":
			raw, found := d.objectBytes()
			m.Source = new(SourceInfo)
			ok = found && json.Unmarshal(raw, m.Source) == nil
		}
		return ok
	})
}

// entry reads one element of "entries".
func (d *metaDecoder) entry(e *Entry) bool {
	return d.object(func(k []byte) (ok bool) {
		switch string(k) {
		case "name":
			e.Name, ok = d.readString()
		case "dtype":
			ok = d.text(func(s string) (err error) { e.DType, err = dtype.Parse(s); return err })
		case "shape":
			e.Shape = []int64{}
			ok = d.array(func() bool {
				v, ok := d.readInt64()
				e.Shape = append(e.Shape, v)
				return ok
			})
		case "offset":
			e.Offset, ok = d.readInt64()
		case "size":
			e.Size, ok = d.readInt64()
		case "chunk":
			e.Chunk, ok = d.readInt64()
		case "total":
			e.Total, ok = d.readInt64()
		case "src":
			e.Src = new(EntrySource)
			ok = d.object(func(k []byte) (ok bool) {
				switch string(k) {
				case "alloc":
					e.Src.Alloc, ok = d.readInt()
				case "offset":
					e.Src.Offset, ok = d.readInt64()
				}
				return ok
			})
		}
		return ok
	})
}

// direct reads "direct".
func (d *metaDecoder) direct(di *DirectInfo) bool {
	return d.object(func(k []byte) (ok bool) {
		switch string(k) {
		case "pid":
			di.PID, ok = d.readInt()
		case "allocs":
			di.Allocs = []DirectAlloc{}
			ok = d.array(func() bool {
				di.Allocs = append(di.Allocs, DirectAlloc{})
				a := &di.Allocs[len(di.Allocs)-1]
				return d.object(func(k []byte) (ok bool) {
					switch string(k) {
					case "handle":
						a.Handle, ok = d.readString()
					case "size":
						a.Size, ok = d.readInt64()
					case "addr":
						a.Addr, ok = d.readString()
					}
					return ok
				})
			})
		case "turns":
			t := new(DirectTurns)
			di.Turns = t
			ok = d.object(func(k []byte) (ok bool) {
				switch string(k) {
				case "alloc":
					t.Alloc, ok = d.readInt()
				case "receivers":
					t.Receivers, ok = d.readInt()
				case "round":
					var r uint64
					r, ok = d.readUint64()
					t.Round = uint32(r)
					ok = ok && r <= math.MaxUint32
				case "every":
					t.Every, ok = d.readInt()
				}
				return ok
			})
		}
		return ok
	})
}
