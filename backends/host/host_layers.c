/* host_layers.c — the host backend's entries of the transformer layers (backend.h):
 * embedding gather and its deterministic scatter-add, LayerNorm forward and backward, and
 * dropout's mask from the counter-based generator. Plain loops; the host is the reference. */
#include <math.h>
#include <stdint.h>

#include "host/host_tensor_ops.h"

#define HOST_PAR 65536 /* elements above which a loop runs on OpenMP's team */

static float *at(clpar_bref r) {
  return (float *)r.buf + r.off;
}

static int64_t index_at(clpar_bref idx, int idx64, size_t i) {
  const uint32_t *w = (const uint32_t *)idx.buf + idx.off;
  return idx64 ? ((const int64_t *)(const void *)w)[i] : (int64_t)((const int32_t *)w)[i];
}

clpar_status clpar_host_embedding(void *dev, size_t n, size_t num, size_t dim, int idx64,
                                  clpar_bref idx, clpar_bref w, clpar_bref out) {
  (void)dev;
  const float *pw = at(w);
  float *po = at(out);
#pragma omp parallel for if (n * dim > HOST_PAR) schedule(static)
  for (size_t i = 0; i < n; i++) {
    int64_t t = index_at(idx, idx64, i);
    int ok = t >= 0 && (uint64_t)t < num;
    for (size_t c = 0; c < dim; c++) po[i * dim + c] = ok ? pw[(size_t)t * dim + c] : NAN;
  }
  return CLPAR_OK;
}

/* Row by row of dw, each summing its positions in increasing order: the same bits on every
 * run, however the rows are spread over threads. */
clpar_status clpar_host_embedding_backward(void *dev, size_t n, size_t num, size_t dim, int idx64,
                                           clpar_bref idx, clpar_bref g, clpar_bref dw) {
  (void)dev;
  const float *pg = at(g);
  float *pd = at(dw);
  for (size_t e = 0; e < num * dim; e++) pd[e] = 0.0f;
  for (size_t i = 0; i < n; i++) {
    int64_t t = index_at(idx, idx64, i);
    if (t < 0 || (uint64_t)t >= num) continue;
    for (size_t c = 0; c < dim; c++) pd[(size_t)t * dim + c] += pg[i * dim + c];
  }
  return CLPAR_OK;
}

clpar_status clpar_host_layernorm(void *dev, size_t rows, size_t cols, float eps, clpar_bref x,
                                  clpar_bref w, clpar_bref b, clpar_bref y, clpar_bref mean,
                                  clpar_bref rstd) {
  (void)dev;
  const float *px = at(x), *pw = w.buf ? at(w) : NULL, *pb = b.buf ? at(b) : NULL;
  float *py = at(y), *pm = at(mean), *pr = at(rstd);
#pragma omp parallel for if (rows * cols > HOST_PAR) schedule(static)
  for (size_t r = 0; r < rows; r++) {
    const float *row = px + r * cols;
    float s = 0.0f, v = 0.0f; /* the row's sums in vector lanes, not one chain of adds */
#pragma omp simd reduction(+ : s)
    for (size_t c = 0; c < cols; c++) s += row[c];
    float m = s / (float)cols;
#pragma omp simd reduction(+ : v)
    for (size_t c = 0; c < cols; c++) v += (row[c] - m) * (row[c] - m);
    float rs = 1.0f / sqrtf(v / (float)cols + eps);
    pm[r] = m;
    pr[r] = rs;
    for (size_t c = 0; c < cols; c++) {
      float h = (row[c] - m) * rs;
      if (pw) h *= pw[c];
      py[r * cols + c] = pb ? h + pb[c] : h;
    }
  }
  return CLPAR_OK;
}

/* The weight's and bias's gradients of columns c0 .. c0 + w: each column summed down the rows
 * in order in float, a row at a time across the block (unit stride), so that the loop
 * vectorizes and every column's sum is the same as one walked alone. */
static void ln_param_grads(const float *px, const float *pg, const float *pm, const float *pr,
                           size_t rows, size_t cols, size_t c0, size_t w, float *sw, float *sb) {
  for (size_t r = 0; r < rows; r++) {
    const float *x = px + r * cols + c0, *g = pg + r * cols + c0;
    float m = pm[r], rs = pr[r];
    for (size_t c = 0; c < w; c++) {
      sw[c] += g[c] * ((x[c] - m) * rs);
      sb[c] += g[c];
    }
  }
}

clpar_status clpar_host_layernorm_backward(void *dev, size_t rows, size_t cols, clpar_bref x,
                                           clpar_bref g, clpar_bref mean, clpar_bref rstd,
                                           clpar_bref w, clpar_bref dx, clpar_bref dw,
                                           clpar_bref db) {
  (void)dev;
  const float *px = at(x), *pg = at(g), *pm = at(mean), *pr = at(rstd);
  const float *pw = w.buf ? at(w) : NULL;
  if (dx.buf) {
    float *pdx = at(dx);
#pragma omp parallel for if (rows * cols > HOST_PAR) schedule(static)
    for (size_t r = 0; r < rows; r++) {
      const float *row = px + r * cols, *grow = pg + r * cols;
      float sh = 0.0f, shx = 0.0f, m = pm[r], rs = pr[r];
#pragma omp simd reduction(+ : sh, shx)
      for (size_t c = 0; c < cols; c++) {
        float h = pw ? grow[c] * pw[c] : grow[c];
        sh += h;
        shx += h * (row[c] - m) * rs;
      }
      float mh = sh / (float)cols, mhx = shx / (float)cols;
      for (size_t c = 0; c < cols; c++) {
        float h = pw ? grow[c] * pw[c] : grow[c];
        pdx[r * cols + c] = rs * (h - mh - (row[c] - m) * rs * mhx);
      }
    }
  }
  float *pdw = dw.buf ? at(dw) : NULL, *pdb = db.buf ? at(db) : NULL;
  if (!pdw && !pdb) return CLPAR_OK;
  enum { BLOCK = 256 };
  size_t blocks = (cols + BLOCK - 1) / BLOCK;
#pragma omp parallel for if (rows * cols > HOST_PAR) schedule(static)
  for (size_t blk = 0; blk < blocks; blk++) {
    float sw[BLOCK] = {0}, sb[BLOCK] = {0};
    size_t c0 = blk * BLOCK, w = cols - c0 < BLOCK ? cols - c0 : BLOCK;
    ln_param_grads(px, pg, pm, pr, rows, cols, c0, w, sw, sb);
    for (size_t c = 0; c < w; c++) {
      if (pdw) pdw[c0 + c] = sw[c];
      if (pdb) pdb[c0 + c] = sb[c];
    }
  }
  return CLPAR_OK;
}

static uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

clpar_status clpar_host_dropout_mask(void *dev, size_t n, uint64_t seed, uint64_t offset, float p,
                                     float scale, clpar_bref out) {
  (void)dev;
  float *po = at(out);
  uint64_t s = splitmix64(seed);
#pragma omp parallel for if (n > HOST_PAR) schedule(static)
  for (size_t i = 0; i < n; i++) {
    uint64_t h = splitmix64(s ^ ((offset + i) * 0xD1B54A32D192ED03ull));
    float u = (float)(h >> 40) * (1.0f / 16777216.0f);
    po[i] = u < p ? 0.0f : scale;
  }
  return CLPAR_OK;
}
