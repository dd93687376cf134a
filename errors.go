package weightcast

import (
	"context"
	"errors"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/rendezvous"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/zmqbus"
)

// Kind sorts errors by what the caller can do about them; the C library
// returns it as the error code, and the Python package raises one
// exception class per kind.
type Kind int

// The kinds of error, from KindOf.
const (
	KindNone     Kind = iota
	KindOther         // anything else: the text says what
	KindConfig        // bad options or input: change them (ErrConfig, a world size or rank that does not match)
	KindTimeout       // a wait ran past its deadline
	KindPeerGone      // another rank died or left (also: the sender ended the run)
	KindChecksum      // a bucket's bytes did not match their checksum
	KindClosed        // the Sender or Receiver is closed
	KindAborted       // a rank gave the round up (Abort, Ctrl-C, or a failure the text names)
)

// KindOf says what kind of failure err is. When several apply, the first
// in this order wins: closed, config, checksum, peer gone, timeout,
// aborted.
func KindOf(err error) Kind {
	var wait *gpu.WaitError
	switch {
	case err == nil:
		return KindNone
	case errors.Is(err, ErrClosed):
		return KindClosed
	case errors.Is(err, ErrConfig), errors.Is(err, rendezvous.ErrWorldSizeMismatch),
		errors.Is(err, rendezvous.ErrDuplicateRank), errors.Is(err, rendezvous.ErrInvalid),
		errors.Is(err, zmqbus.ErrHandshake), errors.Is(err, sink.ErrNotHeld), errors.Is(err, stages.ErrStaleVersion):
		return KindConfig
	case errors.Is(err, stages.ErrChecksum):
		return KindChecksum
	case errors.Is(err, transport.ErrPeerGone), errors.Is(err, rendezvous.ErrPeerGone), errors.Is(err, transport.ErrEnded):
		return KindPeerGone
	case errors.Is(err, transport.ErrTimeout), errors.Is(err, rendezvous.ErrTimeout),
		errors.Is(err, context.DeadlineExceeded), errors.As(err, &wait) && errors.Is(wait.Err, context.DeadlineExceeded):
		return KindTimeout
	case errors.Is(err, zmqbus.ErrAborted), errors.Is(err, rendezvous.ErrAborted), errors.Is(err, context.Canceled), errors.Is(err, ErrInterrupted):
		return KindAborted
	}
	return KindOther
}
