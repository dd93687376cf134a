package handshake

import (
	"bytes"
	"io"
	"testing"

	"github.com/weightcast/weightcast/auth"
)

// stream reads the fuzzer's bytes and throws away what is written.
type stream struct{ io.Reader }

func (stream) Write(p []byte) (int, error) { return len(p), nil }

// FuzzHandshake feeds arbitrary bytes to both sides of the handshake, with
// and without a secret: each returns (an error, mostly) without panicking
// and without reading past its limits.
func FuzzHandshake(f *testing.F) {
	s, _ := auth.NewSecret([]byte("0123456789abcdef0123456789abcdef"))
	k, _ := s.RunKeys("g", "r")
	valid := Side{Group: "g", Rank: 1, World: 4, Extra: []byte("x"), Keys: k}.hello(proto, auth.NewNonce())
	f.Add(valid)
	f.Add(append(append([]byte(nil), valid...), accept.append(nil)...))
	f.Add(Side{Group: "g", Rank: 1, World: 4}.hello(proto, auth.Nonce{}))
	f.Add([]byte{0x77, 0x63, 0x74, 0x73, 0, 3})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, keys := range []*auth.Keys{nil, k} {
			me := Side{Group: "g", Rank: 2, World: 4, Keys: keys}
			Accept(stream{bytes.NewReader(b)}, proto, me, wantRank(1))
			Dial(stream{bytes.NewReader(b)}, proto, me, wantRank(3))
		}
		if h, err := readHello(bytes.NewReader(b), proto); err == nil && (len(h.Group) > MaxGroup || len(h.Extra) > MaxExtra) {
			t.Fatalf("a hello past the limits decoded: group %d bytes, extra %d", len(h.Group), len(h.Extra))
		}
	})
}
