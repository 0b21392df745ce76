/* test_ddp_nccl.c — DistributedDataParallel's choice between NCCL and MPI, and NCCL on CUDA
 * devices against single-process training; run by ctest through mpirun on 1 and 2 ranks
 * (tests/CMakeLists.txt, label mpi).
 *
 * Everywhere: CLPAR_DIST_BACKEND's values; a module on a device that is not CUDA, or split
 * over two devices, is reduced over MPI and clpar_ddp_backend says why; CLPAR_DIST_BACKEND=nccl
 * where NCCL cannot serve fails on every rank naming the rank (no hang); ranks that disagree
 * on the variable fail alike.
 *
 * On CUDA devices (one per rank) with NCCL built: DDP chooses NCCL, and its weights after 5
 * SGD-momentum steps equal one process trained on the whole batch (1e-5 relative), with one
 * bucket, with three, and with two no_sync micro-steps; a synchronized step adds no host wait
 * and copies no byte to the host; the same model forced over MPI agrees too. Without a CUDA
 * device, or without NCCL, those tests skip saying why. Ranks sharing a GPU: NCCL refuses
 * (ncclInvalidUsage), so there the NCCL tests skip and a test checks that auto mode fell back
 * to MPI on every rank, with NCCL's reason. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

enum { IN = 16, HIDDEN = 64, OUT = 4, BATCH = 48, STEPS = 5, MAX_CUDA = 16 };

/* src/dist/dist_internal.h (it needs mpi.h): CLPAR_DIST_BACKEND's parser, and the mode set
 * as the variable would set it */
clpar_status clpar_dist_parse_backend(const char *value, int *mode);
clpar_status clpar_dist_set_backend(const char *value);

static clpar_device *cuda_devs[MAX_CUDA];
static int cuda_count;

static int is_cuda(const clpar_device *d) {
  clpar_device_info info;
  return clpar_device_get_info(d, &info) == CLPAR_OK && strcmp(info.backend, "cuda") == 0;
}

/* This rank's CUDA device (one per local rank), or NULL after printing why the test skips. */
static clpar_device *rank_cuda_device(const char *test) {
  const char *why = NULL;
  char text[256];
#ifndef CLPAR_HAVE_NCCL
  why = "NCCL not built (CMake option CLPAR_NCCL; needs the CUDA module, MPI and nccl.h)";
#endif
  if (!why && cuda_count == 0) why = "no CUDA device";
  if (!why && clpar_dist_local_size() > cuda_count) {
    snprintf(text, sizeof text,
             "%d ranks on this host share %d CUDA device%s: NCCL needs one GPU per rank "
             "(test_ddp_nccl's shared-GPU test covers this case)",
             clpar_dist_local_size(), cuda_count, cuda_count > 1 ? "s" : "");
    why = text;
  }
  if (why) {
    fprintf(stderr, "rank %d: %s skipped: %s\n", clpar_dist_rank(), test, why);
    return NULL;
  }
  return cuda_devs[clpar_dist_local_rank() % cuda_count];
}

static clpar_module *make_mlp(clpar_device *dev, uint64_t seed) {
  return tu_mlp(dev, seed, 4, (int64_t[]){IN, HIDDEN, HIDDEN, OUT});
}

/* Forward and backward of MSE on rows [row0, row0+rows) of the batch. */
static void forward_backward(clpar_module *m, clpar_device *dev, const float *x, const float *y,
                             int row0, int rows) {
  tu_mse_backward(m, dev, x, y, row0, rows, IN, OUT, NULL);
}

static clpar_optimizer *make_sgd(clpar_module *m) {
  clpar_sgd_options o = {.lr = 0.05f, .momentum = 0.9f};
  clpar_optimizer *opt;
  tu_ok(clpar_sgd_create_for(m, &o, &opt));
  return opt;
}

/* DDP on dev (bucket cap, micro-steps) against the whole batch on one process; want is the
 * backend DDP must choose. Returns the number of buckets. With NCCL, a synchronized
 * forward and backward must add no host wait on dev and copy nothing to the host. */
static int check_matches_full_batch(clpar_device *dev, double cap_mb, int micro, const char *want) {
  int rank = clpar_dist_rank(), world = clpar_dist_world_size();
  assert_int_equal(BATCH % (world * micro), 0);
  float *x = tu_rand(BATCH * IN, 11), *y = tu_rand(BATCH * OUT, 12);
  clpar_module *ref = make_mlp(dev, 1), *ddp;
  clpar_ddp_options o = {.bucket_cap_mb = cap_mb};
  tu_ok(clpar_ddp_create(make_mlp(dev, 1 + (uint64_t)rank), &o, &ddp));
  const char *why = NULL, *backend = clpar_ddp_backend(ddp, &why);
  assert_non_null(backend);
  if (strcmp(backend, want) != 0)
    fail_msg("rank %d: DDP chose %s, not %s: %s", rank, backend, want, why);
  clpar_optimizer *ref_opt = make_sgd(ref), *ddp_opt = make_sgd(ddp);
  int rows = BATCH / world;
  for (int step = 0; step < STEPS; step++) {
    tu_ok(clpar_optimizer_zero_grad(ref_opt));
    for (int k = 0; k < micro; k++) forward_backward(ref, dev, x, y, 0, BATCH);
    tu_ok(clpar_optimizer_step(ref_opt));

    tu_ok(clpar_optimizer_zero_grad(ddp_opt));
    for (int k = 0; k < micro; k++) {
      tu_ok(clpar_ddp_set_sync(ddp, k == micro - 1));
      clpar_device_counters before, after;
      tu_ok(clpar_device_counters_get(dev, &before));
      forward_backward(ddp, dev, x, y, rank * rows + k * (rows / micro), rows / micro);
      tu_ok(clpar_device_counters_get(dev, &after));
      if (!strcmp(backend, "nccl")) { /* reduced on the device: no copy, no wait */
        assert_int_equal(after.host_waits - before.host_waits, 0);
        assert_int_equal(after.bytes_out - before.bytes_out, 0);
      }
    }
    tu_ok(clpar_optimizer_step(ddp_opt));
    tu_ok(clpar_ddp_synchronize(ddp));
  }
  int n = clpar_module_parameter_count(ref);
  for (int i = 0; i < n; i++) {
    const char *name;
    clpar_tensor *a, *b;
    tu_ok(clpar_module_parameter_at(ddp, i, &name, &a));
    const char *ref_name;
    tu_ok(clpar_module_parameter_at(ref, i, &ref_name, &b));
    float *av = tu_read(a), *bv = tu_read(b);
    int64_t k = clpar_tensor_numel(b);
    float largest = 0;
    for (int64_t j = 0; j < k; j++) largest = fmaxf(largest, fabsf(bv[j]));
    char what[160];
    snprintf(what, sizeof what, "rank %d, %s after %d steps over %s", rank, name, STEPS, backend);
    tu_assert_close(av, bv, (size_t)k, 0.0f, 1e-5f * largest, what);
    free(av);
    free(bv);
  }
  clpar_ddp_stats stats;
  tu_ok(clpar_ddp_stats_get(ddp, &stats));
  assert_int_equal(stats.reductions, STEPS);
  clpar_optimizer_free(ref_opt);
  clpar_optimizer_free(ddp_opt);
  clpar_module_free(ref);
  clpar_module_free(ddp);
  free(x);
  free(y);
  return stats.buckets;
}

/* ---- everywhere ---- */

static void test_backend_variable_values(void **state) {
  (void)state;
  int mode = -1;
  tu_ok(clpar_dist_parse_backend(NULL, &mode));
  assert_int_equal(mode, 0);
  tu_ok(clpar_dist_parse_backend("", &mode));
  assert_int_equal(mode, 0);
  tu_ok(clpar_dist_parse_backend("auto", &mode));
  assert_int_equal(mode, 0);
  tu_ok(clpar_dist_parse_backend("MPI", &mode));
  assert_int_equal(mode, 1);
  tu_ok(clpar_dist_parse_backend("nccl", &mode));
  assert_int_equal(mode, 2);
  assert_int_equal(clpar_dist_parse_backend("gloo", &mode), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(clpar_last_error(), "CLPAR_DIST_BACKEND=\"gloo\""));
  assert_int_equal(clpar_dist_set_backend("nccl2"), CLPAR_ERROR_INVALID_ARGUMENT);
}

/* The host device is never served by NCCL: MPI, saying so, and training still works. */
static void test_host_device_reduces_over_mpi_saying_why(void **state) {
  (void)state;
  clpar_device *host = clpar_device_host();
  tu_ok(clpar_dist_set_backend("auto"));
  clpar_module *ddp;
  tu_ok(clpar_ddp_create(make_mlp(host, 3), NULL, &ddp));
  const char *why = NULL;
  assert_string_equal(clpar_ddp_backend(ddp, &why), "mpi");
  if (!strstr(why, "NCCL cannot serve rank 0: its device is not a CUDA device"))
    fail_msg("rank %d: %s", clpar_dist_rank(), why);
  if (clpar_dist_rank() == 0 && !strstr(why, "(host, host backend)"))
    fail_msg("rank 0 names its own device: %s", why);
  clpar_module_free(ddp);
  clpar_module *plain = make_mlp(host, 3);
  assert_null(clpar_ddp_backend(plain, &why));
  assert_string_equal(why, "not a DistributedDataParallel module");
  clpar_module_free(plain);
}

/* A module over two devices (DDP with model parallel) goes over MPI, naming both. */
static clpar_status two_device_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                       void *user) {
  clpar_device *second = user;
  clpar_tensor *h;
  clpar_status s = clpar_module_forward(clpar_module_child(self, "0"), x, &h);
  if (s == CLPAR_OK) s = clpar_tensor_to(h, second, &h);
  if (s == CLPAR_OK) s = clpar_module_forward(clpar_module_child(self, "1"), h, y);
  return s;
}

static void test_model_parallel_reduces_over_mpi_saying_why(void **state) {
  (void)state;
  clpar_device *first = clpar_dist_device(), *second = tu_second_device(first);
  if (first == second) {
    fprintf(stderr, "model-parallel choice skipped: one device only\n");
    skip();
  }
  clpar_module *m, *l, *ddp;
  tu_ok(clpar_module_create("Split", two_device_forward, second, NULL, &m));
  tu_ok(clpar_linear_create(IN, HIDDEN, 1, first, &l));
  tu_ok(clpar_module_add_child(m, "0", l));
  tu_ok(clpar_linear_create(HIDDEN, OUT, 1, second, &l));
  tu_ok(clpar_module_add_child(m, "1", l));
  tu_ok(clpar_dist_set_backend("auto"));
  tu_ok(clpar_ddp_create(m, NULL, &ddp));
  const char *why = NULL;
  assert_string_equal(clpar_ddp_backend(ddp, &why), "mpi");
  if (!strstr(why, "NCCL cannot serve rank 0: its module's parameters live on several devices"))
    fail_msg("rank %d: %s", clpar_dist_rank(), why);
  clpar_module_free(ddp);
}

static void test_forced_mpi_is_reported(void **state) {
  (void)state;
  tu_ok(clpar_dist_set_backend("mpi"));
  clpar_module *ddp;
  tu_ok(clpar_ddp_create(make_mlp(clpar_dist_device(), 3), NULL, &ddp));
  const char *why = NULL;
  assert_string_equal(clpar_ddp_backend(ddp, &why), "mpi");
  assert_non_null(strstr(why, "CLPAR_DIST_BACKEND=mpi on rank 0"));
  clpar_module_free(ddp);
  tu_ok(clpar_dist_set_backend("auto"));
}

/* CLPAR_DIST_BACKEND=nccl where NCCL cannot serve: every rank fails naming rank 0, and the
 * ranks are still in step afterwards. */
static void test_forced_nccl_fails_on_every_rank_where_it_cannot(void **state) {
  (void)state;
  tu_ok(clpar_dist_set_backend("nccl"));
  clpar_module *ddp = NULL;
  clpar_status s = clpar_ddp_create(make_mlp(clpar_device_host(), 3), NULL, &ddp);
  tu_ok(clpar_dist_set_backend("auto"));
  assert_int_equal(s, CLPAR_ERROR_UNSUPPORTED);
  assert_null(ddp);
  const char *want =
      "CLPAR_DIST_BACKEND=nccl on rank 0, but NCCL cannot serve rank 0: its "
      "device is not a CUDA device";
  if (!strstr(clpar_last_error(), want))
    fail_msg("rank %d: expected \"%s\" in \"%s\"", clpar_dist_rank(), want, clpar_last_error());
  float one = 1;
  tu_ok(clpar_dist_all_reduce_sum(&one, 1));
  assert_true(one == (float)clpar_dist_world_size());
}

static void test_ranks_disagreeing_on_the_variable_fail_alike(void **state) {
  (void)state;
  int rank = clpar_dist_rank(), world = clpar_dist_world_size();
  if (world < 2) {
    fprintf(stderr, "disagreeing ranks skipped: one rank\n");
    skip();
  }
  tu_ok(clpar_dist_set_backend(rank == world - 1 ? "nccl" : "mpi"));
  clpar_module *ddp = NULL;
  clpar_status s = clpar_ddp_create(make_mlp(clpar_dist_device(), 3), NULL, &ddp);
  tu_ok(clpar_dist_set_backend("auto"));
  assert_int_equal(s, CLPAR_ERROR_INVALID_ARGUMENT);
  char want[160];
  snprintf(want, sizeof want, "CLPAR_DIST_BACKEND is mpi on rank 0 but nccl on rank %d", world - 1);
  if (!strstr(clpar_last_error(), want))
    fail_msg("rank %d: expected \"%s\" in \"%s\"", rank, want, clpar_last_error());
}

/* ---- on CUDA devices ---- */

static void test_nccl_matches_full_batch(void **state) {
  (void)state;
  clpar_device *dev = rank_cuda_device("test_nccl_matches_full_batch");
  if (!dev) skip();
  tu_ok(clpar_dist_set_backend("auto"));
  assert_int_equal(check_matches_full_batch(dev, 0, 1, "nccl"), 1);
}

static void test_nccl_matches_full_batch_several_buckets(void **state) {
  (void)state;
  clpar_device *dev = rank_cuda_device("test_nccl_matches_full_batch_several_buckets");
  if (!dev) skip();
  tu_ok(clpar_dist_set_backend("nccl"));
  /* 0.0005 MiB: {4.bias, 4.weight}, {2.bias, 2.weight}, {0.bias, 0.weight} */
  int buckets = check_matches_full_batch(dev, 0.0005, 1, "nccl");
  tu_ok(clpar_dist_set_backend("auto"));
  assert_int_equal(buckets, 3);
}

static void test_nccl_no_sync_two_micro_steps(void **state) {
  (void)state;
  clpar_device *dev = rank_cuda_device("test_nccl_no_sync_two_micro_steps");
  if (!dev) skip();
  tu_ok(clpar_dist_set_backend("auto"));
  assert_int_equal(check_matches_full_batch(dev, 0.0005, 2, "nccl"), 3);
}

/* The same CUDA devices through pinned host memory over MPI, for comparison. */
static void test_cuda_forced_mpi_matches_full_batch(void **state) {
  (void)state;
  if (cuda_count == 0) {
    fprintf(stderr, "rank %d: CUDA over MPI skipped: no CUDA device\n", clpar_dist_rank());
    skip();
  }
  clpar_device *dev = cuda_devs[clpar_dist_local_rank() % cuda_count];
  tu_ok(clpar_dist_set_backend("mpi"));
  int buckets = check_matches_full_batch(dev, 0.0005, 1, "mpi");
  tu_ok(clpar_dist_set_backend("auto"));
  assert_int_equal(buckets, 3);
}

/* Ranks sharing a GPU: NCCL's init fails on every rank (duplicate GPU), and auto mode falls
 * back to MPI on every rank, giving NCCL's reason; the training still matches. */
static void test_shared_gpu_falls_back_to_mpi(void **state) {
  (void)state;
#ifndef CLPAR_HAVE_NCCL
  fprintf(stderr, "shared-GPU fallback skipped: NCCL not built (CMake option CLPAR_NCCL)\n");
  skip();
#endif
  if (cuda_count == 0 || clpar_dist_local_size() <= cuda_count) {
    fprintf(stderr, "shared-GPU fallback skipped: %s\n",
            cuda_count == 0 ? "no CUDA device" : "every rank has a GPU of its own");
    skip();
  }
  clpar_device *dev = cuda_devs[clpar_dist_local_rank() % cuda_count];
  tu_ok(clpar_dist_set_backend("auto"));
  clpar_module *ddp;
  tu_ok(clpar_ddp_create(make_mlp(dev, 3), NULL, &ddp));
  const char *why = NULL;
  assert_string_equal(clpar_ddp_backend(ddp, &why), "mpi");
  if (!strstr(why, "NCCL's communicator could not be made"))
    fail_msg("rank %d: %s", clpar_dist_rank(), why);
  clpar_module_free(ddp);
  assert_int_equal(check_matches_full_batch(dev, 0, 1, "mpi"), 1);
}

static int setup(void **state) {
  if (tu_dist_setup(state) != 0) return -1;
  for (int i = 0; i < clpar_device_count() && cuda_count < MAX_CUDA; i++)
    if (is_cuda(clpar_device_get(i))) cuda_devs[cuda_count++] = clpar_device_get(i);
  fprintf(stderr, "rank %d of %d (local %d of %d) on %s; %d CUDA device%s\n", clpar_dist_rank(),
          clpar_dist_world_size(), clpar_dist_local_rank(), clpar_dist_local_size(),
          clpar_device_id(clpar_dist_device()), cuda_count, cuda_count == 1 ? "" : "s");
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_backend_variable_values),
      cmocka_unit_test(test_host_device_reduces_over_mpi_saying_why),
      cmocka_unit_test(test_model_parallel_reduces_over_mpi_saying_why),
      cmocka_unit_test(test_forced_mpi_is_reported),
      cmocka_unit_test(test_forced_nccl_fails_on_every_rank_where_it_cannot),
      cmocka_unit_test(test_ranks_disagreeing_on_the_variable_fail_alike),
      cmocka_unit_test(test_nccl_matches_full_batch),
      cmocka_unit_test(test_nccl_matches_full_batch_several_buckets),
      cmocka_unit_test(test_nccl_no_sync_two_micro_steps),
      cmocka_unit_test(test_cuda_forced_mpi_matches_full_batch),
      cmocka_unit_test(test_shared_gpu_falls_back_to_mpi),
  };
  return cmocka_run_group_tests_name("ddp_nccl", tests, setup, tu_dist_teardown);
}
