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
package main
