package timeline_test

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/weightcast/weightcast/timeline"
)

// A two-bucket sync on one sender: bucket 1 is packed while bucket 0 is
// broadcast, the overlap that double buffering buys.
const exampleTrace = `{
 "displayTimeUnit": "ms",
 "otherData": {"command": "weightcast demo --transport inproc"},
 "traceEvents": [
  {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "rank 0 (sender)"}},
  {"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": {"name": "pack"}},
  {"name": "thread_name", "ph": "M", "pid": 0, "tid": 2, "args": {"name": "broadcast"}},
  {"name": "bucket 0", "cat": "pack", "ph": "X", "ts": 0, "dur": 2000, "pid": 0, "tid": 1,
   "args": {"stage": "pack", "bucket": 0, "bytes": 67108864, "rank": 0}},
  {"name": "bucket 1", "cat": "pack", "ph": "X", "ts": 2000, "dur": 2000, "pid": 0, "tid": 1,
   "args": {"stage": "pack", "bucket": 1, "bytes": 67108864, "rank": 0}},
  {"name": "bucket 0", "cat": "broadcast", "ph": "X", "ts": 2000, "dur": 4000, "pid": 0, "tid": 2,
   "args": {"stage": "broadcast", "bucket": 0, "bytes": 67108864, "rank": 0}},
  {"name": "bucket 1", "cat": "broadcast", "ph": "X", "ts": 6000, "dur": 4000, "pid": 0, "tid": 2,
   "args": {"stage": "broadcast", "bucket": 1, "bytes": 67108864, "rank": 0}}
 ]
}`

func Example() {
	if err := timeline.Validate(strings.NewReader(exampleTrace)); err != nil {
		fmt.Println(err)
		return
	}
	t, err := timeline.Read(strings.NewReader(exampleTrace))
	if err != nil {
		fmt.Println(err)
		return
	}
	var svg bytes.Buffer
	if err := timeline.Render(&svg, t, timeline.Options{Title: "one sync round"}); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("bars:", strings.Count(svg.String(), `class="bar"`))
	for _, s := range timeline.Utilization(t) {
		fmt.Printf("%s %-9s busy %v of %v (%.0f%%), %.1f GB/s\n",
			s.Process, s.Stage, s.Busy, s.Wall, 100*s.Utilization(), s.Throughput()/1e9)
	}
	// Output:
	// bars: 4
	// rank 0 (sender) pack      busy 4ms of 10ms (40%), 33.6 GB/s
	// rank 0 (sender) broadcast busy 8ms of 10ms (80%), 16.8 GB/s
}

func ExampleValidate() {
	// A complete event without "dur", and one that ends before it starts.
	const broken = `{"traceEvents": [
	  {"name": "bucket 0", "ph": "X", "ts": 10, "pid": 0, "tid": 1},
	  {"name": "bucket 1", "ph": "X", "ts": 20, "dur": -3, "pid": 0, "tid": 1}
	]}`
	fmt.Println(timeline.Validate(strings.NewReader(broken)))
	// Output:
	// timeline: invalid trace, 2 problems:
	//   event #0 (ph "X", name "bucket 0", pid 0, tid 1): missing "dur"; a complete event (ph "X") needs a duration in microseconds
	//   event #1 (ph "X", name "bucket 1", pid 0, tid 1): "dur" is -3; a complete event needs dur >= 0
}
