/* rng.c — the counter-based generator behind every random tensor: value i of seed s is a
 * pure function of (s, i), computed on the host, so every backend gets the same numbers and
 * a view of rows gets the same values as the whole tensor would. */
#include "internal.h"

static uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

float clpar_rng_uniform01(uint64_t seed, uint64_t index) {
  uint64_t h = splitmix64(splitmix64(seed) ^ (index * 0xD1B54A32D192ED03ull));
  return (float)(h >> 40) * (1.0f / 16777216.0f); /* 24 bits: exact in float, in [0, 1) */
}
