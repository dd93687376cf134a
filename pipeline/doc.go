// Package pipeline runs typed stages joined by bounded channels.
//
// A Pipeline is built from a Source, any number of Stages (or the Map and
// Filter shorthands) and a Sink; each is a function that the pipeline runs on
// its own goroutine when Run is called. Constructors start nothing; Run blocks
// until every stage has returned and owns every goroutine it starts.
//
// The rules every pipeline keeps:
//
//   - A stage never closes its input. The runner closes a stage's output
//     channel when the stage function returns, so the end of a stream
//     propagates downstream as channel closes.
//   - The first stage to fail cancels every other stage (as
//     golang.org/x/sync/errgroup does) and Run returns that error, once,
//     wrapped in a *StageError naming the stage. A panic in a stage becomes
//     such an error too.
//   - After a stage returns, the items still queued on its input are drained
//     and released (items that implement Releaser give back their buffers),
//     so nothing upstream blocks forever and nothing is leaked.
//   - Every send and receive also watches the context, so cancellation
//     reaches a stage blocked on a full or empty channel.
//
// Each stage is measured (items, bytes, busy time, time waiting for input,
// time blocked on output; see Metrics) and can record trace spans with
// StartSpan, which a Tracer writes as Chrome trace-event JSON for Perfetto or
// chrome://tracing. Graph describes the stages, edges and channel capacities,
// and Graph.Mermaid draws them.
package pipeline
