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
