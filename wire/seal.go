package wire

import (
	"encoding/hex"
	"fmt"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/mac"
)

// macMember starts the last member of a signed message, its MAC.
const macMember = `,"mac":"`

// sealLen is how many bytes signing adds to a message.
const sealLen = len(macMember) + 2*auth.KeySize + len(`"`)

// Seal returns msg, the JSON object sent as message seq of the
// metadata bus, signed with keys: the object with one more member at its
// end, "mac", the 64 lower-case hex digits of keys.MessageMAC(seq, msg).
// msg must end with the object's closing brace and hold at least one
// member. Without keys it returns msg.
func Seal(keys *auth.Keys, seq uint64, msg []byte) []byte {
	if keys == nil {
		return msg
	}
	tag := keys.MessageMAC(seq, msg)
	out := make([]byte, 0, len(msg)+sealLen)
	out = append(out, msg[:len(msg)-1]...)
	out = append(out, macMember...)
	out = hex.AppendEncode(out, tag[:])
	return append(out, `"}`...)
}

// Open checks msg, message seq of the metadata bus, as Seal
// signed it with keys, and returns the message without its signature. A
// message that is not signed, whose signature does not verify, or, without
// keys, that is signed, fails with an error wrapping auth.ErrFailed.
// Without keys an unsigned message is returned as it is.
func Open(keys *auth.Keys, seq uint64, msg []byte) ([]byte, error) {
	body, tag, signed := splitSeal(msg)
	switch {
	case keys == nil && signed:
		return nil, fmt.Errorf("%w: message %d is signed with a group secret, and this rank has none; give every rank the same secret", auth.ErrFailed, seq)
	case keys == nil:
		return msg, nil
	case !signed:
		return nil, fmt.Errorf("%w: message %d is not signed, and this rank has a group secret: the root runs without one, or a process without the secret sent or changed it", auth.ErrFailed, seq)
	}
	if err := keys.VerifyMessage(seq, body, tag); err != nil {
		return nil, err
	}
	return body, nil
}

// splitSeal splits a signed message into the message it signs and its
// MAC; signed is false when msg does not end in a signature.
func splitSeal(msg []byte) (body, tag []byte, signed bool) {
	n := len(msg) - sealLen - 1 // the signature, then the closing brace
	if n < 1 || string(msg[n:n+len(macMember)]) != macMember || string(msg[len(msg)-2:]) != `"}` {
		return nil, nil, false
	}
	tag = make([]byte, auth.KeySize)
	if _, err := hex.Decode(tag, msg[n+len(macMember):len(msg)-2]); err != nil {
		return nil, nil, false
	}
	body = append(msg[:n:n], '}') // a copy: msg stays as it is
	return body, tag, true
}

// formatTag is the wire form of a bucket MAC: 64 lower-case hex digits
// of keyed BLAKE3, or 32 of a Poly1305-AES tag (nonce set).
func formatTag(t mac.Tag, nonce *mac.Nonce) string {
	if nonce != nil {
		return hex.EncodeToString(t[:mac.PolyTagSize])
	}
	return t.String()
}

// setMAC sets m's bucket MAC from its wire form: the "bucket_mac" and
// "mac_nonce" members, each nil where absent.
func (m *BucketMeta) setMAC(tag, nonce *string) error {
	switch {
	case tag == nil && nonce == nil:
		return nil
	case tag == nil:
		return fmt.Errorf("a mac_nonce without a bucket_mac")
	case nonce == nil:
		t, err := parseHex(*tag, mac.Size, "bucket MAC")
		if err != nil {
			return err
		}
		m.MAC, m.HasMAC = mac.Tag(t), true
		return nil
	}
	t, err := parseHex(*tag, mac.PolyTagSize, "Poly1305-AES bucket MAC (with a mac_nonce)")
	if err != nil {
		return err
	}
	n, err := parseHex(*nonce, mac.NonceSize, "mac_nonce")
	if err != nil {
		return err
	}
	nn := mac.Nonce(n)
	m.MAC, m.HasMAC, m.MACNonce = mac.PolyTag(t).AsTag(), true, &nn
	return nil
}

// parseHex reads exactly n bytes written as 2n hex digits; what names
// the field in errors.
func parseHex(s string, n int, what string) ([]byte, error) {
	b := make([]byte, n)
	if len(s) != 2*n {
		return nil, fmt.Errorf("malformed %s %q: want %d hex digits", what, s, 2*n)
	}
	if _, err := hex.Decode(b, []byte(s)); err != nil {
		return nil, fmt.Errorf("malformed %s %q: want %d hex digits", what, s, 2*n)
	}
	return b, nil
}
