// Package transporttest holds the conformance suites that every byte
// transport and every metadata bus runs, and an in-memory Exchange test
// double for them.
package transporttest
