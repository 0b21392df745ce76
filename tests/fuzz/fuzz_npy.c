/* fuzz_npy.c — libFuzzer target for the .npy reader (src/io/npy.c): any bytes either parse,
 * with the data exactly as long as the shape says, or give CLPAR_ERROR_CORRUPT (or
 * OUT_OF_MEMORY); never a crash, a leak or undefined behaviour. The bytes are read through a
 * memory stream (fmemopen), so the same code as for a file runs. Built with clang
 * (-fsanitize=fuzzer) by scripts/fuzz.sh; fuzz_main.c replays it in the ordinary suite. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *buf = malloc(size ? size : 1); /* fmemopen wants a writable buffer */
  if (!buf) return 0;
  if (size) memcpy(buf, data, size);
  FILE *f = fmemopen(buf, size ? size : 1, "rb");
  if (!f) {
    free(buf);
    return 0;
  }
  clpar_npy_array a;
  clpar_status s = clpar_npy_read_stream("fuzz", f, (int64_t)size, &a);
  fclose(f);
  free(buf);
  if (s != CLPAR_OK) {
    if (s != CLPAR_ERROR_CORRUPT && s != CLPAR_ERROR_OUT_OF_MEMORY) abort();
    return 0;
  }
  int64_t numel = 1;
  for (int i = 0; i < a.ndim; i++) {
    if (a.shape[i] < 0) abort();
    numel *= a.shape[i];
  }
  size_t item = a.dtype == CLPAR_NPY_I64 ? 8 : 4;
  if (numel != a.numel || (size_t)numel * item > size) abort(); /* the data fits the input */
  volatile uint8_t sink = 0;
  if (numel) sink ^= ((const uint8_t *)a.data)[(size_t)numel * item - 1]; /* in bounds */
  (void)sink;
  clpar_npy_array_free(&a);
  return 0;
}
