//go:build !race

package gpu

// raceDetector is whether the tests run with the race detector.
const raceDetector = false
