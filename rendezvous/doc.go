// Package rendezvous lets the ranks of a named sync group find each other:
// they share the group's unique id and their endpoints, and wait for one
// another, through a small key-value Store. The real Store is etcd v3
// (DialEtcd); StartEmbedded runs a single-member etcd inside the process
// for demos and tests.
package rendezvous
