package zmqbus

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/weightcast/weightcast/auth"
)

// ProtocolVersion is the version of the frame format this package speaks,
// carried in byte 2 of every header frame (see docs/protocol.md).
const ProtocolVersion = 1

// Message types, byte 3 of the header frame.
const (
	typeHello     byte = 1 // receiver → root: join the bus
	typeWelcome   byte = 2 // root → receiver: joined
	typeData      byte = 3 // root → receiver: one metadata message
	typeAck       byte = 4 // receiver → root: message seq handled
	typeHeartbeat byte = 5 // both ways: still alive
	typeError     byte = 6 // both ways: the sender gives up, with a reason
	typeBye       byte = 7 // both ways: the sender closes deliberately
	typeChallenge byte = 8 // root → receiver, with a group secret: the root's nonce and proof
	typeProof     byte = 9 // receiver → root, with a group secret: the receiver's proof
)

func typeName(t byte) string {
	switch t {
	case typeHello:
		return "HELLO"
	case typeWelcome:
		return "WELCOME"
	case typeData:
		return "DATA"
	case typeAck:
		return "ACK"
	case typeHeartbeat:
		return "HEARTBEAT"
	case typeError:
		return "ERROR"
	case typeBye:
		return "BYE"
	case typeChallenge:
		return "CHALLENGE"
	case typeProof:
		return "PROOF"
	}
	return fmt.Sprintf("type %d", t)
}

// Error codes carried by ERROR frames (header bytes 4..7).
const (
	codeProtocol  uint32 = 1  // malformed frame, bad sequence number, unexpected message
	codeVersion   uint32 = 2  // unsupported protocol version
	codeGroup     uint32 = 3  // HELLO for another group
	codeWorldSize uint32 = 4  // HELLO with another world size
	codeRank      uint32 = 5  // rank out of range, or identity that does not match it
	codeDuplicate uint32 = 6  // rank already joined
	codeTooLarge  uint32 = 7  // message over a size limit
	codePeerGone  uint32 = 8  // the root aborts because some rank is gone
	codeAborted   uint32 = 9  // the root's round failed for another reason (the text says which)
	codeAuth      uint32 = 10 // authentication failed: another group secret, or none where one is needed
)

const (
	headerLen  = 16
	helloLen   = 26 // fixed part, before the group name
	welcomeLen = 12

	// maxGroupLen bounds the group name in HELLO.
	maxGroupLen = 1024
	// maxErrorText bounds the reason text of an ERROR frame.
	maxErrorText = 4096
	// controlLimit bounds every frame other than a DATA payload.
	controlLimit = 64 << 10
)

var magic = [2]byte{'W', 'C'}

// header is frame 1 of every message.
type header struct {
	version byte
	typ     byte
	code    uint32
	seq     uint64
}

func encodeHeader(typ byte, code uint32, seq uint64) []byte {
	b := make([]byte, headerLen)
	b[0], b[1] = magic[0], magic[1]
	b[2] = ProtocolVersion
	b[3] = typ
	binary.LittleEndian.PutUint32(b[4:], code)
	binary.LittleEndian.PutUint64(b[8:], seq)
	return b
}

// errVersion is returned by decodeHeader for a well-formed header of
// another protocol version.
var errVersion = errors.New("unsupported protocol version")

func decodeHeader(b []byte) (header, error) {
	if len(b) != headerLen {
		return header{}, fmt.Errorf("%w: header frame of %d bytes, want %d", ErrProtocol, len(b), headerLen)
	}
	if b[0] != magic[0] || b[1] != magic[1] {
		return header{}, fmt.Errorf("%w: header frame does not start with %q (not a weightcast metadata peer?)", ErrProtocol, magic[:])
	}
	h := header{version: b[2], typ: b[3], code: binary.LittleEndian.Uint32(b[4:]), seq: binary.LittleEndian.Uint64(b[8:])}
	if h.version != ProtocolVersion {
		return h, fmt.Errorf("%w %d (this side speaks %d)", errVersion, h.version, ProtocolVersion)
	}
	return h, nil
}

// frameCount is how many frames (header included) each type carries.
func frameCount(typ byte) int {
	switch typ {
	case typeHello, typeWelcome, typeData, typeError, typeChallenge, typeProof:
		return 2
	case typeAck, typeHeartbeat, typeBye:
		return 1
	}
	return 0
}

// decode splits a message (without any routing identity) into its header
// and body, checking the frame count of its type.
func decode(frames [][]byte) (header, []byte, error) {
	if len(frames) == 0 {
		return header{}, nil, fmt.Errorf("%w: empty message", ErrProtocol)
	}
	h, err := decodeHeader(frames[0])
	if err != nil {
		return h, nil, err
	}
	want := frameCount(h.typ)
	if want == 0 {
		return h, nil, fmt.Errorf("%w: unknown message type %d", ErrProtocol, h.typ)
	}
	if len(frames) != want {
		return h, nil, fmt.Errorf("%w: %s with %d frames, want %d", ErrProtocol, typeName(h.typ), len(frames), want)
	}
	var body []byte
	if want == 2 {
		body = frames[1]
	}
	return h, body, nil
}

// hello is the body of a HELLO message. A receiver with a group secret
// appends its nonce after the group name, asking the root to
// authenticate.
type hello struct {
	rank, world uint32
	maxMessage  uint64
	heartbeatMS uint32
	livenessMS  uint32
	group       string
	nonce       *auth.Nonce // nil: no group secret
}

func (m hello) encode() []byte {
	b := make([]byte, helloLen+len(m.group))
	binary.LittleEndian.PutUint32(b[0:], m.rank)
	binary.LittleEndian.PutUint32(b[4:], m.world)
	binary.LittleEndian.PutUint64(b[8:], m.maxMessage)
	binary.LittleEndian.PutUint32(b[16:], m.heartbeatMS)
	binary.LittleEndian.PutUint32(b[20:], m.livenessMS)
	binary.LittleEndian.PutUint16(b[24:], uint16(len(m.group)))
	copy(b[helloLen:], m.group)
	if m.nonce != nil {
		b = append(b, m.nonce[:]...)
	}
	return b
}

func decodeHello(b []byte) (hello, error) {
	if len(b) < helloLen {
		return hello{}, fmt.Errorf("%w: HELLO body of %d bytes, want at least %d", ErrProtocol, len(b), helloLen)
	}
	m := hello{
		rank:        binary.LittleEndian.Uint32(b[0:]),
		world:       binary.LittleEndian.Uint32(b[4:]),
		maxMessage:  binary.LittleEndian.Uint64(b[8:]),
		heartbeatMS: binary.LittleEndian.Uint32(b[16:]),
		livenessMS:  binary.LittleEndian.Uint32(b[20:]),
	}
	n := int(binary.LittleEndian.Uint16(b[24:]))
	switch {
	case n == 0 || n > maxGroupLen:
		return m, fmt.Errorf("%w: HELLO group name of %d bytes, want 1..%d", ErrProtocol, n, maxGroupLen)
	case len(b) < helloLen+n:
		return m, fmt.Errorf("%w: HELLO body of %d bytes is shorter than its group name says (%d)", ErrProtocol, len(b), helloLen+n)
	case !utf8.Valid(b[helloLen : helloLen+n]):
		return m, fmt.Errorf("%w: HELLO group name is not UTF-8", ErrProtocol)
	case m.maxMessage == 0 || m.heartbeatMS == 0 || m.livenessMS == 0:
		return m, fmt.Errorf("%w: HELLO with a zero max_message, heartbeat_ms or liveness_ms", ErrProtocol)
	}
	m.group = string(b[helloLen : helloLen+n])
	switch rest := b[helloLen+n:]; len(rest) {
	case 0:
	case auth.NonceSize:
		m.nonce = new(auth.Nonce)
		copy(m.nonce[:], rest)
	default:
		return m, fmt.Errorf("%w: HELLO with %d bytes after its group name, want none or a %d-byte nonce", ErrProtocol, len(rest), auth.NonceSize)
	}
	return m, nil
}

// challenge is the body of a CHALLENGE: the root's nonce and its proof.
type challenge struct {
	nonce auth.Nonce
	proof [auth.KeySize]byte
}

func (m challenge) encode() []byte { return append(m.nonce[:], m.proof[:]...) }

func decodeChallenge(b []byte) (challenge, error) {
	var m challenge
	if len(b) != auth.NonceSize+auth.KeySize {
		return m, fmt.Errorf("%w: CHALLENGE body of %d bytes, want %d", ErrProtocol, len(b), auth.NonceSize+auth.KeySize)
	}
	copy(m.nonce[:], b)
	copy(m.proof[:], b[auth.NonceSize:])
	return m, nil
}

func decodeProof(b []byte) ([]byte, error) {
	if len(b) != auth.KeySize {
		return nil, fmt.Errorf("%w: PROOF body of %d bytes, want %d", ErrProtocol, len(b), auth.KeySize)
	}
	return b, nil
}

// transcript is what the bus handshake's proofs cover, for receiver rank
// of a world whose nonces are these, on a connection with this TLS
// binding.
func transcript(rank, world int, receiver, root auth.Nonce, binding []byte) auth.Transcript {
	return auth.Transcript{Protocol: "zmqbus", Version: ProtocolVersion, Initiator: rank, Responder: 0, World: world,
		InitiatorNonce: receiver, ResponderNonce: root, Binding: binding}
}

// welcome is the body of a WELCOME message.
type welcome struct {
	window      uint32
	heartbeatMS uint32
	livenessMS  uint32
}

func (m welcome) encode() []byte {
	b := make([]byte, welcomeLen)
	binary.LittleEndian.PutUint32(b[0:], m.window)
	binary.LittleEndian.PutUint32(b[4:], m.heartbeatMS)
	binary.LittleEndian.PutUint32(b[8:], m.livenessMS)
	return b
}

func decodeWelcome(b []byte) (welcome, error) {
	if len(b) < welcomeLen {
		return welcome{}, fmt.Errorf("%w: WELCOME body of %d bytes, want at least %d", ErrProtocol, len(b), welcomeLen)
	}
	m := welcome{
		window:      binary.LittleEndian.Uint32(b[0:]),
		heartbeatMS: binary.LittleEndian.Uint32(b[4:]),
		livenessMS:  binary.LittleEndian.Uint32(b[8:]),
	}
	if m.window == 0 || m.heartbeatMS == 0 || m.livenessMS == 0 {
		return m, fmt.Errorf("%w: WELCOME with a zero window, heartbeat_ms or liveness_ms", ErrProtocol)
	}
	return m, nil
}

// errorText clips an ERROR reason to maxErrorText bytes on a rune boundary.
func errorText(s string) []byte {
	if len(s) <= maxErrorText {
		return []byte(s)
	}
	b := []byte(s[:maxErrorText])
	for len(b) > 0 && !utf8.Valid(b) {
		b = b[:len(b)-1]
	}
	return b
}

// codeError maps an ERROR code to the sentinel a local error wraps.
func codeError(code uint32) error {
	switch code {
	case codePeerGone:
		return errPeerGone
	case codeAborted:
		return ErrAborted
	case codeTooLarge:
		return ErrTooLarge
	case codeVersion, codeGroup, codeWorldSize, codeRank, codeDuplicate:
		return ErrHandshake
	case codeAuth:
		return errAuth
	}
	return ErrProtocol
}

// errAuth is a refused handshake about the group secret: it matches
// ErrHandshake and auth.ErrFailed.
var errAuth = fmt.Errorf("%w: %w", ErrHandshake, auth.ErrFailed)

// errCode maps a local error to the code of the ERROR frame that reports it.
func errCode(err error, fallback uint32) uint32 {
	var ce *codedError
	switch {
	case errors.As(err, &ce):
		return ce.code
	case errors.Is(err, errVersion):
		return codeVersion
	case errors.Is(err, errPeerGone):
		return codePeerGone
	case errors.Is(err, ErrTooLarge):
		return codeTooLarge
	case errors.Is(err, ErrProtocol):
		return codeProtocol
	}
	return fallback
}

// codedError is a handshake rejection that knows its ERROR code.
type codedError struct {
	code uint32
	msg  string
}

func (e *codedError) Error() string { return ErrHandshake.Error() + ": " + e.msg }
func (e *codedError) Unwrap() error {
	if e.code == codeAuth {
		return errAuth
	}
	return ErrHandshake
}
