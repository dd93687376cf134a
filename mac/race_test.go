//go:build race

package mac

// raceEnabled: the race detector multiplies the memory of the 1 GiB test.
const raceEnabled = true
