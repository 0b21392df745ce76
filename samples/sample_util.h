/* sample_util.h — what the samples share: a wall clock, a small random generator for their
 * synthetic data (xorshift64*: the samples' data needs no quality beyond that), a status check
 * that prints clpar's message, the peak device memory per category, and the MLP classifier of
 * train_mlp.c and ddp.c. */
#ifndef CLPAR_SAMPLE_UTIL_H
#define CLPAR_SAMPLE_UTIL_H

#include <clpar/clpar.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "sample_clock.h"

static inline uint64_t *rng_state(void) {
  static uint64_t state = 0x9E3779B97F4A7C15ull;
  return &state;
}

/* Restarts the generator: the same seed gives the same data (on every rank, say). */
static inline void rng_seed(uint64_t seed) {
  *rng_state() = seed;
}

/* The next 64 random bits (xorshift64*). */
static inline uint64_t rng_next(void) {
  uint64_t *s = rng_state();
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545F4914F6CDD1Dull;
}

static inline double uniform(void) { /* in [0, 1) */
  return (double)(rng_next() >> 11) / 9007199254740992.0;
}

/* One standard normal value (Box-Muller, one of the pair). */
static inline double normal(void) {
  return sqrt(-2 * log(1 - uniform())) * cos(6.283185307179586 * uniform());
}

/* n standard normal values (Box-Muller, two at a time). */
static inline void randn(float *x, size_t n) {
  for (size_t i = 0; i < n; i += 2) {
    double r = sqrt(-2 * log(1 - uniform())), a = 6.283185307179586 * uniform();
    x[i] = (float)(r * cos(a));
    if (i + 1 < n) x[i + 1] = (float)(r * sin(a));
  }
}

/* 1 when s is CLPAR_OK; else prints what failed with clpar's message on stderr (prefixed by
 * the rank in a distributed job) and returns 0. */
static inline int check(clpar_status s, const char *what) {
  if (s == CLPAR_OK) return 1;
  if (clpar_dist_rank() >= 0)
    fprintf(stderr, "rank %d: %s: %s: %s\n", clpar_dist_rank(), what, clpar_status_name(s),
            clpar_last_error());
  else
    fprintf(stderr, "%s: %s: %s\n", what, clpar_status_name(s), clpar_last_error());
  return 0;
}

/* One line on stderr: the most device memory each category (include/clpar/memory.h) held at
 * once on dev since clpar_init (or the last clpar_memory_mark), in MiB, the backend's
 * workspaces among them, and all of them at once (total), prefixed by the rank in a
 * distributed job. The line is put together first and written in one call: mpirun forwards
 * each rank's stderr as it arrives, and a line written in pieces while another rank writes
 * its own would come out with the other's spliced into it. */
static inline void print_memory_peaks(clpar_device *dev) {
  static const clpar_mem_category order[] = {
      CLPAR_MEM_PARAMETERS,    CLPAR_MEM_GRADIENTS, CLPAR_MEM_OPTIMIZER, CLPAR_MEM_ACTIVATIONS,
      CLPAR_MEM_COMMUNICATION, CLPAR_MEM_WORKSPACE, CLPAR_MEM_TOTAL};
  char line[512]; /* at most 377 bytes: the id cut at 64, names at 16, values under 18 */
  int n = 0;
  if (clpar_dist_rank() >= 0) n = snprintf(line, sizeof line, "rank %d: ", clpar_dist_rank());
  n += snprintf(line + n, sizeof line - (size_t)n, "peak memory on %.64s:", clpar_device_id(dev));
  for (size_t i = 0; i < sizeof order / sizeof *order; i++)
    n += snprintf(line + n, sizeof line - (size_t)n, "%s %.16s %.2f MiB", i ? "," : "",
                  clpar_memory_category_name(order[i]),
                  (double)clpar_memory_peak(dev, order[i]) / 1048576.0);
  fprintf(stderr, "%s\n", line);
}

/* ---- the MLP classifier of train_mlp.c and ddp.c ---- */

/* Linear(features, hidden) -> ReLU -> Linear(hidden, hidden) -> ReLU -> Linear(hidden,
 * classes) on dev, initialized from seed; NULL (the reason on stderr) on failure. */
static inline clpar_module *build_mlp(int64_t features, int64_t hidden, int64_t classes,
                                      clpar_device *dev, uint64_t seed) {
  clpar_module *layers[5], *mlp = NULL;
  clpar_manual_seed(seed);
  if (!check(clpar_linear_create(features, hidden, 1, dev, &layers[0]), "Linear") ||
      !check(clpar_relu_create(&layers[1]), "ReLU") ||
      !check(clpar_linear_create(hidden, hidden, 1, dev, &layers[2]), "Linear") ||
      !check(clpar_relu_create(&layers[3]), "ReLU") ||
      !check(clpar_linear_create(hidden, classes, 1, dev, &layers[4]), "Linear"))
    return NULL; /* (a sample: leaks on this path are left to the process's exit) */
  check(clpar_sequential_create(layers, 5, &mlp), "Sequential");
  return mlp;
}

/* Fraction of the n rows of x (n x features) whose largest logit is the label y. */
static inline double accuracy(clpar_module *mlp, clpar_device *dev, const float *x,
                              const int32_t *y, int n, int features, int classes) {
  clpar_scope *scope = clpar_scope_begin();
  int was = clpar_set_grad_enabled(0);
  clpar_tensor *xt, *logits;
  float *out = malloc((size_t)n * (size_t)classes * sizeof *out);
  int correct = 0;
  if (out && check(clpar_tensor_from_host(dev, 2, (int64_t[]){n, features}, x, &xt), "upload") &&
      check(clpar_module_forward(mlp, xt, &logits), "forward") &&
      check(clpar_tensor_read(logits, out, (size_t)n * (size_t)classes), "read")) {
    for (int i = 0; i < n; i++) {
      int best = 0;
      for (int c = 1; c < classes; c++)
        best = out[i * classes + c] > out[i * classes + best] ? c : best;
      correct += best == y[i];
    }
  }
  free(out);
  clpar_set_grad_enabled(was);
  clpar_scope_end(scope);
  return (double)correct / n;
}

/* n points of a Gaussian-blobs task: class c around centers[c] (features values each), with
 * noise of standard deviation 1.2. */
static inline void make_blobs(float *x, int32_t *y, int n, const float *centers, int features,
                              int classes) {
  for (int i = 0; i < n; i++) {
    int c = (int)(uniform() * classes);
    y[i] = c;
    for (int f = 0; f < features; f++)
      x[i * features + f] = centers[c * features + f] + (float)(1.2 * normal());
  }
}

#endif
