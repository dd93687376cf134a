package auth_test

import (
	"bytes"
	"testing"

	"github.com/weightcast/weightcast/auth"
)

// FuzzOpenRecord opens arbitrary bytes as a signed record, with a secret
// and without: it never panics, and what it accepts with a secret is
// exactly what SignRecord makes of its value.
func FuzzOpenRecord(f *testing.F) {
	s, _ := auth.NewSecret([]byte("0123456789abcdef0123456789abcdef"))
	k, _ := s.RunKeys("g", "r")
	f.Add("/k", k.SignRecord("/k", []byte(`{"world_size":2}`)))
	f.Add("/k", []byte("plain"))
	f.Add("", []byte("\nwcmac1:"))
	f.Fuzz(func(t *testing.T, key string, rec []byte) {
		if v, err := k.OpenRecord(key, rec); err == nil && !bytes.Equal(k.SignRecord(key, v), rec) {
			t.Fatalf("opened %q as %q, which does not sign back to it", rec, v)
		}
		var none *auth.Keys
		none.OpenRecord(key, rec)
	})
}
