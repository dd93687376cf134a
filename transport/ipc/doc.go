// Package ipc is the CUDA IPC byte transport: the root and its receivers
// are processes of one host (several may share one GPU, as in colocated
// RL, or use different GPUs of the host), and each receiver copies every
// bucket straight out of the root's device buffer into its own, on the GPU.
// No byte crosses the host.
//
// It registers itself as the byte transport "ipc".
//
// # How a bucket moves
//
// The root exports each bucket buffer once (cuIpcGetMemHandle, cached by
// address: with a Pool of two, two handles per run); receivers open each
// handle once (cuIpcOpenMemHandle, cached by handle, with lazy peer access
// so that a receiver on another GPU of the host maps it too). Per bucket,
// the root waits for the buffer's fence (gpu.Fenced: the pack stage's
// copies), then sends every receiver a small frame over a side channel —
// sequence number, length, and which buffer holds it (its handle, and its
// address for receivers in the root's own process, which cannot open their
// own handles and copy from the address directly). Each receiver copies
// the bytes device to device on its own stream, waits for the copy, and
// acknowledges (or borrows the buffer: below); the root's Broadcast
// returns when every receiver has acknowledged, which frees the buffer for
// the next bucket.
//
// The side channel is one TCP connection per receiver on the loopback
// interface (option "bind" picks another local address). The root
// publishes its address under AddrKey through Config.Exchange and, in
// Open, waits until every receiver has connected and completed the
// handshake of the tcp chain (hellos with group, rank, world size, process
// id and device, fresh nonces both ways, and with Config.Auth proofs that
// both ends hold the group secret). A connection whose handshake fails (a
// stranger, a peer of another group, world size or secret, a rank out of
// range or taken) hears why, is logged (rate-limited) and closed, and the
// root keeps waiting: nothing that has not proved itself gets a rank's
// place, a bucket's handle, or can fail the group. A receiver fails Open
// with the root's reason. Frames are length-prefixed and limited to 4 KiB.
//
// Security: the side channel stays on one host and is not encrypted; a
// receiver that passed the handshake maps the root's buffers. CUDA IPC
// itself is not authenticated: any process of the host that can obtain a
// handle can map the memory, so the per-bucket MAC catches tampering with
// the bytes on this path but not reading them.
//
// # Receivers that read in place
//
// Each receiver's handshake carries its GPU's UUID. When every receiver's
// is the root's (colocated processes on one GPU), the root's endpoint says
// so (transport.DirectReader): the sender then leaves buckets of device
// tensors unfilled and every receiver copies the tensors straight out of
// the sender's memory, which the bucket metadata tells it how to map (see
// package stages and docs/protocol.md; the handles travel in the
// metadata, as the buffers' handles travel here). Such buckets never reach
// Broadcast. A receiver that sends no UUID is sent every bucket.
//
// # Receivers that borrow the root's buffers
//
// The root also publishes its GPU's UUID under AddrKey. A receiver on the
// same GPU lends (transport.Lender): instead of copying each bucket into
// a buffer of its own, it hands the root's buffer, as mapped here, to the
// stages that read it (the copies into its model), and acknowledges once
// they are done, which is when the root may reuse the buffer. Per
// receiver that is one copy of the model fewer, the one the GPU shared by
// every rank had to make on top of the pack and the loads. A receiver on
// another GPU copies the bucket on the copy engine, as before.
//
// # Failures
//
// Every wait is bounded by Config.WaitTimeout() and the caller's context.
// A receiver that dies (even by SIGKILL) closes its connection, and the
// root's Broadcast fails at once with transport.ErrPeerGone naming its
// rank; a receiver that hangs makes it fail with transport.ErrTimeout. A
// dead root makes receivers fail with ErrPeerGone. A receiver that cannot
// copy tells the root why. After a failure the endpoint refuses further
// broadcasts. All errors are *transport.Error.
//
// # Memory
//
// The transport allocates no device memory: a stream per receiver and the
// mappings of the root's two buffers, which use the root's memory.
package ipc
