package route

import (
	"fmt"
	"slices"

	"github.com/weightcast/weightcast/layout"
	"github.com/weightcast/weightcast/plan"
)

// Segment is one contiguous run of a bucket: Len bytes of plan tensor
// Tensor, from offset Src of the sender's local tensor Held to offset Dst
// of the receiver's local tensor, at offset Off of the bucket.
type Segment struct {
	Tensor        int
	Held          int // index into Stream.Held: which of the sender's local tensors
	Need          int // index into Schedule.Needs on a receiver: which of its local tensors
	Src, Dst, Len int64
	Off           int64
}

// Bucket is one bucket of a pair's stream: its segments and the bytes
// they span (before the seal), the gaps between them included.
type Bucket struct {
	Segments []Segment
	Bytes    int64
}

// Stream is what one sender sends one receiver in a round, bucket by
// bucket, as both ends compute it from the plan.
type Stream struct {
	Sender, Receiver int // global ranks
	Buckets          []Bucket
	Bytes            int64
	// Held lists the sender's local tensors the stream reads: plan tensor
	// index and the sender's slice.
	Held []Held
}

// Held names one local tensor of a sender: plan tensor Tensor, slice
// Slice.
type Held struct {
	Tensor int
	Slice  layout.Slice
}

// Schedule is one rank's part of a plan: a stream per peer it exchanges
// bytes with, by the peer's global rank, in rank order.
type Schedule struct {
	Plan    *plan.Plan
	Rank    int
	Senders int
	Streams []*Stream
	// Needs lists a receiver's local tensors: plan tensor index and the
	// slice, for every tensor it needs (empty on a sender).
	Needs []Held
}

// NewSchedule returns rank's part of p for buckets of capacity payload
// bytes; ranks [0, senders) send. Every rank computes the same buckets for
// a pair from the same plan and capacity.
func NewSchedule(p *plan.Plan, rank, senders int, capacity int64) (*Schedule, error) {
	if capacity <= 0 {
		return nil, fmt.Errorf("route: a bucket capacity of %d bytes", capacity)
	}
	sc := &Schedule{Plan: p, Rank: rank, Senders: senders}
	sending := rank < senders
	byPeer := map[int]*Stream{}
	heldIndex := map[*Stream]map[string]int{}
	needIndex := map[string]int{}
	for m := range p.Moves() {
		snd, rcv := m.Sender, senders+m.Receiver
		need := 0
		if !sending && rcv == rank {
			k := fmt.Sprint(m.Tensor, m.Need)
			i, ok := needIndex[k]
			if !ok {
				i = len(sc.Needs)
				needIndex[k] = i
				sc.Needs = append(sc.Needs, Held{m.Tensor, m.Need.Clone()})
			}
			need = i
		}
		peer := rcv
		if !sending {
			peer = snd
		}
		if (sending && snd != rank) || (!sending && rcv != rank) {
			continue
		}
		st := byPeer[peer]
		if st == nil {
			st = &Stream{Sender: snd, Receiver: rcv}
			byPeer[peer] = st
			heldIndex[st] = map[string]int{}
			sc.Streams = append(sc.Streams, st)
		}
		hk := fmt.Sprint(m.Tensor, m.Held)
		h, ok := heldIndex[st][hk]
		if !ok {
			h = len(st.Held)
			heldIndex[st][hk] = h
			st.Held = append(st.Held, Held{m.Tensor, m.Held.Clone()})
		}
		es := p.Tensors[m.Tensor].DType.Size()
		for run := range m.Runs(es) {
			st.add(Segment{Tensor: m.Tensor, Held: h, Need: need, Src: run.Src, Dst: run.Dst, Len: run.Len}, capacity)
		}
	}
	sortStreams(sc.Streams, sending)
	return sc, nil
}

// add appends run (a segment without its bucket offset) to the stream's
// buckets, splitting it where a bucket fills. Each segment starts on an
// 8-byte word of its bucket (the GPU's fused copy and checksum needs it);
// the bytes between segments are the bucket's, sent and sealed with it.
func (st *Stream) add(run Segment, capacity int64) {
	for run.Len > 0 {
		if len(st.Buckets) == 0 || align8(st.Buckets[len(st.Buckets)-1].Bytes) >= capacity {
			st.Buckets = append(st.Buckets, Bucket{})
		}
		b := &st.Buckets[len(st.Buckets)-1]
		seg := run
		seg.Off = align8(b.Bytes)
		seg.Len = min(run.Len, capacity-seg.Off)
		b.Segments = append(b.Segments, seg)
		b.Bytes = seg.Off + seg.Len
		st.Bytes += seg.Len
		run.Src, run.Dst, run.Len = run.Src+seg.Len, run.Dst+seg.Len, run.Len-seg.Len
	}
}

// align8 rounds n up to a multiple of 8.
func align8(n int64) int64 { return (n + 7) &^ 7 }

// sortStreams orders streams by peer rank.
func sortStreams(ss []*Stream, sending bool) {
	slices.SortFunc(ss, func(a, b *Stream) int {
		if sending {
			return a.Receiver - b.Receiver
		}
		return a.Sender - b.Sender
	})
}

// Bytes returns the payload bytes of every stream of the schedule: what
// the rank sends (a sender) or receives (a receiver) in a round.
func (sc *Schedule) Bytes() int64 {
	var n int64
	for _, st := range sc.Streams {
		n += st.Bytes
	}
	return n
}
