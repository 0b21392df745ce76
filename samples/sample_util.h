/* sample_util.h — what the ResNet samples share: a wall clock, random images (normal noise from
 * a small xorshift64* generator: the samples' data needs no quality beyond that) and a status
 * check that prints clpar's message. */
#ifndef CLPAR_SAMPLE_UTIL_H
#define CLPAR_SAMPLE_UTIL_H

#include <clpar/clpar.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double uniform(void) { /* xorshift64* in [0, 1) */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}

/* n standard normal values (Box-Muller, two at a time). */
static void randn(float *x, size_t n) {
  for (size_t i = 0; i < n; i += 2) {
    double r = sqrt(-2 * log(1 - uniform())), a = 6.283185307179586 * uniform();
    x[i] = (float)(r * cos(a));
    if (i + 1 < n) x[i + 1] = (float)(r * sin(a));
  }
}

static int check(clpar_status s, const char *what) {
  if (s != CLPAR_OK)
    fprintf(stderr, "%s: %s: %s\n", what, clpar_status_name(s), clpar_last_error());
  return s == CLPAR_OK;
}

#endif
