// Package transporttest holds the conformance suites that every byte
// transport (Suite) and every metadata bus (TestMetaBus) runs, and what
// transport tests share: in-memory and file Exchanges, the configs of a
// test group, and the plumbing of tests whose ranks run as child processes
// of the test binary (Main, Procs, Child, Group).
//
// It is pure Go and imports no transport, so that each transport's tests
// can use it. A suite's buffers come from a Memory: HostMemory here, and
// the GPU's in package gputest, which imports this one.
package transporttest
