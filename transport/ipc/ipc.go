package ipc

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/internal/ratelog"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/internal/handshake"
)

// Name is the registry name of this transport.
const Name = "ipc"

// AddrKey is the Exchange key under which the root publishes its side
// channel address.
const AddrKey = "ipc.addr"

// rootInfo is what the root publishes under AddrKey (JSON).
type rootInfo struct {
	Addr   string `json:"addr"`
	PID    int    `json:"pid"`
	Device int    `json:"device"`
	// UUID is the root's GPU's UUID in hex, so that receivers on the same
	// GPU read its buffers in place (Lend); absent where the driver
	// cannot tell.
	UUID string `json:"uuid,omitempty"`
}

func terr(cfg transport.Config, op string, seq uint64, hasSeq bool, peer int, err error) *transport.Error {
	return &transport.Error{Transport: Name, Group: cfg.Group, Rank: cfg.Rank, Op: op, Seq: seq, HasSeq: hasSeq, Peer: peer, Err: err}
}

// Open opens this rank's endpoint. The root listens on the loopback
// interface (option "bind" picks another host address), publishes the
// address under AddrKey and waits until every receiver has connected and
// said hello; a receiver dials it. Each wait is bounded by
// cfg.WaitTimeout() and ctx. cfg.Device must be a *gpu.CUDADevice.
func Open(ctx context.Context, cfg transport.Config) (transport.Endpoint, error) {
	fail := func(peer int, err error) (transport.Endpoint, error) {
		var te *transport.Error
		if errors.As(err, &te) {
			return nil, err
		}
		return nil, terr(cfg, "open", 0, false, peer, err)
	}
	if err := cfg.Validate(); err != nil {
		return fail(-1, err)
	}
	dev, ok := cfg.Device.(*gpu.CUDADevice)
	if !ok {
		return fail(-1, fmt.Errorf("the ipc transport moves device memory; this rank's device is %s, not a CUDA GPU (use tcp for host memory)", cfg.Device.Name()))
	}
	if cfg.Exchange == nil {
		return fail(-1, errors.New("no Exchange in the config: the root publishes its address through it"))
	}
	if cfg.Rank == 0 {
		return openRoot(ctx, cfg, dev)
	}
	return openReceiver(ctx, cfg, dev)
}

// bounded returns ctx limited by the config's wait bound, and a function
// that turns the limit's expiry into ErrTimeout.
func bounded(ctx context.Context, cfg transport.Config, what string) (context.Context, context.CancelFunc, func(error) error) {
	d := cfg.WaitTimeout()
	wctx, cancel := context.WithTimeoutCause(ctx, d, fmt.Errorf("%s took longer than %v: %w", what, d, transport.ErrTimeout))
	explain := func(err error) error {
		if ctx.Err() == nil && wctx.Err() != nil {
			return context.Cause(wctx)
		}
		return err
	}
	return wctx, cancel, explain
}

// ---- root ----

type peer struct {
	rank   int
	pid    int
	direct bool // on the root's GPU, and reads the root's memory in place
	conn   net.Conn
	acks   chan ack
	gone   chan struct{} // closed by the reader when the connection ends
	err    error         // why; set before gone is closed
	wmu    sync.Mutex    // one writer at a time
}

type root struct {
	cfg     transport.Config
	dev     *gpu.CUDADevice
	uuid    [16]byte // the root's GPU; zero where the driver cannot tell
	peers   []*peer  // by rank - 1
	remote  bool     // some receiver lives in another process
	handles map[uint64]gpu.IPCHandle
	wg      sync.WaitGroup
	done    chan struct{} // closed by Close: readers stop

	mu     sync.Mutex // one Broadcast at a time
	closed bool
	broken error
	once   sync.Once
}

// proto is the handshake of the side channel.
var proto = handshake.Protocol{Name: Name, Magic: magic, Version: version}

// maxHandshake bounds one connection's handshake within the wait for the
// receivers.
const maxHandshake = 10 * time.Second

func openRoot(ctx context.Context, cfg transport.Config, dev *gpu.CUDADevice) (transport.Endpoint, error) {
	bind := "127.0.0.1"
	if v := cfg.Options["bind"]; v != "" {
		bind = v
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(bind, "0"))
	if err != nil {
		return nil, terr(cfg, "open", 0, false, -1, fmt.Errorf("listening on %s: %w", bind, err))
	}
	ri := rootInfo{Addr: ln.Addr().String(), PID: os.Getpid(), Device: dev.Ordinal()}
	if u, err := dev.UUID(); err == nil {
		ri.UUID = hex.EncodeToString(u[:])
	}
	info, _ := json.Marshal(ri)
	wctx, cancel, explain := bounded(ctx, cfg, "waiting for the receivers to connect")
	defer cancel()
	if err := cfg.Exchange.Put(wctx, AddrKey, info); err != nil {
		ln.Close()
		return nil, terr(cfg, "open", 0, false, -1, fmt.Errorf("publishing the side channel address: %w", explain(err)))
	}
	r := &root{cfg: cfg, dev: dev, peers: make([]*peer, cfg.WorldSize-1), handles: map[uint64]gpu.IPCHandle{}, done: make(chan struct{})}
	r.uuid, _ = dev.UUID() // zero where unknown: then no receiver reads in place
	if err := r.admitAll(wctx, ln, explain); err != nil {
		return nil, err
	}
	for _, p := range r.peers {
		if p.pid != os.Getpid() {
			r.remote = true
		}
		r.wg.Go(func() { r.read(p) })
	}
	return r, nil
}

// admitAll waits until every receiver has connected to ln and completed
// the handshake, and fills r.peers. A connection whose handshake fails (a
// stranger, another group, world size or secret, a rank taken or out of
// range) is refused and logged, and the wait goes on: nothing that has
// not proved to be a receiver can take a rank's place or end the wait.
// explain turns the wait's expiry into ErrTimeout.
func (r *root) admitAll(ctx context.Context, ln net.Listener, explain func(error) error) error {
	var mu sync.Mutex
	taken := make([]bool, r.cfg.WorldSize)
	me := handshake.Side{Group: r.cfg.Group, Rank: 0, World: r.cfg.WorldSize, Extra: rootExtra(os.Getpid()), Keys: r.cfg.Auth}
	check := func(h handshake.Hello) string {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case h.Rank < 1 || h.Rank >= r.cfg.WorldSize:
			return fmt.Sprintf("rank %d outside [1, %d): rank 0 is the root", h.Rank, r.cfg.WorldSize)
		case taken[h.Rank]:
			return fmt.Sprintf("rank %d joined twice; give every rank a distinct rank", h.Rank)
		}
		return ""
	}
	a := handshake.Admission{Want: r.cfg.WorldSize - 1, Bound: min(r.cfg.WaitTimeout(), maxHandshake), Log: ratelog.New(r.cfg.Logger, 0),
		What: fmt.Sprintf("ipc root of group %q", r.cfg.Group)}
	got, refused, err := handshake.Admit(ctx, ln, a, func(_ context.Context, c net.Conn) (*peer, error) {
		h, err := handshake.Accept(c, proto, me, check)
		if err != nil {
			return nil, err
		}
		ri, err := decodeReceiverExtra(h.Extra)
		if err != nil {
			return nil, fmt.Errorf("rank %d's hello: %w", h.Rank, err)
		}
		direct := ri.flags&extraReadsDirect != 0 && ri.uuid == r.uuid && r.uuid != [16]byte{}
		mu.Lock()
		defer mu.Unlock()
		if taken[h.Rank] {
			return nil, fmt.Errorf("rank %d joined twice", h.Rank)
		}
		taken[h.Rank] = true
		return &peer{rank: h.Rank, pid: ri.pid, direct: direct, conn: c, acks: make(chan ack, 4), gone: make(chan struct{})}, nil
	})
	if err != nil {
		var missing []int
		for rank := 1; rank < r.cfg.WorldSize; rank++ {
			if !taken[rank] {
				missing = append(missing, rank)
			}
		}
		note := ""
		if refused.N > 0 {
			note = " (" + refused.String() + ")"
		}
		err = explain(err)
		if refused.Auth {
			err = fmt.Errorf("%w (%w)", err, auth.ErrFailed)
		}
		return terr(r.cfg, "open", 0, false, -1, fmt.Errorf("ranks %v never connected%s: %w", missing, note, err))
	}
	for _, x := range got {
		r.peers[x.Value.rank-1] = x.Value
	}
	return nil
}

// ReadsDirect reports whether every receiver shares the root's GPU and
// reads the root's device memory in place (it said so in its handshake).
func (r *root) ReadsDirect() bool {
	for _, p := range r.peers {
		if !p.direct {
			return false
		}
	}
	return true
}

// Receivers counts the receivers, ranks 1 to WorldSize-1.
func (r *root) Receivers() int { return len(r.peers) }

// read delivers a receiver's acks until its connection ends.
func (r *root) read(p *peer) {
	defer close(p.gone)
	for {
		typ, payload, err := readFrame(p.conn)
		if err != nil {
			p.err = fmt.Errorf("connection to rank %d ended (%v): %w", p.rank, err, transport.ErrPeerGone)
			return
		}
		a, err := decodeAck(payload)
		if typ != frameAck || err != nil {
			p.err = fmt.Errorf("rank %d sent a frame of type %d that is no valid ack: %w", p.rank, typ, errFrame)
			p.conn.Close()
			return
		}
		select {
		case p.acks <- a:
		case <-r.done:
			p.err = transport.ErrClosed
			return
		}
	}
}

// handle returns the IPC handle of the allocation at base, exporting it
// the first time.
func (r *root) handle(buf mem.Buffer) (gpu.IPCHandle, error) {
	base := gpu.Unfence(buf)
	if h, ok := r.handles[base.DevicePtr()]; ok {
		return h, nil
	}
	h, err := r.dev.ExportIPC(base)
	if err != nil {
		return h, fmt.Errorf("exporting the bucket buffer (the ipc transport needs whole buffers from the device's Alloc, such as a Pool's): %w", err)
	}
	r.handles[base.DevicePtr()] = h
	return h, nil
}

// Broadcast waits until the bucket's bytes are written (its fence), tells
// every receiver where they are, and returns when every receiver has
// copied them and acknowledged, after which buf may be reused. Where one
// receiver fails (hangs up, refuses the bucket), Broadcast still waits,
// within the same bound, for every other receiver it told of the bucket to
// acknowledge it or hang up, since each may be reading buf until then, and
// returns the first failure (a failed write, else the lowest rank's). A
// wait ended by ctx or the bound
// returns at once, and a receiver that had not acknowledged may then still
// read buf.
func (r *root) Broadcast(ctx context.Context, seq uint64, buf mem.Buffer, n int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	fail := func(peer int, err error) error {
		e := terr(r.cfg, "broadcast", seq, true, peer, err)
		r.broken = e
		return e
	}
	if err := refuse(r.cfg, seq, r.closed, r.broken, buf, n); err != nil {
		return err
	}
	wctx, cancel, explain := bounded(ctx, r.cfg, fmt.Sprintf("bucket %d", seq))
	defer cancel()
	if ev := gpu.FenceOf(buf); ev != nil {
		if err := ev.Wait(wctx); err != nil {
			return fail(-1, fmt.Errorf("waiting for the bucket's bytes to be packed: %w", explain(err)))
		}
	}
	msg := bucketMsg{seq: seq, n: uint64(n), bufLen: uint64(buf.Len()), addr: buf.DevicePtr()}
	if r.remote {
		h, err := r.handle(buf)
		if err != nil {
			return fail(-1, err)
		}
		msg.handle = h
	}
	frame := msg.encode()
	deadline, _ := wctx.Deadline()
	told, err := r.announce(frame, deadline, explain)
	culprit := -1
	if err != nil {
		culprit = r.peers[told].rank
	}
	for _, p := range r.peers[:told] {
		if perr := r.await(wctx, explain, p, seq); perr != nil && err == nil {
			err, culprit = perr, p.rank
		}
	}
	if err != nil {
		return fail(culprit, err)
	}
	return nil
}

// announce writes a bucket's frame to every receiver in rank order, each
// write bounded by deadline. It returns how many it told, and the error of
// the write that failed (the receiver at index told), or nil.
func (r *root) announce(frame []byte, deadline time.Time, explain func(error) error) (int, error) {
	for i, p := range r.peers {
		p.wmu.Lock()
		p.conn.SetWriteDeadline(deadline)
		err := writeFrame(p.conn, frameBucket, frame)
		p.wmu.Unlock()
		if err != nil {
			select {
			case <-p.gone:
				return i, p.err
			default:
			}
			return i, fmt.Errorf("telling rank %d about the bucket (%v): %w", p.rank, explain(err), transport.ErrPeerGone)
		}
	}
	return len(r.peers), nil
}

// await waits, bounded by ctx, for receiver p's acknowledgement of bucket
// seq, and returns why p failed it (hung up first, failed it, acknowledged
// another bucket, or stayed silent until ctx ended), or nil.
func (r *root) await(ctx context.Context, explain func(error) error, p *peer, seq uint64) error {
	var a ack
	select {
	case a = <-p.acks:
	case <-p.gone:
		select {
		case a = <-p.acks: // it acknowledged, then hung up (a receiver done with its last bucket)
		default:
			return p.err
		}
	case <-ctx.Done():
		err := explain(ctx.Err())
		if errors.Is(err, transport.ErrTimeout) {
			err = fmt.Errorf("rank %d did not acknowledge within %v: %w", p.rank, r.cfg.WaitTimeout(), transport.ErrTimeout)
		}
		return err
	}
	switch {
	case a.seq != seq:
		return fmt.Errorf("rank %d acknowledged bucket %d while the root sent bucket %d", p.rank, a.seq, seq)
	case !a.ok:
		return fmt.Errorf("rank %d failed: %s", p.rank, a.msg)
	}
	return nil
}

func (r *root) closeConns() {
	for _, p := range r.peers {
		if p != nil {
			p.conn.Close()
		}
	}
}

// Close ends every connection (receivers then fail with ErrPeerGone) and
// waits for the readers. It is idempotent.
func (r *root) Close() error {
	r.once.Do(func() {
		r.mu.Lock()
		r.closed = true
		r.mu.Unlock()
		close(r.done)
		r.closeConns()
		r.wg.Wait()
	})
	return nil
}

// refuse returns why a Broadcast of n bytes of buf as bucket seq cannot
// start on an endpoint that is closed, or broken by an earlier failure, or
// nil where it can.
func refuse(cfg transport.Config, seq uint64, closed bool, broken error, buf mem.Buffer, n int) error {
	switch {
	case closed:
		return terr(cfg, "broadcast", seq, true, -1, transport.ErrClosed)
	case broken != nil:
		return terr(cfg, "broadcast", seq, true, -1, fmt.Errorf("endpoint unusable after an earlier failure: %w", broken))
	case n < 0 || n > buf.Len():
		return terr(cfg, "broadcast", seq, true, -1, fmt.Errorf("length %d outside the %d-byte buffer", n, buf.Len()))
	case !onDevice(buf):
		return terr(cfg, "broadcast", seq, true, -1, fmt.Errorf("buffer on %s is not device memory; the ipc transport moves device buckets", buf.Device().Name()))
	}
	return nil
}

func onDevice(b mem.Buffer) bool { return b.Host() == nil && b.DevicePtr() != 0 }

// refuseLend is refuse for Lend, which takes no buffer: closed, broken, or
// no bytes to lend.
func refuseLend(cfg transport.Config, seq uint64, closed bool, broken error, n int) error {
	switch {
	case closed:
		return terr(cfg, "broadcast", seq, true, -1, transport.ErrClosed)
	case broken != nil:
		return terr(cfg, "broadcast", seq, true, -1, fmt.Errorf("endpoint unusable after an earlier failure: %w", broken))
	case n <= 0:
		return terr(cfg, "broadcast", seq, true, -1, fmt.Errorf("lending %d bytes: only buckets with bytes are lent (Broadcast the others)", n))
	}
	return nil
}

// ---- receiver ----

type receiver struct {
	cfg     transport.Config
	dev     *gpu.CUDADevice
	conn    net.Conn
	rootPID int
	sameGPU bool       // the root said its GPU's UUID, and it is this receiver's: Lend serves it
	amu     sync.Mutex // one acknowledgement written at a time
	stream  *gpu.Stream
	opened  map[gpu.IPCHandle]mem.Buffer
	frames  chan bucketMsg
	gone    chan struct{} // closed by the reader when the connection ends
	goneErr error
	done    chan struct{} // closed by Close: the reader stops
	wg      sync.WaitGroup

	mu     sync.Mutex
	closed bool
	broken error
	once   sync.Once
}

func openReceiver(ctx context.Context, cfg transport.Config, dev *gpu.CUDADevice) (transport.Endpoint, error) {
	fail := func(err error) (transport.Endpoint, error) {
		return nil, terr(cfg, "open", 0, false, 0, err)
	}
	extra := receiverExtra(os.Getpid(), dev.Ordinal())
	if u, err := dev.UUID(); err == nil {
		extra = readsDirect(extra, u) // a receiver of stages reads direct buckets in place
	}
	c, root, err := dialRoot(ctx, cfg, extra)
	if err != nil {
		return fail(err)
	}
	var same bool
	if u, err := dev.UUID(); err == nil && root.UUID != "" {
		same = root.UUID == hex.EncodeToString(u[:])
	}
	s, err := dev.NewStream()
	if err != nil {
		c.Close()
		return fail(err)
	}
	r := &receiver{cfg: cfg, dev: dev, conn: c, rootPID: root.PID, sameGPU: same, stream: s,
		opened: map[gpu.IPCHandle]mem.Buffer{}, frames: make(chan bucketMsg, 4), gone: make(chan struct{}), done: make(chan struct{})}
	r.wg.Go(r.read)
	return r, nil
}

// dialRoot finds the root's side channel through cfg.Exchange, connects
// and runs the handshake as cfg.Rank with the receiver's extra data, and
// returns the connection and what the root published, with the process id
// its handshake gave.
func dialRoot(ctx context.Context, cfg transport.Config, extra []byte) (net.Conn, rootInfo, error) {
	wctx, cancel, explain := bounded(ctx, cfg, "connecting to the root")
	defer cancel()
	raw, err := cfg.Exchange.Get(wctx, 0, AddrKey)
	if err != nil {
		return nil, rootInfo{}, fmt.Errorf("waiting for the root's address: %w", explain(err))
	}
	var info rootInfo
	if err := json.Unmarshal(raw, &info); err != nil || info.Addr == "" {
		return nil, rootInfo{}, fmt.Errorf("the root published %q under %q, which is no ipc address (is the root using another transport?)", raw, AddrKey)
	}
	var d net.Dialer
	c, err := d.DialContext(wctx, "tcp", info.Addr)
	if err != nil {
		return nil, rootInfo{}, fmt.Errorf("dialing the root at %s: %w", info.Addr, explain(err))
	}
	hctx, hcancel := context.WithTimeout(wctx, maxHandshake)
	defer hcancel()
	deadline, _ := hctx.Deadline()
	c.SetDeadline(deadline)
	stop := context.AfterFunc(hctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	me := handshake.Side{Group: cfg.Group, Rank: cfg.Rank, World: cfg.WorldSize, Extra: extra, Keys: cfg.Auth}
	h, err := handshake.Dial(c, proto, me, func(h handshake.Hello) string {
		if h.Rank != 0 {
			return fmt.Sprintf("the root's side channel at %s answered as rank %d", info.Addr, h.Rank)
		}
		return ""
	})
	stopped := stop()
	if err == nil {
		var pid int
		if pid, err = decodeRootExtra(h.Extra); err == nil {
			c.SetDeadline(time.Time{})
			info.PID = pid
			return c, info, nil
		}
	}
	c.Close()
	switch {
	case errors.Is(err, handshake.ErrRejected):
		return nil, rootInfo{}, fmt.Errorf("handshake with the root at %s: %w", info.Addr, err)
	case !stopped && ctx.Err() == nil:
		return nil, rootInfo{}, fmt.Errorf("the root at %s did not complete the handshake within %v: %w", info.Addr, min(cfg.WaitTimeout(), maxHandshake), transport.ErrTimeout)
	case !stopped:
		return nil, rootInfo{}, fmt.Errorf("handshake with the root at %s: %w", info.Addr, transport.ContextErr(ctx))
	}
	return nil, rootInfo{}, fmt.Errorf("handshake with the root at %s: %w", info.Addr, err)
}

// read delivers the root's bucket frames until the connection ends.
func (r *receiver) read() {
	defer close(r.gone)
	for {
		typ, payload, err := readFrame(r.conn)
		if err != nil {
			r.goneErr = fmt.Errorf("connection to the root ended (%v): %w", err, transport.ErrPeerGone)
			return
		}
		m, err := decodeBucket(payload)
		if typ != frameBucket || err != nil {
			r.goneErr = fmt.Errorf("the root sent a frame of type %d that is no valid bucket: %w", typ, errFrame)
			r.conn.Close()
			return
		}
		select {
		case r.frames <- m:
		case <-r.done:
			r.goneErr = transport.ErrClosed
			return
		}
	}
}

func (r *receiver) sendAck(a ack) error {
	r.amu.Lock()
	defer r.amu.Unlock()
	r.conn.SetWriteDeadline(time.Now().Add(r.cfg.WaitTimeout()))
	return writeFrame(r.conn, frameAck, a.encode())
}

// source returns the address of the root's bucket buffer in this process.
func (r *receiver) source(m bucketMsg) (uint64, error) {
	if r.rootPID == os.Getpid() {
		return m.addr, nil
	}
	if b, ok := r.opened[m.handle]; ok {
		if uint64(b.Len()) != m.bufLen {
			return 0, fmt.Errorf("the root's buffer %s changed size from %d to %d bytes", m.handle.String()[:16], b.Len(), m.bufLen)
		}
		return b.DevicePtr(), nil
	}
	b, err := r.dev.OpenIPC(m.handle, int(m.bufLen))
	if err != nil {
		return 0, fmt.Errorf("opening the root's bucket buffer on %s: %w", r.dev.Name(), err)
	}
	r.opened[m.handle] = b
	return b.DevicePtr(), nil
}

// Broadcast waits for the root's word on bucket seq, copies its n bytes
// from the root's buffer into buf on the GPU, waits for the copy and
// acknowledges.
func (r *receiver) Broadcast(ctx context.Context, seq uint64, buf mem.Buffer, n int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := refuse(r.cfg, seq, r.closed, r.broken, buf, n); err != nil {
		return err
	}
	wctx, cancel, explain := bounded(ctx, r.cfg, fmt.Sprintf("bucket %d", seq))
	defer cancel()
	src, err := r.next(wctx, seq, n, explain)
	if err != nil {
		return r.failLocked(seq, err)
	}
	if n > 0 {
		if err := r.stream.CopyDtoDPtr(gpu.Unfence(buf).DevicePtr(), src, n); err != nil {
			return r.failLocked(seq, r.tell(seq, err))
		}
		if err := r.stream.Sync(wctx); err != nil {
			return r.failLocked(seq, r.tell(seq, fmt.Errorf("copying the bucket from the root's buffer: %w", explain(err))))
		}
	}
	if err := r.sendAck(ack{seq: seq, ok: true}); err != nil {
		return r.failLocked(seq, fmt.Errorf("acknowledging to the root (%v): %w", err, transport.ErrPeerGone))
	}
	return nil
}

// Lends reports whether Lend serves this receiver: the root said its GPU's
// UUID, and it is this receiver's (a lent buffer is then read at memory
// speed; a receiver on another GPU copies buckets with Broadcast, on the
// copy engine).
func (r *receiver) Lends() bool { return r.sameGPU }

// Lend waits for the root's word on bucket seq, as Broadcast does, and
// returns the root's buffer holding its n bytes, as mapped here, without
// copying them. release acknowledges: release(nil) once this rank reads
// the buffer no more, release(err) to fail the bucket on the root. The
// root sends its next bucket only once every receiver has acknowledged
// this one. Lend and Broadcast are called by one goroutine at a time.
func (r *receiver) Lend(ctx context.Context, seq uint64, n int) (mem.Buffer, func(error) error, error) {
	r.mu.Lock()
	err := refuseLend(r.cfg, seq, r.closed, r.broken, n)
	r.mu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	wctx, cancel, explain := bounded(ctx, r.cfg, fmt.Sprintf("bucket %d", seq))
	defer cancel()
	src, err := r.next(wctx, seq, n, explain)
	if err == nil {
		var view mem.Buffer
		if view, err = r.dev.View(src, n); err == nil {
			var once sync.Once
			release := func(cause error) error {
				var werr error
				once.Do(func() { werr = r.release(seq, cause) })
				return werr
			}
			return view, release, nil
		}
		err = r.tell(seq, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return nil, nil, r.failLocked(seq, err)
}

// release acknowledges lent bucket seq: done, or failed with cause.
func (r *receiver) release(seq uint64, cause error) error {
	a := ack{seq: seq, ok: cause == nil}
	if cause != nil {
		a.msg = cause.Error()
	}
	err := r.sendAck(a)
	if err != nil {
		err = fmt.Errorf("acknowledging to the root (%v): %w", err, transport.ErrPeerGone)
	} else if cause != nil {
		err = cause
	}
	if err == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failLocked(seq, err)
}

// next waits for the root's word on bucket seq of n bytes and returns the
// address of the root's buffer holding it in this process (0 for no
// bytes). A mismatch or a buffer that cannot be mapped is told to the
// root.
func (r *receiver) next(ctx context.Context, seq uint64, n int, explain func(error) error) (uint64, error) {
	var m bucketMsg
	select {
	case m = <-r.frames:
	case <-r.gone:
		return 0, r.goneErr
	case <-ctx.Done():
		err := explain(ctx.Err())
		if errors.Is(err, transport.ErrTimeout) {
			err = fmt.Errorf("no word from the root on the bucket within %v: %w", r.cfg.WaitTimeout(), transport.ErrTimeout)
		}
		return 0, err
	}
	if m.seq != seq || m.n != uint64(n) {
		return 0, r.tell(seq, fmt.Errorf("root sent bucket %d of %d bytes, this receiver expected bucket %d of %d bytes", m.seq, m.n, seq, n))
	}
	if n == 0 {
		return 0, nil
	}
	src, err := r.source(m)
	if err != nil {
		return 0, r.tell(seq, err)
	}
	return src, nil
}

// tell sends the root a failed acknowledgement of bucket seq saying err,
// and returns err.
func (r *receiver) tell(seq uint64, err error) error {
	r.sendAck(ack{seq: seq, ok: false, msg: err.Error()})
	return err
}

// failLocked marks the endpoint broken by err, a failure of bucket seq,
// and returns it as a *transport.Error. r.mu is held.
func (r *receiver) failLocked(seq uint64, err error) error {
	e := terr(r.cfg, "broadcast", seq, true, 0, err)
	if r.broken == nil {
		r.broken = e
	}
	return e
}

// Close waits for a copy in flight (bounded by the config's timeout),
// unmaps the root's buffers and ends the connection. It is idempotent.
func (r *receiver) Close() error {
	var errs []error
	r.once.Do(func() {
		r.mu.Lock()
		r.closed = true
		r.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.WaitTimeout())
		defer cancel()
		if err := r.stream.Sync(ctx); err != nil {
			errs = append(errs, fmt.Errorf("ipc close: a copy is still running; leaving the root's buffers mapped: %w", err))
		} else {
			for _, b := range r.opened {
				errs = append(errs, b.Free())
			}
			errs = append(errs, r.stream.Close())
		}
		close(r.done)
		r.conn.Close()
		r.wg.Wait()
	})
	return errors.Join(errs...)
}
