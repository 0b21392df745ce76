/* test_activation_checkpoint_ddp.c — activation checkpointing under DistributedDataParallel,
 * run by ctest through mpirun on 2 ranks (tests/CMakeLists.txt): on every rank, DDP over
 * transformer blocks with dropout, each block wrapped (clpar_activation_checkpoint_create),
 * against DDP over the same blocks unwrapped, each rank on its own rows: the outputs and the
 * averaged gradients must be the same bits, with and without find_unused_parameters. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

enum { B = 4, T = 8, C = 16, NH = 2, BLOCKS = 3 };

static clpar_module *make_ddp(int ckpt, int find_unused) {
  const clpar_block_config bc = {C, NH, 0.25f, 1};
  clpar_module *b[BLOCKS], *seq, *ddp;
  clpar_manual_seed(5);
  for (int i = 0; i < BLOCKS; i++) {
    tu_ok(clpar_transformer_block_create(&bc, clpar_dist_device(), &b[i]));
    if (ckpt) tu_ok(clpar_activation_checkpoint_create(b[i], &b[i]));
  }
  tu_ok(clpar_sequential_create(b, BLOCKS, &seq));
  clpar_ddp_options o = {.find_unused_parameters = find_unused};
  tu_ok(clpar_ddp_create(seq, &o, &ddp));
  return ddp;
}

/* Forward and backward of MSE on this rank's rows; the output's values (malloc'ed). */
static float *step(clpar_module *m, uint64_t seed) {
  clpar_device *dev = clpar_dist_device();
  const int64_t shape[3] = {B, T, C};
  uint64_t rank = (uint64_t)clpar_dist_rank();
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *x = tu_make(dev, 3, shape, seed + 100 * rank), *y, *t, *loss;
  t = tu_make(dev, 3, shape, seed + 100 * rank + 1);
  tu_ok(clpar_module_forward(m, x, &y));
  tu_ok(clpar_mse_loss(y, t, CLPAR_REDUCTION_MEAN, &loss));
  tu_ok(clpar_backward(loss));
  float *out = tu_read(y);
  clpar_scope_end(scope);
  return out;
}

static void expect_same_bits(const float *a, const float *b, size_t n, const char *what) {
  for (size_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], sizeof *a) != 0)
      fail_msg("rank %d, %s: element %zu is %.9g with checkpointing, %.9g without",
               clpar_dist_rank(), what, i, (double)a[i], (double)b[i]);
}

static void check(int find_unused) {
  clpar_module *plain = make_ddp(0, find_unused), *ck = make_ddp(1, find_unused);
  for (int s = 0; s < 2; s++) {
    tu_ok(clpar_module_zero_grad(plain));
    tu_ok(clpar_module_zero_grad(ck));
    float *a = step(ck, 10 + (uint64_t)s), *b = step(plain, 10 + (uint64_t)s);
    tu_ok(clpar_ddp_synchronize(ck));
    tu_ok(clpar_ddp_synchronize(plain));
    expect_same_bits(a, b, (size_t)B * T * C, "output");
    free(a);
    free(b);
    int n = clpar_module_parameter_count(plain);
    assert_int_equal(clpar_module_parameter_count(ck), n);
    for (int i = 0; i < n; i++) {
      const char *na, *nb;
      clpar_tensor *pa, *pb;
      tu_ok(clpar_module_parameter_at(ck, i, &na, &pa));
      tu_ok(clpar_module_parameter_at(plain, i, &nb, &pb));
      assert_string_equal(na, nb);
      float *ga = tu_read(clpar_tensor_grad(pa)), *gb = tu_read(clpar_tensor_grad(pb));
      expect_same_bits(ga, gb, (size_t)clpar_tensor_numel(pb), na);
      free(ga);
      free(gb);
    }
  }
  clpar_module_free(plain);
  clpar_module_free(ck);
}

static void test_ddp_bit_identical(void **state) {
  (void)state;
  check(0);
}

static void test_ddp_find_unused_bit_identical(void **state) {
  (void)state;
  check(1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ddp_bit_identical),
      cmocka_unit_test(test_ddp_find_unused_bit_identical),
  };
  return cmocka_run_group_tests_name("activation_checkpoint_ddp", tests, tu_dist_setup,
                                     tu_dist_teardown);
}
