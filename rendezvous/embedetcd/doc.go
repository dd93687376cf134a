// Package embedetcd runs a single-member etcd server inside the process,
// for a demo or tests that need no separate etcd: Start serves clients on
// a loopback port the OS picks (or a given address) from a temporary data
// directory that Close removes.
//
// It is a package of its own because the etcd server is large (several
// hundred packages): a program that only dials an etcd cluster imports
// package rendezvous, which links the client alone.
package embedetcd
