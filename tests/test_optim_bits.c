/* test_optim_bits.c — an optimizer step gives an element the same bits wherever it is stepped:
 * at offset 0 or 3 of a buffer (a length of 1003, not a multiple of any vector width, so the
 * elements fall in the vector body at one offset and the scalar tail at another), and on the
 * host backend or an OpenCL device. ZeRO relies on it: each rank steps its shard of the flat
 * parameters on its own device, plain DDP the whole buffer, and the two must agree; so must
 * ranks on different backends (CLPAR_DEVICES=host,opencl:0 gives rank 0 the host and rank 1
 * PoCL). SGD (momentum, dampening, Nesterov, weight decay), Adam and AdamW, three steps. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

enum { N = 1003, PAD = 5, STEPS = 3 };

typedef struct {
  int adam; /* 0: SGD with sgd; 1: Adam or AdamW (adam.decoupled) */
  clpar_sgd_args sgd;
  clpar_adam_args adam_args;
} step_kind;

/* The state a step touches: parameters, gradient, and two buffers (momentum, or m and v). */
enum { P, G, B1, B2, NT };

/* Three steps of k on dev over N elements at offset off of buffers of N + PAD; the stepped
 * parameters and buffers into out (3 N floats). */
static void run(clpar_device *dev, const step_kind *k, int64_t off, float *out) {
  clpar_scope *scope = clpar_scope_begin();
  float *h[NT] = {tu_rand(N, 31), tu_rand(N, 32), tu_rand(N, 33), tu_rand(N, 34)};
  for (int i = 0; i < N; i++) h[B2][i] = fabsf(h[B2][i]); /* Adam's v is a mean of squares */
  clpar_bref r[NT];
  clpar_tensor *v[NT];
  for (int t = 0; t < NT; t++) {
    float *whole = calloc(N + PAD, sizeof *whole);
    assert_non_null(whole);
    memcpy(whole + off, h[t], N * sizeof *whole);
    clpar_tensor *x;
    tu_ok(clpar_tensor_from_host(dev, 1, (int64_t[]){N + PAD}, whole, &x));
    tu_ok(clpar_narrow(x, 0, off, N, &v[t]));
    r[t] = clpar_tensor_bref(v[t]);
    assert_int_equal(r[t].off, off); /* a view, not a copy */
    free(whole);
  }
  for (int s = 0; s < STEPS; s++) {
    if (k->adam) {
      clpar_adam_args a = k->adam_args;
      a.step = a.lr / (1.0f - powf(a.beta1, (float)(s + 1)));
      a.root2 = sqrtf(1.0f - powf(a.beta2, (float)(s + 1)));
      tu_ok(clpar_dev_adam_step(dev, N, r[P], r[G], r[B1], r[B2], a));
    } else {
      clpar_sgd_args a = k->sgd;
      a.first = s == 0;
      tu_ok(clpar_dev_sgd_step(dev, N, r[P], r[G], r[B1], a));
    }
  }
  for (int t = 0; t < NT; t++) {
    if (t == G) continue;
    float *got = tu_read(v[t]);
    memcpy(out + (t == P ? 0 : t - 1) * N, got, N * sizeof *got);
    free(got);
  }
  for (int t = 0; t < NT; t++) free(h[t]);
  clpar_scope_end(scope);
}

/* k stepped on the host at offset 0 is the reference: every other place must give its bits. */
static void check(const char *what, const step_kind *k) {
  clpar_device *other = tu_second_device(tu_host());
  float *want = malloc(3 * N * sizeof *want), *got = malloc(3 * N * sizeof *got);
  assert_true(want && got);
  run(tu_host(), k, 0, want);
  struct {
    clpar_device *dev;
    int64_t off;
  } places[3] = {{tu_host(), 3}, {other, 0}, {other, 3}};
  for (int w = 0; w < (other ? 3 : 1); w++) {
    clpar_device *dev = places[w].dev;
    int64_t off = places[w].off;
    run(dev, k, off, got);
    for (int i = 0; i < 3 * N; i++)
      if (memcmp(&got[i], &want[i], sizeof got[i]))
        fail_msg("%s on %s at offset %lld: %s[%d] is %.9g, on the host at offset 0 %.9g", what,
                 clpar_device_id(dev), (long long)off, i < N ? "param" : "buffer", i % N, got[i],
                 want[i]);
  }
  free(want);
  free(got);
}

static void test_sgd(void **state) {
  (void)state;
  step_kind k = {.sgd = {.lr = 0.05f, .weight_decay = 0.01f}};
  check("SGD with weight decay", &k);
  k.sgd.momentum = 0.9f;
  check("SGD with momentum", &k);
  k.sgd.dampening = 0.1f;
  check("SGD with momentum and dampening", &k);
  k.sgd.dampening = 0, k.sgd.nesterov = 1;
  check("SGD with Nesterov momentum", &k);
}

static void test_adam(void **state) {
  (void)state;
  for (int decoupled = 0; decoupled < 2; decoupled++) {
    float lr = 1e-3f, wd = 0.01f;
    step_kind k = {.adam = 1,
                   .adam_args = {.lr = lr,
                                 .beta1 = 0.9f,
                                 .beta2 = 0.999f,
                                 .eps = 1e-8f,
                                 .weight_decay = wd,
                                 .one_minus_beta1 = 1.0f - 0.9f,
                                 .one_minus_beta2 = 1.0f - 0.999f,
                                 .keep = (float)(1.0 - (double)lr * wd),
                                 .decoupled = decoupled}};
    check(decoupled ? "AdamW" : "Adam", &k);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sgd),
      cmocka_unit_test(test_adam),
  };
  return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
