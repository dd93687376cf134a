package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
)

// KeySize is the size of every derived key, and of every MAC.
const KeySize = 32

// Keys are the keys of one run of one group, derived from its secret by
// Secret.RunKeys. A nil *Keys means the group runs without a secret:
// SignRecord and OpenRecord work on it (see there), the other methods must
// not be called. Keys are safe for concurrent use.
type Keys struct {
	group, runID string
	record       [KeySize]byte
	handshake    [KeySize]byte
	bucket       [KeySize]byte
	poly         [KeySize]byte
	message      [KeySize]byte
}

// Group is the group the keys belong to.
func (k *Keys) Group() string { return k.group }

// RunID is the run the keys belong to.
func (k *Keys) RunID() string { return k.runID }

// BucketKey is the key of the per-bucket MAC (a keyed BLAKE3 of each
// bucket's bytes): the same on every rank of the run, and on no other run.
func (k *Keys) BucketKey() [KeySize]byte { return k.bucket }

// BucketPolyKey is the key of the per-bucket MAC where the sender computes
// Poly1305-AES (package mac: the AES-128 key, then r): derived as the
// other keys are, under its own label, so that it shares no bits with the
// keyed BLAKE3 bucket key.
func (k *Keys) BucketPolyKey() [KeySize]byte { return k.poly }

// messageContext starts every message MAC, so that no other MAC of the
// project's can be taken for one.
const messageContext = "weightcast message v1"

// MessageMAC returns the MAC of msg, the payload of message seq of the
// metadata bus (bucket metadata or a commit message): HMAC-SHA256 with the
// run's message key over "weightcast message v1", seq as a big-endian u64
// and msg. The sequence number ties the MAC to the message's place in the
// run, so that no message can be replayed in another.
func (k *Keys) MessageMAC(seq uint64, msg []byte) [KeySize]byte {
	m := hmac.New(sha256.New, k.message[:])
	m.Write([]byte(messageContext))
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seq)
	m.Write(b[:])
	m.Write(msg)
	var tag [KeySize]byte
	m.Sum(tag[:0])
	return tag
}

// VerifyMessage checks, in constant time, that tag is MessageMAC(seq,
// msg). A tag that does not verify fails with an error wrapping ErrFailed.
func (k *Keys) VerifyMessage(seq uint64, msg, tag []byte) error {
	want := k.MessageMAC(seq, msg)
	if !hmac.Equal(tag, want[:]) {
		return fmt.Errorf("%w: the MAC of message %d does not verify: a process without this run's secret wrote or changed it, or the ranks were given different secrets", ErrFailed, seq)
	}
	return nil
}

// recordTag separates a value from its MAC in a signed record; the MAC
// follows it as 64 lower-case hex digits.
const recordTag = "\nwcmac1:"

// RecordOverhead is how many bytes SignRecord adds to a value.
const RecordOverhead = len(recordTag) + 2*KeySize

// RecordError is a record that does not verify. It wraps ErrFailed.
type RecordError struct {
	Key string
	// Unsigned: the record carries no MAC, and the reader has a secret.
	Unsigned bool
	// NoSecret: the record carries a MAC, and the reader has no secret.
	// When neither is set, the MAC does not verify.
	NoSecret bool
}

func (e *RecordError) Error() string {
	switch {
	case e.Unsigned:
		return fmt.Sprintf("authentication failed: the record at key %q is not signed, so a process without the group secret wrote it", e.Key)
	case e.NoSecret:
		return fmt.Sprintf("authentication failed: the record at key %q is signed with a group secret, and this process has none", e.Key)
	}
	return fmt.Sprintf("authentication failed: the record at key %q is signed with another key: a process without this run's secret wrote or changed it, or the ranks were given different secrets", e.Key)
}

func (e *RecordError) Unwrap() error { return ErrFailed }

func (k *Keys) recordMAC(key string, value []byte) []byte {
	m := hmac.New(sha256.New, k.record[:])
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(key)))
	m.Write(n[:])
	m.Write([]byte(key))
	m.Write(value)
	return m.Sum(nil)
}

// SignRecord returns value followed by its MAC under store key key
// (HMAC-SHA256 over the key's length, the key and the value, with the
// run's record key), as it is written to the store. On nil Keys (no
// secret) it returns value.
func (k *Keys) SignRecord(key string, value []byte) []byte {
	if k == nil {
		return value
	}
	out := make([]byte, 0, len(value)+RecordOverhead)
	out = append(out, value...)
	out = append(out, recordTag...)
	return hex.AppendEncode(out, k.recordMAC(key, value))
}

// OpenRecord checks a record that SignRecord made for key and returns its
// value. A record that is not signed, or whose MAC does not verify (it was
// signed for another key, in another run, with another secret, or changed),
// fails with a *RecordError. On nil Keys (no secret) it returns the record
// as it is, unless the record is signed: its writer had a secret that this
// reader lacks.
func (k *Keys) OpenRecord(key string, signed []byte) ([]byte, error) {
	n := len(signed) - RecordOverhead
	tagged := n >= 0 && string(signed[n:n+len(recordTag)]) == recordTag
	if k == nil {
		if tagged {
			return nil, &RecordError{Key: key, NoSecret: true}
		}
		return signed, nil
	}
	if !tagged {
		return nil, &RecordError{Key: key, Unsigned: true}
	}
	value := signed[:n]
	// Compared as text, so the one spelling SignRecord writes (lower-case
	// hex) is the only one accepted.
	want := hex.AppendEncode(nil, k.recordMAC(key, value))
	if !hmac.Equal(signed[n+len(recordTag):], want) {
		return nil, &RecordError{Key: key}
	}
	return value, nil
}

// Role is the side of a handshake a proof speaks for.
type Role byte

const (
	// Initiator is the side that connected.
	Initiator Role = 1
	// Responder is the side that accepted the connection.
	Responder Role = 2
)

func (r Role) String() string {
	switch r {
	case Initiator:
		return "initiator"
	case Responder:
		return "responder"
	}
	return fmt.Sprintf("role %d", byte(r))
}

// Transcript is what a handshake proof covers, besides the run's group and
// id (which the Keys carry).
type Transcript struct {
	// Protocol names the protocol ("zmqbus", "tcp", "ipc") and Version
	// its version.
	Protocol string
	Version  uint32
	// Initiator and Responder are the ranks the two sides claim; World
	// the world size both agreed on.
	Initiator, Responder int
	World                int
	// InitiatorNonce and ResponderNonce are the fresh nonces each side
	// sent.
	InitiatorNonce, ResponderNonce Nonce
	// Binding ties the proof to one connection (TLSBinding on TLS); nil
	// on a plain connection.
	Binding []byte
}

func (k *Keys) proof(role Role, t Transcript) []byte {
	m := hmac.New(sha256.New, k.handshake[:])
	m.Write([]byte("weightcast handshake v1"))
	m.Write([]byte{byte(role)})
	writeField(m, []byte(t.Protocol))
	writeUint(m, t.Version)
	writeField(m, []byte(k.group))
	writeField(m, []byte(k.runID))
	for _, v := range []int{t.Initiator, t.Responder, t.World} {
		writeUint(m, uint32(int32(v)))
	}
	m.Write(t.InitiatorNonce[:])
	m.Write(t.ResponderNonce[:])
	writeField(m, t.Binding)
	return m.Sum(nil)
}

func writeUint(h hash.Hash, v uint32) {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	h.Write(b[:])
}

func writeField(h hash.Hash, b []byte) {
	writeUint(h, uint32(len(b)))
	h.Write(b)
}

// Prove returns the proof that the side playing role holds the run's
// secret: an HMAC-SHA256 over t with the run's handshake key.
func (k *Keys) Prove(role Role, t Transcript) [KeySize]byte {
	var p [KeySize]byte
	copy(p[:], k.proof(role, t))
	return p
}

// Verify checks, in constant time, the proof of the side playing role. A
// proof that does not verify fails with an error wrapping ErrFailed.
func (k *Keys) Verify(role Role, t Transcript, proof []byte) error {
	if !hmac.Equal(proof, k.proof(role, t)) {
		return fmt.Errorf("%w: the %s's proof does not verify: it does not hold this run's group secret, or it answered another handshake", ErrFailed, role)
	}
	return nil
}
