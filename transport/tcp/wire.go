package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/weightcast/weightcast/transport/internal/handshake"
)

// The wire format. Every integer is big-endian.
//
// Each connection (rank r dials rank r+1) opens with the handshake of
// package transport/internal/handshake, with this magic and version (over
// TLS 1.3 first when the config has TLS). Frames follow, each a 32-byte
// header possibly followed by a payload:
//
//	magic u32 | version u16 | kind u8 | code u8 | seq u64 | a u64 | b u64
//
// Downstream (toward the tail) a bucket is one kindBucket frame (a = length,
// b = chunk size) and then one kindChunk frame per chunk (a = offset,
// b = length, followed by the chunk's bytes), or a kindAbort frame at any
// frame boundary. Upstream (toward the root) flows one kindAck per bucket, or
// a kindNack. Abort and nack frames carry a = culprit rank + 1 (0: unknown),
// b = message length, code = what went wrong, followed by the message.
const (
	magic    uint32 = 0x77637470 // "wctp"
	version  uint16 = 2          // 2: the handshake with nonces and proofs
	frameLen        = 32
	maxGroup        = handshake.MaxGroup
	maxMsg          = 4096
	maxChunk        = 1 << 30
	minChunk        = 1 << 10
)

type kind uint8

const (
	kindBucket kind = 1 + iota
	kindChunk
	kindAbort
	kindAck
	kindNack
)

func (k kind) String() string {
	switch k {
	case kindBucket:
		return "bucket header"
	case kindChunk:
		return "chunk"
	case kindAbort:
		return "abort"
	case kindAck:
		return "acknowledgement"
	case kindNack:
		return "failure notice"
	}
	return fmt.Sprintf("unknown frame kind %d", uint8(k))
}

// Codes say what went wrong in abort and nack frames.
const (
	codeNone     uint8 = 0
	codePeerGone uint8 = 1 // maps to transport.ErrPeerGone
	codeTimeout  uint8 = 2 // maps to transport.ErrTimeout
	codeMismatch uint8 = 3 // ranks disagree on the bucket sequence
	codeAborted  uint8 = 4 // cancelled, bad arguments, protocol errors
)

type frame struct {
	kind kind
	code uint8
	seq  uint64
	a, b uint64
}

func (f frame) put(p []byte) {
	binary.BigEndian.PutUint32(p[0:], magic)
	binary.BigEndian.PutUint16(p[4:], version)
	p[6] = byte(f.kind)
	p[7] = f.code
	binary.BigEndian.PutUint64(p[8:], f.seq)
	binary.BigEndian.PutUint64(p[16:], f.a)
	binary.BigEndian.PutUint64(p[24:], f.b)
}

// errProtocol marks bytes that do not follow the wire format.
var errProtocol = errors.New("protocol error")

func parseFrame(p []byte) (frame, error) {
	if m := binary.BigEndian.Uint32(p[0:]); m != magic {
		return frame{}, fmt.Errorf("%w: frame starts with %#08x, not the tcp transport's magic %#08x", errProtocol, m, magic)
	}
	if v := binary.BigEndian.Uint16(p[4:]); v != version {
		return frame{}, fmt.Errorf("%w: frame of protocol version %d, this rank speaks %d", errProtocol, v, version)
	}
	return frame{kind: kind(p[6]), code: p[7], seq: binary.BigEndian.Uint64(p[8:]),
		a: binary.BigEndian.Uint64(p[16:]), b: binary.BigEndian.Uint64(p[24:])}, nil
}

// readFrame reads one frame header into hdr (frameLen bytes) and, for abort
// and nack frames, the message that follows it.
func readFrame(r io.Reader, hdr []byte) (frame, string, error) {
	if _, err := io.ReadFull(r, hdr[:frameLen]); err != nil {
		return frame{}, "", err
	}
	f, err := parseFrame(hdr)
	if err != nil {
		return frame{}, "", err
	}
	if f.kind != kindAbort && f.kind != kindNack {
		return f, "", nil
	}
	if f.b > maxMsg {
		return frame{}, "", fmt.Errorf("%w: %v message of %d bytes, the limit is %d", errProtocol, f.kind, f.b, maxMsg)
	}
	msg := make([]byte, f.b)
	if _, err := io.ReadFull(r, msg); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return frame{}, "", err
	}
	return f, string(msg), nil
}

// notice encodes an abort or nack frame with its message.
func notice(k kind, code uint8, seq uint64, culprit int, msg string) []byte {
	if len(msg) > maxMsg {
		msg = msg[:maxMsg]
	}
	p := make([]byte, frameLen+len(msg))
	frame{kind: k, code: code, seq: seq, a: uint64(culprit + 1), b: uint64(len(msg))}.put(p)
	copy(p[frameLen:], msg)
	return p
}
