package rendezvous

import (
	"errors"
	"fmt"
	"strings"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/transport"
)

// Sentinel errors. Every error Join and Group return for these conditions
// is an *Error wrapping one of them; test with errors.Is.
var (
	// ErrTimeout: a wait ran past its deadline. The *Error lists the
	// ranks that never came (from DialEtcd: etcd did not answer). It also
	// matches transport.ErrTimeout.
	ErrTimeout = errors.New("timed out")
	// ErrGroupInUse: another run still holds the group name.
	ErrGroupInUse = errors.New("group in use")
	// ErrDuplicateRank: two processes claimed the same rank.
	ErrDuplicateRank = errors.New("duplicate rank")
	// ErrWorldSizeMismatch: ranks of one run disagree on the world size.
	ErrWorldSizeMismatch = errors.New("world size mismatch")
	// ErrPeerGone: a rank's liveness key disappeared because its process
	// ended or lost etcd for longer than its lease TTL. It also matches
	// transport.ErrPeerGone.
	ErrPeerGone = errors.New("peer gone")
	// ErrAborted: another rank ended the run's Join with a failure of
	// its own; the *Error's Detail says which.
	ErrAborted = errors.New("run aborted")
	// ErrInvalid: the options or arguments cannot describe a rank, a key
	// or a barrier of a group, or a store to dial.
	ErrInvalid = errors.New("invalid options")
	// ErrDuplicateKey: a rank published the same Exchange key twice.
	ErrDuplicateKey = errors.New("key published twice")
	// ErrClosed: the Group was used after Close.
	ErrClosed = errors.New("group closed")
	// ErrAuth: with a group secret, the only records found where one was
	// needed do not verify (another secret, or none, wrote them). It is
	// auth.ErrFailed: "authentication failed".
	ErrAuth = auth.ErrFailed
	// ErrTampered: a rank's record was deleted or rewritten while its
	// rank lived, by something other than that rank; or a key a rank was
	// to publish (Group.Put) was created first by another writer.
	ErrTampered = errors.New("record deleted or rewritten")
)

// Error is the error of a failed rendezvous step. It names the group, the
// run, the rank that reports it, the store key involved and the ranks at
// fault, and says what to do about it. DialEtcd's errors have no group,
// run or rank.
type Error struct {
	Group string
	RunID string
	// Rank is the rank that reports the error.
	Rank int
	// Key is the store key the failed step read or wrote, if any.
	Key string
	// Ranks are the ranks at fault: missing, duplicated, mismatching or
	// gone. Sorted, possibly empty.
	Ranks []int
	// Err is one of the sentinels above, or the underlying cause
	// (a store error, context.Canceled).
	Err error
	// Detail says what happened and what to do, in words.
	Detail string
}

// Error names the group, run, rank, key and ranks concerned, and what to do.
func (e *Error) Error() string {
	var b strings.Builder
	if e.Group == "" && e.RunID == "" {
		fmt.Fprintf(&b, "rendezvous: %v", e.Err)
	} else {
		fmt.Fprintf(&b, "rendezvous: group %q run %q rank %d: %v", e.Group, e.RunID, e.Rank, e.Err)
	}
	if len(e.Ranks) > 0 {
		fmt.Fprintf(&b, " (rank%s %s)", plural(len(e.Ranks)), joinInts(e.Ranks))
	}
	if e.Key != "" {
		fmt.Fprintf(&b, " at key %q", e.Key)
	}
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	return b.String()
}

// Unwrap returns the sentinel or cause.
func (e *Error) Unwrap() error { return e.Err }

// FaultRanks returns Ranks, the ranks at fault.
func (e *Error) FaultRanks() []int { return e.Ranks }

// Is makes rendezvous timeouts and lost peers match the transport
// package's sentinels, so a transport that gets them from its Exchange can
// be tested the same way as its own.
func (e *Error) Is(target error) bool {
	switch target {
	case transport.ErrTimeout:
		return errors.Is(e.Err, ErrTimeout)
	case transport.ErrPeerGone:
		return errors.Is(e.Err, ErrPeerGone)
	}
	return false
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}
