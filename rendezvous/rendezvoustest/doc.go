// Package rendezvoustest holds the conformance suite every
// rendezvous.Store runs (TestStore) and Mem, an in-memory Store that
// stands in for etcd in unit tests. Mem is a test double: it lives in
// one process, and its leases end only when a store is closed.
package rendezvoustest
