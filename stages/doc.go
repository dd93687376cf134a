// Package stages holds the weight-sync data types (Tensor, Entry,
// BucketMeta, Bucket) and the stages that move a model from one rank to
// many, built on package pipeline.
//
// The sender runs, for each round:
//
//	iterate ──► pack ──► publish ──► broadcast
//
// and every receiver:
//
//	subscribe ──► receive ──► unpack ──► load
//
// Pack fills fixed-size bucket buffers taken from a Pool of two: packing
// bucket k+1 overlaps the broadcast of bucket k, and no rank ever holds more
// than two buffers. A tensor larger than a bucket is split into chunks. The
// last bucket of a round carries IsLast, after which every stage closes its
// output in turn. Each Bucket carries the function that returns its buffer to
// the pool (Release), so whoever finishes with a bucket last gives it back,
// and the pipeline releases buckets left behind by a failure.
//
// Sender and Receiver compose these stages for the common case; the stage
// functions (Iterate, Pack, Publish, Broadcast, Subscribe, Receive, Unpack,
// Load) compose custom pipelines, such as one that drops frozen tensors
// between iterate and pack.
package stages
