/* bench_util.h — what the benchmarks share: a monotonic clock (now_seconds, the samples' one)
 * and a status check that says what failed on stderr (stdout carries only the JSON figures). */
#ifndef CLPAR_BENCH_UTIL_H
#define CLPAR_BENCH_UTIL_H

#include <clpar/clpar.h>
#include <stdio.h>
#include <stdlib.h>

#include "../samples/sample_clock.h" /* now_seconds */

static inline int bench_ok(clpar_status s, const char *what) {
  if (s != CLPAR_OK)
    fprintf(stderr, "%s: %s: %s\n", what, clpar_status_name(s), clpar_last_error());
  return s == CLPAR_OK;
}

/* layers Linear layers in -> hidden -> ... -> hidden -> out with a ReLU between each two, on
 * dev, from a fixed seed; NULL (the reason on stderr) on failure. */
static inline clpar_module *bench_mlp_layers(int layers, int64_t in, int64_t hidden, int64_t out,
                                             clpar_device *dev) {
  clpar_module **l = calloc((size_t)(2 * layers), sizeof *l), *m = NULL;
  int n = 0, good = l != NULL;
  clpar_manual_seed(3);
  for (int i = 0; good && i < layers; i++) {
    int64_t fan_in = i == 0 ? in : hidden, fan_out = i == layers - 1 ? out : hidden;
    good = bench_ok(clpar_linear_create(fan_in, fan_out, 1, dev, &l[n++]), "Linear");
    if (good && i < layers - 1) good = bench_ok(clpar_relu_create(&l[n++]), "ReLU");
  }
  if (good) bench_ok(clpar_sequential_create(l, n, &m), "Sequential");
  free(l);
  return m;
}

/* Linear(in, hidden) -> ReLU -> Linear(hidden, hidden) -> ReLU -> Linear(hidden, out). */
static inline clpar_module *bench_mlp(int64_t in, int64_t hidden, int64_t out, clpar_device *dev) {
  return bench_mlp_layers(3, in, hidden, out, dev);
}

/* A fixed batch: x [batch, in] in [-0.5, 0.5), labels cycling through the classes. */
static inline void bench_batch(float *x, int32_t *y, int64_t batch, int64_t in, int32_t classes) {
  for (int64_t i = 0; i < batch * in; i++) x[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
  for (int64_t i = 0; i < batch; i++) y[i] = (int32_t)(i % classes);
}

/* One training step of a classifier: upload the batch [batch, in] to dev, zero the
 * gradients, forward, cross-entropy, backward, optimizer step; nothing waits for the device.
 * Every temporary is released by a scope. Returns 1 on success. */
static inline int bench_train_step(clpar_module *model, clpar_optimizer *opt, clpar_device *dev,
                                   const float *x, const int32_t *y, int64_t batch, int64_t in) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *xt, *logits, *loss;
  int64_t shape[2] = {batch, in};
  int good = bench_ok(clpar_tensor_from_host(dev, 2, shape, x, &xt), "upload") &&
             bench_ok(clpar_optimizer_zero_grad(opt), "zero_grad") &&
             bench_ok(clpar_module_forward(model, xt, &logits), "forward") &&
             bench_ok(clpar_cross_entropy(logits, y, batch, CLPAR_REDUCTION_MEAN, &loss), "loss") &&
             bench_ok(clpar_backward(loss), "backward") &&
             bench_ok(clpar_optimizer_step(opt), "step");
  clpar_scope_end(scope);
  return good;
}

/* ResNet-50 inputs as bench_train_step --model resnet50 makes them: images [batch, 3, size,
 * size] in [-0.5, 0.5), one-hot targets [batch, classes] (class i % classes). */
static inline void bench_images(float *x, float *target, int64_t batch, int64_t size,
                                int64_t classes) {
  for (int64_t i = 0; i < batch * 3 * size * size; i++)
    x[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
  for (int64_t i = 0; i < batch * classes; i++) target[i] = 0;
  for (int64_t i = 0; i < batch; i++) target[i * classes + i % classes] = 1;
}

/* One training step on static inputs (capturable: nothing uploaded or read): zero the
 * gradients, forward, cross-entropy against the int32 targets y (mean, CLPAR_IGNORE_INDEX) or,
 * where mse is set, MSE against the float targets y (mean), backward, clipping to a global
 * norm of clip where clip > 0, optimizer step. *loss (freed first) holds the loss after, read
 * after the step; the logits are freed. */
static inline clpar_status bench_loss_step(clpar_module *m, clpar_optimizer *opt, clpar_tensor *x,
                                           clpar_tensor *y, float clip, int mse,
                                           clpar_tensor **loss) {
  clpar_tensor_free(*loss);
  *loss = NULL;
  clpar_tensor *logits = NULL;
  clpar_status s = clpar_optimizer_zero_grad(opt);
  if (s == CLPAR_OK) s = clpar_module_forward(m, x, &logits);
  if (s == CLPAR_OK && mse) s = clpar_mse_loss(logits, y, CLPAR_REDUCTION_MEAN, loss);
  if (s == CLPAR_OK && !mse)
    s = clpar_cross_entropy_targets(logits, y, CLPAR_IGNORE_INDEX, CLPAR_REDUCTION_MEAN, loss);
  if (s == CLPAR_OK) s = clpar_backward(*loss);
  if (s == CLPAR_OK && clip > 0) s = clpar_clip_grad_norm_module(m, clip, NULL);
  if (s == CLPAR_OK) s = clpar_optimizer_step(opt);
  clpar_tensor_free(logits);
  return s;
}

/* A captured-step bench's model, optimizer, static inputs (token ids or features, int32
 * targets or, with mse, float targets), last loss, its graph once captured, and
 * bench_loss_step's clip. */
typedef struct {
  clpar_module *m;
  clpar_optimizer *opt;
  clpar_tensor *x, *y, *loss;
  clpar_graph *graph;
  float clip;
  int mse;
} bench_step_run;

/* bench_loss_step on a bench_step_run (ctx), as clpar_step_fn. */
static inline clpar_status bench_step(void *ctx) {
  bench_step_run *r = ctx;
  return bench_loss_step(r->m, r->opt, r->x, r->y, r->clip, r->mse, &r->loss);
}

/* One step of r captured on devs[0 .. n) into r->graph. Returns 1 on success. */
static inline int bench_step_capture(bench_step_run *r, clpar_device **devs, int n) {
  clpar_status ran = CLPAR_OK;
  return bench_ok(clpar_graph_capture_begin(devs, n), "capture") && (ran = bench_step(r), 1) &&
         bench_ok(clpar_graph_capture_end(&r->graph), "capture") && bench_ok(ran, "captured step");
}

static inline void bench_step_run_free(bench_step_run *r) {
  clpar_graph_destroy(r->graph);
  clpar_tensor_free(r->loss);
  clpar_tensor_free(r->x);
  clpar_tensor_free(r->y);
  clpar_optimizer_free(r->opt);
  clpar_module_free(r->m);
}

#ifdef BENCH_HAVE_OPENCL
#include <CL/cl.h>
/* The cl_device_id behind "opencl:N" (for raw CLBlast calls on clpar's device): the backend
 * numbers devices across platforms in enumeration order, as this does. */
static inline cl_device_id bench_cl_device(int ordinal) {
  cl_platform_id plats[16];
  cl_uint np = 0;
  if (clGetPlatformIDs(16, plats, &np) != CL_SUCCESS) return NULL;
  for (cl_uint p = 0; p < np; p++) {
    cl_device_id devs[64];
    cl_uint nd = 0;
    if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 64, devs, &nd) != CL_SUCCESS) continue;
    if (ordinal < (int)nd) return devs[ordinal];
    ordinal -= (int)nd;
  }
  return NULL;
}
#endif

#endif
