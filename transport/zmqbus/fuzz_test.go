package zmqbus

import (
	"testing"

	"github.com/weightcast/weightcast/auth"
)

// FuzzDecode feeds arbitrary frames to the message decoder and the HELLO,
// WELCOME, CHALLENGE and PROOF body decoders: they must never panic, and
// must reject what does not follow docs/protocol.md.
func FuzzDecode(f *testing.F) {
	f.Add(encodeHeader(typeData, 0, 7), []byte(`{"seq":7}`))
	f.Add(encodeHeader(typeHello, 0, 0), []byte("not a hello"))
	f.Add(encodeHeader(typeAck, 0, 3), []byte(nil))
	f.Add([]byte("WC\x01\x06\x09\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"), []byte("reason"))
	f.Add([]byte{}, []byte{})
	n := auth.NewNonce()
	f.Add(encodeHeader(typeHello, 0, 0), hello{rank: 1, world: 2, maxMessage: 1, heartbeatMS: 1, livenessMS: 1, group: "g", nonce: &n}.encode())
	f.Add(encodeHeader(typeChallenge, 0, 0), challenge{nonce: n}.encode())
	f.Add(encodeHeader(typeProof, 0, 0), make([]byte, 32))
	f.Fuzz(func(t *testing.T, head, body []byte) {
		frames := [][]byte{head}
		if body != nil {
			frames = append(frames, body)
		}
		h, b, err := decode(frames)
		if err != nil {
			return
		}
		if want := frameCount(h.typ); want != len(frames) {
			t.Fatalf("accepted a type %d message of %d frames; the type has %d", h.typ, len(frames), want)
		}
		switch h.typ {
		case typeHello:
			if m, err := decodeHello(b); err == nil && m.nonce != nil && len(b) != helloLen+len(m.group)+auth.NonceSize {
				t.Fatalf("a HELLO of %d bytes decoded with a nonce and a group of %d bytes", len(b), len(m.group))
			}
		case typeWelcome:
			decodeWelcome(b)
		case typeChallenge:
			decodeChallenge(b)
		case typeProof:
			decodeProof(b)
		}
	})
}

// FuzzReady feeds arbitrary ZMTP READY command bodies to the identity
// reader of the guard: it must never panic, and an identity it returns
// lies within the body.
func FuzzReady(f *testing.F) {
	f.Add(zmtpReady("DEALER", "r1.abc")[66:])
	f.Add(zmtpReady("DEALER", "")[66:])
	f.Add([]byte("\x05READY\x08Identity\xff\xff\xff\xff"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		id, err := readyIdentity(b)
		if err == nil && len(id) > len(b) {
			t.Fatalf("an identity of %d bytes out of a body of %d", len(id), len(b))
		}
	})
}
