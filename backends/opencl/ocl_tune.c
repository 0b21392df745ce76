/* ocl_tune.c — CLBlast's GEMM tuned for the device at hand, and kept.
 *
 * CLBlast picks kernel parameters from a database of devices it has seen; a CPU under PoCL
 * gets generic ones (about 28 GFLOP/s at n = 1024 here, where tuned ones give 2-3x). The tuner
 * times whole CLBlastSgemm calls on the shapes a model runs, with candidate parameters for
 * the indirect kernel (Xgemm), the kernels its path pads and transposes the matrices with
 * (Pad, Transpose, Padtranspose: each candidate against the one kept, in alternating turns),
 * the direct one (XgemmDirect) and the size where CLBlast switches between them
 * (GemmRoutine), each set through CLBlastOverrideParameters. Every candidate's
 * result is checked against double-precision dot products at sampled positions (C is filled
 * with NaN first, so a kernel that skips elements fails too); a candidate that fails to build,
 * errors or computes wrong values is dropped. The fastest combination is kept only if it beats
 * CLBlast's own parameters.
 *
 * The result is a small text file in the cache directory (CLPAR_CACHE_DIR), named after a hash
 * of the device, driver, platform and CLBlast version, which it also repeats. It is read and
 * written with the trusted-file helpers (src/trusted_file.c: the user's own private directory,
 * regular files of the user's only, atomic replacement), since CLBlast compiles and runs what
 * its parameters say. A stale entry (another driver), a corrupt one or one the helpers refuse
 * is ignored with a warning, as is one whose values CLBlast could not run (params_check).
 * clpar_ocl_tune_apply reads it when a device is opened. */
#include <clblast_c.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ocl_tune.h"

#ifndef CLPAR_CLBLAST_VERSION
#define CLPAR_CLBLAST_VERSION "unknown"
#endif
#define TUNE_FORMAT "clpar-tune 2"
#define TUNE_MAX_FILE 16384
#define TUNE_MAX_VALUE ((size_t)1 << 20)
#define SAMPLES 48
/* Candidates per kernel when the caller does not say: Xgemm, XgemmDirect, and each of the
 * indirect path's pad and transpose kernels. Each costs a compilation of CLBlast's GEMM
 * program (on PoCL 10-20 s for Xgemm's and the helpers', 20-40 s for XgemmDirect's, which
 * has four kernels), so a default run on the MLP of bench/train_step takes about 10 minutes
 * on 2 busy cores. */
#define DEFAULT_XGEMM_CANDIDATES 16
#define DEFAULT_DIRECT_CANDIDATES 8
#define DEFAULT_HELPER_CANDIDATES 4

/* CLBlast's names (its database's) for the kernels its GEMM runs: the indirect kernel, the
 * direct one, the switch-over size between them, and the indirect path's helpers that pad
 * (CopyPadMatrix, and CopyMatrix when C is copied back), transpose whole tiles
 * (TransposeMatrixFast) and transpose with padding (TransposePadMatrix, TransposeMatrix).
 * "Copy" (CopyMatrixFast) is not here: a real-valued GEMM never runs it (it is chosen only
 * where the source needs neither padding nor transposing, and then the GEMM copies nothing),
 * so it keeps CLBlast's parameters. */
static const char *const kernels[] = {"Xgemm", "XgemmDirect", "GemmRoutine",
                                      "Pad",   "Transpose",   "Padtranspose"};
enum { K_XGEMM, K_DIRECT, K_ROUTINE, K_PAD, K_TRA, K_PADTRA, K_COUNT };
/* A parameter each kernel must have in this CLBlast, or the tuner refuses to run. */
static const char *const kernel_key[] = {"MWG",      "WGD",     "XGEMM_MIN_INDIRECT_SIZE",
                                         "PAD_DIMX", "TRA_DIM", "PADTRA_TILE"};

/* ---- the entry: which device it is for, and the parameters ---- */

static void clean(char *dst, size_t size, const char *src) {
  snprintf(dst, size, "%s", src);
  for (char *p = dst; *p; p++)
    if (*p == '\n' || *p == '\r') *p = ' ';
}

/* The header lines an entry for d starts with. */
static void entry_header(clpar_ocl_device *d, char *out, size_t size) {
  char name[256], driver[128], pname[256], pversion[256];
  clean(name, sizeof name, d->dev_name);
  clean(driver, sizeof driver, d->driver_version);
  clean(pname, sizeof pname, d->platform_name);
  clean(pversion, sizeof pversion, d->platform_version);
  snprintf(out, size, "%s\ndevice %s\ndriver %s\nplatform %s %s\nclblast %s\n", TUNE_FORMAT, name,
           driver, pname, pversion, CLPAR_CLBLAST_VERSION);
}

/* The entry's file name: tune-<hash of the header>.txt. */
static void entry_name(clpar_ocl_device *d, char *name, size_t size) {
  char header[1200];
  entry_header(d, header, sizeof header);
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (const char *p = header; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  snprintf(name, size, "tune-%016llx.txt", (unsigned long long)h);
}

int clpar_ocl_tune_path(clpar_ocl_device *d, char *path, size_t size) {
  char dir[4096], name[64];
  int fd;
  if (clpar_cache_dir_open(dir, sizeof dir, &fd) != CLPAR_OK) return -1;
  close(fd);
  entry_name(d, name, sizeof name);
  int n = snprintf(path, size, "%s/%s", dir, name);
  return n < 0 || (size_t)n >= size ? -1 : 0;
}

static int params_apply(cl_device_id dev, int kernel, const clpar_ocl_params *p) {
  const char *names[CLPAR_OCL_MAX_PARAMS];
  for (int i = 0; i < p->n; i++) names[i] = p->name[i];
  return CLBlastOverrideParameters(dev, kernels[kernel], CLBlastPrecisionSingle, (size_t)p->n,
                                   names, p->value) == CLBlastSuccess
             ? 0
             : -1;
}

static size_t *param(clpar_ocl_params *p, const char *name) {
  for (int i = 0; i < p->n; i++)
    if (strcmp(p->name[i], name) == 0) return &p->value[i];
  return NULL;
}

/* CLBlast's own parameters per device, taken before any entry is applied. */
typedef struct defaults_entry {
  cl_device_id dev;
  clpar_ocl_params k[K_COUNT];
  struct defaults_entry *next;
} defaults_entry;
static defaults_entry *defaults_list;
static pthread_mutex_t defaults_lock = PTHREAD_MUTEX_INITIALIZER;

/* 0 and out filled when CLBlast's defaults for dev are known (taken now if first asked). */
static int defaults_get(cl_device_id dev, clpar_ocl_params out[K_COUNT]) {
  pthread_mutex_lock(&defaults_lock);
  defaults_entry *e = defaults_list;
  while (e && e->dev != dev) e = e->next;
  if (!e && (e = calloc(1, sizeof *e))) {
    int ok = 1;
    for (int k = 0; k < K_COUNT && ok; k++)
      ok = clpar_ocl_clblast_params(dev, kernels[k], &e->k[k]) == 0 && e->k[k].n > 0;
    if (ok) {
      e->dev = dev;
      e->next = defaults_list;
      defaults_list = e;
    } else {
      free(e);
      e = NULL;
    }
  }
  if (e) memcpy(out, e->k, sizeof e->k);
  pthread_mutex_unlock(&defaults_lock);
  return e ? 0 : -1;
}

/* ---- what CLBlast can run: an entry's values are checked before they are applied ---- */

typedef struct {
  const char *nonzero[12];    /* divisors in CLBlast's host code or its kernels */
  const char *vector[2];      /* vector widths: 1, 2, 4, 8 or 16 */
  const char *flag[4];        /* 0 or 1 */
  const char *wg[2];          /* the work-group is wg[0] x wg[1] (wg[1] NULL: wg[0] squared) */
  const char *multiple[2][3]; /* [0] a multiple of [1] x [2] */
} kernel_rules;

static const kernel_rules rules[K_COUNT] = {
    [K_XGEMM] = {{"MWG", "NWG", "KWG", "MDIMC", "NDIMC", "MDIMA", "NDIMB", "KWI", "VWM", "VWN",
                  "KREG"},
                 {"VWM", "VWN"},
                 {"SA", "SB", "STRM", "STRN"},
                 {"MDIMC", "NDIMC"},
                 {{"MWG", "MDIMC", "VWM"}, {"NWG", "NDIMC", "VWN"}}},
    [K_DIRECT] = {{"WGD", "MDIMCD", "NDIMCD", "MDIMAD", "NDIMBD", "KWID", "VWMD", "VWND"},
                  {"VWMD", "VWND"},
                  {"PADA", "PADB"},
                  {"MDIMCD", "NDIMCD"},
                  {{"WGD", "MDIMCD", "VWMD"}, {"WGD", "NDIMCD", "VWND"}}},
    [K_ROUTINE] = {{NULL}, {NULL}, {NULL}, {NULL}, {{NULL}}},
    [K_PAD] = {{"PAD_DIMX", "PAD_DIMY", "PAD_WPTX", "PAD_WPTY"},
               {NULL},
               {NULL},
               {"PAD_DIMX", "PAD_DIMY"},
               {{NULL}}},
    [K_TRA] =
        {{"TRA_DIM", "TRA_WPT"}, {"TRA_WPT"}, {"TRA_PAD", "TRA_SHUFFLE"}, {"TRA_DIM"}, {{NULL}}},
    [K_PADTRA] = {{"PADTRA_TILE", "PADTRA_WPT"}, {NULL}, {"PADTRA_PAD"}, {"PADTRA_TILE"}, {{NULL}}},
};

/* The value of name in p, or dflt when this CLBlast has no such parameter. */
static size_t value_or(const clpar_ocl_params *p, const char *name, size_t dflt) {
  for (int i = 0; i < p->n; i++)
    if (strcmp(p->name[i], name) == 0) return p->value[i];
  return dflt;
}

/* 0 when kernel's parameters p are ones CLBlast can compile and launch on a device with
 * max_wg work-items per group and local_mem bytes of local memory (a zero divisor would be a
 * division by zero in CLBlast's host code); -1 with the offending parameter in *bad. */
static int params_check(int kernel, const clpar_ocl_params *p, size_t max_wg, size_t local_mem,
                        const char **bad) {
  const kernel_rules *r = &rules[kernel];
  for (int i = 0; i < 12 && r->nonzero[i]; i++)
    if (value_or(p, r->nonzero[i], 1) == 0) return *bad = r->nonzero[i], -1;
  for (int i = 0; i < 2 && r->vector[i]; i++) {
    size_t v = value_or(p, r->vector[i], 1);
    if (v != 1 && v != 2 && v != 4 && v != 8 && v != 16) return *bad = r->vector[i], -1;
  }
  for (int i = 0; i < 4 && r->flag[i]; i++)
    if (value_or(p, r->flag[i], 0) > 1) return *bad = r->flag[i], -1;
  if (r->wg[0]) {
    size_t x = value_or(p, r->wg[0], 1), y = r->wg[1] ? value_or(p, r->wg[1], 1) : x;
    if (x * y > max_wg) return *bad = r->wg[0], -1;
  }
  for (int i = 0; i < 2 && r->multiple[i][0]; i++) {
    size_t x = value_or(p, r->multiple[i][0], 1), y = value_or(p, r->multiple[i][1], 1),
           z = value_or(p, r->multiple[i][2], 1);
    if (x % (y * z) != 0) return *bad = r->multiple[i][0], -1;
  }
  /* the transposes' local tiles (CLBlast's transpose_fast.hpp and transpose_pad.hpp) */
  if (kernel == K_TRA) {
    size_t d = value_or(p, "TRA_DIM", 1), w = value_or(p, "TRA_WPT", 1);
    if (sizeof(float) * w * (w * d) * (d + value_or(p, "TRA_PAD", 0)) > local_mem)
      return *bad = "TRA_DIM", -1;
  }
  if (kernel == K_PADTRA) {
    size_t tw = value_or(p, "PADTRA_TILE", 1) * value_or(p, "PADTRA_WPT", 1);
    if (tw > ((size_t)1 << 16) ||
        sizeof(float) * tw * (tw + value_or(p, "PADTRA_PAD", 0)) > local_mem)
      return *bad = "PADTRA_TILE", -1;
  }
  return 0;
}

static size_t device_local_mem(cl_device_id dev) {
  cl_ulong bytes = 0;
  return clGetDeviceInfo(dev, CL_DEVICE_LOCAL_MEM_SIZE, sizeof bytes, &bytes, NULL) == CL_SUCCESS
             ? (size_t)bytes
             : 0;
}

/* Parses "Kernel NAME=v NAME=v ..." into p, which must come out with exactly the names of
 * want (CLBlast's set for that kernel). */
static int parse_kernel_line(char *line, const clpar_ocl_params *want, clpar_ocl_params *p) {
  *p = *want;
  int seen[CLPAR_OCL_MAX_PARAMS] = {0}, count = 0;
  char *save = NULL;
  for (char *tok = strtok_r(line, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
    char *eq = strchr(tok, '=');
    if (!eq) return -1;
    *eq = '\0';
    char *end;
    errno = 0;
    unsigned long long v = strtoull(eq + 1, &end, 10);
    if (errno || *end || end == eq + 1 || v > TUNE_MAX_VALUE) return -1;
    int i = 0;
    while (i < p->n && strcmp(p->name[i], tok) != 0) i++;
    if (i == p->n || seen[i]) return -1;
    seen[i] = 1;
    p->value[i] = (size_t)v;
    count++;
  }
  return count == p->n ? 0 : -1;
}

/* Checks and parses an entry's text against d's header; 0 and out filled, or -1 with why. */
static int entry_parse(clpar_ocl_device *d, char *text, const clpar_ocl_params defaults[K_COUNT],
                       clpar_ocl_params out[K_COUNT], const char **why) {
  char header[1200];
  entry_header(d, header, sizeof header);
  if (strncmp(text, TUNE_FORMAT "\n", strlen(TUNE_FORMAT) + 1) != 0) {
    *why = strncmp(text, "clpar-tune ", 11) == 0
               ? "stale: written by another clpar-tune format (run clpar-tune again)"
               : "not a clpar tuning entry";
    return -1;
  }
  if (strncmp(text, header, strlen(header)) != 0) {
    *why = "stale: made for another device, driver or CLBlast version";
    return -1;
  }
  int have[K_COUNT] = {0}, ended = 0;
  char *save = NULL;
  for (char *line = strtok_r(text + strlen(header), "\n", &save); line;
       line = strtok_r(NULL, "\n", &save)) {
    if (ended) break;
    if (strcmp(line, "end") == 0) {
      ended = 1;
      continue;
    }
    char *sp = strchr(line, ' ');
    int k = 0;
    if (sp) {
      *sp = '\0';
      while (k < K_COUNT && strcmp(line, kernels[k]) != 0) k++;
    }
    if (!sp || k == K_COUNT || have[k] || parse_kernel_line(sp + 1, &defaults[k], &out[k]) != 0) {
      *why = "corrupt: a parameter line does not parse or names other parameters";
      return -1;
    }
    have[k] = 1;
  }
  for (int k = 0; k < K_COUNT; k++)
    if (!ended || !have[k]) {
      *why = "corrupt: truncated or missing a kernel";
      return -1;
    }
  return 0;
}

clpar_ocl_tune_applied clpar_ocl_tune_apply(clpar_ocl_device *d) {
  clpar_ocl_params defaults[K_COUNT], saved[K_COUNT];
  if (defaults_get(d->device, defaults) != 0) return CLPAR_OCL_TUNE_NONE;
  const char *tune = getenv("CLPAR_TUNE");
  if (tune && strcmp(tune, "off") == 0) return CLPAR_OCL_TUNE_OFF;
  char dir[4096], name[64], why_buf[512];
  const char *why = NULL;
  int fd;
  if (clpar_cache_dir_open(dir, sizeof dir, &fd) != CLPAR_OK) return CLPAR_OCL_TUNE_NONE;
  entry_name(d, name, sizeof name);
  void *data = NULL;
  size_t size = 0;
  clpar_status s = clpar_trusted_file_read(fd, name, TUNE_MAX_FILE, &data, &size);
  close(fd);
  if (s != CLPAR_OK) {
    snprintf(why_buf, sizeof why_buf, "%s", clpar_last_error());
    why = why_buf;
  } else if (!data) {
    return CLPAR_OCL_TUNE_NONE;
  }
  char *text = data ? malloc(size + 1) : NULL;
  if (data && !text) why = "out of memory";
  if (text) {
    memcpy(text, data, size);
    text[size] = '\0';
    if (strlen(text) != size)
      why = "corrupt: a NUL byte in the text";
    else if (entry_parse(d, text, defaults, saved, &why) == 0) {
      size_t local_mem = device_local_mem(d->device);
      const char *bad = NULL;
      for (int j = 0; j < K_COUNT && !bad; j++)
        if (params_check(j, &saved[j], d->max_wg_size, local_mem, &bad) != 0) {
          snprintf(why_buf, sizeof why_buf,
                   "corrupt: %s's %s is not a value CLBlast can run on this device", kernels[j],
                   bad);
          why = why_buf;
        }
    }
    if (!why) {
      int k = 0;
      while (k < K_COUNT && params_apply(d->device, k, &saved[k]) == 0) k++;
      if (k < K_COUNT) {
        why = "CLBlast refused its parameters";
        for (int j = 0; j < K_COUNT; j++) params_apply(d->device, j, &defaults[j]);
      }
    }
  }
  free(text);
  free(data);
  if (why) {
    clpar_log(CLPAR_LOG_WARN, "opencl: %s: ignoring GEMM tuning entry %s/%s: %s", d->dev_name, dir,
              name, why);
    return CLPAR_OCL_TUNE_IGNORED;
  }
  clpar_log(CLPAR_LOG_INFO, "opencl: %s: GEMM tuning applied from %s/%s", d->dev_name, dir, name);
  return CLPAR_OCL_TUNE_APPLIED;
}

static clpar_status entry_save(clpar_ocl_device *d, const clpar_ocl_params p[K_COUNT], char *path,
                               size_t path_size) {
  char dir[4096], name[64], text[4096];
  int fd;
  if (clpar_cache_dir_open(dir, sizeof dir, &fd) != CLPAR_OK) {
    char why[8192]; /* the reason (as long as an error may be), out of the buffer it fills */
    snprintf(why, sizeof why, "%s", clpar_last_error());
    return clpar_set_error(CLPAR_ERROR_IO,
                           "opencl: no usable cache directory for the tuning "
                           "entry (set CLPAR_CACHE_DIR): %s",
                           why);
  }
  entry_name(d, name, sizeof name);
  int n = snprintf(path, path_size, "%s/%s", dir, name);
  if (n < 0 || (size_t)n >= path_size) {
    close(fd);
    return clpar_set_error(CLPAR_ERROR_IO, "opencl: cache directory path too long: %s", dir);
  }
  entry_header(d, text, sizeof text);
  size_t len = strlen(text);
  for (int k = 0; k < K_COUNT; k++) {
    if (len < sizeof text) len += (size_t)snprintf(text + len, sizeof text - len, "%s", kernels[k]);
    for (int i = 0; i < p[k].n && len < sizeof text; i++)
      len +=
          (size_t)snprintf(text + len, sizeof text - len, " %s=%zu", p[k].name[i], p[k].value[i]);
    if (len < sizeof text) len += (size_t)snprintf(text + len, sizeof text - len, "\n");
  }
  if (len < sizeof text) len += (size_t)snprintf(text + len, sizeof text - len, "end\n");
  clpar_status s = len < sizeof text
                       ? clpar_trusted_file_write(fd, name, text, len)
                       : clpar_set_error(CLPAR_ERROR_IO, "opencl: tuning entry too long");
  close(fd);
  return s;
}

/* ---- timing candidates ---- */

typedef struct {
  clpar_gemm_shape s;
  size_t lda, ldb, a_count, b_count;
  float *ha, *hb, *hc;
  cl_mem a, b, c;
  size_t pos[SAMPLES]; /* sampled positions of C, row-major */
  double ref[SAMPLES], mag[SAMPLES];
} tune_shape;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t lcg(uint64_t *state) {
  *state = *state * 6364136223846793005ull + 1442695040888963407ull;
  return *state >> 11;
}

static void shape_free(tune_shape *t) {
  if (t->a) clReleaseMemObject(t->a);
  if (t->b) clReleaseMemObject(t->b);
  if (t->c) clReleaseMemObject(t->c);
  free(t->ha);
  free(t->hb);
  free(t->hc);
}

static clpar_status shape_init(clpar_ocl_device *d, tune_shape *t, const clpar_gemm_shape *s,
                               uint64_t seed) {
  memset(t, 0, sizeof *t);
  t->s = *s;
  size_t m = (size_t)s->m, n = (size_t)s->n, k = (size_t)s->k;
  t->lda = s->trans_a ? m : k;
  t->ldb = s->trans_b ? k : n;
  t->a_count = m * k;
  t->b_count = k * n;
  t->ha = malloc(t->a_count * sizeof(float));
  t->hb = malloc(t->b_count * sizeof(float));
  t->hc = malloc(m * n * sizeof(float));
  if (!t->ha || !t->hb || !t->hc)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "opencl: tuning buffers");
  for (size_t i = 0; i < t->a_count; i++) t->ha[i] = (float)(lcg(&seed) % 2001) / 1000.0f - 1.0f;
  for (size_t i = 0; i < t->b_count; i++) t->hb[i] = (float)(lcg(&seed) % 2001) / 1000.0f - 1.0f;
  for (int i = 0; i < SAMPLES; i++) {
    size_t r = i == 0 ? 0 : i == 1 ? m - 1 : lcg(&seed) % m;
    size_t c = i == 0 ? 0 : i == 1 ? n - 1 : lcg(&seed) % n;
    double acc = 0, mag = 0;
    for (size_t p = 0; p < k; p++) {
      double x = s->trans_a ? t->ha[p * t->lda + r] : t->ha[r * t->lda + p];
      double y = s->trans_b ? t->hb[c * t->ldb + p] : t->hb[p * t->ldb + c];
      acc += x * y;
      mag += fabs(x * y);
    }
    t->pos[i] = r * n + c;
    t->ref[i] = acc;
    t->mag[i] = mag;
  }
  cl_int err;
  t->a = clCreateBuffer(d->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                        t->a_count * sizeof(float), t->ha, &err);
  if (err == CL_SUCCESS)
    t->b = clCreateBuffer(d->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                          t->b_count * sizeof(float), t->hb, &err);
  if (err == CL_SUCCESS)
    t->c = clCreateBuffer(d->context, CL_MEM_READ_WRITE, m * n * sizeof(float), NULL, &err);
  if (err != CL_SUCCESS)
    return clpar_set_error(clpar_ocl_status(err), "opencl: tuning buffers: %s",
                           clpar_ocl_error_name(err));
  return CLPAR_OK;
}

static int gemm_once(clpar_ocl_device *d, tune_shape *t) {
  const clpar_gemm_shape *s = &t->s;
  CLBlastStatusCode st =
      CLBlastSgemm(CLBlastLayoutRowMajor, s->trans_a ? CLBlastTransposeYes : CLBlastTransposeNo,
                   s->trans_b ? CLBlastTransposeYes : CLBlastTransposeNo, (size_t)s->m,
                   (size_t)s->n, (size_t)s->k, 1.0f, t->a, 0, t->lda, t->b, 0, t->ldb, 0.0f, t->c,
                   0, (size_t)s->n, &d->queue, NULL);
  return st == CLBlastSuccess && clFinish(d->queue) == CL_SUCCESS ? 0 : -1;
}

/* One GEMM of the shape with the parameters in force: checked (C filled with NaN first), then
 * timed, best of reps. Seconds, or -1 when it failed or computed wrong values. */
static double time_shape(clpar_ocl_device *d, tune_shape *t, int reps) {
  size_t count = (size_t)t->s.m * (size_t)t->s.n;
  float nan_pattern = NAN;
  if (clEnqueueFillBuffer(d->queue, t->c, &nan_pattern, sizeof nan_pattern, 0,
                          count * sizeof(float), 0, NULL, NULL) != CL_SUCCESS ||
      gemm_once(d, t) != 0 ||
      clEnqueueReadBuffer(d->queue, t->c, CL_TRUE, 0, count * sizeof(float), t->hc, 0, NULL,
                          NULL) != CL_SUCCESS)
    return -1;
  double tol = 1.2e-7 * (double)t->s.k + 1e-5;
  for (int i = 0; i < SAMPLES; i++) {
    double got = t->hc[t->pos[i]];
    if (!(fabs(got - t->ref[i]) <= tol * (t->mag[i] + 1.0))) return -1;
  }
  double best = -1;
  for (int r = 0; r < reps; r++) {
    double t0 = now_s();
    if (gemm_once(d, t) != 0) return -1;
    double dt = now_s() - t0;
    if (best < 0 || dt < best) best = dt;
  }
  return best;
}

/* ---- candidates ---- */

/* Sets name=value in p; 0 if p has that parameter. */
static int set(clpar_ocl_params *p, const char *name, size_t value) {
  size_t *v = param(p, name);
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
static int xgemm_candidates(const clpar_ocl_params *base, size_t max_wg, clpar_ocl_params *out,
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
                int bad = set(&p, "MWG", mwg) | set(&p, "NWG", nwg) | set(&p, "KWG", kw) |
                          set(&p, "MDIMC", mdimc) | set(&p, "NDIMC", ndimc) |
                          set(&p, "MDIMA", mdimc) | set(&p, "NDIMB", ndimc) | set(&p, "VWM", vwm) |
                          set(&p, "VWN", vwn) | set(&p, "KWI", 2) | set(&p, "SA", 0) |
                          set(&p, "SB", 0) | set(&p, "STRM", 0) | set(&p, "STRN", 0);
                if (param(&p, "GEMMK")) bad |= set(&p, "GEMMK", 0) | set(&p, "KREG", 1);
                if (bad) {
                  free(all);
                  return 0;
                }
                all[n++] = p;
              }
  return pick_some(all, n, out, count, 12345);
}

static int direct_candidates(const clpar_ocl_params *base, size_t max_wg, clpar_ocl_params *out,
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
                int bad = set(&p, "WGD", w) | set(&p, "MDIMCD", mdimc) | set(&p, "NDIMCD", ndimc) |
                          set(&p, "MDIMAD", mdimc) | set(&p, "NDIMBD", ndimc) |
                          set(&p, "VWMD", vwm) | set(&p, "VWND", vwn) | set(&p, "KWID", kwid[k]) |
                          set(&p, "PADA", (size_t)pad) | set(&p, "PADB", (size_t)pad);
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
static int pad_candidates(const clpar_ocl_params *base, size_t max_wg, clpar_ocl_params *out,
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
          if (set(&p, "PAD_DIMX", dim[a]) | set(&p, "PAD_DIMY", dim[b]) |
              set(&p, "PAD_WPTX", wpt[c]) | set(&p, "PAD_WPTY", wpt[e])) {
            free(all);
            return 0;
          }
          all[n++] = p;
        }
  return pick_some(all, n, out, count, 2468);
}

static int transpose_candidates(const clpar_ocl_params *base, size_t max_wg, size_t local_mem,
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
          if (set(&p, "TRA_DIM", d) | set(&p, "TRA_WPT", w) | set(&p, "TRA_PAD", pad) |
              set(&p, "TRA_SHUFFLE", shuffle)) {
            free(all);
            return 0;
          }
          all[n++] = p;
        }
  return pick_some(all, n, out, count, 1357);
}

static int padtranspose_candidates(const clpar_ocl_params *base, size_t max_wg, size_t local_mem,
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
        if (set(&p, "PADTRA_TILE", tl) | set(&p, "PADTRA_WPT", w) | set(&p, "PADTRA_PAD", pad)) {
          free(all);
          return 0;
        }
        all[n++] = p;
      }
  return pick_some(all, n, out, count, 97531);
}

/* ---- the search ---- */

typedef struct {
  clpar_ocl_device *d;
  tune_shape *shapes;
  int n_shapes, reps, done, total;
  const clpar_tune_options *opt;
  clpar_tune_result *result;
} tuner;

static void progress(tuner *t, const char *kernel, int i, int of) {
  t->done++;
  if (!t->opt->progress) return;
  char what[64];
  snprintf(what, sizeof what, "%s %d/%d", kernel, i, of);
  t->opt->progress(t->opt->user, t->done, t->total, what);
}

/* Times every shape with the parameters in force into times[]; total seconds or -1. */
static double time_all(tuner *t, double *times) {
  double total = 0;
  for (int s = 0; s < t->n_shapes; s++) {
    times[s] = time_shape(t->d, &t->shapes[s], t->reps);
    if (times[s] < 0) return -1;
    total += times[s];
  }
  return total;
}

static int routine_force(tuner *t, const clpar_ocl_params *routine, size_t min_indirect) {
  clpar_ocl_params r = *routine;
  return set(&r, "XGEMM_MIN_INDIRECT_SIZE", min_indirect) == 0 &&
                 params_apply(t->d->device, K_ROUTINE, &r) == 0
             ? 0
             : -1;
}

/* Tries each candidate of kernel (the routine forced to it): the fastest (sum over shapes)
 * into *best with its per-shape times in best_times. */
static void search(tuner *t, int kernel, const clpar_ocl_params *cands, int n,
                   clpar_ocl_params *best, double *best_times, double *scratch) {
  double best_total = -1;
  for (int i = 0; i < n; i++) {
    double total = -1;
    if (params_apply(t->d->device, kernel, &cands[i]) == 0) total = time_all(t, scratch);
    t->result->candidates_tried++;
    if (total < 0) t->result->candidates_failed++;
    if (total >= 0 && (best_total < 0 || total < best_total)) {
      best_total = total;
      *best = cands[i];
      memcpy(best_times, scratch, (size_t)t->n_shapes * sizeof *scratch);
    }
    progress(t, kernels[kernel], i + 1, n);
  }
}

/* Tries each candidate of kernel against the parameters kept so far (*kept), the routine
 * forced as it is, in alternating turns (kept, candidate, kept, candidate) so that a change
 * in the machine's load falls on both; the best of each's turns counts. A candidate replaces
 * *kept only if it computes right and is faster by more than MARGIN. kept_times gets the
 * per-shape times (best of the turns) of what is kept in the end. */
#define MARGIN 0.02
static void refine(tuner *t, int kernel, const clpar_ocl_params *cands, int n,
                   clpar_ocl_params *kept, double *kept_times, double *scratch) {
  int ns = t->n_shapes;
  double *tk = scratch + ns, *tc = scratch + 2 * ns;
  for (int i = 0; i < n; i++) {
    double sum_k = -1, sum_c = -1;
    for (int s = 0; s < ns; s++) tk[s] = tc[s] = -1;
    for (int turn = 0; turn < 2; turn++) {
      double x = params_apply(t->d->device, kernel, kept) == 0 ? time_all(t, scratch) : -1;
      if (x >= 0 && (sum_k < 0 || x < sum_k)) sum_k = x;
      for (int s = 0; s < ns && x >= 0; s++)
        if (tk[s] < 0 || scratch[s] < tk[s]) tk[s] = scratch[s];
      double y = params_apply(t->d->device, kernel, &cands[i]) == 0 ? time_all(t, scratch) : -1;
      if (y < 0) {
        sum_c = -1;
        break;
      }
      if (sum_c < 0 || y < sum_c) sum_c = y;
      for (int s = 0; s < ns; s++)
        if (tc[s] < 0 || scratch[s] < tc[s]) tc[s] = scratch[s];
    }
    t->result->candidates_tried++;
    if (sum_c < 0) t->result->candidates_failed++;
    int better = sum_c >= 0 && sum_k >= 0 && sum_c < sum_k * (1.0 - MARGIN);
    if (better) *kept = cands[i];
    if (sum_k >= 0 || better) memcpy(kept_times, better ? tc : tk, (size_t)ns * sizeof *tk);
    progress(t, kernels[kernel], i + 1, n);
  }
  params_apply(t->d->device, kernel, kept);
}

static clpar_status run_search(tuner *t, clpar_ocl_params def[K_COUNT]) {
  clpar_ocl_device *d = t->d;
  const clpar_tune_options *o = t->opt;
  int per_x = o->candidates ? o->candidates : o->quick ? 2 : DEFAULT_XGEMM_CANDIDATES;
  int per_d = o->candidates ? o->candidates : o->quick ? 2 : DEFAULT_DIRECT_CANDIDATES;
  int per_helper = o->candidates ? o->candidates : o->quick ? 1 : DEFAULT_HELPER_CANDIDATES;
  int most = per_helper;
  clpar_ocl_params *cx = calloc((size_t)per_x + 1, sizeof *cx),
                   *cd = calloc((size_t)per_d + 1, sizeof *cd),
                   *ch = calloc((size_t)most * 3, sizeof *ch);
  double *times = calloc((size_t)t->n_shapes * 5, sizeof *times);
  size_t local_mem = device_local_mem(d->device); /* 0: no transpose candidates */
  clpar_status s = CLPAR_OK;
  if (!cx || !cd || !ch || !times) {
    s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "opencl: tuning");
    goto out;
  }
  double *t_ind = times, *t_dir = times + t->n_shapes, *scratch = times + 2 * t->n_shapes;
  /* candidate 0 of each GEMM kernel is CLBlast's own; the helpers start from CLBlast's own */
  cx[0] = def[K_XGEMM];
  cd[0] = def[K_DIRECT];
  int nx = 1 + xgemm_candidates(&def[K_XGEMM], d->max_wg_size, cx + 1, per_x);
  int nd = 1 + direct_candidates(&def[K_DIRECT], d->max_wg_size, cd + 1, per_d);
  clpar_ocl_params *c_tra = ch, *c_padtra = ch + most, *c_pad = ch + 2 * most;
  int ntra = transpose_candidates(&def[K_TRA], d->max_wg_size, local_mem, c_tra, per_helper);
  int npadtra =
      padtranspose_candidates(&def[K_PADTRA], d->max_wg_size, local_mem, c_padtra, per_helper);
  int npad = pad_candidates(&def[K_PAD], d->max_wg_size, c_pad, per_helper);
  t->total = 2 + nx + nd + ntra + npadtra + npad;
  /* CLBlast's parameters throughout: the baseline */
  for (int k = 0; k < K_COUNT; k++) params_apply(d->device, k, &def[k]);
  double base = time_all(t, scratch);
  progress(t, "default", 1, 1);
  if (base < 0) {
    s = clpar_set_error(CLPAR_ERROR_BACKEND,
                        "opencl: %s: CLBlast's own GEMM parameters fail on a tuning shape",
                        d->dev_name);
    goto out;
  }
  clpar_ocl_params best[K_COUNT];
  memcpy(best, def, sizeof best);
  for (int i = 0; i < t->n_shapes; i++) t_ind[i] = t_dir[i] = -1;
  if (routine_force(t, &def[K_ROUTINE], 1) == 0) /* m n k < 1: always indirect */
    search(t, K_XGEMM, cx, nx, &best[K_XGEMM], t_ind, scratch);
  params_apply(d->device, K_XGEMM, &best[K_XGEMM]);
  /* The indirect path's pad and transpose kernels, with the Xgemm just chosen, each candidate
   * against what is kept so far; t_ind follows what is kept. */
  if (t_ind[0] >= 0 && routine_force(t, &def[K_ROUTINE], 1) == 0) {
    refine(t, K_TRA, c_tra, ntra, &best[K_TRA], t_ind, scratch);
    refine(t, K_PADTRA, c_padtra, npadtra, &best[K_PADTRA], t_ind, scratch);
    refine(t, K_PAD, c_pad, npad, &best[K_PAD], t_ind, scratch);
  } else {
    t->done += ntra + npadtra + npad;
  }
  if (routine_force(t, &def[K_ROUTINE], 1 << 20) == 0) /* always direct */
    search(t, K_DIRECT, cd, nd, &best[K_DIRECT], t_dir, scratch);
  params_apply(d->device, K_DIRECT, &best[K_DIRECT]);
  /* The switch-over size: CLBlast runs the direct kernel when m n k < size^3; try the size
   * just above each shape's (and the two extremes) against the times just measured. */
  size_t best_size = *param(&best[K_ROUTINE], "XGEMM_MIN_INDIRECT_SIZE");
  double best_pred = -1;
  for (int c = -2; c < t->n_shapes; c++) {
    size_t size = c == -2 ? 1
                  : c == -1
                      ? (size_t)1 << 20
                      : (size_t)ceil(cbrt((double)t->shapes[c].s.m * (double)t->shapes[c].s.n *
                                          (double)t->shapes[c].s.k)) +
                            1;
    double pred = 0;
    for (int i = 0; i < t->n_shapes && pred >= 0; i++) {
      double mnk = (double)t->shapes[i].s.m * (double)t->shapes[i].s.n * (double)t->shapes[i].s.k;
      double ti = mnk < (double)size * size * size ? t_dir[i] : t_ind[i];
      pred = ti < 0 ? -1 : pred + ti;
    }
    if (pred >= 0 && (best_pred < 0 || pred < best_pred)) {
      best_pred = pred;
      best_size = size;
    }
  }
  set(&best[K_ROUTINE], "XGEMM_MIN_INDIRECT_SIZE", best_size);
  /* The choice against CLBlast's own, timed in turns (ABAB) so that a change in the machine's
   * load falls on both; the best of each counts. */
  double tuned = -1;
  for (int round = 0; round < 3; round++) {
    for (int k = 0; k < K_COUNT; k++) params_apply(d->device, k, &best[k]);
    double tt = time_all(t, scratch);
    if (tt < 0) {
      tuned = -1;
      break;
    }
    tuned = tuned < 0 || tt < tuned ? tt : tuned;
    for (int k = 0; k < K_COUNT; k++) params_apply(d->device, k, &def[k]);
    double tb = time_all(t, scratch);
    base = tb >= 0 && tb < base ? tb : base;
  }
  progress(t, "final", 1, 1);
  if (tuned < 0 || tuned >= base) { /* keep CLBlast's own */
    for (int k = 0; k < K_COUNT; k++) best[k] = def[k];
    tuned = base;
  }
  for (int k = 0; k < K_COUNT; k++) params_apply(d->device, k, &best[k]);
  t->result->default_seconds = base;
  t->result->tuned_seconds = tuned;
  s = entry_save(d, best, t->result->path, sizeof t->result->path);
out:
  free(cx);
  free(cd);
  free(ch);
  free(times);
  return s;
}

static int runs_clblast(const clpar_ocl_device *d, const clpar_gemm_shape *s) {
  return !clpar_ocl_gemm_takes_small(d, s->trans_a, s->trans_b, (size_t)s->m, (size_t)s->n,
                                     (size_t)s->k);
}

clpar_status ocl_tune_gemm(void *dev, const clpar_gemm_shape *shapes, int n_shapes,
                           const clpar_tune_options *options, clpar_tune_result *result) {
  clpar_ocl_device *d = dev;
  clpar_ocl_params def[K_COUNT];
  memset(result, 0, sizeof *result);
  if (defaults_get(d->device, def) != 0)
    return clpar_set_error(CLPAR_ERROR_BACKEND,
                           "opencl: %s: CLBlast does not report its GEMM parameters", d->dev_name);
  for (int k = 0; k < K_COUNT; k++)
    if (!param(&def[k], kernel_key[k]))
      return clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                             "opencl: CLBlast %s names its GEMM parameters differently",
                             CLPAR_CLBLAST_VERSION);
  /* only the shapes CLBlast runs: on a CPU device some take gemm_small.cl (ocl_gemm) */
  int n_blast = 0;
  for (int i = 0; i < n_shapes; i++) n_blast += runs_clblast(d, &shapes[i]);
  if (!n_blast)
    return clpar_set_error(
        CLPAR_ERROR_INVALID_ARGUMENT,
        "opencl: %s: none of the %d shapes runs CLBlast on this CPU device (each "
        "takes clpar's own small-GEMM kernel: B transposed with at most 2^22 "
        "floats, or at most 2^20 multiply-adds), so there is nothing to tune",
        d->dev_name, n_shapes);
  if (n_blast < n_shapes)
    clpar_log(CLPAR_LOG_INFO,
              "opencl: %s: tuning on %d of the %d shapes; the others take clpar's own small-GEMM "
              "kernel on this CPU device",
              d->dev_name, n_blast, n_shapes);
  tune_shape *ts = calloc((size_t)n_blast, sizeof *ts);
  if (!ts) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "opencl: tuning");
  pthread_mutex_lock(&d->lock);
  pthread_mutex_lock(&clpar_ocl_gemm_warmup_lock); /* one device compiles at a time */
  clpar_status s = CLPAR_OK;
  for (int i = 0, j = 0; i < n_shapes && s == CLPAR_OK; i++)
    if (runs_clblast(d, &shapes[i])) s = shape_init(d, &ts[j++], &shapes[i], 7 + i);
  if (s == CLPAR_OK) {
    tuner t = {d, ts, n_blast, options->quick ? 1 : 3, 0, 0, options, result};
    s = run_search(&t, def);
  }
  if (s == CLPAR_OK) atomic_store(&d->gemm_warm, 1); /* CLBlast has compiled for it */
  pthread_mutex_unlock(&clpar_ocl_gemm_warmup_lock);
  pthread_mutex_unlock(&d->lock);
  for (int i = 0; i < n_blast; i++) shape_free(&ts[i]);
  free(ts);
  return s;
}
