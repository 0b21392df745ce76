/* test_act_ref.c — see test_act_ref.h. */
#include "test_act_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "test_util.h"

const char *tu_act_name(clpar_act_kind act) {
  static const char *names[] = {"none", "relu", "sigmoid", "tanh"};
  return names[act];
}

double tu_act(clpar_act_kind act, double z) {
  return act == CLPAR_ACT_RELU      ? (z > 0 ? z : 0)
         : act == CLPAR_ACT_SIGMOID ? 1.0 / (1.0 + exp(-z))
         : act == CLPAR_ACT_TANH    ? tanh(z)
                                    : z;
}

double tu_act_grad(clpar_act_kind act, double y) {
  return act == CLPAR_ACT_RELU      ? (y > 0 ? 1.0 : 0.0)
         : act == CLPAR_ACT_SIGMOID ? y * (1.0 - y)
         : act == CLPAR_ACT_TANH    ? 1.0 - y * y
                                    : 1.0;
}

/* sum(R * act(x W^T + b)) in float64. */
static double loss_of(clpar_act_kind act, tu_linear_dims d, const double *x, const double *w,
                      const double *b, const float *r) {
  double sum = 0;
  for (int i = 0; i < d.rows; i++)
    for (int o = 0; o < d.out; o++) {
      double z = b ? b[o] : 0;
      for (int k = 0; k < d.in; k++) z += x[i * d.in + k] * w[o * d.in + k];
      sum += r[i * d.out + o] * tu_act(act, z);
    }
  return sum;
}

void tu_act_fd(clpar_act_kind act, tu_linear_dims d, double *x, double *w, double *b,
               const float *r, double *v, int n, float *out) {
  const double h = 1e-6;
  for (int i = 0; i < n; i++) {
    double keep = v[i];
    v[i] = keep + h;
    double up = loss_of(act, d, x, w, b, r);
    v[i] = keep - h;
    double down = loss_of(act, d, x, w, b, r);
    v[i] = keep;
    out[i] = (float)((up - down) / (2 * h));
  }
}

/* The float64 values of a tensor's data (malloc'ed). */
static double *doubles_of(const clpar_tensor *t) {
  size_t n = (size_t)clpar_tensor_numel(t);
  float *f = tu_read(t);
  double *v = malloc(n * sizeof *v);
  assert_non_null(v);
  for (size_t i = 0; i < n; i++) v[i] = f[i];
  free(f);
  return v;
}

/* One device, activation and bias choice of tu_act_check_gradients. */
static void check_one(clpar_device *dev, clpar_act_kind act, int with_bias, tu_linear_dims d,
                      uint64_t seed, int plain_none) {
  int64_t xs[2] = {d.rows, d.in}, ws[2] = {d.out, d.in}, bs = d.out, rs[2] = {d.rows, d.out};
  clpar_tensor *x = tu_make(dev, 2, xs, seed), *w = tu_make(dev, 2, ws, seed + 1);
  clpar_tensor *b = with_bias ? tu_make(dev, 1, &bs, seed + 2) : NULL;
  clpar_tensor *r = tu_make(dev, 2, rs, seed + 3);
  clpar_tensor *leaves[3] = {x, w, b}, *y, *yr, *loss;
  for (int i = 0; i < 3; i++)
    if (leaves[i]) tu_ok(clpar_tensor_set_requires_grad(leaves[i], 1));
  int plain = plain_none && act == CLPAR_ACT_NONE;
  if (plain)
    tu_ok(clpar_linear(x, w, b, &y));
  else
    tu_ok(clpar_linear_act(x, w, b, act, &y));
  tu_ok(clpar_mul(y, r, &yr));
  tu_ok(clpar_sum(yr, &loss));
  tu_ok(clpar_backward(loss));
  float *fr = tu_read(r);
  double *v[3] = {doubles_of(x), doubles_of(w), b ? doubles_of(b) : NULL};
  for (int i = 0; i < 3; i++) {
    if (!leaves[i]) continue;
    size_t n = (size_t)clpar_tensor_numel(leaves[i]);
    float *want = malloc(n * sizeof *want);
    assert_non_null(want);
    tu_act_fd(act, d, v[0], v[1], v[2], fr, v[i], (int)n, want);
    float *got = tu_read(clpar_tensor_grad(leaves[i]));
    static const char *leaf[] = {"x", "W", "b"};
    char what[160];
    snprintf(what, sizeof what, "%s %s%s on %s: gradient of %s",
             plain ? "clpar_linear" : "clpar_linear_act", tu_act_name(act),
             with_bias ? "" : " (no bias)", clpar_device_id(dev), leaf[i]);
    tu_assert_close(got, want, n, 1e-3f, 1e-4f, what);
    free(got);
    free(want);
  }
  for (int i = 0; i < 3; i++) free(v[i]);
  free(fr);
  clpar_tensor *all[] = {loss, yr, y, x, w, b, r};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) clpar_tensor_free(all[i]);
}

void tu_act_check_gradients(tu_linear_dims d, uint64_t seed, int plain_none) {
  for (int i = -1; i < clpar_device_count(); i++) {
    clpar_device *dev = i < 0 ? tu_host() : clpar_device_get(i);
    for (int act = CLPAR_ACT_NONE; act <= CLPAR_ACT_TANH; act++)
      for (int with_bias = 0; with_bias < 2; with_bias++)
        check_one(dev, (clpar_act_kind)act, with_bias, d, seed, plain_none);
  }
}
