package sink

// StagingPrefix starts the name of the hidden directory a Safetensors sink
// writes a round into, for the external tests (package sink_test).
const StagingPrefix = stagingPrefix
