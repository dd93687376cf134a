package zmqbus

import (
	"context"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/weightcast/weightcast/transport"
)

// busSocket is what the publisher and the subscriber share: one side's
// socket, the three goroutines that own it, and the lock and change signal
// of that side's state. Both embed it and supply, in sideHooks, what
// differs: what a message means, what a failed Recv or Send means, what
// one liveness round does, and what to say on Close.
//
// The goroutines, started by start and joined by shutdown:
//   - read is the only caller of sock.Recv (which zmq4 cannot interrupt:
//     closing the socket ends it);
//   - the writer is the only caller of sock.Send (which zmq4 blocks on a
//     stalled TCP peer); it sends what out holds;
//   - tick runs one liveness round per tickOf(opts) until stop is closed.
//
// API calls never touch the socket: they push to out and wait on the state
// those goroutines update under mu.
type busSocket struct {
	cfg        transport.Config
	opts       options
	sock       zmq4.Socket
	cancelSock context.CancelFunc // cancels sock's context; called last by shutdown
	out        *outbox
	flush      chan struct{} // closed by shutdown: the writer sends what is left and returns
	stop       chan struct{} // closed by shutdown: tick returns
	writerDone chan struct{} // closed by the writer when it returns
	wg         sync.WaitGroup
	closeOnce  sync.Once

	// mu guards closing and changed, and the state of the side that embeds
	// this busSocket.
	mu      sync.Mutex
	changed chan struct{} // closed and replaced by broadcastLocked on every change; never nil
	closing bool          // set by shutdown: API calls fail with ErrClosed, the goroutines report nothing more
	// failed is closed by failedLocked when the bus fails for a reason
	// other than this side's own Abort (Watcher); selfAborted marks that
	// Abort ended it.
	failed      chan struct{}
	hasFailed   bool
	selfAborted bool
}

// failedLocked closes failed, once, unless this side's own Abort ended
// the bus.
func (b *busSocket) failedLocked() {
	if !b.hasFailed && !b.selfAborted {
		b.hasFailed = true
		close(b.failed)
	}
}

// Failed is closed once the bus has failed for a reason other than this
// side's own Abort; Err then says why (transport.Watcher).
func (b *busSocket) Failed() <-chan struct{} { return b.failed }

// sideHooks are the parts of the socket goroutines that differ between the
// publisher and the subscriber.
type sideHooks struct {
	// handle processes one message from the socket that is not a ZMTP
	// command. It runs on the read goroutine, without mu.
	handle func(frames [][]byte)
	// recvFailed hears the error that ended sock.Recv, unless shutdown
	// caused it. It runs on the read goroutine, with mu held.
	recvFailed func(err error)
	// sendFailed hears that the writer could not send m. It runs on the
	// writer goroutine, with mu held.
	sendFailed func(m zmq4.Msg, err error)
	// tick is one round of heartbeats and liveness checks at now. It runs
	// on the tick goroutine, with mu held.
	tick func(now time.Time)
}

// adopt fills b for sock, which it owns from now on: shutdown closes sock
// and then calls cancelSock.
func (b *busSocket) adopt(cfg transport.Config, opts options, sock zmq4.Socket, cancelSock context.CancelFunc) {
	b.cfg, b.opts, b.sock, b.cancelSock = cfg, opts, sock, cancelSock
	b.out = newOutbox()
	b.flush = make(chan struct{})
	b.stop = make(chan struct{})
	b.writerDone = make(chan struct{})
	b.changed = make(chan struct{})
	b.failed = make(chan struct{})
}

// start starts the three goroutines that own the socket; shutdown stops
// and joins them.
func (b *busSocket) start(h sideHooks) {
	b.wg.Add(3)
	go func() { defer b.wg.Done(); b.read(h.handle, h.recvFailed) }()
	go func() {
		defer b.wg.Done()
		defer close(b.writerDone)
		b.write(h.sendFailed)
	}()
	go func() { defer b.wg.Done(); b.tick(h.tick) }()
}

// broadcastLocked wakes every waiter.
func (b *busSocket) broadcastLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// read is the only caller of sock.Recv. It returns when Recv fails, which
// closing the socket causes.
func (b *busSocket) read(handle func([][]byte), failed func(error)) {
	for {
		msg, err := b.sock.Recv()
		if err != nil {
			b.mu.Lock()
			if !b.closing {
				failed(err)
			}
			b.mu.Unlock()
			return
		}
		if msg.Type == zmq4.CmdMsg {
			continue // a ZMTP command (PING from a libzmq peer): not ours
		}
		handle(msg.Frames)
	}
}

// write is the only caller of sock.Send. It sends what the outbox holds
// until flush is closed, then sends what is left and returns. failed
// hears of every failed send.
func (b *busSocket) write(failed func(zmq4.Msg, error)) {
	send := func() {
		for _, o := range b.out.take() {
			if err := b.sock.SendMulti(o.m); err != nil {
				b.mu.Lock()
				failed(o.m, err)
				b.mu.Unlock()
			}
			if o.after != nil {
				o.after()
			}
		}
	}
	for {
		select {
		case <-b.out.wake:
			send()
		case <-b.flush:
			send()
			return
		}
	}
}

// tick runs round once per tickOf(opts) until stop is closed.
func (b *busSocket) tick(round func(now time.Time)) {
	t := time.NewTicker(tickOf(b.opts))
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		b.mu.Lock()
		round(now)
		b.mu.Unlock()
	}
}

// flushBound is how long Close lets the writer send its last messages
// (BYE) before closing the socket under it.
const flushBound = time.Second

// shutdown is Close for both sides, run once: with mu held it calls bye,
// which queues the side's last words, marks the bus closing and wakes
// every waiter. Then it stops the writer (flush) and waits for it at most
// flushBound, closes the socket, which ends the reader's Recv and any send
// still blocked on a stalled peer, stops tick, joins the three goroutines
// and cancels the socket's context.
func (b *busSocket) shutdown(bye func()) {
	b.closeOnce.Do(func() {
		b.mu.Lock()
		bye()
		b.closing = true
		b.broadcastLocked()
		b.mu.Unlock()

		close(b.flush)
		t := time.NewTimer(flushBound)
		select {
		case <-b.writerDone:
		case <-t.C:
		}
		t.Stop()
		b.sock.Close()

		close(b.stop)
		b.wg.Wait()
		b.cancelSock()
	})
}

// outbox is the queue of messages the writer goroutine sends. Producers
// never block on it; its length is bounded by the protocol (a window of
// DATA per receiver plus control messages).
type outbox struct {
	mu   sync.Mutex
	q    []outMsg
	wake chan struct{} // capacity 1; never closed
}

// outMsg is a message to send, and what to do once it is sent (or its
// send failed), if anything.
type outMsg struct {
	m     zmq4.Msg
	after func()
}

func newOutbox() *outbox { return &outbox{wake: make(chan struct{}, 1)} }

func (o *outbox) push(m zmq4.Msg) { o.pushThen(m, nil) }

// pushThen queues m, and after for the writer to run once m is sent.
func (o *outbox) pushThen(m zmq4.Msg, after func()) {
	o.mu.Lock()
	o.q = append(o.q, outMsg{m, after})
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

func (o *outbox) take() []outMsg {
	o.mu.Lock()
	defer o.mu.Unlock()
	q := o.q
	o.q = nil
	return q
}
