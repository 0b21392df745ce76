/* layers.cl — the transformer layers' entries (backend.h: embedding, embedding_backward,
 * layernorm, layernorm_backward, dropout_mask), with the host backend's loops and order of
 * additions. */

static long index_at(__global const uint *idx, ulong off, int idx64, ulong i) {
  if (idx64) return ((__global const long *)(idx + off))[i];
  return (long)((__global const int *)(idx + off))[i];
}

/* Work-item (c, i). */
__kernel void embedding_f32(__global const uint *idx, ulong idx_off, int idx64,
                            __global const float *w, ulong w_off, __global float *out,
                            ulong out_off, ulong n, ulong num, ulong dim) {
  ulong c = get_global_id(0), i = get_global_id(1);
  if (c >= dim || i >= n) return;
  long t = index_at(idx, idx_off, idx64, i);
  out[out_off + i * dim + c] = t >= 0 && (ulong)t < num ? w[w_off + (ulong)t * dim + c] : NAN;
}

/* Work-item (c, v): one element of dw, its positions summed in increasing order, so the
 * result does not depend on scheduling (no atomics). */
__kernel void embedding_backward_f32(__global const uint *idx, ulong idx_off, int idx64,
                                     __global const float *g, ulong g_off, __global float *dw,
                                     ulong dw_off, ulong n, ulong num, ulong dim) {
  ulong c = get_global_id(0), v = get_global_id(1);
  if (c >= dim || v >= num) return;
  float s = 0.0f;
  for (ulong i = 0; i < n; i++)
    if (index_at(idx, idx_off, idx64, i) == (long)v) s += g[g_off + i * dim + c];
  dw[dw_off + v * dim + c] = s;
}

/* One work-item per row. */
__kernel void layernorm_f32(__global const float *x, ulong x_off, __global const float *w,
                            ulong w_off, int has_w, __global const float *b, ulong b_off,
                            int has_b, __global float *y, ulong y_off, __global float *mean,
                            ulong mean_off, __global float *rstd, ulong rstd_off, ulong rows,
                            ulong cols, float eps) {
  ulong r = get_global_id(0);
  if (r >= rows) return;
  __global const float *row = x + x_off + r * cols;
  float s = 0.0f, v = 0.0f;
  for (ulong c = 0; c < cols; c++) s += row[c];
  float m = s / (float)cols;
  for (ulong c = 0; c < cols; c++) v += (row[c] - m) * (row[c] - m);
  float rs = 1.0f / sqrt(v / (float)cols + eps);
  mean[mean_off + r] = m;
  rstd[rstd_off + r] = rs;
  for (ulong c = 0; c < cols; c++) {
    float h = (row[c] - m) * rs;
    if (has_w) h *= w[w_off + c];
    y[y_off + r * cols + c] = has_b ? h + b[b_off + c] : h;
  }
}

/* One work-item per row: dx. */
__kernel void layernorm_backward_dx_f32(__global const float *x, ulong x_off,
                                        __global const float *g, ulong g_off,
                                        __global const float *mean, ulong mean_off,
                                        __global const float *rstd, ulong rstd_off,
                                        __global const float *w, ulong w_off, int has_w,
                                        __global float *dx, ulong dx_off, ulong rows, ulong cols) {
  ulong r = get_global_id(0);
  if (r >= rows) return;
  __global const float *row = x + x_off + r * cols, *grow = g + g_off + r * cols;
  float m = mean[mean_off + r], rs = rstd[rstd_off + r], sh = 0.0f, shx = 0.0f;
  for (ulong c = 0; c < cols; c++) {
    float h = has_w ? grow[c] * w[w_off + c] : grow[c];
    sh += h;
    shx += h * (row[c] - m) * rs;
  }
  float mh = sh / (float)cols, mhx = shx / (float)cols;
  for (ulong c = 0; c < cols; c++) {
    float h = has_w ? grow[c] * w[w_off + c] : grow[c];
    dx[dx_off + r * cols + c] = rs * (h - mh - (row[c] - m) * rs * mhx);
  }
}

/* One work-item per column: dw and db, rows in increasing order. */
__kernel void layernorm_backward_dwdb_f32(__global const float *x, ulong x_off,
                                          __global const float *g, ulong g_off,
                                          __global const float *mean, ulong mean_off,
                                          __global const float *rstd, ulong rstd_off,
                                          __global float *dw, ulong dw_off, int has_dw,
                                          __global float *db, ulong db_off, int has_db,
                                          ulong rows, ulong cols) {
  ulong c = get_global_id(0);
  if (c >= cols) return;
  float sw = 0.0f, sb = 0.0f;
  for (ulong r = 0; r < rows; r++) {
    float gv = g[g_off + r * cols + c];
    sw += gv * ((x[x_off + r * cols + c] - mean[mean_off + r]) * rstd[rstd_off + r]);
    sb += gv;
  }
  if (has_dw) dw[dw_off + c] = sw;
  if (has_db) db[db_off + c] = sb;
}

static ulong splitmix64(ulong x) {
  x += 0x9E3779B97F4A7C15UL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9UL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBUL;
  return x ^ (x >> 31);
}

/* src/rng.c's generator: value offset + i of seed. */
__kernel void dropout_mask_f32(__global float *out, ulong out_off, ulong n, ulong seed,
                               ulong offset, float p, float scale) {
  ulong i = get_global_id(0);
  if (i >= n) return;
  ulong h = splitmix64(splitmix64(seed) ^ ((offset + i) * 0xD1B54A32D192ED03UL));
  float u = (float)(h >> 40) * (1.0f / 16777216.0f);
  out[out_off + i] = u < p ? 0.0f : scale;
}
