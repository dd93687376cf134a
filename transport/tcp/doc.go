// Package tcp is the byte transport for hosts without GPUs: bucket bytes in
// host memory move over TCP along a pipelined chain
//
//	root (rank 0) → rank 1 → rank 2 → … → rank N-1 (the tail)
//
// Each bucket travels in chunks (256 KiB unless the "chunk" option says
// otherwise), and every receiver but the tail passes chunk i on to its
// successor while chunk i+1 is still arriving. Each link carries every byte
// once, so throughput does not fall as receivers are added; only the time to
// fill the chain grows, by about one chunk per hop.
//
// That fill time is paid once per bucket, since a receiver cannot read ahead
// into a buffer it has not been given yet, so the chunk is kept small: on
// loopback with three receivers and 64 MiB buckets, 256 KiB chunks ran about
// 30% faster than 4 MiB chunks and 1.8 times as fast as 16 MiB chunks, and
// no slower with a single receiver (BenchmarkChunk).
//
// It registers itself as the byte transport "tcp":
//
//	import _ "github.com/weightcast/weightcast/transport/tcp"
//
// # Opening
//
// Every receiver listens on a TCP port of the host named by the "bind"
// option (default 127.0.0.1, port 0 so the kernel picks a free one; give
// host:port to fix the port) and publishes the bound address under the
// Exchange key "tcp.addr". A receiver bound to a wildcard address (0.0.0.0,
// ::) must be told, with the "advertise" option, the host (or host:port) the
// previous rank should dial. Each rank except the tail looks up its
// successor's address and dials it; each receiver accepts exactly one
// connection, from its predecessor.
//
// Each connection opens with a handshake (the one of the ipc side channel
// too): both ends send a hello (magic, version, group, rank, world size, a
// fresh nonce) and a verdict on the other's. With a group secret
// (Config.Auth) each end also proves, with an HMAC over both nonces and
// everything the hellos said, that it holds the secret, so neither a
// stranger nor a replayed handshake gets in. The dialer trusts the address
// it dials (with a secret, the rendezvous record that named it is signed)
// and fails Open with the reason when its peer refuses it or does not fit:
// another group, world size, rank, protocol version or secret (errors
// wrap ErrHandshake, and auth.ErrFailed for the secret). A receiver trusts
// nothing that has not completed the handshake: it runs each accepted
// connection's handshake in a goroutine of its own (bounded by 10 s),
// refuses and logs (rate-limited, Config.Logger) every connection that
// fails it, and keeps waiting for its predecessor, so no stranger can
// take a rank's place, stall the receiver or fail the group; a timeout
// names what it refused. At most 64 handshakes run at once, and one more
// connection takes the place of the one least likely to be the
// predecessor's (handshake.Admit: a silent one first, then one from the
// busiest source host, then the oldest), so strangers that connect first
// and stall cannot keep the predecessor out; a dialer whose connection is
// closed before any answer dials again (5 connections in all). A receiver
// with TLS answers a plain hello with a refusal that says so.
//
// With Config.TLS every connection is mutual TLS 1.3 first (each end
// verifies the other's certificate against the authority; the dialer
// checks it names the host it dialed), and the handshake's proofs cover
// the TLS channel binding, so a relay between two ranks cannot pass them
// on.
//
// # Broadcast
//
// Per bucket the root sends a 32-byte header (sequence number, length, chunk
// size) and then one framed chunk per chunk size; receivers check the
// sequence number and length against their own arguments. A receiver reads
// each chunk straight into its buffer and a forwarding goroutine writes
// whatever has arrived to the successor in one writev, from the same buffer:
// no copies besides the kernel's. The root's chunk size applies to the whole
// chain.
//
// When the tail has the whole bucket it sends an acknowledgement upstream;
// every rank passes it on once its own part is done, and Broadcast returns on
// the root only when the acknowledgement arrives. A nil error on the root
// therefore means every receiver holds the bucket, and a failure anywhere in
// the chain surfaces in the root's Broadcast of that very bucket. (The
// root's buffer would be reusable as soon as the kernel took the last byte;
// the acknowledgement is about knowing, not about the buffer.) It costs a
// pause of one chain drain plus one round trip per bucket, during which the
// root sends nothing. Measured on loopback with 64 and 256 MiB buckets
// against a build without acknowledgements, the pause was within the noise
// with one receiver and cost about 3% with three, so every bucket is
// acknowledged and no window of unacknowledged buckets is offered.
//
// # Failures
//
// Every wait is bounded by Config.WaitTimeout() (a stall is reported as
// transport.ErrTimeout) and by the caller's context, whose cancellation cuts
// a blocked read or write short. Errors are *transport.Error naming the
// group, this rank, the bucket and the rank at fault. A rank that fails
// tells its neighbours: an abort frame goes downstream and a failure notice
// upstream, so that every rank of the chain names the rank that vanished
// (wrapping transport.ErrPeerGone), not just its neighbour, and the reason.
// A rank whose write a failure cut inside a frame first sends the rest of
// that frame, so the notice still arrives at a frame boundary; only a link
// that cannot take it is closed instead. After any error
// the endpoint is broken and every later Broadcast returns the first error.
// Close closes the connections (the neighbours see ErrPeerGone naming this
// rank) and waits for a Broadcast in progress to return.
package tcp
