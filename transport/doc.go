// Package transport defines how bucket bytes and bucket metadata move from the
// root rank to every receiver, and keeps the registry of byte transports by
// name (as database/sql keeps drivers).
//
// A byte transport is opened once per rank as an Endpoint; every rank then
// calls Endpoint.Broadcast for the same sequence of buckets. Metadata travels
// separately, through a Publisher on the root and a Subscriber on each
// receiver, losslessly and in order, with at most a window of unacknowledged
// messages in flight.
//
// Implementations live in sub-packages (inproc, tcp, ipc, and ncclx, which
// registers "nccl") and register themselves in init; import them for their
// side effect:
//
//	import _ "github.com/weightcast/weightcast/transport/tcp"
//
// Open of a built-in transport whose package is not imported fails with an
// error that names that import line (BuiltinPackage).
//
// The package transporttest holds the conformance suites that every
// implementation runs.
package transport
