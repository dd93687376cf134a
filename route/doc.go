// Package route runs routed sync rounds: many sender ranks, each holding
// slices of a model's tensors, and many receiver ranks, each needing
// slices of them (whole tensors, or a tensor-parallel shard), with every
// byte a receiver needs sent once, by one sender that holds it, on the
// plan package plan computes from the two layouts.
//
// A group of N ranks numbers its senders 0..S-1 and its receivers
// S..N-1 (receiver index r is rank S+r). Each rank declares its layout
// once it knows it ([Holding] on a sender, [Need] on a receiver); the
// layouts travel through the group's rendezvous exchange, every rank
// makes the same plan from them, and rank 0 publishes each round's
// layout digests on the metadata bus, so that a layout that changes
// between rounds re-plans on every rank, and one that does not keeps its
// plan.
//
// A round moves, for every sender–receiver pair that the plan joins, the
// pair's byte runs in buckets of one bucket size (a [Schedule] both ends
// compute alike): the sender packs the runs of each bucket out of its
// local tensors, seals it (a checksum, or with a group secret a keyed
// BLAKE3 MAC bound to the version, the pair and the bucket), and sends it
// over a point-to-point transport (transport.Pairs); the receiver checks
// the seal before it writes any run into its local tensors ([Dest]). Each
// pair has its own two buffers on both ends, so packing the next bucket
// overlaps moving this one, and no pair waits for another's buffers; a
// receiver on the sender's GPU borrows the sender's buffer instead of
// copying the bucket into one of its own (transport.Borrower). Segments
// start on 8-byte words of their bucket, so that the GPU checksums a
// bucket in the copies that fill it.
//
// The commit is the broadcast's: every rank acknowledges the round's
// start message only once its part is done (a sender's buckets all sent,
// a receiver's all checked and written), rank 0 then announces the
// version committed, and each receiver's Dest switches to it. A rank that
// fails aborts the bus with its reason, so every rank fails within the
// bus's bounds naming it, and no receiver commits.
package route
