/* tensor_ops.cl — the tensor ops of transformers (backend.h: strided_copy, pointwise,
 * mask_upper, argmax, nll_ignore, nll_ignore_backward). One work-item per element (per row
 * for argmax and nll_ignore); the formulas are backend.h's. */

/* Element e of the geometry: its index decomposed from the last dimension. Words are copied
 * as uints, so every dtype moves unchanged. */
__kernel void strided_copy_u32(__global const uint *in, ulong in_off, __global uint *out,
                               ulong out_off, int ndim, long8 shape, long8 is, long8 os,
                               ulong total) {
  ulong e = get_global_id(0);
  if (e >= total) return;
  long sh[8] = {shape.s0, shape.s1, shape.s2, shape.s3, shape.s4, shape.s5, shape.s6, shape.s7};
  long ist[8] = {is.s0, is.s1, is.s2, is.s3, is.s4, is.s5, is.s6, is.s7};
  long ost[8] = {os.s0, os.s1, os.s2, os.s3, os.s4, os.s5, os.s6, os.s7};
  long rest = (long)e, io = 0, oo = 0;
  for (int d = ndim - 1; d >= 0; d--) {
    long i = rest % sh[d];
    rest /= sh[d];
    io += i * ist[d];
    oo += i * ost[d];
  }
  out[out_off + oo] = in[in_off + io];
}

#define PW_LOG 0
#define PW_POW 1
#define PW_GELU_TANH 2
#define SQRT_2_OVER_PI 0.7978845608028654f
#define GELU_C 0.044715f

/* has_g == 0: out = f(x); otherwise out = g * f'(x). */
__kernel void pointwise_f32(__global const float *x, ulong x_off, __global const float *g,
                            ulong g_off, int has_g, __global float *out, ulong out_off, ulong n,
                            int kind, float p) {
  ulong i = get_global_id(0);
  if (i >= n) return;
  float v = x[x_off + i], r;
  if (!has_g) {
    r = kind == PW_LOG         ? log(v)
        : kind == PW_POW       ? pow(v, p)
        : kind == PW_GELU_TANH ? 0.5f * v * (1.0f + tanh(SQRT_2_OVER_PI * (v + GELU_C * v * v * v)))
                               : 0.5f * v * (1.0f + erf(v * 0.7071067811865476f));
  } else {
    float d;
    if (kind == PW_LOG) {
      d = 1.0f / v;
    } else if (kind == PW_POW) {
      d = p == 0.0f ? 0.0f : p * pow(v, p - 1.0f);
    } else if (kind == PW_GELU_TANH) {
      float t = tanh(SQRT_2_OVER_PI * (v + GELU_C * v * v * v));
      d = 0.5f * (1.0f + t) +
          0.5f * v * (1.0f - t * t) * SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_C * v * v);
    } else {
      d = 0.5f * (1.0f + erf(v * 0.7071067811865476f)) +
          v * exp(-0.5f * v * v) * 0.3989422804014327f;
    }
    r = g[g_off + i] * d;
  }
  out[out_off + i] = r;
}

/* Work-item (j, b * rows + i). */
__kernel void mask_upper_f32(__global const float *a, ulong a_off, __global float *out,
                             ulong out_off, ulong rows, ulong cols, ulong nrows, long diagonal,
                             float value) {
  ulong j = get_global_id(0), br = get_global_id(1);
  if (j >= cols || br >= nrows) return;
  long i = (long)(br % rows);
  ulong e = br * cols + j;
  out[out_off + e] = (long)j - i >= diagonal ? value : a[a_off + e];
}

/* One work-item per row; out is int64 words at out_off (even). */
__kernel void argmax_f32(__global const float *a, ulong a_off, __global long *out, ulong out_off,
                         ulong rows, ulong cols) {
  ulong r = get_global_id(0);
  if (r >= rows) return;
  __global const float *row = a + a_off + r * cols;
  ulong best = 0;
  for (ulong c = 1; c < cols && !isnan(row[best]); c++)
    if (row[c] > row[best] || isnan(row[c])) best = c;
  out[out_off / 2 + r] = (long)best;
}

static long target_at(__global const int *idx, ulong idx_off, int idx64, ulong r) {
  return idx64 ? ((__global const long *)idx)[idx_off / 2 + r] : (long)idx[idx_off + r];
}

__kernel void nll_ignore_f32(__global const float *a, ulong a_off, __global const int *idx,
                             ulong idx_off, int idx64, long ignore, __global float *loss,
                             ulong l_off, __global float *weight, ulong w_off, ulong rows,
                             ulong cols) {
  ulong r = get_global_id(0);
  if (r >= rows) return;
  long t = target_at(idx, idx_off, idx64, r);
  weight[w_off + r] = t == ignore ? 0.0f : 1.0f;
  loss[l_off + r] = t == ignore                    ? 0.0f
                    : t >= 0 && (ulong)t < cols ? -a[a_off + r * cols + (ulong)t]
                                                 : NAN;
}

/* Work-item (c, r). */
__kernel void nll_ignore_backward_f32(__global const int *idx, ulong idx_off, int idx64,
                                      long ignore, __global const float *scale, ulong s_off,
                                      __global float *out, ulong out_off, ulong rows,
                                      ulong cols) {
  ulong c = get_global_id(0), r = get_global_id(1);
  if (c >= cols || r >= rows) return;
  long t = target_at(idx, idx_off, idx64, r);
  out[out_off + r * cols + c] = t != ignore && (long)c == t ? -scale[s_off] : 0.0f;
}
