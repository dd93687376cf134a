// Package parallel splits large memory work (copies, reads) into pieces run
// on several goroutines, so that a transfer that a single core would limit
// runs at the speed of the machine's memory. Work below MinBytes stays on
// the calling goroutine.
package parallel
