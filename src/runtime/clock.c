/* clock.c — the library's one clock (clpar_clock_seconds, declared in backend.h so that
 * backends reach it too): monotonic, so that deadlines and timings do not jump with the
 * wall clock. */
#include <time.h>

#include "backend.h"

double clpar_clock_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
