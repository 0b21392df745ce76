/* pool.cl — max pooling (with the argmax kept as an int32 per output) and PyTorch's adaptive
 * average pooling, forward and backward (backend.h's formulas). Backward passes gather: one
 * work-item per input element sums what reaches it, so no atomics are needed. */

__kernel void max_pool2d_f32(__global const float *x, ulong x_off, __global float *y, ulong y_off,
                             __global int *idx, ulong i_off, ulong total, int h, int w, int kh,
                             int kw, int sh, int sw, int ph, int pw, int oh, int ow) {
  ulong o = get_global_id(0);
  if (o >= total) return;
  ulong P = (ulong)oh * ow, b = o / P;
  int p = (int)(o - b * P), oy = p / ow, ox = p - oy * ow;
  int y0 = oy * sh - ph, x0 = ox * sw - pw, best = -1;
  __global const float *plane = x + x_off + b * (ulong)h * w;
  float top = -INFINITY;
  for (int yy = max(y0, 0); yy < min(y0 + kh, h); yy++)
    for (int xx = max(x0, 0); xx < min(x0 + kw, w); xx++) {
      float v = plane[yy * w + xx];
      if (best < 0 || (!isnan(top) && (v > top || isnan(v)))) {
        top = v;
        best = yy * w + xx;
      }
    }
  y[y_off + o] = top;
  idx[i_off + o] = best;
}

/* The outputs whose window [o s - pad, o s - pad + k) holds i: [lo, hi). */
static void windows_of(int i, int k, int s, int pad, int out, int *lo, int *hi) {
  int num = i + pad - k + 1;
  *lo = num <= 0 ? 0 : (num + s - 1) / s;
  *hi = min((i + pad) / s + 1, out);
}

__kernel void max_pool2d_backward_f32(__global const float *dy, ulong g_off,
                                      __global const int *idx, ulong i_off, __global float *dx,
                                      ulong d_off, ulong total, int h, int w, int kh, int kw,
                                      int sh, int sw, int ph, int pw, int oh, int ow) {
  ulong e = get_global_id(0);
  if (e >= total) return;
  ulong HW = (ulong)h * w, b = e / HW;
  int q = (int)(e - b * HW), y = q / w, xx = q - y * w, oy0, oy1, ox0, ox1;
  windows_of(y, kh, sh, ph, oh, &oy0, &oy1);
  windows_of(xx, kw, sw, pw, ow, &ox0, &ox1);
  ulong base = b * (ulong)oh * ow;
  float sum = 0.0f;
  for (int oy = oy0; oy < oy1; oy++)
    for (int ox = ox0; ox < ox1; ox++)
      if (idx[i_off + base + oy * ow + ox] == q) sum += dy[g_off + base + oy * ow + ox];
  dx[d_off + e] = sum;
}

static int bin_start(int i, int in, int out) {
  return (int)((long)i * in / out);
}
static int bin_end(int i, int in, int out) {
  return (int)(((long)(i + 1) * in + out - 1) / out);
}

__kernel void avg_pool2d_adaptive_f32(__global const float *x, ulong x_off, __global float *y,
                                      ulong y_off, ulong total, int h, int w, int oh, int ow) {
  ulong o = get_global_id(0);
  if (o >= total) return;
  ulong P = (ulong)oh * ow, b = o / P;
  int p = (int)(o - b * P), oy = p / ow, ox = p - oy * ow;
  int y0 = bin_start(oy, h, oh), y1 = bin_end(oy, h, oh);
  int x0 = bin_start(ox, w, ow), x1 = bin_end(ox, w, ow);
  __global const float *plane = x + x_off + b * (ulong)h * w;
  float sum = 0.0f, comp = 0.0f; /* Kahan: a 1x1 bin sums a whole plane */
  for (int yy = y0; yy < y1; yy++)
    for (int xx = x0; xx < x1; xx++) {
      float t = plane[yy * w + xx] - comp, s = sum + t;
      comp = (s - sum) - t;
      sum = s;
    }
  y[y_off + o] = sum / (float)((y1 - y0) * (x1 - x0));
}

__kernel void avg_pool2d_adaptive_backward_f32(__global const float *dy, ulong g_off,
                                               __global float *dx, ulong d_off, ulong total,
                                               int h, int w, int oh, int ow) {
  ulong e = get_global_id(0);
  if (e >= total) return;
  ulong HW = (ulong)h * w, b = e / HW;
  int q = (int)(e - b * HW), y = q / w, xx = q - y * w;
  int oy0 = (int)((long)y * oh / h), ox0 = (int)((long)xx * ow / w);
  while (oy0 > 0 && bin_end(oy0 - 1, h, oh) > y) oy0--;
  while (ox0 > 0 && bin_end(ox0 - 1, w, ow) > xx) ox0--;
  float sum = 0.0f;
  for (int oy = oy0; oy < oh && bin_start(oy, h, oh) <= y; oy++)
    for (int ox = ox0; ox < ow && bin_start(ox, w, ow) <= xx; ox++) {
      int cnt = (bin_end(oy, h, oh) - bin_start(oy, h, oh)) * (bin_end(ox, w, ow) - bin_start(ox, w, ow));
      sum += dy[g_off + b * (ulong)oh * ow + oy * ow + ox] / (float)cnt;
    }
  dx[d_off + e] = sum;
}
