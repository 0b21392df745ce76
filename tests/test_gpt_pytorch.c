/* test_gpt_pytorch.c — the tiny GPT (2 layers, 2 heads, 32 wide, block 16, vocabulary 65,
 * dropout 0) against nanoGPT's in PyTorch (reference/gpt_ref.h from
 * reference/make_gpt_ref.py), on the host and every selected device: the logits of a batch
 * of 4 x 16 whose targets hold one ignored token, the cross-entropy, every parameter's
 * gradient, and the losses of 10 steps of nanoGPT's loop (AdamW with its decay groups,
 * clip_grad_norm 1.0, the warm-up cosine schedule) on batches that change each step. Both
 * sides compute the weights from one formula, so the fixture holds outputs only. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/gpt_ref.h"
#include "test_util.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

enum { V = 65, TMAX = 16, B = 4, T = 16, STEPS = 10, IGNORE = -1 };

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

/* The GPT on dev with tensor j's element i 0.1 sin(0.37 i + 1.3 j), +1 for LayerNorm
 * weights (make_gpt_ref.py's formula). */
static clpar_module *make_gpt(clpar_device *dev) {
  clpar_gpt_config cfg = {TMAX, V, 2, 2, 32, 0.0f, 1};
  clpar_module *m;
  tu_ok(clpar_gpt_create(&cfg, dev, &m));
  for (int j = 0; j < clpar_module_state_count(m); j++) {
    const char *name;
    clpar_tensor *p;
    tu_ok(clpar_module_state_at(m, j, &name, &p, NULL));
    size_t n = (size_t)clpar_tensor_numel(p);
    float *v = malloc(n * sizeof *v);
    assert_non_null(v);
    int ln_weight = strstr(name, ".ln_") && strstr(name, ".weight");
    for (size_t i = 0; i < n; i++)
      v[i] = (float)(0.1 * sin(0.37 * (double)i + 1.3 * j)) + (ln_weight ? 1.0f : 0.0f);
    tu_ok(clpar_tensor_write(p, v, n));
    free(v);
  }
  return m;
}

/* Step step's batch (make_gpt_ref.py's batch()): token (b, t) is (11 b + 5 t + 3 step) % V,
 * its target the next token, (token + 5) % V, except target (1, 7), which is ignored. */
static void make_batch(clpar_device *dev, int step, clpar_tensor **idx, clpar_tensor **tgt) {
  int64_t ids[B * T], tg[B * T], shape[2] = {B, T};
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      ids[b * T + t] = (11 * b + 5 * t + 3 * step) % V;
      tg[b * T + t] = (ids[b * T + t] + 5) % V;
    }
  tg[1 * T + 7] = IGNORE;
  tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT64, 2, shape, ids, idx));
  tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT64, 2, shape, tg, tgt));
}

/* Asserts each element of got within rtol * (|want| + max |want|) of PyTorch's: relative
 * 1e-4 where the value is large, and of the tensor's scale where it is near zero. Returns
 * the largest |got - want| / max |want| seen (the figure the report quotes). */
static double check_close(const float *got, const float *want, size_t n, double rtol,
                          const char *what, clpar_device *dev) {
  double scale = 0, worst = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)want[i]));
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)got[i] - (double)want[i]);
    if (!(d <= rtol * (fabs((double)want[i]) + scale)))
      fail_msg("%s on %s: element %zu is %.9g, PyTorch %.9g", what, clpar_device_id(dev), i,
               (double)got[i], (double)want[i]);
    worst = fmax(worst, d / scale);
  }
  return worst;
}

static void test_logits_loss_grads(void **state) {
  (void)state;
  FOR_EACH_DEVICE(dev) {
    clpar_module *m = make_gpt(dev);
    clpar_scope *scope = clpar_scope_begin();
    clpar_tensor *idx, *tgt, *logits, *loss;
    make_batch(dev, 0, &idx, &tgt);
    tu_ok(clpar_module_forward(m, idx, &logits));
    assert_int_equal(clpar_tensor_numel(logits), N_OF(gpt_ref_logits));
    float *v = tu_read(logits), l;
    double wl = check_close(v, gpt_ref_logits, N_OF(gpt_ref_logits), 1e-4, "logits", dev);
    free(v);
    tu_ok(clpar_cross_entropy_targets(logits, tgt, IGNORE, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_tensor_read(loss, &l, 1));
    double wloss = check_close(&l, gpt_ref_loss, 1, 1e-4, "loss", dev);
    tu_ok(clpar_backward(loss));
    size_t at = 0;
    double wg = 0;
    for (int i = 0; i < clpar_module_state_count(m); i++) {
      const char *name;
      clpar_tensor *p;
      tu_ok(clpar_module_state_at(m, i, &name, &p, NULL));
      size_t n = (size_t)clpar_tensor_numel(p);
      assert_true(at + n <= N_OF(gpt_ref_dparams));
      assert_non_null(clpar_tensor_grad(p));
      float *g = tu_read(clpar_tensor_grad(p));
      wg = fmax(wg, check_close(g, gpt_ref_dparams + at, n, 1e-4, name, dev));
      free(g);
      at += n;
    }
    assert_int_equal(at, N_OF(gpt_ref_dparams));
    print_message("%s: max |diff| / max |PyTorch|: logits %.2g, loss %.2g, gradients %.2g\n",
                  clpar_device_id(dev), wl, wloss, wg);
    clpar_scope_end(scope);
    clpar_module_free(m);
  }
}

/* nanoGPT's train.py loop: the rate from get_lr, forward, cross-entropy, backward,
 * clip_grad_norm_(1.0), AdamW step; each step's loss into losses. */
static void train(clpar_module *m, clpar_device *dev, float *losses) {
  clpar_optimizer *o;
  clpar_adam_options ad = {.lr = 6e-3f, .beta2 = 0.99f, .weight_decay = 0.1f};
  tu_ok(clpar_adamw_create_decay_groups(m, &ad, &o));
  clpar_lr_scheduler *s;
  tu_ok(clpar_warmup_cosine_lr_create(o, 3, 8, 6e-4f, &s));
  for (int step = 0; step < STEPS; step++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *idx, *tgt, *logits, *loss, *norm;
    make_batch(dev, step, &idx, &tgt);
    tu_ok(clpar_optimizer_zero_grad(o));
    tu_ok(clpar_module_forward(m, idx, &logits));
    tu_ok(clpar_cross_entropy_targets(logits, tgt, IGNORE, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_clip_grad_norm_module(m, 1.0f, &norm));
    tu_ok(clpar_optimizer_step(o));
    tu_ok(clpar_lr_scheduler_step(s));
    tu_ok(clpar_tensor_read(loss, &losses[step], 1));
    clpar_scope_end(sc);
  }
  clpar_lr_scheduler_free(s);
  clpar_optimizer_free(o);
}

static void test_adamw_steps(void **state) {
  (void)state;
  assert_int_equal(N_OF(gpt_ref_losses), STEPS);
  FOR_EACH_DEVICE(dev) {
    clpar_module *m = make_gpt(dev);
    float losses[STEPS];
    train(m, dev, losses);
    double worst = 0;
    for (int t = 0; t < STEPS; t++) {
      double d = fabs((double)losses[t] - (double)gpt_ref_losses[t]);
      if (!(d <= 1e-4))
        fail_msg("step %d's loss on %s: %.9g, PyTorch %.9g", t, clpar_device_id(dev),
                 (double)losses[t], (double)gpt_ref_losses[t]);
      worst = fmax(worst, d);
    }
    print_message("%s: 10 AdamW losses, max |diff| %.2g\n", clpar_device_id(dev), worst);
    clpar_module_free(m);
  }
}

static int grad_on(void **state) {
  (void)state;
  clpar_set_grad_enabled(1);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_logits_loss_grads, grad_on),
      cmocka_unit_test_setup(test_adamw_steps, grad_on),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
