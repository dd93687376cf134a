package route

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/mac"
)

// A bucket's seal is its last bytes, after the payload: nothing (no
// checksums), the payload's 64-bit checksum (package checksum), or with a
// group secret a 32-byte tag: HMAC-SHA256 under the run's message key
// (auth.Keys.MessageMAC, bound to the pair's bucket seq) of
//
//	"weightcast route" | version u64 | sender u32 | receiver u32 | n u64 | keyed BLAKE3 of the payload (32 bytes)
//
// so that a bucket cannot be replayed into another round, pair or place of
// the stream.

// sealer seals and checks the buckets of one rank's rounds.
type sealer struct {
	checksum bool
	keys     *auth.Keys
}

// size returns the seal's length.
func (s sealer) size() int {
	switch {
	case s.keys != nil:
		return mac.Size
	case s.checksum:
		return 8
	}
	return 0
}

// bind is what a tag covers besides the payload's keyed hash.
func bind(version uint64, from, to int, n int, tag mac.Tag) []byte {
	b := make([]byte, 0, 16+8+8+8+mac.Size)
	b = append(b, "weightcast route"...)
	b = binary.BigEndian.AppendUint64(b, version)
	b = binary.BigEndian.AppendUint32(b, uint32(from))
	b = binary.BigEndian.AppendUint32(b, uint32(to))
	b = binary.BigEndian.AppendUint64(b, uint64(n))
	return append(b, tag[:]...)
}

// compute returns the seal of payload, bucket seq of the pair from → to
// in round version, computed on the CPU.
func (s sealer) compute(payload []byte, version uint64, from, to int, seq uint64) []byte {
	switch {
	case s.keys != nil:
		key := mac.Key(s.keys.BucketKey())
		return s.fromDigest(0, mac.SumParallel(&key, payload), version, from, to, len(payload), seq)
	case s.checksum:
		return s.fromDigest(checksum.SumParallel(payload), mac.Tag{}, version, from, to, len(payload), seq)
	}
	return nil
}

// fromDigest returns the seal of a payload of n bytes whose checksum is
// sum or, with keys, whose keyed BLAKE3 tag is tag (computed wherever the
// payload lies).
func (s sealer) fromDigest(sum uint64, tag mac.Tag, version uint64, from, to, n int, seq uint64) []byte {
	switch {
	case s.keys != nil:
		t := s.keys.MessageMAC(seq, bind(version, from, to, n, tag))
		return t[:]
	case s.checksum:
		return binary.BigEndian.AppendUint64(nil, sum)
	}
	return nil
}

// ErrCorrupt is wrapped by the error of a bucket whose bytes do not match
// their seal: changed on the way, or, with a group secret, not sent by a
// holder of it.
var ErrCorrupt = errors.New("bucket bytes do not match their seal")

// verify compares the seal a bucket's bytes give, want, with the one it
// carries, got: bucket seq from rank from.
func (s sealer) verify(want, got []byte, from int, seq uint64) error {
	if s.keys != nil {
		var a, b mac.Tag
		copy(a[:], want)
		copy(b[:], got)
		if !a.Equal(b) {
			return fmt.Errorf("%w: the MAC of bucket %d from rank %d does not verify (%w)", ErrCorrupt, seq, from, auth.ErrFailed)
		}
		return nil
	}
	if string(want) != string(got) {
		return fmt.Errorf("%w: the checksum of bucket %d from rank %d is %x, its bytes sum to %x", ErrCorrupt, seq, from, got, want)
	}
	return nil
}
