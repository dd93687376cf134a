package embedetcd

import (
	"errors"
	"sync/atomic"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestQuietLoggerFilters(t *testing.T) {
	obs, logs := observer.New(zap.ErrorLevel)
	var closing atomic.Bool
	lg := zap.New(untilClosing{obs, &closing}).With(zap.String("member", "x"))

	lg.Info("chatter")
	lg.Error("failed to update storage version", zap.String("cluster-version", "3.6.0"),
		zap.Error(errors.New("cannot detect storage schema version: missing term information")))
	lg.Error("failed to update storage version", zap.Error(errors.New("disk on fire")))
	lg.Error("a real problem")
	closing.Store(true)
	lg.Error("setting up serving from embedded etcd failed.", zap.Error(errors.New("http: Server closed")))

	var got []string
	for _, e := range logs.All() {
		got = append(got, e.Message)
		if e.Level < zapcore.ErrorLevel {
			t.Errorf("entry %q at level %v passed an error-level logger", e.Message, e.Level)
		}
	}
	want := []string{"failed to update storage version", "a real problem"}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("logged %q; want %q (the start-up race and everything after Close dropped)", got, want)
	}
	if f := logs.All()[0].ContextMap()["error"]; f != "disk on fire" {
		t.Fatalf("the kept storage version error says %v", f)
	}
}
