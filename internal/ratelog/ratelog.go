// Package ratelog logs events that a stranger can cause as often as it
// likes (a refused connection, a malformed frame) at a bounded rate: at
// most one line per interval, and the next line says how many were left
// out meanwhile.
package ratelog

import (
	"log/slog"
	"sync"
	"time"
)

// DefaultEvery is the interval New uses when given zero.
const DefaultEvery = time.Second

// Logger is a rate-limited slog.Logger. Its methods are safe for
// concurrent use; a nil *Logger logs nothing.
type Logger struct {
	l     *slog.Logger
	every time.Duration

	mu      sync.Mutex
	last    time.Time
	dropped int
}

// New logs to l (slog.Default() when nil) at most once per every
// (DefaultEvery when zero).
func New(l *slog.Logger, every time.Duration) *Logger {
	if l == nil {
		l = slog.Default()
	}
	if every <= 0 {
		every = DefaultEvery
	}
	return &Logger{l: l, every: every}
}

// Warn logs msg with args at level Warn, unless a line was logged less
// than the interval ago; it reports whether it logged.
func (r *Logger) Warn(msg string, args ...any) bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	now := time.Now()
	if !r.last.IsZero() && now.Sub(r.last) < r.every {
		r.dropped++
		r.mu.Unlock()
		return false
	}
	dropped := r.dropped
	r.last, r.dropped = now, 0
	r.mu.Unlock()
	if dropped > 0 {
		args = append(args, slog.Int("suppressed", dropped))
	}
	r.l.Warn(msg, args...)
	return true
}
