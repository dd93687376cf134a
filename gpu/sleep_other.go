//go:build !linux

package gpu

import "time"

// fineSleep sleeps for about d.
func fineSleep(d time.Duration) { time.Sleep(d) }
