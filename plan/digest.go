package plan

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"math"
	"sync"

	"github.com/weightcast/weightcast/layout"
)

// pieceHash hashes every (rank, slice) piece of tensor t of src, with the
// tensor's dtype and shape, into 128 bits (two independent 64-bit mixes),
// and reports whether there was any non-empty piece. Equal hashes stand for
// equal pieces: a 128-bit collision between two tensors of one model is
// not a practical risk.
func pieceHash(src layout.Source, t int, tensor layout.Tensor, ranks int) ([2]uint64, bool) {
	h := mixer{a: 0xcbf29ce484222325, b: 0x9e3779b97f4a7c15}
	h.word(uint64(tensor.DType))
	h.word(uint64(len(tensor.Shape)))
	for _, d := range tensor.Shape {
		h.word(uint64(d))
	}
	any := false
	for r, s := range src.Pieces(t) {
		if s.Empty() {
			continue
		}
		any = true
		h.word(uint64(r))
		for d := range s.Size {
			h.word(uint64(s.Offset[d]))
			h.word(uint64(s.Size[d]))
		}
	}
	return [2]uint64{h.a, h.b}, any
}

type mixer struct{ a, b uint64 }

func (m *mixer) word(x uint64) {
	m.a = (m.a ^ x) * 0x100000001b3
	z := m.b + x + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	m.b = z ^ (z >> 31)
}

// fingerprint is a SHA-256 over a layout: each tensor's name, dtype, shape
// and piece hash.
type fingerprint struct{ h hash.Hash }

func newFingerprint() fingerprint { return fingerprint{sha256.New()} }

func (f fingerprint) tensor(t layout.Tensor, ph [2]uint64) {
	var b []byte
	b = appendString(b, t.Name)
	b = binary.BigEndian.AppendUint64(b, uint64(t.DType))
	b = appendInts(b, t.Shape)
	b = binary.BigEndian.AppendUint64(b, ph[0])
	b = binary.BigEndian.AppendUint64(b, ph[1])
	f.h.Write(b)
}

func (f fingerprint) sum(ranks int) [32]byte {
	f.h.Write(binary.BigEndian.AppendUint64(nil, uint64(ranks)))
	var out [32]byte
	f.h.Sum(out[:0])
	return out
}

// layoutFingerprint computes the fingerprint Make records for src.
func layoutFingerprint(src layout.Source) [32]byte {
	f := newFingerprint()
	for i, t := range src.Tensors() {
		ph, _ := pieceHash(src, i, t, src.NumRanks())
		f.tensor(t, ph)
	}
	return f.sum(src.NumRanks())
}

// Current reports whether senders and receivers describe the layouts p was
// made from (same ranks, tensors and slices): while it holds, p can be
// reused; when not, make a new plan. It reads every piece of both layouts.
func (p *Plan) Current(senders, receivers layout.Source) bool {
	return layoutFingerprint(senders) == p.senderFP && layoutFingerprint(receivers) == p.receiverFP
}

func appendString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}

func appendInts(b []byte, xs []int64) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(len(xs)))
	for _, x := range xs {
		b = binary.BigEndian.AppendUint64(b, uint64(x))
	}
	return b
}

func appendSlice(b []byte, s layout.Slice) []byte {
	return appendInts(appendInts(b, s.Offset), s.Size)
}

// encode returns the SHA-256 of the plan's canonical encoding: a version
// string, the rank counts, the links, every tensor (name, dtype, shape),
// and every group (tensors; regions with receiver, need, region, holders;
// the chosen holders), all integers as 8 bytes big-endian, strings and
// lists length-prefixed.
func (p *Plan) encode() [32]byte {
	h := sha256.New()
	b := appendString(nil, "weightcast plan v1")
	for _, x := range []int64{int64(p.Senders), int64(p.Receivers), int64(p.Links.gpn())} {
		b = binary.BigEndian.AppendUint64(b, uint64(x))
	}
	for _, f := range []float64{p.Links.NIC, p.Links.NVLink, p.Links.Latency} {
		b = binary.BigEndian.AppendUint64(b, math.Float64bits(f))
	}
	if p.Links.Colocated {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(len(p.Tensors)))
	for _, t := range p.Tensors {
		b = appendString(b, t.Name)
		b = binary.BigEndian.AppendUint64(b, uint64(t.DType))
		b = appendInts(b, t.Shape)
	}
	h.Write(b)
	b = binary.BigEndian.AppendUint64(b[:0], uint64(len(p.Groups)))
	for _, g := range p.Groups {
		b = binary.BigEndian.AppendUint64(b, uint64(len(g.Tensors)))
		for _, t := range g.Tensors {
			b = binary.BigEndian.AppendUint64(b, uint64(t))
		}
		b = binary.BigEndian.AppendUint64(b, uint64(len(g.Regions)))
		for _, r := range g.Regions {
			b = binary.BigEndian.AppendUint64(b, uint64(r.Receiver))
			b = appendSlice(b, r.Need)
			b = appendSlice(b, r.Region)
			b = binary.BigEndian.AppendUint64(b, uint64(len(r.Holders)))
			for _, hd := range r.Holders {
				b = binary.BigEndian.AppendUint64(b, uint64(hd.Sender))
				b = appendSlice(b, hd.Held)
			}
			if len(b) > 1<<16 {
				h.Write(b)
				b = b[:0]
			}
		}
		b = binary.BigEndian.AppendUint64(b, uint64(len(g.choices)))
		for _, row := range g.choices {
			b = binary.BigEndian.AppendUint64(b, uint64(len(row)))
			for _, c := range row {
				b = binary.BigEndian.AppendUint64(b, uint64(c))
			}
			if len(b) > 1<<16 {
				h.Write(b)
				b = b[:0]
			}
		}
	}
	h.Write(b)
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// Cache holds the plan of the latest layouts and makes a new one only when
// a layout changed. It is safe for concurrent use.
type Cache struct {
	mu   sync.Mutex
	plan *Plan
}

// Get returns the cached plan while it is current for senders, receivers
// and links, else a new plan; replanned reports which.
func (c *Cache) Get(senders, receivers layout.Source, links Links) (p *Plan, replanned bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.plan != nil && c.plan.Links == links && c.plan.Current(senders, receivers) {
		return c.plan, false, nil
	}
	p, err = Make(senders, receivers, links)
	if err != nil {
		return nil, false, err
	}
	c.plan = p
	return p, true, nil
}
