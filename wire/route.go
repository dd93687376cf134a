package wire

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
)

// RouteStart is the message that starts a routed round (package route):
// rank 0 publishes it on the metadata bus to every other rank, sender or
// receiver, with the round's model version and the digest of every rank's
// layout by rank, from which every rank makes the same plan. Each rank
// acknowledges it once its part of the round is done; the commit message
// follows.
type RouteStart struct {
	Version uint64   `json:"route"`
	Senders int      `json:"senders"`
	Layouts []string `json:"layouts"` // hex SHA-256 of each rank's layout, by rank
}

// MaxRouteStartSize bounds a decoded RouteStart: 1 MiB (the digests of
// about 15,000 ranks).
const MaxRouteStartSize = 1 << 20

// EncodeRouteStart returns m's wire form.
func EncodeRouteStart(m RouteStart) []byte {
	b, err := json.Marshal(m)
	if err != nil {
		panic(err) // plain fields only
	}
	return b
}

// DecodeRouteStart parses a RouteStart, rejecting anything else: bucket
// metadata, a commit message, unknown fields, a digest that is not 64 hex
// digits, a message over MaxRouteStartSize.
func DecodeRouteStart(b []byte) (RouteStart, error) {
	var m RouteStart
	if len(b) > MaxRouteStartSize {
		return m, fmt.Errorf("a routed round's start message of %d bytes exceeds the %d-byte limit", len(b), MaxRouteStartSize)
	}
	if IsCommit(b) {
		return m, fmt.Errorf("a commit message (%s) where a routed round's start message was due", Excerpt(b))
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return m, fmt.Errorf("not a routed round's start message (%s): %w; do all ranks run routed rounds (the same number of senders and layouts)?", Excerpt(b), err)
	}
	if dec.More() {
		return m, fmt.Errorf("not a routed round's start message (%s): data after the object", Excerpt(b))
	}
	if m.Version == 0 {
		return m, fmt.Errorf("a routed round's start message without a version (%s)", Excerpt(b))
	}
	for i, d := range m.Layouts {
		if raw, err := hex.DecodeString(d); err != nil || len(raw) != 32 {
			return m, fmt.Errorf("a routed round's start message with layout digest %q for rank %d: not 64 hex digits", d, i)
		}
	}
	return m, nil
}
