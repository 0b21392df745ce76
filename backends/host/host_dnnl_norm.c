/* host_dnnl_norm.c — the host backend's batch-norm entries (backend.h's bn_stats, bn_apply,
 * bn_backward_sums, bn_backward) through oneDNN's batch-normalization primitive.
 *
 * x [n, c, p] is NCHW in clpar's memory; oneDNN's JIT kernels want channel-blocked layouts
 * (nChw16c on AVX-512; its NCHW kernel is plain C, several times slower than host_conv.c's
 * loops), so x and g are reordered into one at the start of a call and y or dx back at its
 * end (host_dnnl_core.c); the per-channel tensors are used where they are.
 *
 * Each entry maps onto one primitive:
 *   bn_stats          forward training without scale or shift: mean and the biased variance
 *                     (two passes, as backend.h asks); y goes to a work buffer. The running
 *                     statistics are updated here, from those, as host_conv.c does.
 *   bn_apply          forward with the given statistics (use_global_stats), weight and bias.
 *   bn_backward_sums  backward: diff_shift is sum(g), diff_scale sum(g xhat); dx goes to a
 *                     work buffer.
 *   bn_backward       eval: backward with the given statistics (use_global_stats: dx = w
 *                     istd g; the weight's gradient it makes too goes to a scratch buffer).
 *                     Training: oneDNN computes the two sums itself from x and g; its dx is
 *                     the contract's only when those are the sums given, so the sums it made
 *                     are compared, bit for bit, with the given ones, and the plain loop
 *                     rewrites dx when they differ (sums from the plain loops, or from other
 *                     data). The sums come out of the same kernel as bn_backward_sums' (the
 *                     scale enters dx alone), so in a training step they match (unless the
 *                     thread count changed between the two calls).
 * Only short rows go to oneDNN (p <= clpar_host_dnnl_bn_max_p); the rest, and sizes oneDNN
 * cannot take (an empty tensor), go to the plain loops. */
#include <stdint.h>
#include <string.h>

#include "host/host_conv.h"
#include "host/host_dnnl.h"
#include "host/host_dnnl_core.h"

/* The key of a cached batch-norm primitive. */
typedef struct {
  int64_t n, c, p, flags;
  float eps;
  int32_t zero; /* padding, always 0 */
} bn_key;

static float *at(clpar_bref r) {
  return (float *)r.buf + r.off;
}

/* The largest p (values per image and channel) that goes to oneDNN. On short rows its
 * blocked kernels beat the plain loops, whose passes over p values at a time are short; on
 * long rows the reorders into and out of the blocked layout cost more than the plain loops'
 * own passes. Training forward + backward at batch 16, one thread, per call (plain against
 * oneDNN): 2048x2x2 0.63 / 0.33 ms, 1024x4x4 0.70 / 0.53, 512x8x8 1.16 / 1.12-1.26,
 * 2048x7x7 4.3 / 5.5, 256x16x16 2.4 / 3.4-7.4 (bench/norm.c, OMP_NUM_THREADS=1). Tests set it
 * to SIZE_MAX to run every shape through oneDNN. */
size_t clpar_host_dnnl_bn_max_p = 16;

static int fits(size_t n, size_t c, size_t p) {
  return n >= 1 && c >= 1 && p >= 1 && p <= clpar_host_dnnl_bn_max_p && n <= INT64_MAX / c &&
         n * c <= INT64_MAX / p;
}

/* x's layouts: clpar's NCHW (user) and the blocked one the kernels take; the per-channel
 * tensors' layout. */
static clpar_status bn_mds(const bn_key *k, dnnl_memory_desc_t *user, dnnl_memory_desc_t *blocked,
                           dnnl_memory_desc_t *chan) {
  dnnl_dims_t dims = {k->n, k->c, k->p, 1}, cdims = {k->c};
  dnnl_format_tag_t tag = hd_channel_block() == 16 ? dnnl_nChw16c : dnnl_nChw8c;
  HD_TRY("memory_desc_init_by_tag",
         dnnl_memory_desc_init_by_tag(user, 4, dims, dnnl_f32, dnnl_nchw));
  HD_TRY("memory_desc_init_by_tag", dnnl_memory_desc_init_by_tag(blocked, 4, dims, dnnl_f32, tag));
  HD_TRY("memory_desc_init_by_tag", dnnl_memory_desc_init_by_tag(chan, 1, cdims, dnnl_f32, dnnl_a));
  return CLPAR_OK;
}

/* The primitive descriptor of kind k; backward ones made with their forward as the hint. */
static clpar_status bn_pd(const bn_key *k, int kind, const dnnl_memory_desc_t *md,
                          dnnl_primitive_desc_t *pd) {
  unsigned flags = (unsigned)k->flags;
  dnnl_batch_normalization_desc_t d;
  dnnl_prop_kind_t prop = kind == HD_BN_APPLY ? dnnl_forward_inference : dnnl_forward_training;
  HD_TRY("batch_normalization_forward_desc_init",
         dnnl_batch_normalization_forward_desc_init(&d, prop, md, k->eps, flags));
  dnnl_primitive_desc_t fwd = NULL;
  HD_TRY("primitive_desc_create", dnnl_primitive_desc_create(&fwd, &d, NULL, hd_engine(), NULL));
  if (kind == HD_BN_STATS || kind == HD_BN_APPLY) {
    *pd = fwd;
    return CLPAR_OK;
  }
  dnnl_status_t st = dnnl_batch_normalization_backward_desc_init(
      &d, dnnl_backward, md, md, k->eps, flags); /* backward_data takes no scale */
  if (st == dnnl_success) st = dnnl_primitive_desc_create(pd, &d, NULL, hd_engine(), fwd);
  dnnl_primitive_desc_destroy(fwd);
  if (st != dnnl_success) return hd_fail("batch_normalization_backward", st);
  return CLPAR_OK;
}

/* The operands in the order of the entries' pointers (see run_bn's callers). */
static clpar_status bn_operands(hd_entry *e, int kind, unsigned flags, dnnl_primitive_desc_t pd,
                                const dnnl_memory_desc_t *user, const dnnl_memory_desc_t *chan) {
  clpar_status st = CLPAR_OK;
  if (kind != HD_BN_STATS && kind != HD_BN_APPLY)
    st = hd_add_operand(e, pd, DNNL_ARG_DIFF_DST, 0, dnnl_query_diff_dst_md, user);
  if (st == CLPAR_OK) st = hd_add_operand(e, pd, DNNL_ARG_SRC, 0, dnnl_query_src_md, user);
  int stats_out = kind == HD_BN_STATS;
  if (st == CLPAR_OK) st = hd_add_operand(e, pd, DNNL_ARG_MEAN, stats_out, dnnl_query_undef, chan);
  if (st == CLPAR_OK)
    st = hd_add_operand(e, pd, DNNL_ARG_VARIANCE, stats_out, dnnl_query_undef, chan);
  if (st == CLPAR_OK && (flags & dnnl_use_scale))
    st = hd_add_operand(e, pd, DNNL_ARG_SCALE, 0, dnnl_query_undef, chan);
  if (st == CLPAR_OK && (flags & dnnl_use_shift)) /* backward reads it too, unused */
    st = hd_add_operand(e, pd, DNNL_ARG_SHIFT, 0, dnnl_query_undef, chan);
  if (st != CLPAR_OK) return st;
  if (kind == HD_BN_STATS) return hd_add_scratch(e, pd, DNNL_ARG_DST, dnnl_query_dst_md);
  if (kind == HD_BN_APPLY) return hd_add_operand(e, pd, DNNL_ARG_DST, 1, dnnl_query_dst_md, user);
  if (kind == HD_BN_SUMS)
    st = hd_add_scratch(e, pd, DNNL_ARG_DIFF_SRC, dnnl_query_diff_src_md);
  else
    st = hd_add_operand(e, pd, DNNL_ARG_DIFF_SRC, 1, dnnl_query_diff_src_md, user);
  if (st == CLPAR_OK && (flags & dnnl_use_scale))
    st = hd_add_operand(e, pd, DNNL_ARG_DIFF_SCALE, 1, dnnl_query_undef, chan);
  if (st == CLPAR_OK && (flags & dnnl_use_shift))
    st = hd_add_operand(e, pd, DNNL_ARG_DIFF_SHIFT, 1, dnnl_query_undef, chan);
  return st;
}

static clpar_status build_bn(const void *key, int kind, hd_entry *e) {
  const bn_key *k = key;
  dnnl_memory_desc_t user, blocked, chan;
  clpar_status st = bn_mds(k, &user, &blocked, &chan);
  dnnl_primitive_desc_t pd = NULL;
  if (st == CLPAR_OK) st = bn_pd(k, kind, &blocked, &pd);
  if (st == CLPAR_OK) st = bn_operands(e, kind, (unsigned)k->flags, pd, &user, &chan);
  if (st == CLPAR_OK) st = hd_make_prim(e, pd);
  if (pd) dnnl_primitive_desc_destroy(pd);
  return st;
}

/* Runs the primitive of kind for [n, c, p] on ptrs; the lock is held. */
static clpar_status run_bn(int kind, size_t n, size_t c, size_t p, unsigned flags, float eps,
                           void *const *ptrs) {
  bn_key k;
  memset(&k, 0, sizeof k);
  k.n = (int64_t)n, k.c = (int64_t)c, k.p = (int64_t)p, k.flags = flags, k.eps = eps;
  hd_entry *e = NULL;
  clpar_status st = hd_lookup(kind, &k, sizeof k, build_bn, &e);
  return st == CLPAR_OK ? hd_run(e, ptrs, 0) : st;
}

clpar_status clpar_host_dnnl_bn_stats(void *dev, size_t n, size_t c, size_t p, clpar_bref x,
                                      clpar_bref mean, clpar_bref var, clpar_bref running_mean,
                                      clpar_bref running_var, float momentum) {
  if (!fits(n, c, p))
    return clpar_host_bn_stats(dev, n, c, p, x, mean, var, running_mean, running_var, momentum);
  float *pm = at(mean), *pv = at(var);
  void *ptrs[HD_MAX_ARGS] = {at(x), pm, pv, NULL};
  hd_lock();
  clpar_status st = run_bn(HD_BN_STATS, n, c, p, 0, 1e-5f, ptrs); /* eps: unused here */
  hd_unlock();
  if (st != CLPAR_OK || !running_mean.buf) return st;
  double M = (double)n * (double)p;
  float *rm = at(running_mean), *rv = at(running_var);
  for (size_t ch = 0; ch < c; ch++) {
    rm[ch] = (float)((1.0 - momentum) * rm[ch] + momentum * (double)pm[ch]);
    rv[ch] = (float)((1.0 - momentum) * rv[ch] + momentum * ((double)pv[ch] * M / (M - 1.0)));
  }
  return CLPAR_OK;
}

clpar_status clpar_host_dnnl_bn_apply(void *dev, size_t n, size_t c, size_t p, clpar_bref x,
                                      clpar_bref mean, clpar_bref var, clpar_bref weight,
                                      clpar_bref bias, float eps, clpar_bref y) {
  if (!fits(n, c, p)) return clpar_host_bn_apply(dev, n, c, p, x, mean, var, weight, bias, eps, y);
  unsigned flags =
      dnnl_use_global_stats | (weight.buf ? dnnl_use_scale : 0u) | (bias.buf ? dnnl_use_shift : 0u);
  void *ptrs[HD_MAX_ARGS] = {at(x), at(mean), at(var)};
  int i = 3;
  if (weight.buf) ptrs[i++] = at(weight);
  if (bias.buf) ptrs[i++] = at(bias);
  ptrs[i] = at(y);
  hd_lock();
  clpar_status st = run_bn(HD_BN_APPLY, n, c, p, flags, eps, ptrs);
  hd_unlock();
  return st;
}

clpar_status clpar_host_dnnl_bn_backward_sums(void *dev, size_t n, size_t c, size_t p, clpar_bref x,
                                              clpar_bref g, clpar_bref mean, clpar_bref var,
                                              float eps, clpar_bref sum_g, clpar_bref sum_gxhat) {
  if (!fits(n, c, p))
    return clpar_host_bn_backward_sums(dev, n, c, p, x, g, mean, var, eps, sum_g, sum_gxhat);
  hd_lock();
  float *ones = NULL;
  clpar_status st = hd_ones(c, &ones);
  if (st == CLPAR_OK) {
    /* g, x, mean, var, scale, shift (unused), dx (scratch), sums */
    void *ptrs[HD_MAX_ARGS] = {at(g), at(x), at(mean),      at(var),  ones,
                               ones,  NULL,  at(sum_gxhat), at(sum_g)};
    st = run_bn(HD_BN_SUMS, n, c, p, dnnl_use_scale | dnnl_use_shift, eps, ptrs);
  }
  hd_unlock();
  return st;
}

/* Training: dx with the sums oneDNN makes, kept when they are the given ones (*same). */
static clpar_status bn_backward_train(size_t n, size_t c, size_t p, void *const *in,
                                      clpar_bref weight, float eps, clpar_bref sum_g,
                                      clpar_bref sum_gxhat, void *dx, int *same) {
  float *ones = NULL, *sums = NULL;
  clpar_status st = weight.buf ? CLPAR_OK : hd_ones(c, &ones);
  if (st == CLPAR_OK) st = hd_temp(2 * c, &sums);
  if (st != CLPAR_OK) return st;
  float *w = weight.buf ? at(weight) : ones; /* the shift is read, unused */
  void *ptrs[HD_MAX_ARGS] = {in[0], in[1], in[2], in[3], w, w, dx, sums, sums + c};
  st = run_bn(HD_BN_BWD, n, c, p, dnnl_use_scale | dnnl_use_shift, eps, ptrs);
  *same = st == CLPAR_OK && memcmp(sums, at(sum_gxhat), c * sizeof *sums) == 0 &&
          memcmp(sums + c, at(sum_g), c * sizeof *sums) == 0;
  return st;
}

clpar_status clpar_host_dnnl_bn_backward(void *dev, size_t n, size_t c, size_t p, clpar_bref x,
                                         clpar_bref g, clpar_bref mean, clpar_bref var,
                                         clpar_bref weight, float eps, clpar_bref sum_g,
                                         clpar_bref sum_gxhat, int training, clpar_bref dx) {
  if (!fits(n, c, p))
    return clpar_host_bn_backward(dev, n, c, p, x, g, mean, var, weight, eps, sum_g, sum_gxhat,
                                  training, dx);
  void *in[4] = {at(g), at(x), at(mean), at(var)};
  int same = 1;
  hd_lock();
  clpar_status st;
  if (training) {
    st = bn_backward_train(n, c, p, in, weight, eps, sum_g, sum_gxhat, at(dx), &same);
  } else {
    float *ones = NULL, *dw = NULL; /* dw: the weight's gradient, unused */
    st = weight.buf ? CLPAR_OK : hd_ones(c, &ones);
    if (st == CLPAR_OK) st = hd_temp(c, &dw);
    void *ptrs[HD_MAX_ARGS] = {in[0],  in[1], in[2], in[3], weight.buf ? at(weight) : ones,
                               at(dx), dw};
    if (st == CLPAR_OK)
      st = run_bn(HD_BN_BWD_EVAL, n, c, p, dnnl_use_global_stats | dnnl_use_scale, eps, ptrs);
  }
  hd_unlock();
  if (st != CLPAR_OK || same) return st;
  return clpar_host_bn_backward(dev, n, c, p, x, g, mean, var, weight, eps, sum_g, sum_gxhat,
                                training, dx);
}
