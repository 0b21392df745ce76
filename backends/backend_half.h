/* backend_half.h — part of backend.h (which includes it among the entries' argument lists):
 * the entries on 16-bit floats, bfloat16 and IEEE float16 (half_convert, gemm_half).
 *
 * A 16-bit operand's bref counts words as ever: its element i is 16-bit element 2 off + i of
 * the buffer (byte 4 off + 2 i). A 16-bit tensor starts at a whole word; a row of a matrix
 * need not (an odd leading dimension). bf16: bfloat16 (1), else IEEE float16 (0). */
#ifndef CLPAR_BACKEND_HALF_H
#define CLPAR_BACKEND_HALF_H

// clang-format off
/* ---- 16-bit floats (src/half.c) ----
 * n elements between float32 and a 16-bit type, i < n: to_half: out16[i] = round(x[i]) (to
 * nearest, ties to even; overflow to +-Inf; a NaN stays a quiet NaN of its sign); from half:
 * out[i] = x16[i] exactly. The host backend uses the core's scalar conversions
 * (clpar/half.h); the others must match them bit for bit (a NaN's payload aside). */
#define CLPAR_BE_ARGS_half_convert(F) \
  F(int, to_half) F(int, bf16) F(size_t, n) F(clpar_bref, x) F(clpar_bref, out)
/* ---- GEMM on 16-bit operands (src/autocast_gemm.c: autocast's GEMMs) ----
 * gemm's C = alpha op(A) op(B) + beta C, row-major, with A and B in one 16-bit type (bf16)
 * and C float32: A's stored element (r, c) is 16-bit element 2 a.off + r lda + c, B's
 * likewise; C is float32 as in gemm. Every operand element is widened to float32 exactly and
 * the products and sums are float32 (float32 accumulation: no TF32, no 16-bit products or
 * sums); the order of summation is the backend's. beta == 0 ignores C (NaN in C does not
 * leak); NaN and Inf in A or B propagate as in float32.
 * Optional (NULL, or refused by supports_op): the core then converts A and B to float32
 * tensors (half_convert) and calls gemm. The host backend's entry does exactly that (the
 * core's conversions, then its SGEMM), so its bits are those of the widened path. */
#define CLPAR_BE_ARGS_gemm_half(F)                                                      \
  F(int, bf16) F(int, trans_a) F(int, trans_b) F(size_t, m) F(size_t, n) F(size_t, k)    \
  F(float, alpha) F(clpar_bref, a) F(size_t, lda) F(clpar_bref, b) F(size_t, ldb)        \
  F(float, beta) F(clpar_bref, c) F(size_t, ldc)
// clang-format on

#endif
