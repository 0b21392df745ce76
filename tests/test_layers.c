/* test_layers.c — the transformer layers (transformer.h): Embedding, LayerNorm, Dropout,
 * causal self-attention and the pre-norm block. Each runs on the host and every selected
 * device: LayerNorm, attention and the block against PyTorch's values and gradients
 * (reference/layers_ref.h from reference/make_layers_ref.py), LayerNorm's backward also
 * against central finite differences; the embedding against a gather and scatter-add in C,
 * its backward bit-identical on a second run with repeated indices; dropout's mask equal on
 * every backend for one (seed, offset), and its module's offset advancing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/layers_ref.h"
#include "test_util.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* The host first, then each selected device that is not the host. */
static int n_devices(void) {
  return 1 + clpar_device_count() - (clpar_device_index(tu_host()) >= 0 ? 1 : 0);
}
static clpar_device *device_at(int i) {
  if (i == 0) return tu_host();
  for (int k = 0; k < clpar_device_count(); k++)
    if (clpar_device_get(k) != tu_host() && --i == 0) return clpar_device_get(k);
  return NULL;
}
#define FOR_EACH_DEVICE(dev)                  \
  for (int di_ = 0; di_ < n_devices(); di_++) \
    for (clpar_device *dev = device_at(di_); dev; dev = NULL)

static clpar_tensor *from(clpar_device *dev, int ndim, const int64_t *shape, const float *v,
                          int grad) {
  clpar_tensor *t;
  tu_ok(clpar_tensor_from_host(dev, ndim, shape, v, &t));
  if (grad) tu_ok(clpar_tensor_set_requires_grad(t, 1));
  return t;
}

/* sum(y * r) as a float, the loss tensor in *keep (may be NULL). */
static float weighted_sum(clpar_tensor *y, const float *r, clpar_tensor **keep) {
  int64_t shape[CLPAR_MAX_DIMS];
  for (int d = 0; d < clpar_tensor_ndim(y); d++) shape[d] = clpar_tensor_dim(y, d);
  clpar_tensor *rt = from(clpar_tensor_device(y), clpar_tensor_ndim(y), shape, r, 0), *p, *l;
  tu_ok(clpar_mul(y, rt, &p));
  tu_ok(clpar_sum(p, &l));
  float v;
  tu_ok(clpar_tensor_read(l, &v, 1));
  clpar_tensor_free(rt), clpar_tensor_free(p);
  if (keep)
    *keep = l;
  else
    clpar_tensor_free(l);
  return v;
}

static void expect_grad(clpar_tensor *t, const float *want, float rtol, float atol,
                        const char *what, clpar_device *dev) {
  char msg[160];
  snprintf(msg, sizeof msg, "%s on %s", what, clpar_device_id(dev));
  assert_non_null(clpar_tensor_grad(t));
  float *g = tu_read(clpar_tensor_grad(t));
  tu_assert_close(g, want, (size_t)clpar_tensor_numel(t), rtol, atol, msg);
  free(g);
}

static void expect_values(clpar_tensor *t, const float *want, float rtol, float atol,
                          const char *what, clpar_device *dev) {
  char msg[160];
  snprintf(msg, sizeof msg, "%s on %s", what, clpar_device_id(dev));
  float *v = tu_read(t);
  tu_assert_close(v, want, (size_t)clpar_tensor_numel(t), rtol, atol, msg);
  free(v);
}

/* ---- LayerNorm ---- */

static void test_layernorm_pytorch(void **state) {
  (void)state;
  int64_t xs[3] = {3, 4, 8}, c = 8;
  FOR_EACH_DEVICE(dev) {
    for (int with_bias = 0; with_bias < 2; with_bias++) {
      clpar_scope *scope = clpar_scope_begin();
      clpar_tensor *x = from(dev, 3, xs, ln_x, 1), *w = from(dev, 1, &c, ln_w, 1);
      clpar_tensor *b = with_bias ? from(dev, 1, &c, ln_b, 1) : NULL, *y, *loss;
      tu_ok(clpar_layer_norm(x, w, b, 1e-5f, &y));
      weighted_sum(y, ln_r, &loss);
      tu_ok(clpar_backward(loss));
      expect_values(y, with_bias ? ln_bias_y : ln_nobias_y, 1e-5f, 1e-5f, "layer_norm y", dev);
      expect_grad(x, with_bias ? ln_bias_dx : ln_nobias_dx, 1e-4f, 1e-5f, "layer_norm dx", dev);
      expect_grad(w, with_bias ? ln_bias_dw : ln_nobias_dw, 1e-4f, 1e-5f, "layer_norm dw", dev);
      if (b) expect_grad(b, ln_bias_db, 1e-4f, 1e-5f, "layer_norm db", dev);
      clpar_scope_end(scope);
    }
  }
}

/* Central differences of sum(layer_norm(x, w, b) * r) in each element of x, w and b. */
static void test_layernorm_finite_differences(void **state) {
  (void)state;
  int64_t xs[2] = {3, 5}, c = 5;
  float *hx = tu_rand(15, 1), *hw = tu_rand(5, 2), *hb = tu_rand(5, 3), *r = tu_rand(15, 4);
  float *host[3] = {hx, hw, hb};
  size_t n[3] = {15, 5, 5};
  FOR_EACH_DEVICE(dev) {
    clpar_scope *scope = clpar_scope_begin();
    clpar_tensor *in[3] = {from(dev, 2, xs, hx, 1), from(dev, 1, &c, hw, 1),
                           from(dev, 1, &c, hb, 1)};
    clpar_tensor *y, *loss;
    tu_ok(clpar_layer_norm(in[0], in[1], in[2], 1e-5f, &y));
    weighted_sum(y, r, &loss);
    tu_ok(clpar_backward(loss));
    clpar_set_grad_enabled(0);
    for (int i = 0; i < 3; i++) {
      float *g = tu_read(clpar_tensor_grad(in[i])), fd[15];
      for (size_t j = 0; j < n[i]; j++) {
        float v = host[i][j], sides[2];
        for (int k = 0; k < 2; k++) {
          host[i][j] = v + (k ? -1e-2f : 1e-2f);
          tu_ok(clpar_tensor_write(in[i], host[i], n[i]));
          clpar_tensor *yy;
          tu_ok(clpar_layer_norm(in[0], in[1], in[2], 1e-5f, &yy));
          sides[k] = weighted_sum(yy, r, NULL);
          clpar_tensor_free(yy);
        }
        host[i][j] = v;
        tu_ok(clpar_tensor_write(in[i], host[i], n[i]));
        fd[j] = (sides[0] - sides[1]) / 2e-2f;
      }
      char what[96];
      snprintf(what, sizeof what, "layer_norm d/d input %d on %s", i, clpar_device_id(dev));
      tu_assert_close(g, fd, n[i], 2e-2f, 3e-3f, what);
      free(g);
    }
    clpar_set_grad_enabled(1);
    clpar_scope_end(scope);
  }
  free(hx), free(hw), free(hb), free(r);
}

static void test_layernorm_module(void **state) {
  (void)state;
  clpar_module *m;
  tu_ok(clpar_layernorm_create(6, 0.0f, 1, tu_host(), &m));
  assert_string_equal(clpar_module_type(m), "LayerNorm");
  assert_int_equal(clpar_module_parameter_count(m), 2);
  float w[6], b[6];
  tu_ok(clpar_tensor_read(clpar_module_parameter(m, "weight"), w, 6));
  tu_ok(clpar_tensor_read(clpar_module_parameter(m, "bias"), b, 6));
  for (int i = 0; i < 6; i++) assert_true(w[i] == 1.0f && b[i] == 0.0f);
  clpar_module_free(m);
  tu_ok(clpar_layernorm_create(6, 0.0f, 0, tu_host(), &m));
  assert_int_equal(clpar_module_parameter_count(m), 1);
  assert_null(clpar_module_parameter(m, "bias"));
  clpar_module_free(m);
}

/* ---- Embedding ---- */

/* Indices with repeats (row 2 four times), as int32 or int64. */
static clpar_tensor *indices(clpar_device *dev, int wide, const int64_t *vals, int n) {
  int64_t shape[2] = {2, n / 2};
  int32_t v32[16];
  for (int i = 0; i < n; i++) v32[i] = (int32_t)vals[i];
  clpar_tensor *t;
  tu_ok(clpar_tensor_from_host_dtype(dev, wide ? CLPAR_INT64 : CLPAR_INT32, 2, shape,
                                     wide ? (const void *)vals : (const void *)v32, &t));
  return t;
}

static void test_embedding(void **state) {
  (void)state;
  enum { NUM = 5, DIM = 3, N = 8 };
  const int64_t idx[N] = {2, 0, 2, 4, 2, 1, 2, 4};
  float *w = tu_rand(NUM * DIM, 5), *r = tu_rand(N * DIM, 6), want[N * DIM], dw[NUM * DIM] = {0};
  for (int i = 0; i < N; i++)
    for (int c = 0; c < DIM; c++) {
      want[i * DIM + c] = w[idx[i] * DIM + c];
      dw[idx[i] * DIM + c] += r[i * DIM + c];
    }
  int64_t ws[2] = {NUM, DIM};
  FOR_EACH_DEVICE(dev) {
    for (int wide = 0; wide < 2; wide++) {
      clpar_scope *scope = clpar_scope_begin();
      clpar_tensor *wt = from(dev, 2, ws, w, 1), *it = indices(dev, wide, idx, N), *y, *loss;
      tu_ok(clpar_embedding(it, wt, &y));
      assert_int_equal(clpar_tensor_ndim(y), 3);
      assert_int_equal(clpar_tensor_dim(y, 2), DIM);
      expect_values(y, want, 0, 0, "embedding y", dev);
      weighted_sum(y, r, &loss);
      tu_ok(clpar_backward(loss));
      expect_grad(wt, dw, 1e-6f, 1e-6f, "embedding dw", dev);
      float first[NUM * DIM], again[NUM * DIM];
      tu_ok(clpar_tensor_read(clpar_tensor_grad(wt), first, NUM * DIM));
      tu_ok(clpar_tensor_zero_grad(wt));
      tu_ok(clpar_backward(loss));
      tu_ok(clpar_tensor_read(clpar_tensor_grad(wt), again, NUM * DIM));
      assert_memory_equal(first, again, sizeof first); /* deterministic: the same bits */
      clpar_scope_end(scope);
    }
  }
  free(w), free(r);
}

static void test_embedding_module(void **state) {
  (void)state;
  clpar_module *m;
  clpar_manual_seed(3);
  tu_ok(clpar_embedding_create(50, 40, tu_host(), &m));
  assert_string_equal(clpar_module_type(m), "Embedding");
  clpar_tensor *w = clpar_module_parameter(m, "weight");
  assert_int_equal(clpar_tensor_dim(w, 0), 50);
  float *v = tu_read(w), mean = 0, sq = 0;
  for (int i = 0; i < 2000; i++) mean += v[i] / 2000, sq += v[i] * v[i] / 2000;
  assert_true(fabsf(mean) < 0.1f && fabsf(sq - 1.0f) < 0.15f); /* normal(0, 1) */
  free(v);
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *y, *it = indices(tu_host(), 1, (const int64_t[]){49, 0}, 2);
  tu_ok(clpar_module_forward(m, it, &y));
  assert_int_equal(clpar_tensor_dim(y, 2), 40);
  clpar_scope_end(scope);
  clpar_module_free(m);
}

/* ---- Dropout ---- */

static void test_dropout_mask(void **state) {
  (void)state;
  enum { N = 4096 };
  int64_t n = N;
  float ones[N], *ref = NULL;
  for (int i = 0; i < N; i++) ones[i] = 1.0f;
  FOR_EACH_DEVICE(dev) {
    clpar_scope *scope = clpar_scope_begin();
    clpar_tensor *x = from(dev, 1, &n, ones, 1), *y, *y2, *loss;
    tu_ok(clpar_dropout(x, 0.25f, 1, 77, 1000, &y));
    float *v = tu_read(y);
    int kept = 0;
    for (int i = 0; i < N; i++) {
      assert_true(v[i] == 0.0f || v[i] == 1.0f / 0.75f);
      kept += v[i] != 0.0f;
    }
    assert_true(kept > N * 0.7 && kept < N * 0.8);
    if (!ref) ref = tu_read(y);
    char what[96];
    snprintf(what, sizeof what, "dropout mask on %s against the host", clpar_device_id(dev));
    tu_assert_close(v, ref, N, 0, 0, what); /* the same (seed, offset): the same mask */
    /* the mask of offset 1000 + 96 starts 96 elements later */
    tu_ok(clpar_dropout(x, 0.25f, 1, 77, 1096, &y2));
    float *w2 = tu_read(y2);
    tu_assert_close(w2, v + 96, N - 96, 0, 0, "dropout mask at a later offset");
    tu_ok(clpar_sum(y, &loss));
    tu_ok(clpar_backward(loss));
    expect_grad(x, v, 0, 0, "dropout dx (the mask)", dev);
    free(v), free(w2);
    clpar_scope_end(scope);
  }
  free(ref);
}

static void test_dropout_identity_and_module(void **state) {
  (void)state;
  clpar_scope *scope = clpar_scope_begin();
  int64_t n = 64;
  clpar_tensor *x = tu_make(tu_host(), 1, &n, 8), *y;
  float *xv = tu_read(x);
  tu_ok(clpar_dropout(x, 0.5f, 0, 1, 0, &y)); /* eval */
  expect_values(y, xv, 0, 0, "dropout in eval", tu_host());
  tu_ok(clpar_dropout(x, 0.0f, 1, 1, 0, &y)); /* p = 0 */
  expect_values(y, xv, 0, 0, "dropout p=0", tu_host());
  tu_ok(clpar_dropout(x, 1.0f, 1, 1, 0, &y)); /* p = 1: zeros */
  float zeros[64] = {0};
  expect_values(y, zeros, 0, 0, "dropout p=1", tu_host());
  assert_int_equal(clpar_dropout(x, 1.5f, 1, 1, 0, &y), CLPAR_ERROR_INVALID_ARGUMENT);
  clpar_module *m;
  tu_ok(clpar_dropout_create(0.5f, &m));
  uint64_t seed, off;
  tu_ok(clpar_dropout_set_state(m, 9, 0));
  tu_ok(clpar_module_forward(m, x, &y));
  tu_ok(clpar_dropout_get_state(m, &seed, &off));
  assert_true(seed == 9 && off == 64);
  clpar_tensor *want;
  tu_ok(clpar_dropout(x, 0.5f, 1, 9, 0, &want)); /* the module's mask is (seed, offset)'s */
  tu_expect_equal(y, want, 0, 0, "Dropout module's first forward");
  tu_ok(clpar_module_eval(m));
  tu_ok(clpar_module_forward(m, x, &y));
  expect_values(y, xv, 0, 0, "Dropout module in eval", tu_host());
  tu_ok(clpar_dropout_get_state(m, NULL, &off));
  assert_true(off == 64); /* eval draws nothing */
  clpar_module_free(m);
  free(xv);
  clpar_scope_end(scope);
}

/* ---- attention and the block against nanoGPT's modules ---- */

/* Overwrites m's state (parameters in state_dict order) from the flat values. */
static void load_params(clpar_module *m, const float *flat, size_t total) {
  size_t at = 0;
  for (int i = 0; i < clpar_module_state_count(m); i++) {
    clpar_tensor *t;
    tu_ok(clpar_module_state_at(m, i, NULL, &t, NULL));
    size_t n = (size_t)clpar_tensor_numel(t);
    tu_ok(clpar_tensor_write(t, flat + at, n));
    at += n;
  }
  assert_int_equal(at, total);
}

static void check_module_grads(clpar_module *m, const float *want, size_t total, clpar_device *dev,
                               const char *tag) {
  size_t at = 0;
  for (int i = 0; i < clpar_module_state_count(m); i++) {
    const char *name;
    clpar_tensor *t;
    tu_ok(clpar_module_state_at(m, i, &name, &t, NULL));
    char what[128];
    snprintf(what, sizeof what, "%s d/d %s", tag, name);
    expect_grad(t, want + at, 1e-4f, 2e-5f, what, dev);
    at += (size_t)clpar_tensor_numel(t);
  }
  assert_int_equal(at, total);
}

static void run_block_case(int block) {
  clpar_block_config cfg = {8, 2, 0.0f, 1};
  int64_t xs[3] = {2, 5, 8};
  const char *tag = block ? "Block" : "CausalSelfAttention";
  FOR_EACH_DEVICE(dev) {
    clpar_module *m;
    tu_ok(block ? clpar_transformer_block_create(&cfg, dev, &m)
                : clpar_causal_self_attention_create(&cfg, dev, &m));
    load_params(m, block ? block_params : attn_params,
                block ? N_OF(block_params) : N_OF(attn_params));
    clpar_scope *scope = clpar_scope_begin();
    clpar_tensor *x = from(dev, 3, xs, block ? block_x : attn_x, 1), *y, *loss;
    tu_ok(clpar_module_forward(m, x, &y));
    weighted_sum(y, block ? block_r : attn_r, &loss);
    tu_ok(clpar_backward(loss));
    expect_values(y, block ? block_y : attn_y, 1e-4f, 1e-5f, tag, dev);
    expect_grad(x, block ? block_dx : attn_dx, 1e-4f, 2e-5f, tag, dev);
    check_module_grads(m, block ? block_dparams : attn_dparams,
                       block ? N_OF(block_dparams) : N_OF(attn_dparams), dev, tag);
    clpar_scope_end(scope);
    clpar_module_free(m);
  }
}

static void test_attention_pytorch(void **state) {
  (void)state;
  run_block_case(0);
}

static void test_block_pytorch(void **state) {
  (void)state;
  run_block_case(1);
}

static void test_block_names(void **state) {
  (void)state;
  clpar_block_config cfg = {8, 2, 0.1f, 1};
  clpar_module *m;
  tu_ok(clpar_transformer_block_create(&cfg, tu_host(), &m));
  static const char *want[] = {"ln_1.weight",      "ln_1.bias",          "attn.c_attn.weight",
                               "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
                               "ln_2.weight",      "ln_2.bias",          "mlp.c_fc.weight",
                               "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
  assert_int_equal(clpar_module_state_count(m), (int)N_OF(want));
  for (int i = 0; i < (int)N_OF(want); i++) {
    const char *name;
    tu_ok(clpar_module_state_at(m, i, &name, NULL, NULL));
    assert_string_equal(name, want[i]);
  }
  clpar_module_free(m);
  cfg.n_head = 3; /* 8 is no multiple of 3 */
  assert_int_equal(clpar_transformer_block_create(&cfg, tu_host(), &m),
                   CLPAR_ERROR_INVALID_ARGUMENT);
}

/* ---- GPT ---- */

static void test_gpt_names_and_init(void **state) {
  (void)state;
  clpar_gpt_config cfg = {16, 65, 2, 2, 32, 0.0f, 1};
  clpar_module *m;
  clpar_manual_seed(1);
  tu_ok(clpar_gpt_create(&cfg, tu_host(), &m));
  static const char *block[] = {"ln_1.weight",      "ln_1.bias",          "attn.c_attn.weight",
                                "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
                                "ln_2.weight",      "ln_2.bias",          "mlp.c_fc.weight",
                                "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
  static const int64_t block_shapes[][2] = {{32, 0},   {32, 0},  {96, 32},  {96, 0},
                                            {32, 32},  {32, 0},  {32, 0},   {32, 0},
                                            {128, 32}, {128, 0}, {32, 128}, {32, 0}};
  assert_int_equal(clpar_module_state_count(m), 2 + 2 * 12 + 2);
  assert_int_equal(clpar_module_parameter_count(m), 2 + 2 * 12 + 2);
  for (int i = 0; i < clpar_module_state_count(m); i++) {
    const char *name;
    clpar_tensor *t;
    tu_ok(clpar_module_state_at(m, i, &name, &t, NULL));
    char want[96];
    const int64_t *shape;
    int64_t emb[2][2] = {{65, 32}, {16, 32}}, lnf[2] = {32, 0};
    if (i < 2) {
      snprintf(want, sizeof want, "transformer.%s.weight", i ? "wpe" : "wte");
      shape = emb[i];
    } else if (i < 26) {
      snprintf(want, sizeof want, "transformer.h.%d.%s", (i - 2) / 12, block[(i - 2) % 12]);
      shape = block_shapes[(i - 2) % 12];
    } else {
      snprintf(want, sizeof want, "transformer.ln_f.%s", i == 26 ? "weight" : "bias");
      shape = lnf;
    }
    assert_string_equal(name, want);
    assert_int_equal(clpar_tensor_ndim(t), shape[1] ? 2 : 1);
    assert_int_equal(clpar_tensor_dim(t, 0), shape[0]);
    if (shape[1]) assert_int_equal(clpar_tensor_dim(t, 1), shape[1]);
    /* GPT-2's initialization: the spread of each weight matrix */
    float *v = tu_read(t), sq = 0;
    int64_t n = clpar_tensor_numel(t);
    for (int64_t j = 0; j < n; j++) sq += v[j] * v[j] / (float)n;
    float want_std = strstr(name, ".ln_")            ? -1
                     : strstr(name, "bias")          ? 0
                     : strstr(name, "c_proj.weight") ? 0.01f
                                                     : 0.02f; /* 0.02 / sqrt(4) */
    if (want_std == 0) assert_true(sq == 0);
    if (want_std > 0) assert_true(fabsf(sqrtf(sq) - want_std) < 0.2f * want_std);
    free(v);
  }
  /* lm_head.weight is wte's tensor */
  assert_ptr_equal(clpar_module_parameter(clpar_module_child(m, "lm_head"), "weight"),
                   clpar_module_parameter(
                       clpar_module_child(clpar_module_child(m, "transformer"), "wte"), "weight"));
  clpar_module_free(m);
  cfg.n_head = 3;
  assert_int_equal(clpar_gpt_create(&cfg, tu_host(), &m), CLPAR_ERROR_INVALID_ARGUMENT);
}

/* The tiny GPT of the fixture: weights 0.1 sin(0.37 i + 1.3 j) (+1 for LayerNorm weights),
 * logits, loss and every gradient against nanoGPT's. */
static void test_gpt_pytorch(void **state) {
  (void)state;
  enum { V = 11, TMAX = 8, B = 2, T = 6 };
  clpar_gpt_config cfg = {TMAX, V, 2, 2, 8, 0.0f, 1};
  int64_t ids[B * T], tg[B * T];
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      ids[b * T + t] = (b * 7 + t * 3) % V;
      tg[b * T + t] = (ids[b * T + t] + 1) % V;
    }
  FOR_EACH_DEVICE(dev) {
    clpar_module *m;
    tu_ok(clpar_gpt_create(&cfg, dev, &m));
    for (int j = 0; j < clpar_module_state_count(m); j++) {
      const char *name;
      clpar_tensor *p;
      tu_ok(clpar_module_state_at(m, j, &name, &p, NULL));
      size_t n = (size_t)clpar_tensor_numel(p);
      float *v = malloc(n * sizeof *v);
      int ln_weight = strstr(name, ".ln_") && strstr(name, ".weight");
      for (size_t i = 0; i < n; i++)
        v[i] = (float)(0.1 * sin(0.37 * (double)i + 1.3 * j)) + (ln_weight ? 1.0f : 0.0f);
      tu_ok(clpar_tensor_write(p, v, n));
      free(v);
    }
    clpar_scope *scope = clpar_scope_begin();
    clpar_tensor *it, *tt, *logits, *loss;
    int64_t shape[2] = {B, T};
    tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT64, 2, shape, ids, &it));
    tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT64, 2, shape, tg, &tt));
    tu_ok(clpar_module_forward(m, it, &logits));
    assert_int_equal(clpar_tensor_dim(logits, 2), V);
    expect_values(logits, gpt_logits, 1e-4f, 1e-5f, "GPT logits", dev);
    tu_ok(clpar_cross_entropy_targets(logits, tt, CLPAR_IGNORE_INDEX, CLPAR_REDUCTION_MEAN, &loss));
    expect_values(loss, gpt_loss, 1e-5f, 0, "GPT loss", dev);
    tu_ok(clpar_backward(loss));
    check_module_grads(m, gpt_dparams, N_OF(gpt_dparams), dev, "GPT");
    clpar_scope_end(scope);
    clpar_module_free(m);
  }
}

static void test_errors(void **state) {
  (void)state;
  clpar_scope *scope = clpar_scope_begin();
  clpar_device *h = tu_host();
  clpar_tensor *w = tu_make(h, 2, (int64_t[]){4, 3}, 1), *f = tu_make(h, 1, (int64_t[]){2}, 2);
  clpar_tensor *out = NULL;
  assert_int_equal(clpar_embedding(f, w, &out), CLPAR_ERROR_DTYPE);
  assert_non_null(strstr(clpar_last_error(), "clpar_embedding"));
  assert_int_equal(clpar_layer_norm(w, f, NULL, 1e-5f, &out), CLPAR_ERROR_SHAPE_MISMATCH);
  assert_non_null(strstr(clpar_last_error(), "clpar_layer_norm"));
  assert_null(out);
  clpar_module *m = NULL;
  assert_int_equal(clpar_embedding_create(0, 3, h, &m), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_dropout_set_state(NULL, 1, 0), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_null(m);
  clpar_scope_end(scope);
}

static int grad_on(void **state) {
  (void)state;
  clpar_set_grad_enabled(1);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_layernorm_pytorch, grad_on),
      cmocka_unit_test_setup(test_layernorm_finite_differences, grad_on),
      cmocka_unit_test_setup(test_layernorm_module, grad_on),
      cmocka_unit_test_setup(test_embedding, grad_on),
      cmocka_unit_test_setup(test_embedding_module, grad_on),
      cmocka_unit_test_setup(test_dropout_mask, grad_on),
      cmocka_unit_test_setup(test_dropout_identity_and_module, grad_on),
      cmocka_unit_test_setup(test_attention_pytorch, grad_on),
      cmocka_unit_test_setup(test_block_pytorch, grad_on),
      cmocka_unit_test_setup(test_block_names, grad_on),
      cmocka_unit_test_setup(test_gpt_names_and_init, grad_on),
      cmocka_unit_test_setup(test_gpt_pytorch, grad_on),
      cmocka_unit_test_setup(test_errors, grad_on),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
