package wire

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mac"
)

// Limits on what a receiver accepts; a message or tensor past one is
// rejected with an error naming the limit.
const (
	// MaxMetaSize is the largest encoded BucketMeta a receiver decodes.
	MaxMetaSize = 64 << 20
	// MaxNameLen is the longest tensor name, in bytes.
	MaxNameLen = 1024
	// MaxRank is the most dimensions a tensor may have.
	MaxRank = 16
	// MaxEntries is the most entries one bucket may carry.
	MaxEntries = 1 << 20
	// MaxTensors is the most tensors one round may carry.
	MaxTensors = 1 << 20
	// Align is the alignment of every entry's offset within a bucket, so
	// that tensor views of any dtype are aligned.
	Align = 64
)

// Entry places one tensor, or one chunk of a tensor larger than a bucket, in
// a bucket.
type Entry struct {
	Name  string      `json:"name"`
	DType dtype.DType `json:"dtype"`
	Shape []int64     `json:"shape"`
	// Offset is where the entry's bytes start in the bucket.
	Offset int64 `json:"offset"`
	// Size is how many bytes of the tensor this entry carries.
	Size int64 `json:"size"`
	// Chunk is where those bytes start within the tensor: 0 for a whole
	// tensor and for the first chunk of a split one.
	Chunk int64 `json:"chunk"`
	// Total is the tensor's whole byte length.
	Total int64 `json:"total"`
	// Src, in a direct bucket (BucketMeta.Direct), says where the entry's
	// bytes lie in the sender's device memory; nil for an entry of no
	// bytes, and in every other bucket.
	Src *EntrySource `json:"src,omitempty"`
}

// EntrySource places an entry of a direct bucket in the sender's device
// memory: Offset bytes into allocation Alloc of BucketMeta.Direct.Allocs.
type EntrySource struct {
	Alloc  int   `json:"alloc"`
	Offset int64 `json:"offset"`
}

// DirectInfo makes a bucket direct: the sender did not fill it, and every
// receiver copies each entry straight out of the sender's device memory
// (Entry.Src), which it maps with CUDA IPC; no byte of the bucket moves on
// the byte transport. Its checksum (BucketMeta.Checksum) is that of the
// bucket as it would be packed with zeros between the entries, which the
// sender computed from its own tensors.
type DirectInfo struct {
	// PID is the sender's process id: a receiver in the same process
	// reads the allocations at Addr, since a process cannot open the
	// handles it exported.
	PID int `json:"pid"`
	// Allocs are the sender's allocations the bucket's entries lie in.
	Allocs []DirectAlloc `json:"allocs"`
	// Turns, when set, has the receivers copy the round's direct buckets
	// in turns (see DirectTurns).
	Turns *DirectTurns `json:"turns,omitempty"`
}

// DirectTurns has the receivers of a direct round take turns on the GPU
// they share with the sender: processes that share a GPU without MPS time
// slice their kernels, and each hand-over from one process's kernels to
// another's costs about 120-150 µs (docs/benchmarks.md, "What the GPU's
// hand-over between processes costs"), so receivers that copy one after
// another, several buckets at a time, waste far fewer than receivers
// whose copies interleave. Turns are a schedule and never a check: a wait
// that ends early costs speed, never bytes.
//
// The round's buckets fall into groups of Every by Index. Each receiver
// rank r has a 64-bit word, 8 bytes at 8(r-1) of allocation Alloc, and
// the value of group g is Round<<32 | g. Before its first copies of a
// group, receiver r waits on its GPU (cuStreamWaitValue64) until its word
// reaches the group's value (receiver 1 instead waits for the value of
// the group it took before, and not at all for its first); after its last
// copies of the group it raises the next rank's word (receiver 1's, after
// the last rank) to the group's value with an atomic maximum, so that a
// raise landing late never lowers a word. A group ends at the bucket that
// ends its Index range, at the round's last bucket, or at the first
// bucket of the round that is not in it. A receiver that does not take
// turns raises the next rank's word to Round<<32 | 0xffffffff, the round's
// last value, at the round's first bucket; a rank whose round fails writes
// that value into every word. The GPU compares a 64-bit wait cyclically
// (int64(word-value) >= 0), which rounds below 2^31 keep consistent.
type DirectTurns struct {
	// Alloc is the allocation of DirectInfo.Allocs that holds the words.
	Alloc int `json:"alloc"`
	// Receivers counts the ranks that take turns: ranks 1 to Receivers,
	// in that order.
	Receivers int `json:"receivers"`
	// Round numbers the sender's rounds with turns, from 1, below
	// MaxTurnsRound.
	Round uint32 `json:"round"`
	// Every is how many buckets a group holds.
	Every int `json:"every"`
}

// MaxTurnsReceivers is the most receivers that take turns on one GPU.
const MaxTurnsReceivers = 1 << 10

// MaxTurnsRound bounds DirectTurns.Round: values stay below 2^63, where
// the GPU's cyclic comparison of 64-bit words orders them.
const MaxTurnsRound = 1<<31 - 1

// DirectAlloc is one of the sender's device allocations.
type DirectAlloc struct {
	// Handle is the allocation's CUDA IPC handle (gpu.IPCHandle, in hex).
	Handle string `json:"handle"`
	// Size is the allocation's byte length.
	Size int64 `json:"size"`
	// Addr is the allocation's address in the sender's process, in hex
	// (64-bit integers do not survive JSON parsers that use doubles).
	Addr string `json:"addr"`
}

// Complete reports whether the entry finishes its tensor.
func (e *Entry) Complete() bool { return e.Chunk+e.Size == e.Total }

// Whole reports whether the entry holds its entire tensor.
func (e *Entry) Whole() bool { return e.Chunk == 0 && e.Size == e.Total }

// BucketMeta is what the root publishes for each bucket before its bytes
// move: enough for a receiver to check the bytes and rebuild the tensors.
type BucketMeta struct {
	// Seq numbers buckets across the life of a sender: 0, 1, 2, ...,
	// continuing from one round to the next.
	Seq uint64 `json:"seq"`
	// Index numbers the buckets within their round, from 0.
	Index int `json:"index"`
	// Version is the model version the round carries.
	Version uint64 `json:"version"`
	// Length is the number of filled bytes; only these are transferred.
	Length int64 `json:"length"`
	// IsLast marks the last bucket of the round.
	IsLast bool `json:"is_last"`
	// Checksum is checksum.Sum of the filled bytes, or 0 when HasChecksum
	// is false.
	Checksum    uint64 `json:"-"`
	HasChecksum bool   `json:"-"`
	// MAC is the bucket MAC of the filled bytes, when the group has a
	// secret (HasMAC): keyed BLAKE3 under the run's bucket key (package
	// mac), travelling as "bucket_mac", 64 hex digits; or, where MACNonce
	// is set, Poly1305-AES under the run's Poly1305-AES key and that
	// nonce, its 16 bytes MAC's first (mac.PolyTag.AsTag), travelling as
	// "bucket_mac", 32 hex digits, with "mac_nonce", 32 more.
	MAC      mac.Tag    `json:"-"`
	HasMAC   bool       `json:"-"`
	MACNonce *mac.Nonce `json:"-"`
	Entries  []Entry    `json:"entries"`
	// Source describes the model the round carries (its checkpoint
	// layout and metadata). Only the first bucket of a round (Index 0)
	// carries it, and only when the sender's Source has a SourceInfo.
	Source *SourceInfo `json:"source,omitempty"`
	// Direct, when set, makes the bucket direct (see DirectInfo): its
	// entries are read where they lie in the sender's memory.
	Direct *DirectInfo `json:"direct,omitempty"`
}

// SourceInfo describes where a round's tensors come from, so a receiver can
// write them back in the same shape: the checkpoint's __metadata__ and, for
// a sharded checkpoint, which file holds which tensors.
type SourceInfo struct {
	// Format names the source: "synthetic", "safetensors".
	Format string `json:"format"`
	// Metadata is the checkpoint's __metadata__, carried through.
	Metadata map[string]string `json:"metadata,omitempty"`
	// MetadataKeys keeps the order of Metadata's keys as in the source file.
	MetadataKeys []string `json:"metadata_keys,omitempty"`
	// Shards lists the checkpoint's files in order with the tensors of
	// each, in file order. Empty for a source that is not a checkpoint.
	Shards []ShardInfo `json:"shards,omitempty"`
	// IndexMetadata is the "metadata" object of a sharded checkpoint's
	// model.safetensors.index.json, carried through as raw JSON.
	IndexMetadata json.RawMessage `json:"index_metadata,omitempty"`
}

// ShardInfo is one file of a checkpoint.
type ShardInfo struct {
	File    string   `json:"file"`
	Tensors []string `json:"tensors"`
	// DTypes and Shapes, when set, give the dtype and shape of each of
	// Tensors (same length, same order) as the round carries them (after
	// a Cast, the cast dtype). They let a receiver lay out the file's
	// header before its tensors arrive (WriteSafetensors writes every
	// byte in place then). Empty when unknown, as from older senders.
	DTypes []dtype.DType `json:"dtypes,omitempty"`
	Shapes [][]int64     `json:"shapes,omitempty"`
	// Metadata is this file's own __metadata__ when it differs per shard.
	Metadata     map[string]string `json:"metadata,omitempty"`
	MetadataKeys []string          `json:"metadata_keys,omitempty"`
}

// MarshalJSON encodes the metadata in the wire format of docs/protocol.md.
// The checksum travels as a string of exactly 16 lower-case hex digits
// (FormatChecksum): 64-bit integers do not survive JSON parsers that use
// doubles.
func (m *BucketMeta) MarshalJSON() ([]byte, error) {
	type plain BucketMeta // drops the methods, so no recursion
	var sum, tag, nonce string
	if m.HasChecksum {
		sum = FormatChecksum(m.Checksum)
	}
	if m.HasMAC {
		tag = formatTag(m.MAC, m.MACNonce)
	}
	if m.MACNonce != nil {
		nonce = m.MACNonce.String()
	}
	return json.Marshal(struct {
		*plain
		Checksum  string `json:"checksum,omitempty"`
		BucketMAC string `json:"bucket_mac,omitempty"`
		MACNonce  string `json:"mac_nonce,omitempty"`
	}{(*plain)(m), sum, tag, nonce})
}

// FormatChecksum is the wire form of a bucket checksum: exactly 16
// lower-case hex digits, leading zeros included.
func FormatChecksum(sum uint64) string { return fmt.Sprintf("%016x", sum) }

// ParseChecksum reads a checksum's wire form. It also takes the shorter
// form without leading zeros that senders before the fixed width wrote,
// and upper-case digits: 1 to 16 hex digits, nothing else.
func ParseChecksum(s string) (uint64, error) {
	if len(s) < 1 || len(s) > 16 || strings.IndexFunc(s, func(r rune) bool { return !strings.ContainsRune("0123456789abcdefABCDEF", r) }) >= 0 {
		return 0, fmt.Errorf("malformed checksum %q: want 16 hex digits", s)
	}
	return strconv.ParseUint(s, 16, 64)
}

// EncodeMeta returns the wire encoding of m.
func EncodeMeta(m *BucketMeta) ([]byte, error) { return m.MarshalJSON() }

// DecodeMeta parses and checks one bucket's metadata. It rejects a message
// over MaxMetaSize and metadata whose entries do not fit in Length bytes or
// break the other limits.
func DecodeMeta(b []byte) (*BucketMeta, error) {
	if len(b) > MaxMetaSize {
		return nil, fmt.Errorf("bucket metadata of %d bytes exceeds the %d-byte limit", len(b), MaxMetaSize)
	}
	m, ok := decodeCanonical(b)
	if !ok {
		var err error
		if m, err = decodeJSON(b); err != nil {
			return nil, err
		}
	}
	if err := m.Check(); err != nil {
		return nil, err
	}
	return m, nil
}

// decodeJSON parses metadata with encoding/json, whatever its form, and
// says what is wrong with it where it is not metadata.
func decodeJSON(b []byte) (*BucketMeta, error) {
	type plain BucketMeta
	var w struct {
		plain
		Checksum  *string `json:"checksum"`
		BucketMAC *string `json:"bucket_mac"`
		MACNonce  *string `json:"mac_nonce"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return nil, fmt.Errorf("malformed bucket metadata (%d bytes): %w", len(b), err)
	}
	m := (*BucketMeta)(&w.plain)
	if w.Checksum != nil {
		v, err := ParseChecksum(*w.Checksum)
		if err != nil {
			return nil, fmt.Errorf("bucket %d: %w", m.Seq, err)
		}
		m.Checksum, m.HasChecksum = v, true
	}
	if err := m.setMAC(w.BucketMAC, w.MACNonce); err != nil {
		return nil, fmt.Errorf("bucket %d: %w", m.Seq, err)
	}
	return m, nil
}

// Check reports metadata that no sender following the rules produces:
// entries outside the filled length, overlapping entries, chunk ranges
// outside their tensor, sizes that disagree with dtype and shape, or
// limits exceeded.
func (m *BucketMeta) Check() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("bucket %d (index %d, version %d): %s", m.Seq, m.Index, m.Version, fmt.Sprintf(format, a...))
	}
	if m.Length < 0 {
		return bad("negative length %d", m.Length)
	}
	if len(m.Entries) > MaxEntries {
		return bad("%d entries exceed the limit of %d", len(m.Entries), MaxEntries)
	}
	if err := m.checkDirect(); err != nil {
		return bad("%v", err)
	}
	if m.MACNonce != nil && (!m.HasMAC || [mac.Size - mac.PolyTagSize]byte(m.MAC[mac.PolyTagSize:]) != [mac.Size - mac.PolyTagSize]byte{}) {
		return bad("a Poly1305-AES nonce without a Poly1305-AES MAC (16 bytes)")
	}
	end := int64(0)
	for i := range m.Entries {
		e := &m.Entries[i]
		if e.Name == "" || len(e.Name) > MaxNameLen {
			return bad("entry %d has a name of %d bytes (allowed 1..%d)", i, len(e.Name), MaxNameLen)
		}
		if !e.DType.Valid() {
			return bad("tensor %q has an invalid dtype", e.Name)
		}
		if len(e.Shape) > MaxRank {
			return bad("tensor %q has %d dimensions; the limit is %d", e.Name, len(e.Shape), MaxRank)
		}
		total, err := e.DType.Bytes(e.Shape)
		if err != nil || total != e.Total {
			return bad("tensor %q: %s%v is %d bytes but total says %d", e.Name, e.DType, e.Shape, total, e.Total)
		}
		if e.Size < 0 || e.Chunk < 0 || e.Chunk+e.Size > e.Total || (e.Size == 0 && e.Total != 0) {
			return bad("tensor %q: chunk [%d, %d) outside its %d bytes", e.Name, e.Chunk, e.Chunk+e.Size, e.Total)
		}
		if e.Offset < end || e.Offset+e.Size > m.Length {
			return bad("tensor %q: bytes [%d, %d) overlap the previous entry or pass the filled length %d", e.Name, e.Offset, e.Offset+e.Size, m.Length)
		}
		end = e.Offset + e.Size
	}
	return nil
}

// checkDirect checks a direct bucket's allocations and sources: handles
// and addresses that parse, every entry with bytes placed inside one of
// the allocations; and that no other bucket places entries.
func (m *BucketMeta) checkDirect() error {
	d := m.Direct
	if d == nil {
		for i := range m.Entries {
			if m.Entries[i].Src != nil {
				return fmt.Errorf("tensor %q has a source in the sender's memory, but the bucket is not direct", m.Entries[i].Name)
			}
		}
		return nil
	}
	if len(d.Allocs) > MaxEntries {
		return fmt.Errorf("%d allocations exceed the limit of %d", len(d.Allocs), MaxEntries)
	}
	for i, a := range d.Allocs {
		if _, err := gpu.ParseIPCHandle(a.Handle); err != nil {
			return fmt.Errorf("allocation %d: %w", i, err)
		}
		if _, err := strconv.ParseUint(a.Addr, 16, 64); err != nil || a.Size <= 0 {
			return fmt.Errorf("allocation %d: address %q and size %d do not place an allocation", i, a.Addr, a.Size)
		}
	}
	if t := d.Turns; t != nil {
		switch {
		case t.Alloc < 0 || t.Alloc >= len(d.Allocs):
			return fmt.Errorf("the turns' words lie in allocation %d of %d", t.Alloc, len(d.Allocs))
		case t.Receivers < 1 || t.Receivers > MaxTurnsReceivers:
			return fmt.Errorf("turns of %d receivers (allowed 1..%d)", t.Receivers, MaxTurnsReceivers)
		case d.Allocs[t.Alloc].Size < 8*int64(t.Receivers):
			return fmt.Errorf("the turns' words of %d receivers do not fit their %d-byte allocation", t.Receivers, d.Allocs[t.Alloc].Size)
		case t.Round == 0 || t.Round > MaxTurnsRound:
			return fmt.Errorf("turns of round %d (allowed 1..%d)", t.Round, MaxTurnsRound)
		case t.Every < 1 || t.Every > MaxEntries:
			return fmt.Errorf("turns of %d buckets (allowed 1..%d)", t.Every, MaxEntries)
		}
	}
	for i := range m.Entries {
		e := &m.Entries[i]
		src := e.Src
		switch {
		case src == nil && e.Size > 0:
			return fmt.Errorf("tensor %q has no source in the sender's memory in a direct bucket", e.Name)
		case src == nil:
		case src.Alloc < 0 || src.Alloc >= len(d.Allocs):
			return fmt.Errorf("tensor %q lies in allocation %d of %d", e.Name, src.Alloc, len(d.Allocs))
		case src.Offset < 0 || src.Offset > d.Allocs[src.Alloc].Size-e.Size:
			return fmt.Errorf("tensor %q: %d bytes at %d lie outside its %d-byte allocation", e.Name, e.Size, src.Offset, d.Allocs[src.Alloc].Size)
		}
	}
	return nil
}
