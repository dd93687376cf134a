package transport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/mem"
)

// Config places one rank in a sync group. Rank 0 is the root (the sender);
// ranks 1..WorldSize-1 receive.
type Config struct {
	// Group names the sync group; ranks of one group find each other by it.
	Group string
	// Rank is this rank's index in [0, WorldSize).
	Rank int
	// WorldSize counts the root and every receiver.
	WorldSize int
	// Senders, in a routed group (Pairs), counts the ranks that send:
	// ranks [0, Senders) send, the others receive. Zero means one. A
	// broadcast group (Endpoint) has one root, rank 0, and ignores it.
	Senders int
	// Device is where this rank's bucket buffers live.
	Device mem.Device
	// Exchange shares endpoints between the ranks while the transport
	// opens. In-process transports may leave it unused.
	Exchange Exchange
	// Timeout bounds every single wait inside the transport (a peer
	// connecting, a bucket arriving). Zero means 5 minutes. The caller's
	// context bounds everything as well.
	Timeout time.Duration
	// Options holds transport-specific settings ("chunk": "4MiB", ...).
	Options map[string]string
	// Auth, when not nil, are the run's keys derived from the group secret
	// (auth.Secret.RunKeys of this group and run): every connection
	// between ranks then opens with a challenge and response that proves
	// both ends hold the secret, and a peer that does not is refused. Nil
	// means no secret. Every rank of a group is given keys of the same
	// secret, or none.
	Auth *auth.Keys
	// TLS, when not nil, runs the connections that cross the network (the
	// tcp chain, the metadata bus) over mutual TLS 1.3 with this rank's
	// certificate and authority. Nil means plain TCP.
	TLS *auth.TLS
	// Logger receives the transports' warnings (connections refused before
	// their handshake completed, rate-limited). Nil means slog.Default().
	Logger *slog.Logger
}

// DefaultTimeout is the wait bound used when Config.Timeout is zero.
const DefaultTimeout = 5 * time.Minute

// WaitTimeout returns c.Timeout, or DefaultTimeout when it is zero.
func (c Config) WaitTimeout() time.Duration {
	if c.Timeout > 0 {
		return c.Timeout
	}
	return DefaultTimeout
}

// Validate reports a Config that cannot describe a rank.
func (c Config) Validate() error {
	switch {
	case c.Group == "":
		return errors.New("transport: empty group name; give every rank the same group")
	case c.WorldSize < 2:
		return fmt.Errorf("transport: world size %d: a group needs a root and at least one receiver", c.WorldSize)
	case c.Rank < 0 || c.Rank >= c.WorldSize:
		return fmt.Errorf("transport: rank %d outside [0, %d) for world size %d", c.Rank, c.WorldSize, c.WorldSize)
	case c.Device == nil:
		return errors.New("transport: no device in config")
	case c.Auth != nil && c.Auth.Group() != c.Group:
		return fmt.Errorf("transport: the keys in Auth belong to group %q, not %q; derive them with RunKeys of this group and run", c.Auth.Group(), c.Group)
	}
	return nil
}

// Exchange shares small values (addresses, unique ids) among the ranks of
// one group while transports open. The rendezvous package provides one.
type Exchange interface {
	// Put publishes value under key on behalf of this rank.
	Put(ctx context.Context, key string, value []byte) error
	// Get waits until rank has published key and returns the value.
	Get(ctx context.Context, rank int, key string) ([]byte, error)
}

// Endpoint is one rank's side of a byte transport.
type Endpoint interface {
	// Broadcast moves buf[:n] from the root to every receiver. On the root
	// buf holds the bytes; on a receiver they land in buf. Every rank
	// calls Broadcast with the same seq and n, in the same order. It
	// returns when this rank's part is done: on the root buf may then be
	// reused, on a receiver buf[:n] holds the root's bytes.
	Broadcast(ctx context.Context, seq uint64, buf mem.Buffer, n int) error
	// Close releases the endpoint's connections. It is idempotent.
	Close() error
}

// DirectReader is implemented by root endpoints of transports whose
// receivers can map the root's device memory (CUDA IPC) and read it where
// it lies: then the root's device tensors need not be packed into buckets
// and broadcast at all, every receiver copies them straight out of the
// root's memory (stages' direct buckets), and Broadcast is called only for
// the buckets the root did fill.
type DirectReader interface {
	// ReadsDirect reports whether every receiver reads the root's device
	// memory in place: each shares the root's GPU and speaks a protocol
	// that can. It is false on receivers' endpoints.
	ReadsDirect() bool
	// Receivers counts the receivers, ranks 1 to Receivers, that may
	// take turns on the root's GPU (stages' turns.go).
	Receivers() int
}

// Lender is implemented by receiver endpoints that can hand this rank the
// root's own buffer instead of copying each bucket into one of its own:
// the ipc transport's, whose receivers on the root's GPU map the root's
// buffers. The stages then read the bucket where it lies (one copy of
// the model per receiver fewer), and the root reuses the buffer only once
// every receiver has released it.
type Lender interface {
	// Lends reports whether Lend serves this rank (for ipc: it shares the
	// root's GPU). Where it does not, the rank calls Broadcast.
	Lends() bool
	// Lend waits, as Broadcast does, for bucket seq of n bytes (n > 0) and
	// returns memory this rank's GPU can read holding them: buf[:n], the
	// root's buffer. release tells the root: release(nil) once this rank
	// reads buf no more (every copy out of it has finished), release(err)
	// to fail the bucket; only the first call counts. The root sends the
	// next bucket only once every receiver has released this one. Every
	// rank calls Broadcast or Lend for the same buckets in the same order.
	Lend(ctx context.Context, seq uint64, n int) (buf mem.Buffer, release func(error) error, err error)
}

// Error is the error every transport returns from a failed wait or
// transfer: it names the transport, group, rank, operation and bucket.
type Error struct {
	Transport string
	Group     string
	Rank      int
	Op        string // "open", "broadcast", "publish", "recv", ...
	Seq       uint64 // the bucket or message sequence number, when HasSeq
	HasSeq    bool
	Peer      int // the rank at fault, or -1 when unknown
	Err       error
}

// Error names the transport, operation, group, rank, bucket and peer.
func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: group %q rank %d", e.Transport, e.Op, e.Group, e.Rank)
	if e.HasSeq {
		fmt.Fprintf(&b, " bucket %d", e.Seq)
	}
	if e.Peer >= 0 {
		fmt.Fprintf(&b, " (peer rank %d)", e.Peer)
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	return b.String()
}

// Unwrap returns the underlying error (ErrTimeout, ErrPeerGone, ...).
func (e *Error) Unwrap() error { return e.Err }

// FaultRanks returns the rank at fault, Peer, or none when unknown.
func (e *Error) FaultRanks() []int {
	if e.Peer < 0 {
		return nil
	}
	return []int{e.Peer}
}

// ErrTimeout is wrapped by errors from waits that ran past their bound.
var ErrTimeout = errors.New("timed out")

// ErrPeerGone is wrapped by errors caused by a peer that disconnected or died.
var ErrPeerGone = errors.New("peer gone")

// ErrEnded is wrapped by a Subscriber's Recv error when the root closed
// the metadata bus deliberately with every message acknowledged: between
// two rounds, that ends the run (docs/protocol.md, "End of a run").
var ErrEnded = errors.New("the root ended the run")

// ErrClosed is returned by operations on a closed endpoint, publisher or subscriber.
var ErrClosed = errors.New("transport: closed")

// ContextErr is ctx.Err() with the context's cause attached when the cause
// says more (a lost peer, a failed stage), so that an error passed down a
// chain of ranks still tells why the first one stopped. errors.Is still
// matches context.Canceled or context.DeadlineExceeded.
func ContextErr(ctx context.Context) error {
	err := ctx.Err()
	if err == nil {
		return nil
	}
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return &CanceledError{Err: err, Cause: cause}
	}
	return err
}

// CanceledError is ContextErr's error for a context whose cause says
// more than its error: "context canceled (because ...)". It matches Err
// (errors.Is), not Cause, which is the reason given, not what failed
// here; Cause lets a caller tell that an error already carries a reason
// (package blame).
type CanceledError struct {
	Err   error // context.Canceled or context.DeadlineExceeded
	Cause error // context.Cause
}

// Error is "Err (because Cause)".
func (e *CanceledError) Error() string { return e.Err.Error() + " (because " + e.Cause.Error() + ")" }

// Unwrap returns Err.
func (e *CanceledError) Unwrap() error { return e.Err }
