package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRun runs the example as `go run ./examples/sync` does: it must sync,
// and every receiver must hold every byte.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out); err != nil {
		t.Fatal(err)
	}
	want := "rank 1 holds version 1: 30 tensors, identical to rank 0's\nrank 2 holds version 1: 30 tensors, identical to rank 0's\n"
	if out.String() != want {
		t.Fatalf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}

// Where the README's library example comes from, and where it goes.
const (
	regionStart = "// [README: the library example]\n"
	regionEnd   = "// [README: end]\n"
	readmeMark  = "<!-- the library example: examples/sync/main.go, between its [README] marks; a test keeps the two the same -->\n"
)

// TestReadmeQuotesExample fails when the README's library example is not
// the code between the marks in main.go, which TestRun runs.
func TestReadmeQuotesExample(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, region, ok := strings.Cut(string(src), regionStart)
	region, _, ok2 := strings.Cut(region, regionEnd)
	if !ok || !ok2 {
		t.Fatalf("main.go lacks the marks %q and %q", regionStart, regionEnd)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), readmeMark+"\n```go\n")
	block, _, ok2 = strings.Cut(block, "```\n")
	if !ok || !ok2 {
		t.Fatalf("README.md lacks %q followed by a go code block", readmeMark)
	}
	if strings.TrimSpace(block) != strings.TrimSpace(region) {
		t.Errorf("README.md's library example differs from examples/sync/main.go; copy the code between the marks into the README.\nREADME:\n%s\nmain.go:\n%s", block, region)
	}
}
