// Package sink holds the destinations a receiver loads its rounds into.
// Each is a stages.Sink and says by the optional interfaces it implements
// what else it can do (stages.Beginner, DeviceSink, DeviceTarget,
// Committer, Holder, Aborter; stages/load.go says what the load stage and
// the Receiver do with each):
//
//   - HostModel keeps the model in host memory, updated in place round
//     after round, or, made WithShadow, loaded into a second copy that the
//     group's commit switches to, so the committed version stays servable;
//   - DeviceModel keeps it in device memory, the destination of a rollout
//     worker's weights (NewDeviceModelOver: in tensors someone else owns);
//     as a DeviceTarget it has the load stage copy device buckets into it
//     with their checksums computed by the same copies;
//   - WriteSafetensors writes each round as safetensors files, mirroring a
//     checkpoint source's files, and puts a round in place only when the
//     group commits it;
//   - Views hands each bucket's whole tensors to a consumer as views of
//     the bucket, without copying them (the shape of verl's
//     receive_weights and of a rollout engine's load_weights);
//   - Checksums keeps a checksum of every tensor, Verify compares every
//     byte with a source that can regenerate or re-read it, and Callback
//     calls a function once per whole tensor.
//
// stages.Sinks combines several; the load stage and the Receiver see
// through it, so each member keeps its capabilities.
//
// The package sits above stages: it implements the interfaces the stages
// consume, and stages imports nothing of it.
package sink
