/* peer_copy.c — a copy between two OpenCL devices of one platform, through host staging (each
 * device in a context of its own: CLPAR_OPENCL_CONTEXT=device) against the peer copy of a
 * shared context (CLPAR_OPENCL_CONTEXT=platform), in one run: the library is shut down and
 * started again with the other setting between rounds, which alternate, and the best round
 * of each counts. For each size and setting one JSON object: the time of one copy waited for
 * (posted, then the destination synchronized) and of a stream of copies posted back to back
 * (one synchronize at the end), per copy, with the bandwidth, and the peer copies counted.
 *
 *   POCL_DEVICES="pthread pthread" ./bench_peer_copy [rounds]
 *
 * Needs two OpenCL devices of one platform, selected (CLPAR_DEVICES) or by default. */
#include <clpar/clpar.h>

#include "bench_util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { STREAM = 16, SINGLE = 8 };

typedef struct {
  double single, stream; /* seconds per copy, best round */
  uint64_t peer;         /* peer copies counted on the destination, last round */
} result;

/* The first two selected OpenCL devices; 0 (said on stderr) when there are fewer. */
static int pick(clpar_device **a, clpar_device **b) {
  int n = 0;
  for (int i = 0; i < clpar_device_count() && n < 2; i++) {
    clpar_device_info info;
    if (clpar_device_get_info(clpar_device_get(i), &info) == CLPAR_OK &&
        strcmp(info.backend, "opencl") == 0)
      *(n++ ? b : a) = clpar_device_get(i);
  }
  if (n < 2) fprintf(stderr, "bench_peer_copy: needs two OpenCL devices\n");
  return n == 2;
}

/* One round in mode ("device" or "platform") for size bytes; 0 on failure. */
static int round_once(const char *mode, size_t bytes, result *r) {
  if (setenv("CLPAR_OPENCL_CONTEXT", mode, 1) != 0 || !bench_ok(clpar_init(), "clpar_init"))
    return 0;
  clpar_device *a, *b;
  clpar_tensor *src = NULL, *dst = NULL;
  int64_t shape[] = {(int64_t)(bytes / sizeof(float))};
  int good = pick(&a, &b) && bench_ok(clpar_tensor_zeros(a, 1, shape, &src), "zeros") &&
             bench_ok(clpar_tensor_zeros(b, 1, shape, &dst), "zeros");
  for (int i = 0; good && i < 3; i++) /* warm-up: staging blocks of this size */
    good = bench_ok(clpar_copy(dst, src), "copy") && bench_ok(clpar_device_synchronize(b), "sync");
  clpar_device_counters c0, c1;
  good = good && bench_ok(clpar_device_counters_get(b, &c0), "counters");
  double t0 = now_seconds();
  for (int i = 0; good && i < SINGLE; i++)
    good = bench_ok(clpar_copy(dst, src), "copy") && bench_ok(clpar_device_synchronize(b), "sync");
  double t1 = now_seconds();
  for (int i = 0; good && i < STREAM; i++) good = bench_ok(clpar_copy(dst, src), "copy");
  good = good && bench_ok(clpar_device_synchronize(b), "sync");
  double t2 = now_seconds();
  good = good && bench_ok(clpar_device_counters_get(b, &c1), "counters");
  if (good) {
    double single = (t1 - t0) / SINGLE, stream = (t2 - t1) / STREAM;
    if (r->single == 0 || single < r->single) r->single = single;
    if (r->stream == 0 || stream < r->stream) r->stream = stream;
    r->peer = c1.peer_copies - c0.peer_copies;
  }
  clpar_tensor_free(src);
  clpar_tensor_free(dst);
  clpar_shutdown();
  return good;
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 5;
  if (rounds < 1) rounds = 1;
  static const size_t sizes[] = {(size_t)4 << 20, (size_t)64 << 20};
  static const char *modes[] = {"device", "platform"};
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
    result res[2] = {{0, 0, 0}, {0, 0, 0}};
    for (int r = 0; r < rounds; r++)
      for (int m = 0; m < 2; m++)
        if (!round_once(modes[(m + r) % 2], sizes[si], &res[(m + r) % 2])) return 1;
    for (int m = 0; m < 2; m++) {
      double mib = (double)sizes[si] / (1 << 20);
      printf(
          "{\"bench\":\"peer_copy\",\"bytes\":%zu,\"context\":\"%s\",\"path\":\"%s\","
          "\"ms_per_copy_waited\":%.3f,\"ms_per_copy_streamed\":%.3f,"
          "\"gib_per_s_streamed\":%.2f,\"peer_copies_per_round\":%llu,"
          "\"streamed_speedup_vs_staging\":%.2f,\"rounds\":%d}\n",
          sizes[si], modes[m], m ? "peer" : "staging", res[m].single * 1e3, res[m].stream * 1e3,
          mib / 1024 / res[m].stream, (unsigned long long)res[m].peer,
          res[0].stream / res[m].stream, rounds);
    }
  }
  return 0;
}
