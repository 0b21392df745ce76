/* activation.cl — element-wise activations and their gradients (relu, sigmoid, tanh), and
 * the forward-only exp, sqrt and negation that the core composes fused ops from.
 * The kind is a kernel argument: it is the same for every work-item, so the branch costs
 * nothing, and one kernel serves all three. Values match backend.h's clpar_unary_kind. */

#define CLPAR_RELU 0
#define CLPAR_SIGMOID 1
#define CLPAR_TANH 2
#define CLPAR_EXP 3
#define CLPAR_SQRT 4

/* out[i] = f(a[i]); out may be a. */
__kernel void unary_f32(__global const float *a, ulong a_off, __global float *out,
                        ulong out_off, ulong n, int kind) {
  ulong i = get_global_id(0);
  if (i >= n) return;
  float x = a[a_off + i];
  out[out_off + i] = kind == CLPAR_RELU      ? fmax(x, 0.0f)
                     : kind == CLPAR_SIGMOID ? 1.0f / (1.0f + exp(-x))
                     : kind == CLPAR_TANH    ? tanh(x)
                     : kind == CLPAR_EXP     ? exp(x)
                     : kind == CLPAR_SQRT    ? sqrt(x)
                                             : -x;
}

/* out[i] = g[i] * f'(.), from the input x (relu) or the output y (sigmoid, tanh); out may
 * be g. relu's is a select, g where x > 0 else 0, as PyTorch's threshold_backward: an inf or
 * NaN gradient does not pass where x <= 0. */
__kernel void unary_backward_f32(__global const float *g, ulong g_off, __global const float *saved,
                                 ulong s_off, __global float *out, ulong out_off, ulong n,
                                 int kind) {
  ulong i = get_global_id(0);
  if (i >= n) return;
  float s = saved[s_off + i], gi = g[g_off + i];
  out[out_off + i] = kind == CLPAR_RELU      ? (s > 0.0f ? gi : 0.0f)
                     : kind == CLPAR_SIGMOID ? gi * (s * (1.0f - s))
                                             : gi * (1.0f - s * s);
}

/* ---- the fused Linear epilogues (backend.h: bias_act, bias_act_backward) ---- */

#define CLPAR_ACT_NONE 0
#define CLPAR_ACT_RELU 1
#define CLPAR_ACT_SIGMOID 2
#define CLPAR_ACT_TANH 3

/* out[r, c] = f(a[r, c] + bias[c]); out may be a. The sum is a float before f. */
__kernel void bias_act_f32(__global const float *a, ulong a_off, __global const float *bias,
                           ulong b_off, __global float *out, ulong out_off, ulong rows,
                           ulong cols, int act) {
  ulong c = get_global_id(0), r = get_global_id(1);
  if (c >= cols || r >= rows) return;
  ulong i = r * cols + c;
  float x = a[a_off + i] + bias[b_off + c];
  out[out_off + i] = act == CLPAR_ACT_RELU      ? fmax(x, 0.0f)
                     : act == CLPAR_ACT_SIGMOID ? 1.0f / (1.0f + exp(-x))
                     : act == CLPAR_ACT_TANH    ? tanh(x)
                                                : x;
}

/* d = g f'(y) at element i (act none: d = g), written to out when has_out. */
inline float act_backward_at(__global const float *gr, ulong g_off, __global const float *y,
                             ulong y_off, __global float *out, ulong out_off, int store,
                             int act, ulong i) {
  float d = gr[g_off + i];
  if (act != CLPAR_ACT_NONE) {
    float v = y[y_off + i];
    d = act == CLPAR_ACT_RELU      ? (v > 0.0f ? d : 0.0f) /* a select, as unary_backward */
        : act == CLPAR_ACT_SIGMOID ? d * (v * (1.0f - v))
                                   : d * (1.0f - v * v);
  }
  if (store) out[out_off + i] = d;
  return d;
}

/* For rows [g * chunk, min(rows, (g + 1) * chunk)) of column c: d = g f'(y), written to out
 * when has_out, and the chunk's sum of d, in sum_rows_f32's order (reduce.cl), stored at
 * db[g * cols + c], or added to what is there when accumulate. One launch with one chunk does
 * the whole entry; a tall matrix takes two (partial sums, then their sum with act none). */
__kernel void bias_act_backward_f32(__global const float *gr, ulong g_off,
                                    __global const float *y, ulong y_off, __global float *out,
                                    ulong out_off, int has_out, ulong rows, ulong cols,
                                    ulong chunk, int act, __global float *db, ulong db_off,
                                    int accumulate) {
  ulong c = get_global_id(0), g = get_global_id(1);
  ulong r0 = g * chunk;
  ulong r1 = min(rows, r0 + chunk);
  /* Work-items past the last column compute column cols-1 and store nothing. */
  ulong col = min(c, cols - 1);
  int st = has_out && c < cols;
  float sum = 0.0f, comp = 0.0f;
  for (ulong r = r0; r < r1; r += 16) {
    ulong end = min(r1, r + 16), q = r;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    for (; q + 4 <= end; q += 4) {
      s0 += act_backward_at(gr, g_off, y, y_off, out, out_off, st, act, q * cols + col);
      s1 += act_backward_at(gr, g_off, y, y_off, out, out_off, st, act, (q + 1) * cols + col);
      s2 += act_backward_at(gr, g_off, y, y_off, out, out_off, st, act, (q + 2) * cols + col);
      s3 += act_backward_at(gr, g_off, y, y_off, out, out_off, st, act, (q + 3) * cols + col);
    }
    for (; q < end; q++)
      s0 += act_backward_at(gr, g_off, y, y_off, out, out_off, st, act, q * cols + col);
    float t0 = ((s0 + s1) + (s2 + s3)) - comp;
    float t = sum + t0;
    /* Past an infinity the compensation would turn into NaN; a plain sum keeps inf. */
    comp = isfinite(t) ? (t - sum) - t0 : 0.0f;
    sum = t;
  }
  if (c < cols) {
    ulong o = db_off + g * cols + c;
    db[o] = accumulate ? db[o] + sum : sum;
  }
}
