// Package zmqbus is the metadata bus of weightcast over ZeroMQ: a
// transport.Publisher on the root (rank 0) and a transport.Subscriber on
// every receiver, losslessly and in order, between processes and hosts.
//
// verl sends each bucket's metadata over ZeroMQ PUB/SUB, which drops what
// is sent before a subscription arrives (the slow joiner) and, in
// go-zeromq/zmq4 v0.17.0, whatever passes the high-water mark. This bus
// uses a ROUTER socket on the root and one DEALER per receiver instead, and
// adds what ZeroMQ does not give:
//
//   - a readiness handshake: each receiver says HELLO (group, rank, world
//     size, protocol version, size limit, liveness) and waits for WELCOME;
//     the root's first Publish waits until every receiver has joined, so a
//     receiver that connects late still gets message 0. With a group
//     secret (Config.Auth) the HELLO carries the receiver's nonce, the root
//     answers with a CHALLENGE (its nonce and its proof: an HMAC over both
//     nonces, the group, run, ranks, world size, protocol version and TLS
//     channel binding), the receiver checks it and answers with its own
//     PROOF, and only then is it welcomed: neither a stranger nor a replay
//     gets in.
//   - no one-packet denial of service: a connection that has not joined
//     cannot fail the bus. A HELLO that does not fit (another group, world
//     size, version or secret, a rank out of range or joined already), a
//     wrong proof, or any malformed, oversized or unexpected frame from it
//     gets an ERROR about itself alone (never another rank's identity),
//     and its connection is closed and logged (rate-limited,
//     Config.Logger); a misconfigured receiver fails with that reason
//     (ErrHandshake, and auth.ErrFailed for the secret), and a root that
//     waits in vain for a rank names what it refused. The guard under
//     zmq4 gives each peer identity one connection: a second connection
//     announcing a connected peer's routing identity is refused.
//   - sequence numbers and acknowledgements: Publish blocks while
//     transport.DefaultWindow messages are unacknowledged by some receiver;
//     a gap, duplicate or reordering on either side is an error
//     (ErrProtocol), never a silent loss.
//   - a size limit on every decoded message (option max_message, default
//     transport.DefaultMaxMessage): the root refuses to publish past any
//     receiver's limit, and the receiver checks again; frames larger than
//     the limit are refused before zmq4 allocates them (ErrTooLarge).
//   - heartbeats both ways: a receiver killed with SIGKILL makes the root's
//     Publish or Sync fail with transport.ErrPeerGone naming its rank, and
//     a dead root makes Recv fail the same way, within the liveness bound.
//   - no reconnection: a broken connection fails the round rather than
//     risk a message lost in the gap.
//
// The frames are a fixed little-endian header plus a payload, so a libzmq
// client in any language can join; docs/protocol.md describes them.
//
// TLS: zmq4 v0.17.0 offers only the NULL and PLAIN security mechanisms (no
// CURVE), so with Config.TLS the bus runs ZMTP over mutual TLS 1.3 inside
// its own zmq4 transport, and the root publishes tcp+tls://host:port. A
// libzmq client cannot join such a bus (libzmq has no TLS transport).
//
// Options (transport.Config.Options; other keys are ignored):
//
//	bind         host the root binds (default 127.0.0.1; port always chosen by the system)
//	advertise    host the root publishes instead of bind (required when binding 0.0.0.0 or ::)
//	max_message  largest message payload, such as 64MiB (default transport.DefaultMaxMessage)
//	heartbeat    longest interval between heartbeats (default 1s)
//	liveness     silence after which a peer is gone (default 3 heartbeats, at most Config.WaitTimeout())
//
// Goroutines: OpenPublisher and OpenSubscriber start three goroutines per
// socket, which Close stops and joins. One reads (the only caller of the
// socket's Recv, which zmq4 cannot interrupt), one writes (the only caller
// of Send, which zmq4 blocks on a stalled TCP peer), one ticks heartbeats
// and liveness. Publish, Sync, Recv and Ack never touch the socket; they
// wait on state those goroutines update, bounded by their context and by
// Config.WaitTimeout(). Every error is a *transport.Error with transport
// "zmq".
package zmqbus
