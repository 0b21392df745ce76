/* linear_backward.cl — a Linear's whole backward in one launch for small shapes on CPU devices
 * (backend.h's linear_act_backward): from g [m, n], the forward's output y [m, n], x [m, k]
 * and w [n, k], with d = g f'(y) recomputed wherever it is read (a select or two multiplies
 * against a load, so that no work-item waits for another):
 *   dw's row c, 8 columns j: sum over r of d[r, c] x[r, j..]   (gemm_small_tn's order)
 *   dx's row r, 8 columns j: sum over c of d[r, c] w[c, j..]   (gemm_small_nn's order)
 *   db[c]: sum over r of d[r, c]                  (bias_act_backward_f32's, one chunk)
 * each summed in the order of the kernel the unfused path runs, so that the results are the
 * same bits; k is a multiple of 8. A zero count skips an output; acc's bits (1 dx, 2 dw, 4 db)
 * add to what is there. */

#define ACT_NONE 0
#define ACT_RELU 1
#define ACT_SIGMOID 2
#define ACT_TANH 3

/* d at element i, as activation.cl's act_backward_at computes it. */
inline float lab_d(__global const float *g, __global const float *y, int act, ulong i) {
  float d = g[i];
  if (act != ACT_NONE) {
    float v = y[i];
    d = act == ACT_RELU      ? (v > 0.0f ? d : 0.0f)
        : act == ACT_SIGMOID ? d * (v * (1.0f - v))
                             : d * (1.0f - v * v);
  }
  return d;
}

/* db[c]: bias_act_backward_f32's compensated sum over blocks of 16 rows. */
inline float lab_colsum(__global const float *g, __global const float *y, int act, ulong m,
                        ulong n, ulong c) {
  float sum = 0.0f, comp = 0.0f;
  for (ulong r = 0; r < m; r += 16) {
    ulong end = min(m, r + 16), q = r;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    for (; q + 4 <= end; q += 4) {
      s0 += lab_d(g, y, act, q * n + c);
      s1 += lab_d(g, y, act, (q + 1) * n + c);
      s2 += lab_d(g, y, act, (q + 2) * n + c);
      s3 += lab_d(g, y, act, (q + 3) * n + c);
    }
    for (; q < end; q++) s0 += lab_d(g, y, act, q * n + c);
    float t0 = ((s0 + s1) + (s2 + s3)) - comp;
    float t = sum + t0;
    comp = isfinite(t) ? (t - sum) - t0 : 0.0f;
    sum = t;
  }
  return sum;
}

/* One kernel per activation, so that act is a constant in the loops. Work-item (j8, row) of a
 * 2-D range k/8 wide, columns j = 8 j8: rows [0, n_dw) are dw's (n_dw = n, 0 without dw),
 * the next n_dx (m or 0) dx's, the next n_db hold db[c] at c = (row - n_dw - n_dx) k/8 + j8.
 * The row decides the branch, the same for a whole row of work-items. */
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
    if (row < n_dw) { /* dw = d^T x, as gemm_small_tn */                                       \
      float8 s = (float8)(0.0f);                                                               \
      for (ulong r = 0; r < m; r++)                                                            \
        s += lab_d(g, y, act, r * n + row) * vload8(0, x + r * k + j);                        \
      __global float *p = dw + dw_off + row * k + j;                                           \
      vstore8((acc & 2) ? 1.0f * s + 1.0f * vload8(0, p) : 1.0f * s, 0, p);                    \
    } else if (row - n_dw < n_dx) { /* dx = d w, as gemm_small_nn */                           \
      ulong r = row - n_dw;                                                                    \
      float8 s = (float8)(0.0f);                                                               \
      for (ulong c = 0; c < n; c++)                                                            \
        s += lab_d(g, y, act, r * n + c) * vload8(0, w + c * k + j);                           \
      __global float *p = dx + dx_off + r * k + j;                                             \
      vstore8((acc & 1) ? 1.0f * s + 1.0f * vload8(0, p) : 1.0f * s, 0, p);                    \
    } else if (row - n_dw - n_dx < n_db) {                                                     \
      ulong c = (row - n_dw - n_dx) * k8 + j8;                                                 \
      if (c < n) {                                                                             \
        float sum = lab_colsum(g, y, act, m, n, c);                                            \
        db[db_off + c] = (acc & 4) ? db[db_off + c] + sum : sum;                               \
      }                                                                                        \
    }                                                                                          \
  }

LAB_KERNEL(linear_act_backward_none, ACT_NONE)
LAB_KERNEL(linear_act_backward_relu, ACT_RELU)
LAB_KERNEL(linear_act_backward_sigmoid, ACT_SIGMOID)
LAB_KERNEL(linear_act_backward_tanh, ACT_TANH)
