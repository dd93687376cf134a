// Package plan computes which sender rank sends which bytes to which
// receiver rank when many senders hold slices of a model and many receivers
// need slices of it (see package layout).
//
// [Make] maps every element a receiver needs to exactly one sender that
// holds it, as rectangular regions ([Move]); [Move.Runs] expresses a region
// as contiguous byte runs of the sender's and the receiver's local tensor.
// Where several senders hold a region the planner picks one: greedy by
// descending size, the sender whose link would finish earliest, then a pass
// that moves regions that can finish earlier elsewhere. The [Links] model
// says how fast bytes move: a NIC per GPU across nodes, NVLink inside one.
//
// A plan is deterministic: the same layouts give the same plan, and the same
// [Plan.Digest] (SHA-256 of a canonical encoding) on every rank, so ranks can
// check they agree before a round. It is made once and reused while
// [Plan.Current] says both layouts are the ones it was made from; [Cache]
// re-plans when one changes.
//
// Tensors whose holders and needs have the same shape and the same slices
// (every layer's expert gate projections, say) share one pattern of
// regions, so a 1T-parameter model over hundreds of ranks plans in about a
// second and its plan stays small.
package plan
