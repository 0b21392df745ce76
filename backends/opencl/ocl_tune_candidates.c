/* ocl_tune_candidates.c — the parameter sets the GEMM tuner tries for each CLBlast kernel:
 * valid ones (CLBlast's own constraints), spread over the grid, chosen by a fixed seed. */
#include <stdlib.h>

#include "ocl_tune_internal.h"

/* Sets name=value in p; 0 if p has that parameter. */
int clpar_ocl_param_set(clpar_ocl_params *p, const char *name, size_t value) {
  size_t *v = clpar_ocl_param(p, name);
  if (!v) return -1;
  *v = value;
  return 0;
}

/* Moves count candidates (or all n, if fewer) chosen at random by a fixed seed from all[0..n)
 * to out, frees all, and returns how many. */
static int pick_some(clpar_ocl_params *all, int n, clpar_ocl_params *out, int count,
                     uint64_t seed) {
  int chosen = 0;
  for (int i = 0; i < count && n > 0; i++) {
    int pick = (int)(lcg(&seed) % (uint64_t)n);
    out[chosen++] = all[pick];
    all[pick] = all[--n];
  }
  free(all);
  return chosen;
}

/* Valid Xgemm parameter sets (GEMMK 0, no strided access, local memory off: on a CPU the
 * cache is the local memory), count of them at most, spread over the grid. */
int clpar_ocl_xgemm_candidates(const clpar_ocl_params *base, size_t max_wg, clpar_ocl_params *out,
                               int count) {
  static const size_t wg[] = {16, 32, 64, 128}, kwg[] = {16, 32}, dim[] = {4, 8, 16},
                      vw[] = {1, 2, 4, 8};
  clpar_ocl_params *all = malloc(1024 * sizeof *all);
  int n = 0;
  if (!all) return 0;
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 4; b++)
      for (int c = 0; c < 2; c++)
        for (int e = 0; e < 3; e++)
          for (int f = 0; f < 3; f++)
            for (int g = 0; g < 4; g++)
              for (int h = 0; h < 4; h++) {
                size_t mwg = wg[a], nwg = wg[b], kw = kwg[c], mdimc = dim[e], ndimc = dim[f];
                size_t vwm = vw[g], vwn = vw[h];
                /* per work-item tiles above 32 values unroll into code that PoCL's LLVM
                 * takes minutes to compile, and spill */
                size_t tile = (mwg / mdimc) * (nwg / ndimc);
                if (mdimc * ndimc > max_wg || mwg % (mdimc * vwm) || nwg % (ndimc * vwn) ||
                    kw % mdimc || kw % ndimc || tile > 32 || tile < 4 || n == 1024)
                  continue;
                clpar_ocl_params p = *base;
                int bad =
                    clpar_ocl_param_set(&p, "MWG", mwg) | clpar_ocl_param_set(&p, "NWG", nwg) |
                    clpar_ocl_param_set(&p, "KWG", kw) | clpar_ocl_param_set(&p, "MDIMC", mdimc) |
                    clpar_ocl_param_set(&p, "NDIMC", ndimc) |
                    clpar_ocl_param_set(&p, "MDIMA", mdimc) |
                    clpar_ocl_param_set(&p, "NDIMB", ndimc) | clpar_ocl_param_set(&p, "VWM", vwm) |
                    clpar_ocl_param_set(&p, "VWN", vwn) | clpar_ocl_param_set(&p, "KWI", 2) |
                    clpar_ocl_param_set(&p, "SA", 0) | clpar_ocl_param_set(&p, "SB", 0) |
                    clpar_ocl_param_set(&p, "STRM", 0) | clpar_ocl_param_set(&p, "STRN", 0);
                if (clpar_ocl_param(&p, "GEMMK"))
                  bad |= clpar_ocl_param_set(&p, "GEMMK", 0) | clpar_ocl_param_set(&p, "KREG", 1);
                if (bad) {
                  free(all);
                  return 0;
                }
                all[n++] = p;
              }
  return pick_some(all, n, out, count, 12345);
}

int clpar_ocl_direct_candidates(const clpar_ocl_params *base, size_t max_wg, clpar_ocl_params *out,
                                int count) {
  static const size_t wgd[] = {8, 16, 32, 64}, dim[] = {4, 8, 16}, vw[] = {1, 2, 4, 8},
                      kwid[] = {2, 8};
  clpar_ocl_params *all = malloc(1024 * sizeof *all);
  int n = 0;
  if (!all) return 0;
  for (int a = 0; a < 4; a++)
    for (int e = 0; e < 3; e++)
      for (int f = 0; f < 3; f++)
        for (int g = 0; g < 4; g++)
          for (int h = 0; h < 4; h++)
            for (int k = 0; k < 2; k++)
              for (int pad = 0; pad < 2; pad++) {
                size_t w = wgd[a], mdimc = dim[e], ndimc = dim[f], vwm = vw[g], vwn = vw[h];
                size_t tile = (w / mdimc) * (w / ndimc);
                if (mdimc * ndimc > max_wg || w % (mdimc * vwm) || w % (ndimc * vwn) ||
                    w % kwid[k] || tile > 32 || tile < 4 || n == 1024)
                  continue;
                clpar_ocl_params p = *base;
                int bad =
                    clpar_ocl_param_set(&p, "WGD", w) | clpar_ocl_param_set(&p, "MDIMCD", mdimc) |
                    clpar_ocl_param_set(&p, "NDIMCD", ndimc) |
                    clpar_ocl_param_set(&p, "MDIMAD", mdimc) |
                    clpar_ocl_param_set(&p, "NDIMBD", ndimc) |
                    clpar_ocl_param_set(&p, "VWMD", vwm) | clpar_ocl_param_set(&p, "VWND", vwn) |
                    clpar_ocl_param_set(&p, "KWID", kwid[k]) |
                    clpar_ocl_param_set(&p, "PADA", (size_t)pad) |
                    clpar_ocl_param_set(&p, "PADB", (size_t)pad);
                if (bad) {
                  free(all);
                  return 0;
                }
                all[n++] = p;
              }
  return pick_some(all, n, out, count, 6789);
}

/* Candidates for the indirect path's helpers, from the values CLBlast's own tuners try
 * (src/tuning/kernels/copy_pad.hpp, transpose_fast.hpp, transpose_pad.hpp), within the
 * device's work-group size and local memory; words per work-item at most 8 per dimension
 * (more unrolls into code that PoCL's LLVM is slow to compile, as with Xgemm's tiles). */
int clpar_ocl_pad_candidates(const clpar_ocl_params *base, size_t max_wg, clpar_ocl_params *out,
                             int count) {
  static const size_t dim[] = {8, 16, 32}, wpt[] = {1, 2, 4};
  clpar_ocl_params *all = malloc(81 * sizeof *all);
  int n = 0;
  if (!all) return 0;
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 3; b++)
      for (int c = 0; c < 3; c++)
        for (int e = 0; e < 3; e++) {
          if (dim[a] * dim[b] > max_wg) continue;
          clpar_ocl_params p = *base;
          if (clpar_ocl_param_set(&p, "PAD_DIMX", dim[a]) |
              clpar_ocl_param_set(&p, "PAD_DIMY", dim[b]) |
              clpar_ocl_param_set(&p, "PAD_WPTX", wpt[c]) |
              clpar_ocl_param_set(&p, "PAD_WPTY", wpt[e])) {
            free(all);
            return 0;
          }
          all[n++] = p;
        }
  return pick_some(all, n, out, count, 2468);
}

int clpar_ocl_transpose_candidates(const clpar_ocl_params *base, size_t max_wg, size_t local_mem,
                                   clpar_ocl_params *out, int count) {
  static const size_t dim[] = {4, 8, 16, 32}, wpt[] = {1, 2, 4, 8};
  clpar_ocl_params *all = malloc(64 * sizeof *all);
  int n = 0;
  if (!all) return 0;
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 4; b++)
      for (size_t pad = 0; pad < 2; pad++)
        for (size_t shuffle = 0; shuffle < 2; shuffle++) {
          size_t d = dim[a], w = wpt[b];
          /* the kernel's local tile: w rows of w d values by d + pad (transpose_fast.hpp) */
          if (d * d > max_wg || sizeof(float) * w * (w * d) * (d + pad) > local_mem) continue;
          clpar_ocl_params p = *base;
          if (clpar_ocl_param_set(&p, "TRA_DIM", d) | clpar_ocl_param_set(&p, "TRA_WPT", w) |
              clpar_ocl_param_set(&p, "TRA_PAD", pad) |
              clpar_ocl_param_set(&p, "TRA_SHUFFLE", shuffle)) {
            free(all);
            return 0;
          }
          all[n++] = p;
        }
  return pick_some(all, n, out, count, 1357);
}

int clpar_ocl_padtranspose_candidates(const clpar_ocl_params *base, size_t max_wg, size_t local_mem,
                                      clpar_ocl_params *out, int count) {
  static const size_t tile[] = {8, 16, 32}, wpt[] = {1, 2, 4, 8};
  clpar_ocl_params *all = malloc(24 * sizeof *all);
  int n = 0;
  if (!all) return 0;
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 4; b++)
      for (size_t pad = 0; pad < 2; pad++) {
        size_t tl = tile[a], w = wpt[b];
        if (tl * tl > max_wg || sizeof(float) * (tl * w) * (tl * w + pad) > local_mem) continue;
        clpar_ocl_params p = *base;
        if (clpar_ocl_param_set(&p, "PADTRA_TILE", tl) | clpar_ocl_param_set(&p, "PADTRA_WPT", w) |
            clpar_ocl_param_set(&p, "PADTRA_PAD", pad)) {
          free(all);
          return 0;
        }
        all[n++] = p;
      }
  return pick_some(all, n, out, count, 97531);
}
