/* ocl_tune_entry.c — the GEMM tuner's saved entry: which device, driver and CLBlast it is
 * for, the parameters, the checks an entry passes before CLBlast runs what it says
 * (params_check), and its trusted file I/O in the cache directory (src/runtime/trusted_file.c).
 * clpar_ocl_tune_apply reads it when a device is opened. */
#include <clblast_c.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ocl_tune_internal.h"

/* ---- the entry: which device it is for, and the parameters ---- */

static void clean(char *dst, size_t size, const char *src) {
  snprintf(dst, size, "%s", src);
  for (char *p = dst; *p; p++)
    if (*p == '\n' || *p == '\r') *p = ' ';
}

void clpar_ocl_entry_device_lines(clpar_ocl_device *d, char *out, size_t size) {
  char name[256], driver[128], pname[256], pversion[256];
  clean(name, sizeof name, d->dev_name);
  clean(driver, sizeof driver, d->driver_version);
  clean(pname, sizeof pname, d->platform_name);
  clean(pversion, sizeof pversion, d->platform_version);
  snprintf(out, size, "device %s\ndriver %s\nplatform %s %s\n", name, driver, pname, pversion);
}

void clpar_ocl_entry_name(const char *prefix, const char *header, char *name, size_t size) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (const char *p = header; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  snprintf(name, size, "%s-%016llx.txt", prefix, (unsigned long long)h);
}

int clpar_ocl_entry_path(const char *name, char *path, size_t size) {
  char dir[4096];
  int fd;
  if (clpar_cache_dir_open(dir, sizeof dir, &fd) != CLPAR_OK) return -1;
  close(fd);
  int n = snprintf(path, size, "%s/%s", dir, name);
  return n < 0 || (size_t)n >= size ? -1 : 0;
}

/* The header lines an entry for d starts with. */
static void entry_header(clpar_ocl_device *d, char *out, size_t size) {
  char lines[960]; /* the device lines are at most 919 bytes */
  clpar_ocl_entry_device_lines(d, lines, sizeof lines);
  snprintf(out, size, "%s\n%sclblast %s\n", TUNE_FORMAT, lines, CLPAR_CLBLAST_VERSION);
}

/* The entry's file name: tune-<hash of the header>.txt. */
static void entry_name(clpar_ocl_device *d, char *name, size_t size) {
  char header[1200];
  entry_header(d, header, sizeof header);
  clpar_ocl_entry_name("tune", header, name, size);
}

int clpar_ocl_tune_path(clpar_ocl_device *d, char *path, size_t size) {
  char name[64];
  entry_name(d, name, sizeof name);
  return clpar_ocl_entry_path(name, path, size);
}

int clpar_ocl_params_apply(cl_device_id dev, int kernel, const clpar_ocl_params *p) {
  const char *names[CLPAR_OCL_MAX_PARAMS];
  for (int i = 0; i < p->n; i++) names[i] = p->name[i];
  return CLBlastOverrideParameters(dev, kernels[kernel], CLBlastPrecisionSingle, (size_t)p->n,
                                   names, p->value) == CLBlastSuccess
             ? 0
             : -1;
}

size_t *clpar_ocl_param(clpar_ocl_params *p, const char *name) {
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
int clpar_ocl_tune_defaults(cl_device_id dev, clpar_ocl_params out[K_COUNT]) {
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

size_t clpar_ocl_local_mem(cl_device_id dev) {
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
  if (clpar_ocl_tune_defaults(d->device, defaults) != 0) return CLPAR_OCL_TUNE_NONE;
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
      size_t local_mem = clpar_ocl_local_mem(d->device);
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
      while (k < K_COUNT && clpar_ocl_params_apply(d->device, k, &saved[k]) == 0) k++;
      if (k < K_COUNT) {
        why = "CLBlast refused its parameters";
        for (int j = 0; j < K_COUNT; j++) clpar_ocl_params_apply(d->device, j, &defaults[j]);
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

clpar_status clpar_ocl_tune_save(clpar_ocl_device *d, const clpar_ocl_params p[K_COUNT], char *path,
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
