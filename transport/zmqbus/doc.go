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
//     receiver that connects late still gets message 0. A HELLO from
//     another group, with another world size, a rank out of range or one
//     already joined is answered with an ERROR frame, and both sides fail
//     with the same reason (ErrHandshake).
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
