/* test_util.c — shared helpers of the cmocka tests (see test_util.h). */
#include "test_util.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

int tu_setup(void **state) {
  (void)state;
  clpar_status s = clpar_init();
  if (s != CLPAR_OK) {
    fprintf(stderr, "clpar_init: %s: %s\n", clpar_status_name(s), clpar_last_error());
    return -1;
  }
  return 0;
}

int tu_teardown(void **state) {
  (void)state;
  clpar_shutdown();
  return 0;
}

clpar_device *tu_host(void) {
  clpar_device *d = clpar_device_host();
  assert_non_null(d);
  return d;
}

clpar_device *tu_non_host(void) {
  for (int d = 0; d < clpar_device_count(); d++)
    if (clpar_device_get(d) != tu_host()) return clpar_device_get(d);
  return NULL;
}

clpar_device *tu_second_device(const clpar_device *first) {
  for (int i = 0; i < clpar_device_count(); i++)
    if (clpar_device_get(i) != first) return clpar_device_get(i);
  if (first != tu_host()) return tu_host();
  for (int i = 0; i < clpar_device_probed_count(); i++) {
    clpar_device *d = clpar_device_probed(i);
    if (d == first) continue;
    static int said;
    if (!said++)
      fprintf(stderr, "note: only %s is selected; %s (not selected) is the second device\n",
              clpar_device_id(first), clpar_device_id(d));
    return d;
  }
  return NULL;
}

float *tu_rand(size_t n, uint64_t seed) {
  float *p = malloc(n * sizeof *p);
  assert_non_null(p);
  for (size_t i = 0; i < n; i++) p[i] = 2.0f * clpar_rng_uniform01(seed, i) - 1.0f;
  return p;
}

void tu_assert_close_(const float *a, const float *b, size_t n, float rtol, float atol,
                      const char *what, const char *file, int line) {
  for (size_t i = 0; i < n; i++) {
    float d = fabsf(a[i] - b[i]);
    if (!(d <= atol + rtol * fabsf(b[i]))) {
      fail_msg("%s:%d: %s: element %zu is %.9g, expected %.9g (diff %.3g)", file, line, what, i,
               (double)a[i], (double)b[i], (double)d);
    }
  }
}

float *tu_read(const clpar_tensor *t) {
  size_t n = (size_t)clpar_tensor_numel(t);
  float *p = malloc(n * sizeof *p);
  assert_non_null(p);
  tu_ok(clpar_tensor_read(t, p, n));
  return p;
}

clpar_tensor *tu_make(clpar_device *dev, int ndim, const int64_t *shape, uint64_t seed) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  float *h = tu_rand((size_t)n, seed);
  clpar_tensor *t = NULL;
  tu_ok(clpar_tensor_from_host(dev, ndim, shape, h, &t));
  free(h);
  return t;
}

void tu_expect_equal(const clpar_tensor *t, const clpar_tensor *ref, float rtol, float atol,
                     const char *what) {
  assert_int_equal(clpar_tensor_ndim(t), clpar_tensor_ndim(ref));
  for (int i = 0; i < clpar_tensor_ndim(t); i++)
    assert_int_equal(clpar_tensor_dim(t, i), clpar_tensor_dim(ref, i));
  float *a = tu_read(t), *b = tu_read(ref);
  tu_assert_close(a, b, (size_t)clpar_tensor_numel(t), rtol, atol, what);
  free(a);
  free(b);
}

void tu_remove_dir(const char *path) {
  DIR *dir = opendir(path);
  if (dir) {
    char entry[512];
    for (struct dirent *e; (e = readdir(dir));) {
      if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
      snprintf(entry, sizeof entry, "%s/%s", path, e->d_name);
      unlink(entry);
    }
    closedir(dir);
  }
  rmdir(path);
}

static clpar_status toy_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **out,
                                void *user) {
  const tu_toy_devices *d = user;
  clpar_tensor *h;
  clpar_status s = CLPAR_OK;
  if (clpar_tensor_device(x) != d->dev0) s = clpar_tensor_to(x, d->dev0, &x);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(self, "net1"), x, &h);
  if (s == CLPAR_OK) s = clpar_relu(h, &h);
  if (s == CLPAR_OK && d->dev1 != d->dev0) s = clpar_tensor_to(h, d->dev1, &h);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(self, "net2"), h, out);
  return s;
}

float tu_parity_value(int k, int a, int b) {
  return (float)((double)((k * a) % b) / b - 0.5);
}

clpar_module *tu_parity_mlp(clpar_device *dev) {
  clpar_module *layers[3], *mlp;
  tu_ok(clpar_linear_create(4, 3, 1, dev, &layers[0]));
  tu_ok(clpar_relu_create(&layers[1]));
  tu_ok(clpar_linear_create(3, 2, 1, dev, &layers[2]));
  tu_ok(clpar_sequential_create(layers, 3, &mlp));
  float w1[12], b1[3], w2[6], b2[2];
  for (int i = 0; i < 12; i++) w1[i] = tu_parity_value(i + 1, 7, 11);
  for (int i = 0; i < 3; i++) b1[i] = tu_parity_value(i + 1, 5, 13);
  for (int i = 0; i < 6; i++) w2[i] = tu_parity_value(i + 1, 3, 7);
  for (int i = 0; i < 2; i++) b2[i] = tu_parity_value(i + 1, 4, 9);
  const float *init[4] = {w1, b1, w2, b2};
  static const char *names[4] = {"0.weight", "0.bias", "2.weight", "2.bias"};
  assert_int_equal(clpar_module_parameter_count(mlp), 4);
  for (int i = 0; i < 4; i++) {
    const char *name;
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(mlp, i, &name, &p));
    assert_string_equal(name, names[i]);
    tu_ok(clpar_tensor_write(p, init[i], (size_t)clpar_tensor_numel(p)));
  }
  return mlp;
}

clpar_module *tu_toy_create(tu_toy_devices *d, uint64_t seed) {
  clpar_module *m, *net1, *net2;
  clpar_manual_seed(seed);
  tu_ok(clpar_module_create("ToyModel", toy_forward, d, NULL, &m));
  tu_ok(clpar_linear_create(10, 10, 1, d->dev0, &net1));
  tu_ok(clpar_module_add_child(m, "net1", net1));
  tu_ok(clpar_linear_create(10, 5, 1, d->dev1, &net2));
  tu_ok(clpar_module_add_child(m, "net2", net2));
  return m;
}

void tu_toy_train(tu_toy_devices *d, uint64_t seed, const clpar_sgd_options *sgd, int steps,
                  float *losses, float *weights) {
  clpar_module *m = tu_toy_create(d, seed);
  static const char *names[] = {"net1.weight", "net1.bias", "net2.weight", "net2.bias"};
  assert_int_equal(clpar_module_parameter_count(m), 4);
  for (int i = 0; i < 4; i++) {
    const char *name;
    tu_ok(clpar_module_parameter_at(m, i, &name, NULL));
    assert_string_equal(name, names[i]);
  }
  clpar_optimizer *opt;
  tu_ok(clpar_sgd_create_for(m, sgd, &opt));
  for (int step = 0; step < steps; step++) {
    clpar_scope *sc = clpar_scope_begin();
    clpar_tensor *x, *labels, *y, *loss;
    tu_ok(
        clpar_tensor_rand_normal(d->dev0, 2, (int64_t[]){20, 10}, 100 + (uint64_t)step, 0, 1, &x));
    tu_ok(clpar_tensor_rand_normal(d->dev1, 2, (int64_t[]){20, 5}, 200 + (uint64_t)step, 0, 1,
                                   &labels));
    tu_ok(clpar_optimizer_zero_grad(opt));
    tu_ok(clpar_module_forward(m, x, &y));
    assert_ptr_equal(clpar_tensor_device(y), d->dev1); /* labels go where the output is */
    tu_ok(clpar_mse_loss(y, labels, CLPAR_REDUCTION_MEAN, &loss));
    tu_ok(clpar_backward(loss));
    tu_ok(clpar_optimizer_step(opt));
    if (losses) tu_ok(clpar_tensor_read(loss, &losses[step], 1));
    clpar_scope_end(sc);
  }
  size_t at = 0;
  for (int i = 0; i < 4; i++) {
    clpar_tensor *p;
    tu_ok(clpar_module_parameter_at(m, i, NULL, &p));
    tu_ok(clpar_tensor_read(p, weights + at, 165 - at));
    at += (size_t)clpar_tensor_numel(p);
  }
  assert_int_equal(at, 165);
  clpar_optimizer_free(opt);
  clpar_module_free(m);
}

uint64_t tu_backward_peak(clpar_device *dev, clpar_tensor *loss) {
  tu_ok(clpar_device_synchronize(dev));
  uint64_t before = clpar_memory_in_use(dev, CLPAR_MEM_TOTAL);
  tu_ok(clpar_memory_mark(dev));
  tu_ok(clpar_backward(loss));
  tu_ok(clpar_device_synchronize(dev));
  return clpar_memory_peak(dev, CLPAR_MEM_TOTAL) - before;
}

int tu_dist_setup(void **state) {
  (void)state;
  clpar_status s = clpar_dist_init();
  if (s != CLPAR_OK) {
    fprintf(stderr, "clpar_dist_init: %s: %s\n", clpar_status_name(s), clpar_last_error());
    return -1;
  }
  return 0;
}

int tu_dist_teardown(void **state) {
  (void)state;
  clpar_dist_finalize();
  return 0;
}

char *tu_slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  assert_true(n >= 0);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  buf[n] = 0;
  *len = (size_t)n;
  return buf;
}

/* ---- models and steps the data-parallel and checkpoint tests share ---- */

clpar_module *tu_mlp(clpar_device *dev, uint64_t seed, int n, const int64_t *widths) {
  clpar_module *layers[2 * TU_MLP_MAX_LAYERS], *mlp;
  int k = 0;
  assert_true(n >= 2 && n <= TU_MLP_MAX_LAYERS + 1);
  clpar_manual_seed(seed);
  for (int i = 0; i + 1 < n; i++) {
    if (i) tu_ok(clpar_relu_create(&layers[k++]));
    tu_ok(clpar_linear_create(widths[i], widths[i + 1], 1, dev, &layers[k++]));
  }
  tu_ok(clpar_sequential_create(layers, k, &mlp));
  return mlp;
}

void tu_wave_batch(int k, float *x, int nx, float *y, int ny) {
  for (int i = 0; i < nx; i++) x[i] = sinf(0.37f * (float)(i + 101 * k));
  for (int i = 0; i < ny; i++) y[i] = cosf(0.23f * (float)(i + 53 * k));
}

void tu_mse_backward(clpar_module *m, clpar_device *dev, const float *x, const float *y, int row0,
                     int rows, int in, int out, float *loss) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *xt, *yt, *pred, *l;
  tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){rows, in}, x + (size_t)row0 * in, &xt));
  tu_ok(clpar_module_forward(m, xt, &pred));
  tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){rows, out}, y + (size_t)row0 * out, &yt));
  tu_ok(clpar_mse_loss(pred, yt, CLPAR_REDUCTION_MEAN, &l));
  tu_ok(clpar_backward(l));
  if (loss) tu_ok(clpar_tensor_read_raw(l, loss, sizeof *loss));
  clpar_scope_end(scope);
}

void tu_rank_mse_backward(clpar_module *m, clpar_device *dev, const float *x, const float *y,
                          int batch, int in, int out, float *loss) {
  int rank = clpar_dist_rank(), world = clpar_dist_world_size();
  if (rank < 0 || world < 1) rank = 0, world = 1;
  int rows = batch / world;
  tu_mse_backward(m, dev, x, y, rank * rows, rows, in, out, loss);
}

void tu_rank_mse_backward_rand(clpar_module *m, int k, int batch, int in, int out) {
  float *x = tu_rand((size_t)(batch * in), 11 + (uint64_t)k);
  float *y = tu_rand((size_t)(batch * out), 41 + (uint64_t)k);
  tu_rank_mse_backward(m, clpar_dist_device(), x, y, batch, in, out, NULL);
  free(x), free(y);
}

float *tu_read_params(clpar_module *m, size_t n) {
  float *all = malloc(n * sizeof(float));
  assert_non_null(all);
  size_t at = 0;
  for (int i = 0; i < clpar_module_parameter_count(m); i++) {
    clpar_tensor *t;
    tu_ok(clpar_module_parameter_at(m, i, NULL, &t));
    size_t k = (size_t)clpar_tensor_numel(t);
    assert_true(at + k <= n);
    tu_ok(clpar_tensor_read(t, all + at, k));
    at += k;
  }
  assert_int_equal(at, n);
  return all;
}

int tu_zero_train_tiny(int stage, const clpar_adam_options *adam, int steps, float p[3]) {
  clpar_ddp_options o = {.zero_stage = stage};
  clpar_module *lin, *ddp;
  clpar_device *dev = clpar_dist_device();
  clpar_manual_seed(5);
  tu_ok(clpar_linear_create(2, 1, 1, dev, &lin));
  tu_ok(clpar_ddp_create(lin, &o, &ddp));
  clpar_optimizer *opt = NULL;
  clpar_zero_optimizer *zopt = NULL;
  tu_ok(stage ? clpar_zero_adam_create(ddp, adam, &zopt) : clpar_adam_create_for(ddp, adam, &opt));
  for (int k = 0; k < steps; k++) {
    float x[2] = {(float)clpar_dist_rank() + 1.0f, (float)k - 2.0f};
    clpar_scope *scope = clpar_scope_begin();
    clpar_tensor *xt, *y, *loss;
    tu_ok(clpar_tensor_from_host(dev, 2, (int64_t[]){1, 2}, x, &xt));
    tu_ok(clpar_module_forward(ddp, xt, &y));
    tu_ok(clpar_mean(y, &loss));
    tu_ok(clpar_backward(loss));
    clpar_scope_end(scope);
    tu_ok(stage ? clpar_zero_optimizer_step(zopt) : clpar_optimizer_step(opt));
    tu_ok(stage ? clpar_zero_optimizer_zero_grad(zopt) : clpar_optimizer_zero_grad(opt));
  }
  if (stage == 3) tu_ok(clpar_zero_gather_parameters(ddp));
  float *all = tu_read_params(ddp, 3);
  memcpy(p, all, 3 * sizeof(float));
  free(all);
  int empty = zopt && !clpar_zero_optimizer_inner(zopt);
  clpar_zero_optimizer_free(zopt);
  clpar_optimizer_free(opt);
  clpar_module_free(ddp);
  return empty;
}

/* ---- a convolution case on a backend's path against the plain one ---- */

const char *const tu_conv_part[4] = {"y", "dx", "dw", "db"};

static float *read_counted(clpar_tensor *t, size_t *n) {
  *n = (size_t)clpar_tensor_numel(t);
  return tu_read(t);
}

void tu_conv_run(clpar_device *dev, const tu_conv_case *c, int grads, tu_conv_result *out) {
  clpar_scope *sc = clpar_scope_begin();
  int64_t xs[4] = {c->n, c->c, c->h, c->w}, ws[4] = {c->o, c->c / c->opt.groups, c->kh, c->kw};
  clpar_tensor *x = tu_make(dev, 4, xs, 11), *w = tu_make(dev, 4, ws, 12);
  clpar_tensor *b = c->bias ? tu_make(dev, 1, &c->o, 13) : NULL, *y, *r, *prod, *loss;
  tu_ok(clpar_tensor_set_requires_grad(x, grads & 1));
  tu_ok(clpar_tensor_set_requires_grad(w, (grads >> 1) & 1));
  if (b) tu_ok(clpar_tensor_set_requires_grad(b, (grads >> 2) & 1));
  tu_ok(clpar_conv2d(x, w, b, &c->opt, &y));
  r = tu_make(dev, y->ndim, y->shape, 14);
  tu_ok(clpar_mul(y, r, &prod));
  tu_ok(clpar_sum(prod, &loss));
  tu_ok(clpar_backward(loss));
  memset(out, 0, sizeof *out);
  out->v[0] = read_counted(y, &out->n[0]);
  clpar_tensor *g[3] = {clpar_tensor_grad(x), clpar_tensor_grad(w),
                        b ? clpar_tensor_grad(b) : NULL};
  for (int i = 0; i < 3; i++) {
    if ((grads >> i) & 1 && (i < 2 || b)) assert_non_null(g[i]);
    if (g[i]) out->v[i + 1] = read_counted(g[i], &out->n[i + 1]);
  }
  clpar_scope_end(sc);
}

void tu_conv_result_free(tu_conv_result *r) {
  for (int i = 0; i < 4; i++) free(r->v[i]);
}

void tu_conv_run_plain(clpar_device *dev, const tu_conv_case *c, int grads, tu_conv_result *out) {
  tu_ok(clpar_device_synchronize(dev));
  const clpar_backend_iface *keep = dev->bd.iface;
  clpar_backend_iface plain = *keep;
  plain.conv2d = NULL;
  plain.conv2d_backward = NULL;
  dev->bd.iface = &plain;
  tu_conv_run(dev, c, grads, out);
  tu_ok(clpar_device_synchronize(dev));
  dev->bd.iface = keep;
}

uint64_t tu_mapped_bytes(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmSize: %llu kB", &kb) == 1) break;
  fclose(f);
  return (uint64_t)kb << 10;
}

int tu_limit_address_space(uint64_t room, struct rlimit *old) {
  assert_int_equal(getrlimit(RLIMIT_AS, old), 0);
  struct rlimit lim = *old;
  lim.rlim_cur = (rlim_t)(tu_mapped_bytes() + room);
  assert_true(lim.rlim_cur > room); /* the mapped bytes were known */
  if (old->rlim_cur != RLIM_INFINITY && old->rlim_cur < lim.rlim_cur) return 0;
  assert_int_equal(setrlimit(RLIMIT_AS, &lim), 0);
  return 1;
}
