/* gpt.c — nanoGPT's GPT: token and position embeddings, n_layer pre-norm blocks, a final
 * LayerNorm and a language-model head tied to the token embedding, under GPT-2's parameter
 * names and with GPT-2's initialization (normal 0.02, the residual projections c_proj
 * normal 0.02 / sqrt(2 n_layer), biases 0, LayerNorms 1 and 0). */
#include <math.h>
#include <stdio.h>
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

/* wte(idx) + wpe(0 .. T-1), [B, T, C]. The positions' embeddings are wpe's first T rows, a
 * view (its backward adds into those rows of wpe's gradient, the others stay zero, as
 * wpe(arange(T))'s does): nothing is uploaded per forward, so a captured step can hold it. */
static clpar_status embed(clpar_module *tr, clpar_tensor *idx, int64_t c, clpar_tensor **out) {
  int64_t b = idx->shape[0], t = idx->shape[1], row[2] = {b, t * c}, flat = t * c;
  clpar_tensor *wpe = clpar_module_parameter(clpar_module_child(tr, "wpe"), "weight");
  clpar_tensor *tok = NULL, *pe = NULL, *tok2 = NULL, *pe1 = NULL, *sum = NULL;
  clpar_status s = clpar_module_forward(clpar_module_child(tr, "wte"), idx, &tok);
  if (s == CLPAR_OK) s = clpar_tensor_rows(wpe, 0, t, &pe);
  if (s == CLPAR_OK) s = clpar_tensor_reshape(tok, 2, row, &tok2);
  if (s == CLPAR_OK) s = clpar_tensor_reshape(pe, 1, &flat, &pe1);
  if (s == CLPAR_OK) s = clpar_add(tok2, pe1, &sum); /* the positions broadcast over B */
  if (s == CLPAR_OK) s = clpar_tensor_reshape(sum, 3, (int64_t[]){b, t, c}, out);
  clpar_tensor *all[] = {tok, pe, tok2, pe1, sum};
  for (int i = 0; i < 5; i++) clpar_tensor_free(all[i]);
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

/* ---- the GPT cut into pipeline stages ---- */

typedef struct {
  clpar_gpt_config c;
  int first, last;
  int64_t b0, b1;       /* the blocks [b0, b1) of this stage */
  clpar_module *stage0; /* the first stage, which holds wte (the head's tied weight) */
} stage_state;

/* The head on the last stage: ln_f, then logits from wte, copied (differentiably) from the
 * first stage's device when that is another, so that wte's gradient sums both uses. */
static clpar_status stage_head(const stage_state *st, clpar_module *tr, clpar_tensor *h,
                               clpar_tensor **logits) {
  int64_t b = h->shape[0], t = h->shape[1], c = st->c.n_embd;
  clpar_tensor *wte = clpar_module_parameter(
      clpar_module_child(clpar_module_child(st->stage0, "transformer"), "wte"), "weight");
  clpar_tensor *w = NULL, *n = NULL, *n2 = NULL, *l2 = NULL;
  clpar_status s = clpar_tensor_to(wte, clpar_tensor_device(h), &w);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(tr, "ln_f"), h, &n);
  if (s == CLPAR_OK) s = clpar_tensor_reshape(n, 2, (int64_t[]){b * t, c}, &n2);
  if (s == CLPAR_OK) s = clpar_linear(n2, w, NULL, &l2);
  if (s == CLPAR_OK) s = clpar_tensor_reshape(l2, 3, (int64_t[]){b, t, st->c.vocab_size}, logits);
  clpar_tensor *all[] = {w, n, n2, l2};
  for (int i = 0; i < 4; i++) clpar_tensor_free(all[i]);
  return s;
}

static clpar_status check_activation(const stage_state *st, const clpar_tensor *x) {
  const char *fn = "GPTStage";
  if (!x) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: input is NULL", fn);
  clpar_status s = clpar_check_alive(fn, x);
  char a[128];
  if (s == CLPAR_OK && (x->ndim != 3 || x->shape[2] != st->c.n_embd))
    s = clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                        "%s: input is %s; need the previous stage's [B, T, %lld]", fn,
                        clpar_tensor_shape_str(x, a, sizeof a), (long long)st->c.n_embd);
  return s;
}

/* The first stage: token ids [B, T] to wte + wpe, dropout, its blocks; a later stage: the
 * previous stage's [B, T, C] through its blocks; the last also ln_f and the head. */
static clpar_status stage_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                  void *user) {
  const stage_state *st = user;
  gpt_state gs = {st->c};
  clpar_status s = st->first ? check_ids(&gs, x) : check_activation(st, x);
  if (s != CLPAR_OK) return s;
  clpar_module *tr = clpar_module_child(self, "transformer"), *h = clpar_module_child(tr, "h");
  clpar_tensor *e = NULL, *cur = x;
  if (st->first) s = embed(tr, x, st->c.n_embd, &e);
  if (s == CLPAR_OK && st->first) s = clpar_module_forward(clpar_module_child(tr, "drop"), e, &cur);
  clpar_tensor_free(e);
  for (int64_t i = st->b0; s == CLPAR_OK && i < st->b1; i++) {
    char name[24];
    snprintf(name, sizeof name, "%lld", (long long)i);
    clpar_tensor *next = NULL;
    s = clpar_module_forward(clpar_module_child(h, name), cur, &next);
    if (cur != x) clpar_tensor_free(cur);
    cur = next;
  }
  /* every stage has a block, so cur is not x here */
  if (s == CLPAR_OK && st->last) s = stage_head(st, tr, cur, y);
  if (s == CLPAR_OK && !st->last)
    *y = cur;
  else if (cur != x)
    clpar_tensor_free(cur);
  return s;
}

/* Stage k's modules: transformer.{wte, wpe, drop} on the first, transformer.h.<i> for its
 * blocks, transformer.ln_f on the last. */
static clpar_status build_stage(const clpar_gpt_config *c, clpar_device *dev, stage_state *st,
                                clpar_module *m) {
  clpar_block_config bc = {c->n_embd, c->n_head, c->dropout, c->bias};
  clpar_module *tr = NULL, *h = NULL, *ch = NULL;
  clpar_status s = clpar_module_create("ModuleDict", container_forward, NULL, NULL, &tr);
  if (s == CLPAR_OK) s = clpar_module_add_child(m, "transformer", tr);
  if (s == CLPAR_OK && st->first) s = clpar_embedding_create(c->vocab_size, c->n_embd, dev, &ch);
  if (s == CLPAR_OK && st->first) s = clpar_module_add_child(tr, "wte", ch);
  if (s == CLPAR_OK && st->first) s = clpar_embedding_create(c->block_size, c->n_embd, dev, &ch);
  if (s == CLPAR_OK && st->first) s = clpar_module_add_child(tr, "wpe", ch);
  if (s == CLPAR_OK && st->first) s = clpar_dropout_create(c->dropout, &ch);
  if (s == CLPAR_OK && st->first) s = clpar_module_add_child(tr, "drop", ch);
  if (s == CLPAR_OK) s = clpar_module_create("ModuleList", container_forward, NULL, NULL, &h);
  if (s == CLPAR_OK) s = clpar_module_add_child(tr, "h", h);
  for (int64_t i = st->b0; s == CLPAR_OK && i < st->b1; i++) {
    char name[24];
    snprintf(name, sizeof name, "%lld", (long long)i);
    s = clpar_transformer_block_create(&bc, dev, &ch);
    if (s == CLPAR_OK) s = clpar_module_add_child(h, name, ch);
  }
  if (s == CLPAR_OK && st->last) s = clpar_layernorm_create(c->n_embd, 0.0f, c->bias, dev, &ch);
  if (s == CLPAR_OK && st->last) s = clpar_module_add_child(tr, "ln_f", ch);
  return s;
}

/* The Dropout modules of a block, by path. */
static const char *const block_dropouts[][2] = {
    {"attn", "attn_dropout"}, {"attn", "resid_dropout"}, {"mlp", "dropout"}};

/* stage's parameters and Dropout states from the GPT g of the same configuration. */
static clpar_status copy_from_gpt(clpar_module *g, clpar_module *stage, const stage_state *st) {
  clpar_status s = CLPAR_OK;
  for (int i = 0; s == CLPAR_OK && i < clpar_module_state_count(stage); i++) {
    const char *name, *gname;
    clpar_tensor *p, *q = NULL;
    s = clpar_module_state_at(stage, i, &name, &p, NULL);
    for (int j = 0; s == CLPAR_OK && !q && j < clpar_module_state_count(g); j++) {
      clpar_tensor *t;
      s = clpar_module_state_at(g, j, &gname, &t, NULL);
      if (s == CLPAR_OK && strcmp(gname, name) == 0) q = t;
    }
    if (s == CLPAR_OK) s = clpar_copy(p, q);
  }
  clpar_module *gtr = clpar_module_child(g, "transformer");
  clpar_module *tr = clpar_module_child(stage, "transformer");
  uint64_t seed, off;
  if (s == CLPAR_OK && st->first)
    s = clpar_dropout_get_state(clpar_module_child(gtr, "drop"), &seed, &off);
  if (s == CLPAR_OK && st->first)
    s = clpar_dropout_set_state(clpar_module_child(tr, "drop"), seed, off);
  for (int64_t b = st->b0; s == CLPAR_OK && b < st->b1; b++) {
    char name[24];
    snprintf(name, sizeof name, "%lld", (long long)b);
    clpar_module *gb = clpar_module_child(clpar_module_child(gtr, "h"), name);
    clpar_module *sb = clpar_module_child(clpar_module_child(tr, "h"), name);
    for (int k = 0; s == CLPAR_OK && k < 3; k++) {
      const char *const *path = block_dropouts[k];
      s = clpar_dropout_get_state(clpar_module_child(clpar_module_child(gb, path[0]), path[1]),
                                  &seed, &off);
      if (s == CLPAR_OK)
        s = clpar_dropout_set_state(clpar_module_child(clpar_module_child(sb, path[0]), path[1]),
                                    seed, off);
    }
  }
  return s;
}

static clpar_status make_stage(const clpar_gpt_config *c, clpar_device *dev, int k, int n,
                               clpar_module *stage0, clpar_module **out) {
  stage_state *st = malloc(sizeof *st);
  if (!st)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "clpar_gpt_create_stages: out of memory");
  *st = (stage_state){*c, k == 0, k == n - 1, c->n_layer * k / n, c->n_layer * (k + 1) / n, stage0};
  clpar_status s = clpar_module_create("GPTStage", stage_forward, st, free, out);
  if (s != CLPAR_OK) {
    free(st);
    return s;
  }
  if (k == 0) st->stage0 = *out;
  s = build_stage(c, dev, st, *out);
  if (s != CLPAR_OK) clpar_module_free(*out);
  return s;
}

clpar_status clpar_gpt_create_stages(const clpar_gpt_config *c, int n_stages, clpar_device *dev,
                                     clpar_module **stages) {
  clpar_module *g = NULL;
  clpar_status s = check_gpt_config(c, dev, stages);
  if (s == CLPAR_OK && (n_stages < 1 || n_stages > c->n_layer))
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                        "clpar_gpt_create_stages: n_stages %d; need 1 to n_layer (%lld)", n_stages,
                        (long long)c->n_layer);
  if (s == CLPAR_OK) s = clpar_gpt_create(c, dev, &g);
  /* the stages' own draws are overwritten by g's values: the seed stream goes on from where
   * g left it, as after clpar_gpt_create */
  uint64_t seed, counter;
  clpar_rng_state_get(&seed, &counter);
  int made = 0;
  for (; s == CLPAR_OK && made < n_stages; made++) {
    s = make_stage(c, dev, made, n_stages, made ? stages[0] : NULL, &stages[made]);
    if (s == CLPAR_OK)
      s = copy_from_gpt(g, stages[made], stages[made]->user);
    else
      made--;
  }
  clpar_rng_state_set(seed, counter);
  clpar_module_free(g);
  if (s != CLPAR_OK)
    for (int i = 0; i < made; i++) clpar_module_free(stages[i]), stages[i] = NULL;
  return s;
}
