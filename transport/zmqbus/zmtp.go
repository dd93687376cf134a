package zmqbus

// What the guard knows of ZMTP: the framing of one direction of a
// connection, followed byte by byte (guard.go says why).

import (
	"encoding/binary"
)

// ZMTP framing (RFC 23): a 64-byte greeting, then frames of a flags byte
// (bit 0 MORE, bit 1 LONG, bit 2 COMMAND), a 1-byte or 8-byte big-endian
// size, and the body.
const (
	zmtpGreeting = 64
	flagMore     = 0x1
	flagLong     = 0x2
	flagCommand  = 0x4
)

type parseState int

const (
	stGreeting parseState = iota
	stFlags
	stSize
	stBody
)

// framer follows the ZMTP framing of one direction of a connection.
type framer struct {
	state    parseState
	left     uint64 // greeting or body bytes still to come
	flags    byte
	size     [8]byte
	sizeHave int
	sizeNeed int
	// body, when set, is given the bytes of every frame body as they
	// pass.
	body func(flags byte, b []byte)
}

func newFramer() framer { return framer{state: stGreeting, left: zmtpGreeting} }

// feed advances over b. It calls check (if not nil) when a frame's size
// is known, before the last byte of the size field is consumed, and stops
// there if check fails, returning how many bytes of b it consumed. It
// calls end at the end of the greeting (flags 0xFF) and of every frame,
// with the offset in b just past that end.
func (f *framer) feed(b []byte, check func(flags byte, size uint64) error, end func(flags byte, at int)) (int, error) {
	i := 0
	for i < len(b) {
		switch f.state {
		case stGreeting:
			k := min(f.left, uint64(len(b)-i))
			i += int(k)
			f.left -= k
			if f.left == 0 {
				f.state = stFlags
				end(0xFF, i)
			}
		case stFlags:
			f.flags = b[i]
			i++
			f.sizeHave, f.sizeNeed = 0, 1
			if f.flags&flagLong != 0 {
				f.sizeNeed = 8
			}
			f.state = stSize
		case stSize:
			f.size[f.sizeHave] = b[i]
			f.sizeHave++
			if f.sizeHave < f.sizeNeed {
				i++
				continue
			}
			size := uint64(f.size[0])
			if f.sizeNeed == 8 {
				size = binary.BigEndian.Uint64(f.size[:])
			}
			if check != nil {
				if err := check(f.flags, size); err != nil {
					return i, err
				}
			}
			i++
			f.left = size
			f.state = stBody
			if size == 0 {
				f.state = stFlags
				end(f.flags, i)
			}
		case stBody:
			k := min(f.left, uint64(len(b)-i))
			if f.body != nil {
				f.body(f.flags, b[i:i+int(k)])
			}
			i += int(k)
			f.left -= k
			if f.left == 0 {
				f.state = stFlags
				end(f.flags, i)
			}
		}
	}
	return len(b), nil
}

// messageEnd reports whether a frame with these flags ends what its
// sender will write in one go: the greeting, a command, or the last frame
// of a message.
func messageEnd(flags byte) bool {
	return flags == 0xFF || flags&flagCommand != 0 || flags&flagMore == 0
}
