// Package quant turns rollout weights into block-scaled FP8, the layout of
// the FP8 checkpoints of DeepSeek-V3, Kimi-K2 and Qwen3-FP8, on host bytes,
// and back again for checks.
//
// A weight W of shape [rows, cols] (F32, BF16 or F16) becomes two tensors:
// its codes, F8_E4M3 (PyTorch's float8_e4m3fn: 4 exponent bits of bias 7,
// 3 mantissa bits, no infinities, 0x7F and 0xFF the only NaNs, largest
// finite value 448) of the same shape, and its scales, F32 of shape
// [ceil(rows/128), ceil(cols/128)], one per block of 128×128 elements
// (partial blocks at the right and bottom edges). Block (i, j) holds the
// elements of rows [128i, 128i+128) and columns [128j, 128j+128). For a
// block whose elements are all finite, with amax the largest |W| of the
// block (in float32: BF16 and F16 widen exactly):
//
//	s = amax / 448           (a float32 division, rounded to nearest even)
//	s = 1 if s < 2^-126      (amax = 0, a block of zeros, and blocks so small
//	                          that s would be a subnormal or 0)
//	code = e4m3fn(W / s)     (a float32 division, then PyTorch's conversion)
//
// which is, bit for bit, PyTorch's (W.float() / s).to(torch.float8_e4m3fn)
// for the same s: e4m3fn is c10's fp8e4m3fn_from_fp32_value, round to
// nearest with ties to even, subnormal codes rounded correctly, and no
// saturation (a float32 beyond 464 in magnitude becomes NaN, as in torch;
// by construction |W/s| <= 448 here, so no code of a finite block is
// NaN). The scale tensor holds s itself, the factor a reader multiplies
// the decoded codes by (the "scale_inv" of the checkpoints: W ≈ code × s).
//
// A block holding any NaN or ±Inf has s = NaN (0x7FC00000) and every code
// 0x7F (NaN): the block decodes to NaN, so a corrupt weight stays visible
// at the receivers instead of being rounded into plausible numbers. (torch
// applied literally would also give s = NaN or Inf and decode the whole
// block to NaN, but with NaN bits that differ from one device to another.)
//
// Encode and the block functions are the host implementation; the GPU
// kernel of package gpu reproduces them bit for bit. UpdateHFConfig gives
// a model's config.json the quantization_config under which transformers
// loads such a checkpoint. Dequantize computes
// code × s in float32, as DeepSeek-V3's weight_dequant does, and rounds to
// BF16 as package cast does.
package quant
