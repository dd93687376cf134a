package tcp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/weightcast/weightcast/internal/ratelog"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/internal/handshake"
)

// PairsAddrKey is the Exchange key under which every sender of a routed
// group publishes the address its receivers connect to (OpenPairs).
const PairsAddrKey = "tcp.pairs.addr"

// pairsProto is the handshake of the point-to-point mode's connections:
// another magic than the chain's, so that neither kind of endpoint takes
// the other's connections. Each hello's Extra holds the number of senders.
var pairsProto = handshake.Protocol{Name: Name + "-pairs", Magic: pairsMagic, Version: 1}

// The point-to-point wire format. After the handshake, each bucket is a
// 24-byte header and its bytes; integers big-endian:
//
//	magic u32 | kind u8 (1: bucket) | 3 zero bytes | seq u64 | length u64
//
// Nothing flows back: TCP's flow control bounds what is in flight, and a
// round's acknowledgements and failures travel on the metadata bus.
const (
	pairsMagic  uint32 = 0x77637070 // "wcpp"
	pairsHeader        = 24
	kindPair    uint8  = 1
)

// pairs is one rank's side of the point-to-point mode: a sender keeps a
// connection from every receiver, a receiver one to every sender.
type pairs struct {
	e     *endpoint // the handshake's settings and helpers; its chain stays unused
	conns map[int]*pairConn

	closeOnce sync.Once
}

// pairConn is one connection of a pair; mu keeps its calls one at a time.
type pairConn struct {
	mu  sync.Mutex
	c   net.Conn
	hdr [pairsHeader]byte
}

// OpenPairs opens cfg.Rank's side of tcp's point-to-point mode for a
// routed group (transport.Pairs): every sender (ranks below cfg.Senders)
// listens and publishes its address under PairsAddrKey, and every
// receiver connects to every sender. The handshake is the chain's (group,
// world size, ranks, the group secret, TLS when configured), with the
// number of senders besides, and a sender refuses and logs every
// connection that is not one of its receivers, as Open's receivers do.
// Each wait is bounded by cfg.WaitTimeout() and by ctx. Buffers are host
// memory.
func OpenPairs(ctx context.Context, cfg transport.Config) (transport.Pairs, error) {
	fail := func(peer int, err error) error {
		return &transport.Error{Transport: Name, Group: cfg.Group, Rank: cfg.Rank, Op: "open", Peer: peer, Err: err}
	}
	if err := cfg.ValidatePairs(); err != nil {
		return nil, fail(-1, err)
	}
	switch {
	case cfg.Device.Kind() != mem.KindHost:
		return nil, fail(-1, fmt.Errorf("device %s holds %s memory, the tcp transport moves host memory only; use the ipc transport for GPU buffers", cfg.Device.Name(), cfg.Device.Kind()))
	case cfg.Exchange == nil:
		return nil, fail(-1, errors.New("no Exchange in the config: the tcp transport needs one to share the senders' addresses"))
	case len(cfg.Group) > maxGroup:
		return nil, fail(-1, fmt.Errorf("group name of %d bytes, the tcp transport takes at most %d", len(cfg.Group), maxGroup))
	}
	opts, err := parseOptions(cfg.Options)
	if err != nil {
		return nil, fail(-1, err)
	}
	senders := max(cfg.Senders, 1)
	e := &endpoint{cfg: cfg, rank: cfg.Rank, world: cfg.WorldSize, timeout: cfg.WaitTimeout(), chunk: opts.chunk,
		proto: pairsProto, extra: []byte(strconv.Itoa(senders)), log: ratelog.New(cfg.Logger, 0)}
	p := &pairs{e: e, conns: map[int]*pairConn{}}
	if cfg.Sends(cfg.Rank) {
		err = p.acceptReceivers(ctx, opts, senders)
	} else {
		err = p.dialSenders(ctx, senders)
	}
	if err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// check accepts a hello of rank want (any receiver when want < 0) that
// counts the same senders.
func (p *pairs) check(want int) handshake.Check {
	return func(h handshake.Hello) string {
		e := p.e
		switch {
		case string(h.Extra) != string(e.extra):
			return fmt.Sprintf("rank %d says the group has %s senders, rank %d says %s: start every rank with the same number of senders", h.Rank, h.Extra, e.rank, e.extra)
		case want >= 0 && h.Rank != want:
			return fmt.Sprintf("rank %d answered where rank %d expected sender rank %d: give every rank a distinct rank", h.Rank, e.rank, want)
		case want < 0 && e.cfg.Sends(h.Rank):
			return fmt.Sprintf("rank %d is a sender and connected to sender rank %d: only receivers connect to senders", h.Rank, e.rank)
		}
		return ""
	}
}

// acceptReceivers listens, publishes the address and admits one
// connection from every receiver.
func (p *pairs) acceptReceivers(ctx context.Context, opts options, senders int) error {
	e := p.e
	fail := func(err error) error {
		return &transport.Error{Transport: Name, Group: e.cfg.Group, Rank: e.rank, Op: "open", Peer: -1, Err: err}
	}
	ln, addr, err := listen(ctx, opts)
	if err != nil {
		return fail(err)
	}
	pctx, cancel := context.WithTimeout(ctx, e.timeout)
	err = e.cfg.Exchange.Put(pctx, PairsAddrKey, []byte(addr))
	cancel()
	if err != nil {
		ln.Close()
		return fail(fmt.Errorf("publishing this rank's address %s: %w", addr, err))
	}
	want := e.world - senders
	wctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	var mu sync.Mutex
	seen := map[int]bool{}
	a := handshake.Admission{Want: want, Bound: min(e.timeout, maxHandshake), Log: e.log,
		What: fmt.Sprintf("tcp transport, group %q sender rank %d waiting for its %d receivers on %s", e.cfg.Group, e.rank, want, addr)}
	got, refused, err := handshake.Admit(wctx, ln, a, func(hctx context.Context, c net.Conn) (int, error) {
		sc, binding, err := e.secure(hctx, c, true, "")
		if err != nil {
			return 0, err
		}
		h, err := handshake.Accept(sc, e.proto, e.side(binding), p.check(-1))
		if err != nil {
			return 0, err
		}
		mu.Lock()
		defer mu.Unlock()
		if seen[h.Rank] {
			sc.Close()
			return 0, fmt.Errorf("rank %d connected twice: give every rank a distinct rank", h.Rank)
		}
		seen[h.Rank] = true
		return h.Rank, nil
	})
	if err != nil {
		note := ""
		if refused.N > 0 {
			note = " (" + refused.String() + ")"
		}
		missing := []int{}
		for r := senders; r < e.world; r++ {
			if !seen[r] {
				missing = append(missing, r)
			}
		}
		if ctxErr(ctx) == nil && errors.Is(err, context.DeadlineExceeded) {
			return fail(fmt.Errorf("receivers %v did not connect to %s within %v%s: %w", missing, addr, e.timeout, note, transport.ErrTimeout))
		}
		return fail(fmt.Errorf("waiting for receivers %v on %s%s: %w", missing, addr, note, err))
	}
	for _, g := range got {
		p.conns[g.Value] = &pairConn{c: g.Conn}
	}
	return nil
}

// dialSenders connects to every sender, concurrently.
func (p *pairs) dialSenders(ctx context.Context, senders int) error {
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	for s := range senders {
		g.Go(func() error {
			c, err := p.e.dialRank(gctx, s, PairsAddrKey, p.check(s))
			if err != nil {
				return err
			}
			mu.Lock()
			p.conns[s] = &pairConn{c: c}
			mu.Unlock()
			return nil
		})
	}
	return g.Wait()
}

// conn returns the connection to peer, or an error naming the call that
// peer cannot answer.
func (p *pairs) conn(op string, peer int, seq uint64) (*pairConn, error) {
	pc, ok := p.conns[peer]
	if !ok {
		what := "a sender"
		if p.e.cfg.Sends(p.e.rank) {
			what = "a receiver"
		}
		return nil, p.err(op, peer, seq, fmt.Errorf("rank %d is not %s of group %q (%d senders of %d ranks)", peer, what, p.e.cfg.Group, max(p.e.cfg.Senders, 1), p.e.world))
	}
	return pc, nil
}

// err wraps err as the *transport.Error of op with peer on bucket seq.
func (p *pairs) err(op string, peer int, seq uint64, err error) error {
	return &transport.Error{Transport: Name, Group: p.e.cfg.Group, Rank: p.e.rank, Op: op, Seq: seq, HasSeq: true, Peer: peer, Err: err}
}

// Send writes bucket seq's header and buf[:n] to receiver to.
func (p *pairs) Send(ctx context.Context, to int, seq uint64, buf mem.Buffer, n int) error {
	pc, err := p.conn("send", to, seq)
	if err != nil {
		return err
	}
	if n < 0 || n > buf.Len() {
		return p.err("send", to, seq, fmt.Errorf("%d bytes of a %d-byte buffer", n, buf.Len()))
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	stop, err := guard(ctx, pc.c, p.e.timeout)
	if err != nil {
		return p.err("send", to, seq, err)
	}
	defer stop()
	binary.BigEndian.PutUint32(pc.hdr[0:], pairsMagic)
	pc.hdr[4] = kindPair
	binary.BigEndian.PutUint64(pc.hdr[8:], seq)
	binary.BigEndian.PutUint64(pc.hdr[16:], uint64(n))
	bufs := net.Buffers{pc.hdr[:], buf.Host()[:n]}
	if _, err := bufs.WriteTo(pc.c); err != nil {
		return p.err("send", to, seq, ioError(ctx, err, to, p.e.timeout, fmt.Sprintf("sending %d bytes to rank %d", n, to)))
	}
	return nil
}

// Recv reads bucket seq from sender from into buf[:n], checking that the
// header is that bucket's.
func (p *pairs) Recv(ctx context.Context, from int, seq uint64, buf mem.Buffer, n int) error {
	pc, err := p.conn("recv", from, seq)
	if err != nil {
		return err
	}
	if n < 0 || n > buf.Len() {
		return p.err("recv", from, seq, fmt.Errorf("%d bytes into a %d-byte buffer", n, buf.Len()))
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	stop, err := guard(ctx, pc.c, p.e.timeout)
	if err != nil {
		return p.err("recv", from, seq, err)
	}
	defer stop()
	doing := fmt.Sprintf("waiting for bucket %d from rank %d", seq, from)
	if _, err := io.ReadFull(pc.c, pc.hdr[:]); err != nil {
		return p.err("recv", from, seq, ioError(ctx, err, from, p.e.timeout, doing))
	}
	gotSeq, gotN := binary.BigEndian.Uint64(pc.hdr[8:]), binary.BigEndian.Uint64(pc.hdr[16:])
	switch {
	case binary.BigEndian.Uint32(pc.hdr[0:]) != pairsMagic || pc.hdr[4] != kindPair:
		return p.err("recv", from, seq, fmt.Errorf("%w: rank %d sent a frame that is not a bucket header", errProtocol, from))
	case gotSeq != seq || gotN != uint64(n):
		return p.err("recv", from, seq, fmt.Errorf("%w: rank %d sent bucket %d of %d bytes where this rank's schedule expects bucket %d of %d bytes: do both ranks plan from the same layouts?", errProtocol, from, gotSeq, gotN, seq, n))
	}
	if _, err := io.ReadFull(pc.c, buf.Host()[:n]); err != nil {
		return p.err("recv", from, seq, ioError(ctx, err, from, p.e.timeout, doing))
	}
	return nil
}

// Close closes every connection. It is idempotent.
func (p *pairs) Close() error {
	p.closeOnce.Do(func() {
		for _, pc := range p.conns {
			pc.c.Close()
		}
	})
	return nil
}
