package transport

import "context"

// DefaultWindow is how many messages a Publisher lets be in flight
// (published but not acknowledged by every subscriber): 32. Buckets the
// root fills are bounded by each rank's two bucket buffers whatever the
// window; a window of at least three lets a third message reach a
// receiver while it copies the two before, so that the next bucket is
// there when a buffer frees (on one H200 a metadata message arrived
// 400-700 us after the acknowledgement that let the root send it, nearly a
// 1 GiB bucket's copies, and a window of three kept the receiver's GPU
// busy between buckets where two left it idle 0.2-0.7 ms a round). Direct
// buckets hold no memory, and receivers that copy them in turns
// (wire.DirectTurns) hold back their acknowledgements while the receiver
// ahead of them copies its turn: the root must publish a turn and the next
// while the last receiver acknowledges nothing, so the window bounds a turn
// to 16 buckets. A window of 32 alone changed neither 1 GiB nor 256 MiB
// rounds (docs/benchmarks.md, "Turns of several buckets with a window of
// 32").
const DefaultWindow = 32

// DefaultMaxMessage is the largest metadata message a Subscriber accepts
// unless configured otherwise: 64 MiB.
const DefaultMaxMessage = 64 << 20

// Publisher sends each bucket's metadata from the root to every receiver,
// losslessly and in order. Publish blocks while Window messages are
// unacknowledged by some subscriber, so a slow receiver slows the root
// instead of losing messages.
type Publisher interface {
	// Publish sends msg as message seq to every subscriber. Sequence
	// numbers start at 0 and increase by one per call, across rounds.
	Publish(ctx context.Context, seq uint64, msg []byte) error
	// Sync waits until every subscriber has acknowledged every message
	// published so far.
	Sync(ctx context.Context) error
	// Close releases the publisher. It is idempotent.
	Close() error
}

// Message is one metadata message as a Subscriber receives it.
type Message struct {
	Seq  uint64
	Data []byte
}

// Subscriber receives the root's metadata messages on one receiver. Recv
// and Ack may be called from different goroutines (one stage receives,
// a later one acknowledges), but each from one goroutine at a time.
type Subscriber interface {
	// Recv returns the next message. Messages arrive in sequence order
	// with no gaps or duplicates; a gap is reported as an error.
	Recv(ctx context.Context) (Message, error)
	// Ack tells the root that message seq has been fully handled, which
	// opens the window for the next one.
	Ack(ctx context.Context, seq uint64) error
	// Close releases the subscriber. It is idempotent.
	Close() error
}

// Aborter is implemented by Publishers that can tell every receiver why
// the root gave up a round, and by Subscribers that can tell the root why a
// receiver gave up, so that the other side fails with the real reason rather
// than with "peer gone". Sender and Receiver call it when a round fails.
type Aborter interface {
	Abort(err error)
}

// Watcher is implemented by Publishers and Subscribers that tell, while a
// round waits elsewhere (on the byte transport, which may never hear of
// it), that the bus has failed for a reason other than this side's own
// Abort: the other side gave up, broke the protocol, or its connection
// failed. Failed is closed then, and Err says why. Sender and Receiver end
// a running round with Err at once.
type Watcher interface {
	Failed() <-chan struct{}
	Err() error
}
