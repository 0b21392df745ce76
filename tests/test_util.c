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
