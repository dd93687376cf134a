package weightcast

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite the generated package graph in docs/architecture.md")

// foundation are the packages every layer may import (pure Go, standard
// library only): the package graph leaves out the arrows into them, which
// would otherwise be a third of it, and says so.
var foundation = []string{"auth", "dtype", "mem"}

// graphGroups places the module's packages in the package graph's boxes,
// by path prefix, first match; the rest stand outside any box.
var graphGroups = []struct{ title, prefix string }{
	{"front ends", "weightcast"},
	{"front ends", "capi"},
	{"front ends", "cmd/"},
	{"transports", "transport"},
	{"rendezvous", "rendezvous"},
	{"GPU bindings", "gpu"},
	{"GPU bindings", "nccl"},
	{"GPU bindings", "internal/dl"},
	{"internal helpers", "internal/"},
	{"tensors and bytes", "cast"},
	{"tensors and bytes", "checksum"},
	{"tensors and bytes", "mac"},
	{"tensors and bytes", "quant"},
	{"tensors and bytes", "safetensors"},
	{"foundation: every layer may import these", "auth"},
	{"foundation: every layer may import these", "dtype"},
	{"foundation: every layer may import these", "mem"},
}

// TestArchitecturePackageGraph checks that the package graph drawn in
// docs/architecture.md is the import graph of the module's packages as go
// list reports it (test-support packages, those named *test, and examples
// left out). Run with -update-docs to regenerate it.
func TestArchitecturePackageGraph(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("skipping: needs the go command")
	}
	out, err := exec.Command(goBin, "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	graph := packageGraph(string(out))
	const path = "docs/architecture.md"
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)(<!-- generated: package graph -->\n```mermaid\n)(.*?)(```\n)")
	m := re.FindStringSubmatch(string(doc))
	if m == nil {
		t.Fatalf("%s has no generated package graph block", path)
	}
	if m[2] == graph {
		return
	}
	if !*updateDocs {
		t.Fatalf("the package graph in %s is out of date; run go test -run ArchitecturePackageGraph -update-docs .\nwant:\n%s", path, graph)
	}
	if err := os.WriteFile(path, []byte(re.ReplaceAllLiteralString(string(doc), m[1]+graph+m[3])), 0o644); err != nil {
		t.Fatal(err)
	}
}

// packageGraph draws, as mermaid, the import graph that golist (lines of
// a package and its imports) describes, of this module's packages only.
func packageGraph(golist string) string {
	const module = "github.com/weightcast/weightcast"
	short := func(p string) (string, bool) {
		if p == module {
			return "weightcast", true
		}
		s, ok := strings.CutPrefix(p, module+"/")
		if !ok || strings.HasSuffix(s[strings.LastIndex(s, "/")+1:], "test") ||
			strings.HasPrefix(s, "examples/") || s == "internal/faultfs" {
			return "", false
		}
		return s, true
	}
	id := func(p string) string { return strings.NewReplacer("/", "_").Replace(p) }
	var nodes []string
	var edges []string
	for line := range strings.SplitSeq(strings.TrimSpace(golist), "\n") {
		f := strings.Fields(line)
		p, ok := short(f[0])
		if !ok {
			continue
		}
		nodes = append(nodes, p)
		for _, imp := range f[1:] {
			if q, ok := short(imp); ok && !slices.Contains(foundation, q) {
				edges = append(edges, fmt.Sprintf("    %s --> %s\n", id(p), id(q)))
			}
		}
	}
	slices.Sort(nodes)
	slices.Sort(edges)
	var b strings.Builder
	b.WriteString("flowchart LR\n")
	fmt.Fprintf(&b, "    %%%% generated from go list; arrows into %s, which every layer may import, left out\n",
		strings.Join(foundation, ", "))
	placed := map[string]bool{}
	for i, g := range graphGroups {
		if i > 0 && graphGroups[i-1].title == g.title {
			continue
		}
		var in []string
		for _, n := range nodes {
			for _, h := range graphGroups[i:] {
				if h.title != g.title {
					break
				}
				if !placed[n] && strings.HasPrefix(n, h.prefix) {
					placed[n] = true
					in = append(in, n)
				}
			}
		}
		fmt.Fprintf(&b, "    subgraph box%d[%q]\n", i, g.title)
		for _, n := range in {
			fmt.Fprintf(&b, "        %s[%s]\n", id(n), n)
		}
		b.WriteString("    end\n")
	}
	for _, n := range nodes {
		if !placed[n] {
			fmt.Fprintf(&b, "    %s[%s]\n", id(n), n)
		}
	}
	for _, e := range edges {
		b.WriteString(e)
	}
	return b.String()
}
