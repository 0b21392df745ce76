/* test_zero3_free.c — freeing a ZeRO stage 3 module (clpar/zero.h) while its communication
 * thread still has a unit's collective to run, through mpirun on 2, 3 and 4 ranks, one PoCL
 * device each (tests/CMakeLists.txt). The units' wrappers are children of the module's tree,
 * freed before the DDP module itself stops the thread, which runs every collective posted
 * before it stops (the same on every rank): a slot the thread has not run yet must not read a
 * freed unit (else the sanitizer build reports a heap-use-after-free in zero3_comm.c, and a
 * reduce-scatter's sum written into the freed unit corrupts the heap of a plain build), and
 * no rank may wait for a collective that its peers do not run (the next test's
 * clpar_ddp_create would wait for that rank).
 *
 * The order is made certain with a gate (src/runtime/capture_host.c) on the device's queue:
 * Sequential(Sequential(Gate, Linear(5, 7)), Linear(7, 3), Opener), the Linear layers' trees
 * the units. Gate's forward (inside the first unit, so also in its recompute in backward)
 * makes the queue wait until the gate is opened; the device's reads that the thread waits for
 * before a collective queue up behind it. Opener is the container's last child: freed after
 * both units, it opens the gate, so the thread can go on only once the units were freed. */
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* clpar_gate_new, clpar_dev_gate_wait */
#include "test_util.h"

enum { ROWS = 4, IN = 5, HID = 7, OUT = 3, REPEAT = 3 };

static clpar_status identity(clpar_tensor *x, clpar_tensor **y) {
  return clpar_tensor_reshape(x, clpar_tensor_ndim(x),
                              (int64_t[]){clpar_tensor_dim(x, 0), clpar_tensor_dim(x, 1)}, y);
}

/* Gate: the device's queue waits at the gate (user), then the input as it is. */
static clpar_status gate_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                 void *user) {
  (void)self;
  clpar_status s = clpar_dev_gate_wait(clpar_dist_device(), user);
  return s == CLPAR_OK ? identity(x, y) : s;
}

static clpar_status opener_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                   void *user) {
  (void)self;
  (void)user;
  return identity(x, y);
}

/* Opener's free: the gate opens (the units were freed before it). */
static void opener_free(void *user) {
  clpar_gate_open(user, CLPAR_OK, NULL);
}

static clpar_module *make_model(clpar_gate *gate) {
  clpar_device *dev = clpar_dist_device();
  clpar_module *first[2], *outer[3], *unit0, *m, *ddp;
  clpar_manual_seed(5);
  tu_ok(clpar_module_create("Gate", gate_forward, gate, NULL, &first[0]));
  tu_ok(clpar_linear_create(IN, HID, 1, dev, &first[1]));
  tu_ok(clpar_sequential_create(first, 2, &unit0));
  outer[0] = unit0;
  tu_ok(clpar_linear_create(HID, OUT, 1, dev, &outer[1]));
  tu_ok(clpar_module_create("Opener", opener_forward, gate, opener_free, &outer[2]));
  tu_ok(clpar_sequential_create(outer, 3, &m));
  tu_ok(clpar_ddp_create(m, &(clpar_ddp_options){.zero_stage = 3}, &ddp));
  return ddp;
}

/* Frees the module (the gate opens on the way), then the gate once the queue passed it. */
static void free_model(clpar_module *ddp, clpar_gate *gate) {
  clpar_module_free(ddp);
  tu_ok(clpar_device_synchronize(clpar_dist_device()));
  clpar_gate_free(gate);
}

/* A recorded forward, no backward: the last unit's gather for the backward (prefetched at the
 * end of its forward) waits behind the gate when the units are freed. */
static void test_free_with_a_prefetched_gather_queued(void **state) {
  (void)state;
  for (int r = 0; r < REPEAT; r++) {
    clpar_gate *gate = clpar_gate_new();
    assert_non_null(gate);
    clpar_module *ddp = make_model(gate);
    clpar_tensor *x = tu_make(clpar_dist_device(), 2, (int64_t[]){ROWS, IN}, 7), *y = NULL;
    tu_ok(clpar_module_forward(ddp, x, &y));
    assert_int_equal(clpar_tensor_numel(y), ROWS * OUT);
    clpar_tensor_free(y);
    clpar_tensor_free(x);
    free_model(ddp, gate);
  }
}

/* Forward, the gate opened once, backward: the first unit's recompute waits at the gate again,
 * before the read of its gradient, so its reduce-scatter waits behind the gate when the units
 * are freed (the reduce-scatter adds into the unit's accumulated shard). */
static void test_free_with_a_reduce_scatter_queued(void **state) {
  (void)state;
  for (int r = 0; r < REPEAT; r++) {
    clpar_gate *gate = clpar_gate_new();
    assert_non_null(gate);
    clpar_module *ddp = make_model(gate);
    clpar_tensor *x = tu_make(clpar_dist_device(), 2, (int64_t[]){ROWS, IN}, 7), *y, *loss;
    tu_ok(clpar_module_forward(ddp, x, &y));
    tu_ok(clpar_mean(y, &loss));
    clpar_gate_open(gate, CLPAR_OK, NULL); /* the forward's wait */
    tu_ok(clpar_backward(loss));
    clpar_tensor_free(loss);
    clpar_tensor_free(y);
    clpar_tensor_free(x);
    free_model(ddp, gate);
  }
}

/* After the frees above, a module made, trained and gathered now gives every rank the same
 * parameters (a rank held back in those frees would keep the others waiting here). */
static void test_ranks_still_matched(void **state) {
  (void)state;
  clpar_gate *gate = clpar_gate_new();
  assert_non_null(gate);
  clpar_gate_open(gate, CLPAR_OK, NULL); /* its forward passes */
  clpar_gate_open(gate, CLPAR_OK, NULL); /* and its recompute */
  clpar_module *ddp = make_model(gate);
  clpar_zero_optimizer *opt;
  tu_ok(clpar_zero_sgd_create(ddp, &(clpar_sgd_options){.lr = 0.1f}, &opt));
  clpar_tensor *x = tu_make(clpar_dist_device(), 2, (int64_t[]){ROWS, IN},
                            9 + (uint64_t)clpar_dist_rank()),
               *y, *loss;
  tu_ok(clpar_module_forward(ddp, x, &y));
  tu_ok(clpar_mean(y, &loss));
  tu_ok(clpar_backward(loss));
  tu_ok(clpar_zero_optimizer_step(opt));
  tu_ok(clpar_zero_gather_parameters(ddp));
  enum { N = IN * HID + HID + HID * OUT + OUT };
  float *p = tu_read_params(ddp, N), hi[2 * N];
  for (int i = 0; i < N; i++) hi[i] = p[i], hi[N + i] = -p[i];
  tu_ok(clpar_dist_all_reduce_max(hi, 2 * N));
  for (int i = 0; i < N; i++)
    if (hi[i] != p[i] || hi[N + i] != -p[i])
      fail_msg("parameter %d differs across the ranks: %.9g here, in [%.9g, %.9g]", i, (double)p[i],
               (double)-hi[N + i], (double)hi[i]);
  free(p);
  clpar_tensor_free(loss);
  clpar_tensor_free(y);
  clpar_tensor_free(x);
  clpar_zero_optimizer_free(opt);
  free_model(ddp, gate);
}

/* argv[1], if given: a cmocka test filter (one case alone) */
int main(int argc, char **argv) {
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_free_with_a_prefetched_gather_queued),
      cmocka_unit_test(test_free_with_a_reduce_scatter_queued),
      cmocka_unit_test(test_ranks_still_matched),
  };
  return cmocka_run_group_tests_name("zero3_free", tests, tu_dist_setup, tu_dist_teardown);
}
