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

/* Row N of an 8 x 8 block held as 8 columns. */
#define LAB_ROW(N)                                                                            \
  (float8)(s[0].s##N, s[1].s##N, s[2].s##N, s[3].s##N, s[4].s##N, s[5].s##N, s[6].s##N,       \
           s[7].s##N)
#define LAB_STORE_DW(N)                                                                       \
  {                                                                                           \
    __global float *p = dw + dw_off + (c0 + N) * k + j;                                       \
    float8 t = LAB_ROW(N);                                                                    \
    vstore8((acc & 2) ? 1.0f * t + 1.0f * vload8(0, p) : 1.0f * t, 0, p);                     \
  }

/* Column c + N of the 8 in dv: w's row c + N times d[r, c + N] added into each of 4 rows. */
#define LAB_DX_TERM(N)                                                                        \
  {                                                                                           \
    float8 wv = vload8(0, pw + N * k);                                                        \
    s[0] += dv[0].s##N * wv, s[1] += dv[1].s##N * wv;                                         \
    s[2] += dv[2].s##N * wv, s[3] += dv[3].s##N * wv;                                         \
  }

/* One kernel per activation, so that act is a constant in the loops. Work-item (j8, row) of a
 * 2-D range k/8 wide, columns j = 8 j8: rows [0, n_dw) are 8 x 8 blocks of dw (rows c0 = 8 row,
 * n_dw = n/8, 0 without dw), each d computed once a block and used for 8 columns; the next
 * n_dx (ceil(m / 4) or 0) blocks of 4 dx rows, each d[r, c .. c + 7] one load used for 8
 * columns; the next n_db hold db[c0 .. c0 + 7] at c0 = 8 ((row - n_dw - n_dx) k/8 + j8). The
 * row decides the branch. Register blocks keep a few independent sums per work-item; each
 * element's sum still adds its terms in the unfused kernel's order. */
#define LAB_KERNEL(name, ACT)                                                                  \
  __kernel void name(ulong m, ulong n, ulong k, __global const float *g, ulong g_off,          \
                     __global const float *y, ulong y_off, __global const float *x,            \
                     ulong x_off, __global const float *w, ulong w_off, __global float *dx,    \
                     ulong dx_off, ulong n_dx, __global float *dw, ulong dw_off, ulong n_dw,   \
                     __global float *db, ulong db_off, ulong n_db, int acc) {                  \
    const int act = ACT;                                                                       \
    ulong k8 = k / 8, j8 = get_global_id(0), row = get_global_id(1), j = j8 * 8;               \
    g += g_off, y += y_off, x += x_off, w += w_off;                                            \
    if (j8 >= k8) return;                                                                      \
    if (row < n_dw) { /* dw = d^T x, each element as gemm_small_tn sums it */                  \
      ulong c0 = row * 8;                                                                      \
      float8 s[8];                                                                             \
      for (int q = 0; q < 8; q++) s[q] = (float8)(0.0f);                                       \
      for (ulong r = 0; r < m; r++) {                                                          \
        float8 dv = lab_d8(g, y, act, r * n + c0), xv = vload8(0, x + r * k + j);              \
        s[0] += dv * xv.s0, s[1] += dv * xv.s1, s[2] += dv * xv.s2, s[3] += dv * xv.s3;        \
        s[4] += dv * xv.s4, s[5] += dv * xv.s5, s[6] += dv * xv.s6, s[7] += dv * xv.s7;        \
      }                                                                                        \
      LAB_STORE_DW(0) LAB_STORE_DW(1) LAB_STORE_DW(2) LAB_STORE_DW(3)                          \
      LAB_STORE_DW(4) LAB_STORE_DW(5) LAB_STORE_DW(6) LAB_STORE_DW(7)                          \
    } else if (row - n_dw < n_dx) { /* dx = d w, each element as gemm_small_nn sums it */      \
      ulong r0 = (row - n_dw) * 4; /* rows r0 .. r0 + 3, those past m computed, not stored */  \
      ulong o[4] = {r0 * n, min(r0 + 1, m - 1) * n, min(r0 + 2, m - 1) * n,                    \
                    min(r0 + 3, m - 1) * n};                                                   \
      float8 s[4] = {(float8)(0.0f), (float8)(0.0f), (float8)(0.0f), (float8)(0.0f)};          \
      __global const float *pw = w + j;                                                        \
      for (ulong c = 0; c < n; c += 8, pw += 8 * k) { /* d[r, c .. c + 7] in one load */       \
        float8 dv[4];                                                                          \
        for (int i = 0; i < 4; i++) dv[i] = lab_d8(g, y, act, o[i] + c);                       \
        LAB_DX_TERM(0) LAB_DX_TERM(1) LAB_DX_TERM(2) LAB_DX_TERM(3)                            \
        LAB_DX_TERM(4) LAB_DX_TERM(5) LAB_DX_TERM(6) LAB_DX_TERM(7)                            \
      }                                                                                        \
      for (int i = 0; i < 4 && r0 + i < m; i++) {                                              \
        __global float *p = dx + dx_off + (r0 + i) * k + j;                                    \
        vstore8((acc & 1) ? 1.0f * s[i] + 1.0f * vload8(0, p) : 1.0f * s[i], 0, p);            \
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
