/* bench_util.h — what the benchmarks share: a monotonic clock and a status check that says
 * what failed on stderr (stdout carries only the JSON figures). */
#ifndef CLPAR_BENCH_UTIL_H
#define CLPAR_BENCH_UTIL_H

#include <clpar/clpar.h>
#include <stdio.h>
#include <time.h>

static inline double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int bench_ok(clpar_status s, const char *what) {
  if (s != CLPAR_OK)
    fprintf(stderr, "%s: %s: %s\n", what, clpar_status_name(s), clpar_last_error());
  return s == CLPAR_OK;
}

#endif
