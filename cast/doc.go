// Package cast converts tensor elements between floating-point dtypes on
// host bytes: F32→BF16, F32→F16, BF16→F16 and F16→BF16, the exact widenings
// BF16→F32 and F16→F32, and the identity on those three types. Other dtypes
// (integers, FP8, F64) are not supported: Supported reports false and
// Convert returns ErrUnsupported.
//
// Every narrowing rounds to nearest, ties to even, and mirrors PyTorch's
// scalar conversions bit for bit (c10/util/BFloat16.h round_to_nearest_even
// and c10/util/Half.h fp16_ieee_from_fp32_value):
//
//   - F32→BF16: any NaN becomes 0x7FC0 (positive quiet NaN); otherwise the
//     bits are rounded by adding 0x7FFF plus the lowest kept bit and
//     truncating, so values past the largest finite bfloat16 round to ±Inf
//     and subnormal inputs round on their bits like any other;
//   - F32→F16: a NaN becomes sign | 0x7E00 (quiet, sign kept, payload
//     dropped); magnitudes from 65520 up round to ±Inf; results below 2^-14
//     are correctly rounded subnormals; F32 subnormals become ±0;
//   - BF16→F16 and F16→BF16 widen exactly to F32 and then narrow by the
//     rules above (so F16→BF16 turns every NaN into 0x7FC0 and BF16→F16
//     keeps the sign of a NaN).
//
// ±Inf and -0 are preserved by every conversion.
//
// # PyTorch's own kernels and NaN
//
// For every non-NaN input the results equal PyTorch's, on the CPU and on
// CUDA: checked against torch 2.11 (x86-64 CPU and an H200) by digest over
// 3,964,928 F32 inputs and all 65,536 F16 and BF16 inputs
// (testdata/torch_golden.py). NaN spellings differ between PyTorch's own
// code paths, and this package follows the c10 scalar functions above. As
// measured with torch 2.11: tensor.to(torch.bfloat16) on the x86-64 CPU
// gives 0xFFFF for every F32 NaN (its AVX2 kernel blends in 0xFFFF), even
// for one-element tensors; tensor.to(torch.float16) on that CPU keeps the
// NaN's sign and top payload bits (the F16C instruction: 0x7FC12345 gives
// 0x7E09); CUDA gives 0x7FFF for both.
//
// Convert runs a tight loop over encoding/binary's little-endian accessors
// and starts no goroutines. Conversions from 16-bit types look the result
// up in a 65,536-entry table built once, on first use, from the element
// functions (F16ToBF16, BF16ToF16, F16ToF32).
package cast
