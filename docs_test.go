package weightcast

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The pointers from code to docs that TestDocReferences follows. A docs
// reference is the docs directory's file name, optionally followed by
// #anchor or by `, "Heading"` (the heading of a section, or its start up to
// a colon or a parenthesis); one preceded by a path (another project's
// docs) is not ours. A cited identifier is the word "see" followed by a Go
// name (Name, pkg.Name) or a file name (name.go).
var (
	docRef      = regexp.MustCompile(`(?:^|[^\w/.-])docs/([\w.-]+\.md)(?:#([\w-]+)|,? "([^"]+)")?`)
	seeRef      = regexp.MustCompile(`\b[Ss]ee ([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)`)
	mdLink      = regexp.MustCompile(`\]\(([^)\s]+?\.md)(?:#([^)\s]+))?\)`)
	sourceFile  = regexp.MustCompile(`\.(go|c|h|py|ptx)$`)
	camelOrType = regexp.MustCompile(`^[A-Z]|[a-z0-9][A-Z]`)
)

// TestDocReferences checks that every pointer from the module's Go code to
// its docs resolves: each docs/*.md named in a comment or a string exists,
// and so does the section it cites (a quoted heading or an #anchor). It
// also checks the links between the Markdown files (README.md, docs/) and
// their anchors, and, where a comment's "see" is followed by what reads as
// a Go name (CamelCase, mixedCase or pkg.Name) or a file (x.go), that it
// is declared in, or is a file of, this module.
func TestDocReferences(t *testing.T) {
	files, decls := moduleGoFiles(t)
	headings := map[string][]string{} // docs file → its headings
	sections := func(doc string) ([]string, bool) {
		if h, ok := headings[doc]; ok {
			return h, h != nil
		}
		text, err := os.ReadFile(doc)
		if err != nil {
			headings[doc] = nil
			return nil, false
		}
		headings[doc] = markdownHeadings(string(text))
		return headings[doc], true
	}
	for _, f := range files {
		for _, text := range f.texts {
			for _, m := range docRef.FindAllStringSubmatch(text, -1) {
				doc := filepath.Join("docs", m[1])
				hs, ok := sections(doc)
				switch {
				case !ok:
					t.Errorf("%s cites %s, which does not exist", f.path, doc)
				case m[2] != "" && !hasAnchor(hs, m[2]):
					t.Errorf("%s cites %s#%s: no heading has that anchor", f.path, doc, m[2])
				case m[3] != "" && !hasHeading(hs, m[3]):
					t.Errorf("%s cites %s, %q: no such heading", f.path, doc, m[3])
				}
			}
		}
		for _, c := range f.comments {
			for _, m := range seeRef.FindAllStringSubmatch(c, -1) {
				checkCited(t, f.path, strings.TrimSuffix(m[1], "."), decls)
			}
		}
	}
	mds, _ := filepath.Glob("docs/*.md")
	for _, md := range append(mds, "README.md") {
		text, err := os.ReadFile(md)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllStringSubmatch(string(text), -1) {
			if strings.Contains(m[1], "://") {
				continue
			}
			doc := filepath.Join(filepath.Dir(md), m[1])
			hs, ok := sections(doc)
			if !ok {
				t.Errorf("%s links to %s, which does not exist", md, doc)
			} else if m[2] != "" && !hasAnchor(hs, m[2]) {
				t.Errorf("%s links to %s#%s: no heading has that anchor", md, doc, m[2])
			}
		}
	}
}

// checkCited reports a name that a comment of path cites after "see"
// which reads as a Go identifier or a file and is neither declared in the
// module nor a file of it. Plain lower-case words (as in "see" followed by
// "below") are prose and left alone.
func checkCited(t *testing.T, path, name string, decls map[string]bool) {
	t.Helper()
	if sourceFile.MatchString(name) {
		if _, err := os.Stat(filepath.Join(filepath.Dir(path), name)); err == nil {
			return
		}
		if !decls["file:"+filepath.Base(name)] {
			t.Errorf("%s says see %s: no such file in the module", path, name)
		}
		return
	}
	if !strings.Contains(name, ".") && !camelOrType.MatchString(name) {
		return
	}
	for _, part := range strings.Split(name, ".") {
		if !decls[part] {
			t.Errorf("%s says see %s: %s is declared nowhere in the module", path, name, part)
			return
		}
	}
}

// goFile is what TestDocReferences reads of one Go file: its comments
// (each group as one line of text) and its string literals.
type goFile struct {
	path     string
	comments []string
	texts    []string // the comments and the string literals
}

// moduleGoFiles parses every Go file of the module (not testdata or
// hidden directories) and returns them, with the set of every name
// declared in them (packages, types, functions, methods, fields,
// variables, constants) and, as "file:NAME", of every file's name.
func moduleGoFiles(t *testing.T) ([]goFile, map[string]bool) {
	t.Helper()
	var files []goFile
	decls := map[string]bool{}
	fset := token.NewFileSet()
	walkModule(t, func(path, name string) error {
		decls["file:"+name] = true
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		af, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		f := goFile{path: path}
		for _, cg := range af.Comments {
			c := strings.Join(strings.Fields(cg.Text()), " ")
			f.comments = append(f.comments, c)
			f.texts = append(f.texts, c)
		}
		decls[af.Name.Name] = true
		ast.Inspect(af, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BasicLit:
				if n.Kind == token.STRING {
					if s, err := strconv.Unquote(n.Value); err == nil {
						f.texts = append(f.texts, s)
					}
				}
			case *ast.FuncDecl:
				decls[n.Name.Name] = true
			case *ast.TypeSpec:
				decls[n.Name.Name] = true
			case *ast.ValueSpec:
				for _, id := range n.Names {
					decls[id.Name] = true
				}
			case *ast.Field:
				for _, id := range n.Names {
					decls[id.Name] = true
				}
			}
			return true
		})
		files = append(files, f)
		return nil
	})
	return files, decls
}

// walkModule calls fn with the path and name of every file of the module
// below the current directory, the module root (not in testdata, hidden
// or node_modules directories); an error of fn fails the test.
func walkModule(t *testing.T, fn func(path, name string) error) {
	t.Helper()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		return fn(path, name)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// markdownHeadings returns the headings of a Markdown text, outside code
// blocks, without their #s.
func markdownHeadings(text string) []string {
	var hs []string
	fenced := false
	for line := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		if !fenced && strings.HasPrefix(line, "#") {
			hs = append(hs, strings.TrimSpace(strings.TrimLeft(line, "#")))
		}
	}
	return hs
}

// hasHeading reports whether one of hs is cited, or starts with cited and
// a colon or a parenthesis ("Calling C" for "Calling C: cgo against
// purego").
func hasHeading(hs []string, cited string) bool {
	for _, h := range hs {
		h = strings.ReplaceAll(h, "`", "")
		if h == cited || strings.HasPrefix(h, cited+":") || strings.HasPrefix(h, cited+" (") {
			return true
		}
	}
	return false
}

// hasAnchor reports whether one of hs has the anchor GitHub gives it:
// lower case, punctuation other than '-' and '_' dropped, spaces as '-'.
func hasAnchor(hs []string, anchor string) bool {
	for _, h := range hs {
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
				b.WriteRune(r)
			}
		}
		if b.String() == anchor {
			return true
		}
	}
	return false
}
