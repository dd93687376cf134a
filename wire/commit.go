package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// MaxCommitSize is the largest commit message a receiver decodes.
const MaxCommitSize = 4 << 10

// commitMessage is the wire form of the commit message.
type commitMessage struct {
	Commit *uint64 `json:"commit"`
}

// EncodeCommit returns the commit message announcing that version is
// committed on every receiver: {"commit":version}.
func EncodeCommit(version uint64) []byte {
	return []byte(`{"commit":` + strconv.FormatUint(version, 10) + `}`)
}

// DecodeCommit parses a commit message and returns its version. It rejects
// anything else: bucket metadata, unknown fields, trailing data, a message
// over MaxCommitSize.
func DecodeCommit(b []byte) (uint64, error) {
	if len(b) > MaxCommitSize {
		return 0, fmt.Errorf("a commit message of %d bytes exceeds the %d-byte limit", len(b), MaxCommitSize)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var m commitMessage
	if err := dec.Decode(&m); err != nil {
		return 0, fmt.Errorf("not a commit message (%s): %w", Excerpt(b), err)
	}
	if dec.More() {
		return 0, fmt.Errorf("not a commit message (%s): data after the object", Excerpt(b))
	}
	if m.Commit == nil {
		return 0, fmt.Errorf("not a commit message (%s): no \"commit\" field", Excerpt(b))
	}
	return *m.Commit, nil
}

// IsCommit reports whether msg looks like a commit message rather than
// bucket metadata (for a clear error when one arrives out of place).
func IsCommit(msg []byte) bool {
	if len(msg) > 64 || !bytes.Contains(msg, []byte(`"commit"`)) {
		return false
	}
	_, err := DecodeCommit(msg)
	return err == nil
}

// Excerpt shows the start of a message, quoted, for an error about it.
func Excerpt(b []byte) string {
	if len(b) > 80 {
		return strconv.Quote(string(b[:80])) + "..."
	}
	return strconv.Quote(string(b))
}
