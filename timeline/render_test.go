package timeline

import (
	"bytes"
	"encoding/xml"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden SVG files in testdata")

// node is a parsed XML element.
type node struct {
	name  string
	attrs map[string]string
	kids  []*node
	text  string // character data directly inside the element
}

// parseSVG parses SVG markup into a tree, failing the test on invalid XML.
func parseSVG(t testing.TB, data []byte) *node {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(data))
	root := &node{name: "#document"}
	stack := []*node{root}
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not well-formed XML: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			n := &node{name: tok.Name.Local, attrs: map[string]string{}}
			for _, a := range tok.Attr {
				n.attrs[a.Name.Local] = a.Value
			}
			top := stack[len(stack)-1]
			top.kids = append(top.kids, n)
			stack = append(stack, n)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			stack[len(stack)-1].text += string(tok)
		}
	}
	if len(root.kids) != 1 || root.kids[0].name != "svg" {
		t.Fatalf("the document's root is not a single <svg> element")
	}
	return root.kids[0]
}

// find returns every element below n (n included) for which match is true.
func (n *node) find(match func(*node) bool) []*node {
	var out []*node
	var walk func(*node)
	walk = func(m *node) {
		if match(m) {
			out = append(out, m)
		}
		for _, k := range m.kids {
			walk(k)
		}
	}
	walk(n)
	return out
}

func hasClass(class string) func(*node) bool {
	return func(n *node) bool { return n.attrs["class"] == class }
}

func (n *node) num(t testing.TB, attr string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(n.attrs[attr], 64)
	if err != nil {
		t.Fatalf("<%s> attribute %s=%q is not a number", n.name, attr, n.attrs[attr])
	}
	return v
}

// allText joins the character data of n and everything below it.
func (n *node) allText() string {
	var b strings.Builder
	for _, m := range n.find(func(*node) bool { return true }) {
		b.WriteString(m.text)
	}
	return b.String()
}

func renderFixture(t testing.TB, opts Options) []byte {
	t.Helper()
	f, err := os.Open("testdata/pipeline.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr, err := Read(f)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := Render(&buf, tr, opts); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestRenderStructure(t *testing.T) {
	svg := parseSVG(t, renderFixture(t, Options{}))

	ranks := svg.find(hasClass("rank"))
	wantRanks := []string{"rank 0 (sender)", "rank 1 (receiver)", "rank 2 (receiver)"}
	if len(ranks) != len(wantRanks) {
		t.Fatalf("got %d rank groups, want %d", len(ranks), len(wantRanks))
	}
	for i, r := range ranks {
		if r.attrs["data-name"] != wantRanks[i] || r.attrs["data-pid"] != strconv.Itoa(i) {
			t.Errorf("rank group %d is pid %s %q, want pid %d %q", i, r.attrs["data-pid"], r.attrs["data-name"], i, wantRanks[i])
		}
	}

	// Lanes in thread_sort_index order, with their bars.
	type laneWant struct {
		pid, stage string
		bars       int
	}
	want := []laneWant{
		{"0", "round", 1}, {"0", "iterate", 6}, {"0", "pack", 6}, {"0", "publish", 6}, {"0", "broadcast", 6},
		{"1", "subscribe", 6}, {"1", "broadcast", 6}, {"1", "unpack", 6}, {"1", "load", 6},
		{"2", "subscribe", 6}, {"2", "broadcast", 6}, {"2", "unpack", 6}, {"2", "load", 6},
	}
	lanes := svg.find(hasClass("lane"))
	if len(lanes) != len(want) {
		t.Fatalf("got %d lanes, want %d", len(lanes), len(want))
	}
	for i, l := range lanes {
		w := want[i]
		if l.attrs["data-pid"] != w.pid || l.attrs["data-stage"] != w.stage {
			t.Errorf("lane %d is pid %s stage %q, want pid %s stage %q", i, l.attrs["data-pid"], l.attrs["data-stage"], w.pid, w.stage)
		}
		labels := l.find(hasClass("lane-label"))
		if len(labels) != 1 || labels[0].text != w.stage {
			t.Errorf("lane %d label is %v, want %q", i, labels, w.stage)
		}
		bars := l.find(hasClass("bar"))
		if len(bars) != w.bars {
			t.Errorf("lane %d (pid %s %s) has %d bars, want %d", i, w.pid, w.stage, len(bars), w.bars)
		}
		for j, b := range bars {
			fill := b.attrs["fill"]
			if b.attrs["data-bucket"] == "none" {
				if fill != colorNoBucket {
					t.Errorf("lane %s bar %d without a bucket has fill %s, want %s", w.stage, j, fill, colorNoBucket)
				}
				continue
			}
			k, err := strconv.Atoi(b.attrs["data-bucket"])
			if err != nil {
				t.Fatalf("bar data-bucket=%q", b.attrs["data-bucket"])
			}
			if w.stage != "round" && k != j {
				t.Errorf("lane %s bar %d is bucket %d, want bars in bucket order", w.stage, j, k)
			}
			if fill != palette[k%len(palette)] {
				t.Errorf("lane %s bucket %d has fill %s, want %s", w.stage, k, fill, palette[k%len(palette)])
			}
			titles := b.find(func(n *node) bool { return n.name == "title" })
			if len(titles) != 1 || !strings.Contains(titles[0].text, "bucket "+strconv.Itoa(k)) || !strings.Contains(titles[0].text, "duration ") {
				t.Errorf("lane %s bucket %d tooltip is %v", w.stage, k, titles)
			}
		}
	}

	// The same bucket has the same color on every lane and rank.
	colors := map[string]string{}
	for _, b := range svg.find(hasClass("bar")) {
		k := b.attrs["data-bucket"]
		if c, ok := colors[k]; ok && c != b.attrs["fill"] {
			t.Errorf("bucket %s is drawn in %s and %s", k, c, b.attrs["fill"])
		}
		colors[k] = b.attrs["fill"]
	}
	if len(colors) != 7 { // buckets 0-5 and the round span
		t.Errorf("got %d distinct bucket values, want 7", len(colors))
	}

	// Tooltips humanize bytes.
	var packTip string
	for _, l := range lanes {
		if l.attrs["data-pid"] == "0" && l.attrs["data-stage"] == "pack" {
			packTip = l.find(func(n *node) bool { return n.name == "title" })[0].text
		}
	}
	if !strings.Contains(packTip, "256 MiB at ") || !strings.Contains(packTip, "GB/s") {
		t.Errorf("pack bucket 0 tooltip %q lacks bytes and throughput", packTip)
	}

	// Time axis in ms, with ticks from 0 to 300 ms.
	var ticks []string
	for _, n := range svg.find(hasClass("tick")) {
		ticks = append(ticks, n.text)
	}
	if got := strings.Join(ticks, ","); got != "0 ms,50 ms,100 ms,150 ms,200 ms,250 ms,300 ms" {
		t.Errorf("tick labels are %s", got)
	}

	// Counters, one per rank.
	if got := len(svg.find(hasClass("counter-line"))); got != 3 {
		t.Errorf("got %d counter lines, want 3", got)
	}
	// The instant event on the sender's publish lane.
	if got := len(svg.find(hasClass("instant"))); got != 1 {
		t.Errorf("got %d instant markers, want 1", got)
	}

	// Legend lists buckets 0-5 and "no bucket".
	var legend []string
	for _, n := range svg.find(hasClass("legend-item")) {
		legend = append(legend, n.attrs["data-bucket"])
	}
	if got := strings.Join(legend, ","); got != "0,1,2,3,4,5,none" {
		t.Errorf("legend items are %s", got)
	}

	// Summary: one row per lane, with figures.
	rows := svg.find(hasClass("row"))
	if len(rows) != len(want) {
		t.Fatalf("got %d summary rows, want %d", len(rows), len(want))
	}
	for i, r := range rows {
		if r.attrs["data-pid"] != want[i].pid || r.attrs["data-stage"] != want[i].stage {
			t.Errorf("summary row %d is pid %s %s, want pid %s %s", i, r.attrs["data-pid"], r.attrs["data-stage"], want[i].pid, want[i].stage)
		}
	}
	packRow := rows[2].allText()
	for _, s := range []string{"pack", "6", "180.88 ms", "53.4%", "1.3 GiB", "8.0 GB/s"} {
		if !strings.Contains(packRow, s) {
			t.Errorf("summary row for rank 0 pack %q lacks %q", packRow, s)
		}
	}
	if !strings.Contains(rows[0].allText(), "rank 0 (sender)") || strings.Contains(rows[1].allText(), "rank 0") {
		t.Errorf("the rank name should label only the first row of its group")
	}

	// Caption and facts.
	top := svg.find(hasClass("caption"))
	if len(top) == 0 || !strings.HasPrefix(top[0].text, "weightcast demo --transport tcp") {
		t.Errorf("caption is %v, want the otherData command", top)
	}
	facts := svg.find(hasClass("facts"))
	if len(facts) == 0 || !strings.Contains(facts[0].text, "bucket_bytes: 256 MiB") || !strings.Contains(facts[0].text, "transport: tcp") {
		t.Errorf("facts line is %v", facts)
	}
}

func TestRenderGolden(t *testing.T) {
	got := renderFixture(t, Options{})
	golden := filepath.Join("testdata", "pipeline.svg")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./timeline -run TestRenderGolden -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := 0; i < min(len(gl), len(wl)); i++ {
			if gl[i] != wl[i] {
				t.Fatalf("SVG differs from %s at line %d:\n got: %s\nwant: %s\n(if the change is intended, rerun with -update and look at the result)", golden, i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("SVG differs from %s in length: %d lines, want %d", golden, len(gl), len(wl))
	}
}

func TestRenderDeterministic(t *testing.T) {
	a := renderFixture(t, Options{})
	for i := 0; i < 5; i++ {
		if b := renderFixture(t, Options{}); !bytes.Equal(a, b) {
			t.Fatal("two renders of the same trace differ")
		}
	}
}

// barsOf returns the bars of the lane with the given pid and stage.
func barsOf(t *testing.T, svg *node, pid, stage string) map[string]*node {
	t.Helper()
	out := map[string]*node{}
	for _, l := range svg.find(hasClass("lane")) {
		if l.attrs["data-pid"] == pid && l.attrs["data-stage"] == stage {
			for _, b := range l.find(hasClass("bar")) {
				out[b.attrs["data-bucket"]] = b
			}
			return out
		}
	}
	t.Fatalf("no lane pid %s stage %s", pid, stage)
	return nil
}

func TestRenderOverlap(t *testing.T) {
	// Double buffering: bucket 1 is packed while bucket 0 is broadcast;
	// bucket 2 is packed only after bucket 0's broadcast ended.
	tr := mustRead(t, traceJSON(t,
		processName(0, "rank 0 (sender)"), threadName(0, 1, "pack"), threadName(0, 2, "broadcast"),
		span(0, 1, "pack", 0, 0, 5),
		span(0, 1, "pack", 1, 10, 30),
		span(0, 1, "pack", 2, 50, 10),
		span(0, 2, "broadcast", 0, 5, 25),
	))
	var buf bytes.Buffer
	if err := Render(&buf, tr, Options{}); err != nil {
		t.Fatal(err)
	}
	svg := parseSVG(t, buf.Bytes())
	pack, bc := barsOf(t, svg, "0", "pack"), barsOf(t, svg, "0", "broadcast")
	xr := func(n *node) (float64, float64) {
		x := n.num(t, "x")
		return x, x + n.num(t, "width")
	}
	overlaps := func(a, b *node) bool {
		a0, a1 := xr(a)
		b0, b1 := xr(b)
		return a0 < b1 && b0 < a1
	}
	if !overlaps(pack["1"], bc["0"]) {
		a0, a1 := xr(pack["1"])
		b0, b1 := xr(bc["0"])
		t.Errorf("pack bucket 1 [%g, %g] does not overlap broadcast bucket 0 [%g, %g]", a0, a1, b0, b1)
	}
	if overlaps(pack["2"], bc["0"]) {
		t.Errorf("pack bucket 2 overlaps broadcast bucket 0, but it starts after it ended")
	}
	if pack["1"].attrs["fill"] == bc["0"].attrs["fill"] {
		t.Errorf("buckets 0 and 1 share the color %s", bc["0"].attrs["fill"])
	}
	// The x scale is linear: pack 1 starts at 10 µs of 60 µs.
	x0, _ := xr(pack["0"])
	_, x1 := xr(pack["2"])
	p0, _ := xr(pack["1"])
	if got := (p0 - x0) / (x1 - x0); got < 0.16 || got > 0.17 {
		t.Errorf("pack bucket 1 starts at %.3f of the axis, want 10/60", got)
	}
}

func TestRenderRowsForOverlappingSpans(t *testing.T) {
	tr := mustRead(t, traceJSON(t,
		span(0, 1, "load", 0, 0, 10),
		span(0, 1, "load", 1, 5, 10),
		span(0, 1, "load", 2, 12, 3),
	))
	var buf bytes.Buffer
	if err := Render(&buf, tr, Options{}); err != nil {
		t.Fatal(err)
	}
	bars := barsOf(t, parseSVG(t, buf.Bytes()), "0", "load")
	y0, y1, y2 := bars["0"].num(t, "y"), bars["1"].num(t, "y"), bars["2"].num(t, "y")
	if y0 == y1 {
		t.Errorf("overlapping buckets 0 and 1 are drawn on the same row (y=%g)", y0)
	}
	if y2 != y0 {
		t.Errorf("bucket 2 starts after bucket 0 ended and should reuse its row: y=%g, want %g", y2, y0)
	}
}

func TestRenderLegend(t *testing.T) {
	var evs []ev
	for k := 0; k < 30; k++ {
		evs = append(evs, span(0, 1, "pack", k, float64(k)*10, 8))
	}
	tr := mustRead(t, traceJSON(t, evs...))
	legendItems := func(opts Options) ([]string, string) {
		var buf bytes.Buffer
		if err := Render(&buf, tr, opts); err != nil {
			t.Fatal(err)
		}
		svg := parseSVG(t, buf.Bytes())
		var items []string
		for _, n := range svg.find(hasClass("legend-item")) {
			items = append(items, n.attrs["data-bucket"])
		}
		text := ""
		for _, g := range svg.find(hasClass("legend")) {
			text = g.allText()
		}
		return items, text
	}
	items, text := legendItems(Options{})
	if len(items) != len(palette) {
		t.Errorf("collapsed legend has %d items, want one per palette color (%d)", len(items), len(palette))
	}
	if !strings.Contains(text, "30 buckets; the colors repeat every 20 buckets") {
		t.Errorf("collapsed legend text %q does not say how colors repeat", text)
	}
	items, _ = legendItems(Options{MaxLegendBuckets: 40})
	if len(items) != 30 {
		t.Errorf("legend with room for 40 buckets has %d items, want 30", len(items))
	}
	items, text = legendItems(Options{MaxLegendBuckets: -1})
	if len(items) != 0 || text != "" {
		t.Errorf("MaxLegendBuckets < 0 still drew a legend: %v", items)
	}
}

func TestRenderUnits(t *testing.T) {
	for _, tc := range []struct {
		dur  float64
		want []string
	}{
		{400, []string{"0 µs", "50 µs", "400 µs"}},
		{2500, []string{"0.0 ms", "0.5 ms", "2.5 ms"}},
		{3.2e6, []string{"0.0 s", "0.5 s", "3.0 s"}},
	} {
		tr := mustRead(t, traceJSON(t, span(0, 1, "pack", 0, 1000, tc.dur)))
		var buf bytes.Buffer
		if err := Render(&buf, tr, Options{}); err != nil {
			t.Fatal(err)
		}
		var ticks []string
		for _, n := range parseSVG(t, buf.Bytes()).find(hasClass("tick")) {
			ticks = append(ticks, n.text)
		}
		all := strings.Join(ticks, ",")
		for _, w := range tc.want {
			if !strings.Contains(","+all+",", ","+w+",") {
				t.Errorf("span %g µs: ticks %s lack %q", tc.dur, all, w)
			}
		}
	}
}

func TestRenderEscapesText(t *testing.T) {
	name := `stage <"&'> x`
	tr := mustRead(t, traceJSON(t, processName(0, "rank <0> & co"), threadName(0, 1, name), span(0, 1, name, 0, 0, 10)))
	var buf bytes.Buffer
	if err := Render(&buf, tr, Options{Title: "a < b", Caption: "cmd --x='<y>'"}); err != nil {
		t.Fatal(err)
	}
	svg := parseSVG(t, buf.Bytes()) // fails on bad escaping
	labels := svg.find(hasClass("lane-label"))
	if len(labels) != 1 || labels[0].text != name {
		t.Errorf("lane label is %v, want %q", labels, name)
	}
}

func TestRenderErrors(t *testing.T) {
	if err := Render(io.Discard, nil, Options{}); err == nil {
		t.Error("Render(nil trace) succeeded")
	}
	tr := mustRead(t, traceJSON(t, processName(0, "rank 0")))
	if err := Render(io.Discard, tr, Options{}); err == nil || !strings.Contains(err.Error(), "nothing to draw") {
		t.Errorf("Render of a trace with only metadata: %v, want a 'nothing to draw' error", err)
	}
	tr = mustRead(t, traceJSON(t, span(0, 1, "pack", 0, 0, 1)))
	werr := errors.New("disk full")
	if err := Render(failWriter{werr}, tr, Options{}); !errors.Is(err, werr) {
		t.Errorf("Render to a failing writer: %v, want it to wrap %v", err, werr)
	}
}

type failWriter struct{ err error }

func (w failWriter) Write([]byte) (int, error) { return 0, w.err }

func TestRenderFile(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "timeline.svg")
	if err := RenderFile("testdata/pipeline.json", out, Options{}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if want := renderFixture(t, Options{}); !bytes.Equal(got, want) {
		t.Error("RenderFile wrote something other than Render's output")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("RenderFile left %d files in the directory, want only the SVG", len(entries))
	}

	err = RenderFile(filepath.Join(dir, "missing.json"), out, Options{})
	if err == nil || !strings.Contains(err.Error(), "missing.json") {
		t.Errorf("RenderFile of a missing trace: %v, want an error naming the file", err)
	}
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"traceEvents": [{"ph": "X", "name": "x", "pid": 0, "tid": 0, "ts": 0}]}`), 0o644)
	err = RenderFile(bad, out, Options{})
	var ve *ValidationError
	if !errors.As(err, &ve) || !strings.Contains(err.Error(), "bad.json") || !strings.Contains(err.Error(), `missing "dur"`) {
		t.Errorf("RenderFile of a broken trace: %v, want a ValidationError naming the file and the missing dur", err)
	}
	err = RenderFile("testdata/pipeline.json", filepath.Join(dir, "no", "such", "dir.svg"), Options{})
	if err == nil || !strings.Contains(err.Error(), "dir.svg") {
		t.Errorf("RenderFile into a missing directory: %v, want an error naming the SVG path", err)
	}
}

// TestRenderLegendRounds: 12 buckets of 3 rounds whose sequence numbers
// skip one per round (the bus's commit message takes it, as the stages
// trace them) are labeled 0–3 in each round, under a heading per round,
// on the legend and on the bars alike; each of the 12 has a color of its
// own; a lane with no spans (the sender's iterate, say) and its table row
// are left out.
func TestRenderLegendRounds(t *testing.T) {
	evs := []ev{threadName(0, 1, "iterate"), threadName(0, 2, "pack"), threadName(0, 3, "idle")}
	for round := 1; round <= 3; round++ {
		for i := range 4 {
			seq := 5*(round-1) + i
			e := span(0, 2, "pack", seq, float64(seq)*10, 8)
			e["args"].(map[string]any)["round"] = round
			evs = append(evs, e)
		}
	}
	var buf bytes.Buffer
	if err := Render(&buf, mustRead(t, traceJSON(t, evs...)), Options{}); err != nil {
		t.Fatal(err)
	}
	svg := parseSVG(t, buf.Bytes())
	var labels, headings []string
	fills := map[string]string{}
	for _, n := range svg.find(hasClass("legend-item")) {
		labels = append(labels, n.allText())
		for _, r := range n.find(func(c *node) bool { return c.name == "rect" }) {
			fills[n.attrs["data-bucket"]] = r.attrs["fill"]
		}
	}
	for _, n := range svg.find(hasClass("legend-round")) {
		headings = append(headings, n.text)
	}
	if got := strings.Join(labels, ","); got != "0,1,2,3,0,1,2,3,0,1,2,3" {
		t.Errorf("legend labels %s; want 0–3 for each round", got)
	}
	if got := strings.Join(headings, ","); got != "round 1,round 2,round 3" {
		t.Errorf("legend headings %q; want one per round", got)
	}
	colors := map[string]bool{}
	for _, f := range fills {
		colors[f] = true
	}
	if len(fills) != 12 || len(colors) != 12 {
		t.Errorf("12 buckets have %d distinct colors: %v", len(colors), fills)
	}
	bars := barsOf(t, svg, "0", "pack")
	for seq, want := range map[string]string{"0": "0", "5": "0", "8": "3", "13": "3"} {
		if bars[seq].attrs["fill"] != fills[seq] {
			t.Errorf("bucket %s: bar fill %s, legend fill %s", seq, bars[seq].attrs["fill"], fills[seq])
		}
		if title := bars[seq].allText(); !strings.Contains(title, "bucket "+want+" of round") || !strings.Contains(title, "sequence number "+seq) {
			t.Errorf("bucket %s's tooltip %q does not name it as bucket %s of its round", seq, title, want)
		}
	}
	var lanes []string
	for _, n := range svg.find(hasClass("lane-label")) {
		lanes = append(lanes, n.text)
	}
	if got := strings.Join(lanes, ","); got != "pack" {
		t.Errorf("lanes %q; want only pack (iterate and idle have no spans)", got)
	}
	if text := svg.find(hasClass("summary"))[0].allText(); strings.Contains(text, "iterate") || strings.Contains(text, "idle") {
		t.Errorf("the table lists a stage without spans:\n%s", text)
	}
}
