/* test_util.h — what every cmocka test of clpar shares: set-up, the host reference device,
 * random host data and comparisons with a tolerance that names the first bad element. */
#ifndef CLPAR_TEST_UTIL_H
#define CLPAR_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka.h needs the three above first */
#include <cmocka.h>

#include <sys/resource.h>

#include "clpar/clpar.h"

/* cmocka group set-up/tear-down: clpar_init / clpar_shutdown (fails the group on error). */
int tu_setup(void **state);
int tu_teardown(void **state);

/* The host backend device, always available as the reference even when not selected. */
clpar_device *tu_host(void);

/* The first selected device that is not the host (the one to compare with the host
 * reference), or NULL when the host is the only one selected. */
clpar_device *tu_non_host(void);

/* A device other than first for tests that need two: another selected device, else the host
 * device, else (first is the host, the only one selected) a probed device that is not
 * selected (PoCL), said on stderr; NULL when the machine has no second device. */
clpar_device *tu_second_device(const clpar_device *first);

/* Removes the files in the directory path (not subdirectories), then the directory. */
void tu_remove_dir(const char *path);

/* n floats uniform in [-1, 1) from seed, malloc'ed (never NULL). */
float *tu_rand(size_t n, uint64_t seed);

/* Fails the test naming the first element where |a-b| > atol + rtol*|b|. */
void tu_assert_close_(const float *a, const float *b, size_t n, float rtol, float atol,
                      const char *what, const char *file, int line);
#define tu_assert_close(a, b, n, rtol, atol, what) \
  tu_assert_close_((a), (b), (n), (rtol), (atol), (what), __FILE__, __LINE__)

/* Asserts status == CLPAR_OK, printing clpar_last_error() when it is not. */
#define tu_ok(expr)                                                                        \
  do {                                                                                     \
    clpar_status tu_s_ = (expr);                                                           \
    if (tu_s_ != CLPAR_OK)                                                                 \
      fail_msg("%s returned %s: %s", #expr, clpar_status_name(tu_s_), clpar_last_error()); \
  } while (0)

/* A tensor of the given shape on dev holding tu_rand(numel, seed). */
clpar_tensor *tu_make(clpar_device *dev, int ndim, const int64_t *shape, uint64_t seed);

/* Asserts that t equals ref in shape and, within the tolerance, in values. */
void tu_expect_equal(const clpar_tensor *t, const clpar_tensor *ref, float rtol, float atol,
                     const char *what);

/* Reads a whole tensor into a new malloc'ed buffer. */
float *tu_read(const clpar_tensor *t);

/* The model-parallel tutorial's ToyModel: net1 = Linear(10, 10) on dev0, ReLU, net2 =
 * Linear(10, 5) on dev1 (dev0 == dev1: one device); forward moves the input to dev0 and the
 * activation to dev1 with the differentiable copy. */
typedef struct {
  clpar_device *dev0, *dev1;
} tu_toy_devices;
/* Made with clpar_manual_seed(seed) (d must outlive the module). */
/* tests/reference/train_parity.py's value formula and MLP: Linear(4, 3), ReLU, Linear(3, 2) on
 * dev with that script's fixed weights (parameters 0.weight, 0.bias, 2.weight, 2.bias). */
float tu_parity_value(int k, int a, int b);
clpar_module *tu_parity_mlp(clpar_device *dev);
clpar_module *tu_toy_create(tu_toy_devices *d, uint64_t seed);
/* steps SGD steps (MSE, batch 20 of fixed random inputs on dev0 and targets on dev1, both
 * seeded by the step), checking the output's device and the parameters' names; the losses
 * (steps of them; losses may be NULL) and the 165 parameters after, flattened, out. */
void tu_toy_train(tu_toy_devices *d, uint64_t seed, const clpar_sgd_options *sgd, int steps,
                  float *losses, float *weights);

/* The whole file at path (malloc'd, NUL-terminated, *len its size; the test fails if it cannot
 * be read). */
char *tu_slurp(const char *path, size_t *len);
/* Group setup and teardown of the tests run under mpirun: clpar_dist_init (its failure
 * printed, the group not run) and clpar_dist_finalize. */
/* Bytes dev's allocator held at its peak during clpar_backward(loss), over what it held before
 * (both after the device's queue drained). */
uint64_t tu_backward_peak(clpar_device *dev, clpar_tensor *loss);
int tu_dist_setup(void **state);
int tu_dist_teardown(void **state);

/* ---- models and steps the data-parallel and checkpoint tests share ---- */

enum { TU_MLP_MAX_LAYERS = 8 };
/* Linear(widths[0], widths[1]), ReLU, ..., Linear(widths[n-2], widths[n-1]) (2 <= n <= 9, with
 * bias) on dev, made after clpar_manual_seed(seed). */
clpar_module *tu_mlp(clpar_device *dev, uint64_t seed, int n, const int64_t *widths);
/* Batch k of the checkpoint tests: x[i] = sin(0.37 (i + 101 k)), y[i] = cos(0.23 (i + 53 k)),
 * the same on every rank and at every world size. */
void tu_wave_batch(int k, float *x, int nx, float *y, int ny);
/* Forward and backward of MSE (mean) of m on rows [row0, row0 + rows) of the host arrays x
 * [.., in] and y [.., out], on dev; the loss into *loss (read back) unless loss is NULL. */
void tu_mse_backward(clpar_module *m, clpar_device *dev, const float *x, const float *y, int row0,
                     int rows, int in, int out, float *loss);
/* tu_mse_backward on this rank's share of the batch (batch / world rows; all of them outside
 * an MPI job); this rank's loss into *loss unless loss is NULL. */
void tu_rank_mse_backward(clpar_module *m, clpar_device *dev, const float *x, const float *y,
                          int batch, int in, int out, float *loss);
/* tu_rank_mse_backward on this rank's device of step k's batch: x = tu_rand(batch * in,
 * 11 + k), y = tu_rand(batch * out, 41 + k). */
void tu_rank_mse_backward_rand(clpar_module *m, int k, int batch, int in, int out);
/* Every parameter of m, in order, into a new host array of n floats (exactly n). */
float *tu_read_params(clpar_module *m, size_t n);
/* Linear(2, 1) (seed 5) under DistributedDataParallel with ZeRO at stage (0: plain DDP),
 * steps Adam steps of mean(y) on a row that differs by rank and step; its 3 parameters (stage
 * 3 gathers them) into p. 1 when the rank's ZeRO optimizer stepped nothing (its shard all
 * padding: no inner optimizer). */
int tu_zero_train_tiny(int stage, const clpar_adam_options *adam, int steps, float p[3]);

/* ---- one convolution case (test_host_dnnl, test_cuda_cudnn) ---- */

typedef struct {
  const char *name;
  int64_t n, c, h, w, o, kh, kw;
  clpar_conv2d_options opt;
  int bias;
} tu_conv_case;
#define TU_CONV_OPT(s0, s1, p0, p1, d0, d1, g) \
  { {s0, s1}, {p0, p1}, {d0, d1}, g }
/* y, dx, dw, db of a case (NULL where not asked, db without bias) and their counts. */
typedef struct {
  float *v[4];
  size_t n[4];
} tu_conv_result;
extern const char *const tu_conv_part[4]; /* "y", "dx", "dw", "db" */
/* The case on dev, loss sum(y * r) of fixed random x, w, b, r; grads: bit 0 x, bit 1 weight,
 * bit 2 bias, the inputs that require a gradient. */
void tu_conv_run(clpar_device *dev, const tu_conv_case *c, int grads, tu_conv_result *out);
/* The same with dev's whole-convolution entries removed for the call: the plain path. */
void tu_conv_run_plain(clpar_device *dev, const tu_conv_case *c, int grads, tu_conv_result *out);
void tu_conv_result_free(tu_conv_result *r);

/* ---- an address-space limit, to make a driver run out of host memory ---- */

/* TU_UNDER_ASAN: 1 under AddressSanitizer, whose shadow memory needs an unlimited address
 * space (no test there may lower it). */
#if defined(__SANITIZE_ADDRESS__)
#define TU_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TU_UNDER_ASAN 1
#endif
#endif
#ifndef TU_UNDER_ASAN
#define TU_UNDER_ASAN 0
#endif

/* The process's mapped bytes now (VmSize), or 0 when /proc cannot tell. */
uint64_t tu_mapped_bytes(void);

/* Lowers the soft address-space limit (RLIMIT_AS) to what is mapped now (which must be known)
 * plus room, the old limits into *old (for setrlimit to restore); 0, changing nothing, when the
 * soft limit is already lower. */
int tu_limit_address_space(uint64_t room, struct rlimit *old);

#endif
