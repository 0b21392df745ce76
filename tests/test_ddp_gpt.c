/* test_ddp_gpt.c — the tiny GPT (tiny_gpt.h) under DistributedDataParallel, run by ctest
 * through mpirun on 2 ranks: each rank trains its rows of the batch for 3 AdamW steps (decay
 * groups, clipping by the norm of the reduced gradient) and, on its own, the whole batch on
 * one model; losses (the ranks' mean), the last step's gradients and the parameters after
 * must agree within 1e-4 of each tensor's largest value (sums in other orders; tiny_gpt.h's
 * tg_expect_same).
 * The ranks start from different weights (seeded by rank): DDP broadcasts rank 0's.
 *
 * With dropout, each rank's Dropout modules keep their own seed (DDP broadcasts parameters and
 * buffers, not seeds) and offset, which counts that rank's elements only: with the same seed
 * on every rank, rank r's rows get the masks that one device gives the first rows of a batch,
 * so every rank draws the same masks. The step is then one device's on the rows of each rank
 * in turn, the Dropout offsets set back before each (test_dropout_masks_per_rank). Seeding
 * each rank's Dropout modules apart (clpar_manual_seed(seed + rank) before making the model,
 * as nanoGPT seeds 1337 + rank) gives each rank masks of its own. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tiny_gpt.h"

static const float tol = 1e-4f;

static void ddp_run(float dropout, uint64_t seed, tg_run *r) {
  int rank = clpar_dist_rank(), world = clpar_dist_world_size();
  assert_int_equal(TG_B % world, 0);
  clpar_gpt_config c = tg_config(dropout);
  clpar_module *m;
  clpar_manual_seed(seed);
  tu_ok(clpar_gpt_create(&c, clpar_dist_device(), &m));
  tu_ok(clpar_ddp_create(m, NULL, &m));
  tg_train(m, clpar_dist_device(), rank * (TG_B / world), TG_B / world, 0, r);
  tu_ok(clpar_ddp_synchronize(m));
  tu_ok(clpar_dist_all_reduce_mean(r->loss, TG_STEPS)); /* the batch's loss */
  clpar_module_free(m);
}

static void test_matches_one_device(void **state) {
  (void)state;
  tg_run ref = {0}, ddp = {0};
  clpar_gpt_config c = tg_config(0.0f);
  clpar_module *m;
  clpar_manual_seed(7);
  tu_ok(clpar_gpt_create(&c, clpar_dist_device(), &m));
  tg_train(m, clpar_dist_device(), 0, TG_B, 0, &ref);
  clpar_module_free(m);
  ddp_run(0.0f, 7 + (uint64_t)clpar_dist_rank(), &ddp);
  char what[64];
  snprintf(what, sizeof what, "rank %d: DDP", clpar_dist_rank());
  tg_expect_same(&ref, &ddp, tol, what);
  tg_free(&ref);
  tg_free(&ddp);
}

/* The GPT's Dropout modules: transformer.drop and three per block. */
static int dropouts(clpar_module *m, clpar_module **out) {
  clpar_module *tr = clpar_module_child(m, "transformer");
  int n = 0;
  out[n++] = clpar_module_child(tr, "drop");
  char name[16];
  for (int b = 0; snprintf(name, sizeof name, "%d", b),
           clpar_module_child(clpar_module_child(tr, "h"), name) != NULL;
       b++) {
    clpar_module *blk = clpar_module_child(clpar_module_child(tr, "h"), name);
    out[n++] = clpar_module_child(clpar_module_child(blk, "attn"), "attn_dropout");
    out[n++] = clpar_module_child(clpar_module_child(blk, "attn"), "resid_dropout");
    out[n++] = clpar_module_child(clpar_module_child(blk, "mlp"), "dropout");
  }
  for (int i = 0; i < n; i++) assert_non_null(out[i]);
  return n;
}

/* One step of DDP with dropout and the same seed on every rank, on one process: each rank's
 * rows in turn from the same Dropout offsets, the loss divided by the ranks (the mean of the
 * ranks' gradients), then clipping and AdamW as tg_train. */
static void per_rank_reference(float dropout, int world, tg_run *r) {
  clpar_gpt_config c = tg_config(dropout);
  clpar_module *m, *d[16];
  clpar_manual_seed(7);
  tu_ok(clpar_gpt_create(&c, clpar_dist_device(), &m));
  int nd = dropouts(m, d), rows = TG_B / world;
  clpar_optimizer *o;
  clpar_adam_options ad = {.lr = TG_LR, .beta2 = 0.99f, .weight_decay = 0.1f};
  tu_ok(clpar_adamw_create_decay_groups(m, &ad, &o));
  for (int t = 0; t < TG_STEPS; t++) {
    uint64_t seed[16], off[16];
    for (int i = 0; i < nd; i++) tu_ok(clpar_dropout_get_state(d[i], &seed[i], &off[i]));
    tu_ok(clpar_optimizer_zero_grad(o));
    r->loss[t] = 0;
    for (int k = 0; k < world; k++) {
      clpar_scope *sc = clpar_scope_begin();
      for (int i = 0; i < nd; i++) tu_ok(clpar_dropout_set_state(d[i], seed[i], off[i]));
      clpar_tensor *x, *y, *out, *loss, *scaled;
      float l;
      tg_batch(clpar_dist_device(), k * rows, rows, &x, &y);
      tu_ok(clpar_module_forward(m, x, &out));
      tu_ok(tg_loss_fn(out, y, 0, NULL, &loss));
      tu_ok(clpar_scale(loss, 1.0f / (float)world, &scaled));
      tu_ok(clpar_backward(scaled));
      tu_ok(clpar_tensor_read(loss, &l, 1));
      r->loss[t] += l / (float)world;
      clpar_tensor_free(x);
      clpar_tensor_free(y);
      clpar_scope_end(sc);
    }
    tu_ok(clpar_clip_grad_norm_module(m, 1.0f, NULL));
    if (t == 0) tg_collect(m, r, r->grad1);
    if (t == TG_STEPS - 1) tg_collect(m, r, r->grad);
    tu_ok(clpar_optimizer_step(o));
  }
  tg_collect_params(m, r);
  clpar_optimizer_free(o);
  clpar_module_free(m);
}

static void test_dropout_masks_per_rank(void **state) {
  (void)state;
  tg_run ref = {0}, ddp = {0};
  per_rank_reference(0.2f, clpar_dist_world_size(), &ref);
  ddp_run(0.2f, 7, &ddp); /* the same seed on every rank */
  char what[64];
  snprintf(what, sizeof what, "rank %d: DDP, dropout 0.2", clpar_dist_rank());
  tg_expect_same(&ref, &ddp, tol, what);
  tg_free(&ref);
  tg_free(&ddp);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matches_one_device),
      cmocka_unit_test(test_dropout_masks_per_rank),
  };
  return cmocka_run_group_tests_name("ddp_gpt", tests, tu_dist_setup, tu_dist_teardown);
}
