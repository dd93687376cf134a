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
	"github.com/weightcast/weightcast/mac"
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

// summary is the demo's result; --json prints it as one object. It states
// only what was measured: a figure that no rank reported is null or absent,
// never zero.
type summary struct {
	Transport       string `json:"transport"`
	TransportReason string `json:"transport_reason"`
	Ranks           int    `json:"ranks"`
	Mode            string `json:"mode"`
	Model           string `json:"model"`
	Bytes           int64  `json:"bytes"`
	Tensors         int    `json:"tensors"`
	Bucket          int64  `json:"bucket"`
	// Senders and TP describe a routed run (--senders, --tp); absent for
	// a broadcast. BytesPerReceiver is then the most bytes a receiver
	// took in a round (its shard), which GBps is counted from, and Plan
	// the plan every rank made.
	Senders          int          `json:"senders,omitempty"`
	TP               int          `json:"tp,omitempty"`
	BytesPerReceiver int64        `json:"bytes_per_receiver,omitempty"`
	Plan             *planSummary `json:"plan,omitempty"`
	// Rounds is the number of rounds asked for (--rounds).
	Rounds int `json:"rounds"`
	// Seconds has the duration of each round the sender finished
	// (committed), as it timed them.
	Seconds []float64 `json:"seconds"`
	// GBps is the median rate of those rounds per receiver; null when no
	// round finished or the sender did not report.
	GBps *float64 `json:"gbps"`
	// Scope says whose reports the summary is made of: "every rank" (a
	// local launch, inproc) or "this rank" (--rank: this process knows
	// only itself; the other ranks' figures are in their own summaries).
	Scope string `json:"scope"`
	// Verified says every receiver checked every byte of every round
	// against the source (--verify), and the run finished; with Scope
	// "this rank", that this receiver did (the sender checks nothing, so
	// its summary says false).
	Verified bool `json:"verified"`
	// Checksum says buckets carried a checksum (--checksum); every
	// receiver checked those of the versions up to CommittedVersion. With
	// a group secret a direct bucket carries its MAC in place of one.
	Checksum bool `json:"checksum"`
	// MAC says every bucket carried a MAC under the group secret
	// (--secret-file), which every receiver checked as it did checksums.
	MAC bool `json:"mac"`
	// BucketMAC names the MAC, with MAC: "blake3" or "poly1305-aes"
	// (--bucket-mac).
	BucketMAC string `json:"bucket_mac,omitempty"`
	// Committed is the last model version committed on every receiver:
	// the sender's figure, or, when it did not report, the lowest a
	// receiver reported; null when no rank reported. Each rank's own is
	// in PerRank.
	Committed  *uint64 `json:"committed_version"`
	MaxBuffers int     `json:"max_buffers"`
	PeakRSS    int64   `json:"peak_rss_bytes"`
	// Trace and Timeline name the files written; TraceError says why
	// they were not.
	Trace      string        `json:"trace,omitempty"`
	Timeline   string        `json:"timeline,omitempty"`
	TraceError string        `json:"trace_error,omitempty"`
	PerRank    []*rankResult `json:"per_rank"`
	// Stopped names the signal that stopped the run (SIGINT, SIGTERM).
	Stopped string `json:"stopped,omitempty"`
	// Error says why the run did not succeed: the ranks that failed, a
	// signal, an output that could not be written.
	Error      string `json:"error,omitempty"`
	ExitStatus int    `json:"exit_status"`

	verifyOn bool     // --verify
	failures []string // what Error says, but the signal
	only     int      // the one rank this process ran (--rank), or -1: every rank reported here
}

// planSummary is a routed run's plan as rank 0 reported it: its digest,
// and its busiest sender's bytes over the mean.
type planSummary struct {
	Digest  string  `json:"digest"`
	Balance float64 `json:"balance"`
}

// inprocMode is the summary's Mode of --transport inproc.
const inprocMode = "goroutines of one process"

func summarize(c *config, transportName, reason, mode string, results []*rankResult) *summary {
	s := &summary{
		Transport: transportName, TransportReason: reason, Ranks: c.ranks, Mode: mode,
		Model:  fmt.Sprintf("synthetic %s, %d tensors, %s, seed %d", humanize.IBytes(uint64(c.size)), c.tensors, dtypeList(c), c.seed),
		Bucket: c.bucket, Rounds: c.rounds, PerRank: results,
		Verified: c.verify, verifyOn: c.verify, Checksum: c.checksum, MAC: c.secret != nil, Seconds: []float64{},
		Scope: "every rank", only: -1,
	}
	if s.MAC {
		k, _ := mac.ParseKind(c.bucketMAC) // parseConfig checked it
		s.BucketMAC = string(k)
	}
	if c.rank >= 0 {
		s.Scope, s.only = "this rank", c.rank
		// The sender checks no received bytes: whether they were
		// verified is in the receivers' own summaries.
		s.Verified = c.verify && c.rank > 0
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
	for _, r := range results {
		if r == nil {
			continue
		}
		if r.Error != "" && r.Stopped == "" {
			failed = append(failed, fmt.Sprintf("rank %d: %s", r.Rank, r.Error))
		}
		if r.Error != "" || r.Unreported || (!c.sends(r.Rank) && c.verify && !r.Verified) {
			s.Verified = false
		}
		s.MaxBuffers = max(s.MaxBuffers, r.MaxBuffers)
		s.PeakRSS = max(s.PeakRSS, r.PeakRSS)
	}
	if sender := reported(results, 0); sender != nil {
		v := sender.CommittedVersion
		s.Committed = &v
		for _, rr := range sender.Rounds {
			s.Seconds = append(s.Seconds, rr.Seconds)
		}
	} else {
		for _, r := range results {
			if r != nil && !r.Unreported && (s.Committed == nil || r.CommittedVersion < *s.Committed) {
				v := r.CommittedVersion
				s.Committed = &v
			}
		}
	}
	perReceiver := s.Bytes
	if c.routed() {
		s.Senders, s.TP = c.senders, c.tp
		for _, r := range results {
			if r != nil && !c.sends(r.Rank) && len(r.Rounds) > 0 {
				s.BytesPerReceiver = max(s.BytesPerReceiver, r.Rounds[len(r.Rounds)-1].BytesReceived)
			}
		}
		if r := reported(results, 0); r != nil && r.Plan != "" {
			s.Plan = &planSummary{Digest: r.Plan, Balance: r.PlanBalance}
		}
		perReceiver = s.BytesPerReceiver
	}
	if len(s.Seconds) > 0 && perReceiver > 0 {
		sorted := slices.Clone(s.Seconds)
		slices.Sort(sorted)
		med := sorted[len(sorted)/2]
		if len(sorted)%2 == 0 {
			med = (sorted[len(sorted)/2-1] + sorted[len(sorted)/2]) / 2
		}
		gbps := float64(perReceiver) / med / 1e9
		s.GBps = &gbps
	}
	for _, f := range failed {
		s.addError(f)
	}
	return s
}

// reported is rank's result, if that rank reported one.
func reported(results []*rankResult, rank int) *rankResult {
	for _, r := range results {
		if r != nil && r.Rank == rank && !r.Unreported {
			return r
		}
	}
	return nil
}

// addError records a failure: the run exits 1 unless a signal stopped it.
func (s *summary) addError(msg string) {
	s.failures = append(s.failures, msg)
	s.Error = joinNonEmpty("; ", s.Error, msg)
	if s.ExitStatus == exitOK {
		s.ExitStatus = exitFailed
	}
}

// stop records the signal that stopped the run, which sets the exit status.
func (s *summary) stop(sig stopSignal) {
	s.Stopped = signalName(sig.sig)
	s.Error = joinNonEmpty("; ", sig.Error(), s.Error)
	s.Verified = s.Verified && len(s.Seconds) == s.Rounds
	s.ExitStatus = sig.exitStatus()
}

// stoppedText says when the signal came: "by SIGINT during round 3".
func (s *summary) stoppedText() string {
	text := "by " + s.Stopped
	if reported(s.PerRank, 0) != nil && len(s.Seconds) < s.Rounds {
		text += fmt.Sprintf(" during round %d", len(s.Seconds)+1)
	}
	return text
}

// traceFailed records that the trace or timeline could not be written.
// The sync's own verdict stands.
func (s *summary) traceFailed(err error) {
	s.TraceError = err.Error()
	s.addError(err.Error())
}

func joinNonEmpty(sep string, parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, sep)
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

// receivers are the results of the ranks other than the sender.
func (s *summary) receivers() []*rankResult {
	var out []*rankResult
	for _, r := range s.PerRank {
		if r != nil && r.Rank > 0 {
			out = append(out, r)
		}
	}
	return out
}

// writeTable prints the summary for a person.
func (s *summary) writeTable(w io.Writer) {
	perReceiver := s.Bytes
	if s.Senders > 0 {
		fmt.Fprintf(w, "\nweightcast demo: %s (%s routed to %s at TP %d) as %s, transport %s (%s)\n",
			plural(s.Ranks, "rank"), plural(s.Senders, "sender"), plural(s.Ranks-s.Senders, "receiver"), s.TP, s.Mode, s.Transport, s.TransportReason)
		perReceiver = s.BytesPerReceiver
	} else {
		fmt.Fprintf(w, "\nweightcast demo: %s (1 sender, %s) as %s, transport %s (%s)\n",
			plural(s.Ranks, "rank"), plural(s.Ranks-1, "receiver"), s.Mode, s.Transport, s.TransportReason)
	}
	fmt.Fprintf(w, "model: %s = %s; buckets of %s\n\n", s.Model, humanize.IBytes(uint64(s.Bytes)), humanize.IBytes(uint64(s.Bucket)))
	if len(s.Seconds) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "round\tseconds\trate\t")
		for i, sec := range s.Seconds {
			fmt.Fprintf(tw, "%d\t%.3f\t%s/s\t\n", i+1, sec, humanize.Bytes(uint64(float64(perReceiver)/max(sec, 1e-9))))
		}
		tw.Flush()
		fmt.Fprintln(w)
	}
	switch {
	case s.GBps != nil && s.Senders > 0:
		fmt.Fprintf(w, "median rate:   %.2f GB/s per receiver (the largest shard, %s, %s finished)\n", *s.GBps, humanize.IBytes(uint64(perReceiver)), plural(len(s.Seconds), "round"))
	case s.GBps != nil:
		fmt.Fprintf(w, "median rate:   %.2f GB/s per receiver (%s, %s finished)\n", *s.GBps, plural(s.Ranks-1, "receiver"), plural(len(s.Seconds), "round"))
	case s.only > 0:
		fmt.Fprintf(w, "median rate:   not known here: the sender (rank 0) times the rounds; see its summary\n")
	case reported(s.PerRank, 0) == nil:
		fmt.Fprintf(w, "median rate:   not measured: the sender did not report\n")
	default:
		fmt.Fprintf(w, "median rate:   none: no round finished\n")
	}
	if s.Plan != nil {
		fmt.Fprintf(w, "plan:          %s, busiest sender %.2fx the mean\n", s.Plan.Digest[:16], s.Plan.Balance)
		for _, r := range s.PerRank {
			if r != nil && len(r.Rounds) > 0 {
				last := r.Rounds[len(r.Rounds)-1]
				fmt.Fprintf(w, "  rank %d %-8s sent %s, received %s in the last round\n", r.Rank, r.Role, humanize.IBytes(uint64(last.BytesSent)), humanize.IBytes(uint64(last.BytesReceived)))
			}
		}
	}
	finished := s.Stopped == "" && (len(s.failures) == 0 || len(s.failures) == 1 && s.failures[0] == s.TraceError)
	s.writeVerified(w, finished)
	s.writeChecksums(w, finished)
	s.writeCommitted(w)
	switch {
	case s.MaxBuffers == 0 && s.only >= 0:
		fmt.Fprintf(w, "buffers held:  none taken on this rank\n")
	case s.MaxBuffers == 0:
		fmt.Fprintf(w, "buffers held:  none taken on any rank that reported\n")
	case s.only >= 0:
		fmt.Fprintf(w, "buffers held:  at most %d on this rank\n", s.MaxBuffers)
	default:
		fmt.Fprintf(w, "buffers held:  at most %d per rank\n", s.MaxBuffers)
	}
	for _, r := range s.PerRank {
		switch {
		case r == nil:
		case r.GPUMemory > 0:
			fmt.Fprintf(w, "GPU memory:    rank %d held %s on %s (driver's figure: buckets, model, transport)\n", r.Rank, humanize.IBytes(uint64(r.GPUMemory)), r.Device)
		case r.GPUBuffers > 0:
			fmt.Fprintf(w, "GPU memory:    rank %d allocated %s on %s (two buckets and its model)\n", r.Rank, humanize.IBytes(uint64(r.GPUBuffers)), r.Device)
		}
	}
	switch {
	case s.PeakRSS > 0 && s.only >= 0:
		fmt.Fprintf(w, "peak memory:   %s RSS on this rank\n", humanize.IBytes(uint64(s.PeakRSS)))
	case s.PeakRSS > 0 && s.Mode == inprocMode:
		fmt.Fprintf(w, "peak memory:   %s RSS of this process (every rank)\n", humanize.IBytes(uint64(s.PeakRSS)))
	case s.PeakRSS > 0:
		fmt.Fprintf(w, "peak memory:   %s RSS on the largest rank\n", humanize.IBytes(uint64(s.PeakRSS)))
	}
	if s.Trace != "" {
		fmt.Fprintf(w, "trace:         %s (open in https://ui.perfetto.dev or chrome://tracing)\n", s.Trace)
	}
	if s.Timeline != "" {
		fmt.Fprintf(w, "timeline:      %s\n", s.Timeline)
	}
	if s.TraceError != "" {
		fmt.Fprintf(w, "trace:         not written: %s\n", s.TraceError)
	}
	if s.Stopped != "" {
		fmt.Fprintf(w, "\nSTOPPED %s\n", s.stoppedText())
	}
	if len(s.failures) > 0 {
		fmt.Fprintf(w, "\nFAILED:\n")
		for _, f := range s.failures {
			fmt.Fprintf(w, "  %s\n", f)
		}
	}
}

// writeVerified says what the receivers compared with the source; finished
// says every rank ended its rounds without failing.
func (s *summary) writeVerified(w io.Writer, finished bool) {
	receivers := s.receivers()
	switch {
	case s.only == 0 && s.verifyOn:
		fmt.Fprintf(w, "verified:      by each receiver, in its own summary (this process is the sender)\n")
	case s.only > 0 && s.Verified:
		scope := "every round"
		if len(receivers) == 1 && receivers[0].VerifyScope != "" {
			scope = receivers[0].VerifyScope
		}
		fmt.Fprintf(w, "verified:      yes, every byte on this rank (rank %d; %s)\n", s.only, scope)
	case s.Verified:
		scope := "every round"
		for _, r := range receivers {
			if r.VerifyScope != "" {
				scope = r.VerifyScope
			}
		}
		fmt.Fprintf(w, "verified:      yes, every byte on %s (%s)\n", plural(s.Ranks-max(s.Senders, 1), "receiver"), scope)
	case !s.verifyOn:
		fmt.Fprintf(w, "verified:      not checked (--verify=false)\n")
	case finished:
		fmt.Fprintf(w, "verified:      no\n")
	default:
		// Host buckets are checked as they arrive, so every round a
		// receiver finished was checked in full; a GPU model is read back
		// after the last round only.
		var per []string
		for _, r := range receivers {
			switch {
			case r.Unreported:
				per = append(per, fmt.Sprintf("rank %d: no report", r.Rank))
			case r.VerifyScope == "every round":
				per = append(per, fmt.Sprintf("rank %d: %d", r.Rank, len(r.Rounds)))
			default:
				per = append(per, fmt.Sprintf("rank %d: 0", r.Rank))
			}
		}
		if len(per) == 0 {
			fmt.Fprintf(w, "verified:      no: the run did not finish\n")
			return
		}
		fmt.Fprintf(w, "verified:      no: the run did not finish; rounds checked byte for byte before it ended: %s\n", strings.Join(per, ", "))
	}
}

// writeChecksums says which buckets every receiver checked: their
// checksums and, with a group secret, their MACs, which stand in for the
// checksums of direct buckets.
func (s *summary) writeChecksums(w io.Writer, finished bool) {
	if s.MAC {
		s.writeChecked(w, "MACs:         ", "bucket ("+macName[mac.Kind(s.BucketMAC)]+")", finished)
	}
	switch {
	case !s.Checksum:
		fmt.Fprintf(w, "checksums:     off (--checksum=false)\n")
	case s.MAC && s.directBuckets() > 0:
		s.writeChecked(w, "checksums:    ", "packed bucket (a direct bucket's MAC stood in for its checksum)", finished)
	default:
		s.writeChecked(w, "checksums:    ", "bucket", finished)
	}
}

// macName is how the table names each bucket MAC.
var macName = map[mac.Kind]string{mac.BLAKE3: "keyed BLAKE3", mac.Poly1305AES: "Poly1305-AES"}

// writeChecked writes the line, under label, that says which buckets
// (what: "bucket", …) every receiver checked.
func (s *summary) writeChecked(w io.Writer, label, what string, finished bool) {
	switch {
	case finished:
		fmt.Fprintf(w, "%s every %s, checked by every receiver\n", label, what)
	case s.Committed == nil || *s.Committed == 0:
		fmt.Fprintf(w, "%s on; no version was committed, so no round's buckets are known to have been checked on every receiver\n", label)
	default:
		fmt.Fprintf(w, "%s every %s of the %s committed, checked by every receiver; not the unfinished round\n", label, what, plural(int(*s.Committed), "version"))
	}
}

// directBuckets counts the direct buckets of the sender's rounds.
func (s *summary) directBuckets() int {
	r := reported(s.PerRank, 0)
	if r == nil {
		return 0
	}
	n := 0
	for _, rd := range r.Rounds {
		n += rd.Direct
	}
	return n
}

// writeCommitted prints the committed version: one line when every rank
// reported the same and none failed, else one line per rank.
func (s *summary) writeCommitted(w io.Writer) {
	var ranks []*rankResult
	same := true
	for _, r := range s.PerRank {
		if r == nil {
			continue
		}
		ranks = append(ranks, r)
		same = same && !r.Unreported && s.Committed != nil && r.CommittedVersion == *s.Committed && r.State == ""
	}
	switch {
	case s.Committed == nil:
		fmt.Fprintf(w, "committed:     unknown: no rank reported\n")
	case len(ranks) == 1:
		r := ranks[0]
		fmt.Fprintf(w, "committed:     %s on every receiver, as rank %d saw it%s\n", versionText(r.CommittedVersion), r.Rank, stateText(r))
	case same:
		fmt.Fprintf(w, "committed:     %s on every receiver\n", versionText(*s.Committed))
	default:
		fmt.Fprintf(w, "committed:     %s on every receiver; by rank:\n", versionText(*s.Committed))
		for _, r := range ranks {
			if r.Unreported {
				fmt.Fprintf(w, "               rank %d: no report (%s)\n", r.Rank, r.Error)
				continue
			}
			fmt.Fprintf(w, "               rank %d: %s%s\n", r.Rank, versionText(r.CommittedVersion), stateText(r))
		}
	}
}

// versionText is "version 3", or "no version" for 0.
func versionText(v uint64) string {
	if v == 0 {
		return "no version"
	}
	return fmt.Sprintf("version %d", v)
}

func stateText(r *rankResult) string {
	if r.State == "" {
		return ""
	}
	return ", model " + r.State
}

// plural is "1 round", "2 rounds", "3 rank processes", "2 directories".
func plural(n int, word string) string {
	switch {
	case n == 1:
		return "1 " + word
	case strings.HasSuffix(word, "s"):
		return fmt.Sprintf("%d %ses", n, word)
	case strings.HasSuffix(word, "y"):
		return fmt.Sprintf("%d %sies", n, strings.TrimSuffix(word, "y"))
	}
	return fmt.Sprintf("%d %ss", n, word)
}

func sizeText(n int64) string { return humanize.IBytes(uint64(n)) }
