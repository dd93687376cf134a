package ipc

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"sync"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// syncLog collects log lines from several goroutines.
type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncLog) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncLog) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncLog) logger() *slog.Logger { return slog.New(slog.NewTextHandler(s, nil)) }
