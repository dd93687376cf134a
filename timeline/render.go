package timeline

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/dustin/go-humanize"
)

// Options control Render. The zero value gives a 1200 px wide chart titled
// "weightcast pipeline timeline" with the trace's otherData.command as caption.
type Options struct {
	// Width is the SVG width in pixels; 0 means 1200. It grows where the
	// lane labels or the summary table need more room.
	Width int
	// Title is drawn at the top; "" means "weightcast pipeline timeline".
	Title string
	// Caption is drawn under the title in a fixed-width font, wrapped;
	// "" means the trace's otherData "command" string, if any.
	Caption string
	// MaxLegendBuckets is how many buckets the color legend lists one by
	// one; with more buckets it shows one swatch per palette color instead.
	// 0 means 20, the palette's size; a negative value leaves the legend
	// out.
	MaxLegendBuckets int
}

const (
	defaultWidth     = 1200
	defaultTitle     = "weightcast pipeline timeline"
	defaultMaxLegend = 20

	margin     = 24.0
	rowH       = 20.0 // one row of a lane
	barH       = 14.0
	headerH    = 24.0 // a rank's name band
	counterH   = 32.0
	groupGap   = 10.0
	tickSpaceX = 90.0 // at least this many pixels between time ticks

	fontSans = "DejaVu Sans, Verdana, Helvetica, Arial, sans-serif"
	fontMono = "DejaVu Sans Mono, Menlo, Consolas, monospace"

	colorText     = "#1f2328"
	colorMuted    = "#59636e"
	colorGrid     = "#dde1e6"
	colorHeader   = "#e9edf2"
	colorStripe   = "#f6f8fa"
	colorNoBucket = "#d5d9de"
	colorNoStroke = "#7d8792"
	colorCounter  = "#3d4a57"
	colorUtil     = "#5b7087"
)

// palette is the categorical palette for buckets: Tableau 10, then the
// lighter companion of each of its hues. A chart's buckets are counted in
// order of their sequence numbers, and the k-th is drawn in
// palette[k % len(palette)] on every lane of every rank, so that one
// bucket can be followed through the stages, two buckets in flight at once
// (double buffering) stand out, and no two of the first 20 share a color.
var palette = []string{
	"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
	"#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
	"#a0cbe8", "#ffbe7d", "#ff9d9a", "#b3dcd8", "#8cd17d",
	"#f6e3a1", "#d4a6c8", "#fbd3d9", "#d7b5a6", "#79706e",
}

// paletteInk is the text color that reads on each palette color.
var paletteInk = []string{
	"#ffffff", "#1f2328", "#ffffff", "#1f2328", "#ffffff",
	"#1f2328", "#ffffff", "#1f2328", "#ffffff", "#1f2328",
	"#1f2328", "#1f2328", "#1f2328", "#1f2328", "#1f2328",
	"#1f2328", "#1f2328", "#1f2328", "#1f2328", "#ffffff",
}

// BucketColor is the fill Render uses for the k-th bucket of a chart (its
// buckets counted from 0 in order of sequence number), and the fill of
// spans without a bucket for NoBucket.
func BucketColor(k int) string {
	if k < 0 {
		return colorNoBucket
	}
	return palette[k%len(palette)]
}

// Render writes t as an SVG Gantt chart: one lane per stage per rank,
// grouped by rank, bars colored by bucket with a tooltip each, counters as
// step lines under their rank's lanes, a time axis, a bucket color legend
// and a per-stage utilization table. The output depends only on t and
// opts, byte for byte.
func Render(w io.Writer, t *Trace, opts Options) error {
	if t == nil {
		return errors.New("timeline: Render needs a trace, got nil")
	}
	start, end, ok := t.Bounds()
	if !ok {
		return errors.New("timeline: the trace has nothing to draw: no complete (\"X\"), begin/end, instant or counter events")
	}
	r := newRenderer(t, opts, start, end)
	var buf bytes.Buffer
	r.write(&buf)
	if _, err := w.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("timeline: write SVG: %w", err)
	}
	return nil
}

// RenderFile reads the trace at tracePath and writes its chart to svgPath
// (replacing it atomically: the SVG is written next to it and renamed).
func RenderFile(tracePath, svgPath string, opts Options) error {
	f, err := os.Open(tracePath)
	if err != nil {
		return fmt.Errorf("timeline: open trace: %w", err)
	}
	t, err := Read(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", tracePath, err)
	}
	var buf bytes.Buffer
	if err := Render(&buf, t, opts); err != nil {
		return fmt.Errorf("%s: %w", tracePath, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(svgPath), "."+filepath.Base(svgPath)+".*")
	if err != nil {
		return fmt.Errorf("timeline: create SVG next to %s: %w", svgPath, err)
	}
	_, werr := tmp.Write(buf.Bytes())
	cerr := tmp.Close()
	if werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Chmod(tmp.Name(), 0o644)
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), svgPath)
	}
	if werr != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("timeline: write %s: %w", svgPath, werr)
	}
	return nil
}

// renderer holds the layout of one chart.
type renderer struct {
	t     *Trace
	opts  Options
	stats []StageStats

	t0, span         float64 // µs: time origin and length of the axis
	width            float64
	labelW           float64
	chartX0, chartX1 float64
	buckets          []int // distinct bucket numbers, sorted
	noBucket         bool  // some span has no bucket
	// Each bucket's place: its index among buckets (its color), its
	// round (NoRound when no span of it says), and its index among the
	// buckets of that round (its label). rounds are the rounds with
	// buckets, in order.
	order, roundOf, inRound map[int]int
	rounds                  []int
}

func newRenderer(t *Trace, opts Options, start, end float64) *renderer {
	if opts.Width <= 0 {
		opts.Width = defaultWidth
	}
	if opts.Title == "" {
		opts.Title = defaultTitle
	}
	if opts.Caption == "" {
		if c, ok := t.OtherData["command"].(string); ok {
			opts.Caption = c
		}
	}
	if opts.MaxLegendBuckets == 0 {
		opts.MaxLegendBuckets = defaultMaxLegend
	}
	// The table, as the lanes, leaves out stages that did nothing.
	stats := slices.DeleteFunc(Utilization(t), func(s StageStats) bool { return s.Items == 0 })
	r := &renderer{t: t, opts: opts, stats: stats, t0: start, span: end - start}
	if r.span <= 0 {
		r.span = 1
	}
	r.roundOf = map[int]int{}
	labelW := 0.0
	for _, p := range t.Processes {
		for _, l := range p.Lanes {
			if empty(l) {
				continue
			}
			labelW = max(labelW, textW(l.Name, 12))
			for _, s := range l.Spans {
				if s.Bucket == NoBucket {
					r.noBucket = true
					continue
				}
				round, seen := r.roundOf[s.Bucket]
				if !seen {
					r.buckets = append(r.buckets, s.Bucket)
					r.roundOf[s.Bucket] = s.Round
				} else if round == NoRound {
					r.roundOf[s.Bucket] = s.Round
				}
			}
		}
		for _, c := range p.Counters {
			labelW = max(labelW, textW(c.Name, 12))
		}
	}
	sort.Ints(r.buckets)
	r.order, r.inRound = map[int]int{}, map[int]int{}
	count := map[int]int{}
	for i, k := range r.buckets {
		round := r.roundOf[k]
		r.order[k], r.inRound[k] = i, count[round]
		if count[round] == 0 {
			r.rounds = append(r.rounds, round)
		}
		count[round]++
	}
	sort.Ints(r.rounds)
	r.labelW = max(110, math.Ceil(labelW)+32)
	r.width = max(float64(opts.Width), 2*margin+r.labelW+320, 2*margin+r.tableWidth())
	r.chartX0 = margin + r.labelW
	r.chartX1 = r.width - margin - 12
	return r
}

// x maps a trace time in µs to a horizontal pixel position.
func (r *renderer) x(us float64) float64 {
	return r.chartX0 + (us-r.t0)/r.span*(r.chartX1-r.chartX0)
}

// svg accumulates markup.
type svg struct{ strings.Builder }

func (b *svg) f(format string, a ...any) { fmt.Fprintf(b, format, a...) }

// text writes a <text> element; attrs are written verbatim.
func (b *svg) text(x, y float64, s, attrs string) {
	b.f(`<text x="%s" y="%s"%s>%s</text>`+"\n", px(x), px(y), attrs, esc(s))
}

func (r *renderer) write(out *bytes.Buffer) {
	var head, bg, grid, fg svg
	y := margin

	// Title, caption, facts.
	head.text(margin, y+16, r.opts.Title, ` class="title" font-size="18" font-weight="bold" fill="`+colorText+`"`)
	y += 30
	wrapW := r.width - 2*margin
	if r.opts.Caption != "" {
		for _, line := range wrap(r.opts.Caption, int(wrapW/(11*0.61))) {
			head.text(margin, y+11, line, ` class="caption" font-family="`+fontMono+`" font-size="11" fill="`+colorText+`"`)
			y += 16
		}
	}
	for _, line := range wrap(r.facts(), int(wrapW/(11*0.62))) {
		head.text(margin, y+11, line, ` class="facts" font-size="11" fill="`+colorMuted+`"`)
		y += 16
	}
	y += 8

	// Legend.
	if r.opts.MaxLegendBuckets > 0 && (len(r.buckets) > 0 || r.noBucket) {
		y = r.legend(&head, y) + 12
	}

	// Lanes, rank by rank.
	var blocks [][2]float64 // vertical extent of each rank's lanes, for the grid
	for _, p := range r.t.Processes {
		bg.f(`<rect x="%s" y="%s" width="%s" height="%s" fill="%s"/>`+"\n", px(margin), px(y), px(r.width-2*margin), px(headerH), colorHeader)
		fg.f(`<g class="rank" data-pid="%d" data-name="%s">`+"\n", p.PID, esc(p.Name))
		fg.text(margin+8, y+16.5, p.Name, ` class="rank-label" font-size="13" font-weight="bold" fill="`+colorText+`"`)
		for _, in := range p.Instants {
			r.instant(&fg, in, p.Name, y+headerH-8)
		}
		y += headerH
		blockTop := y
		li := -1
		for _, l := range p.Lanes {
			if empty(l) {
				continue // a stage that did nothing on this rank
			}
			li++
			h := float64(l.Depth) * rowH
			if li%2 == 1 {
				bg.f(`<rect x="%s" y="%s" width="%s" height="%s" fill="%s"/>`+"\n", px(margin), px(y), px(r.width-2*margin), px(h), colorStripe)
			}
			r.lane(&fg, p, l, y)
			y += h
		}
		for ci, c := range p.Counters {
			if (li+1+ci)%2 == 1 {
				bg.f(`<rect x="%s" y="%s" width="%s" height="%s" fill="%s"/>`+"\n", px(margin), px(y), px(r.width-2*margin), px(counterH), colorStripe)
			}
			r.counter(&fg, c, y)
			y += counterH
		}
		fg.f("</g>\n")
		blocks = append(blocks, [2]float64{blockTop, y})
		y += groupGap
	}
	chartBottom := y - groupGap

	// Grid and axis.
	ticks, unit, dec := axisTicks(r.span, int((r.chartX1-r.chartX0)/tickSpaceX))
	grid.f(`<g class="grid" stroke="%s" stroke-width="1">`+"\n", colorGrid)
	for _, tk := range ticks {
		x := r.x(r.t0 + tk)
		for _, bl := range blocks {
			grid.f(`<line x1="%s" y1="%s" x2="%s" y2="%s"/>`+"\n", px(x), px(bl[0]), px(x), px(bl[1]))
		}
	}
	grid.f("</g>\n")
	ay := chartBottom + 4
	fg.f(`<g class="axis" font-size="11" fill="%s">`+"\n", colorText)
	fg.f(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s"/>`+"\n", px(r.chartX0), px(ay), px(r.chartX1), px(ay), colorMuted)
	for _, tk := range ticks {
		x := r.x(r.t0 + tk)
		fg.f(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s"/>`+"\n", px(x), px(ay), px(x), px(ay+5), colorMuted)
		fg.text(x, ay+18, formatTick(tk, unit, dec), ` class="tick" text-anchor="middle"`)
	}
	fg.text((r.chartX0+r.chartX1)/2, ay+36, "time since the first event", ` class="axis-title" text-anchor="middle" fill="`+colorMuted+`"`)
	fg.f("</g>\n")
	y = ay + 58

	// Utilization table.
	y = r.summary(&fg, y)
	height := math.Ceil(y + margin)

	out.WriteString(`<?xml version="1.0" encoding="UTF-8"?>` + "\n")
	fmt.Fprintf(out, `<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" viewBox="0 0 %s %s" font-family="%s" font-size="12">`+"\n",
		px(r.width), px(height), px(r.width), px(height), fontSans)
	fmt.Fprintf(out, "<title>%s</title>\n", esc(r.opts.Title))
	fmt.Fprintf(out, `<rect class="background" width="%s" height="%s" fill="#ffffff"/>`+"\n", px(r.width), px(height))
	out.WriteString(head.String())
	out.WriteString(bg.String())
	out.WriteString(grid.String())
	out.WriteString(fg.String())
	out.WriteString("</svg>\n")
}

// facts is the line under the caption: wall time, ranks, buckets and the
// trace's otherData (but the command, which is the caption).
func (r *renderer) facts() string {
	parts := []string{}
	if s, e, ok := r.t.spanBounds(); ok {
		parts = append(parts, "wall "+formatDuration(e-s))
	}
	parts = append(parts, plural(len(r.t.Processes), "rank"))
	if len(r.buckets) > 0 {
		parts = append(parts, plural(len(r.buckets), "bucket"))
	}
	for _, k := range sortedKeys(r.t.OtherData) {
		if k == "command" {
			continue
		}
		v := fmtValue(r.t.OtherData[k])
		if n, ok := r.t.OtherData[k].(json.Number); ok && strings.Contains(k, "bytes") {
			if i, err := n.Int64(); err == nil && i >= 0 {
				v = humanize.IBytes(uint64(i))
			}
		}
		parts = append(parts, k+": "+v)
	}
	return strings.Join(parts, "  ·  ")
}

// legend draws the bucket colors starting at y and returns the y below it.
// Buckets are labeled as their bars are: by their index in their round,
// under a heading per round when the chart has rounds.
func (r *renderer) legend(b *svg, y float64) float64 {
	type item struct {
		bucket  int    // sequence number, NoBucket for the "no bucket" entry
		color   int    // palette index
		label   string // the swatch's label, or a round's heading
		heading bool
	}
	var items []item
	prefix := "bucket"
	note := ""
	if len(r.buckets) <= r.opts.MaxLegendBuckets {
		headings := len(r.rounds) > 1
		for _, round := range r.rounds {
			if headings {
				h := "round " + strconv.Itoa(round)
				if round == NoRound {
					h = "no round"
				}
				items = append(items, item{label: h, heading: true})
			}
			for _, k := range r.buckets {
				if r.roundOf[k] == round {
					items = append(items, item{bucket: k, color: r.order[k], label: strconv.Itoa(r.inRound[k])})
				}
			}
		}
	} else {
		// Collapsed: one swatch per palette color, which the chart's
		// buckets take in turn.
		prefix = "bucket colors, in turn"
		n := min(len(palette), r.opts.MaxLegendBuckets)
		for k := 0; k < n; k++ {
			items = append(items, item{bucket: k, color: k, label: strconv.Itoa(k + 1)})
		}
		in := ""
		if len(r.rounds) > 1 || r.rounds[0] != NoRound {
			in = " in " + plural(len(r.rounds), "round")
		}
		note = fmt.Sprintf("%d buckets%s; the colors repeat every %d buckets", len(r.buckets), in, len(palette))
	}
	if r.noBucket {
		items = append(items, item{bucket: NoBucket, label: "no bucket"})
	}
	b.f(`<g class="legend" font-size="11" fill="%s">`+"\n", colorText)
	x := margin
	b.text(x, y+10, prefix, ` font-weight="bold"`)
	x += textW(prefix, 11) + 10
	rowStart := x
	for _, it := range items {
		if it.heading {
			w := textW(it.label, 11) + 8
			if x+w+40 > r.width-margin {
				x = rowStart
				y += 18
			}
			b.text(x, y+10, it.label, ` class="legend-round" fill="`+colorMuted+`"`)
			x += w
			continue
		}
		w := 16 + textW(it.label, 11) + 12
		if x+w > r.width-margin {
			x = rowStart
			y += 18
		}
		b.f(`<g class="legend-item" data-bucket="%s">`, bucketAttr(it.bucket))
		if it.bucket == NoBucket {
			b.f(`<rect x="%s" y="%s" width="12" height="12" rx="2" fill="%s" stroke="%s"/>`, px(x), px(y), colorNoBucket, colorNoStroke)
		} else {
			b.f(`<rect x="%s" y="%s" width="12" height="12" rx="2" fill="%s"/>`, px(x), px(y), BucketColor(it.color))
		}
		b.f(`<text x="%s" y="%s">%s</text></g>`+"\n", px(x+16), px(y+10), esc(it.label))
		x += w
	}
	if note != "" {
		w := textW(note, 11)
		if x+w > r.width-margin {
			x = rowStart
			y += 18
		}
		b.text(x+4, y+10, note, ` fill="`+colorMuted+`"`)
	}
	b.f("</g>\n")
	return y + 14
}

// empty reports whether a lane has nothing to draw: a stage that did no
// work on its rank (a sender's iterate lane, say). Render leaves it out.
func empty(l *Lane) bool { return len(l.Spans) == 0 && len(l.Instants) == 0 }

// lane draws one lane's label, bars and instants with its top at y.
func (r *renderer) lane(b *svg, p *Process, l *Lane, y float64) {
	b.f(`<g class="lane" data-pid="%d" data-tid="%d" data-stage="%s">`+"\n", l.PID, l.TID, esc(l.Name))
	b.text(r.chartX0-10, y+rowH/2+4, l.Name, ` class="lane-label" text-anchor="end" fill="`+colorText+`"`)
	for _, s := range l.Spans {
		x0, x1 := r.x(s.Start), r.x(s.End())
		w := max(x1-x0, 0.5)
		by := y + float64(s.Row)*rowH + (rowH-barH)/2
		rx := ""
		if w > 4 {
			rx = ` rx="2"`
		}
		fill, stroke, ink, label := colorNoBucket, "", colorText, s.Name
		if s.Bucket != NoBucket {
			k := r.order[s.Bucket]
			fill, ink = BucketColor(k), paletteInk[k%len(palette)]
			label = strconv.Itoa(r.inRound[s.Bucket])
		} else {
			stroke = ` stroke="` + colorNoStroke + `" stroke-width="0.75"`
		}
		b.f(`<rect class="bar" data-bucket="%s" x="%s" y="%s" width="%s" height="%s"%s fill="%s"%s><title>%s</title></rect>`+"\n",
			bucketAttr(s.Bucket), px(x0), px(by), px(w), px(barH), rx, fill, stroke, esc(r.tooltip(p, s)))
		if lw := textW(label, 10); w >= lw+6 {
			b.text(x0+w/2, by+barH/2+3.5, label, ` class="bar-label" text-anchor="middle" font-size="10" fill="`+ink+`" pointer-events="none"`)
		}
	}
	for _, in := range l.Instants {
		r.instant(b, in, l.Name, y)
	}
	b.f("</g>\n")
}

// instant draws a small downward triangle at the instant's time, top at y.
func (r *renderer) instant(b *svg, in Instant, where string, y float64) {
	x := r.x(in.TS)
	b.f(`<path class="instant" d="M%s %sL%s %sL%s %sZ" fill="%s"><title>%s</title></path>`+"\n",
		px(x-4), px(y+1), px(x+4), px(y+1), px(x), px(y+8), colorText,
		esc(fmt.Sprintf("%s (%s)\nat %s", in.Name, where, formatDuration(in.TS-r.t0))))
}

// counter draws a counter's step line in a row with its top at y.
func (r *renderer) counter(b *svg, c *Counter, y float64) {
	maxV := 0.0
	for _, pt := range c.Points {
		for _, v := range pt.Values {
			maxV = max(maxV, v)
		}
	}
	scale := maxV
	if scale <= 0 {
		scale = 1
	}
	yOf := func(v float64) float64 { return y + counterH - 5 - v/scale*(counterH-12) }
	b.f(`<g class="counter" data-pid="%d" data-name="%s">`+"\n", c.PID, esc(c.Name))
	b.text(r.chartX0-10, y+14, c.Name, ` class="counter-label" text-anchor="end" fill="`+colorText+`"`)
	b.text(r.chartX0-10, y+26, "0 – "+fmtNum(maxV), ` text-anchor="end" font-size="10" fill="`+colorMuted+`"`)
	endX := r.x(r.t0 + r.span)
	for si, name := range c.Series {
		color := colorCounter
		if len(c.Series) > 1 {
			color = palette[si%len(palette)]
		}
		var d strings.Builder
		for i, pt := range c.Points {
			x, v := r.x(pt.TS), yOf(pt.Values[si])
			if i == 0 {
				fmt.Fprintf(&d, "M%s %s", px(x), px(v))
			} else {
				fmt.Fprintf(&d, "H%sV%s", px(x), px(v))
			}
		}
		if len(c.Points) > 0 {
			fmt.Fprintf(&d, "H%s", px(endX))
			x0 := r.x(c.Points[0].TS)
			if len(c.Series) == 1 {
				b.f(`<path d="%sV%sH%sZ" fill="%s" fill-opacity="0.15" stroke="none"/>`+"\n", d.String(), px(yOf(0)), px(x0), color)
			}
			b.f(`<path class="counter-line" d="%s" fill="none" stroke="%s" stroke-width="1.5"><title>%s</title></path>`+"\n",
				d.String(), color, esc(fmt.Sprintf("%s: %s (max %s)", c.Name, name, fmtNum(maxV))))
		}
	}
	b.f("</g>\n")
}

// tooltip is the text of a bar's <title>.
func (r *renderer) tooltip(p *Process, s Span) string {
	var b strings.Builder
	stage := s.Stage
	if stage == "" {
		stage = "?"
	}
	fmt.Fprintf(&b, "%s: %s (%s)", stage, s.Name, p.Name)
	var ids []string
	switch round := r.roundOf[s.Bucket]; {
	case s.Bucket != NoBucket && round != NoRound:
		ids = append(ids, fmt.Sprintf("bucket %d of round %d (sequence number %d)", r.inRound[s.Bucket], round, s.Bucket))
	case s.Bucket != NoBucket:
		ids = append(ids, fmt.Sprintf("bucket %d (sequence number %d)", r.inRound[s.Bucket], s.Bucket))
	case s.Round != NoRound:
		ids = append(ids, "round "+strconv.Itoa(s.Round))
	}
	if len(ids) > 0 {
		b.WriteString("\n" + strings.Join(ids, ", "))
	}
	fmt.Fprintf(&b, "\nstart %s, duration %s", formatDuration(s.Start-r.t0), formatDuration(s.Dur))
	if s.Bytes > 0 {
		b.WriteString("\n" + humanize.IBytes(uint64(s.Bytes)))
		if s.Dur > 0 {
			b.WriteString(" at " + rate(float64(s.Bytes)/(s.Dur/1e6)))
		}
	}
	return b.String()
}

// Table columns: rank and stage left-aligned, the rest right-aligned at
// the offsets below from the end of the stage column.
var tableCols = []struct {
	head  string
	right float64 // right edge, from the end of the stage column
}{
	{"spans", 50},
	{"busy", 145},
	{"% of wall", 320},
	{"bytes", 420},
	{"throughput", 530},
}

const utilBarW = 100.0

func (r *renderer) tableGeometry() (rankW, stageW float64) {
	rankW, stageW = textW("rank", 11), textW("stage", 11)
	for _, s := range r.stats {
		rankW = max(rankW, textW(s.Process, 11))
		stageW = max(stageW, textW(s.Stage, 11))
	}
	return math.Ceil(rankW) + 20, math.Ceil(stageW) + 20
}

func (r *renderer) tableWidth() float64 {
	rankW, stageW := r.tableGeometry()
	return rankW + stageW + tableCols[len(tableCols)-1].right
}

// summary draws the utilization table with its top at y; returns its bottom.
func (r *renderer) summary(b *svg, y float64) float64 {
	rankW, stageW := r.tableGeometry()
	c0, c1 := margin, margin+rankW
	base := c1 + stageW
	tw := r.tableWidth()
	wall := 0.0
	if len(r.stats) > 0 {
		wall = float64(r.stats[0].Wall.Nanoseconds()) / 1e3
	}
	b.f(`<g class="summary" font-size="11" fill="%s">`+"\n", colorText)
	b.text(c0, y+12, "Per-stage utilization", ` font-size="14" font-weight="bold"`)
	y += 18
	note := "busy time of each stage as a share of the wall time, " + formatDuration(wall) + " from the first span to the last on any rank"
	for _, line := range wrap(note, int((r.width-2*margin)/(11*0.62))) {
		b.text(c0, y+12, line, ` fill="`+colorMuted+`"`)
		y += 15
	}
	y += 8
	b.text(c0, y+11, "rank", ` class="col-head" font-weight="bold"`)
	b.text(c1, y+11, "stage", ` class="col-head" font-weight="bold"`)
	for _, col := range tableCols {
		b.text(base+col.right, y+11, col.head, ` class="col-head" text-anchor="end" font-weight="bold"`)
	}
	y += 16
	b.f(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s"/>`+"\n", px(c0), px(y), px(c0+tw), px(y), colorMuted)
	y += 2
	prev := int64(math.MinInt64)
	for i, s := range r.stats {
		if i > 0 && s.Rank != prev {
			b.f(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s"/>`+"\n", px(c0), px(y), px(c0+tw), px(y), colorGrid)
		}
		b.f(`<g class="row" data-pid="%d" data-stage="%s">`+"\n", s.Rank, esc(s.Stage))
		ty := y + 13
		if s.Rank != prev {
			b.text(c0, ty, s.Process, ` font-weight="bold"`)
		}
		prev = s.Rank
		b.text(c1, ty, s.Stage, "")
		util := s.Utilization()
		bytesCol, thrCol := "–", "–"
		if s.Bytes > 0 {
			bytesCol = humanize.IBytes(uint64(s.Bytes))
		}
		if thr := s.Throughput(); thr > 0 {
			thrCol = rate(thr)
		}
		cells := []string{
			strconv.Itoa(s.Items),
			formatDuration(float64(s.Busy.Nanoseconds()) / 1e3),
			strconv.FormatFloat(100*util, 'f', 1, 64) + "%",
			bytesCol,
			thrCol,
		}
		for ci, col := range tableCols {
			b.text(base+col.right, ty, cells[ci], ` text-anchor="end"`)
		}
		// A bar for the utilization, left of its percentage.
		bx := base + tableCols[2].right - 48 - utilBarW
		b.f(`<rect x="%s" y="%s" width="%s" height="8" fill="%s"/>`, px(bx), px(y+5), px(utilBarW), colorHeader)
		b.f(`<rect class="util" x="%s" y="%s" width="%s" height="8" fill="%s"/>`+"\n", px(bx), px(y+5), px(utilBarW*min(1, util)), colorUtil)
		b.f("</g>\n")
		y += 18
	}
	b.f("</g>\n")
	return y
}

// px formats a coordinate with at most two decimals and no trailing zeros.
func px(v float64) string {
	s := strconv.FormatFloat(v, 'f', 2, 64)
	s = strings.TrimRight(s, "0")
	s = strings.TrimSuffix(s, ".")
	if s == "-0" {
		s = "0"
	}
	return s
}

// esc escapes s for XML text and attribute values.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // writing to a strings.Builder cannot fail
	return b.String()
}

// textW estimates the width in pixels of s in the sans font at size px.
// It errs wide, so that labels sized with it do not collide.
func textW(s string, size float64) float64 {
	return float64(utf8.RuneCountInString(s)) * size * 0.62
}

// wrap breaks s into lines of at most width runes, at spaces where it can.
func wrap(s string, width int) []string {
	width = max(width, 20)
	var lines []string
	for _, para := range strings.Split(s, "\n") {
		line := ""
		for _, word := range strings.Fields(para) {
			for utf8.RuneCountInString(word) > width {
				if line != "" {
					lines = append(lines, line)
					line = ""
				}
				rs := []rune(word)
				lines = append(lines, string(rs[:width]))
				word = string(rs[width:])
			}
			switch {
			case line == "":
				line = word
			case utf8.RuneCountInString(line)+1+utf8.RuneCountInString(word) <= width:
				line += " " + word
			default:
				lines = append(lines, line)
				line = word
			}
		}
		if line != "" {
			lines = append(lines, line)
		}
	}
	return lines
}

// rate formats a throughput in bytes per second in SI units ("61 GB/s"),
// the unit link bandwidths are quoted in.
func rate(bps float64) string {
	return humanize.Bytes(uint64(math.Round(bps))) + "/s"
}

func bucketAttr(k int) string {
	if k == NoBucket {
		return "none"
	}
	return strconv.Itoa(k)
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}

// fmtValue formats an otherData value: strings and numbers as written,
// anything else as compact JSON (object keys sorted, so deterministic).
func fmtValue(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case json.Number:
		return v.String()
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Sprint(v)
		}
		return string(b)
	}
}
