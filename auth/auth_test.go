package auth_test

import (
	"bytes"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weightcast/weightcast/auth"
)

const testSecret = "0123456789abcdef0123456789abcdef"

func keys(t *testing.T, secret, group, run string) *auth.Keys {
	t.Helper()
	s, err := auth.NewSecret([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	k, err := s.RunKeys(group, run)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestRecordFormula recomputes a signed record from the construction
// docs/protocol.md gives (HKDF-SHA256 extract with the salt, expand with
// the length-prefixed label, group and run id; HMAC-SHA256 over the key's
// length, the key and the value), so another implementation can follow
// the document, and pins one value so the derivation never changes
// unnoticed.
func TestRecordFormula(t *testing.T) {
	k := keys(t, testSecret, "policy", "run-7")
	signed := k.SignRecord("/weightcast/policy/run-7/root", []byte(`{"world_size":4}`))

	prk, err := hkdf.Extract(sha256.New, []byte(testSecret), []byte("weightcast group secret v1"))
	if err != nil {
		t.Fatal(err)
	}
	info := []byte("weightcast/v1/")
	for _, f := range []string{"record", "policy", "run-7"} {
		info = binary.BigEndian.AppendUint32(info, uint32(len(f)))
		info = append(info, f...)
	}
	rk, err := hkdf.Expand(sha256.New, prk, string(info), 32)
	if err != nil {
		t.Fatal(err)
	}
	m := hmac.New(sha256.New, rk)
	key := "/weightcast/policy/run-7/root"
	m.Write(binary.BigEndian.AppendUint32(nil, uint32(len(key))))
	m.Write([]byte(key))
	m.Write([]byte(`{"world_size":4}`))
	want := `{"world_size":4}` + "\nwcmac1:" + hex.EncodeToString(m.Sum(nil))
	if string(signed) != want {
		t.Fatalf("signed record\n%q\nwant (from the documented construction)\n%q", signed, want)
	}
	if len(signed) != len(`{"world_size":4}`)+auth.RecordOverhead {
		t.Fatalf("signed record of %d bytes; RecordOverhead says %d more than the value", len(signed), auth.RecordOverhead)
	}
	// Pinned: the value above for this secret, group, run, key and value.
	if got := hex.EncodeToString(m.Sum(nil)); got != pinnedRecordMAC {
		t.Fatalf("record MAC %s; the pinned value is %s (the derivation changed: records of older releases will not verify)", got, pinnedRecordMAC)
	}
}

const pinnedRecordMAC = "8da100a9ab43147899d07c01e077a5f06db5e872e743f81e01266d370b38e7a3"

func TestKeysPerRun(t *testing.T) {
	base := keys(t, testSecret, "g", "r1")
	same := keys(t, testSecret, "g", "r1")
	if !bytes.Equal(base.SignRecord("/k", []byte("v")), same.SignRecord("/k", []byte("v"))) || base.BucketKey() != same.BucketKey() {
		t.Fatal("the same secret, group and run derived different keys")
	}
	if base.Group() != "g" || base.RunID() != "r1" {
		t.Fatalf("keys of group %q run %q", base.Group(), base.RunID())
	}
	for name, other := range map[string]*auth.Keys{
		"another run":    keys(t, testSecret, "g", "r2"),
		"another group":  keys(t, testSecret, "g2", "r1"),
		"another secret": keys(t, testSecret+"x", "g", "r1"),
		// Length prefixes keep ("g","r1") and ("gr","1") apart.
		"shifted names": keys(t, testSecret, "gr", "1"),
	} {
		if _, err := other.OpenRecord("/k", base.SignRecord("/k", []byte("v"))); !errors.Is(err, auth.ErrFailed) {
			t.Errorf("%s opened a record of the base run: %v", name, err)
		}
		if other.BucketKey() == base.BucketKey() || other.BucketPolyKey() == base.BucketPolyKey() {
			t.Errorf("%s has the same bucket key", name)
		}
	}
	// The three keys of one run differ from each other.
	tr := auth.Transcript{Protocol: "tcp"}
	p := base.Prove(auth.Initiator, tr)
	b, pk := base.BucketKey(), base.BucketPolyKey()
	if bytes.Equal(p[:], b[:]) || bytes.Equal(b[:], pk[:]) || base.BucketPolyKey() != same.BucketPolyKey() {
		t.Fatal("a handshake proof equals the bucket key, or the two bucket keys are one, or the Poly1305-AES key differs between two derivations")
	}
	if _, err := auth.NewSecret([]byte(testSecret)); err != nil {
		t.Fatal(err)
	}
	s, _ := auth.NewSecret([]byte(testSecret))
	if _, err := s.RunKeys("", "r"); err == nil {
		t.Error("RunKeys with an empty group succeeded")
	}
	if _, err := s.RunKeys("g", ""); err == nil {
		t.Error("RunKeys with an empty run id succeeded")
	}
}

func TestOpenRecord(t *testing.T) {
	k := keys(t, testSecret, "g", "r")
	const key = "/weightcast/g/r/ranks/2"
	value := []byte(`{"world_size":4,"endpoints":{"meta":"10.0.0.2:7000"}}`)
	signed := k.SignRecord(key, value)
	got, err := k.OpenRecord(key, signed)
	if err != nil || !bytes.Equal(got, value) {
		t.Fatalf("OpenRecord of a signed record = %q, %v", got, err)
	}
	if got, err := k.OpenRecord("/e", k.SignRecord("/e", nil)); err != nil || len(got) != 0 {
		t.Fatalf("an empty signed value opened as %q, %v", got, err)
	}
	// Without a secret (nil Keys) values are stored as they are, and a
	// signed record is refused: its writer has a secret the reader lacks.
	var none *auth.Keys
	if got := none.SignRecord(key, value); !bytes.Equal(got, value) {
		t.Fatalf("SignRecord without a secret = %q", got)
	}
	if got, err := none.OpenRecord(key, value); err != nil || !bytes.Equal(got, value) {
		t.Fatalf("OpenRecord without a secret = %q, %v", got, err)
	}
	var re *auth.RecordError
	if _, err := none.OpenRecord(key, signed); !errors.As(err, &re) || !re.NoSecret || !strings.Contains(err.Error(), "this process has none") {
		t.Fatalf("OpenRecord of a signed record without a secret = %v; want a *RecordError saying this process has none", err)
	}
	tampered := append([]byte(nil), signed...)
	tampered[20] ^= 1
	badHex := append([]byte(nil), signed...)
	badHex[len(badHex)-1] = 'z'
	flipMAC := append([]byte(nil), signed...)
	if flipMAC[len(flipMAC)-1] == '0' {
		flipMAC[len(flipMAC)-1] = '1'
	} else {
		flipMAC[len(flipMAC)-1] = '0'
	}
	for _, c := range []struct {
		name     string
		key      string
		rec      []byte
		unsigned bool
	}{
		{"plain value", key, value, true},
		{"empty", key, nil, true},
		{"truncated", key, signed[:len(signed)-1], true},
		{"value changed", key, tampered, false},
		{"MAC changed", key, flipMAC, false},
		{"MAC not hex", key, badHex, false},
		{"moved to another key", "/weightcast/g/r/ranks/3", signed, false},
		{"another run's", key, keys(t, testSecret, "g", "r0").SignRecord(key, value), false},
	} {
		_, err := k.OpenRecord(c.key, c.rec)
		var re *auth.RecordError
		switch {
		case !errors.As(err, &re) || !errors.Is(err, auth.ErrFailed):
			t.Errorf("%s: OpenRecord = %v; want a *RecordError wrapping ErrFailed", c.name, err)
		case re.Unsigned != c.unsigned:
			t.Errorf("%s: Unsigned = %v, want %v", c.name, re.Unsigned, c.unsigned)
		case !strings.Contains(err.Error(), c.key) || !strings.Contains(err.Error(), "authentication failed"):
			t.Errorf("%s: %q does not name the key or say authentication failed", c.name, err)
		}
	}
}

func TestProofs(t *testing.T) {
	k := keys(t, testSecret, "g", "r")
	base := auth.Transcript{Protocol: "tcp", Version: 2, Initiator: 1, Responder: 2, World: 4,
		InitiatorNonce: auth.NewNonce(), ResponderNonce: auth.NewNonce(), Binding: []byte("tls")}
	proof := k.Prove(auth.Initiator, base)
	if err := k.Verify(auth.Initiator, base, proof[:]); err != nil {
		t.Fatalf("Verify of a fresh proof: %v", err)
	}
	change := map[string]func(*auth.Transcript){
		"protocol":        func(t *auth.Transcript) { t.Protocol = "ipc" },
		"version":         func(t *auth.Transcript) { t.Version = 1 },
		"initiator rank":  func(t *auth.Transcript) { t.Initiator = 0 },
		"responder rank":  func(t *auth.Transcript) { t.Responder = 3 },
		"world size":      func(t *auth.Transcript) { t.World = 5 },
		"initiator nonce": func(t *auth.Transcript) { t.InitiatorNonce = auth.NewNonce() },
		"responder nonce": func(t *auth.Transcript) { t.ResponderNonce = auth.NewNonce() }, // a replay meets a fresh nonce
		"binding":         func(t *auth.Transcript) { t.Binding = []byte("other connection") },
		"no binding":      func(t *auth.Transcript) { t.Binding = nil },
	}
	for name, f := range change {
		tr := base
		f(&tr)
		if err := k.Verify(auth.Initiator, tr, proof[:]); !errors.Is(err, auth.ErrFailed) {
			t.Errorf("a proof verified with another %s: %v", name, err)
		}
	}
	if err := k.Verify(auth.Responder, base, proof[:]); !errors.Is(err, auth.ErrFailed) {
		t.Error("an initiator's proof verified as the responder's (reflection)")
	}
	if err := keys(t, testSecret, "g", "r2").Verify(auth.Initiator, base, proof[:]); !errors.Is(err, auth.ErrFailed) {
		t.Error("a proof verified under another run's keys")
	}
	if err := k.Verify(auth.Initiator, base, proof[:16]); !errors.Is(err, auth.ErrFailed) {
		t.Error("a truncated proof verified")
	}
	if auth.NewNonce() == auth.NewNonce() {
		t.Error("two nonces are equal")
	}
}

func TestReadSecretFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", testSecret+"\n", 0o600)
	s, err := auth.ReadSecretFile(good)
	if err != nil {
		t.Fatal(err)
	}
	k, _ := s.RunKeys("g", "r")
	if _, err := k.OpenRecord("/k", keys(t, testSecret, "g", "r").SignRecord("/k", nil)); err != nil {
		t.Fatalf("a secret file with a trailing newline is not the same secret: %v", err)
	}
	if _, err := auth.ReadSecretFile(write("readonly", testSecret, 0o400)); err != nil {
		t.Errorf("a secret file only its owner can read was refused: %v", err)
	}
	// Any access for the group or other users is refused, naming the
	// mode found and the chmod that fixes it.
	for _, mode := range []os.FileMode{0o640, 0o660, 0o604, 0o644, 0o610, 0o601, 0o666} {
		p := write(fmt.Sprintf("mode%o", mode), testSecret, mode)
		_, err := auth.ReadSecretFile(p)
		var me *auth.SecretModeError
		if !errors.As(err, &me) || me.Mode != mode || me.Path != p {
			t.Errorf("mode %#o: ReadSecretFile = %v; want a *SecretModeError with that mode", mode, err)
			continue
		}
		if want := fmt.Sprintf("mode %#o", mode); !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "chmod 600 "+p) {
			t.Errorf("mode %#o: %v; want it to say %q and chmod 600 %s", mode, err, want, p)
		}
	}
	for name, c := range map[string]struct {
		path, want string
	}{
		"world-readable": {write("open", testSecret, 0o644), "chmod 600"},
		"short":          {write("short", "0123456789\n", 0o600), "give 16 to 4096 bytes"},
		"missing":        {filepath.Join(dir, "none"), "no such file"},
		"directory":      {dir, "not a regular file"},
	} {
		if _, err := auth.ReadSecretFile(c.path); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: ReadSecretFile = %v; want an error saying %q", name, err, c.want)
		}
	}
	t.Setenv(auth.SecretFileEnv, "")
	if s, err := auth.SecretFile(""); s != nil || err != nil {
		t.Fatalf("SecretFile with nothing set = %v, %v; want nil, nil", s, err)
	}
	t.Setenv(auth.SecretFileEnv, good)
	if s, err := auth.SecretFile(""); s == nil || err != nil {
		t.Fatalf("SecretFile from %s = %v, %v", auth.SecretFileEnv, s, err)
	}
	if _, err := auth.SecretFile(filepath.Join(dir, "none")); err == nil {
		t.Fatal("SecretFile preferred the environment over a given path")
	}
}

// TestMessageFormula recomputes a message MAC from the construction
// docs/protocol.md gives (the key of label "message"; HMAC-SHA256 over
// "weightcast message v1", the sequence number as a big-endian u64 and the
// message), and checks that VerifyMessage refuses a MAC of another
// message, sequence number or run.
func TestMessageFormula(t *testing.T) {
	k := keys(t, testSecret, "policy", "run-7")
	msg := []byte(`{"commit":3}`)
	got := k.MessageMAC(9, msg)

	prk, err := hkdf.Extract(sha256.New, []byte(testSecret), []byte("weightcast group secret v1"))
	if err != nil {
		t.Fatal(err)
	}
	info := []byte("weightcast/v1/")
	for _, f := range []string{"message", "policy", "run-7"} {
		info = binary.BigEndian.AppendUint32(info, uint32(len(f)))
		info = append(info, f...)
	}
	mk, err := hkdf.Expand(sha256.New, prk, string(info), 32)
	if err != nil {
		t.Fatal(err)
	}
	m := hmac.New(sha256.New, mk)
	m.Write([]byte("weightcast message v1"))
	m.Write(binary.BigEndian.AppendUint64(nil, 9))
	m.Write(msg)
	if want := m.Sum(nil); !bytes.Equal(got[:], want) {
		t.Fatalf("message MAC %x; the documented construction gives %x", got, want)
	}
	if err := k.VerifyMessage(9, msg, got[:]); err != nil {
		t.Fatal(err)
	}
	other := keys(t, testSecret, "policy", "run-8")
	for name, err := range map[string]error{
		"another sequence number": k.VerifyMessage(10, msg, got[:]),
		"another message":         k.VerifyMessage(9, []byte(`{"commit":4}`), got[:]),
		"a truncated MAC":         k.VerifyMessage(9, msg, got[:31]),
		"another run":             other.VerifyMessage(9, msg, got[:]),
	} {
		if !errors.Is(err, auth.ErrFailed) {
			t.Errorf("%s: VerifyMessage returned %v, want authentication failed", name, err)
		}
	}
}
