package auth

import (
	"bytes"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// ErrFailed is wrapped by every error of a check that failed: a record or
// a handshake proof that does not verify, a peer without the secret.
var ErrFailed = errors.New("authentication failed")

// SecretFileEnv names the environment variable that SecretFile reads when
// no path is given.
const SecretFileEnv = "WEIGHTCAST_SECRET_FILE"

// Limits on a group secret.
const (
	MinSecretLen = 16
	MaxSecretLen = 4096
)

// salt separates this project's keys from any other use of the same
// secret.
const salt = "weightcast group secret v1"

// Secret is a group secret, kept as its HKDF pseudorandom key. The zero
// value is not usable; call NewSecret or ReadSecretFile.
type Secret struct {
	prk []byte
}

// NewSecret makes a Secret of b, which must hold MinSecretLen to
// MaxSecretLen bytes. b is not kept.
func NewSecret(b []byte) (*Secret, error) {
	if len(b) < MinSecretLen || len(b) > MaxSecretLen {
		return nil, fmt.Errorf("auth: a group secret of %d bytes; give %d to %d bytes, such as the output of `head -c 32 /dev/urandom | base64`", len(b), MinSecretLen, MaxSecretLen)
	}
	prk, err := hkdf.Extract(sha256.New, b, []byte(salt))
	if err != nil {
		return nil, fmt.Errorf("auth: deriving from the group secret: %w", err)
	}
	return &Secret{prk: prk}, nil
}

// SecretModeError is the error of a group secret file whose mode grants
// its group or other users any access: only its owner may read or write
// it (mode 0600 or 0400).
type SecretModeError struct {
	Path string
	Mode fs.FileMode // the permission bits found
}

func (e *SecretModeError) Error() string {
	who := "the users of its group"
	if e.Mode&0o007 != 0 {
		who = "every user of this host"
	}
	return fmt.Sprintf("auth: group secret file %s has mode %#o, so %s can read or change it; only its owner may: run chmod 600 %s", e.Path, e.Mode, who, e.Path)
}

// ReadSecretFile reads a group secret from the file at path: its bytes,
// without trailing white space (so a secret written by `echo` or `base64`
// works). It refuses a file that is not regular, and one whose mode lets
// anyone but its owner read, write or run it (a *SecretModeError): give it
// mode 0600. Every reader of a secret file (the demo, the C library, the
// Python package through it) goes through this check.
func ReadSecretFile(path string) (*Secret, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("auth: group secret file: %w", err)
	}
	defer f.Close()
	// The mode of the file opened, not of whatever the path names later.
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("auth: group secret file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("auth: group secret file %s is not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, &SecretModeError{Path: path, Mode: perm}
	}
	if fi.Size() > MaxSecretLen+64 {
		return nil, fmt.Errorf("auth: group secret file %s holds %d bytes; a secret has at most %d", path, fi.Size(), MaxSecretLen)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxSecretLen+65))
	if err != nil {
		return nil, fmt.Errorf("auth: group secret file: %w", err)
	}
	defer clear(b)
	if len(b) > MaxSecretLen+64 {
		return nil, fmt.Errorf("auth: group secret file %s holds more than %d bytes; a secret has at most %d", path, MaxSecretLen+64, MaxSecretLen)
	}
	s, err := NewSecret(bytes.TrimRight(b, " \t\r\n"))
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, path)
	}
	return s, nil
}

// SecretFile reads the group secret from path, or when path is empty from
// the file that WEIGHTCAST_SECRET_FILE names. It returns nil and no error
// when neither is set: the group runs without a secret.
func SecretFile(path string) (*Secret, error) {
	if path == "" {
		path = os.Getenv(SecretFileEnv)
	}
	if path == "" {
		return nil, nil
	}
	return ReadSecretFile(path)
}

// Labels of the keys of a run.
const (
	labelRecord    = "record"
	labelHandshake = "handshake"
	labelBucket    = "bucket-mac"
	labelPoly      = "bucket-poly1305-aes"
	labelMessage   = "message"
)

// RunKeys derives the keys of one run of a group. Every rank of the run
// derives the same ones; group and runID must not be empty.
func (s *Secret) RunKeys(group, runID string) (*Keys, error) {
	if s == nil || len(s.prk) == 0 {
		return nil, errors.New("auth: RunKeys of a nil or zero Secret")
	}
	if group == "" || runID == "" {
		return nil, fmt.Errorf("auth: run keys need a group name and a run id (got %q, %q)", group, runID)
	}
	k := &Keys{group: group, runID: runID}
	for _, d := range []struct {
		label string
		key   *[KeySize]byte
	}{{labelRecord, &k.record}, {labelHandshake, &k.handshake}, {labelBucket, &k.bucket}, {labelPoly, &k.poly}, {labelMessage, &k.message}} {
		b, err := hkdf.Expand(sha256.New, s.prk, runInfo(d.label, group, runID), KeySize)
		if err != nil {
			return nil, fmt.Errorf("auth: deriving the %s key: %w", d.label, err)
		}
		copy(d.key[:], b)
	}
	return k, nil
}

// runInfo is the HKDF info of one key of one run: the label, the group and
// the run id, each length-prefixed so that no two runs share an info.
func runInfo(label, group, runID string) string {
	b := []byte("weightcast/v1/")
	for _, f := range []string{label, group, runID} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	return string(b)
}
