/* dnnl_conv.c — whole convolutions through oneDNN's C API on any engine (dnnl_conv.h):
 * forward with bias, backward data, backward weights with bias. The host backend runs them
 * on oneDNN's CPU engine (host/host_dnnl.c), the OpenCL backend on its devices' own context
 * and queue (opencl/ocl_dnnl.c).
 *
 * Tensors stay NCHW / OIHW in clpar's memory. Each primitive is made with its layouts left to
 * oneDNN (format_tag_any: channel-blocked layouts such as nChw16c on AVX-512, for which it
 * has direct JIT kernels), and reorders move the operands between clpar's layout and the
 * primitive's at the edges of the call, through the backend's work buffers. The primitives
 * are cached per shape, with their reorders, in the backend's cache (dnnl_prim.c). */
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "dnnl_conv.h"

/* The key of a cached convolution: its shape and whether it has a bias. */
typedef struct {
  clpar_conv2d_shape s;
  int64_t has_bias;
} conv_key;

/* The rows (columns) of x the convolution reads: [0, *used), and the padding after them that
 * makes oneDNN's output size oh. Rows past the last window's reach are left out of x's view
 * (oneDNN wants the padding after x to be >= 0). */
static void extent(int64_t in, int64_t out, int64_t k, int64_t s, int64_t p, int64_t d,
                   int64_t *used, int64_t *pad_r) {
  int64_t last = (out - 1) * s - p + (k - 1) * d; /* the last input index read, maybe padding */
  *used = last + 1 < in ? last + 1 : in;
  *pad_r = last + 1 - *used;
}

/* x's view: [n, c, rows used, columns used] with the strides of the whole NCHW tensor. */
static clpar_status user_src_md(const clpar_conv2d_shape *s, dnnl_memory_desc_t *md) {
  int64_t hu, wu, pr;
  extent(s->h, s->oh, s->kh, s->sh, s->ph, s->dh, &hu, &pr);
  extent(s->w, s->ow, s->kw, s->sw, s->pw, s->dw, &wu, &pr);
  dnnl_dims_t dims = {s->n, s->c, hu, wu};
  dnnl_dims_t strides = {s->c * s->h * s->w, s->h * s->w, s->w, 1};
  HD_TRY("memory_desc_init_by_strides",
         dnnl_memory_desc_init_by_strides(md, 4, dims, dnnl_f32, strides));
  return CLPAR_OK;
}

static clpar_status weights_md(const clpar_conv2d_shape *s, int any, dnnl_memory_desc_t *md) {
  int64_t g = s->groups;
  dnnl_format_tag_t tag = any ? dnnl_format_tag_any : g > 1 ? dnnl_goihw : dnnl_oihw;
  dnnl_dims_t d1 = {s->o, s->c, s->kh, s->kw}, dg = {g, s->o / g, s->c / g, s->kh, s->kw};
  HD_TRY("memory_desc_init_by_tag",
         dnnl_memory_desc_init_by_tag(md, g > 1 ? 5 : 4, g > 1 ? dg : d1, dnnl_f32, tag));
  return CLPAR_OK;
}

static clpar_status dst_md(const clpar_conv2d_shape *s, int any, dnnl_memory_desc_t *md) {
  dnnl_dims_t dims = {s->n, s->o, s->oh, s->ow};
  HD_TRY(
      "memory_desc_init_by_tag",
      dnnl_memory_desc_init_by_tag(md, 4, dims, dnnl_f32, any ? dnnl_format_tag_any : dnnl_nchw));
  return CLPAR_OK;
}

/* The user layouts of an entry's source, weights, destination and bias. */
typedef struct {
  dnnl_memory_desc_t src, wei, dst, bias, src_any, wei_any, dst_any;
} descs;

static clpar_status make_descs(const clpar_conv2d_shape *s, descs *d) {
  clpar_status st = user_src_md(s, &d->src);
  if (st == CLPAR_OK) st = weights_md(s, 0, &d->wei);
  if (st == CLPAR_OK) st = weights_md(s, 1, &d->wei_any);
  if (st == CLPAR_OK) st = dst_md(s, 0, &d->dst);
  if (st == CLPAR_OK) st = dst_md(s, 1, &d->dst_any);
  if (st != CLPAR_OK) return st;
  dnnl_dims_t src_dims;
  memcpy(src_dims, d->src.dims, sizeof(int64_t) * 4);
  HD_TRY("memory_desc_init_by_tag",
         dnnl_memory_desc_init_by_tag(&d->src_any, 4, src_dims, dnnl_f32, dnnl_format_tag_any));
  dnnl_dims_t bdims = {s->o};
  HD_TRY("memory_desc_init_by_tag",
         dnnl_memory_desc_init_by_tag(&d->bias, 1, bdims, dnnl_f32, dnnl_a));
  return CLPAR_OK;
}

/* The convolution's descriptor of kind k over the layouts src, wei, dst (bias when has_bias). */
static clpar_status conv_desc(const clpar_conv2d_shape *s, int k, int has_bias, const descs *d,
                              dnnl_convolution_desc_t *cd) {
  int64_t hu, wu, prh, prw;
  extent(s->h, s->oh, s->kh, s->sh, s->ph, s->dh, &hu, &prh);
  extent(s->w, s->ow, s->kw, s->sw, s->pw, s->dw, &wu, &prw);
  dnnl_dims_t strides = {s->sh, s->sw}, dil = {s->dh - 1, s->dw - 1};
  dnnl_dims_t pl = {s->ph, s->pw}, pr = {prh, prw};
  const dnnl_memory_desc_t *b = has_bias ? &d->bias : NULL;
  dnnl_alg_kind_t alg = dnnl_convolution_direct;
  if (k == HD_CONV_FWD)
    HD_TRY("convolution_forward_desc_init", dnnl_dilated_convolution_forward_desc_init(
                                                cd, dnnl_forward_training, alg, &d->src_any,
                                                &d->wei_any, b, &d->dst_any, strides, dil, pl, pr));
  else if (k == HD_CONV_BWD_DATA)
    HD_TRY("convolution_backward_data_desc_init",
           dnnl_dilated_convolution_backward_data_desc_init(cd, alg, &d->src_any, &d->wei_any,
                                                            &d->dst_any, strides, dil, pl, pr));
  else
    HD_TRY("convolution_backward_weights_desc_init",
           dnnl_dilated_convolution_backward_weights_desc_init(cd, alg, &d->src_any, &d->wei_any, b,
                                                               &d->dst_any, strides, dil, pl, pr));
  return CLPAR_OK;
}

static clpar_status make_pd(dnnl_engine_t eng, const clpar_conv2d_shape *s, int k, int has_bias,
                            const descs *d, const_dnnl_primitive_desc_t hint,
                            dnnl_primitive_desc_t *pd) {
  dnnl_convolution_desc_t cd;
  clpar_status st = conv_desc(s, k, has_bias, d, &cd);
  if (st != CLPAR_OK) return st;
  HD_TRY("primitive_desc_create", dnnl_primitive_desc_create(pd, &cd, NULL, eng, hint));
  return CLPAR_OK;
}

/* The operands of kind k in execution order (see hd_run's pointers). Both backward kinds
 * take gy (DIFF_DST) first, in work buffer 0, so that one reorder of it serves both. */
static clpar_status add_operands(hd_entry *e, dnnl_primitive_desc_t pd, const descs *d,
                                 int has_bias) {
  clpar_status st;
  if (e->kind == HD_CONV_FWD) {
    st = hd_add_operand(e, pd, DNNL_ARG_SRC, 0, dnnl_query_src_md, &d->src);
    if (st == CLPAR_OK)
      st = hd_add_operand(e, pd, DNNL_ARG_WEIGHTS, 0, dnnl_query_weights_md, &d->wei);
    if (st == CLPAR_OK) st = hd_add_operand(e, pd, DNNL_ARG_DST, 1, dnnl_query_dst_md, &d->dst);
    if (st == CLPAR_OK && has_bias)
      st = hd_add_operand(e, pd, DNNL_ARG_BIAS, 0, dnnl_query_undef, &d->bias);
  } else if (e->kind == HD_CONV_BWD_DATA) {
    st = hd_add_operand(e, pd, DNNL_ARG_DIFF_DST, 0, dnnl_query_diff_dst_md, &d->dst);
    if (st == CLPAR_OK)
      st = hd_add_operand(e, pd, DNNL_ARG_WEIGHTS, 0, dnnl_query_weights_md, &d->wei);
    if (st == CLPAR_OK)
      st = hd_add_operand(e, pd, DNNL_ARG_DIFF_SRC, 1, dnnl_query_diff_src_md, &d->src);
  } else {
    st = hd_add_operand(e, pd, DNNL_ARG_DIFF_DST, 0, dnnl_query_diff_dst_md, &d->dst);
    if (st == CLPAR_OK) st = hd_add_operand(e, pd, DNNL_ARG_SRC, 0, dnnl_query_src_md, &d->src);
    if (st == CLPAR_OK)
      st = hd_add_operand(e, pd, DNNL_ARG_DIFF_WEIGHTS, 1, dnnl_query_diff_weights_md, &d->wei);
    if (st == CLPAR_OK && has_bias)
      st = hd_add_operand(e, pd, DNNL_ARG_DIFF_BIAS, 1, dnnl_query_undef, &d->bias);
  }
  return st;
}

/* Builds a convolution's entry of kind k (hd_build_fn): its primitive (backward ones made with
 * a forward one as their hint) and its operands. */
static clpar_status build_entry(const void *key, int k, hd_entry *e) {
  const conv_key *ck = key;
  const clpar_conv2d_shape *s = &ck->s;
  int has_bias = (int)ck->has_bias;
  descs d;
  clpar_status st = make_descs(s, &d);
  if (st != CLPAR_OK) return st;
  e->aux = d.src.dims[2] != s->h || d.src.dims[3] != s->w; /* x clipped */
  dnnl_primitive_desc_t fwd = NULL, pd = NULL;
  st = make_pd(e->engine, s, HD_CONV_FWD, has_bias, &d, NULL, &fwd);
  if (st == CLPAR_OK && k != HD_CONV_FWD) st = make_pd(e->engine, s, k, has_bias, &d, fwd, &pd);
  dnnl_primitive_desc_t use = k == HD_CONV_FWD ? fwd : pd;
  if (st == CLPAR_OK) st = add_operands(e, use, &d, has_bias);
  if (st == CLPAR_OK) st = hd_make_prim(e, use);
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (fwd) dnnl_primitive_desc_destroy(fwd);
  return st;
}

static clpar_status lookup(hd_io *io, const clpar_conv2d_shape *s, int k, int has_bias,
                           hd_entry **out) {
  conv_key key;
  memset(&key, 0, sizeof key);
  key.s = *s;
  key.has_bias = has_bias;
  return hd_cache_lookup(io->cache, io->engine, k, &key, sizeof key, build_entry, out);
}

clpar_status hd_conv_forward(hd_io *io, const clpar_conv2d_shape *s, void *x, void *w, void *b,
                             void *y) {
  hd_entry *e = NULL;
  clpar_status st = lookup(io, s, HD_CONV_FWD, b != NULL, &e);
  void *handles[HD_MAX_ARGS] = {x, w, y, b};
  return st == CLPAR_OK ? hd_exec(e, io, handles, 0) : st;
}

/* Backward data (dx) then backward weights (dw, db); gy is reordered once when both
 * primitives take it in the same layout. */
clpar_status hd_conv_backward(hd_io *io, const clpar_conv2d_shape *s, void *x, void *w, void *gy,
                              void *dx, void *dw, void *db) {
  hd_entry *bd = NULL, *bw = NULL;
  clpar_status st = dx ? lookup(io, s, HD_CONV_BWD_DATA, 0, &bd) : CLPAR_OK;
  if (st == CLPAR_OK && dw) st = lookup(io, s, HD_CONV_BWD_WEIGHTS, db != NULL, &bw);
  if (st == CLPAR_OK && bd) {
    /* dx is written whole: the rows and columns no window reads get zeros */
    if (bd->aux) st = io->zero(io, dx, (size_t)(s->n * s->c * s->h * s->w) * sizeof(float));
    void *handles[HD_MAX_ARGS] = {gy, w, dx, NULL};
    if (st == CLPAR_OK) st = hd_exec(bd, io, handles, 0);
  }
  if (st == CLPAR_OK && bw) {
    int have = bd && bd->ops[0].reorder && bw->ops[0].reorder &&
               dnnl_memory_desc_equal(&bd->ops[0].inner, &bw->ops[0].inner);
    void *handles[HD_MAX_ARGS] = {gy, x, dw, db};
    st = hd_exec(bw, io, handles, have);
  }
  return st;
}
