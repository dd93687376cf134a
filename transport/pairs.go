package transport

import (
	"context"
	"fmt"

	"github.com/weightcast/weightcast/mem"
)

// Pairs is one rank's side of a point-to-point byte transport for a routed
// group: ranks [0, Config.Senders) send, the others receive, and buckets
// move between one sender and one receiver at a time (what package plan
// routes), not from one root to everyone as with Endpoint.
//
// Send and Recv calls for one peer are made one at a time, in the order of
// their seq (0, 1, … for each pair, across rounds); calls for different
// peers may run concurrently. Both ends of a pair are told the same seq
// and n, from a schedule both computed. Every wait is bounded by the
// config's timeout and by ctx, and its error is an *Error naming the peer.
type Pairs interface {
	// Send moves buf[:n] to rank to as that pair's bucket seq. It returns
	// when buf may be reused.
	Send(ctx context.Context, to int, seq uint64, buf mem.Buffer, n int) error
	// Recv waits for bucket seq of n bytes from rank from and lands it in
	// buf[:n]; it returns once the bytes are there.
	Recv(ctx context.Context, from int, seq uint64, buf mem.Buffer, n int) error
	// Close releases the connections, so that every peer still waiting
	// on this rank fails with ErrPeerGone naming it. It is idempotent.
	Close() error
}

// Borrower is implemented by Pairs whose receivers can read a bucket where
// it lies in the sender's memory instead of copying it into their own
// (ipc, on the sender's GPU): one copy of the round fewer per receiver.
type Borrower interface {
	// Borrows reports whether Borrow serves the pair with sender from.
	Borrows(from int) bool
	// Borrow waits, as Recv does, for bucket seq of n bytes from sender
	// from and returns memory this rank's GPU can read holding them, and
	// release, which tells the sender that this rank reads it no more
	// (release(nil), once every copy out of it has finished) or that the
	// bucket failed (release(err)); only the first call counts. The
	// sender's Send returns once the bucket is released.
	Borrow(ctx context.Context, from int, seq uint64, n int) (buf mem.Buffer, release func(error) error, err error)
}

// PairsOpener opens a rank's side of a point-to-point transport.
type PairsOpener func(ctx context.Context, cfg Config) (Pairs, error)

// Sends reports whether rank sends in a routed group of cfg: ranks
// [0, Senders) do.
func (c Config) Sends(rank int) bool { return rank < c.senders() }

// senders is Senders, or 1 when it is zero.
func (c Config) senders() int { return max(c.Senders, 1) }

// ValidatePairs reports a Config that cannot describe a rank of a routed
// group: Validate's rules, and at least one sender and one receiver.
func (c Config) ValidatePairs() error {
	if err := c.Validate(); err != nil {
		return err
	}
	if c.Senders < 0 || c.senders() >= c.WorldSize {
		return fmt.Errorf("transport: %d senders in a group of %d ranks: a routed group needs at least one sender and one receiver", c.Senders, c.WorldSize)
	}
	return nil
}

// OpenPairs opens cfg.Rank's side of the point-to-point transport
// registered as name, or says that it has none.
func OpenPairs(ctx context.Context, name string, cfg Config) (Pairs, error) {
	d, ok := Lookup(name)
	if !ok {
		return nil, unknown(name)
	}
	if d.OpenPairs == nil {
		return nil, fmt.Errorf("transport %s moves buckets from one root to every receiver only; a routed group (several senders, or sharded receivers) needs one that moves them between pairs of ranks: %s", name, pairNames())
	}
	return d.OpenPairs(ctx, cfg)
}

// pairNames lists the registered transports with point-to-point support.
func pairNames() string {
	var out string
	for _, n := range Names() {
		if d, _ := Lookup(n); d.OpenPairs != nil {
			if out != "" {
				out += ", "
			}
			out += n
		}
	}
	if out == "" {
		return "none is linked into this program"
	}
	return "those that do: " + out
}
