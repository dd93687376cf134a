package authtest

import (
	"bytes"
	"log/slog"
	"sync"
	"testing"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/transport"
)

// Run is the run id of the keys Secure gives.
const Run = "run"

// Secure gives every config the keys of secret for run Run of its group
// (when secret is not nil) and TLS settings of a certificate of ca for the
// loopback names (when ca is not nil), and returns cfgs.
func Secure(t testing.TB, cfgs []transport.Config, secret *auth.Secret, ca *CA) []transport.Config {
	t.Helper()
	for r := range cfgs {
		if secret != nil {
			cfgs[r].Auth = Keys(t, secret, cfgs[r].Group, Run)
		}
		if ca != nil {
			cfgs[r].TLS = ca.TLS(t)
		}
	}
	return cfgs
}

// LogBuffer collects the lines of a logger that several goroutines use,
// for tests that check what was logged (a refused connection).
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write adds p.
func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything logged so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Logger is a text logger into l.
func (l *LogBuffer) Logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }
