package handshake

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/internal/ratelog"
)

// MaxInFlight bounds the handshakes Admit runs at once; connections past
// it are closed at once.
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
	c   net.Conn
	v   T
	err error
}

var past = time.Unix(1, 0)

// Admit accepts connections on ln and runs admit on each, in a goroutine
// of its own and bounded by a.Bound (through the connection's deadline and
// the context admit gets), until admit has accepted a.Want of them. A
// connection admit refuses is closed, logged and noted, and the wait goes
// on: a connection that did not complete its handshake never ends it. A
// connection admit accepts after a.Want others is closed too.
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
		results  = make(chan result[T], MaxInFlight)
		accepted = make(chan net.Conn)
		lnErr    = make(chan error, 1)
		inFlight = 0
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
			if inFlight == MaxInFlight {
				c.Close()
				refuse(c, fmt.Errorf("%d handshakes already in progress", MaxInFlight))
				continue
			}
			inFlight++
			wg.Go(func() {
				hctx, hcancel := context.WithTimeout(ctx, a.Bound)
				defer hcancel()
				dl, _ := hctx.Deadline()
				c.SetDeadline(dl)
				stop := context.AfterFunc(hctx, func() { c.SetDeadline(past) })
				v, err := admit(hctx, c)
				if !stop() && err == nil {
					err = fmt.Errorf("handshake did not complete within %v", a.Bound)
				}
				if err == nil {
					c.SetDeadline(time.Time{})
				} else {
					c.Close()
				}
				results <- result[T]{c, v, err} // never blocks: capacity MaxInFlight
			})
		case r := <-results:
			inFlight--
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
