package ncclx

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/nccl"
	"github.com/weightcast/weightcast/transport"
)

// Name is the registry name of this transport.
const Name = "nccl"

// UniqueIDKey is the Exchange key under which rank 0 publishes the NCCL
// unique id of the communicator's first generation; a rebuild publishes
// generation g under UniqueIDKey + ".<g>".
const UniqueIDKey = "nccl.uid"

// Endpoint is one rank's NCCL endpoint. Its methods may be called from any
// goroutine, one at a time.
type Endpoint struct {
	cfg    transport.Config
	dev    *gpu.CUDADevice
	stream *gpu.Stream

	mu     sync.Mutex
	comm   *nccl.Comm
	gen    int // communicator generation: 0 at Open, +1 per Rebuild
	closed bool
	broken error
}

var _ transport.Endpoint = (*Endpoint)(nil)

func (e *Endpoint) err(op string, seq uint64, hasSeq bool, peer int, err error) *transport.Error {
	return &transport.Error{Transport: Name, Group: e.cfg.Group, Rank: e.cfg.Rank, Op: op, Seq: seq, HasSeq: hasSeq, Peer: peer, Err: err}
}

// Open creates this rank's NCCL communicator: rank 0 makes the unique id
// and publishes it under UniqueIDKey, the others wait for it; then every
// rank joins (non-blocking init, bounded by cfg.WaitTimeout() and ctx,
// aborted when either ends). cfg.Rank is the NCCL rank and cfg.WorldSize
// the NCCL world size; cfg.Device must be a *gpu.CUDADevice, one per rank
// (NCCL refuses two ranks on one GPU).
//
// Option "rebuild": "never" (the default) keeps one communicator for the
// endpoint's life. "each-round" (verl's rebuild_group) is refused here: an
// Endpoint sees buckets, not rounds, so callers that want a fresh
// communicator per round call Rebuild on every rank between rounds.
func Open(ctx context.Context, cfg transport.Config) (transport.Endpoint, error) {
	e := &Endpoint{cfg: cfg}
	if err := cfg.Validate(); err != nil {
		return nil, e.err("open", 0, false, -1, err)
	}
	switch v := cfg.Options["rebuild"]; v {
	case "", "never":
	case "each-round":
		return nil, e.err("open", 0, false, -1, errors.New(`option rebuild=each-round: an endpoint has no round boundary; keep rebuild=never and call (*ncclx.Endpoint).Rebuild on every rank between rounds`))
	default:
		return nil, e.err("open", 0, false, -1, fmt.Errorf("option rebuild=%q: want never", v))
	}
	dev, ok := cfg.Device.(*gpu.CUDADevice)
	if !ok {
		return nil, e.err("open", 0, false, -1, fmt.Errorf("the nccl transport moves device memory; this rank's device is %s, not a CUDA GPU (use tcp for host memory)", cfg.Device.Name()))
	}
	if cfg.Exchange == nil {
		return nil, e.err("open", 0, false, -1, errors.New("no Exchange in the config: rank 0 publishes the NCCL unique id through it"))
	}
	e.dev = dev
	s, err := dev.NewStream()
	if err != nil {
		return nil, e.err("open", 0, false, -1, err)
	}
	e.stream = s
	if err := e.connect(ctx, "open"); err != nil {
		s.Close()
		return nil, err
	}
	return e, nil
}

// bounded limits ctx by the config's wait bound, and explains its expiry.
func (e *Endpoint) bounded(ctx context.Context, what string) (context.Context, context.CancelFunc, func(error) error) {
	d := e.cfg.WaitTimeout()
	wctx, cancel := context.WithTimeoutCause(ctx, d, fmt.Errorf("%s took longer than %v: %w", what, d, transport.ErrTimeout))
	explain := func(err error) error {
		if ctx.Err() == nil && wctx.Err() != nil {
			return fmt.Errorf("%w (%w)", context.Cause(wctx), err)
		}
		return err
	}
	return wctx, cancel, explain
}

func (e *Endpoint) uidKey() string {
	if e.gen == 0 {
		return UniqueIDKey
	}
	return fmt.Sprintf("%s.%d", UniqueIDKey, e.gen)
}

// connect shares the unique id of the current generation and creates the
// communicator.
func (e *Endpoint) connect(ctx context.Context, op string) error {
	wctx, cancel, explain := e.bounded(ctx, "joining the NCCL communicator")
	defer cancel()
	var id nccl.UniqueID
	key := e.uidKey()
	if e.cfg.Rank == 0 {
		var err error
		if id, err = nccl.NewUniqueID(); err != nil {
			return e.err(op, 0, false, -1, err)
		}
		if err := e.cfg.Exchange.Put(wctx, key, id[:]); err != nil {
			return e.err(op, 0, false, -1, fmt.Errorf("publishing the unique id: %w", explain(err)))
		}
	} else {
		raw, err := e.cfg.Exchange.Get(wctx, 0, key)
		if err != nil {
			return e.err(op, 0, false, 0, fmt.Errorf("waiting for rank 0's unique id: %w", explain(err)))
		}
		if len(raw) != len(id) {
			return e.err(op, 0, false, 0, fmt.Errorf("rank 0 published a %d-byte %q, not a %d-byte NCCL unique id (is it using another transport?)", len(raw), key, len(id)))
		}
		copy(id[:], raw)
	}
	c, err := nccl.NewComm(wctx, nccl.Config{Device: e.dev, ID: id, NRanks: e.cfg.WorldSize, Rank: e.cfg.Rank, Label: e.cfg.Group})
	if err != nil {
		return e.err(op, 0, false, -1, classify(explain(err)))
	}
	e.comm = c
	return nil
}

// classify marks NCCL failures caused by a rank that went away.
func classify(err error) error {
	var ne *nccl.Error
	if errors.As(err, &ne) && (ne.Result == nccl.RemoteError || ne.Result == nccl.SystemError) && !errors.Is(err, transport.ErrPeerGone) {
		return fmt.Errorf("%w (%w)", err, transport.ErrPeerGone)
	}
	return err
}

// Broadcast runs ncclBroadcast of buf[:n] from rank 0, in place, on the
// endpoint's stream. If buf is fenced (a bucket still being packed), the
// stream first waits for the fence on the GPU (cuStreamWaitEvent): the
// host never blocks on it. Broadcast returns when the broadcast has
// finished on this rank. When the wait bound or ctx ends first, or NCCL
// reports an error, the communicator is aborted and the endpoint refuses
// further broadcasts; the error wraps transport.ErrTimeout, the context's
// error, or transport.ErrPeerGone for NCCL's remote and system errors.
func (e *Endpoint) Broadcast(ctx context.Context, seq uint64, buf mem.Buffer, n int) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.closed:
		return e.err("broadcast", seq, true, -1, transport.ErrClosed)
	case e.broken != nil:
		return e.err("broadcast", seq, true, -1, fmt.Errorf("endpoint unusable after an earlier failure (the communicator was aborted): %w", e.broken))
	case n < 0 || n > buf.Len():
		return e.err("broadcast", seq, true, -1, fmt.Errorf("length %d outside the %d-byte buffer", n, buf.Len()))
	case buf.Host() != nil || buf.DevicePtr() == 0:
		return e.err("broadcast", seq, true, -1, fmt.Errorf("buffer on %s is not device memory; the nccl transport moves device buckets", buf.Device().Name()))
	}
	if n == 0 {
		return nil // every rank skips an empty bucket alike
	}
	if ev := gpu.FenceOf(buf); ev != nil {
		if err := e.stream.WaitEvent(ev); err != nil {
			return e.fail(seq, err)
		}
	}
	wctx, cancel, explain := e.bounded(ctx, fmt.Sprintf("broadcast of bucket %d (%d bytes)", seq, n))
	defer cancel()
	p := buf.DevicePtr()
	if err := e.comm.Broadcast(wctx, p, p, n, 0, e.stream); err != nil {
		return e.fail(seq, classify(explain(err)))
	}
	return nil
}

func (e *Endpoint) fail(seq uint64, err error) error {
	te := e.err("broadcast", seq, true, -1, err)
	e.broken = te
	e.comm.Abort() // a no-op where the failed broadcast already aborted it
	return te
}

// Rebuild replaces the communicator with a new one (verl's rebuild_group):
// the old one is finalized (or aborted when that fails), rank 0 publishes a
// fresh unique id under UniqueIDKey.<generation>, and every rank joins
// again. Every rank of the group must call Rebuild at the same point,
// between rounds. It also makes a broken endpoint usable again when the
// failure is gone.
func (e *Endpoint) Rebuild(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return e.err("rebuild", 0, false, -1, transport.ErrClosed)
	}
	if e.comm != nil {
		wctx, cancel, _ := e.bounded(ctx, "finalizing the communicator")
		// A finalize that fails aborts the old communicator, which is
		// all that is needed of it here.
		e.comm.Close(wctx)
		cancel()
		e.comm = nil
	}
	e.gen++
	if err := e.connect(ctx, "rebuild"); err != nil {
		e.broken = err
		return err
	}
	e.broken = nil
	return nil
}

// Close finalizes the communicator (bounded by the config's wait bound;
// aborted when that ends or fails) and destroys the stream. It is
// idempotent.
func (e *Endpoint) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	var errs []error
	if e.comm != nil {
		if e.broken != nil {
			errs = append(errs, e.comm.Abort())
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), e.cfg.WaitTimeout())
			errs = append(errs, e.comm.Close(ctx))
			cancel()
		}
	}
	errs = append(errs, e.stream.Close())
	return errors.Join(errs...)
}
