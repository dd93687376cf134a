package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/weightcast/weightcast/dtype"
)

// ui writes progress to standard error: a live line on a terminal, one
// line per finished round otherwise.
type ui struct {
	mu     sync.Mutex
	w      io.Writer
	tty    bool
	rounds int
	live   bool // a live line is on screen
	last   time.Time
}

func (u *ui) event(ev event) {
	u.mu.Lock()
	defer u.mu.Unlock()
	switch ev.Type {
	case "progress":
		if !u.tty || time.Since(u.last) < 100*time.Millisecond {
			return
		}
		u.last = time.Now()
		rate := ""
		if ev.Elapsed > 0 {
			rate = humanize.Bytes(uint64(float64(ev.Bytes)/ev.Elapsed)) + "/s"
		}
		fmt.Fprintf(u.w, "\r\033[Kround %d/%d  %s of %s  %s", ev.Round, u.rounds,
			humanize.IBytes(uint64(ev.Bytes)), humanize.IBytes(uint64(ev.Total)), rate)
		u.live = true
	case "round":
		u.clear()
		fmt.Fprintf(u.w, "round %d/%d  %s in %.3f s  %s/s\n", ev.Round, u.rounds,
			humanize.IBytes(uint64(ev.Bytes)), ev.Elapsed, humanize.Bytes(uint64(float64(ev.Bytes)/max(ev.Elapsed, 1e-9))))
	}
}

// line writes a line from a rank process.
func (u *ui) line(s string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.clear()
	fmt.Fprintln(u.w, s)
}

func (u *ui) say(format string, a ...any) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.clear()
	fmt.Fprintf(u.w, format+"\n", a...)
}

func (u *ui) clear() {
	if u.live {
		fmt.Fprint(u.w, "\r\033[K")
		u.live = false
	}
}

// summary is the demo's result; --json prints it as one object.
type summary struct {
	Transport       string    `json:"transport"`
	TransportReason string    `json:"transport_reason"`
	Ranks           int       `json:"ranks"`
	Mode            string    `json:"mode"`
	Model           string    `json:"model"`
	Bytes           int64     `json:"bytes"`
	Tensors         int       `json:"tensors"`
	Bucket          int64     `json:"bucket"`
	Rounds          int       `json:"rounds"`
	Seconds         []float64 `json:"seconds"`
	GBps            float64   `json:"gbps"`
	Verified        bool      `json:"verified"`
	// Checksum says whether every bucket carried a checksum that every
	// receiver checked (--checksum).
	Checksum bool `json:"checksum"`
	// Committed is the last model version committed on every receiver:
	// the lowest any receiver reports (the sender's, when it reports
	// alone).
	Committed  uint64        `json:"committed_version"`
	MaxBuffers int           `json:"max_buffers"`
	PeakRSS    int64         `json:"peak_rss_bytes"`
	Trace      string        `json:"trace,omitempty"`
	Timeline   string        `json:"timeline,omitempty"`
	PerRank    []*rankResult `json:"per_rank"`
	Error      string        `json:"error,omitempty"`
}

func summarize(c *config, transportName, reason, mode string, results []*rankResult) *summary {
	s := &summary{
		Transport: transportName, TransportReason: reason, Ranks: c.ranks, Mode: mode,
		Model:  fmt.Sprintf("synthetic %s, %d tensors, %s, seed %d", humanize.IBytes(uint64(c.size)), c.tensors, dtypeList(c), c.seed),
		Bucket: c.bucket, Rounds: c.rounds, Trace: c.trace, Timeline: c.timeline, PerRank: results,
		Verified: c.verify, Checksum: c.checksum,
	}
	if m, err := c.model(0); err == nil {
		s.Bytes, s.Tensors = m.Size(), len(m.List())
	}
	if c.modelPath != "" {
		s.Model = fmt.Sprintf("checkpoint %s, %d tensors", c.modelPath, s.Tensors)
		if c.castTo != dtype.Invalid {
			s.Model += ", cast to " + c.castTo.String()
		}
	}
	var failed []string
	receivers := 0
	for _, r := range results {
		if r != nil && r.Rank > 0 {
			if receivers == 0 || r.CommittedVersion < s.Committed {
				s.Committed = r.CommittedVersion
			}
			receivers++
		}
	}
	if receivers == 0 && len(results) > 0 && results[0] != nil {
		s.Committed = results[0].CommittedVersion
	}
	for _, r := range results {
		if r == nil {
			continue
		}
		if r.Error != "" {
			failed = append(failed, fmt.Sprintf("rank %d: %s", r.Rank, r.Error))
		}
		if r.Rank > 0 && c.verify && !r.Verified {
			s.Verified = false
		}
		s.MaxBuffers = max(s.MaxBuffers, r.MaxBuffers)
		s.PeakRSS = max(s.PeakRSS, r.PeakRSS)
	}
	if len(results) > 0 && results[0] != nil {
		for _, rr := range results[0].Rounds {
			s.Seconds = append(s.Seconds, rr.Seconds)
		}
	}
	if len(s.Seconds) > 0 {
		sorted := slices.Clone(s.Seconds)
		slices.Sort(sorted)
		med := sorted[len(sorted)/2]
		if len(sorted)%2 == 0 {
			med = (sorted[len(sorted)/2-1] + sorted[len(sorted)/2]) / 2
		}
		s.GBps = float64(s.Bytes) / med / 1e9
	}
	if len(failed) > 0 {
		s.Error = strings.Join(failed, "; ")
		s.Verified = false
	}
	return s
}

func dtypeList(c *config) string {
	out := make([]string, len(c.dtypes))
	for i, d := range c.dtypes {
		out[i] = d.String()
	}
	return strings.Join(out, "+")
}

func (s *summary) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}

// writeTable prints the summary for a person.
func (s *summary) writeTable(w io.Writer) {
	fmt.Fprintf(w, "\nweightcast demo: %d ranks (1 sender, %d receivers) as %s, transport %s (%s)\n",
		s.Ranks, s.Ranks-1, s.Mode, s.Transport, s.TransportReason)
	fmt.Fprintf(w, "model: %s = %s; buckets of %s\n\n", s.Model, humanize.IBytes(uint64(s.Bytes)), humanize.IBytes(uint64(s.Bucket)))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "round\tseconds\trate\t")
	for i, sec := range s.Seconds {
		fmt.Fprintf(tw, "%d\t%.3f\t%s/s\t\n", i+1, sec, humanize.Bytes(uint64(float64(s.Bytes)/max(sec, 1e-9))))
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintf(w, "median rate:   %.2f GB/s per receiver (%d receivers)\n", s.GBps, s.Ranks-1)
	switch {
	case s.Error != "":
		fmt.Fprintf(w, "verified:      no, the run failed\n")
	case s.Verified:
		scope := "every round"
		for _, r := range s.PerRank {
			if r != nil && r.Rank > 0 && r.VerifyScope != "" {
				scope = r.VerifyScope
			}
		}
		fmt.Fprintf(w, "verified:      yes, every byte on %d receivers (%s)\n", s.Ranks-1, scope)
	default:
		fmt.Fprintf(w, "verified:      not checked (--verify=false)\n")
	}
	if s.Checksum {
		fmt.Fprintf(w, "checksums:     every bucket, checked by every receiver\n")
	} else {
		fmt.Fprintf(w, "checksums:     off (--checksum=false)\n")
	}
	s.writeCommitted(w)
	fmt.Fprintf(w, "buffers held:  at most %d per rank\n", s.MaxBuffers)
	for _, r := range s.PerRank {
		switch {
		case r == nil:
		case r.GPUMemory > 0:
			fmt.Fprintf(w, "GPU memory:    rank %d held %s on %s (driver's figure: buckets, model, transport)\n", r.Rank, humanize.IBytes(uint64(r.GPUMemory)), r.Device)
		case r.GPUBuffers > 0:
			fmt.Fprintf(w, "GPU memory:    rank %d allocated %s on %s (two buckets and its model)\n", r.Rank, humanize.IBytes(uint64(r.GPUBuffers)), r.Device)
		}
	}
	if s.PeakRSS > 0 {
		fmt.Fprintf(w, "peak memory:   %s RSS on the largest rank\n", humanize.IBytes(uint64(s.PeakRSS)))
	}
	if s.Trace != "" {
		fmt.Fprintf(w, "trace:         %s (open in https://ui.perfetto.dev or chrome://tracing)\n", s.Trace)
	}
	if s.Timeline != "" {
		fmt.Fprintf(w, "timeline:      %s\n", s.Timeline)
	}
	if s.Error != "" {
		fmt.Fprintf(w, "\nFAILED: %s\n", s.Error)
	}
}

// writeCommitted prints the committed version: one line when every rank
// agrees and none failed, else one line per rank.
func (s *summary) writeCommitted(w io.Writer) {
	var ranks []*rankResult
	same := true
	for _, r := range s.PerRank {
		if r == nil {
			continue
		}
		ranks = append(ranks, r)
		same = same && r.CommittedVersion == s.Committed && r.State == ""
	}
	switch {
	case len(ranks) == 1:
		r := ranks[0]
		fmt.Fprintf(w, "committed:     version %d on every receiver, as rank %d saw it%s\n", r.CommittedVersion, r.Rank, stateText(r))
	case same:
		fmt.Fprintf(w, "committed:     version %d on every receiver\n", s.Committed)
	default:
		fmt.Fprintf(w, "committed:     version %d on every receiver; by rank:\n", s.Committed)
		for _, r := range ranks {
			fmt.Fprintf(w, "               rank %d: version %d%s\n", r.Rank, r.CommittedVersion, stateText(r))
		}
	}
}

func stateText(r *rankResult) string {
	if r.State == "" {
		return ""
	}
	return ", model " + r.State
}

func sizeText(n int64) string { return humanize.IBytes(uint64(n)) }
