package weightcast

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// maxFileLines is the most lines a hand-written, non-test Go file of the
// module may have: a file longer than that holds more than one concern and
// is split by concern.
const maxFileLines = 800

// TestFileSize fails when a non-generated, non-test Go file of the module
// has more than maxFileLines lines. A file is generated when it carries
// the standard "Code generated ... DO NOT EDIT." line.
func TestFileSize(t *testing.T) {
	fset := token.NewFileSet()
	checked := 0
	walkModule(t, func(path, name string) error {
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(fset, path, src, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		checked++
		if ast.IsGenerated(f) {
			return nil
		}
		lines := bytes.Count(src, []byte("\n"))
		if len(src) > 0 && src[len(src)-1] != '\n' {
			lines++
		}
		if lines > maxFileLines {
			t.Errorf("%s has %d lines, more than %d: split it by concern", path, lines, maxFileLines)
		}
		return nil
	})
	if checked == 0 {
		t.Fatal("no Go files found: is the test running in the module root?")
	}
}
