/* gpt.c — nanoGPT's GPT: token and position embeddings, n_layer pre-norm blocks, a final
 * LayerNorm and a language-model head tied to the token embedding, under GPT-2's parameter
 * names and with GPT-2's initialization (normal 0.02, the residual projections c_proj
 * normal 0.02 / sqrt(2 n_layer), biases 0, LayerNorms 1 and 0). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct {
  clpar_gpt_config c;
} gpt_state;

static clpar_status container_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                      void *user) {
  (void)x, (void)y, (void)user;
  return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                         "%s: a container of the GPT's layers; run the GPT's forward",
                         clpar_module_type(self));
}

static clpar_status check_ids(const gpt_state *st, const clpar_tensor *idx) {
  const char *fn = "GPT";
  if (!idx) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: input is NULL", fn);
  clpar_status s = clpar_check_alive(fn, idx);
  if (s != CLPAR_OK) return s;
  char a[128];
  if (idx->dtype != CLPAR_INT32 && idx->dtype != CLPAR_INT64)
    return clpar_set_error(CLPAR_ERROR_DTYPE, "%s: token ids are %s; need int32 or int64", fn,
                           clpar_dtype_name(idx->dtype));
  if (idx->ndim != 2 || idx->shape[1] > st->c.block_size)
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                           "%s: token ids are %s; need [B, T] with T <= block_size %lld", fn,
                           clpar_tensor_shape_str(idx, a, sizeof a), (long long)st->c.block_size);
  return CLPAR_OK;
}

/* wte(idx) + wpe(0 .. T-1), [B, T, C]. */
static clpar_status embed(clpar_module *tr, clpar_tensor *idx, int64_t c, clpar_tensor **out) {
  int64_t b = idx->shape[0], t = idx->shape[1], row[2] = {b, t * c}, flat = t * c;
  int64_t *pos = malloc((size_t)t * sizeof *pos);
  if (!pos) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "GPT: out of host memory");
  for (int64_t i = 0; i < t; i++) pos[i] = i;
  clpar_tensor *pt = NULL, *tok = NULL, *pe = NULL, *tok2 = NULL, *pe1 = NULL, *sum = NULL;
  clpar_status s = clpar_tensor_from_host_dtype(idx->storage->dev, CLPAR_INT64, 1, &t, pos, &pt);
  free(pos);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(tr, "wte"), idx, &tok);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(tr, "wpe"), pt, &pe);
  if (s == CLPAR_OK) s = clpar_tensor_reshape(tok, 2, row, &tok2);
  if (s == CLPAR_OK) s = clpar_tensor_reshape(pe, 1, &flat, &pe1);
  if (s == CLPAR_OK) s = clpar_add(tok2, pe1, &sum); /* the positions broadcast over B */
  if (s == CLPAR_OK) s = clpar_tensor_reshape(sum, 3, (int64_t[]){b, t, c}, out);
  clpar_tensor *all[] = {pt, tok, pe, tok2, pe1, sum};
  for (int i = 0; i < 6; i++) clpar_tensor_free(all[i]);
  return s;
}

static clpar_status gpt_forward(clpar_module *self, clpar_tensor *idx, clpar_tensor **logits,
                                void *user) {
  const gpt_state *st = user;
  clpar_status s = check_ids(st, idx);
  if (s != CLPAR_OK) return s;
  clpar_module *tr = clpar_module_child(self, "transformer");
  int64_t b = idx->shape[0], t = idx->shape[1], c = st->c.n_embd;
  clpar_tensor *x = NULL, *d = NULL, *h = NULL, *n = NULL, *n2 = NULL, *l2 = NULL;
  s = embed(tr, idx, c, &x);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(tr, "drop"), x, &d);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(tr, "h"), d, &h);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(tr, "ln_f"), h, &n);
  if (s == CLPAR_OK) s = clpar_tensor_reshape(n, 2, (int64_t[]){b * t, c}, &n2);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(self, "lm_head"), n2, &l2);
  if (s == CLPAR_OK) s = clpar_tensor_reshape(l2, 3, (int64_t[]){b, t, st->c.vocab_size}, logits);
  clpar_tensor *all[] = {x, d, h, n, n2, l2};
  for (int i = 0; i < 6; i++) clpar_tensor_free(all[i]);
  return s;
}

static int ends_with(const char *s, const char *tail) {
  size_t a = strlen(s), b = strlen(tail);
  return a >= b && strcmp(s + a - b, tail) == 0;
}

/* GPT-2's initialization over the state list (the tied head is listed once, as wte). */
static clpar_status gpt_init(clpar_module *m, const clpar_gpt_config *c) {
  clpar_status s = CLPAR_OK;
  float proj_std = 0.02f / sqrtf(2.0f * (float)c->n_layer);
  for (int i = 0; s == CLPAR_OK && i < clpar_module_state_count(m); i++) {
    const char *name;
    clpar_tensor *p, *v = NULL;
    s = clpar_module_state_at(m, i, &name, &p, NULL);
    if (s != CLPAR_OK || strstr(name, ".ln_")) continue; /* LayerNorm: 1 and 0 */
    if (ends_with(name, ".bias")) {
      s = clpar_fill(p, 0.0f);
      continue;
    }
    float std = ends_with(name, "c_proj.weight") ? proj_std : 0.02f;
    s = clpar_tensor_rand_normal(p->storage->dev, p->ndim, p->shape, clpar_param_seed_next(), 0,
                                 std, &v);
    if (s == CLPAR_OK) s = clpar_copy(p, v);
    clpar_tensor_free(v);
  }
  return s;
}

static clpar_status check_gpt_config(const clpar_gpt_config *c, clpar_device *dev,
                                     clpar_module **out) {
  const char *fn = "clpar_gpt_create";
  if (!c || !dev || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (c->block_size < 1 || c->vocab_size < 1 || c->n_layer < 1 || c->n_layer > 100000)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: block_size %lld, vocab_size %lld and n_layer %lld must be >= 1", fn,
                           (long long)c->block_size, (long long)c->vocab_size,
                           (long long)c->n_layer);
  return CLPAR_OK;
}

/* transformer.{wte, wpe, drop, h, ln_f} */
static clpar_status build_transformer(const clpar_gpt_config *c, const clpar_block_config *bc,
                                      clpar_device *dev, clpar_module *tr) {
  clpar_module *ch = NULL;
  clpar_status s = clpar_embedding_create(c->vocab_size, c->n_embd, dev, &ch);
  if (s == CLPAR_OK) s = clpar_module_add_child(tr, "wte", ch);
  if (s == CLPAR_OK) s = clpar_embedding_create(c->block_size, c->n_embd, dev, &ch);
  if (s == CLPAR_OK) s = clpar_module_add_child(tr, "wpe", ch);
  if (s == CLPAR_OK) s = clpar_dropout_create(c->dropout, &ch);
  if (s == CLPAR_OK) s = clpar_module_add_child(tr, "drop", ch);
  clpar_module **blocks = s == CLPAR_OK ? calloc((size_t)c->n_layer, sizeof *blocks) : NULL;
  if (s == CLPAR_OK && !blocks)
    s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "clpar_gpt_create: out of host memory");
  int made = 0;
  for (; s == CLPAR_OK && made < c->n_layer; made++)
    s = clpar_transformer_block_create(bc, dev, &blocks[made]);
  if (s == CLPAR_OK)
    s = clpar_sequential_create(blocks, (int)c->n_layer, &ch);
  else
    for (int i = 0; i < made; i++) clpar_module_free(blocks[i]);
  free(blocks);
  if (s == CLPAR_OK) s = clpar_module_add_child(tr, "h", ch);
  if (s == CLPAR_OK) s = clpar_layernorm_create(c->n_embd, 0.0f, c->bias, dev, &ch);
  if (s == CLPAR_OK) s = clpar_module_add_child(tr, "ln_f", ch);
  return s;
}

clpar_status clpar_gpt_create(const clpar_gpt_config *c, clpar_device *dev, clpar_module **out) {
  clpar_status s = check_gpt_config(c, dev, out);
  if (s != CLPAR_OK) return s;
  clpar_block_config bc = {c->n_embd, c->n_head, c->dropout, c->bias};
  clpar_module *m = NULL, *tr = NULL, *head = NULL;
  gpt_state *st = malloc(sizeof *st);
  if (!st) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "clpar_gpt_create: out of memory");
  st->c = *c;
  s = clpar_module_create("GPT", gpt_forward, st, free, &m);
  if (s != CLPAR_OK) {
    free(st);
    return s;
  }
  s = clpar_module_create("ModuleDict", container_forward, NULL, NULL, &tr);
  if (s == CLPAR_OK) s = clpar_module_add_child(m, "transformer", tr);
  if (s == CLPAR_OK) s = build_transformer(c, &bc, dev, tr);
  if (s == CLPAR_OK) s = clpar_module_create("Linear", clpar_linear_forward, NULL, NULL, &head);
  if (s == CLPAR_OK) s = clpar_module_add_child(m, "lm_head", head);
  if (s == CLPAR_OK) /* weight tying: lm_head.weight is wte's tensor */
    s = clpar_module_add_parameter(head, "weight",
                                   clpar_module_parameter(clpar_module_child(tr, "wte"), "weight"));
  if (s == CLPAR_OK) s = gpt_init(m, c);
  if (s != CLPAR_OK) {
    clpar_module_free(m);
    return s;
  }
  *out = m;
  return CLPAR_OK;
}
