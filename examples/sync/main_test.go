package main

import (
	"bytes"
	"context"
	"fmt"
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
	var want string
	for _, how := range []string{"front door", "by hand"} {
		for rank := 1; rank <= 2; rank++ {
			want += fmt.Sprintf("%s: rank %d holds version 1: 30 tensors, identical to rank 0's\n", how, rank)
		}
	}
	if out.String() != want {
		t.Fatalf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}

// quotes are the README's quotations of main.go: the mark before a go code
// block in README.md, and the marks around the quoted code in main.go.
var quotes = []struct{ readmeMark, start, end string }{
	{"<!-- the front door example: examples/sync/main.go, between its [README: the front door] marks; a test keeps the two the same -->\n",
		"// [README: the front door]\n", "// [README: end]\n"},
	{"<!-- the library example: examples/sync/main.go, between its [README] marks; a test keeps the two the same -->\n",
		"// [README: the library example]\n", "// [README: end]\n"},
}

// TestReadmeQuotesExample fails when a README example is not the code
// between its marks in main.go, which TestRun runs.
func TestReadmeQuotesExample(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range quotes {
		_, region, ok := strings.Cut(string(src), q.start)
		region, _, ok2 := strings.Cut(region, q.end)
		if !ok || !ok2 {
			t.Fatalf("main.go lacks the marks %q and %q", q.start, q.end)
		}
		_, block, ok := strings.Cut(string(readme), q.readmeMark+"\n```go\n")
		block, _, ok2 = strings.Cut(block, "```\n")
		if !ok || !ok2 {
			t.Fatalf("README.md lacks %q followed by a go code block", q.readmeMark)
		}
		if strings.TrimSpace(block) != strings.TrimSpace(region) {
			t.Errorf("README.md's example after %q differs from examples/sync/main.go; copy the code between %q and %q into the README.\nREADME:\n%s\nmain.go:\n%s", q.readmeMark, q.start, q.end, block, region)
		}
	}
}
