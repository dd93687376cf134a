package gpu

import (
	"errors"
	"fmt"
	"time"
)

// RecordTimed records a new event at the current end of the stream that,
// unlike Record's, keeps the time the GPU reached it, so that Elapsed can
// tell how long the GPU took between two of them. Recording one costs the
// host no more than Record (no wait); the caller owns the event and must
// Close it.
func (s *Stream) RecordTimed() (*Event, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	h, r := cuEventCreateTimed(s.d.ctx)
	if r != 0 {
		return nil, s.d.err("cuEventCreate", "timed", r)
	}
	e := &Event{d: s.d, e: h}
	if err := e.recordOn(s); err != nil {
		return nil, errors.Join(err, e.Close())
	}
	return e, nil
}

// Elapsed returns the GPU time from start to end, two completed events of
// one device recorded with RecordTimed (cuEventElapsedTime: about half a
// microsecond of resolution; negative when end came first). It fails with
// CUDAErrorNotReady while either has not completed, and on an event made by
// Record, which keeps no time.
func Elapsed(start, end *Event) (time.Duration, error) {
	if start.closed || end.closed {
		return 0, fmt.Errorf("gpu: elapsed time of an event of cuda:%d used after Close", start.d.ordinal)
	}
	if start.d != end.d {
		return 0, fmt.Errorf("gpu: elapsed time between events of cuda:%d and cuda:%d", start.d.ordinal, end.d.ordinal)
	}
	ms, r := cuEventElapsedTime(start.d.ctx, start.e, end.e)
	if r != 0 {
		return 0, start.d.err("cuEventElapsedTime", "", r)
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}
