package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestRateLimit(t *testing.T) {
	var buf bytes.Buffer
	r := New(slog.New(slog.NewTextHandler(&buf, nil)), time.Hour)
	if !r.Warn("refused", "from", "a") {
		t.Fatal("the first line was not logged")
	}
	for range 5 {
		if r.Warn("refused", "from", "b") {
			t.Fatal("a line within the interval was logged")
		}
	}
	r.last = time.Now().Add(-2 * time.Hour) // the interval has passed
	if !r.Warn("refused", "from", "c") {
		t.Fatal("a line after the interval was not logged")
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "from=a") || !strings.Contains(lines[1], "from=c") || !strings.Contains(lines[1], "suppressed=5") {
		t.Fatalf("logged:\n%s\nwant a's line, then c's saying 5 were suppressed", buf.String())
	}
	var none *Logger
	if none.Warn("x") {
		t.Fatal("a nil Logger logged")
	}
}
