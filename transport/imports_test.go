package transport_test

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/weightcast/weightcast"

// above are the packages of the module that sit above transport: the
// front door and what builds on it, the stages, and blame, which the
// stages and the front door share.
var above = []string{module, module + "/stages", module + "/blame", module + "/capi", module + "/cmd", module + "/examples"}

// TestImportsNothingAbove: no package under transport, nor its tests, nor
// anything they depend on, imports the stages or the front door, so the
// import graph has no arrow upward from transport (the stage-level
// conformance suite lives in stages/stagestest for that reason).
func TestImportsNothingAbove(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to list the dependencies with")
	}
	// -test lists each package's test variants too, with their imports.
	out, err := exec.Command(gobin, "list", "-deps", "-test", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, module+"/transport/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps -test: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 20 {
		t.Fatalf("go list -deps -test listed only %q", lines)
	}
	isAbove := func(p string) bool {
		p, _, _ = strings.Cut(p, " ") // "pkg [pkg.test]"
		for _, a := range above {
			if p == a || strings.HasPrefix(p, a+"/") && a != module {
				return true
			}
		}
		return false
	}
	for _, l := range lines {
		f := strings.Fields(l)
		pkg := f[0]
		for _, imp := range f[1:] {
			if imp == "[" || strings.HasSuffix(imp, ".test]") {
				continue
			}
			if isAbove(imp) && !isAbove(pkg) {
				t.Errorf("%s imports %s, which sits above transport", pkg, imp)
			}
		}
		if isAbove(pkg) {
			t.Errorf("transport's packages depend on %s, which sits above them", pkg)
		}
	}
}
