/* softmax.cl — row-wise softmax and log-softmax and their gradients, and the negative
 * log-likelihood loss that follows them.
 * One work-group per row: its work-items stride over the columns and combine their partial
 * maxima and sums in local memory, so a wide row (a large vocabulary) is not left to one
 * work-item. The row's maximum is subtracted first so that exp does not overflow. The local
 * size is a power of two (the tree reductions below rely on it). */

/* Leaves the reduction of v over the work-group in every work-item's return value. */
float group_max(float v, __local float *s) {
  uint l = get_local_id(0);
  s[l] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (uint h = get_local_size(0) / 2; h > 0; h >>= 1) {
    if (l < h) s[l] = fmax(s[l], s[l + h]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  float r = s[0];
  barrier(CLK_LOCAL_MEM_FENCE); /* s is reused by the next reduction */
  return r;
}

float group_sum(float v, __local float *s) {
  uint l = get_local_id(0);
  s[l] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (uint h = get_local_size(0) / 2; h > 0; h >>= 1) {
    if (l < h) s[l] += s[l + h];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  float r = s[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return r;
}

/* out = softmax(a) (take_log == 0) or log_softmax(a), per row of cols; out may be a, since
 * every read of the row happens before the barriers that precede the writes. */
__kernel void softmax_f32(__global const float *a, ulong a_off, __global float *out,
                          ulong out_off, ulong cols, int take_log, __local float *s) {
  ulong row = get_group_id(0);
  uint l = get_local_id(0), L = get_local_size(0);
  __global const float *x = a + a_off + row * cols;
  __global float *y = out + out_off + row * cols;
  float m = -INFINITY;
  for (ulong c = l; c < cols; c += L) m = fmax(m, x[c]);
  m = group_max(m, s);
  float sum = 0.0f;
  for (ulong c = l; c < cols; c += L) sum += exp(x[c] - m);
  sum = group_sum(sum, s);
  float lse = log(sum);
  for (ulong c = l; c < cols; c += L)
    y[c] = take_log ? (x[c] - m) - lse : exp(x[c] - m) / sum;
}

/* From the forward's output y and the gradient g, per row:
 *   softmax:     out = y * (g - sum(g * y))
 *   log-softmax: out = g - exp(y) * sum(g) */
__kernel void softmax_backward_f32(__global const float *y, ulong y_off, __global const float *g,
                                   ulong g_off, __global float *out, ulong out_off, ulong cols,
                                   int take_log, __local float *s) {
  ulong row = get_group_id(0);
  uint l = get_local_id(0), L = get_local_size(0);
  __global const float *yr = y + y_off + row * cols;
  __global const float *gr = g + g_off + row * cols;
  __global float *o = out + out_off + row * cols;
  float dot = 0.0f;
  for (ulong c = l; c < cols; c += L) dot += take_log ? gr[c] : gr[c] * yr[c];
  dot = group_sum(dot, s);
  for (ulong c = l; c < cols; c += L)
    o[c] = take_log ? gr[c] - exp(yr[c]) * dot : yr[c] * (gr[c] - dot);
}

/* out[r] = -a[r, labels[r]]; the labels are int32 class indices (a float would be exact only
 * up to 2^24), checked by the caller to lie in 0 .. cols-1. */
__kernel void nll_f32(__global const float *a, ulong a_off, __global const int *labels,
                      ulong l_off, __global float *out, ulong out_off, ulong rows, ulong cols) {
  ulong r = get_global_id(0);
  if (r < rows) out[out_off + r] = -a[a_off + r * cols + (ulong)labels[l_off + r]];
}

/* out[r, c] = c == labels[r] ? -g[r] : 0 (int32 labels, as for nll_f32) */
__kernel void nll_backward_f32(__global const int *labels, ulong l_off, __global const float *g,
                               ulong g_off, __global float *out, ulong out_off, ulong rows,
                               ulong cols) {
  ulong c = get_global_id(0), r = get_global_id(1);
  if (c < cols && r < rows)
    out[out_off + r * cols + c] = c == (ulong)labels[l_off + r] ? -g[g_off + r] : 0.0f;
}

/* ---- softmax cross-entropy (backend.h's xent, xent_backward): one work-group per row ----
 * Targets are int32 (idx64 == 0) or int64 (idx64 == 1, offset in words); logp is the
 * softmax_f32 kernel's log_softmax, element for element. */
static long xent_target(__global const int *idx, ulong idx_off, int idx64, ulong r) {
  return idx64 ? ((__global const long *)idx)[idx_off / 2 + r] : (long)idx[idx_off + r];
}

/* The row's maximum and log of its sum of exp(x - max), in every work-item. */
static void xent_row(__global const float *x, ulong cols, __local float *s, float *m,
                     float *lse) {
  uint l = get_local_id(0), L = get_local_size(0);
  float mx = -INFINITY;
  for (ulong c = l; c < cols; c += L) mx = fmax(mx, x[c]);
  mx = group_max(mx, s);
  float sum = 0.0f;
  for (ulong c = l; c < cols; c += L) sum += exp(x[c] - mx);
  sum = group_sum(sum, s);
  *m = mx;
  *lse = log(sum);
}

/* A row's loss from its max m and log-sum-exp lse: -(x[t] - m - lse), 0 for an ignored target
 * (weight 0, else 1), NaN for one out of range. */
static void xent_store(__global const float *x, ulong cols, long t, long ignore, float m, float lse,
                       __global float *loss, __global float *weight) {
  *weight = t == ignore ? 0.0f : 1.0f;
  *loss = t == ignore                 ? 0.0f
          : t >= 0 && (ulong)t < cols ? -((x[t] - m) - lse)
                                      : NAN;
}

/* loss[r] = t == ignore ? 0 : 0 <= t < cols ? -logp[r, t] : NaN;  weight[r] = t != ignore */
__kernel void xent_f32(__global const float *a, ulong a_off, __global const int *idx,
                       ulong idx_off, int idx64, long ignore, __global float *loss, ulong l_off,
                       __global float *weight, ulong w_off, ulong cols, __local float *s) {
  ulong r = get_group_id(0);
  __global const float *x = a + a_off + r * cols;
  float m, lse;
  xent_row(x, cols, s, &m, &lse);
  if (get_local_id(0) != 0) return;
  xent_store(x, cols, xent_target(idx, idx_off, idx64, r), ignore, m, lse, loss + l_off + r,
             weight + w_off + r);
}

/* s = has_count ? g / count : alpha g; out[r, c] = d - exp(logp[r, c]) * -s, d = -s at the
 * target (0 elsewhere), for rows whose target is in range and not ignored; 0 for the others. */
__kernel void xent_backward_f32(__global const float *a, ulong a_off, __global const int *idx,
                                ulong idx_off, int idx64, long ignore, __global const float *g,
                                ulong g_off, __global const float *count, ulong c_off,
                                int has_count, float alpha, __global float *out, ulong out_off,
                                ulong cols, __local float *s) {
  ulong r = get_group_id(0);
  uint l = get_local_id(0), L = get_local_size(0);
  __global const float *x = a + a_off + r * cols;
  __global float *o = out + out_off + r * cols;
  long t = xent_target(idx, idx_off, idx64, r);
  if (t == ignore || t < 0 || (ulong)t >= cols) {
    for (ulong c = l; c < cols; c += L) o[c] = 0.0f;
    return; /* the whole group returns: no barrier is left waiting */
  }
  float m, lse;
  xent_row(x, cols, s, &m, &lse);
  float sv = has_count ? g[g_off] / count[c_off] : alpha * g[g_off], dot = -sv;
  for (ulong c = l; c < cols; c += L) {
    float d = (long)c == t ? -sv : 0.0f;
    o[c] = d - exp((x[c] - m) - lse) * dot;
  }
}

/* ---- the same for short rows on CPU devices: one work-item a row, 8 columns at a time ----
 * (ocl_xent: rows of at most XENT_ROW_COLS columns.) A group-wide reduction over a short row
 * costs more in the barriers' work-item loops than the row's arithmetic; here a work-item
 * reads its row twice (maximum, then sum of exp) with float8 loads. The same results as the
 * group kernels up to the order of the sums; rows past `rows` do nothing. */

/* The row's maximum and log of its sum of exp(x - max). */
static void xent_row_one(__global const float *x, ulong cols, float *m, float *lse) {
  ulong c8 = cols & ~(ulong)7, c;
  float8 mv = (float8)(-INFINITY);
  for (c = 0; c < c8; c += 8) mv = fmax(mv, vload8(0, x + c));
  float4 m4 = fmax(mv.lo, mv.hi);
  float mx = fmax(fmax(m4.x, m4.z), fmax(m4.y, m4.w));
  for (; c < cols; c++) mx = fmax(mx, x[c]);
  float8 sv = (float8)(0.0f);
  for (c = 0; c < c8; c += 8) sv += exp(vload8(0, x + c) - mx);
  float4 s4 = sv.lo + sv.hi;
  float sum = (s4.x + s4.z) + (s4.y + s4.w);
  for (; c < cols; c++) sum += exp(x[c] - mx);
  *m = mx;
  *lse = log(sum);
}

/* xent_f32's results, one work-item a row. */
__kernel void xent_row_f32(__global const float *a, ulong a_off, __global const int *idx,
                           ulong idx_off, int idx64, long ignore, __global float *loss,
                           ulong l_off, __global float *weight, ulong w_off, ulong cols,
                           ulong rows) {
  ulong r = get_global_id(0);
  if (r >= rows) return;
  __global const float *x = a + a_off + r * cols;
  float m, lse;
  xent_row_one(x, cols, &m, &lse);
  xent_store(x, cols, xent_target(idx, idx_off, idx64, r), ignore, m, lse, loss + l_off + r,
             weight + w_off + r);
}

/* xent_backward_f32's results, one work-item a row. */
__kernel void xent_backward_row_f32(__global const float *a, ulong a_off, __global const int *idx,
                                    ulong idx_off, int idx64, long ignore,
                                    __global const float *g, ulong g_off,
                                    __global const float *count, ulong c_off, int has_count,
                                    float alpha, __global float *out, ulong out_off, ulong cols,
                                    ulong rows) {
  ulong r = get_global_id(0);
  if (r >= rows) return;
  __global const float *x = a + a_off + r * cols;
  __global float *o = out + out_off + r * cols;
  ulong c8 = cols & ~(ulong)7, c;
  long t = xent_target(idx, idx_off, idx64, r);
  if (t == ignore || t < 0 || (ulong)t >= cols) {
    for (c = 0; c < c8; c += 8) vstore8((float8)(0.0f), 0, o + c);
    for (; c < cols; c++) o[c] = 0.0f;
    return;
  }
  float m, lse;
  xent_row_one(x, cols, &m, &lse);
  float sv = has_count ? g[g_off] / count[c_off] : alpha * g[g_off], dot = -sv;
  const int8 lane = (int8)(0, 1, 2, 3, 4, 5, 6, 7);
  for (c = 0; c < c8; c += 8) {
    float8 d = select((float8)(0.0f), (float8)(-sv), (int8)(c - t) + lane == 0);
    vstore8(d - exp((vload8(0, x + c) - m) - lse) * dot, 0, o + c);
  }
  for (; c < cols; c++) {
    float d = (long)c == t ? -sv : 0.0f;
    o[c] = d - exp((x[c] - m) - lse) * dot;
  }
}
