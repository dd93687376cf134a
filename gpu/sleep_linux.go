package gpu

import (
	"syscall"
	"time"
)

// fineSleep sleeps the calling thread for d with nanosleep, whose slack is
// tens of microseconds where a Go timer's can reach a millisecond. An early
// wake-up (EINTR) only makes the caller poll sooner.
func fineSleep(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	_ = syscall.Nanosleep(&ts, nil)
}
