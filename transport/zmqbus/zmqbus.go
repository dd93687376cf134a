package zmqbus

import (
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"strings"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/weightcast/weightcast/transport"
)

// Name is the transport name in every error this package returns, and
// the bus's registry name.
const Name = "zmq"

// AddrKey is the Exchange key under which the root publishes the bus
// address: "tcp://host:port", or "tcp+tls://host:port" when the bus runs
// over TLS.
const AddrKey = "meta.addr"

// tlsScheme starts the address of a bus over TLS (which plain libzmq
// peers cannot join).
const tlsScheme = "tcp+tls://"

// quietZMQ takes zmq4's own log lines: every connection it drops is one
// the guard refused, and the bus logs what matters of those itself.
var quietZMQ = log.New(io.Discard, "", 0)

// Default liveness settings; see the package documentation.
const (
	DefaultHeartbeat = time.Second
	// DefaultMisses is how many heartbeat intervals of silence make a peer
	// gone when the "liveness" option is not set.
	DefaultMisses = 3
)

var (
	// ErrHandshake is wrapped by errors from a HELLO the root rejected:
	// another group, another world size, a rank out of range or already
	// joined, another protocol version.
	ErrHandshake = errors.New("handshake rejected")
	// ErrProtocol is wrapped by errors from a frame that breaks the
	// protocol: malformed, out of sequence, unexpected.
	ErrProtocol = errors.New("protocol violation")
	// ErrTooLarge is wrapped by errors from a message over a size limit.
	ErrTooLarge = errors.New("message too large")
	// ErrAborted is wrapped by errors from a bus that the other side
	// aborted because its round failed; the error carries its reason.
	ErrAborted = errors.New("round aborted")

	errPeerGone = transport.ErrPeerGone
	errTimeout  = transport.ErrTimeout
)

// options are the settings read from transport.Config.Options.
type options struct {
	bind       string        // host to bind (publisher)
	advertise  string        // host to publish instead of bind (publisher)
	maxMessage uint64        // largest DATA payload
	heartbeat  time.Duration // how often to send heartbeats at most
	liveness   time.Duration // silence after which a peer is gone
	handshake  time.Duration // bound on one ZMTP connection handshake
}

func parseOptions(cfg transport.Config) (options, error) {
	o := options{bind: "127.0.0.1", maxMessage: transport.DefaultMaxMessage, heartbeat: DefaultHeartbeat}
	get := func(k string) (string, bool) {
		v, ok := cfg.Options[k]
		return strings.TrimSpace(v), ok && strings.TrimSpace(v) != ""
	}
	if v, ok := get("bind"); ok {
		o.bind = strings.Trim(v, "[]")
	}
	if v, ok := get("advertise"); ok {
		if _, _, err := net.SplitHostPort(v); err == nil {
			return o, fmt.Errorf("option advertise=%q: give a host name or address without a port; the port is the one bound", v)
		}
		o.advertise = strings.Trim(v, "[]")
	}
	if v, ok := get("max_message"); ok {
		n, err := humanize.ParseBytes(v)
		if err != nil || n == 0 || n > math.MaxInt32*2 {
			return o, fmt.Errorf("option max_message=%q: want a size from 1 byte to 4GiB such as 64MiB", v)
		}
		o.maxMessage = n
	}
	if v, ok := get("heartbeat"); ok {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Millisecond {
			return o, fmt.Errorf("option heartbeat=%q: want a duration of 1ms or more such as 1s", v)
		}
		o.heartbeat = d
	}
	o.liveness = DefaultMisses * o.heartbeat
	if v, ok := get("liveness"); ok {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Millisecond {
			return o, fmt.Errorf("option liveness=%q: want a duration of 1ms or more such as 3s", v)
		}
		o.liveness = d
	}
	o.liveness = min(o.liveness, cfg.WaitTimeout())
	o.handshake = min(cfg.WaitTimeout(), 10*time.Second)
	return o, nil
}

// sendInterval is how often to heartbeat a peer that declares another
// side gone after peerLiveness of silence: at most every own heartbeat,
// and at least three times per peer liveness.
func sendInterval(own, peerLiveness time.Duration) time.Duration {
	return max(min(own, peerLiveness/3), time.Millisecond)
}

// tickOf is the period of the liveness ticker.
func tickOf(o options) time.Duration {
	return max(min(50*time.Millisecond, o.heartbeat/4, o.liveness/8), time.Millisecond)
}

func millis(d time.Duration) uint32 {
	ms := d.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	if ms > math.MaxUint32 {
		ms = math.MaxUint32
	}
	return uint32(ms)
}

// busError builds the *transport.Error every failure of this package is.
func busError(cfg transport.Config, op string, seq uint64, hasSeq bool, peer int, err error) *transport.Error {
	return &transport.Error{Transport: Name, Group: cfg.Group, Rank: cfg.Rank, Op: op, Seq: seq, HasSeq: hasSeq, Peer: peer, Err: err}
}

var (
	_ transport.Watcher = (*publisher)(nil)
	_ transport.Watcher = (*subscriber)(nil)
)
