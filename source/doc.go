// Package source holds the models a sender sends, each a stages.Source
// that yields its tensors in a stable order once per round:
//
//   - Tensors, a fixed list (host bytes, a reader, or device memory);
//   - Synthetic, a deterministic transformer-shaped model whose bytes are
//     generated on demand, so any rank can regenerate any byte to verify
//     it (sink.Verify);
//   - OpenCheckpoint, safetensors files on disk, one file or a sharded
//     Hugging Face directory, streamed from disk straight into buckets and
//     described (stages.Describer) so that receivers can write the same
//     files back (sink.WriteSafetensors).
//
// The wrappers that change what pack does with a source's tensors,
// stages.Cast and stages.Quantize, stay with the stages: pack converts and
// quantizes the tensors they mark.
//
// The package sits above stages: it yields the Tensors the stages consume,
// and stages imports nothing of it.
package source
