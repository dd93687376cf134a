// Package rendezvous lets the ranks of a named sync group find each other:
// they share the run's unique id (the NCCL unique id, later) and their
// endpoints, and wait for one another. It is built on a small key-value
// Store; the real one is etcd v3 (DialEtcd), and package embedetcd runs a
// single-member etcd inside the process for demos and tests.
//
// # Joining
//
// Every rank calls Join with the same group name, run id and world size
// and its own rank. Join is bounded by one deadline (JoinOptions.Timeout,
// 5 minutes by default) rather than a number of retries. It returns a
// *Group, which is the transport.Exchange of the rank's transports and
// watches every rank's liveness until Close.
//
//	rank 0:  claim owner → register → publish root → join barrier → read ranks
//	others:  register → wait for root, check world size → join barrier → read ranks
//
// # Keys
//
// All keys live under /weightcast/<group>/. Group names and run ids hold
// no '/', and a run id is never "owner".
//
//	/weightcast/<group>/owner
//	    The run id of the run holding the group. Created if absent by
//	    rank 0, on rank 0's lease: it goes when rank 0 closes or its
//	    lease expires. A rank 0 that finds another run id here fails with
//	    ErrGroupInUse; finding its own run id, with ErrDuplicateRank.
//
//	/weightcast/<group>/<run>/ranks/<rank>
//	    The rank's liveness key, on the rank's lease: JSON
//	    {"world_size", "endpoints", "host", "pid", "lease"} ("lease": the
//	    lease's id in hex). Created if absent; a second process with the
//	    same rank fails with ErrDuplicateRank. Group.PeerGone fires when
//	    one of these disappears (ErrPeerGone when its lease ended,
//	    ErrTampered when it was deleted while the lease lives) or is
//	    rewritten (ErrTampered).
//
//	/weightcast/<group>/<run>/seen/<rank>
//	    Empty, on no lease; created right after the liveness key. It
//	    tells, after a timeout, which ranks came at all, even if they gave
//	    up and left before the others looked.
//
//	/weightcast/<group>/<run>/root
//	    Rank 0's record, on its lease: JSON {"world_size", "unique_id"
//	    (128 bytes, base64)}. The other ranks wait for it and compare
//	    world sizes; a mismatch fails with ErrWorldSizeMismatch.
//
//	/weightcast/<group>/<run>/abort
//	    The first failure any rank saw during Join, on no lease: JSON
//	    {"kind", "by", "key", "ranks", "detail", "time"}. Every rank
//	    watches it during Join and fails with the same error at once
//	    instead of at the deadline. A run id is one launch: a later launch
//	    reusing it sees this record.
//
//	/weightcast/<group>/<run>/join/<rank>, .../join/count, .../join/done
//	    The join barrier, on no lease: each rank creates its arrival key
//	    and adds 1 to the decimal counter; a rank that brings it to the
//	    world size and finds every rank's arrival key creates "done",
//	    which every rank waits for.
//
//	/weightcast/<group>/<run>/barrier/<name>/...
//	    Group.Barrier(name), laid out as the join barrier. Names are
//	    single-use within a run.
//
//	/weightcast/<group>/<run>/data/<rank>/<key>
//	    Group.Put(key) of that rank, on its lease; Group.Get(rank, key)
//	    waits for it. Put of a key this rank published already fails with
//	    ErrDuplicateKey; of a key another writer created first, with
//	    ErrTampered.
//
// Because every key of a run is under its run id, keys a crashed run
// leaves behind never block a new run; the new run's rank 0, once it holds
// the owner key, deletes the runs that have no live rank left. Rank 0's
// Group.Close deletes its own run's keys that live on no lease; the
// leased ones go with their ranks' leases.
//
// # Signed records
//
// With a group secret (JoinOptions.Auth, the run's keys from
// auth.Secret.RunKeys), every value a rank writes under its run's prefix
// is signed: the value is followed by "\nwcmac1:" and 64 hex digits of an
// HMAC-SHA256 over the key's length (4 bytes, big-endian), the key and
// the value, with the run's record key. A rank refuses a record that does
// not verify: one squatting on a key a rank writes is deleted and
// replaced, one a rank waits for is waited past, and a wait that ends
// while the key holds only such records fails with ErrAuth
// ("authentication failed") naming the key, so ranks given different
// secrets (or a secret and none) fail at the join deadline saying so. The
// owner key and the barrier counters are not signed: forging them can
// delay a run (as deleting keys can) but not join it. A rank without a
// secret refuses signed records.
//
// # Waiting and liveness
//
// On etcd, create-if-absent is a transaction on the key's CreateRevision
// being 0. A wait reads the key and, if it is not there, watches it from
// the read's revision + 1, so nothing is missed and nothing is polled;
// when that revision has been compacted away, it reads and watches again.
// Each Store holds one lease (TTL 10 s by default, WithLeaseTTL), kept
// alive by its client; Close revokes it, and a killed process's lease
// expires after the TTL, deleting its liveness key, which the other
// ranks' Groups see as ErrPeerGone. A liveness key deleted while the
// lease named in it lives, or rewritten, was tampered with: no rank
// deletes or rewrites another's, and the Groups say exactly that
// (ErrTampered, "rank 2's record was deleted").
//
// Errors are *Error values naming the group, run, reporting rank, the key
// and the ranks at fault, wrapping ErrTimeout, ErrGroupInUse,
// ErrDuplicateRank, ErrWorldSizeMismatch, ErrPeerGone, ErrAuth,
// ErrTampered, ErrAborted, ErrInvalid, ErrDuplicateKey or ErrClosed.
package rendezvous
