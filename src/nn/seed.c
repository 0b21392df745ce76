/* seed.c — the seed state of parameter initialization (clpar_manual_seed): every new
 * parameter draws a stream of its own from it, so that a model is the same after the same
 * seed. */
#include "internal.h"

static uint64_t seed_base = 0x5EED;
static uint64_t seed_counter;

void clpar_manual_seed(uint64_t seed) {
  __atomic_store_n(&seed_base, seed, __ATOMIC_RELAXED);
  __atomic_store_n(&seed_counter, 0, __ATOMIC_RELAXED);
}

void clpar_rng_state_get(uint64_t *seed, uint64_t *counter) {
  *seed = __atomic_load_n(&seed_base, __ATOMIC_RELAXED);
  *counter = __atomic_load_n(&seed_counter, __ATOMIC_RELAXED);
}

void clpar_rng_state_set(uint64_t seed, uint64_t counter) {
  __atomic_store_n(&seed_base, seed, __ATOMIC_RELAXED);
  __atomic_store_n(&seed_counter, counter, __ATOMIC_RELAXED);
}

/* A fresh stream for the next parameter initialization: deterministic after manual_seed. */
uint64_t clpar_param_seed_next(void) {
  uint64_t c = __atomic_fetch_add(&seed_counter, 1, __ATOMIC_RELAXED);
  return __atomic_load_n(&seed_base, __ATOMIC_RELAXED) * 0x9E3779B97F4A7C15ull + c + 1;
}
