/* test_graph.c — a training step captured and replayed (clpar/graph.h) against the same step
 * run eagerly: losses, parameters and buffers bit for bit over 100 steps (the learning rate
 * changed at step 40), for an MLP with SGD (momentum), Adam and AdamW, flat and not, the seeds'
 * ToyModel, a conv + BatchNorm block, ResNet's stem and a Bottleneck block (conv, BatchNorm,
 * ReLU, max pool, the residual), an MLP with Dropout, a first step captured, DataParallel and a
 * 1F1B pipeline over two devices; replays with BatchNorm posted back to back without waiting
 * for each other; and the refusals: a host read or upload inside the
 * capture, optimizer state made in it, a composed optimizer step, replay after clpar_module_to,
 * a re-flatten, a freed input or optimizer. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

#include "internal.h" /* clpar_compose_force */
#include "test_graph_util.h"

enum { STEPS = 100, LR_CHANGE = 40 };

typedef enum { MODEL_MLP, MODEL_TOY, MODEL_CONV, MODEL_DROPOUT, MODEL_RESBLOCK } model_kind;
typedef enum { OPT_SGD, OPT_ADAM, OPT_ADAMW, OPT_SGD_PLAIN } opt_kind;
/* How the replayed run starts: clpar_step_run (eager warm-up, capture, replays), or a capture
 * of the very first step (the optimizer's state made inside it), then replays. */
typedef enum { COMPILED, FIRST_CAPTURED, DATA_PARALLEL } start_kind;

typedef struct {
  clpar_device *dev;
  clpar_device *devs[2]; /* DataParallel's, when n_devs is 2 */
  int n_devs;
  tu_toy_devices toy;
  tgu_train t;
  int64_t xshape[4], yshape[2];
  int xdim;
  int host_read; /* reads the loss inside the step (refused at capture) */
  int pipe;      /* r->t.m is a pipeline: its train step, 1F1B */
} run;

static clpar_module *make_mlp(clpar_device *dev, float dropout) {
  clpar_module *c[6];
  int n = 0;
  tu_ok(clpar_linear_create(8, 16, 1, dev, &c[n++]));
  tu_ok(clpar_relu_create(&c[n++]));
  if (dropout > 0.0f) tu_ok(clpar_dropout_create(dropout, &c[n++]));
  tu_ok(clpar_linear_create(16, 16, 1, dev, &c[n++]));
  tu_ok(clpar_relu_create(&c[n++]));
  tu_ok(clpar_linear_create(16, 4, 1, dev, &c[n++]));
  clpar_module *m;
  tu_ok(clpar_sequential_create(c, n, &m));
  return m;
}

static clpar_module *make_conv(clpar_device *dev) {
  clpar_module *c[5];
  tu_ok(clpar_conv2d_create(3, 4, 3, 3, &(clpar_conv2d_options){.padding = {1, 1}}, 1, dev, &c[0]));
  tu_ok(clpar_batchnorm2d_create(4, NULL, dev, &c[1]));
  tu_ok(clpar_relu_create(&c[2]));
  tu_ok(clpar_flatten_create(1, -1, &c[3]));
  tu_ok(clpar_linear_create(4 * 5 * 5, 4, 1, dev, &c[4]));
  clpar_module *m;
  tu_ok(clpar_sequential_create(c, 5, &m));
  return m;
}

/* ResNet's stem (conv, BatchNorm, ReLU, max pool 3x3 stride 2) and a Bottleneck block whose
 * downsample (1x1 conv + BatchNorm) makes the residual, then a Linear: [b, 3, 5, 5] in. */
static clpar_module *make_resblock(clpar_device *dev) {
  clpar_module *c[7];
  int64_t k3[2] = {3, 3}, s2[2] = {2, 2}, p1[2] = {1, 1};
  tu_ok(clpar_conv2d_create(3, 4, 3, 3, &(clpar_conv2d_options){.padding = {1, 1}}, 0, dev, &c[0]));
  tu_ok(clpar_batchnorm2d_create(4, NULL, dev, &c[1]));
  tu_ok(clpar_relu_create(&c[2]));
  tu_ok(clpar_max_pool2d_create(k3, s2, p1, &c[3]));
  tu_ok(clpar_resnet_block_create(CLPAR_RESNET_BOTTLENECK, 4, 2, 1, dev, &c[4]));
  tu_ok(clpar_flatten_create(1, -1, &c[5]));
  tu_ok(clpar_linear_create(8 * 3 * 3, 4, 1, dev, &c[6]));
  clpar_module *m;
  tu_ok(clpar_sequential_create(c, 7, &m));
  return m;
}

/* The model and optimizer, made the same way for the eager and the replayed run. */
static void run_make(run *r, clpar_device *dev, model_kind kind, opt_kind ok, int flat) {
  memset(r, 0, sizeof *r);
  r->dev = dev;
  clpar_manual_seed(7);
  int64_t b = 6;
  r->xdim = 2;
  r->xshape[0] = r->yshape[0] = b;
  r->xshape[1] = 8;
  r->yshape[1] = 4;
  if (kind == MODEL_MLP || kind == MODEL_DROPOUT)
    r->t.m = make_mlp(dev, kind == MODEL_DROPOUT ? 0.5f : 0);
  if (kind == MODEL_TOY) {
    r->toy = (tu_toy_devices){dev, dev};
    r->t.m = tu_toy_create(&r->toy, 7);
    r->xshape[1] = 10;
    r->yshape[1] = 5;
  }
  if (kind == MODEL_CONV || kind == MODEL_RESBLOCK) {
    r->t.m = kind == MODEL_CONV ? make_conv(dev) : make_resblock(dev);
    r->xdim = 4;
    memcpy(r->xshape, (int64_t[]){b, 3, 5, 5}, sizeof r->xshape);
  }
  r->devs[0] = dev;
  r->n_devs = 1;
  if (flat) tu_ok(clpar_module_flatten(r->t.m));
  if (ok == OPT_SGD || ok == OPT_SGD_PLAIN)
    tu_ok(clpar_sgd_create_for(
        r->t.m, &(clpar_sgd_options){.lr = 0.05f, .momentum = ok == OPT_SGD ? 0.9f : 0.0f},
        &r->t.opt));
  else if (ok == OPT_ADAM)
    tu_ok(clpar_adam_create_for(r->t.m, &(clpar_adam_options){.lr = 0.01f}, &r->t.opt));
  else
    tu_ok(clpar_adamw_create_for(r->t.m, &(clpar_adam_options){.lr = 0.01f, .weight_decay = 0.05f},
                                 &r->t.opt));
  tu_ok(clpar_tensor_zeros(dev, r->xdim, r->xshape, &r->t.x));
  tu_ok(clpar_tensor_zeros(dev, 2, r->yshape, &r->t.y));
}

/* The step: zero_grad, forward, MSE, backward, optimizer step; the loss stays in r->t.loss. */
static clpar_status step(void *ctx) {
  run *r = ctx;
  clpar_scope *scope = tgu_step_begin(&r->t);
  clpar_status s;
  if (r->pipe) {
    s = clpar_optimizer_zero_grad(r->t.opt);
    if (s == CLPAR_OK)
      s = clpar_pipeline_train_step(r->t.m, r->t.x, r->t.y, tgu_mse, NULL, &r->t.loss);
  } else {
    s = tgu_forward_backward(&r->t, tgu_mse);
  }
  float v;
  if (s == CLPAR_OK && r->host_read) s = clpar_tensor_read(r->t.loss, &v, 1);
  if (s == CLPAR_OK) s = clpar_optimizer_step(r->t.opt);
  tgu_step_end(&r->t, scope);
  return s;
}

/* Step i's inputs, written into the static input tensors. */
static void write_inputs(run *r, int i) {
  size_t nx = (size_t)clpar_tensor_numel(r->t.x), ny = (size_t)clpar_tensor_numel(r->t.y);
  float *x = tu_rand(nx, 1000 + (uint64_t)i), *y = tu_rand(ny, 5000 + (uint64_t)i);
  tu_ok(clpar_tensor_write(r->t.x, x, nx));
  tu_ok(clpar_tensor_write(r->t.y, y, ny));
  free(x);
  free(y);
}

/* Trains STEPS steps, eagerly or through clpar_step_run, the learning rate scaled by 0.3 at
 * LR_CHANGE; the losses into losses. */
static void train(run *r, int compiled, start_kind start, float *losses) {
  clpar_step *st = NULL;
  clpar_graph *g = NULL;
  if (compiled && start == COMPILED) tu_ok(clpar_step_compile(step, r, r->devs, r->n_devs, &st));
  for (int i = 0; i < STEPS; i++) {
    if (i == LR_CHANGE)
      tu_ok(clpar_optimizer_set_lr(r->t.opt, 0, 0.3f * clpar_optimizer_lr(r->t.opt, 0)));
    write_inputs(r, i);
    if (!compiled) {
      tu_ok(step(r));
    } else if (start == COMPILED) {
      tu_ok(clpar_step_run(st));
    } else if (start == DATA_PARALLEL && i == 0) { /* warm-up */
      tu_ok(step(r));
    } else if (i == (start == DATA_PARALLEL)) {
      tu_ok(clpar_graph_capture_begin(r->devs, r->n_devs));
      clpar_status ran = step(r);
      tu_ok(clpar_graph_capture_end(&g));
      tu_ok(ran);
    } else {
      tu_ok(clpar_graph_replay(g));
    }
    tu_ok(clpar_tensor_read(r->t.loss, &losses[i], 1));
  }
  if (st) g = clpar_step_graph(st);
  if (compiled) {
    assert_non_null(g);
    assert_true(clpar_graph_command_count(g) > 0);
  }
  if (st)
    clpar_step_free(st);
  else
    clpar_graph_destroy(g);
}

/* The replayed run's losses and state equal the eager run's, bit for bit. */
static void expect_same_state(const run *eager, const run *replayed) {
  size_t ne, nr;
  float *pe = tgu_floats_of(eager->t.m, 1, &ne), *pr = tgu_floats_of(replayed->t.m, 1, &nr);
  assert_int_equal(ne, nr);
  tgu_expect_bits("state element", pe, pr, ne);
  free(pe);
  free(pr);
}

static void expect_same_runs(const run *eager, const run *replayed, const float *le,
                             const float *lr) {
  tgu_expect_bits("loss at step", le, lr, STEPS);
  expect_same_state(eager, replayed);
}

static void check_on(clpar_device *dev, model_kind kind, opt_kind ok, int flat, start_kind start) {
  run eager, replayed;
  float le[STEPS], lr[STEPS];
  run_make(&eager, dev, kind, ok, flat);
  train(&eager, 0, start, le);
  run_make(&replayed, dev, kind, ok, flat);
  train(&replayed, 1, start, lr);
  expect_same_runs(&eager, &replayed, le, lr);
  assert_true(le[STEPS - 1] != le[0]); /* it trained */
  tgu_train_free(&eager.t);
  tgu_train_free(&replayed.t);
}

/* On every selected device. */
static void check_replay_equals_eager(model_kind kind, opt_kind ok, int flat) {
  for (int d = 0; d < clpar_device_count(); d++)
    check_on(clpar_device_get(d), kind, ok, flat, COMPILED);
}

/* One replay-equals-eager case, its test's prestate. */
typedef struct {
  model_kind model;
  opt_kind opt;
  int flat;
} replay_case;

static void test_replay_case(void **state) {
  const replay_case *c = *state;
  check_replay_equals_eager(c->model, c->opt, c->flat);
}

/* The first step captured: the gradients are made inside the capture (the graph's pool) and
 * written anew by each replay, as eager steps accumulate them into zeros. */
static void test_first_step_captured(void **state) {
  (void)state;
  for (int d = 0; d < clpar_device_count(); d++)
    check_on(clpar_device_get(d), MODEL_MLP, OPT_SGD_PLAIN, 0, FIRST_CAPTURED);
}

/* Optimizer state made inside the capture (SGD's momentum buffer, Adam's moments, zeroed on
 * the first step) would be made again at each replay: refused. */
static void test_first_step_state_refused(void **state) {
  (void)state;
  for (int k = 0; k < 2; k++) {
    run r;
    run_make(&r, clpar_device_get(0), MODEL_MLP, k ? OPT_ADAM : OPT_SGD, k);
    write_inputs(&r, 0);
    tu_ok(clpar_graph_capture_begin(&r.dev, 1));
    clpar_status ran = step(&r);
    clpar_graph *g;
    assert_int_not_equal(clpar_graph_capture_end(&g), CLPAR_OK);
    assert_null(g);
    if (!strstr(clpar_last_error(), "first step")) fail_msg("%s", clpar_last_error());
    (void)ran;
    tu_ok(step(&r)); /* eager steps go on */
    tgu_train_free(&r.t);
  }
}

/* An optimizer step composed from primitives has no command whose learning rate can be
 * patched: refused at capture. */
static void test_composed_step_refused(void **state) {
  (void)state;
  run r;
  clpar_device *dev = clpar_device_get(0);
  run_make(&r, dev, MODEL_MLP, OPT_SGD, 0);
  write_inputs(&r, 0);
  tu_ok(step(&r));
  tu_ok(clpar_compose_force(dev, (uint64_t)1 << CLPAR_ENTRY_sgd_step));
  tu_ok(clpar_graph_capture_begin(&dev, 1));
  clpar_status ran = step(&r);
  clpar_graph *g;
  clpar_status s = clpar_graph_capture_end(&g);
  tu_ok(clpar_compose_force(dev, 0));
  assert_int_not_equal(ran, CLPAR_OK);
  assert_int_not_equal(s, CLPAR_OK);
  assert_null(g);
  if (!strstr(clpar_last_error(), "no sgd_step command")) fail_msg("%s", clpar_last_error());
  tgu_train_free(&r.t);
}

/* A captured run r (warm-up, capture): its graph, ready to replay. */
static clpar_graph *capture(run *r) {
  write_inputs(r, 0);
  tu_ok(step(r));
  clpar_graph *g = NULL;
  tu_ok(clpar_graph_capture_begin(&r->dev, 1));
  clpar_status ran = step(r);
  tu_ok(clpar_graph_capture_end(&g));
  tu_ok(ran);
  tu_ok(clpar_graph_replay(g));
  return g;
}

static void test_host_read_refused(void **state) {
  (void)state;
  run r;
  run_make(&r, clpar_device_get(0), MODEL_MLP, OPT_SGD, 0);
  write_inputs(&r, 0);
  tu_ok(step(&r));
  r.host_read = 1;
  tu_ok(clpar_graph_capture_begin(&r.dev, 1));
  clpar_status ran = step(&r);
  assert_int_not_equal(ran, CLPAR_OK);
  clpar_graph *g = (clpar_graph *)&r; /* must be set to NULL */
  clpar_status s = clpar_graph_capture_end(&g);
  assert_int_not_equal(s, CLPAR_OK);
  assert_null(g);
  const char *msg = clpar_last_error();
  if (!strstr(msg, "clpar_download") || !strstr(msg, "inside a capture"))
    fail_msg("message does not name the host read: %s", msg);
  r.host_read = 0; /* the device still works eagerly */
  tu_ok(step(&r));
  tgu_train_free(&r.t);
}

static void test_upload_refused(void **state) {
  (void)state;
  clpar_device *dev = clpar_device_get(0);
  clpar_tensor *t = NULL;
  float v[4] = {1, 2, 3, 4};
  tu_ok(clpar_graph_capture_begin(&dev, 1));
  assert_int_not_equal(clpar_tensor_from_host(dev, 1, (int64_t[]){4}, v, &t), CLPAR_OK);
  clpar_graph *g;
  assert_int_not_equal(clpar_graph_capture_end(&g), CLPAR_OK);
  if (!strstr(clpar_last_error(), "clpar_upload")) fail_msg("%s", clpar_last_error());
  assert_null(g);
  clpar_tensor_free(t);
}

/* g refuses to replay, naming what: its message holds what; g destroyed. */
static void expect_replay_refused(clpar_graph *g, const char *what) {
  assert_int_not_equal(clpar_graph_replay(g), CLPAR_OK);
  if (!strstr(clpar_last_error(), what)) fail_msg("%s", clpar_last_error());
  clpar_graph_destroy(g);
}

static void test_stale_after_flatten(void **state) {
  (void)state;
  run r;
  run_make(&r, clpar_device_get(0), MODEL_MLP, OPT_SGD, 1);
  clpar_graph *g = capture(&r);
  tu_ok(clpar_module_flatten(r.t.m));
  expect_replay_refused(g, "clpar_module_flatten");
  tu_ok(step(&r)); /* eager steps go on */
  tgu_train_free(&r.t);
}

static void test_stale_after_module_to(void **state) {
  (void)state;
  run r;
  clpar_device *dev = clpar_device_get(0);
  run_make(&r, dev, MODEL_MLP, OPT_ADAM, 0);
  clpar_graph *g = capture(&r);
  tu_ok(clpar_module_to(r.t.m, dev));
  expect_replay_refused(g, "clpar_module_to");
  tgu_train_free(&r.t);
}

/* An input freed (and its buffer free for others) after the capture: never replayed. */
static void test_stale_after_free(void **state) {
  (void)state;
  run r;
  run_make(&r, clpar_device_get(0), MODEL_MLP, OPT_SGD, 0);
  clpar_graph *g = capture(&r);
  clpar_tensor_free(r.t.loss); /* its autograd record holds the input too */
  r.t.loss = NULL;
  clpar_tensor_free(r.t.x);
  tu_ok(clpar_tensor_zeros(r.dev, r.xdim, r.xshape, &r.t.x));
  expect_replay_refused(g, "freed after the capture");
  tgu_train_free(&r.t);
}

/* The graph's patches point at the optimizer (and Dropout's at the module): freed, the graph
 * refuses to replay instead of reading freed memory. */
static void test_stale_after_optimizer_free(void **state) {
  (void)state;
  run r;
  run_make(&r, clpar_device_get(0), MODEL_DROPOUT, OPT_SGD, 0);
  clpar_graph *g = capture(&r);
  clpar_optimizer_free(r.t.opt);
  r.t.opt = NULL;
  expect_replay_refused(g, "clpar_optimizer_free");
  tgu_train_free(&r.t);
}

/* The pool: the capture's temporaries are reused within it, the graph's blocks never go to the
 * shared cache while it lives, and destroying it gives them back. */
static void test_pool(void **state) {
  (void)state;
  run r;
  clpar_device *dev = clpar_device_get(0);
  run_make(&r, dev, MODEL_MLP, OPT_SGD, 0);
  clpar_graph *g = capture(&r);
  clpar_memory_stats before, after;
  tu_ok(clpar_device_synchronize(dev));
  tu_ok(clpar_device_memory_stats(dev, &before));
  for (int i = 0; i < 5; i++) tu_ok(clpar_graph_replay(g));
  tu_ok(clpar_device_synchronize(dev));
  tu_ok(clpar_device_memory_stats(dev, &after));
  assert_int_equal(after.driver_allocs, before.driver_allocs); /* a replay allocates nothing */
  assert_int_equal(after.bytes_in_use, before.bytes_in_use);
  clpar_tensor *loss = r.t.loss; /* the graph's: freed, it goes back to the graph's pool */
  r.t.loss = NULL;
  clpar_tensor_free(loss);
  tu_ok(clpar_graph_replay(g));
  clpar_graph_destroy(g);
  tu_ok(step(&r)); /* eagerly again, with the pool's blocks back in the cache */
  tgu_train_free(&r.t);
}

static void test_device_twice_refused(void **state) {
  (void)state;
  clpar_device *devs[2] = {clpar_device_get(0), clpar_device_get(0)};
  assert_int_equal(clpar_graph_capture_begin(devs, 2), CLPAR_ERROR_INVALID_ARGUMENT);
  clpar_graph *g;
  assert_int_not_equal(clpar_graph_capture_end(&g), CLPAR_OK); /* none in progress */
}

/* DataParallel's step (scatter, replica copies, forward on both devices, gather, the reduce
 * of the replica's gradient) captured on its two devices: the copies between them go through
 * host memory the graph owns, their events made fresh at each replay. */
static void dp_make(run *r, clpar_device *d0, clpar_device *d1, opt_kind ok) {
  run_make(r, d0, MODEL_MLP, ok, 0);
  clpar_optimizer_free(r->t.opt);
  r->devs[1] = d1;
  r->n_devs = 2;
  clpar_module *dp;
  clpar_data_parallel_options o = {.devices = r->devs, .n_devices = 2};
  tu_ok(clpar_data_parallel_create(r->t.m, &o, &dp));
  r->t.m = dp;
  if (ok == OPT_SGD)
    tu_ok(clpar_sgd_create_for(r->t.m, &(clpar_sgd_options){.lr = 0.05f, .momentum = 0.9f},
                               &r->t.opt));
  else
    tu_ok(clpar_adam_create_for(r->t.m, &(clpar_adam_options){.lr = 0.01f}, &r->t.opt));
}

/* A pipeline of two stages on the two devices, 1F1B over 3 micro-batches (its train step). */
static void pipe_make(run *r, clpar_device *d0, clpar_device *d1, opt_kind ok) {
  memset(r, 0, sizeof *r);
  r->dev = d0;
  r->devs[0] = d0;
  r->devs[1] = d1;
  r->n_devs = 2;
  r->pipe = 1;
  r->xdim = 2;
  memcpy(r->xshape, (int64_t[]){6, 8}, 2 * sizeof(int64_t));
  memcpy(r->yshape, (int64_t[]){6, 4}, sizeof r->yshape);
  clpar_manual_seed(7);
  clpar_module *l[3], *stages[2];
  tu_ok(clpar_linear_create(8, 16, 1, d0, &l[0]));
  tu_ok(clpar_relu_create(&l[1]));
  tu_ok(clpar_sequential_create(l, 2, &stages[0]));
  tu_ok(clpar_linear_create(16, 4, 1, d0, &stages[1]));
  clpar_pipeline_options o = {.chunks = 3, .schedule = CLPAR_PIPELINE_1F1B};
  tu_ok(clpar_pipeline_create(stages, r->devs, 2, &o, &r->t.m));
  if (ok == OPT_SGD)
    tu_ok(clpar_sgd_create_for(r->t.m, &(clpar_sgd_options){.lr = 0.05f, .momentum = 0.9f},
                               &r->t.opt));
  else
    tu_ok(clpar_adam_create_for(r->t.m, &(clpar_adam_options){.lr = 0.01f}, &r->t.opt));
  tu_ok(clpar_tensor_zeros(d0, 2, r->xshape, &r->t.x));
  tu_ok(clpar_tensor_zeros(d1, 2, r->yshape, &r->t.y));
}

static void check_two_devices(void (*make)(run *, clpar_device *, clpar_device *, opt_kind)) {
  clpar_device *d0 = clpar_device_get(0), *d1 = tu_second_device(d0);
  if (!d1) skip();
  for (int k = 0; k < 2; k++) {
    run eager, replayed;
    float le[STEPS], lr[STEPS];
    make(&eager, d0, d1, k ? OPT_ADAM : OPT_SGD);
    train(&eager, 0, DATA_PARALLEL, le);
    make(&replayed, d0, d1, k ? OPT_ADAM : OPT_SGD);
    train(&replayed, 1, k ? DATA_PARALLEL : COMPILED, lr); /* both ways to capture */
    expect_same_runs(&eager, &replayed, le, lr);
    tgu_train_free(&eager.t);
    tgu_train_free(&replayed.t);
  }
}

static void test_data_parallel(void **state) {
  (void)state;
  check_two_devices(dp_make);
}

/* A copy to the second device of a product the first device takes long to make: each replay's
 * copy must wait for that replay's product (the events between the queues made fresh), so the
 * second device holds the new product after every replay, never the previous one. */
static void test_copy_waits_for_its_source(void **state) {
  (void)state;
  clpar_device *devs[2] = {clpar_device_get(0), tu_second_device(clpar_device_get(0))};
  if (!devs[1]) skip();
  enum { N = 384 };
  int64_t shape[2] = {N, N};
  clpar_tensor *a = tu_make(devs[0], 2, shape, 1), *w = tu_make(devs[0], 2, shape, 2);
  clpar_tensor *c = NULL, *c1 = NULL;
  tu_ok(clpar_graph_capture_begin(devs, 2));
  clpar_status s = clpar_matmul(a, w, 0, 0, &c);
  if (s == CLPAR_OK) s = clpar_tensor_to(c, devs[1], &c1);
  clpar_graph *g;
  tu_ok(clpar_graph_capture_end(&g));
  tu_ok(s);
  float *got = malloc(N * N * sizeof *got), *want = malloc(N * N * sizeof *want);
  assert_non_null(got);
  assert_non_null(want);
  for (int k = 0; k < 4; k++) {
    float *x = tu_rand(N * N, 10 + (uint64_t)k);
    tu_ok(clpar_tensor_write(a, x, N * N));
    free(x);
    tu_ok(clpar_graph_replay(g));
    tu_ok(clpar_tensor_read(c1, got, N * N));
    tu_ok(clpar_tensor_read(c, want, N * N));
    assert_memory_equal(got, want, N * N * sizeof *got);
  }
  free(got);
  free(want);
  clpar_tensor_free(c1);
  clpar_tensor_free(c);
  clpar_graph_destroy(g);
  clpar_tensor_free(a);
  clpar_tensor_free(w);
}

/* DataParallel's step captured on its first device only: its copies to the second are
 * refused, naming what. */
static void test_copy_out_of_capture_refused(void **state) {
  (void)state;
  clpar_device *d0 = clpar_device_get(0), *d1 = tu_second_device(d0);
  if (!d1) skip();
  run r;
  dp_make(&r, d0, d1, OPT_SGD);
  write_inputs(&r, 0);
  tu_ok(step(&r));
  tu_ok(clpar_graph_capture_begin(&d0, 1));
  clpar_status ran = step(&r);
  clpar_graph *g;
  assert_int_not_equal(clpar_graph_capture_end(&g), CLPAR_OK);
  assert_int_not_equal(ran, CLPAR_OK);
  assert_null(g);
  if (!strstr(clpar_last_error(), "one outside the capture")) fail_msg("%s", clpar_last_error());
  tu_ok(step(&r)); /* eager steps go on */
  tgu_train_free(&r.t);
}

static void test_pipeline_1f1b(void **state) {
  (void)state;
  check_two_devices(pipe_make);
}

/* Completes the event that holds a device's queue unless the test did first (*hold_state: 0
 * held, 1 released): on a build where a replay waits for the previous one, the test would
 * otherwise wait for ever. */
typedef struct {
  clpar_event *hold;
  int state;
} holder;

static void release_hold(holder *h) {
  if (__atomic_exchange_n(&h->state, 1, __ATOMIC_ACQ_REL) == 0)
    clpar_event_complete(h->hold, CLPAR_OK);
}

static void *watchdog(void *arg) {
  for (int i = 0; i < 200 && __atomic_load_n(&((holder *)arg)->state, __ATOMIC_ACQUIRE) == 0; i++)
    usleep(10000);
  release_hold(arg);
  return NULL;
}

/* The int64 buffers (num_batches_tracked) of m, in order, into out (room for max). */
static size_t counters_of(clpar_module *m, int64_t *out, size_t max) {
  size_t n = 0;
  for (int i = 0; i < clpar_module_buffer_count(m); i++) {
    clpar_tensor *t;
    tu_ok(clpar_module_buffer_at(m, i, NULL, &t));
    if (clpar_tensor_dtype(t) != CLPAR_INT64) continue;
    assert_true(n < max);
    tu_ok(clpar_tensor_read_raw(t, &out[n++], sizeof *out));
  }
  return n;
}

/* Replays of a step with BatchNorm2d posted back to back while the device's queue is held (it
 * waits for an event only the test completes): the host waits for none of them (each replay's
 * counters are written from memory of its own), and once they ran, parameters, running
 * statistics and num_batches_tracked equal as many eager steps bit for bit. */
static void test_batchnorm_replays_do_not_wait(void **state) {
  (void)state;
  enum { REPLAYS = 6 };
  for (int d = 0; d < clpar_device_count(); d++) {
    clpar_device *dev = clpar_device_get(d);
    run eager, replayed;
    run_make(&eager, dev, MODEL_RESBLOCK, OPT_SGD, 0);
    run_make(&replayed, dev, MODEL_RESBLOCK, OPT_SGD, 0);
    write_inputs(&eager, 0);
    write_inputs(&replayed, 0);
    for (int i = 0; i < REPLAYS + 2; i++) tu_ok(step(&eager));
    tu_ok(step(&replayed)); /* the optimizer's state, then the captured step */
    clpar_graph *g;
    tu_ok(clpar_graph_capture_begin(&dev, 1));
    clpar_status ran = step(&replayed);
    tu_ok(clpar_graph_capture_end(&g));
    tu_ok(ran);
    holder h = {clpar_event_new(NULL), 0};
    assert_non_null(h.hold);
    tu_ok(clpar_event_wait(dev, h.hold));
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, watchdog, &h), 0);
    uint64_t w0 = clpar_device_host_waits(dev);
    for (int i = 0; i < REPLAYS; i++) tu_ok(clpar_graph_replay(g));
    uint64_t waited = clpar_device_host_waits(dev) - w0;
    release_hold(&h);
    pthread_join(t, NULL);
    assert_int_equal(waited, 0);
    tu_ok(clpar_device_synchronize(dev));
    int64_t ce[8], cr[8];
    size_t nc = counters_of(eager.t.m, ce, 8);
    assert_int_equal(counters_of(replayed.t.m, cr, 8), nc);
    assert_int_equal(nc, 5);
    assert_memory_equal(ce, cr, nc * sizeof *ce);
    assert_int_equal(ce[0], REPLAYS + 2);
    float le, lr;
    tu_ok(clpar_tensor_read(eager.t.loss, &le, 1));
    tu_ok(clpar_tensor_read(replayed.t.loss, &lr, 1));
    tgu_expect_bits("loss", &le, &lr, 1);
    expect_same_state(&eager, &replayed);
    clpar_graph_destroy(g);
    tgu_train_free(&eager.t);
    tgu_train_free(&replayed.t);
  }
}

/* test_replay_case under the name of the case it runs. */
#define REPLAY_CASE(name, ...) TGU_CASE(name, test_replay_case, replay_case, __VA_ARGS__)

int main(void) {
  const struct CMUnitTest tests[] = {
      REPLAY_CASE(test_mlp_sgd, MODEL_MLP, OPT_SGD, 0),
      REPLAY_CASE(test_mlp_sgd_flat, MODEL_MLP, OPT_SGD, 1),
      REPLAY_CASE(test_mlp_adam, MODEL_MLP, OPT_ADAM, 0),
      REPLAY_CASE(test_mlp_adamw_flat, MODEL_MLP, OPT_ADAMW, 1),
      cmocka_unit_test(test_first_step_captured),
      cmocka_unit_test(test_first_step_state_refused),
      cmocka_unit_test(test_composed_step_refused),
      REPLAY_CASE(test_toy_model, MODEL_TOY, OPT_SGD, 0),
      REPLAY_CASE(test_conv_batchnorm, MODEL_CONV, OPT_ADAM, 0),
      REPLAY_CASE(test_dropout, MODEL_DROPOUT, OPT_SGD, 0),
      REPLAY_CASE(test_resnet_block, MODEL_RESBLOCK, OPT_SGD, 0),
      cmocka_unit_test(test_batchnorm_replays_do_not_wait),
      cmocka_unit_test(test_host_read_refused),
      cmocka_unit_test(test_upload_refused),
      cmocka_unit_test(test_stale_after_flatten),
      cmocka_unit_test(test_stale_after_module_to),
      cmocka_unit_test(test_stale_after_free),
      cmocka_unit_test(test_stale_after_optimizer_free),
      cmocka_unit_test(test_pool),
      cmocka_unit_test(test_device_twice_refused),
      cmocka_unit_test(test_data_parallel),
      cmocka_unit_test(test_pipeline_1f1b),
      cmocka_unit_test(test_copy_out_of_capture_refused),
      cmocka_unit_test(test_copy_waits_for_its_source),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
