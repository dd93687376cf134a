// Package timeline reads the Chrome trace-event JSON files that weightcast's
// pipeline writes, checks them against the Trace Event Format, sums up how
// busy each stage was, and draws them as an SVG Gantt chart: one lane per
// stage per rank, bars colored by bucket, so that the double-buffer overlap
// (bucket k+1 packed while bucket k is broadcast) can be seen at a glance.
//
// Everything here is plain Go: no browser and no external tool is needed to
// draw a chart.
//
//	t, err := timeline.Read(f)              // decode and build ranks, lanes, counters
//	err = timeline.Validate(f)              // strict check: loads in Perfetto / chrome://tracing
//	err = timeline.Render(w, t, opts)       // SVG
//	err = timeline.RenderFile("trace.json", "trace.svg", opts)
//	stats := timeline.Utilization(t)        // busy time, bytes, throughput per rank and stage
//
// # The trace weightcast writes
//
// A JSON object with the events in traceEvents (the format's "JSON Object
// Format"); timestamps and durations are in microseconds:
//
//	{
//	  "displayTimeUnit": "ms",
//	  "otherData": {"command": "weightcast demo --transport tcp --receivers 2", "transport": "tcp"},
//	  "traceEvents": [
//	    {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "rank 0 (sender)"}},
//	    {"name": "thread_name", "ph": "M", "pid": 0, "tid": 2, "args": {"name": "pack"}},
//	    {"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": 2, "args": {"sort_index": 2}},
//	    {"name": "bucket 3", "cat": "pack", "ph": "X", "ts": 5038012.888, "dur": 33554.432,
//	     "pid": 0, "tid": 2,
//	     "args": {"stage": "pack", "bucket": 3, "bytes": 268435456, "rank": 0, "round": 1}},
//	    {"name": "buffers held", "ph": "C", "ts": 5038012.888, "pid": 0, "args": {"held": 2}},
//	    {"name": "is_last", "ph": "i", "s": "t", "ts": 5327437.364, "pid": 0, "tid": 3}
//	  ]
//	}
//
// How the events are read:
//
//   - pid is the rank; process_name labels its group of lanes.
//   - tid is the stage's lane within the rank; thread_name names it and
//     thread_sort_index orders it (lanes without one follow, in order of
//     first appearance). Stage names are not fixed: any name gets a lane.
//   - "X" (complete) events are the work: cat and args.stage name the stage,
//     args.bucket the bucket sequence number (bars of bucket k have the same
//     color on every lane and rank), args.bytes the bytes moved, args.round
//     the sync round. Matched "B"/"E" pairs are drawn like "X" events.
//   - "C" (counter) events are drawn as a step line under the rank's lanes;
//     "i" (instant) events as a small marker. Other phases are kept in
//     Trace.Events and not drawn.
//
// # What the format requires
//
// The Trace Event Format is defined in the Google document "Trace Event
// Format" (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU),
// which catapult's own page points to
// (github.com/catapult-project/catapult/blob/main/docs/trace-event-format.md).
// Every event has ph (a one-letter phase), and name, cat, ts
// (microseconds), pid, tid and args as the phase needs them. Validate
// checks:
//
//   - every event but metadata ("M") has a numeric ts: Perfetto's JSON
//     tokenizer drops an event without one (it counts it as a tokenizer
//     failure), and keeps only metadata events without ts;
//   - a complete event ("X") has a numeric dur (Perfetto's parser drops an
//     "X" event without dur) that is not negative, and a tid;
//   - every event has a whole-number pid; "B", "E", "X" and thread-scoped
//     instant events have a tid; every event but "E" has a name;
//   - an instant event's scope "s" is "g", "p" or "t";
//   - a counter event ("C") holds its series in args, every value a number
//     (the format displays them as a stacked chart per pid and name);
//   - metadata events carry their payload in args: process_name and
//     thread_name in args.name, process_sort_index and thread_sort_index in
//     args.sort_index, process_labels in args.labels;
//   - async ("b", "e", "n", "S", "T", "p", "F") and flow ("s", "t", "f")
//     events carry an id;
//   - duration events pair up: on one pid and tid an "E" closes the most
//     recent open "B" (the format requires the "B" to come first and the
//     events of a thread to be in time order), and no "B" stays open;
//   - the spans of one thread nest perfectly. The Perfetto FAQ ("Why are
//     overlapping events in JSON traces not displayed correctly?",
//     github.com/google/perfetto/blob/main/docs/faq.md) says that the
//     Perfetto UI and trace processor do not support overlapping B/E/X
//     events, in compliance with the format, which allows only perfect
//     nesting. So a stage that runs work
//     concurrently must give each concurrent worker its own tid.
//
// Read applies the per-event checks (so that it never draws nonsense) but
// tolerates unmatched "B"/"E" events and overlapping spans, which it draws
// on extra rows of the lane; Validate is the strict check to run in tests
// of code that writes traces.
//
// # The chart
//
// Render draws, top to bottom: the title, the caption (by default the
// otherData "command") and a line of facts (wall time, ranks, buckets, the
// rest of otherData), a legend of bucket colors, the lanes grouped by rank
// with counters under them (a lane with no spans or instants, a stage that
// did nothing on its rank, is left out), a time axis from the first event
// with 1-2-5 ticks in µs, ms or s chosen from the span, and a per-stage
// utilization table of the stages that ran. A chart's buckets, counted in
// order of sequence number, take the 20 colors of the palette in turn, so
// no two of the first 20 share one; bars and the legend label a bucket by
// its index in its round (0, 1, ... in every round: sequence numbers skip
// the commit message of each round), the legend under a heading per round
// when there are several, or one swatch per color when there are more
// buckets than Options.MaxLegendBuckets. Every bar has a <title> tooltip
// with the stage, the bucket's index in its round and sequence number, the
// round, start, duration, bytes and throughput. The output is a pure function of the trace and the options:
// coordinates have at most two decimals and everything is sorted, so golden
// files compare byte for byte.
//
// The SVG marks its parts with class attributes ("rank", "lane", "bar",
// "tick", "legend-item", "row", ...) and data-* attributes (data-pid,
// data-tid, data-stage, data-bucket), which tests and scripts can query.
package timeline
