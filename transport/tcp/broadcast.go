package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
)

const (
	// batchChunks and batchBytes bound one writev of chunk frames.
	batchChunks = 64
	batchBytes  = 16 << 20
	// nackGrace is how long a sender whose peer vanished waits for the
	// failure notice that names the rank really at fault.
	nackGrace = 200 * time.Millisecond
	// noticeWait bounds sending an abort or nack after a failure.
	noticeWait = 500 * time.Millisecond
	// maxOwed is the most bytes of an interrupted frame that a failed
	// rank still sends to reach the frame boundary its notice needs.
	maxOwed = 16 << 20
)

// Where a fault was seen: on this rank, on the connection from the
// predecessor, or on the connection to the successor.
const (
	fromLocal = iota
	fromUp
	fromDown
)

// fault is why a Broadcast failed.
type fault struct {
	peer   int   // the rank at fault, -1 when unknown
	code   uint8 // what to tell the neighbours
	from   int   // fromLocal, fromUp or fromDown
	err    error
	remote string // the notice text, when the fault came from a neighbour's notice
}

// remoteError is a failure another rank reported in an abort or nack frame.
type remoteError struct {
	msg      string
	sentinel error // transport.ErrPeerGone, transport.ErrTimeout or nil
}

// Error is the notice's text, which already ends in the sentinel's text.
func (r *remoteError) Error() string { return r.msg }
func (r *remoteError) Unwrap() error { return r.sentinel }

func remoteFault(f frame, msg string, from int) *fault {
	var s error
	switch f.code {
	case codePeerGone:
		s = transport.ErrPeerGone
	case codeTimeout:
		s = transport.ErrTimeout
	}
	dir := "downstream"
	if from == fromUp {
		dir = "upstream"
	}
	return &fault{peer: int(f.a) - 1, code: f.code, from: from, remote: msg,
		err: &remoteError{msg: fmt.Sprintf("a rank %s gave up: %s", dir, msg), sentinel: s}}
}

// op is one Broadcast in progress: the goroutines working on it share its
// first failure, and fail/finish stop them all.
type op struct {
	e    *endpoint
	ctx  context.Context
	seq  uint64
	once sync.Once
	done chan struct{} // closed by the first fail or by finish
	why  *fault        // set once, before done is closed
	wg   sync.WaitGroup
}

// fail records f (when it is the first) and stops every goroutine of the
// operation by closing done and expiring every connection deadline. I/O
// starts only after arm, which re-checks done after setting its deadline, so
// no I/O outlives this.
func (o *op) fail(f *fault) {
	o.once.Do(func() {
		o.why = f
		close(o.done)
		for _, c := range []net.Conn{o.e.up, o.e.down} {
			if c != nil {
				c.SetDeadline(past)
			}
		}
	})
}

// arm sets c's read or write deadline to t and reports whether the
// operation is still running. When it is not, arm expires the deadline
// again: fail may have expired it just before arm set t, and another
// goroutine of the operation may be blocked on that side of c (the
// acknowledgement reader, whose read deadline awaitAck arms), which would
// otherwise wait until t, the whole timeout, after a failure it was meant
// to see at once.
func (o *op) arm(c net.Conn, write bool, t time.Time) bool {
	set := c.SetReadDeadline
	if write {
		set = c.SetWriteDeadline
	}
	set(t)
	select {
	case <-o.done:
		set(past)
		return false
	default:
		return true
	}
}

func (o *op) deadline() time.Time { return deadline(o.ctx, o.e.timeout) }

// ioFault turns an I/O error with peer into a fault.
func (o *op) ioFault(err error, peer, from int, doing string) *fault {
	e := o.e
	if e.closed.Load() {
		return &fault{peer: -1, code: codePeerGone, from: fromLocal, err: fmt.Errorf("%s: %w", doing, transport.ErrClosed)}
	}
	if errors.Is(err, errProtocol) {
		return &fault{peer: peer, code: codeAborted, from: from, err: fmt.Errorf("%s: %w", doing, err)}
	}
	f := &fault{peer: peer, code: codeAborted, from: from, err: ioError(o.ctx, err, peer, e.timeout, doing)}
	switch {
	case ctxErr(o.ctx) != nil:
		f.peer, f.from = -1, fromLocal
	case errors.Is(f.err, transport.ErrTimeout):
		f.code = codeTimeout
	case errors.Is(f.err, transport.ErrPeerGone):
		f.code = codePeerGone
	}
	return f
}

// Broadcast moves buf[:n] from the root down the chain. The root returns
// once every byte is written and the tail's end-of-bucket acknowledgement
// has come back up the chain; a receiver returns once buf[:n] holds the
// bytes, it has passed them on, and the acknowledgement from its successors
// has come back. After an error the endpoint is broken: the neighbours are
// told (when the stream allows) and every later call returns the same error.
func (e *endpoint) Broadcast(ctx context.Context, seq uint64, buf mem.Buffer, n int) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Load() {
		return e.err(seq, -1, transport.ErrClosed)
	}
	if e.broken != nil {
		return e.broken
	}
	var f *fault
	switch {
	case buf == nil:
		f = &fault{peer: -1, code: codeAborted, err: errors.New("nil buffer")}
	case buf.Host() == nil:
		f = &fault{peer: -1, code: codeAborted, err: fmt.Errorf("buffer on %s is not host memory: the tcp transport moves host memory only; use the nccl or ipc transport for GPU buffers", deviceName(buf))}
	case n < 0 || n > buf.Len():
		f = &fault{peer: -1, code: codeAborted, err: fmt.Errorf("length %d outside the buffer of %d bytes", n, buf.Len())}
	default:
		f = e.run(ctx, seq, buf.Host()[:n])
	}
	if f == nil {
		return nil
	}
	err := e.err(seq, f.peer, f.err)
	e.broken = err
	e.tell(seq, f)
	return err
}

func deviceName(b mem.Buffer) string {
	if d := b.Device(); d != nil {
		return d.Name()
	}
	return "an unknown device"
}

func (e *endpoint) err(seq uint64, peer int, err error) error {
	return &transport.Error{Transport: Name, Group: e.cfg.Group, Rank: e.rank, Op: "broadcast", Seq: seq, HasSeq: true, Peer: peer, Err: err}
}

// run performs one bucket and returns why it failed, or nil.
func (e *endpoint) run(ctx context.Context, seq uint64, data []byte) *fault {
	if err := ctxErr(ctx); err != nil { // tell the neighbours before any byte of the bucket moves
		return &fault{peer: -1, code: codeAborted, from: fromLocal, err: err}
	}
	o := &op{e: e, ctx: ctx, seq: seq, done: make(chan struct{})}
	stop := context.AfterFunc(ctx, func() {
		o.fail(&fault{peer: -1, code: codeAborted, from: fromLocal, err: ctxErr(ctx)})
	})
	if e.rank == 0 {
		o.send(data)
	} else {
		o.receive(data)
	}
	o.wg.Wait()
	stop()
	o.fail(nil) // finish: a no-op after a failure; waits for a running AfterFunc
	return o.why
}

// send is the root's part.
func (o *op) send(data []byte) {
	e := o.e
	var err error
	next := e.rank + 1
	frame{kind: kindBucket, seq: o.seq, a: uint64(len(data)), b: uint64(e.chunk)}.put(e.whdr[:])
	if !o.arm(e.down, true, o.deadline()) {
		return
	}
	if e.downOwed, err = writeFrames(e.down, [][]byte{e.whdr[:]}, 1); err != nil {
		o.fail(o.ioFault(err, next, fromDown, fmt.Sprintf("sending the header of bucket %d to rank %d", o.seq, next)))
		return
	}
	ackDone := o.startAckReader()
	if o.writeChunks(data, 0, len(data), e.chunk) {
		o.awaitAck(ackDone)
	}
}

// receive is a receiver's part: take the bucket from the predecessor, pass
// each chunk on to the successor as soon as it is complete, and acknowledge
// once the successors have acknowledged.
func (o *op) receive(data []byte) {
	e := o.e
	prev, n := e.rank-1, len(data)
	upFault := func(err error, doing string) {
		o.fail(o.ioFault(err, prev, fromUp, doing))
	}
	if !o.arm(e.up, false, o.deadline()) {
		return
	}
	f, msg, err := readFrame(e.upR, e.rhdr[:])
	if err != nil {
		upFault(err, fmt.Sprintf("waiting for bucket %d from rank %d", o.seq, prev))
		return
	}
	switch {
	case f.kind == kindAbort:
		o.fail(remoteFault(f, msg, fromUp))
		return
	case f.kind != kindBucket:
		upFault(fmt.Errorf("%w: got a %v where a bucket header belongs", errProtocol, f.kind), "reading the bucket header")
		return
	case f.seq != o.seq || f.a != uint64(n):
		o.fail(&fault{peer: 0, code: codeMismatch, from: fromLocal, err: fmt.Errorf(
			"the root sent bucket %d of %d bytes, this rank expected bucket %d of %d bytes: every rank must call Broadcast with the same seq and n, in the same order",
			f.seq, f.a, o.seq, n)})
		return
	case f.b < 1 || f.b > maxChunk:
		upFault(fmt.Errorf("%w: chunk size %d in the bucket header", errProtocol, f.b), "reading the bucket header")
		return
	}
	chunk := int(f.b)

	var progress atomic.Int64      // bytes of data complete
	wake := make(chan struct{}, 1) // progress moved; never closed
	fwdDone, ackDone := closedChan(), closedChan()
	if e.down != nil {
		next := e.rank + 1
		if !o.arm(e.down, true, o.deadline()) {
			return
		}
		if e.downOwed, err = writeFrames(e.down, [][]byte{e.rhdr[:]}, 1); err != nil {
			o.fail(o.ioFault(err, next, fromDown, fmt.Sprintf("passing the header of bucket %d to rank %d", o.seq, next)))
			return
		}
		ackDone = o.startAckReader()
		fwdDone = make(chan struct{})
		o.wg.Go(func() {
			defer close(fwdDone)
			o.forward(data, chunk, &progress, wake)
		})
	}
	for off := 0; off < n; {
		if !o.arm(e.up, false, o.deadline()) {
			return
		}
		f, msg, err := readFrame(e.upR, e.rhdr[:])
		if err != nil {
			upFault(err, fmt.Sprintf("receiving bucket %d from rank %d at byte %d of %d", o.seq, prev, off, n))
			return
		}
		l := min(chunk, n-off)
		switch {
		case f.kind == kindAbort:
			o.fail(remoteFault(f, msg, fromUp))
			return
		case f.kind != kindChunk || f.seq != o.seq || f.a != uint64(off) || f.b != uint64(l):
			upFault(fmt.Errorf("%w: got %v (bucket %d, offset %d, %d bytes) where the chunk of bucket %d at offset %d of %d bytes belongs",
				errProtocol, f.kind, f.seq, f.a, f.b, o.seq, off, l), "receiving a chunk")
			return
		}
		if _, err := io.ReadFull(e.upR, data[off:off+l]); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			upFault(err, fmt.Sprintf("receiving bucket %d from rank %d at byte %d of %d", o.seq, prev, off, n))
			return
		}
		off += l
		progress.Store(int64(off))
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	<-fwdDone
	o.awaitAck(ackDone)
	select {
	case <-o.done:
		return
	default:
	}
	if !o.arm(e.up, true, o.deadline()) {
		return
	}
	frame{kind: kindAck, seq: o.seq}.put(e.whdr[:])
	if e.upOwed, err = writeFrames(e.up, [][]byte{e.whdr[:]}, 1); err != nil {
		upFault(err, fmt.Sprintf("acknowledging bucket %d to rank %d", o.seq, prev))
		return
	}
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// forward passes chunks on to the successor as the receive loop completes
// them, as many as have arrived in one writev.
func (o *op) forward(data []byte, chunk int, progress *atomic.Int64, wake <-chan struct{}) {
	for sent := 0; sent < len(data); {
		avail := int(progress.Load())
		if avail == sent {
			select {
			case <-wake:
			case <-o.done:
				return
			}
			continue
		}
		if !o.writeChunks(data, sent, avail, chunk) {
			return
		}
		sent = avail
	}
}

// writeChunks writes the chunk frames of data[from:to] to the successor;
// from and to lie on chunk boundaries or at len(data).
func (o *op) writeChunks(data []byte, from, to, chunk int) bool {
	e := o.e
	next := e.rank + 1
	if e.hdrs == nil {
		e.hdrs = make([]byte, batchChunks*frameLen)
		e.iov = make([][]byte, 0, 2*batchChunks)
	}
	for from < to {
		iov := e.iov[:0]
		for k, size := 0, 0; from < to && k < batchChunks && size < batchBytes; k++ {
			l := min(chunk, len(data)-from)
			h := e.hdrs[k*frameLen : (k+1)*frameLen]
			frame{kind: kindChunk, seq: o.seq, a: uint64(from), b: uint64(l)}.put(h)
			iov = append(iov, h, data[from:from+l])
			from += l
			size += l
		}
		if !o.arm(e.down, true, o.deadline()) {
			return false
		}
		var err error
		if e.downOwed, err = writeFrames(e.down, iov, 2); err != nil {
			f := o.ioFault(err, next, fromDown, fmt.Sprintf("sending bucket %d to rank %d", o.seq, next))
			if f.code == codePeerGone {
				// The successor may have sent a notice naming the
				// rank really at fault before it went; let the
				// acknowledgement reader take it first.
				t := time.NewTimer(nackGrace)
				select {
				case <-o.done:
				case <-t.C:
				}
				t.Stop()
			}
			o.fail(f)
			return false
		}
	}
	return true
}

// writeFrames writes iov, whole frames of perFrame buffers each (the first
// one a frame header), to c. When the write stops early it also returns the
// bytes still owed to finish the frame it stopped in, nil when it stopped
// between two frames: tell writes them before its notice, so the neighbour
// reads the notice at a frame boundary and learns why, instead of seeing
// the connection close.
func writeFrames(c net.Conn, iov [][]byte, perFrame int) (owed [][]byte, err error) {
	bufs := net.Buffers(iov)
	if _, err = bufs.WriteTo(c); err == nil || len(bufs) == 0 {
		return nil, err
	}
	// WriteTo consumed what it wrote: bufs is the rest, its first
	// buffer perhaps cut short.
	k := len(iov) - len(bufs)
	if k%perFrame == 0 && len(bufs[0]) == frameLen {
		return nil, err // no byte of this frame went out
	}
	return slices.Clone(bufs[:perFrame-k%perFrame]), err
}

// startAckReader reads the successor's end-of-bucket acknowledgement (or
// failure notice) while the bucket is still moving, so a failure further
// down stops this rank at once. The read has no deadline but ctx's until
// awaitAck arms it. The returned channel is closed when the reader returns.
func (o *op) startAckReader() chan struct{} {
	e := o.e
	var dl time.Time
	if d, ok := o.ctx.Deadline(); ok {
		dl = d
	}
	done := make(chan struct{})
	if !o.arm(e.down, false, dl) {
		close(done)
		return done
	}
	o.wg.Go(func() {
		defer close(done)
		next := e.rank + 1
		f, msg, err := readFrame(e.down, e.ahdr[:])
		switch {
		case err != nil:
			o.fail(o.ioFault(err, next, fromDown, fmt.Sprintf("waiting for rank %d to acknowledge bucket %d", next, o.seq)))
		case f.kind == kindNack:
			o.fail(remoteFault(f, msg, fromDown))
		case f.kind != kindAck || f.seq != o.seq:
			o.fail(o.ioFault(fmt.Errorf("%w: got %v for bucket %d", errProtocol, f.kind, f.seq), next, fromDown,
				fmt.Sprintf("waiting for rank %d to acknowledge bucket %d", next, o.seq)))
		}
	})
	return done
}

// awaitAck bounds the acknowledgement wait by the timeout, now that this
// rank's own part is done, and waits for the reader.
func (o *op) awaitAck(ackDone chan struct{}) {
	if o.e.down != nil {
		o.arm(o.e.down, false, o.deadline())
	}
	<-ackDone
}

// tell passes a failure on to the neighbours: an abort frame to the
// successor, a nack to the predecessor. A side whose stream stopped inside
// a frame first gets the rest of that frame (the bytes it is owed, when
// they are few enough to send within noticeWait); a side that cannot take
// the notice is closed instead, which its peer reports as ErrPeerGone
// naming this rank.
func (e *endpoint) tell(seq uint64, f *fault) {
	if e.closed.Load() {
		return
	}
	msg := f.remote
	if msg == "" {
		msg = fmt.Sprintf("rank %d: %v", e.rank, f.err)
	}
	code := f.code
	if code == codeNone {
		code = codeAborted
	}
	send := func(c net.Conn, owed [][]byte, k kind, neighbour int) {
		if n := bytesOf(owed); n > maxOwed {
			c.Close()
			return
		}
		// Name the rank at fault as this rank sees it, or this rank
		// itself when it gave up, or when the notice goes to the rank
		// it blames (which then learns who stopped waiting for it).
		culprit := f.peer
		if f.from == fromLocal || culprit < 0 || culprit == neighbour {
			culprit = e.rank
		}
		c.SetWriteDeadline(time.Now().Add(min(e.timeout, noticeWait)))
		iov := net.Buffers(append(owed, notice(k, code, seq, culprit, msg)))
		if _, err := iov.WriteTo(c); err != nil {
			c.Close()
		}
	}
	// A neighbour that sent a notice knows already; any other, even one
	// that stalled or vanished, is told (a dead one's socket fails fast).
	if e.up != nil && (f.remote == "" || f.from != fromUp) {
		send(e.up, e.upOwed, kindNack, e.rank-1)
	}
	if e.down != nil && (f.remote == "" || f.from != fromDown) {
		send(e.down, e.downOwed, kindAbort, e.rank+1)
	}
}

func bytesOf(bufs [][]byte) int {
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	return n
}
