// Package safetensors reads, validates and writes Hugging Face safetensors
// checkpoints: single files, and sharded directories with a
// model.safetensors.index.json.
//
// # Format
//
// A file is an 8-byte little-endian unsigned length N, then N bytes of UTF-8
// JSON (the header), then the data region. The header maps each tensor name
// to {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, with
// offsets relative to the start of the data region (byte 8+N), and may hold
// "__metadata__": a map from strings to strings. Tensors are little-endian,
// row-major.
//
// # Reading
//
// Open reads and validates the header only; tensor bytes are read on demand
// through File.ReadAt, File.Section or File.ReadTensor, so a file is never
// loaded whole. File.Tensors lists the tensors in data order with absolute
// file offsets. OpenModel opens a single file, an index, or a directory (with
// or without an index) and lists every tensor in a stable order: shard
// order (shard names sorted), then data offset.
//
// Validation rejects, with an *Error naming the file and the tensor and
// wrapping a sentinel for errors.Is: a header that is not UTF-8 JSON of the
// right shape (ErrHeaderJSON); a header length above the limit (100 MB by
// default, as the reference) or past the end of the file (ErrHeaderSize); a
// file shorter than its header says (ErrTruncated); reversed or huge offsets
// (ErrOffsets); overlapping tensors (ErrOverlap); bytes of the data region,
// including trailing bytes, that belong to no tensor (ErrGap: the data region
// must be covered contiguously); unknown dtypes, including ones the
// reference knows but package dtype does not (ErrDType); a shape whose byte
// length differs from its offsets (ErrShape); negative dimensions
// (ErrNegativeDim); empty names (ErrName); a name twice in one header or in
// two shards (ErrDuplicate); an index naming a missing shard
// (ErrMissingShard) or disagreeing with the shards (ErrIndexMismatch); and
// more tensors, longer names, higher ranks or a larger __metadata__ (16 MiB
// by default) than the Limits (ErrLimit). As the reference does, unknown fields inside a tensor entry
// are ignored, "__metadata__": null means no metadata, and whitespace may
// surround the header object.
//
// # Writing
//
// Create writes the header for a list of tensors in the order given, with
// data offsets assigned contiguously in that order; the caller then writes
// the tensor bytes (Write sequentially, WriteAt / WriteTensorAt at any
// offsets and from several goroutines, CopyTensor from a reader), and Close
// checks that every byte was written exactly once before renaming the file
// into place. CreateModel does the same for a set of shards and writes the
// index last.
//
// # Byte-identical output: what the reference writer does
//
// The reference implementation (huggingface/safetensors,
// safetensors/src/tensor.rs, functions prepare and serialize, and the
// Serialize impl of Metadata; checked against files written by the Python
// package safetensors 0.8.0 with torch 2.11) writes:
//
//   - the tensors sorted by dtype, widest alignment first following the
//     order of its Dtype enum (U64, I64, F64, C64, F32, U32, I32, BF16, F16,
//     U16, I16, F8_E8M0, F8_E4M3, F8_E5M2, I8, U8, F6_E3M2, F6_E2M3, F4,
//     BOOL), then by name, with offsets assigned contiguously in that order
//     (SortLikeReference reproduces it);
//   - compact serde_json: "__metadata__" first when metadata was given,
//     then the tensors in offset order, each as
//     {"dtype":..,"shape":[..],"data_offsets":[b,e]} in that field order;
//   - the metadata keys in the iteration order of a Rust HashMap, which is
//     random per process: a file with two metadata keys may list them in
//     either order, so to reproduce a file one must keep its key order
//     (File.MetadataKeys, WithMetadataOrder);
//   - strings escaped as serde_json does: only '"', '\\' and the control
//     characters below 0x20 (as \b \t \n \f \r, else \u00xx in lower-case
//     hex); DEL, '<', '&', U+2028 and all non-ASCII are written raw;
//   - the JSON padded with spaces to a multiple of 8 bytes, N counting the
//     padding.
//
// This package writes exactly that for the order it is given, so reading a
// file and writing it back with File.Infos and File.Metadata in the order
// of File.MetadataKeys (or Model.Layout for a checkpoint) reproduces it
// byte for byte. That holds for every file written by the reference and by
// this package: both list tensors in data order. Files written by other
// tools round-trip to the same tensors and metadata but may differ in
// bytes (a header not in data order, other escapes, other padding).
//
// One reference quirk: with no tensors and an empty, non-nil metadata map
// (save_file({}, metadata={})), safetensors 0.8.0 writes the header
// `{},"__metadata__":{}}`, which is not JSON (serde_json's serialize_map is
// told zero entries). Open rejects such a file with ErrHeaderJSON; Create
// writes `{"__metadata__":{}}` instead.
//
// Index files are written as the Hugging Face libraries write them, Python's
// json.dumps(index, indent=2, sort_keys=True) plus a newline (ASCII only,
// non-ASCII escaped as \uxxxx), with the weight_map built from the shards.
package safetensors
