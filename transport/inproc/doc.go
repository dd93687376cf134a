// Package inproc is the in-process transport: the root and its receivers are
// goroutines of one process, bucket bytes are copied from the root's buffer
// into each receiver's buffer, and metadata goes through bounded channels
// with the same window and acknowledgement rules as the networked buses.
//
// It registers itself as the byte transport "inproc".
package inproc
