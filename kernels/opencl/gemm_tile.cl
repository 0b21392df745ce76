/* gemm_tile.cl — row-major C = alpha op(A) op(B) + beta C, strided-batched, for CPU devices
 * (ocl_gemm_tile.c), where CLBlast's GPU kernels (local-memory tiles, barriers) run at a
 * fraction of the SIMD units' speed under PoCL. Each work-item keeps a register tile of C in
 * explicit float16 vectors (one AVX-512 register, two AVX2 ones), so the compiler emits FMAs
 * on whole registers with no work-item loop to vectorize:
 *   op(B) not transposed (nn, tn): a tile of GT_MR rows by 16 * GT_NV columns; each step of k
 *     broadcasts GT_MR elements of op(A) and loads GT_NV vectors of B's row;
 *   B transposed, A not (nt): a tile of GT_DM by GT_DN dot products of A's rows and B's rows,
 *     16 elements of k at a time, summed across the vector at the end.
 * Tiles that cross the edge of C take a scalar loop (the work-item's own, so every
 * shape is valid). beta == 0 ignores C (NaN in C does not leak), as BLAS. Global ids: (row
 * tile, column tile, batch); sizes fit 32 bits, offsets are 64-bit. GT_MR, GT_NV, GT_DM and
 * GT_DN are build options (ocl_gemm_tile.c) so that a tuner can choose them per device. */
#ifndef GT_MR
#define GT_MR 8
#endif
#ifndef GT_NV
#define GT_NV 2
#endif
#ifndef GT_DM
#define GT_DM 4
#endif
#ifndef GT_DN
#define GT_DN 4
#endif
#define GT_NR (16 * GT_NV)

#define GT_ARGS                                                                                  \
  uint m, uint n, uint k, float alpha, __global const float *a, ulong a_off, uint lda,           \
      ulong sa, __global const float *b, ulong b_off, uint ldb, ulong sb, float beta,            \
      __global float *c, ulong c_off, uint ldc, ulong sc

/* Stores alpha * v (+ beta * C) into C[i, j]. */
#define GT_PUT(pc, v) *(pc) = beta == 0.0f ? alpha * (v) : alpha * (v) + beta * *(pc)

/* The scalar loop of a tile at (i0, j0) that crosses C's edge. */
static void gt_edge(uint m, uint n, uint k, float alpha, __global const float *a, uint lda,
                    int ta, __global const float *b, uint ldb, int tb, float beta,
                    __global float *c, uint ldc, uint i0, uint j0, uint mr, uint nr) {
  for (uint i = i0; i < min(m, i0 + mr); i++)
    for (uint j = j0; j < min(n, j0 + nr); j++) {
      float s = 0.0f;
      for (uint p = 0; p < k; p++)
        s += (ta ? a[(ulong)p * lda + i] : a[(ulong)i * lda + p]) *
             (tb ? b[(ulong)j * ldb + p] : b[(ulong)p * ldb + j]);
      GT_PUT(c + (ulong)i * ldc + j, s);
    }
}

/* A row tile of GT_MR rows of op(A) times a GT_NR-wide panel of B; A_AT(r, p) addresses
 * op(A)[i0 + r, p]. */
#define GT_ROWS(name, TA, A_AT)                                                                 \
  __kernel void name(GT_ARGS) {                                                                \
    uint i0 = get_global_id(0) * GT_MR, j0 = get_global_id(1) * GT_NR;                        \
    ulong bt = get_global_id(2);                                                               \
    a += a_off + bt * sa;                                                                      \
    b += b_off + bt * sb;                                                                      \
    c += c_off + bt * sc;                                                                      \
    if (i0 + GT_MR > m || j0 + GT_NR > n) {                                                    \
      gt_edge(m, n, k, alpha, a, lda, TA, b, ldb, 0, beta, c, ldc, i0, j0, GT_MR, GT_NR);      \
      return;                                                                                  \
    }                                                                                          \
    float16 acc[GT_MR][GT_NV];                                                                 \
    _Pragma("unroll") for (int r = 0; r < GT_MR; r++)                                          \
        _Pragma("unroll") for (int v = 0; v < GT_NV; v++) acc[r][v] = (float16)(0.0f);         \
    __global const float *pb = b + j0;                                                         \
    for (uint p = 0; p < k; p++, pb += ldb) {                                                  \
      float16 bv[GT_NV];                                                                       \
      _Pragma("unroll") for (int v = 0; v < GT_NV; v++) bv[v] = vload16(v, pb);                \
      _Pragma("unroll") for (int r = 0; r < GT_MR; r++) {                                      \
        float av = a[A_AT(r, p)];                                                              \
        _Pragma("unroll") for (int v = 0; v < GT_NV; v++) acc[r][v] =                          \
            fma((float16)(av), bv[v], acc[r][v]);                                              \
      }                                                                                        \
    }                                                                                          \
    _Pragma("unroll") for (int r = 0; r < GT_MR; r++)                                          \
        _Pragma("unroll") for (int v = 0; v < GT_NV; v++) {                                    \
      __global float *pc = c + (ulong)(i0 + r) * ldc + j0 + 16 * v;                            \
      float16 out = alpha * acc[r][v];                                                         \
      if (beta != 0.0f) out += beta * vload16(0, pc);                                          \
      vstore16(out, 0, pc);                                                                    \
    }                                                                                          \
  }

#define GT_AT_N(r, p) (ulong)(i0 + (r)) * lda + (p)
#define GT_AT_T(r, p) (ulong)(p) * lda + i0 + (r)
GT_ROWS(gemm_tile_nn, 0, GT_AT_N)
GT_ROWS(gemm_tile_tn, 1, GT_AT_T)

/* nt: C[i, j] = A's row i . B's row j, a GT_DM x GT_DN tile of them per work-item. */
__kernel void gemm_tile_nt(GT_ARGS) {
  uint i0 = get_global_id(0) * GT_DM, j0 = get_global_id(1) * GT_DN;
  ulong bt = get_global_id(2);
  a += a_off + bt * sa;
  b += b_off + bt * sb;
  c += c_off + bt * sc;
  if (i0 + GT_DM > m || j0 + GT_DN > n) {
    gt_edge(m, n, k, alpha, a, lda, 0, b, ldb, 1, beta, c, ldc, i0, j0, GT_DM, GT_DN);
    return;
  }
  float16 acc[GT_DM][GT_DN];
#pragma unroll
  for (int r = 0; r < GT_DM; r++)
#pragma unroll
    for (int q = 0; q < GT_DN; q++) acc[r][q] = (float16)(0.0f);
  uint k16 = k & ~15u;
  for (uint p = 0; p < k16; p += 16) {
    float16 av[GT_DM], bv[GT_DN];
#pragma unroll
    for (int r = 0; r < GT_DM; r++) av[r] = vload16(0, a + (ulong)(i0 + r) * lda + p);
#pragma unroll
    for (int q = 0; q < GT_DN; q++) bv[q] = vload16(0, b + (ulong)(j0 + q) * ldb + p);
#pragma unroll
    for (int r = 0; r < GT_DM; r++)
#pragma unroll
      for (int q = 0; q < GT_DN; q++) acc[r][q] = fma(av[r], bv[q], acc[r][q]);
  }
#pragma unroll
  for (int r = 0; r < GT_DM; r++)
#pragma unroll
    for (int q = 0; q < GT_DN; q++) {
      float16 v = acc[r][q];
      float8 h8 = v.lo + v.hi;
      float4 h4 = h8.lo + h8.hi;
      float2 h2 = h4.lo + h4.hi;
      float s = h2.x + h2.y;
      for (uint p = k16; p < k; p++)
        s += a[(ulong)(i0 + r) * lda + p] * b[(ulong)(j0 + q) * ldb + p];
      GT_PUT(c + (ulong)(i0 + r) * ldc + j0 + q, s);
    }
}
