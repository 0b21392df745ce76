/* attention.c — nanoGPT's CausalSelfAttention, MLP and pre-norm Block, composed from
 * differentiable ops (Linear, split, permute, batched matmul, causal mask, softmax, GELU,
 * dropout), so their backward comes from those ops'. Every function frees what it made
 * (nodes keep what backward needs). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct {
  clpar_block_config c;
} block_state;

/* A child's forward on x seen as [rows, last] (Linear takes 2-D input), back to x's leading
 * shape with the child's output width. */
static clpar_status forward_2d(clpar_module *self, const char *child, clpar_tensor *x,
                               clpar_tensor **out) {
  int64_t last = x->shape[x->ndim - 1], s2[2] = {x->numel / last, last};
  clpar_tensor *x2 = NULL, *y2 = NULL;
  clpar_status s = clpar_tensor_reshape(x, 2, s2, &x2);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(self, child), x2, &y2);
  if (s == CLPAR_OK) {
    int64_t shape[CLPAR_MAX_DIMS];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    shape[x->ndim - 1] = y2->shape[1];
    s = clpar_tensor_reshape(y2, x->ndim, shape, out);
  }
  clpar_tensor_free(x2);
  clpar_tensor_free(y2);
  return s;
}

/* The fused QKV projection [B, T, 3C] to q, k and v, each [B, H, T, D]: one permute to
 * [3, B, H, T, D], then views of its three blocks. One copy each way (the blocks' gradients
 * land in the permuted gradient's rows in place), where a split along C and a permute per
 * part would copy twice and, in backward, zero-fill and add a [B, T, 3C] gradient per part. */
static clpar_status split_heads(clpar_tensor *qkv, int64_t h, clpar_tensor **heads) {
  int64_t b = qkv->shape[0], t = qkv->shape[1], d = qkv->shape[2] / 3 / h;
  int64_t s5[5] = {b, t, 3, h, d}, s4[4] = {b, h, t, d};
  static const int perm[5] = {2, 0, 3, 1, 4};
  clpar_tensor *v = NULL, *p = NULL;
  clpar_status s = clpar_tensor_reshape(qkv, 5, s5, &v);
  if (s == CLPAR_OK) s = clpar_permute(v, perm, 5, &p);
  for (int i = 0; i < 3 && s == CLPAR_OK; i++) {
    clpar_tensor *part = NULL;
    s = clpar_tensor_rows(p, i, 1, &part);
    if (s == CLPAR_OK) s = clpar_tensor_reshape(part, 4, s4, &heads[i]);
    clpar_tensor_free(part);
  }
  clpar_tensor_free(v);
  clpar_tensor_free(p);
  return s;
}

/* softmax(causal(q k^T / sqrt(D))) v, dropout on the weights: [B, H, T, D]. */
static clpar_status attend(clpar_module *self, clpar_tensor *q, clpar_tensor *k, clpar_tensor *v,
                           clpar_tensor **out) {
  clpar_tensor *att = NULL, *sc = NULL, *mk = NULL, *sm = NULL, *dr = NULL;
  clpar_status s = clpar_bmm(q, k, 0, 1, &att);
  if (s == CLPAR_OK) s = clpar_scale(att, 1.0f / sqrtf((float)q->shape[3]), &sc);
  if (s == CLPAR_OK) s = clpar_causal_mask(sc, &mk);
  if (s == CLPAR_OK) s = clpar_softmax(mk, &sm);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(self, "attn_dropout"), sm, &dr);
  if (s == CLPAR_OK) s = clpar_bmm(dr, v, 0, 0, out);
  clpar_tensor_free(att), clpar_tensor_free(sc), clpar_tensor_free(mk);
  clpar_tensor_free(sm), clpar_tensor_free(dr);
  return s;
}

static clpar_status check_btc(const char *fn, const clpar_tensor *x, int64_t c) {
  char a[128];
  if (!x) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: input is NULL", fn);
  clpar_status s = clpar_check_float(fn, "input", x);
  if (s == CLPAR_OK && (x->ndim != 3 || x->shape[2] != c))
    s = clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH, "%s: input is %s; need [B, T, %lld]", fn,
                        clpar_tensor_shape_str(x, a, sizeof a), (long long)c);
  return s;
}

static clpar_status attn_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                 void *user) {
  const block_state *st = user;
  int64_t c = st->c.n_embd, h = st->c.n_head;
  clpar_status s = check_btc("CausalSelfAttention", x, c);
  if (s != CLPAR_OK) return s;
  clpar_tensor *qkv = NULL, *heads[3] = {NULL, NULL, NULL};
  clpar_tensor *o = NULL, *ot = NULL, *proj = NULL;
  int64_t s3[3] = {x->shape[0], x->shape[1], c};
  static const int perm[4] = {0, 2, 1, 3};
  s = forward_2d(self, "c_attn", x, &qkv);
  if (s == CLPAR_OK) s = split_heads(qkv, h, heads);
  if (s == CLPAR_OK) s = attend(self, heads[0], heads[1], heads[2], &o);
  if (s == CLPAR_OK) s = clpar_permute(o, perm, 4, &ot);
  clpar_tensor *merged = NULL;
  if (s == CLPAR_OK) s = clpar_tensor_reshape(ot, 3, s3, &merged);
  if (s == CLPAR_OK) s = forward_2d(self, "c_proj", merged, &proj);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(self, "resid_dropout"), proj, y);
  clpar_tensor_free(qkv), clpar_tensor_free(o), clpar_tensor_free(ot);
  clpar_tensor_free(merged), clpar_tensor_free(proj);
  for (int i = 0; i < 3; i++) clpar_tensor_free(heads[i]);
  return s;
}

static clpar_status mlp_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y, void *user) {
  const block_state *st = user;
  clpar_status s = check_btc("MLP", x, st->c.n_embd);
  if (s != CLPAR_OK) return s;
  clpar_tensor *h = NULL, *g = NULL, *p = NULL;
  s = forward_2d(self, "c_fc", x, &h);
  if (s == CLPAR_OK) s = clpar_gelu(h, CLPAR_GELU_NONE, &g);
  if (s == CLPAR_OK) s = forward_2d(self, "c_proj", g, &p);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(self, "dropout"), p, y);
  clpar_tensor_free(h), clpar_tensor_free(g), clpar_tensor_free(p);
  return s;
}

/* x + child2(child1(x)) */
static clpar_status residual(clpar_module *self, const char *norm, const char *sub, clpar_tensor *x,
                             clpar_tensor **out) {
  clpar_tensor *n = NULL, *f = NULL;
  clpar_status s = clpar_module_forward(clpar_module_child(self, norm), x, &n);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(self, sub), n, &f);
  if (s == CLPAR_OK) s = clpar_add(x, f, out);
  clpar_tensor_free(n), clpar_tensor_free(f);
  return s;
}

static clpar_status block_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                  void *user) {
  const block_state *st = user;
  clpar_status s = check_btc("Block", x, st->c.n_embd);
  clpar_tensor *h = NULL;
  if (s == CLPAR_OK) s = residual(self, "ln_1", "attn", x, &h);
  if (s == CLPAR_OK) s = residual(self, "ln_2", "mlp", h, y);
  clpar_tensor_free(h);
  return s;
}

static clpar_status check_config(const char *fn, const clpar_block_config *c, clpar_device *dev,
                                 clpar_module **out) {
  if (!c || !dev || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (!clpar_is_initialized())
    return clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED, "%s: call clpar_init first", fn);
  if (c->n_embd < 1 || c->n_head < 1 || c->n_embd % c->n_head != 0)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: n_embd %lld must be a positive multiple of n_head %lld", fn,
                           (long long)c->n_embd, (long long)c->n_head);
  if (!(c->dropout >= 0.0f && c->dropout <= 1.0f))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: dropout %g is not in [0, 1]", fn,
                           (double)c->dropout);
  return CLPAR_OK;
}

/* A module of type with the config as its state, or NULL (error set). */
static clpar_status make(const char *type, clpar_forward_fn fwd, const clpar_block_config *c,
                         clpar_module **m) {
  block_state *st = malloc(sizeof *st);
  if (!st) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", type);
  st->c = *c;
  clpar_status s = clpar_module_create(type, fwd, st, free, m);
  if (s != CLPAR_OK) free(st);
  return s;
}

static clpar_status add_linear(clpar_module *m, const char *name, int64_t in, int64_t outf,
                               int bias, clpar_device *dev) {
  clpar_module *l = NULL;
  clpar_status s = clpar_linear_create(in, outf, bias, dev, &l);
  return s == CLPAR_OK ? clpar_module_add_child(m, name, l) : s;
}

static clpar_status add_dropout(clpar_module *m, const char *name, float p) {
  clpar_module *d = NULL;
  clpar_status s = clpar_dropout_create(p, &d);
  return s == CLPAR_OK ? clpar_module_add_child(m, name, d) : s;
}

static clpar_status done(clpar_status s, clpar_module *m, clpar_module **out) {
  if (s != CLPAR_OK) {
    clpar_module_free(m);
    return s;
  }
  *out = m;
  return CLPAR_OK;
}

clpar_status clpar_causal_self_attention_create(const clpar_block_config *c, clpar_device *dev,
                                                clpar_module **out) {
  clpar_status s = check_config("clpar_causal_self_attention_create", c, dev, out);
  clpar_module *m = NULL;
  if (s == CLPAR_OK) s = make("CausalSelfAttention", attn_forward, c, &m);
  if (s != CLPAR_OK) return s;
  s = add_linear(m, "c_attn", c->n_embd, 3 * c->n_embd, c->bias, dev);
  if (s == CLPAR_OK) s = add_linear(m, "c_proj", c->n_embd, c->n_embd, c->bias, dev);
  if (s == CLPAR_OK) s = add_dropout(m, "attn_dropout", c->dropout);
  if (s == CLPAR_OK) s = add_dropout(m, "resid_dropout", c->dropout);
  return done(s, m, out);
}

clpar_status clpar_mlp_create(const clpar_block_config *c, clpar_device *dev, clpar_module **out) {
  clpar_status s = check_config("clpar_mlp_create", c, dev, out);
  clpar_module *m = NULL;
  if (s == CLPAR_OK) s = make("MLP", mlp_forward, c, &m);
  if (s != CLPAR_OK) return s;
  s = add_linear(m, "c_fc", c->n_embd, 4 * c->n_embd, c->bias, dev);
  if (s == CLPAR_OK) s = add_linear(m, "c_proj", 4 * c->n_embd, c->n_embd, c->bias, dev);
  if (s == CLPAR_OK) s = add_dropout(m, "dropout", c->dropout);
  return done(s, m, out);
}

clpar_status clpar_transformer_block_create(const clpar_block_config *c, clpar_device *dev,
                                            clpar_module **out) {
  clpar_status s = check_config("clpar_transformer_block_create", c, dev, out);
  clpar_module *m = NULL, *ch = NULL;
  if (s == CLPAR_OK) s = make("Block", block_forward, c, &m);
  if (s != CLPAR_OK) return s;
  s = clpar_layernorm_create(c->n_embd, 0.0f, c->bias, dev, &ch);
  if (s == CLPAR_OK) s = clpar_module_add_child(m, "ln_1", ch);
  if (s == CLPAR_OK) s = clpar_causal_self_attention_create(c, dev, &ch);
  if (s == CLPAR_OK) s = clpar_module_add_child(m, "attn", ch);
  if (s == CLPAR_OK) s = clpar_layernorm_create(c->n_embd, 0.0f, c->bias, dev, &ch);
  if (s == CLPAR_OK) s = clpar_module_add_child(m, "ln_2", ch);
  if (s == CLPAR_OK) s = clpar_mlp_create(c, dev, &ch);
  if (s == CLPAR_OK) s = clpar_module_add_child(m, "mlp", ch);
  return done(s, m, out);
}
