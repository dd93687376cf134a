package rendezvous

import "strconv"

// KeyPrefix is the prefix of every key the rendezvous writes.
const KeyPrefix = "/weightcast/"

// keys builds the store keys of one run of one group; see the package
// documentation for the layout.
type keys struct{ group, run string }

// owner is the group's owner key: rank 0's lease holds it, its value is
// the live run's id.
func (k keys) owner() string { return k.groupPrefix() + "owner" }

// groupPrefix is the prefix of every key of the group.
func (k keys) groupPrefix() string { return KeyPrefix + k.group + "/" }

// runPrefix is the prefix of every key of this run.
func (k keys) runPrefix() string { return k.groupPrefix() + k.run + "/" }

func (k keys) ranks() string       { return k.runPrefix() + "ranks/" }
func (k keys) rank(r int) string   { return k.ranks() + strconv.Itoa(r) }
func (k keys) seen() string        { return k.runPrefix() + "seen/" }
func (k keys) root() string        { return k.runPrefix() + "root" }
func (k keys) abort() string       { return k.runPrefix() + "abort" }
func (k keys) joinBarrier() string { return k.runPrefix() + "join/" }

// unleased are the prefixes of the run's keys that live on no lease.
func (k keys) unleased() []string {
	return []string{k.seen(), k.joinBarrier(), k.runPrefix() + "barrier/", k.abort()}
}

func (k keys) barrier(name string) string { return k.runPrefix() + "barrier/" + name + "/" }

func (k keys) data(rank int, key string) string {
	return k.runPrefix() + "data/" + strconv.Itoa(rank) + "/" + key
}
