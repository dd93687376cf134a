package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestREADMEDemoLines parses every demo command line of the README (make
// demo ARGS="…" and bin/demo …) as the demo parses its flags, and runs its
// demo plan lines, so that the README never shows a flag that does not
// exist or a value it refuses.
func TestREADMEDemoLines(t *testing.T) {
	text, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := 0
	for _, m := range regexp.MustCompile(`(?m)^(?:[A-Z_]+=\S+ )*(?:make demo ARGS="([^"]*)"|bin/demo ([^#\n]*))`).FindAllStringSubmatch(string(text), -1) {
		args := strings.Fields(m[1] + m[2]) // the README quotes nothing inside ARGS
		if len(args) > 0 && args[0] == "--help" {
			continue
		}
		env := map[string]string{}
		for _, kv := range strings.Fields(m[0]) {
			if k, v, ok := strings.Cut(kv, "="); ok && k == strings.ToUpper(k) && k != "ARGS" {
				env[k] = v
			}
		}
		lines++
		if len(args) > 0 && args[0] == "plan" {
			// Its paths are the repository root's; this test runs in cmd/demo.
			for i := range args {
				if i > 0 && args[i-1] == "--config" {
					args[i] = "../../" + args[i]
				}
			}
			var out, errOut strings.Builder
			if code := runPlan(args[1:], &out, &errOut); code != exitOK {
				t.Errorf("README: %s\n  demo plan exits %d: %s", m[0], code, errOut.String())
			}
			continue
		}
		if _, err := parseConfig(args, func(k string) string { return env[k] }); err != nil {
			t.Errorf("README: %s\n  the demo refuses it: %v", m[0], err)
		}
	}
	if lines < 5 {
		t.Fatalf("found %d demo lines in the README; the pattern no longer matches it", lines)
	}
}
