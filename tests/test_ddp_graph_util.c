/* test_ddp_graph_util.c — see test_ddp_graph_util.h. */
#include "test_ddp_graph_util.h"

#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h" /* clpar_tensor_unscope, the device's replay counts */

void tdg_write_inputs(clpar_tensor *x, clpar_tensor *y, int i, int spread) {
  int rank = clpar_dist_rank();
  uint64_t seed = 1000 * (uint64_t)(rank + 1) + (uint64_t)i;
  size_t nx = (size_t)clpar_tensor_numel(x), ny = (size_t)clpar_tensor_numel(y);
  float *vx = tu_rand(nx, seed), *vy = tu_rand(ny, seed + 500);
  if (spread)
    for (size_t k = 0; k < nx; k++) vx[k] = vx[k] * (float)(rank + 1) + 0.5f;
  tu_ok(clpar_tensor_write(x, vx, (int64_t)nx));
  tu_ok(clpar_tensor_write(y, vy, (int64_t)ny));
  free(vx);
  free(vy);
}

void tdg_expect_same_on_every_rank(const char *what, const float *v, size_t n) {
  float *hi = malloc(2 * n * sizeof *hi);
  assert_non_null(hi);
  for (size_t i = 0; i < n; i++) hi[i] = v[i], hi[n + i] = -v[i];
  tu_ok(clpar_dist_all_reduce_max(hi, (int64_t)(2 * n)));
  for (size_t i = 0; i < n; i++)
    if (hi[i] != v[i] || hi[n + i] != -v[i])
      fail_msg("%s %zu differs across the ranks: %.9g here, in [%.9g, %.9g]", what, i, (double)v[i],
               (double)-hi[n + i], (double)hi[i]);
  free(hi);
}

clpar_status tdg_step(void *ctx) {
  tgu_train *t = ctx;
  clpar_scope *scope = tgu_step_begin(t);
  clpar_status s = tgu_forward_backward(t, tgu_mse);
  if (s == CLPAR_OK) s = clpar_optimizer_step(t->opt);
  tgu_step_end(t, scope);
  return s;
}

clpar_status tdg_accumulating_step(void *ctx) {
  tgu_train *t = ctx;
  clpar_scope *scope = tgu_step_begin(t);
  clpar_tensor *out = NULL, *first = NULL;
  clpar_status s = clpar_optimizer_zero_grad(t->opt);
  for (int k = 0; s == CLPAR_OK && k < 2; k++) {
    clpar_tensor **loss = k ? &t->loss : &first;
    s = clpar_ddp_set_sync(t->m, k == 1);
    if (s == CLPAR_OK) s = clpar_module_forward(t->m, t->x, &out);
    if (s == CLPAR_OK) s = clpar_mse_loss(out, t->y, CLPAR_REDUCTION_MEAN, loss);
    if (s == CLPAR_OK) s = clpar_backward(*loss);
  }
  if (s == CLPAR_OK) s = clpar_optimizer_step(t->opt);
  tgu_step_end(t, scope);
  return s;
}

void tdg_ddp_train(tgu_train *t, clpar_step_fn fn, const tdg_ddp_run *run, int compiled,
                   float *losses, tdg_replays *r) {
  clpar_device *dev = clpar_dist_device();
  clpar_step *st = NULL;
  if (compiled) tu_ok(clpar_step_compile(fn, t, &dev, 1, &st));
  clpar_ddp_stats before = {0}, after = {0};
  uint64_t waits = 0;
  for (int i = 0; i < run->steps; i++) {
    if (i == run->lr_change)
      tu_ok(clpar_optimizer_set_lr(t->opt, 0, 0.3f * clpar_optimizer_lr(t->opt, 0)));
    tdg_write_inputs(t->x, t->y, i, run->spread);
    if (!compiled) {
      tu_ok(fn(t));
    } else {
      if (i == 2) tu_ok(clpar_ddp_stats_get(t->m, &before));
      uint64_t w0 = clpar_device_host_waits(dev);
      tu_ok(clpar_step_run(st));
      if (i >= 2) waits += clpar_device_host_waits(dev) - w0;
    }
    tu_ok(clpar_tensor_read(t->loss, &losses[i], 1));
  }
  if (compiled) {
    tu_ok(clpar_ddp_synchronize(t->m));
    tu_ok(clpar_ddp_stats_get(t->m, &after));
    assert_non_null(clpar_step_graph(st));
    assert_true(after.buckets >= 3);
    r->waits = waits;
    r->reductions = after.reductions - before.reductions;
    r->backward_waited = after.wait_seconds != before.wait_seconds;
    clpar_step_free(st);
  }
}

void tdg_expect_refused(clpar_status s, const char *want, const char *want2) {
  clpar_graph *g = NULL;
  clpar_status e = clpar_graph_capture_end(&g);
  assert_int_equal(s, CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(e, CLPAR_ERROR_INVALID_ARGUMENT);
  assert_null(g);
  const char *msg = clpar_last_error();
  if (!strstr(msg, want)) fail_msg("expected \"%s\" in \"%s\"", want, msg);
  if (want2 && !strstr(msg, want2)) fail_msg("expected \"%s\" in \"%s\"", want2, msg);
}

void tdg_ddp_expect_equal_runs(tgu_train *eager, tgu_train *replayed, clpar_step_fn fn,
                               const tdg_ddp_run *run, int buffers, const char *what,
                               tdg_replays *r) {
  size_t steps = (size_t)run->steps, ne, nr;
  float *le = calloc(steps, sizeof *le), *lr = calloc(steps, sizeof *lr);
  assert_true(le && lr);
  tdg_ddp_train(eager, fn, run, 0, le, NULL);
  tdg_ddp_train(replayed, fn, run, 1, lr, r);
  tgu_expect_bits("loss at step", le, lr, steps);
  float *pe = tgu_floats_of(eager->m, buffers, &ne), *pr = tgu_floats_of(replayed->m, buffers, &nr);
  assert_int_equal(ne, nr);
  tgu_expect_bits(what, pe, pr, ne);
  assert_true(le[steps - 1] != le[0]); /* it trained */
  free(pe);
  free(pr);
  free(le);
  free(lr);
}

void tdg_expect_forward_refused(clpar_module *ddp, int64_t rows, int64_t in, const char *want) {
  clpar_device *dev = clpar_dist_device();
  clpar_tensor *x, *out = NULL;
  tu_ok(clpar_tensor_zeros(dev, 2, (int64_t[]){rows, in}, &x));
  tu_ok(clpar_graph_capture_begin(&dev, 1));
  tdg_expect_refused(clpar_module_forward(ddp, x, &out), "DistributedDataParallel's forward", want);
  clpar_tensor_free(out);
  clpar_tensor_free(x);
  clpar_module_free(ddp);
}

/* ---- ZeRO ---- */

void tdg_zero_make(tdg_zero_train *t, const tdg_zero_model *md, int stage, tdg_opt ok) {
  memset(t, 0, sizeof *t);
  t->stage = stage;
  t->m = md->make_ddp(stage);
  if (ok == TDG_SGD)
    tu_ok(
        clpar_zero_sgd_create(t->m, &(clpar_sgd_options){.lr = 0.05f, .momentum = 0.9f}, &t->opt));
  else
    tu_ok(clpar_zero_adam_create(t->m, &(clpar_adam_options){.lr = 0.01f}, &t->opt));
  clpar_device *dev = clpar_dist_device();
  tu_ok(clpar_tensor_zeros(dev, 2, (int64_t[]){md->rows, md->in}, &t->x));
  tu_ok(clpar_tensor_zeros(dev, 2, (int64_t[]){md->rows, md->out}, &t->y));
}

void tdg_zero_free(tdg_zero_train *t) {
  clpar_tensor_free(t->loss);
  clpar_tensor_free(t->x);
  clpar_tensor_free(t->y);
  clpar_zero_optimizer_free(t->opt);
  clpar_module_free(t->m);
}

clpar_status tdg_zero_step(void *ctx) {
  tdg_zero_train *t = ctx;
  clpar_tensor_free(t->loss);
  t->loss = NULL;
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *out = NULL;
  clpar_status s = t->zero_grad_late ? CLPAR_OK : clpar_zero_optimizer_zero_grad(t->opt);
  if (s == CLPAR_OK) s = clpar_module_forward(t->m, t->x, &out);
  if (s == CLPAR_OK) s = clpar_mse_loss(out, t->y, CLPAR_REDUCTION_MEAN, &t->loss);
  if (s == CLPAR_OK) s = clpar_backward(t->loss);
  if (s == CLPAR_OK && t->zero_grad_late) s = clpar_zero_optimizer_zero_grad(t->opt);
  if (s == CLPAR_OK) s = clpar_zero_optimizer_step(t->opt);
  if (t->loss) clpar_tensor_unscope(t->loss);
  clpar_scope_end(scope);
  return s;
}

float *tdg_zero_params(tdg_zero_train *t, size_t *n) {
  if (t->stage == 3) tu_ok(clpar_zero_gather_parameters(t->m));
  float *p = tgu_floats_of(t->m, 0, n);
  if (t->stage == 3) tu_ok(clpar_zero_release_parameters(t->m));
  return p;
}

void tdg_zero_train_run(tdg_zero_train *t, int steps, int lr_change, int spread, int compiled,
                        float *losses) {
  clpar_device *dev = clpar_dist_device();
  clpar_step *st = NULL;
  if (compiled) tu_ok(clpar_step_compile(tdg_zero_step, t, &dev, 1, &st));
  for (int i = 0; i < steps; i++) {
    if (i == lr_change) {
      clpar_optimizer *inner = clpar_zero_optimizer_inner(t->opt);
      assert_non_null(inner);
      tu_ok(clpar_optimizer_set_lr(inner, 0, 0.3f * clpar_optimizer_lr(inner, 0)));
    }
    tdg_write_inputs(t->x, t->y, i, spread);
    tu_ok(compiled ? clpar_step_run(st) : tdg_zero_step(t));
    tu_ok(clpar_tensor_read(t->loss, &losses[i], 1));
  }
  if (compiled) {
    assert_non_null(clpar_step_graph(st)); /* the steps after the first two were replays */
    clpar_step_free(st);
  }
}

/* md's steps on t (tdg_zero_train_run, inputs not spread). */
static void zero_train(tdg_zero_train *t, const tdg_zero_model *md, int compiled, float *losses) {
  tdg_zero_train_run(t, md->steps, md->lr_change, 0, compiled, losses);
}

clpar_module *tdg_bn_net(void) {
  clpar_device *dev = clpar_dist_device();
  clpar_module *c[6], *m;
  clpar_manual_seed(7);
  clpar_conv2d_options pad = {.padding = {1, 1}};
  tu_ok(clpar_conv2d_create(TDG_BN_C, TDG_BN_FEAT, 3, 3, &pad, 0, dev, &c[0]));
  tu_ok(clpar_batchnorm2d_create(TDG_BN_FEAT, NULL, dev, &c[1]));
  tu_ok(clpar_relu_create(&c[2]));
  tu_ok(clpar_resnet_block_create(CLPAR_RESNET_BASIC, TDG_BN_FEAT, TDG_BN_FEAT, 1, dev, &c[3]));
  tu_ok(clpar_flatten_create(1, -1, &c[4]));
  tu_ok(clpar_linear_create(TDG_BN_FEAT * TDG_BN_HW * TDG_BN_HW, TDG_BN_OUT, 1, dev, &c[5]));
  tu_ok(clpar_sequential_create(c, 6, &m));
  return m;
}

/* m's int64 buffers (num_batches_tracked), concatenated into out[0 .. *n), at most cap. */
static void counters_of(clpar_module *m, int64_t *out, int cap, int *n) {
  *n = 0;
  for (int i = 0; i < clpar_module_buffer_count(m); i++) {
    clpar_tensor *t;
    tu_ok(clpar_module_buffer_at(m, i, NULL, &t));
    if (clpar_tensor_dtype(t) != CLPAR_INT64) continue;
    assert_true(*n < cap);
    tu_ok(clpar_tensor_read_raw(t, &out[(*n)++], sizeof *out));
  }
}

int64_t tdg_bn_counters_alike(clpar_module *eager, clpar_module *replayed) {
  int64_t ce[8], cr[8];
  int nce, ncr;
  counters_of(eager, ce, 8, &nce);
  counters_of(replayed, cr, 8, &ncr);
  assert_int_equal(nce, 3);
  assert_int_equal(ncr, 3);
  for (int k = 0; k < 3; k++) {
    assert_int_equal(ce[k], ce[0]);
    assert_int_equal(cr[k], ce[k]);
  }
  return ce[0];
}

void tdg_zero_check_replay_equals_eager(const tdg_zero_model *md, int stage, tdg_opt ok) {
  tdg_zero_train eager, replayed;
  float *le = calloc((size_t)md->steps, sizeof *le), *lr = calloc((size_t)md->steps, sizeof *lr);
  assert_true(le && lr);
  tdg_zero_make(&eager, md, stage, ok);
  zero_train(&eager, md, 0, le);
  tdg_zero_make(&replayed, md, stage, ok);
  zero_train(&replayed, md, 1, lr);
  tgu_expect_bits("loss at step", le, lr, (size_t)md->steps);
  size_t ne, nr;
  float *pe = tdg_zero_params(&eager, &ne), *pr = tdg_zero_params(&replayed, &nr);
  assert_int_equal(ne, md->numel);
  assert_int_equal(nr, md->numel);
  tgu_expect_bits("parameter element", pe, pr, ne);
  assert_true(le[md->steps - 1] != le[0]);            /* it trained */
  tdg_expect_same_on_every_rank("parameter", pr, nr); /* every rank's shards were gathered */
  free(le);
  free(lr);
  free(pe);
  free(pr);
  tdg_zero_free(&eager);
  tdg_zero_free(&replayed);
}

void tdg_zero_test_replay_equals_eager(void **state) {
  const tdg_zero_case *c = *state;
  tdg_zero_check_replay_equals_eager(c->md, c->stage, c->opt);
}

void tdg_expect_eager_without_drain(clpar_step_fn fn, void *ctx) {
  clpar_device *dev = clpar_dist_device();
  while (__atomic_load_n(&dev->replays, __ATOMIC_ACQUIRE) != 0) sched_yield();
  uint64_t drains = __atomic_load_n(&dev->replay_drains, __ATOMIC_ACQUIRE);
  tu_ok(fn(ctx));
  assert_int_equal(__atomic_load_n(&dev->replay_drains, __ATOMIC_ACQUIRE), drains);
}

void tdg_zero_eager_after_replays_then_stale(const tdg_zero_model *md, int stage,
                                             const char *stale_want, float *le, float *lm) {
  tdg_zero_train eager, mixed;
  clpar_device *dev = clpar_dist_device();
  tdg_zero_make(&eager, md, stage, TDG_ADAM);
  tdg_zero_make(&mixed, md, stage, TDG_ADAM);
  tdg_write_inputs(eager.x, eager.y, 0, 0);
  tdg_write_inputs(mixed.x, mixed.y, 0, 0);
  for (int i = 0; i < 6; i++) tu_ok(tdg_zero_step(&eager));
  tu_ok(clpar_tensor_read(eager.loss, le, 1));
  tu_ok(tdg_zero_step(&mixed)); /* the warm-up: Adam's state */
  clpar_graph *g = NULL;
  tu_ok(clpar_graph_capture_begin(&dev, 1));
  clpar_status s = tdg_zero_step(&mixed);
  tu_ok(clpar_graph_capture_end(&g));
  tu_ok(s);
  for (int i = 0; i < 3; i++) tu_ok(clpar_graph_replay(g));
  tu_ok(tdg_zero_step(&mixed));
  tu_ok(clpar_tensor_read(mixed.loss, lm, 1));
  tdg_expect_eager_without_drain(tdg_zero_step, &mixed);
  tu_ok(tdg_zero_step(&eager));
  size_t ne, nm;
  float *pe = tdg_zero_params(&eager, &ne), *pm = tdg_zero_params(&mixed, &nm);
  assert_int_equal(ne, nm);
  tgu_expect_bits("parameter element", pe, pm, ne);
  free(pe);
  free(pm);
  clpar_zero_optimizer_free(mixed.opt);
  mixed.opt = NULL;
  assert_int_not_equal(clpar_graph_replay(g), CLPAR_OK);
  if (!strstr(clpar_last_error(), stale_want))
    fail_msg("expected the freeing of the %s in \"%s\"", stale_want, clpar_last_error());
  clpar_graph_destroy(g);
  tdg_zero_free(&eager);
  tdg_zero_free(&mixed);
}

/* ---- the timeout scenario ---- */

static void timeout_die(const char *what) {
  fprintf(stderr, "FAIL rank %d: %s: %s\n", clpar_dist_rank(), what, clpar_last_error());
  _exit(2);
}

/* Sleeps a minute: long past CLPAR_DIST_TIMEOUT, so the job ends first. */
static void sleep_a_minute(void) {
  for (int i = 0; i < 600; i++) nanosleep(&(struct timespec){0, 100000000}, NULL);
}

void tdg_timeout_init(void) {
  if (clpar_dist_init() != CLPAR_OK) timeout_die("clpar_dist_init");
}

int tdg_timeout_run(clpar_step_fn fn, void *ctx, clpar_tensor *const *loss, int stopper) {
  clpar_device *dev = clpar_dist_device();
  clpar_step *st;
  if (clpar_step_compile(fn, ctx, &dev, 1, &st) != CLPAR_OK) timeout_die("compile");
  float v;
  int rank = clpar_dist_rank();
  for (int i = 0; i < 4; i++) /* warm-up, capture, two replays on every rank */
    if (clpar_step_run(st) != CLPAR_OK || clpar_tensor_read(*loss, &v, 1) != CLPAR_OK)
      timeout_die("a step every rank runs");
  fprintf(stderr, "rank %d: 4 steps done\n", rank);
  if (rank == stopper) { /* stops replaying: in no collective until the job ends */
    sleep_a_minute();
    fprintf(stderr, "FAIL rank %d: nobody ended the job\n", rank);
    _exit(5);
  }
  clpar_status s = clpar_step_run(st);
  if (s == CLPAR_OK) s = clpar_tensor_read(*loss, &v, 1);
  printf("RESULT rank %d: %s: %s\n", rank, clpar_status_name(s), s ? clpar_last_error() : "");
  fflush(stdout);
  /* the lowest replaying rank ends the job once every other replaying rank printed (they
   * message it) */
  int world = clpar_dist_world_size(), one = 1, first = stopper == 0 ? 1 : 0;
  if (rank != first) {
    MPI_Send(&one, 1, MPI_INT, first, 77, MPI_COMM_WORLD);
    sleep_a_minute();
    _exit(6);
  }
  for (int r = first + 1; r < world; r++)
    if (r != stopper) MPI_Recv(&one, 1, MPI_INT, r, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  clpar_dist_abort(3);
  return 4; /* only if MPI could not abort */
}
