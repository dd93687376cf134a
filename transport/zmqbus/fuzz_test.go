package zmqbus

import "testing"

// FuzzDecode feeds arbitrary frames to the message decoder and the HELLO
// and WELCOME body decoders: they must never panic, and must reject what
// does not follow docs/protocol.md.
func FuzzDecode(f *testing.F) {
	f.Add(encodeHeader(typeData, 0, 7), []byte(`{"seq":7}`))
	f.Add(encodeHeader(typeHello, 0, 0), []byte("not a hello"))
	f.Add(encodeHeader(typeAck, 0, 3), []byte(nil))
	f.Add([]byte("WC\x01\x06\x09\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"), []byte("reason"))
	f.Add([]byte{}, []byte{})
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
			decodeHello(b)
		case typeWelcome:
			decodeWelcome(b)
		}
	})
}
