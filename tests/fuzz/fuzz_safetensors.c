/* fuzz_safetensors.c — libFuzzer target for the safetensors reader (src/io/safetensors.c):
 * any bytes either parse, with every tensor's bytes inside the buffer and the counts
 * consistent, or give CLPAR_ERROR_CORRUPT; never a crash, a leak or undefined behaviour.
 * Built with clang (-fsanitize=fuzzer) by scripts/fuzz.sh; fuzz_main.c runs the same target
 * over the seed corpus and every kept crash in the ordinary test suite. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *buf = malloc(size ? size : 1);
  if (!buf) return 0;
  if (size) memcpy(buf, data, size);
  clpar_st_file f;
  clpar_status s = clpar_st_parse("fuzz", buf, size, &f);
  if (s != CLPAR_OK) {
    if (s != CLPAR_ERROR_CORRUPT && s != CLPAR_ERROR_OUT_OF_MEMORY) abort();
    free(buf);
    return 0;
  }
  uint64_t covered = 0;
  volatile uint8_t sink = 0;
  for (int i = 0; i < f.n; i++) {
    const clpar_st_tensor *t = &f.tensors[i];
    if (t->data < f.buf || t->end < t->begin) abort();
    if (t->end > t->begin) sink ^= t->data[0] ^ t->data[t->end - t->begin - 1]; /* in bounds */
    covered += t->end - t->begin;
    if (clpar_st_find(&f, t->name) < 0) abort();
  }
  uint64_t header;
  memcpy(&header, f.buf, 8);
  if (8 + header + covered != f.size) abort(); /* the data covers the file exactly */
  (void)sink;
  clpar_st_free(&f); /* frees buf */
  return 0;
}
