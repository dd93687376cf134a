package stages

import (
	"flag"
	"os"
	"regexp"
	"testing"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite the generated stage graphs in docs/architecture.md")

// TestArchitectureGraphs checks that the stage graphs drawn in
// docs/architecture.md are the ones the code builds, so the picture cannot
// drift from the code. Run with -update-docs to regenerate them.
func TestArchitectureGraphs(t *testing.T) {
	const path = "../docs/architecture.md"
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	graphs := map[string]string{
		"sender":   NewSender(SenderConfig{}).Graph().Mermaid(),
		"receiver": NewReceiver(ReceiverConfig{}).Graph().Mermaid(),
	}
	out := string(doc)
	for name, g := range graphs {
		re := regexp.MustCompile("(?s)(<!-- generated: " + name + " graph -->\n```mermaid\n)(.*?)(```\n)")
		m := re.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("%s has no generated %s graph block", path, name)
		}
		if m[2] != g {
			if !*updateDocs {
				t.Errorf("the %s graph in %s is out of date; run go test ./stages -run ArchitectureGraphs -update-docs\nwant:\n%s", name, path, g)
			}
			out = re.ReplaceAllLiteralString(out, m[1]+g+m[3])
		}
	}
	if *updateDocs && out != string(doc) {
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
