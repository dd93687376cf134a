package ipc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/weightcast/weightcast/gpu"
)

// The side channel between the root and each receiver is one TCP
// connection on the loopback interface. It opens with the handshake of
// package transport/internal/handshake (the receiver initiates), whose
// extra data is the receiver's process id (u32), device ordinal (i32) and,
// from receivers that read the root's memory in place when the bucket
// metadata says so, its GPU's UUID (16 bytes) and a flags byte
// (extraReadsDirect); and the root's process id (u32), little-endian. A
// receiver that sends no UUID is sent every bucket. Then every frame is a
// 4-byte little-endian length (of what follows), a 1-byte type and a
// payload; integers are little-endian. (Types 1 and 2 were the hello and
// welcome of version 1.)
const (
	frameBucket = 3 // root → receiver: seq, n, buffer length, address, handle
	frameAck    = 4 // receiver → root: seq, status, message

	magic   = 0x50494357 // "WCIP"
	version = 2          // 2: the shared handshake with nonces and proofs

	// extraReadsDirect, a flag of the receiver's extra data: it reads
	// bucket entries in place in the root's device memory where the
	// metadata says so (direct buckets).
	extraReadsDirect = 1

	// maxFrame bounds every frame read: the largest is a bucket frame
	// (97 bytes) or a message carrying an error text.
	maxFrame = 4096
	// maxText bounds error texts and group names in frames.
	maxText = 1024
)

var errFrame = errors.New("malformed frame on the ipc side channel")

func writeFrame(w io.Writer, typ byte, payload []byte) error {
	if len(payload)+1 > maxFrame {
		return fmt.Errorf("ipc: frame of %d bytes exceeds the %d-byte limit", len(payload)+1, maxFrame)
	}
	b := make([]byte, 5+len(payload))
	binary.LittleEndian.PutUint32(b, uint32(1+len(payload)))
	b[4] = typ
	copy(b[5:], payload)
	_, err := w.Write(b)
	return err
}

func readFrame(r io.Reader) (typ byte, payload []byte, err error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.LittleEndian.Uint32(h[:4])
	if n < 1 || n > maxFrame {
		return 0, nil, fmt.Errorf("%w: length %d outside [1, %d]", errFrame, n, maxFrame)
	}
	payload = make([]byte, n-1)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, err
	}
	return h[4], payload, nil
}

// text appends a length-prefixed string, cut at maxText bytes.
func text(b []byte, s string) []byte {
	if len(s) > maxText {
		s = s[:maxText]
	}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// reader decodes a payload, remembering the first short read.
type reader struct {
	b   []byte
	bad bool
}

func (r *reader) take(n int) []byte {
	if r.bad || len(r.b) < n {
		r.bad = true
		return make([]byte, n)
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8() byte    { return r.take(1)[0] }
func (r *reader) u32() uint32 { return binary.LittleEndian.Uint32(r.take(4)) }
func (r *reader) u64() uint64 { return binary.LittleEndian.Uint64(r.take(8)) }
func (r *reader) text() string {
	n := binary.LittleEndian.Uint16(r.take(2))
	return string(r.take(int(n)))
}
func (r *reader) done() error {
	if r.bad || len(r.b) != 0 {
		return errFrame
	}
	return nil
}

// receiverExtra is the receiver's extra handshake data: its process id
// and device ordinal; readsDirect appends what a receiver that reads the
// root's memory in place adds.
func receiverExtra(pid, device int) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(pid))
	return binary.LittleEndian.AppendUint32(b, uint32(int32(device)))
}

// readsDirect appends to a receiver's extra data its GPU's UUID and
// extraReadsDirect.
func readsDirect(extra []byte, uuid [16]byte) []byte {
	return append(append(extra, uuid[:]...), extraReadsDirect)
}

// receiverInfo is what a receiver's extra data says.
type receiverInfo struct {
	pid, device int
	uuid        [16]byte // zero where it sent none
	flags       byte
}

func decodeReceiverExtra(p []byte) (receiverInfo, error) {
	r := reader{b: p}
	ri := receiverInfo{pid: int(r.u32()), device: int(int32(r.u32()))}
	if len(r.b) > 0 {
		copy(ri.uuid[:], r.take(len(ri.uuid)))
		ri.flags = r.u8()
	}
	return ri, r.done()
}

// rootExtra is the root's extra handshake data: its process id.
func rootExtra(pid int) []byte { return binary.LittleEndian.AppendUint32(nil, uint32(pid)) }

func decodeRootExtra(p []byte) (pid int, err error) {
	r := reader{b: p}
	pid = int(r.u32())
	return pid, r.done()
}

// bucketMsg tells a receiver where bucket seq's n bytes are: at addr in
// the root's address space (used by receivers in the root's own process),
// or at the start of the allocation of bufLen bytes exported as handle.
type bucketMsg struct {
	seq, n, bufLen uint64
	addr           uint64
	handle         gpu.IPCHandle
}

func (m bucketMsg) encode() []byte {
	b := binary.LittleEndian.AppendUint64(nil, m.seq)
	b = binary.LittleEndian.AppendUint64(b, m.n)
	b = binary.LittleEndian.AppendUint64(b, m.bufLen)
	b = binary.LittleEndian.AppendUint64(b, m.addr)
	return append(b, m.handle[:]...)
}

func decodeBucket(p []byte) (bucketMsg, error) {
	r := reader{b: p}
	m := bucketMsg{seq: r.u64(), n: r.u64(), bufLen: r.u64(), addr: r.u64()}
	copy(m.handle[:], r.take(len(m.handle)))
	if err := r.done(); err != nil {
		return m, err
	}
	if m.n > m.bufLen {
		return m, fmt.Errorf("%w: bucket %d of %d bytes in a buffer of %d", errFrame, m.seq, m.n, m.bufLen)
	}
	return m, nil
}

type ack struct {
	seq uint64
	ok  bool
	msg string
}

func (a ack) encode() []byte {
	b := binary.LittleEndian.AppendUint64(nil, a.seq)
	if a.ok {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	return text(b, a.msg)
}

func decodeAck(p []byte) (ack, error) {
	r := reader{b: p}
	a := ack{seq: r.u64(), ok: r.u8() == 1, msg: r.text()}
	return a, r.done()
}
