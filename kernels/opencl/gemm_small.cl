/* gemm_small.cl — row-major C = alpha op(A) op(B) + beta C for small GEMMs on CPU devices,
 * where CLBlast's kernels (built for GPUs: local-memory tiles, barriers) pad a 16-row product
 * to their tile under PoCL, so that half the rows cost about as much as all of them. Explicit
 * float8 vectors (the compiler maps them to the CPU's SIMD registers):
 *   op(B) not transposed (nn, tn): a work-item computes 8 adjacent elements of a row of C,
 *     reading op(B)'s row p as one float8 and op(A)[i, p] as a scalar;
 *   B transposed, A not (nt): a work-item computes one element as a dot product of A's row i
 *     and B's row j, 8 elements of k at a time.
 * The core takes these only when n (nn, tn) or k (nt) is a multiple of 8 (ocl_gemm).
 * beta == 0 ignores C (NaN in C does not leak), as BLAS. */

/* Work-items past the edge compute the last row or column and store nothing: an early
 * return would keep the compiler from running a work-group's items in lockstep. */
#define GEMM_SMALL_ROW8(name, A_AT)                                                            \
  __kernel void name(ulong m, ulong n, ulong k, float alpha, __global const float *a,        \
                     ulong a_off, ulong lda, __global const float *b, ulong b_off, ulong ldb,  \
                     float beta, __global float *c, ulong c_off, ulong ldc) {                 \
    ulong j8 = get_global_id(0), i = get_global_id(1);                                       \
    ulong ii = min(i, m - 1), jj = min(j8, n / 8 - 1) * 8;                                   \
    __global const float *pa = a + a_off, *pb = b + b_off + jj;                              \
    float8 acc = (float8)(0.0f);                                                             \
    for (ulong p = 0; p < k; p++) acc += pa[A_AT] * vload8(0, pb + p * ldb);                 \
    if (i < m && j8 < n / 8) {                                                               \
      __global float *pc = c + c_off + i * ldc + jj;                                         \
      vstore8(beta == 0.0f ? alpha * acc : alpha * acc + beta * vload8(0, pc), 0, pc);       \
    }                                                                                        \
  }

/* op(A)[ii, p] */
GEMM_SMALL_ROW8(gemm_small_nn, ii * lda + p)
GEMM_SMALL_ROW8(gemm_small_tn, p * lda + ii)

__kernel void gemm_small_nt(ulong m, ulong n, ulong k, float alpha, __global const float *a,
                            ulong a_off, ulong lda, __global const float *b, ulong b_off,
                            ulong ldb, float beta, __global float *c, ulong c_off, ulong ldc) {
  ulong j = get_global_id(0), i = get_global_id(1);
  ulong ii = min(i, m - 1), jj = min(j, n - 1);
  __global const float *pa = a + a_off + ii * lda, *pb = b + b_off + jj * ldb;
  float8 acc = (float8)(0.0f);
  for (ulong p = 0; p < k; p += 8) acc += vload8(0, pa + p) * vload8(0, pb + p);
  float4 h = acc.lo + acc.hi;
  float2 q = h.lo + h.hi;
  float sum = q.x + q.y;
  if (i < m && j < n) {
    __global float *pc = c + c_off + i * ldc + j;
    *pc = beta == 0.0f ? alpha * sum : alpha * sum + beta * *pc;
  }
}

/* gemm_small_nt with a Linear's epilogue (backend.h's linear_act): out = f(x w^T + bias),
 * the product summed as gemm_small_nt sums it and rounded to float before the bias is added
 * and f applied, as bias_act does (act: 0 none, 1 relu, 2 sigmoid, 3 tanh; has_bias 0 skips
 * the bias). */
__kernel void gemm_small_nt_bias_act(ulong m, ulong n, ulong k, __global const float *a,
                                     ulong a_off, __global const float *b, ulong b_off,
                                     __global const float *bias, ulong bias_off, int has_bias,
                                     int act, __global float *c, ulong c_off) {
  ulong j = get_global_id(0), i = get_global_id(1);
  ulong ii = min(i, m - 1), jj = min(j, n - 1);
  __global const float *pa = a + a_off + ii * k, *pb = b + b_off + jj * k;
  float8 acc = (float8)(0.0f);
  for (ulong p = 0; p < k; p += 8) acc += vload8(0, pa + p) * vload8(0, pb + p);
  float4 h = acc.lo + acc.hi;
  float2 q = h.lo + h.hi;
  float x = q.x + q.y;
  if (i < m && j < n) {
    if (has_bias) x = x + bias[bias_off + j];
    c[c_off + i * n + j] = act == 1   ? fmax(x, 0.0f)
                           : act == 2 ? 1.0f / (1.0f + exp(-x))
                           : act == 3 ? tanh(x)
                                      : x;
  }
}

/* The 8 sums of s[0 .. 7] as one vector, lane q holding gemm_small_nt's sum of s[q]'s lanes:
 * ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), the same additions, 8 columns at once. */
inline float8 gsn_hsum8x8(const float8 *s) {
  float8 h01 = (float8)(s[0].lo, s[1].lo) + (float8)(s[0].hi, s[1].hi);
  float8 h23 = (float8)(s[2].lo, s[3].lo) + (float8)(s[2].hi, s[3].hi);
  float8 h45 = (float8)(s[4].lo, s[5].lo) + (float8)(s[4].hi, s[5].hi);
  float8 h67 = (float8)(s[6].lo, s[7].lo) + (float8)(s[6].hi, s[7].hi);
  float8 q03 = (float8)(h01.s01, h01.s45, h23.s01, h23.s45) +
               (float8)(h01.s23, h01.s67, h23.s23, h23.s67);
  float8 q47 = (float8)(h45.s01, h45.s45, h67.s01, h67.s45) +
               (float8)(h45.s23, h45.s67, h67.s23, h67.s67);
  return (float8)(q03.even, q47.even) + (float8)(q03.odd, q47.odd);
}

/* c[0 .. 7] from the accumulators of 8 columns: the bias and f as gemm_small_nt_bias_act
 * applies them (sigmoid and tanh one element at a time, as there). */
inline void gsn_store8(const float8 *s, __global const float *bias, int has_bias, int act,
                       __global float *c) {
  float8 x = gsn_hsum8x8(s);
  if (has_bias) x = x + vload8(0, bias);
  if (act == 0 || act == 1) {
    vstore8(act == 1 ? fmax(x, 0.0f) : x, 0, c);
    return;
  }
  float e[8];
  vstore8(x, 0, e);
  for (int q = 0; q < 8; q++) c[q] = act == 2 ? 1.0f / (1.0f + exp(-e[q])) : tanh(e[q]);
}

/* The 8 columns' statements written out (constant indices: the sums stay in registers). */
#define GSN_ALL(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define GSN_ZERO(Q) s0[Q] = s1[Q] = (float8)(0.0f);
#define GSN_TERM(Q)                                                                            \
  {                                                                                            \
    float8 wv = vload8(0, pb + Q * k + p);                                                     \
    s0[Q] += x0 * wv;                                                                          \
    s1[Q] += x1 * wv;                                                                          \
  }

/* gemm_small_nt_bias_act, register-blocked for n a multiple of 8: work-item (j8, i2) computes
 * rows 2 i2 and 2 i2 + 1, columns 8 j8 .. 8 j8 + 7, so that each load of a row of a or b
 * feeds 8 or 2 products instead of one. Each element's products and sums are the ones
 * gemm_small_nt_bias_act computes for it, in the same order: the same bits. */
/* The sizes and offsets (in floats) of gemm_small_nt_bias_act_2x8, and has_bias and act, as
 * one argument: PoCL copies each argument of each launch into memory of its own (ocl_gemm.c's
 * gsn_sizes has the same layout). */
typedef struct {
  ulong m, n, k, a_off, b_off, bias_off, c_off;
  int has_bias, act;
} gsn_sizes;

__kernel void gemm_small_nt_bias_act_2x8(__global const float *a, __global const float *b,
                                         __global const float *bias, __global float *c,
                                         gsn_sizes z) {
  ulong m = z.m, n = z.n, k = z.k, a_off = z.a_off, b_off = z.b_off, bias_off = z.bias_off;
  ulong c_off = z.c_off;
  int has_bias = z.has_bias, act = z.act;
  ulong j8 = get_global_id(0), i = get_global_id(1) * 2;
  ulong j = min(j8, n / 8 - 1) * 8, i0 = min(i, m - 1), i1 = min(i + 1, m - 1);
  __global const float *pa0 = a + a_off + i0 * k, *pa1 = a + a_off + i1 * k;
  __global const float *pb = b + b_off + j * k;
  float8 s0[8], s1[8];
  GSN_ALL(GSN_ZERO)
  for (ulong p = 0; p < k; p += 8) {
    float8 x0 = vload8(0, pa0 + p), x1 = vload8(0, pa1 + p);
    GSN_ALL(GSN_TERM)
  }
  if (j8 < n / 8 && i < m) gsn_store8(s0, bias + bias_off + j, has_bias, act, c + c_off + i * n + j);
  if (j8 < n / 8 && i + 1 < m)
    gsn_store8(s1, bias + bias_off + j, has_bias, act, c + c_off + (i + 1) * n + j);
}
