// Package nccltest is the shared setup of the tests that run over NCCL:
// GPU memory that skips, saying why, on a host without the library.
package nccltest
