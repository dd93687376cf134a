// Package layout describes which slices of a model's tensors each rank holds
// or needs.
//
// A [Tensor] is a global tensor: its name, dtype and global shape. A [Slice]
// is a rectangular region of one tensor: an offset and a size per dimension.
// A rank's local tensor for a slice is that region, stored contiguous in
// row-major order.
//
// A sender rank holds slices (FSDP dim-0 shards, tensor-parallel shards,
// replicas; several ranks may hold overlapping slices). A receiver rank needs
// slices: whole tensors by default, or its tensor-parallel (and
// expert-parallel) shard, which [Rules] derive from tensor names the way
// vLLM's model loaders slice Llama, Qwen2/3 and DeepSeek-V3/Kimi-K2
// checkpoints. [DefaultRules] holds that rule set; users put their own rules
// in front of it with [Rules.With].
//
// A group of ranks is a [Source]: [Layout] lists every rank's slices
// explicitly, [Parallel] computes them from a parallelism (ranks, TP, EP,
// FSDP) without storing one slice per rank and tensor, which matters for a
// 1T-parameter model on hundreds of ranks.
package layout
