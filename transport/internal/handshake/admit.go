package handshake

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/internal/ratelog"
)

// MaxInFlight bounds the handshakes Admit runs at once. A connection that
// arrives when that many are in progress takes the place of the one least
// likely to be the awaited peer (see Admit), which is closed; only when
// the closed ones have not yet finished either is the new one closed at
// once.
const MaxInFlight = 64

// maxNotes bounds the refusals Admit describes.
const maxNotes = 8

// Admission says how Admit waits.
type Admission struct {
	// Want is how many connections to admit.
	Want int
	// Bound limits each connection's handshake.
	Bound time.Duration
	// Log hears of every connection refused (rate-limited); may be nil.
	Log *ratelog.Logger
	// What names the waiting end in log lines ("tcp rank 2").
	What string
}

// Admitted is one connection Admit admitted, with what admit said of it.
type Admitted[T any] struct {
	Conn  net.Conn
	Value T
}

// Refusals describes the connections Admit refused.
type Refusals struct {
	N     int      // how many
	Notes []string // the first few: "address: why"
	Auth  bool     // some failed authentication
}

func (r *Refusals) add(addr string, err error) {
	r.N++
	if len(r.Notes) < maxNotes {
		r.Notes = append(r.Notes, fmt.Sprintf("%s: %v", addr, err))
	}
	r.Auth = r.Auth || errors.Is(err, auth.ErrFailed)
}

// String lists the refusals for an error message, or "" when there are
// none.
func (r Refusals) String() string {
	if r.N == 0 {
		return ""
	}
	s := fmt.Sprintf("refused %d connection(s) whose handshake failed", r.N)
	for _, n := range r.Notes {
		s += "; " + n
	}
	if r.N > len(r.Notes) {
		s += "; …"
	}
	return s
}

type result[T any] struct {
	c   *watched
	v   T
	err error
}

// watched is an accepted connection in its handshake: it notes whether
// its peer has sent anything yet.
type watched struct {
	net.Conn
	spoke   atomic.Bool
	evicted atomic.Bool // closed by Admit to make room
}

func (w *watched) Read(p []byte) (int, error) {
	n, err := w.Conn.Read(p)
	if n > 0 && !w.spoke.Load() {
		w.spoke.Store(true)
	}
	return n, err
}

// handshaking is one handshake in progress.
type handshaking struct {
	c     *watched
	start time.Time
	src   string // the peer's host
}

var past = time.Unix(1, 0)

// host is the host part of a remote address, the unit of Admit's
// per-source accounting.
func host(a net.Addr) string {
	s := a.String()
	if h, _, err := net.SplitHostPort(s); err == nil {
		return h
	}
	return s
}

// victim picks the handshake in progress to close for a new connection:
// one whose peer has sent nothing yet before one that has, then one from
// the source with the most handshakes in progress, then the oldest. The
// awaited peer speaks first and at once, arrives after strangers that
// stalled before it, and shares a source with few of them unless it shares
// their host, so it is the last to go.
func victim(live map[*watched]handshaking) *watched {
	per := map[string]int{}
	for _, h := range live {
		per[h.src]++
	}
	var best *handshaking
	for _, h := range live {
		switch {
		case best == nil:
		case h.c.spoke.Load() != best.c.spoke.Load():
			if h.c.spoke.Load() {
				continue
			}
		case per[h.src] != per[best.src]:
			if per[h.src] < per[best.src] {
				continue
			}
		case !h.start.Before(best.start):
			continue
		}
		best = &h
	}
	if best == nil {
		return nil
	}
	return best.c
}

// Admit accepts connections on ln and runs admit on each, in a goroutine
// of its own and bounded by a.Bound (through the connection's deadline and
// the context admit gets), until admit has accepted a.Want of them. A
// connection admit refuses is closed, logged and noted, and the wait goes
// on: a connection that did not complete its handshake never ends it. A
// connection admit accepts after a.Want others is closed too.
//
// At most MaxInFlight handshakes run at once. When one more connection
// arrives, the handshake least likely to be an awaited peer's is closed
// (noted as refused) and the new one takes its place: first one whose
// peer has sent nothing yet, then one from the host with the most
// handshakes in progress, then the oldest. So strangers that connect
// before an awaited peer and stall cannot keep it out: it arrives after
// them and speaks at once.
//
// admit is given c wrapped (to see whether its peer spoke); the
// connection in an Admitted is the one admit returned in its value.
//
// Admit takes ln and closes it. It returns the admitted connections, the
// refusals, and an error only when ctx ended or ln failed first; then the
// admitted connections are closed. It waits for its goroutines.
func Admit[T any](ctx context.Context, ln net.Listener, a Admission, admit func(ctx context.Context, c net.Conn) (T, error)) ([]Admitted[T], Refusals, error) {
	ctx, cancel := context.WithCancel(ctx)
	var (
		wg       sync.WaitGroup
		refused  Refusals
		admitted []Admitted[T]
		// Evicted handshakes end at once (their connection is
		// closed), but may not have yet when the next arrives: at
		// most 2*MaxInFlight goroutines run.
		results  = make(chan result[T], 2*MaxInFlight)
		accepted = make(chan net.Conn)
		lnErr    = make(chan error, 1)
		live     = map[*watched]handshaking{} // not evicted
		running  = 0                          // goroutines, evicted ones too
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				lnErr <- err
				return
			}
			select {
			case accepted <- c:
			case <-ctx.Done():
				c.Close()
				lnErr <- ctx.Err()
				return
			}
		}
	})
	refuse := func(c net.Conn, err error) {
		refused.add(c.RemoteAddr().String(), err)
		a.Log.Warn("refused a connection whose handshake failed", "who", a.What, "from", c.RemoteAddr().String(), "error", err.Error())
	}
	var err error
	for len(admitted) < a.Want && err == nil {
		select {
		case c := <-accepted:
			if len(live) == MaxInFlight {
				if running == cap(results) {
					c.Close()
					refuse(c, fmt.Errorf("%d handshakes already in progress", MaxInFlight))
					continue
				}
				v := victim(live)
				delete(live, v)
				v.evicted.Store(true)
				v.Close()
			}
			w := &watched{Conn: c}
			live[w] = handshaking{c: w, start: time.Now(), src: host(c.RemoteAddr())}
			running++
			wg.Go(func() {
				hctx, hcancel := context.WithTimeout(ctx, a.Bound)
				defer hcancel()
				dl, _ := hctx.Deadline()
				w.SetDeadline(dl)
				stop := context.AfterFunc(hctx, func() { w.SetDeadline(past) })
				v, err := admit(hctx, w)
				if !stop() && err == nil {
					err = fmt.Errorf("handshake did not complete within %v", a.Bound)
				}
				if w.evicted.Load() && err != nil {
					err = fmt.Errorf("closed to make room: %d handshakes were in progress, and this one's peer the least likely to be awaited", MaxInFlight)
				}
				if err == nil {
					w.SetDeadline(time.Time{})
				} else {
					w.Close()
				}
				results <- result[T]{w, v, err} // never blocks: capacity 2*MaxInFlight
			})
		case r := <-results:
			running--
			delete(live, r.c)
			if r.err != nil {
				refuse(r.c, r.err)
			} else {
				admitted = append(admitted, Admitted[T]{r.c, r.v})
			}
		case err = <-lnErr:
			if cerr := ctx.Err(); cerr != nil {
				err = cerr
			}
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	cancel()
	ln.Close()
	wg.Wait()
	close(results)
	for r := range results { // finished after the wait ended
		if r.err == nil {
			r.c.Close()
		}
	}
	if err != nil {
		for _, x := range admitted {
			x.Conn.Close()
		}
		return nil, refused, err
	}
	return admitted, refused, nil
}
