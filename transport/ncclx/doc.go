// Package ncclx is the NCCL byte transport: every bucket is broadcast from
// rank 0 to all other ranks with ncclBroadcast over device memory, between
// GPUs of one host (NVLink, PCIe) or of many (InfiniBand, RoCE, sockets).
// It registers itself as the byte transport "nccl"; the package has another
// name so that it can be imported beside package nccl, the bindings it
// uses.
//
// # Ranks
//
// The numbering is verl's build_topology for its NCCL checkpoint engine:
// the trainer's rank 0 is NCCL rank 0 and the root; rollout receivers are
// NCCL ranks 1..N. transport.Config.Rank is the NCCL rank and WorldSize the
// NCCL world size (1 + N). Trainer ranks other than 0 take no part in the
// weight sync: they simply do not open an endpoint (their shards reach
// rank 0 through the trainer's own gather before a round).
//
// # Setup and rounds
//
// Rank 0 creates the unique id (ncclGetUniqueId) and publishes it under
// UniqueIDKey through Config.Exchange; the others wait for it there. The
// communicator is created non-blocking and kept across rounds (verl's
// rebuild_group=False). Endpoints have no notion of a round, so verl's
// rebuild_group=True is (*Endpoint).Rebuild, which every rank calls at the
// same point between rounds; option rebuild=each-round is refused with a
// message saying so.
//
// # Broadcasts and ordering
//
// Broadcast runs ncclBroadcast in place (send == receive buffer on the
// root) on the endpoint's own stream. A fenced bucket (gpu.Fenced: the
// pack stage's copies into it) is ordered on the GPU: the stream waits for
// the fence with cuStreamWaitEvent, and the host never blocks on the
// packing. Broadcast returns once the broadcast has finished on this rank
// (an event after it, polled together with ncclCommGetAsyncError): on the
// root the bucket may then be reused, on a receiver its bytes have landed.
//
// # Failures
//
// Every wait is bounded by Config.WaitTimeout() and the caller's context.
// When either ends, or NCCL reports an error, the communicator is aborted
// (ncclCommAbort, never ncclCommDestroy on an error path) and the endpoint
// refuses further broadcasts until Rebuild. Errors are *transport.Error
// and wrap transport.ErrTimeout for an expired bound, the context's error
// when the caller cancelled, and transport.ErrPeerGone when NCCL reports a
// remote or system error (a rank that died). A rank killed mid-broadcast
// may also leave NCCL waiting silently, which the bound turns into
// ErrTimeout.
//
// NVLink multicast stays off: loading NCCL sets NCCL_NVLS_ENABLE=0 (see
// package nccl), and processes started by callers should get nccl.SafeEnv.
package ncclx
