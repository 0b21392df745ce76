/* host_dnnl_pool.c — the host backend's adaptive average pooling (backend.h's avgpool and
 * avgpool_backward) through oneDNN's pooling primitive.
 *
 * PyTorch's adaptive bins are one average-pooling window each when the output divides the
 * input (h = k oh, w = k' ow: kernel and stride (k, k'), no padding; ResNet's global pool is
 * one); then the mean over a bin is oneDNN's avg_exclude_padding, and its backward spreads dy
 * / (k k') over the bin. Other sizes have bins of unequal or overlapping extent, which no
 * oneDNN pooling expresses: they go to the plain loops (host_conv.c).
 *
 * Max pooling stays with the plain loops: backend.h's maxpool returns each output's argmax as
 * its position in the plane (the first maximum, NaN winning) for maxpool_backward, and
 * oneDNN keeps its argmax in a workspace whose format it leaves opaque (and its max does not
 * let NaN win).
 *
 * The g.n planes are oneDNN's channels of one image ([1, n, h, w], NCHW), used in place. */
#include <stdint.h>
#include <string.h>

#include "host/host_conv.h"
#include "host/host_dnnl.h"
#include "host/host_dnnl_core.h"

/* The key of a cached pooling primitive. */
typedef struct {
  int64_t n, h, w, oh, ow;
} pool_key;

static float *at(clpar_bref r) {
  return (float *)r.buf + r.off;
}

static int fits(const clpar_conv_geom *g) {
  return g->n >= 1 && g->h >= 1 && g->w >= 1 && g->oh >= 1 && g->ow >= 1 && g->h % g->oh == 0 &&
         g->w % g->ow == 0;
}

static clpar_status pool_pd(const pool_key *k, int kind, dnnl_memory_desc_t *src,
                            dnnl_memory_desc_t *dst, dnnl_primitive_desc_t *pd) {
  dnnl_dims_t sd = {1, k->n, k->h, k->w}, dd = {1, k->n, k->oh, k->ow};
  dnnl_dims_t kernel = {k->h / k->oh, k->w / k->ow}, zero = {0, 0};
  HD_TRY("memory_desc_init_by_tag", dnnl_memory_desc_init_by_tag(src, 4, sd, dnnl_f32, dnnl_nchw));
  HD_TRY("memory_desc_init_by_tag", dnnl_memory_desc_init_by_tag(dst, 4, dd, dnnl_f32, dnnl_nchw));
  dnnl_pooling_v2_desc_t d;
  dnnl_alg_kind_t alg = dnnl_pooling_avg_exclude_padding;
  dnnl_prop_kind_t prop = kind == HD_AVGPOOL_FWD ? dnnl_forward_inference : dnnl_forward_training;
  HD_TRY(
      "pooling_v2_forward_desc_init",
      dnnl_pooling_v2_forward_desc_init(&d, prop, alg, src, dst, kernel, kernel, zero, zero, zero));
  dnnl_primitive_desc_t fwd = NULL;
  HD_TRY("primitive_desc_create", dnnl_primitive_desc_create(&fwd, &d, NULL, hd_engine(), NULL));
  if (kind == HD_AVGPOOL_FWD) {
    *pd = fwd;
    return CLPAR_OK;
  }
  dnnl_status_t st =
      dnnl_pooling_v2_backward_desc_init(&d, alg, src, dst, kernel, kernel, zero, zero, zero);
  if (st == dnnl_success) st = dnnl_primitive_desc_create(pd, &d, NULL, hd_engine(), fwd);
  dnnl_primitive_desc_destroy(fwd);
  if (st != dnnl_success) return hd_fail("pooling_v2_backward", st);
  return CLPAR_OK;
}

/* Forward: x, y; backward: dy, dx. */
static clpar_status build_pool(const void *key, int kind, hd_entry *e) {
  dnnl_memory_desc_t src, dst;
  dnnl_primitive_desc_t pd = NULL;
  clpar_status st = pool_pd(key, kind, &src, &dst, &pd);
  if (st != CLPAR_OK) return st;
  if (kind == HD_AVGPOOL_FWD) {
    st = hd_add_operand(e, pd, DNNL_ARG_SRC, 0, dnnl_query_src_md, &src);
    if (st == CLPAR_OK) st = hd_add_operand(e, pd, DNNL_ARG_DST, 1, dnnl_query_dst_md, &dst);
  } else {
    st = hd_add_operand(e, pd, DNNL_ARG_DIFF_DST, 0, dnnl_query_diff_dst_md, &dst);
    if (st == CLPAR_OK)
      st = hd_add_operand(e, pd, DNNL_ARG_DIFF_SRC, 1, dnnl_query_diff_src_md, &src);
  }
  if (st == CLPAR_OK) st = hd_make_prim(e, pd);
  dnnl_primitive_desc_destroy(pd);
  return st;
}

static clpar_status run_pool(int kind, const clpar_conv_geom *g, void *in, void *out) {
  pool_key k = {g->n, g->h, g->w, g->oh, g->ow};
  void *ptrs[HD_MAX_ARGS] = {in, out};
  hd_lock();
  hd_entry *e = NULL;
  clpar_status st = hd_lookup(kind, &k, sizeof k, build_pool, &e);
  if (st == CLPAR_OK) st = hd_run(e, ptrs, 0);
  hd_unlock();
  return st;
}

clpar_status clpar_host_dnnl_avgpool(void *dev, clpar_conv_geom g, clpar_bref x, clpar_bref y) {
  if (!fits(&g)) return clpar_host_avgpool(dev, g, x, y);
  return run_pool(HD_AVGPOOL_FWD, &g, at(x), at(y));
}

clpar_status clpar_host_dnnl_avgpool_backward(void *dev, clpar_conv_geom g, clpar_bref dy,
                                              clpar_bref dx) {
  if (!fits(&g)) return clpar_host_avgpool_backward(dev, g, dy, dx);
  return run_pool(HD_AVGPOOL_BWD, &g, at(dy), at(dx));
}
