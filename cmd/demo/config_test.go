package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weightcast/weightcast/auth"
)

// TestSecretFileMode: a secret file that its group or other users may
// read or write is refused before anything starts, through the flag and
// through WEIGHTCAST_SECRET_FILE, with the mode found and the chmod that
// fixes it; mode 0600 is taken.
func TestSecretFileMode(t *testing.T) {
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte("a group secret of some length\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	noEnv := func(string) string { return "" }
	if c, err := parseConfig([]string{"--secret-file", p}, noEnv); err != nil || c.secret == nil {
		t.Fatalf("mode 0600: %v", err)
	}
	for _, mode := range []os.FileMode{0o660, 0o640, 0o644} {
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		for _, how := range []struct {
			args   []string
			getenv func(string) string
		}{
			{[]string{"--secret-file", p}, noEnv},
			{nil, func(k string) string { return map[string]string{auth.SecretFileEnv: p}[k] }},
		} {
			_, err := parseConfig(how.args, how.getenv)
			var me *auth.SecretModeError
			if !errors.As(err, &me) || me.Mode != mode {
				t.Fatalf("mode %#o (args %q): %v; want an auth.SecretModeError", mode, how.args, err)
			}
			if msg := err.Error(); !strings.HasPrefix(msg, "--secret-file: ") || !strings.Contains(msg, "chmod 600 "+p) {
				t.Errorf("mode %#o: %q; want it to name --secret-file and chmod 600 %s", mode, msg, p)
			}
		}
	}
}
