// Command demo streams a model's weights (a synthetic transformer, or a
// safetensors checkpoint with --model) from one sender to several receivers
// through weightcast's pipeline, round after round, and verifies every byte
// on every receiver.
//
// By default it starts every rank as its own process on this machine, meeting
// through an embedded etcd, with metadata over ZeroMQ and bytes over the
// transport --transport names (auto: nccl with a GPU per rank, ipc when ranks
// share GPUs, tcp without GPUs). --transport inproc runs every rank as goroutines of one
// process. Across hosts, start one process per rank with --rank,
// --world-size and --rendezvous etcd://HOST:PORT, or with torchrun's RANK,
// WORLD_SIZE, MASTER_ADDR and MASTER_PORT.
//
// Everything that can be checked before a rank starts is (flags, the
// checkpoint's headers, that outputs can be written), and what fails exits
// 2 at once. A failed run exits 1; a run stopped by SIGINT or SIGTERM asks
// its ranks to stop, and exits 130 or 143. Either way the summary (the
// table, or one JSON object with --json) states only what the ranks
// measured and reported. Rank processes end with their launcher, and a
// launch removes what killed launches left in TMPDIR.
package main
