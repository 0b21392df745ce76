/* linear_backward.cl — a Linear's whole backward in one launch for small shapes on CPU devices
 * (backend.h's linear_act_backward): from g [m, n], the forward's output y [m, n], x [m, k]
 * and w [n, k], with d = g f'(y) recomputed by each work-item that reads it (a select or two
 * multiplies, 8 columns at a time, so that no work-item waits for another):
 *   dw [c, j]: sum over r of d[r, c] x[r, j]   (gemm_small_tn's order)
 *   dx [r, j]: sum over c of d[r, c] w[c, j]   (gemm_small_nn's order)
 *   db [c]:    sum over r of d[r, c]           (bias_act_backward_f32's, one chunk)
 * each summed in the order of the kernel the unfused path runs, so that the results are the
 * same bits; n and k are multiples of 8. A zero count skips an output; acc's bits (1 dx,
 * 2 dw, 4 db) add to what is there. */

#define ACT_NONE 0
#define ACT_RELU 1
#define ACT_SIGMOID 2
#define ACT_TANH 3

/* d at elements i .. i + 7 (8 columns of a row), each lane as activation.cl's
 * act_backward_at computes it. */
inline float8 lab_d8(__global const float *g, __global const float *y, int act, ulong i) {
  float8 d = vload8(0, g + i);
  if (act != ACT_NONE) {
    float8 v = vload8(0, y + i);
    d = act == ACT_RELU      ? select((float8)(0.0f), d, v > 0.0f)
        : act == ACT_SIGMOID ? d * (v * (1.0f - v))
                             : d * (1.0f - v * v);
  }
  return d;
}

/* db[c0 .. c0 + 7]: bias_act_backward_f32's compensated sum over blocks of 16 rows, one column
 * a lane. */
inline float8 lab_colsum8(__global const float *g, __global const float *y, int act, ulong m,
                          ulong n, ulong c0) {
  float8 sum = (float8)(0.0f), comp = (float8)(0.0f);
  for (ulong r = 0; r < m; r += 16) {
    ulong end = min(m, r + 16), q = r;
    float8 s0 = (float8)(0.0f), s1 = s0, s2 = s0, s3 = s0;
    for (; q + 4 <= end; q += 4) {
      s0 += lab_d8(g, y, act, q * n + c0);
      s1 += lab_d8(g, y, act, (q + 1) * n + c0);
      s2 += lab_d8(g, y, act, (q + 2) * n + c0);
      s3 += lab_d8(g, y, act, (q + 3) * n + c0);
    }
    for (; q < end; q++) s0 += lab_d8(g, y, act, q * n + c0);
    float8 t0 = ((s0 + s1) + (s2 + s3)) - comp;
    float8 t = sum + t0;
    comp = select((float8)(0.0f), (t - sum) - t0, isfinite(t));
    sum = t;
  }
  return sum;
}

/* Row N of an 8 x 8 block held as 8 columns S[0 .. 7], stored at dw row C; acc's bit 2 adds. */
#define LAB_ROW(S, N)                                                                         \
  (float8)(S[0].s##N, S[1].s##N, S[2].s##N, S[3].s##N, S[4].s##N, S[5].s##N, S[6].s##N,       \
           S[7].s##N)
#define LAB_STORE_DW(S, C, N)                                                                 \
  {                                                                                           \
    __global float *p = dw + dw_off + (C + N) * k + j;                                        \
    float8 v = LAB_ROW(S, N);                                                                 \
    vstore8((acc & 2) ? 1.0f * v + 1.0f * vload8(0, p) : 1.0f * v, 0, p);                     \
  }
#define LAB_STORE_DW8(S, C)                                                                   \
  {                                                                                           \
    LAB_STORE_DW(S, C, 0) LAB_STORE_DW(S, C, 1) LAB_STORE_DW(S, C, 2) LAB_STORE_DW(S, C, 3)   \
    LAB_STORE_DW(S, C, 4) LAB_STORE_DW(S, C, 5) LAB_STORE_DW(S, C, 6) LAB_STORE_DW(S, C, 7)   \
  }

/* x[r, j + N] (one broadcast load) times d[r, c0 ..] and d[r, c0 + 8 ..] into column N. */
#define LAB_DW_TERM(N) s[N] += dv * xr[N], t[N] += dv2 * xr[N];

/* Column c + N of the 8 in dv: w's row c + N (two 8-column blocks) times d[r, c + N], added
 * into each of 4 rows. */
#define LAB_DX_TERM(N)                                                                        \
  {                                                                                           \
    float8 wv = vload8(0, pw + N * k), wv2 = vload8(0, pw + N * k + j2);                      \
    s[0] += dv[0].s##N * wv, s[1] += dv[1].s##N * wv;                                         \
    s[2] += dv[2].s##N * wv, s[3] += dv[3].s##N * wv;                                         \
    t[0] += dv[0].s##N * wv2, t[1] += dv[1].s##N * wv2;                                       \
    t[2] += dv[2].s##N * wv2, t[3] += dv[3].s##N * wv2;                                       \
  }
#define LAB_ALL8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

/* One kernel per activation, so that act is a constant in the loops. Work-item (j8, row) of a
 * 2-D range k/8 wide, columns j = 8 j8: rows [0, n_dw) are 16 x 8 blocks of dw (rows
 * c0 = 16 row, n_dw = ceil(n / 16), 0 without dw), each d computed once a block and used for
 * 8 columns, each x one broadcast load used for 2 rows; the next n_dx (ceil(m / 4) or 0) are
 * blocks of 4 dx rows and 16 columns (j = 16 j8, items with j8 >= ceil(k / 16) idle), each
 * d[r, c .. c + 7] one load used for 16 columns; the next n_db hold db[c0 .. c0 + 7] at
 * c0 = 8 ((row - n_dw - n_dx) k/8 + j8). The row decides the branch. A block's half past the
 * edge is computed from the first half's data and not stored. Register blocks keep several
 * independent sums per work-item; each element's sum still adds its terms in the unfused
 * kernel's order. */
/* The sizes, offsets (in floats), block counts and acc, as one argument: PoCL copies each
 * argument of each launch into memory of its own, so that 14 scalars cost more to launch than
 * one struct (ocl_gemm.c's lab_sizes has the same layout). */
typedef struct {
  ulong m, n, k, g_off, y_off, x_off, w_off, dx_off, n_dx, dw_off, n_dw, db_off, n_db;
  int acc, unused;
} lab_sizes;

#define LAB_KERNEL(name, ACT)                                                                  \
  __kernel void name(__global const float *g, __global const float *y,                         \
                     __global const float *x, __global const float *w, __global float *dx,     \
                     __global float *dw, __global float *db, lab_sizes z) {                    \
    const int act = ACT, acc = z.acc;                                                          \
    ulong m = z.m, n = z.n, k = z.k, n_dx = z.n_dx, n_dw = z.n_dw, n_db = z.n_db;              \
    ulong dx_off = z.dx_off, dw_off = z.dw_off, db_off = z.db_off;                             \
    ulong g_off = z.g_off, y_off = z.y_off, x_off = z.x_off, w_off = z.w_off;                  \
    ulong k8 = k / 8, j8 = get_global_id(0), row = get_global_id(1), j = j8 * 8;               \
    g += g_off, y += y_off, x += x_off, w += w_off;                                            \
    if (j8 >= k8) return;                                                                      \
    if (row < n_dw) { /* dw = d^T x, each element as gemm_small_tn sums it */                  \
      ulong c0 = row * 16, c2 = c0 + 8 < n ? c0 + 8 : c0; /* the second 8 rows */              \
      float8 s[8], t[8];                                                                       \
      for (int q = 0; q < 8; q++) s[q] = t[q] = (float8)(0.0f);                                \
      for (ulong r = 0; r < m; r++) {                                                          \
        float8 dv = lab_d8(g, y, act, r * n + c0), dv2 = lab_d8(g, y, act, r * n + c2);        \
        __global const float *xr = x + r * k + j;                                              \
        LAB_ALL8(LAB_DW_TERM)                                                                  \
      }                                                                                        \
      LAB_STORE_DW8(s, c0)                                                                     \
      if (c2 != c0) LAB_STORE_DW8(t, c2)                                                       \
    } else if (row - n_dw < n_dx) { /* dx = d w, each element as gemm_small_nn sums it */      \
      if (2 * j8 >= k8) return;                                                                \
      j = 16 * j8;                                                                             \
      ulong r0 = (row - n_dw) * 4; /* rows r0 .. r0 + 3, those past m computed, not stored */  \
      ulong j2 = j + 8 < k ? 8 : 0; /* the second 8 columns, j + j2 */                         \
      ulong o[4] = {r0 * n, min(r0 + 1, m - 1) * n, min(r0 + 2, m - 1) * n,                    \
                    min(r0 + 3, m - 1) * n};                                                   \
      float8 s[4], t[4];                                                                       \
      for (int i = 0; i < 4; i++) s[i] = t[i] = (float8)(0.0f);                                \
      __global const float *pw = w + j;                                                        \
      for (ulong c = 0; c < n; c += 8, pw += 8 * k) { /* d[r, c .. c + 7] in one load */       \
        float8 dv[4];                                                                          \
        for (int i = 0; i < 4; i++) dv[i] = lab_d8(g, y, act, o[i] + c);                       \
        LAB_ALL8(LAB_DX_TERM)                                                                  \
      }                                                                                        \
      for (int i = 0; i < 4 && r0 + i < m; i++) {                                              \
        __global float *p = dx + dx_off + (r0 + i) * k + j;                                    \
        vstore8((acc & 1) ? 1.0f * s[i] + 1.0f * vload8(0, p) : 1.0f * s[i], 0, p);            \
        if (j2)                                                                                \
          vstore8((acc & 1) ? 1.0f * t[i] + 1.0f * vload8(0, p + 8) : 1.0f * t[i], 0, p + 8);  \
      }                                                                                        \
    } else if (row - n_dw - n_dx < n_db) {                                                     \
      ulong c0 = ((row - n_dw - n_dx) * k8 + j8) * 8;                                          \
      if (c0 < n) {                                                                            \
        __global float *p = db + db_off + c0;                                                  \
        float8 sum = lab_colsum8(g, y, act, m, n, c0);                                         \
        vstore8((acc & 4) ? vload8(0, p) + sum : sum, 0, p);                                   \
      }                                                                                        \
    }                                                                                          \
  }

LAB_KERNEL(linear_act_backward_none, ACT_NONE)
LAB_KERNEL(linear_act_backward_relu, ACT_RELU)
LAB_KERNEL(linear_act_backward_sigmoid, ACT_SIGMOID)
LAB_KERNEL(linear_act_backward_tanh, ACT_TANH)
