/* ocl_conv_algo.h — private to the OpenCL backend: its whole forward and backward convolution
 * (backend.h's conv2d entries) and how each picks an algorithm per layer shape. Tests include
 * it to force and inspect the choice.
 *
 * Algorithms: im2col + GEMM (ocl_conv_algo.c: columns in a chunked buffer, CLBlast or
 * gemm_tile.cl), an implicit GEMM (kernels/opencl/conv_implicit.cl: the columns gathered
 * into local memory, tile sizes as build options) and, for 3x3 stride-1 undilated ungrouped
 * layers, Winograd's F(2x2, 3x3) (ocl_conv_winograd.c), and for ungrouped layers CLBlast's
 * own convolution (CLBlastSconvgemm, ocl_gemm.c). Per shape the entry takes what
 * CLPAR_OCL_CONV forces (im2col, implicit, winograd, convgemm; auto or unset: choose; a forced
 * algorithm that cannot run the shape falls back to im2col), else the choice cached for the
 * device, else it times each on the call's own data once and caches the fastest. Choices
 * and the implicit kernel's tiles are kept per device and driver in a trusted file of the
 * cache directory (ocl_conv_cache.c), read once when the device first convolves. The backward
 * passes (ocl_conv_bwd.c) choose the same way among their own algorithms (CLPAR_OCL_CONV_BWD
 * forces one), cached in the same entry. */
#ifndef CLPAR_OCL_CONV_ALGO_H
#define CLPAR_OCL_CONV_ALGO_H

#include "ocl_internal.h"

typedef enum {
  CLPAR_OCL_CONV_AUTO = 0,
  CLPAR_OCL_CONV_IM2COL = 1,
  CLPAR_OCL_CONV_IMPLICIT = 2,
  CLPAR_OCL_CONV_WINOGRAD = 3,
  CLPAR_OCL_CONV_CONVGEMM = 4, /* the forward only */
  CLPAR_OCL_CONV_ALGOS = 5,
  CLPAR_OCL_CONV_BWD_ALGOS = 4 /* the backward passes' algorithms are those below convgemm */
} clpar_ocl_conv_algo;

/* The implicit GEMM's tiles (conv_implicit.cl's CI_TM, CI_TN, CI_TK, CI_WM, CI_WN). */
typedef struct {
  unsigned tm, tn, tk, wm, wn;
} clpar_ocl_conv_tiles;

/* The default tiles: 64 x 64 tiles, 16 deep, 4 x 4 per work-item. The one definition: the
 * tiled files (conv_implicit.cl, conv_bwd.cl) have none and take theirs from the build options
 * (clpar_ocl_conv_tile_options). */
#define CLPAR_OCL_CONV_DEFAULT_TILES \
  { 64, 64, 16, 4, 4 }

/* Build options for a tiled file: CLPAR_OCL_BUILD_OPTIONS and t's CI_* defines (t NULL: the
 * default tiles), into buf (256 bytes hold them). */
void clpar_ocl_conv_tile_options(const clpar_ocl_conv_tiles *t, char *buf, size_t size);
/* 1 for a file whose kernels need the CI_* tile options (conv_implicit.cl, conv_bwd.cl). */
int clpar_ocl_conv_tiled_file(const char *file);

/* The tiled kernels, each with tiles of its own (the backward passes' default to the
 * forward's): the forward's conv_implicit_f32, conv_bwd.cl's data and weights kernels. */
enum { CLPAR_OCL_TILES_FWD = 0, CLPAR_OCL_TILES_DATA = 1, CLPAR_OCL_TILES_WEIGHT = 2 };
#define CLPAR_OCL_TILED_KINDS 3

/* What the entry did on a device, for tests and benches. */
typedef struct {
  uint64_t measured;                    /* shapes timed */
  uint64_t runs[CLPAR_OCL_CONV_ALGOS];  /* convolutions run (their last, kept run) per algorithm */
  uint64_t timed[CLPAR_OCL_CONV_ALGOS]; /* shapes each algorithm was timed on when measured */
  uint64_t disk_loads;                  /* entries read and accepted */
  uint64_t disk_rejects;                /* entries read and refused */
  uint64_t bwd_measured;                /* shapes whose backward passes were timed */
  uint64_t bwd_runs[2][CLPAR_OCL_CONV_ALGOS]; /* backward runs: [0] data, [1] weights */
} clpar_ocl_conv_stats;

/* The floats im2col's column buffer may take per chunk of images (16 Mi: 64 MiB, or one
 * image's when that is more); Winograd's transformed input and output take twice that. Tests
 * lower it to run several chunks. */
extern size_t clpar_ocl_conv_chunk_floats;
/* How many of n images a chunk holds when each takes per_image floats of a buffer of scale
 * times clpar_ocl_conv_chunk_floats: at least 1, at most n. */
size_t clpar_ocl_conv_chunk_images(size_t per_image, size_t scale, size_t n);

/* "im2col", "implicit", "winograd", "convgemm" ("auto" for CLPAR_OCL_CONV_AUTO). */
const char *clpar_ocl_conv_algo_name(int algo);
/* The algorithm below algos (CLPAR_OCL_CONV_ALGOS for the forward, CLPAR_OCL_CONV_BWD_ALGOS for
 * the backward) that the environment variable var (CLPAR_OCL_CONV, CLPAR_OCL_CONV_BWD) forces
 * into *algo (CLPAR_OCL_CONV_AUTO when unset or "auto"); CLPAR_ERROR_INVALID_ARGUMENT naming
 * var when it names none of them. */
clpar_status clpar_ocl_conv_forced(const char *var, int algos, int *algo);
/* 0 when tiles t can be built and launched on d (divisibility, work-group size, local memory),
 * else -1 with the offending field in *bad. */
int clpar_ocl_conv_tiles_check(const clpar_ocl_device *d, const clpar_ocl_conv_tiles *t,
                               const char **bad);
/* The tiles d runs the implicit GEMM with: its saved ones, else the defaults for its kind. */
clpar_ocl_conv_tiles clpar_ocl_conv_tiles_of(clpar_ocl_device *d);
/* The tiles d runs tiled kernel kind (CLPAR_OCL_TILES_*) with: its saved ones, else (for a
 * backward pass) the forward's as clpar_ocl_conv_tiles_of. */
clpar_ocl_conv_tiles clpar_ocl_conv_kind_tiles_of(clpar_ocl_device *d, int kind);
/* 1 when the implicit GEMM can run shape s (sizes fit its 32-bit indices). */
int clpar_ocl_conv_implicit_fits(const clpar_conv2d_shape *s);

/* 1 when CLBlast's convgemm can run s: one group, and every size its kernels index with 32-bit
 * ints fits (x, y, the weights, and the column buffer of the CLBlast versions that lay out
 * columns first). The buffers' offsets are checked when it runs (too far: im2col runs). */
int clpar_ocl_conv_convgemm_fits(const clpar_conv2d_shape *s);

/* ---- Winograd F(2x2, 3x3) (ocl_conv_winograd.c) ---- */

/* 1 when s is a 3x3, stride-1, undilated, ungrouped convolution whose sizes fit. */
int clpar_ocl_conv_winograd_fits(const clpar_conv2d_shape *s);
clpar_status clpar_ocl_conv_winograd(clpar_ocl_device *d, const clpar_conv2d_shape *s, clpar_bref x,
                                     clpar_bref wt, clpar_bref bias, clpar_bref y);

/* ---- the backward passes (ocl_conv_bwd.c) ---- */

/* 1 when backward data of s runs as Winograd's forward on the rotated filter: s is 3x3, stride
 * 1, undilated, ungrouped, padding at most 2, and that forward fits. */
int clpar_ocl_conv_bwd_winograd_fits(const clpar_conv2d_shape *s);
/* d's kernel name of the embedded OpenCL file for tiles t, kept under kind (0: the forward's
 * implicit GEMM), built with the tiles as -D options; UNSUPPORTED when the driver allows fewer
 * work-items for it than the tiles need (ocl_conv_algo.c). */
clpar_status clpar_ocl_conv_tiled_kernel(clpar_ocl_device *d, int kind, const char *file,
                                         const char *name, const clpar_ocl_conv_tiles *t,
                                         cl_kernel *out);
/* d's tiled kernel of kind (CLPAR_OCL_TILES_*) for tiles t, as clpar_ocl_conv_tiled_kernel. */
clpar_status clpar_ocl_conv_kind_kernel(clpar_ocl_device *d, int kind,
                                        const clpar_ocl_conv_tiles *t, cl_kernel *out);
/* Seconds one run of backward pass kind (CLPAR_OCL_TILES_DATA into dx, CLPAR_OCL_TILES_WEIGHT
 * into dw) by algo (tiles t for the implicit GEMM, NULL for the others) takes on s into out: best
 * of two after one untimed run; negative when it failed (its error set). Waits for the device. */
double clpar_ocl_conv_bwd_time(clpar_ocl_device *d, int kind, int algo,
                               const clpar_ocl_conv_tiles *t, const clpar_conv2d_shape *s,
                               clpar_bref x, clpar_bref wt, clpar_bref gy, clpar_bref out);
/* The kernels of conv_bwd.cl kept per tiles beside the forward's (kind 1 data, 2 weights). */
cl_kernel clpar_ocl_conv_kernel_find_kind(clpar_ocl_device *d, int kind,
                                          const clpar_ocl_conv_tiles *t);
void clpar_ocl_conv_kernel_keep_kind(clpar_ocl_device *d, int kind, const clpar_ocl_conv_tiles *t,
                                     cl_kernel k);
/* The backward algorithms cached for s on d (CLPAR_OCL_CONV_AUTO each where none is). */
void clpar_ocl_conv_bwd_cached(clpar_ocl_device *d, const clpar_conv2d_shape *s, int *data,
                               int *weight);
/* Caches the backward choices for s that are not CLPAR_OCL_CONV_AUTO; save as below. */
void clpar_ocl_conv_bwd_remember(clpar_ocl_device *d, const clpar_conv2d_shape *s, int data,
                                 int weight, int save);
/* Counts one backward run of algo for pass (0 data, 1 weights), or one timing. */
void clpar_ocl_conv_bwd_count(clpar_ocl_device *d, int pass, int algo, int measured);
CLPAR_OCL_ENTRY_DECL_(conv2d_backward)

/* ---- the per-device cache (ocl_conv_cache.c) ---- */

/* The algorithm cached for s on d (the implicit GEMM's tiles into *tiles), or
 * CLPAR_OCL_CONV_AUTO when none is. Reads the device's saved entry the first time (unless
 * CLPAR_TUNE=off). */
int clpar_ocl_conv_cached(clpar_ocl_device *d, const clpar_conv2d_shape *s,
                          clpar_ocl_conv_tiles *tiles);
/* Caches algo (with tiles, for the implicit GEMM) for s on d; save: also rewrites the
 * device's entry on disk (a failure to write is a warning: the choice stays in memory). */
void clpar_ocl_conv_remember(clpar_ocl_device *d, const clpar_conv2d_shape *s, int algo,
                             const clpar_ocl_conv_tiles *tiles, int save);
/* Sets d's tiles (checked: CLPAR_ERROR_INVALID_ARGUMENT if they cannot run); save as above. */
clpar_status clpar_ocl_conv_set_tiles(clpar_ocl_device *d, const clpar_ocl_conv_tiles *t, int save);
/* Sets d's tiles for tiled kernel kind (CLPAR_OCL_TILES_*), as clpar_ocl_conv_set_tiles. */
clpar_status clpar_ocl_conv_set_kind_tiles(clpar_ocl_device *d, int kind,
                                           const clpar_ocl_conv_tiles *t, int save);
/* Forgets every cached choice and tile of d, and whether its entry was read (as a new process
 * would start). */
void clpar_ocl_conv_forget(clpar_ocl_device *d);
/* The entry file for d (whether or not it exists); -1 when there is no usable directory. */
int clpar_ocl_conv_path(clpar_ocl_device *d, char *path, size_t size);
void clpar_ocl_conv_stats_get(clpar_ocl_device *d, clpar_ocl_conv_stats *out);
/* Counts one run of algo (ocl_conv_algo.c) or one timing (a shape measured). */
void clpar_ocl_conv_count(clpar_ocl_device *d, int algo, int measured);
/* Counts one shape that algo was timed on. */
void clpar_ocl_conv_count_timed(clpar_ocl_device *d, int algo);
/* The forward implicit GEMM's kernel with tiles t built for d earlier, or NULL. */
cl_kernel clpar_ocl_conv_kernel_find(clpar_ocl_device *d, const clpar_ocl_conv_tiles *t);
/* Frees d's convolution state (at device destroy). */
void clpar_ocl_conv_state_free(clpar_ocl_device *d);

/* ---- the entry (ocl_conv_algo.c) ---- */
CLPAR_OCL_ENTRY_DECL_(conv2d)
/* Seconds one run of algo (tiles t for the implicit GEMM) takes on s into y: best of two after
 * one untimed run, or the first when that took over cut seconds (cut > 0; for the implicit
 * GEMM, whose kernel is built first, and for convgemm once CLBlast has compiled it on d, the
 * untimed run's); negative when it failed (its error set). Waits for the device. */
double clpar_ocl_conv_time(clpar_ocl_device *d, int algo, const clpar_ocl_conv_tiles *t,
                           clpar_conv2d_shape s, clpar_bref x, clpar_bref wt, clpar_bref bias,
                           clpar_bref y, double cut);

/* ---- tuning the tiled kernels' tiles (ocl_conv_tune.c) ---- */
typedef struct {
  double before, after;       /* seconds over the tune shapes: the tiles in force, the kept */
  int tried, failed;          /* candidates; failed: build or launch error, or wrong results */
  int unrunnable;             /* candidates skipped: built, their kernel needs more registers
                                 than a work-group of their size has (a GPU's limit) */
  clpar_ocl_conv_tiles tiles; /* the device's tiles now */
} clpar_ocl_conv_tune_result;
/* The shapes the tile tuner times (*n of them; ResNet-50 layers, conv1's included). */
const clpar_conv2d_shape *clpar_ocl_conv_tune_shapes(int *n);
/* Times up to tries tile candidates for tiled kernel kind (CLPAR_OCL_TILES_*: the forward, or
 * a backward pass) on the tune shapes, checking each against im2col's result of
 * the same pass, and keeps (and saves) the fastest as d's tiles for kind if it beats those in
 * force. Takes d->lock for each command: call without holding it. */
clpar_status clpar_ocl_conv_tune(clpar_ocl_device *d, int kind, int tries,
                                 clpar_ocl_conv_tune_result *r);

#endif
