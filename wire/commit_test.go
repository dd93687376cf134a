package wire

import (
	"bytes"
	"math"
	"testing"
)

// TestCommitMessage: the commit message round-trips, has one exact
// form, and nothing else decodes as one.
func TestCommitMessage(t *testing.T) {
	for _, v := range []uint64{1, 7, math.MaxUint64} {
		got, err := DecodeCommit(EncodeCommit(v))
		if err != nil || got != v {
			t.Fatalf("round trip of %d: %d, %v", v, got, err)
		}
	}
	if s := string(EncodeCommit(3)); s != `{"commit":3}` {
		t.Fatalf("EncodeCommit(3) = %s", s)
	}
	if v, err := DecodeCommit([]byte(" { \"commit\" : 12 }\n")); err != nil || v != 12 {
		t.Fatalf("with spaces: %d, %v", v, err)
	}
	meta, _ := EncodeMeta(&BucketMeta{Seq: 4, Version: 2, IsLast: true})
	for name, b := range map[string][]byte{
		"bucket metadata": meta,
		"no commit":       []byte(`{}`),
		"unknown field":   []byte(`{"commit":3,"extra":1}`),
		"negative":        []byte(`{"commit":-1}`),
		"string":          []byte(`{"commit":"3"}`),
		"trailing":        []byte(`{"commit":3}{}`),
		"not json":        []byte(`commit 3`),
		"oversized":       append([]byte(`{"commit":3}`), bytes.Repeat([]byte(" "), MaxCommitSize)...),
	} {
		if v, err := DecodeCommit(b); err == nil {
			t.Errorf("%s: accepted as the commit of version %d", name, v)
		}
	}
	if !IsCommit(EncodeCommit(9)) || IsCommit(meta) {
		t.Fatal("IsCommit")
	}
}

// FuzzDecodeCommit feeds arbitrary bytes to the commit decoder: it must
// never panic, and whatever it accepts must encode back to the same
// version.
func FuzzDecodeCommit(f *testing.F) {
	f.Add([]byte(`{"commit":3}`))
	f.Add([]byte(`{"commit":18446744073709551615}`))
	f.Add([]byte(`{"commit":3,"seq":1}`))
	f.Add([]byte(`{"seq":0,"length":0,"entries":[]}`))
	f.Add([]byte(`{"commit":1e3}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := DecodeCommit(b)
		if err != nil {
			return
		}
		if back, err := DecodeCommit(EncodeCommit(v)); err != nil || back != v {
			t.Fatalf("version %d from %q does not round-trip: %d, %v", v, b, back, err)
		}
	})
}
