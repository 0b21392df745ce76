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
