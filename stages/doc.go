// Package stages holds the weight-sync data types (Tensor, Bucket) and the
// stages that move a model from one rank to many, built on package
// pipeline. What a bucket's metadata and the commit message look like on
// the wire, and how a message is signed, is package wire's.
//
// The sender runs, for each round:
//
//	iterate ──► pack ──► publish ──► broadcast
//
// and every receiver:
//
//	subscribe ──► receive ──► unpack ──► load
//
// Each stage lives in one file of its name (iterate.go, pack.go, ...),
// whose top shows its flow; pack's device fill sits behind a small
// interface in a file of its own (pack_device.go). Pack fills fixed-size bucket buffers
// taken from a Pool of two: packing bucket k+1 overlaps the broadcast of
// bucket k, and no rank ever holds more than two buffers. A tensor larger
// than a bucket is split into chunks. The last bucket of a round carries
// IsLast, after which every stage closes its output in turn. Each Bucket
// carries the function that returns its buffer to the pool (Release), so
// whoever finishes with a bucket last gives it back, and the pipeline
// releases buckets left behind by a failure. Unpack checks every bucket
// (its entries, and its checksum, or it leaves the checksum to the copies
// that load a device bucket into a lone DeviceTarget) before load hands it
// to a Sink.
//
// With a group secret (SenderConfig.Auth, ReceiverConfig.Auth: the run's
// auth.Keys), every bucket also carries a keyed BLAKE3 MAC of its bytes,
// computed where they are (on the GPU for device buckets), every metadata
// message is signed, and unpack checks the MAC before any sink sees the
// bucket, so bytes changed on purpose on any path fail the round instead
// of being committed (mac.go; the signature is wire.Seal).
//
// Sender and Receiver compose these stages for the common case; the stage
// functions (Iterate, Pack, Publish, Broadcast, Subscribe, Receive, Unpack,
// Load) compose custom pipelines, such as one that drops frozen tensors
// between iterate and pack.
//
// The stages consume a Source and a Sink, interfaces declared here (with
// the capabilities a source or sink may add: Describer, Lookuper; Beginner,
// Committer, DeviceSink, DeviceTarget, Holder, Aborter). The models a
// sender sends are package source's (a list of Tensors, a Synthetic model
// generated on demand, a Checkpoint of safetensors files streamed from
// disk straight into buckets), and the destinations package sink's (host
// and device models updated in place round after round, safetensors files,
// views, verifiers, checksums, callbacks); both import this package, never
// the other way round. What the stages themselves act on stays here: Cast,
// which marks floating tensors to be converted to the rollout dtype as
// pack copies them (Tensor.SourceDType), Quantize, which marks weights to
// be quantized as pack copies them, and Sinks, which combines several
// sinks and which load sees through, asking each member what it can do.
//
// Rounds are all or nothing. Every round carries a model version; once
// every receiver has acknowledged every bucket, Sender.Sync announces the
// version committed with one more message on the metadata bus
// (AnnounceCommit, AwaitCommit), and only then does a Receiver report it
// (Committed, WaitCommitted) and tell its sink (Committer). After a failed
// round, Receiver.State says whether the sink still holds the committed
// version (StateIntact) or was partly overwritten (StatePartial: resync),
// from what the sink holds (Holding): a sink.HostModel made WithShadow and
// sink.WriteSafetensors load each round into a copy of their own and
// switch on commit, so the committed version stays servable throughout.
//
// On GPUs the same stages run on device memory: a Pool of device buffers
// makes Pack copy into device buckets (device tensors device to device,
// host tensors through a pinned staging ring, small copies batched), each
// bucket carries an event that orders its copies before the broadcast,
// receivers get device views, and a bucket is released only after the
// copies out of it have finished. Checksums are computed in the copies
// that move the bytes (the fused kernels). Where every receiver shares the
// sender's GPU, buckets of device tensors are direct: left unfilled, read
// by every receiver where they lie in the sender's memory (direct.go).
// Receivers on the root's GPU borrow the root's buckets rather than copy
// them (transport.Lender). The GPU state this needs between rounds
// (streams, kernels' memory, pending checksums, pinned staging) is a
// Packer's on the sender and a Loader's on a receiver (loader.go: all of
// the receive stages' device work, which their device branches call); a
// Sender and a Receiver each own one, and their Close frees it. A Pool holds buffers
// only and stays its creator's.
package stages
