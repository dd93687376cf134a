package pipeline

import (
	"fmt"
	"strings"
)

// Edge is a stream between two stages.
type Edge struct {
	From, To string
	Capacity int    // channel capacity
	Type     string // Go type of the items
}

// Node is one stage of a graph.
type Node struct {
	Name string
	Kind string // "source", "stage" or "sink"
}

// Graph describes a pipeline: its stages in the order they were added and
// the bounded channels between them.
type Graph struct {
	Name  string
	Nodes []Node
	Edges []Edge
}

// Graph describes the pipeline as built so far.
func (p *Pipeline) Graph() Graph {
	g := Graph{Name: p.name, Edges: append([]Edge(nil), p.edges...)}
	for _, s := range p.stages {
		g.Nodes = append(g.Nodes, Node{Name: s.name, Kind: s.kind()})
	}
	return g
}

// Mermaid renders the graph as a Mermaid flowchart, each edge labelled
// with its item type and channel capacity.
func (g Graph) Mermaid() string {
	var b strings.Builder
	b.WriteString("flowchart LR\n")
	if g.Name != "" {
		fmt.Fprintf(&b, "    %%%% %s\n", g.Name)
	}
	id := func(name string) string { return strings.Map(mermaidID, name) }
	for _, n := range g.Nodes {
		switch n.Kind {
		case "source":
			fmt.Fprintf(&b, "    %s([%s])\n", id(n.Name), n.Name)
		case "sink":
			fmt.Fprintf(&b, "    %s[/%s/]\n", id(n.Name), n.Name)
		default:
			fmt.Fprintf(&b, "    %s[%s]\n", id(n.Name), n.Name)
		}
	}
	for _, e := range g.Edges {
		fmt.Fprintf(&b, "    %s -- \"%s, cap %d\" --> %s\n", id(e.From), strings.NewReplacer("*", "", "\"", "'").Replace(e.Type), e.Capacity, id(e.To))
	}
	return b.String()
}

func mermaidID(r rune) rune {
	if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' {
		return r
	}
	return '_'
}
