package gputest

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestFirstDiff(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"", "", -1},
		{"abc", "abc", -1},
		{"abc", "abd", 2},
		{"xbc", "abc", 0},
		{"ab", "abc", 2},
		{"abc", "a", 1},
	} {
		if got := FirstDiff([]byte(c.a), []byte(c.b)); got != c.want {
			t.Errorf("FirstDiff(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

func TestRandomBytes(t *testing.T) {
	a := RandomBytes(rand.New(rand.NewPCG(1, 2)), 1000)
	b := RandomBytes(rand.New(rand.NewPCG(1, 2)), 1000)
	if len(a) != 1000 || !bytes.Equal(a, b) {
		t.Fatal("RandomBytes is not a function of its generator")
	}
	if bytes.Count(a, a[:1]) == len(a) {
		t.Fatal("RandomBytes returned one byte repeated")
	}
}

// TestDevice needs a GPU: it uploads random bytes, fills a second buffer,
// and reads both back. Without one it checks that Device skips.
func TestDevice(t *testing.T) {
	d := Device(t)
	s := Stream(t, d)
	const n = 1<<20 + 3
	want := RandomBytes(rand.New(rand.NewPCG(3, 4)), n)
	a, b := Alloc(t, d, n), Alloc(t, d, n)
	Upload(t, s, a, 0, want)
	Fill(t, s, b, 0xA5)
	if got := Download(t, s, a, 0, n); !bytes.Equal(got, want) {
		t.Fatalf("round trip differs at byte %d", FirstDiff(got, want))
	}
	if got := Download(t, s, b, 1, n-1); !bytes.Equal(got, bytes.Repeat([]byte{0xA5}, n-1)) {
		t.Fatal("Fill left bytes unset")
	}
}
