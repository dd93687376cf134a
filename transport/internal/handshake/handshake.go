// Package handshake is the introduction the two ends of a new stream
// connection between ranks make before a byte transport uses it (the tcp
// chain, the ipc side channel): who they are, whether they belong to the
// same group, and, with a group secret, a challenge and response that
// proves it.
//
// The initiator (the end that connected) and the responder exchange four
// messages; every integer is big-endian:
//
//	hello:   magic u32 | version u16 | flags u8 | rank i32 | world i32 |
//	         nonce [32] | group length u16 | group | extra length u16 | extra
//	verdict: status u8 (0 accept, 1 reject, 2 authentication failed) |
//	         reason length u16 | reason
//	proof:   [32] HMAC-SHA256 (auth.Keys.Prove)
//
//	1. initiator → responder: hello
//	2. responder → initiator: hello, verdict on the initiator's hello,
//	   and its proof if both have a secret and the verdict accepts
//	3. initiator → responder: verdict on the responder's hello and proof,
//	   and its proof if both have a secret and the verdict accepts
//	4. responder → initiator: verdict on the initiator's proof
//
// Flags bit 0 says that the side has a group secret. A nonce is fresh
// random bytes (auth.NewNonce) in every hello, with or without a secret;
// each proof covers the protocol, its version, the group and run (through
// the keys), both ranks, the world size, both nonces and the TLS channel
// binding, so a proof recorded from one handshake fails in any other. A
// side that finds the other's hello unfit (another group, world size,
// rank, protocol version, a secret where it has none) or its proof wrong
// says why in its verdict, and both ends fail with that reason.
package handshake

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/weightcast/weightcast/auth"
)

// Limits on the variable parts of the messages.
const (
	MaxGroup  = 1024
	MaxExtra  = 1024
	MaxReason = 4096
)

const (
	fixedLen     = 4 + 2 + 1 + 4 + 4 + auth.NonceSize + 2
	flagSecret   = 1
	statusAccept = 0
	statusReject = 1
	statusAuth   = 2
)

// Protocol is one protocol that opens its connections with this handshake.
type Protocol struct {
	Name    string // covered by the proofs: "tcp", "ipc"
	Magic   uint32 // the first 4 bytes of each hello
	Version uint16
}

// Side is what one end says about itself.
type Side struct {
	Group       string
	Rank, World int
	// Extra is the protocol's own data, sent with the hello (at most
	// MaxExtra bytes).
	Extra []byte
	// Keys are the run's keys, or nil without a group secret.
	Keys *auth.Keys
	// Binding is the connection's TLS channel binding (auth.TLSBinding),
	// or nil on a plain connection.
	Binding []byte
}

// Hello is what the other end said about itself.
type Hello struct {
	Version     uint16
	Rank, World int
	Group       string
	Extra       []byte
	Secret      bool // it has a group secret
	Nonce       auth.Nonce
}

// Check decides whether the other end's hello fits: it returns "" to
// accept it, or why not. Version, group and secret are checked before it.
type Check func(Hello) string

var (
	// ErrRejected is wrapped by the error of a handshake that one end
	// refused (a *Rejected).
	ErrRejected = errors.New("handshake rejected")
	// ErrNotPeer is wrapped by the error of a connection whose first
	// bytes are not this protocol's hello: another program.
	ErrNotPeer = errors.New("not a peer of this protocol")
	// ErrMalformed is wrapped by the error of a message that breaks the
	// format.
	ErrMalformed = errors.New("malformed handshake message")
)

// Rejected is a handshake that one end refused: this one (ByPeer false)
// or the other, which said Reason. It wraps ErrRejected, and also
// auth.ErrFailed when the refusal is about the group secret.
type Rejected struct {
	Reason string
	ByPeer bool
	Auth   bool
}

func (e *Rejected) Error() string {
	if e.ByPeer {
		return "refused by the other end: " + e.Reason
	}
	return e.Reason
}

func (e *Rejected) Unwrap() []error {
	if e.Auth {
		return []error{ErrRejected, auth.ErrFailed}
	}
	return []error{ErrRejected}
}

// verdict is one end's judgement of the other's hello or proof.
type verdict struct {
	status byte
	reason string
}

var accept = verdict{}

func reject(format string, args ...any) verdict {
	return verdict{status: statusReject, reason: fmt.Sprintf(format, args...)}
}

func authFailed(format string, args ...any) verdict {
	return verdict{status: statusAuth, reason: "authentication failed: " + fmt.Sprintf(format, args...)}
}

func (v verdict) ok() bool { return v.status == statusAccept }

// mine is the error of this end's refusal, theirs of the other end's.
func (v verdict) mine() error {
	return &Rejected{Reason: v.reason, Auth: v.status == statusAuth}
}

func (v verdict) theirs() error {
	return &Rejected{Reason: v.reason, ByPeer: true, Auth: v.status == statusAuth}
}

func (v verdict) append(b []byte) []byte {
	r := clip(v.reason, MaxReason)
	b = append(b, v.status)
	b = binary.BigEndian.AppendUint16(b, uint16(len(r)))
	return append(b, r...)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

func readVerdict(r io.Reader) (verdict, error) {
	var h [3]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return verdict{}, err
	}
	n := int(binary.BigEndian.Uint16(h[1:]))
	if h[0] > statusAuth || n > MaxReason {
		return verdict{}, fmt.Errorf("%w: verdict status %d with a reason of %d bytes", ErrMalformed, h[0], n)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		return verdict{}, unexpected(err)
	}
	v := verdict{status: h[0], reason: string(msg)}
	if !v.ok() && v.reason == "" {
		v.reason = "refused without a reason"
	}
	return v, nil
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

func (s Side) hello(p Protocol, nonce auth.Nonce) []byte {
	b := make([]byte, 0, fixedLen+len(s.Group)+2+len(s.Extra))
	b = binary.BigEndian.AppendUint32(b, p.Magic)
	b = binary.BigEndian.AppendUint16(b, p.Version)
	var flags byte
	if s.Keys != nil {
		flags |= flagSecret
	}
	b = append(b, flags)
	b = binary.BigEndian.AppendUint32(b, uint32(int32(s.Rank)))
	b = binary.BigEndian.AppendUint32(b, uint32(int32(s.World)))
	b = append(b, nonce[:]...)
	g := clip(s.Group, MaxGroup)
	b = binary.BigEndian.AppendUint16(b, uint16(len(g)))
	b = append(b, g...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(s.Extra)))
	return append(b, s.Extra...)
}

// readHello reads a hello of protocol p. A hello of another version is
// returned with only its version set (the rest of its layout is unknown)
// and no error: the caller refuses it, saying so.
func readHello(r io.Reader, p Protocol) (Hello, error) {
	var fixed [fixedLen]byte
	if _, err := io.ReadFull(r, fixed[:6]); err != nil {
		return Hello{}, err
	}
	if m := binary.BigEndian.Uint32(fixed[0:]); m != p.Magic {
		return Hello{}, fmt.Errorf("%w: the first bytes are %#08x, not the %s hello's %#08x", ErrNotPeer, m, p.Name, p.Magic)
	}
	h := Hello{Version: binary.BigEndian.Uint16(fixed[4:])}
	if h.Version != p.Version {
		return h, nil
	}
	if _, err := io.ReadFull(r, fixed[6:]); err != nil {
		return h, unexpected(err)
	}
	return decodeHelloRest(r, h, fixed[:])
}

func decodeHelloRest(r io.Reader, h Hello, fixed []byte) (Hello, error) {
	flags := fixed[6]
	if flags&^flagSecret != 0 {
		return h, fmt.Errorf("%w: hello flags %#x", ErrMalformed, flags)
	}
	h.Secret = flags&flagSecret != 0
	h.Rank = int(int32(binary.BigEndian.Uint32(fixed[7:])))
	h.World = int(int32(binary.BigEndian.Uint32(fixed[11:])))
	copy(h.Nonce[:], fixed[15:15+auth.NonceSize])
	gl := int(binary.BigEndian.Uint16(fixed[15+auth.NonceSize:]))
	if gl > MaxGroup {
		return h, fmt.Errorf("%w: group name of %d bytes, the limit is %d", ErrMalformed, gl, MaxGroup)
	}
	g := make([]byte, gl+2)
	if _, err := io.ReadFull(r, g); err != nil {
		return h, unexpected(err)
	}
	h.Group = string(g[:gl])
	el := int(binary.BigEndian.Uint16(g[gl:]))
	if el > MaxExtra {
		return h, fmt.Errorf("%w: extra data of %d bytes, the limit is %d", ErrMalformed, el, MaxExtra)
	}
	h.Extra = make([]byte, el)
	if _, err := io.ReadFull(r, h.Extra); err != nil {
		return h, unexpected(err)
	}
	return h, nil
}
