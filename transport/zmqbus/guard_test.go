package zmqbus

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"
)

// recConn records every Write on the wire and serves reads from r.
type recConn struct {
	net.Conn // nil: only the methods below are used
	r        io.Reader
	wire     bytes.Buffer
	writes   []int // length of each underlying Write
}

func (c *recConn) Read(p []byte) (int, error) { return c.r.Read(p) }
func (c *recConn) Write(p []byte) (int, error) {
	c.writes = append(c.writes, len(p))
	return c.wire.Write(p)
}
func (c *recConn) SetDeadline(time.Time) error      { return nil }
func (c *recConn) Close() error                     { return nil }
func (c *recConn) SetReadDeadline(time.Time) error  { return nil }
func (c *recConn) SetWriteDeadline(time.Time) error { return nil }

// zmtpStream is a greeting, a READY command and messages of random frames;
// ends holds the offset just past each message (and greeting, command).
func zmtpStream(rng *rand.Rand, messages int) (stream []byte, ends []int) {
	g := make([]byte, 64)
	g[0], g[9], g[10] = 0xFF, 0x7F, 3
	stream = append(stream, g...)
	ends = append(ends, len(stream))
	stream = append(stream, 0x04, 6)
	stream = append(stream, "\x05READY"...)
	ends = append(ends, len(stream))
	for range messages {
		parts := 1 + rng.IntN(3)
		for p := range parts {
			body := make([]byte, []int{0, 1, 16, 255, 256, 5000, 40000}[rng.IntN(7)])
			for i := range body {
				body[i] = byte(rng.Uint32())
			}
			stream = append(stream, zmtpFrame(p < parts-1, body)...)
		}
		ends = append(ends, len(stream))
	}
	return stream, ends
}

// TestGuardWriteCoalesces: bytes written in any pieces reach the wire
// unchanged, and the wire is written only at message ends or for large
// pieces.
func TestGuardWriteCoalesces(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	stream, ends := zmtpStream(rng, 300)
	isEnd := map[int]bool{}
	for _, e := range ends {
		isEnd[e] = true
	}
	c := &recConn{}
	g := newGuardConn(c, guardConfig{}, nil)
	for off := 0; off < len(stream); {
		n := min(len(stream)-off, 1+rng.IntN(300))
		if rng.IntN(10) == 0 {
			n = min(len(stream)-off, coalesceLimit+1+rng.IntN(1000))
		}
		if k, err := g.Write(stream[off : off+n]); err != nil || k != n {
			t.Fatalf("write: %d, %v", k, err)
		}
		off += n
	}
	if !bytes.Equal(c.wire.Bytes(), stream) {
		t.Fatal("bytes on the wire differ from the bytes written")
	}
	pos := 0
	for i, n := range c.writes {
		pos += n
		if !isEnd[pos] && n <= coalesceLimit && i+1 < len(c.writes) {
			// A flush that is not at a message end must be a large piece
			// (pending plus that piece go out as two Writes on this conn).
			if c.writes[i+1] <= coalesceLimit && !isEnd[pos+c.writes[i+1]] {
				t.Fatalf("write %d ends at %d, inside a message", i, pos)
			}
		}
	}
	if len(c.writes) > len(ends)*3 {
		t.Fatalf("%d wire writes for %d messages", len(c.writes), len(ends))
	}
}

// TestGuardReadPassesThrough: the read side delivers the stream unchanged
// in whatever pieces it is asked for.
func TestGuardReadPassesThrough(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	stream, _ := zmtpStream(rng, 300)
	g := newGuardConn(&recConn{r: bytes.NewReader(stream)}, guardConfig{maxFrame: 1 << 20, maxMessage: 1 << 20, maxParts: 4}, nil)
	var got []byte
	for {
		p := make([]byte, 1+rng.IntN(70000))
		n, err := g.Read(p)
		got = append(got, p[:n]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, stream) {
		t.Fatalf("read %d bytes, want the %d written", len(got), len(stream))
	}
}

// TestGuardReadLimits: the reader stops before the last byte of an
// oversized size field, and counts a message's frames and bytes.
func TestGuardReadLimits(t *testing.T) {
	prefix, _ := zmtpStream(rand.New(rand.NewPCG(1, 1)), 0)
	for _, tc := range []struct {
		name string
		tail []byte
		want string
	}{
		{"Frame", append([]byte{0x2}, 0, 0, 0, 0, 0, 0x10, 0, 0), "frame of 1048576 bytes exceeds the limit of 1000"},
		{"Message", append(zmtpFrame(true, make([]byte, 600)), zmtpFrame(false, make([]byte, 600))...), "message of 1200 bytes exceeds the limit of 1100"},
		{"Parts", bytes.Repeat(zmtpFrame(true, []byte{1}), 5), "more than 4 frames"},
		{"Command", append([]byte{0x6}, 0, 0, 0, 0, 0, 1, 0, 1), "command of 65537 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stream := append(append([]byte(nil), prefix...), tc.tail...)
			g := newGuardConn(&recConn{r: bytes.NewReader(stream)}, guardConfig{maxFrame: 1000, maxMessage: 1100, maxParts: 4}, nil)
			got, err := io.ReadAll(g)
			if err == nil || !errors.Is(err, ErrTooLarge) && !errors.Is(err, ErrProtocol) {
				t.Fatalf("read all: %v", err)
			}
			if !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
				t.Fatalf("error %q does not mention %q", err, tc.want)
			}
			if len(got) >= len(stream) {
				t.Fatalf("delivered all %d bytes despite the limit", len(got))
			}
			if _, err2 := g.Read(make([]byte, 10)); err2 != err {
				t.Fatalf("error not sticky: %v then %v", err, err2)
			}
		})
	}
}
