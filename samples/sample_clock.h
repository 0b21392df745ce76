/* sample_clock.h — a monotonic clock in seconds for the programs built on clpar's public API:
 * the samples (sample_util.h), the benchmarks (bench/bench_util.h) and clpar-tune. */
#ifndef CLPAR_SAMPLE_CLOCK_H
#define CLPAR_SAMPLE_CLOCK_H

#include <time.h>

static inline double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
