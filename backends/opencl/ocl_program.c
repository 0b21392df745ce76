/* ocl_program.c — OpenCL programs, built once per device and cached twice: in memory (the
 * cl_program and its kernels, per device) and on disk (the device binary), because compiling
 * from source costs from a fraction of a second (PoCL) to seconds (GPU drivers) per program
 * and per device at every start.
 *
 * Disk entries live in CLPAR_CACHE_DIR (default $XDG_CACHE_HOME/clpar, else
 * $HOME/.cache/clpar), read each time a program is built so it can change at run time. An
 * entry is named after a SHA-256 key over everything that decides the binary: the source,
 * the build options, the device and driver, the platform, and the clpar version. The file
 * repeats the full key and carries the payload's size and SHA-256, so an entry that is
 * corrupt, truncated or stale (a key that does not match) is rebuilt from source and
 * overwritten. The checksum only detects damage: the key is computable from public data, so
 * an entry is trusted only as far as its directory and file are (a binary for a CPU device is
 * native code run in this process). src/runtime/trusted_file.c decides that: a directory of this
 * user's that no one else can write, a regular file of this user's, no link followed, no FIFO
 * waited on; otherwise programs are compiled from source, with one warning. Entries are
 * written to a new file and renamed into place, so a reader never sees half a file even when
 * two processes build the same program. On PoCL's CPU devices (before PoCL 6.0) every build adds
 * a define naming the device (options_suffix), so that no two devices share a program inside
 * PoCL. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ocl_conv_algo.h"
#include "ocl_internal.h"

#define MAX_KERNELS 16

struct clpar_ocl_program {
  clpar_ocl_program *next;
  char name[64];
  int embedded; /* one of clpar_opencl_sources: matched by name alone */
  char *source; /* a copy, to recognise the same source given again */
  size_t size;
  char *options;
  cl_program program;
  int nkernels;
  struct {
    char name[64];
    cl_kernel kernel;
  } kernels[MAX_KERNELS];
};

static atomic_uint_least64_t stat_source_builds;
static atomic_uint_least64_t stat_disk_loads;
static atomic_uint_least64_t stat_memory_hits;
static atomic_uint_least64_t stat_disk_rejects;

void clpar_ocl_program_stats_get(clpar_ocl_program_stats *out) {
  out->source_builds = atomic_load(&stat_source_builds);
  out->disk_loads = atomic_load(&stat_disk_loads);
  out->memory_hits = atomic_load(&stat_memory_hits);
  out->disk_rejects = atomic_load(&stat_disk_rejects);
}

/* ---- SHA-256 (FIPS 180-4): the cache key and the payload checksum ---- */

typedef struct {
  uint32_t h[8];
  uint8_t block[64];
  size_t used;
  uint64_t total;
} sha256_ctx;

static const uint32_t sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t rotr(uint32_t x, int n) {
  return (x >> n) | (x << (32 - n));
}

static void sha256_block(sha256_ctx *s, const uint8_t *p) {
  uint32_t w[64], v[8];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 |
           p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  memcpy(v, s->h, sizeof v);
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = v[7] + (rotr(v[4], 6) ^ rotr(v[4], 11) ^ rotr(v[4], 25)) +
                  ((v[4] & v[5]) ^ (~v[4] & v[6])) + sha256_k[i] + w[i];
    uint32_t t2 = (rotr(v[0], 2) ^ rotr(v[0], 13) ^ rotr(v[0], 22)) +
                  ((v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]));
    memmove(v + 1, v, 7 * sizeof v[0]);
    v[4] += t1;
    v[0] = t1 + t2;
  }
  for (int i = 0; i < 8; i++) s->h[i] += v[i];
}

static void sha256_init(sha256_ctx *s) {
  static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, h0, sizeof h0);
  s->used = 0;
  s->total = 0;
}

static void sha256_update(sha256_ctx *s, const void *data, size_t n) {
  const uint8_t *p = data;
  s->total += n;
  while (n > 0) {
    size_t take = 64 - s->used < n ? 64 - s->used : n;
    memcpy(s->block + s->used, p, take);
    s->used += take;
    p += take;
    n -= take;
    if (s->used == 64) {
      sha256_block(s, s->block);
      s->used = 0;
    }
  }
}

static void sha256_final(sha256_ctx *s, uint8_t out[32]) {
  uint64_t bits = s->total * 8;
  uint8_t pad = 0x80, zero = 0, len[8];
  sha256_update(s, &pad, 1);
  while (s->used != 56) sha256_update(s, &zero, 1);
  for (int i = 0; i < 8; i++) len[i] = (uint8_t)(bits >> (56 - 8 * i));
  sha256_update(s, len, 8);
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 4; j++) out[4 * i + j] = (uint8_t)(s->h[i] >> (24 - 8 * j));
}

/* Each field is preceded by its length, so that ("ab", "c") and ("a", "bc") differ. */
static void sha256_field(sha256_ctx *s, const void *data, size_t n) {
  uint64_t len = n;
  sha256_update(s, &len, sizeof len);
  sha256_update(s, data, n);
}

static void cache_key(const clpar_ocl_device *dev, const char *source, size_t size,
                      const char *options, uint8_t key[32]) {
  const char *fields[] = {"clpar-opencl-program", CLPAR_VERSION_STRING, options,
                          dev->dev_name,          dev->dev_version,     dev->driver_version,
                          dev->platform_name,     dev->platform_version};
  sha256_ctx s;
  sha256_init(&s);
  sha256_field(&s, source, size);
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
    sha256_field(&s, fields[i], strlen(fields[i]));
  sha256_final(&s, key);
}

/* ---- the options a program is built with ---- */

/* PoCL's CPU drivers (basic, pthread) share one process-wide table of loaded kernel binaries,
 * keyed by the program's build hash: the source and the build options, not the device. Two
 * such devices building the same program share its entries, and PoCL before 6.0 releases an
 * entry by part of the key it was taken by (pocl_release_dlhandle_cache; fixed upstream by
 * "fix dlhandle cache", in 6.0): two threads running one kernel with different sizes at once
 * (DataParallel) take the count from the wrong entry and abort the process on an assertion. */
int clpar_ocl_pocl_shares_kernels(const clpar_ocl_device *dev) {
  const char *v = strstr(dev->platform_version, "PoCL ");
  return dev->cpu && v && strtol(v + 5, NULL, 10) < 6;
}

/* A define naming the device's position in its platform gives each such device builds of its
 * own; other devices get nothing added. Called with dev->prog_lock held. */
static const char *options_suffix(clpar_ocl_device *dev) {
  if (dev->options_suffix_set) return dev->options_suffix;
  cl_uint n = 0;
  if (!clpar_ocl_pocl_shares_kernels(dev) ||
      clGetDeviceIDs(dev->platform, CL_DEVICE_TYPE_ALL, 0, NULL, &n) != CL_SUCCESS || n == 0 ||
      n > 4096) {
    dev->options_suffix_set = 1;
    return dev->options_suffix;
  }
  cl_device_id *ids = malloc(n * sizeof *ids);
  if (!ids) return ""; /* tried again at the next build */
  if (clGetDeviceIDs(dev->platform, CL_DEVICE_TYPE_ALL, n, ids, NULL) == CL_SUCCESS)
    for (cl_uint i = 0; i < n; i++)
      if (ids[i] == dev->device)
        snprintf(dev->options_suffix, sizeof dev->options_suffix, " -D CLPAR_POCL_DEVICE=%u", i);
  free(ids);
  dev->options_suffix_set = 1;
  return dev->options_suffix;
}

/* options followed by dev's suffix (malloc'ed), or NULL (error set). Called with
 * dev->prog_lock held. */
static char *full_options(clpar_ocl_device *dev, const char *options) {
  const char *suffix = options_suffix(dev);
  size_t a = strlen(options), b = strlen(suffix);
  char *full = malloc(a + b + 1);
  if (!full) {
    clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "opencl: build options");
    return NULL;
  }
  memcpy(full, options, a);
  memcpy(full + a, suffix, b + 1);
  return full;
}

/* ---- the disk cache (what is trusted: src/runtime/trusted_file.c) ---- */

#define ENTRY_MAGIC "CLPARPRG"
#define ENTRY_FORMAT 1u
/* magic 8 | format u32 | header size u32 | key 32 | payload size u64 | payload sha256 32 */
#define ENTRY_HEADER 88
#define ENTRY_MAX_PAYLOAD ((size_t)1 << 30)

static void entry_name(char name[72], const uint8_t key[32]) {
  for (int i = 0; i < 32; i++) snprintf(name + 2 * i, 3, "%02x", key[i]);
  memcpy(name + 64, ".clbin", 7);
}

clpar_status clpar_ocl_cache_file(clpar_ocl_device *dev, const char *source, size_t size,
                                  const char *options, char *path, size_t path_size) {
  char dir[4096], name[72];
  uint8_t key[32];
  int dirfd;
  clpar_status s = clpar_cache_dir_open(dir, sizeof dir, &dirfd);
  if (s != CLPAR_OK) return s;
  close(dirfd);
  pthread_mutex_lock(&dev->prog_lock);
  char *full = full_options(dev, options);
  pthread_mutex_unlock(&dev->prog_lock);
  if (!full) return CLPAR_ERROR_OUT_OF_MEMORY;
  cache_key(dev, source, size, full, key);
  free(full);
  entry_name(name, key);
  int n = snprintf(path, path_size, "%s/%s", dir, name);
  if (n < 0 || (size_t)n >= path_size)
    return clpar_set_error(CLPAR_ERROR_IO, "opencl: cache path too long");
  return CLPAR_OK;
}

/* The payload of a well-formed entry for key (a pointer into file), or NULL. */
static const uint8_t *entry_payload(const uint8_t *file, size_t file_size, const uint8_t key[32],
                                    size_t *payload_size) {
  uint8_t digest[32];
  uint32_t format, header_size;
  uint64_t size;
  if (file_size < ENTRY_HEADER) return NULL;
  memcpy(&format, file + 8, 4);
  memcpy(&header_size, file + 12, 4);
  memcpy(&size, file + 48, 8);
  if (memcmp(file, ENTRY_MAGIC, 8) != 0 || format != ENTRY_FORMAT || header_size != ENTRY_HEADER ||
      memcmp(file + 16, key, 32) != 0 || size == 0 || size > ENTRY_MAX_PAYLOAD ||
      file_size - ENTRY_HEADER != size)
    return NULL;
  sha256_ctx s;
  sha256_init(&s);
  sha256_update(&s, file + ENTRY_HEADER, (size_t)size);
  sha256_final(&s, digest);
  if (memcmp(digest, file + 56, 32) != 0) return NULL;
  *payload_size = (size_t)size;
  return file + ENTRY_HEADER;
}

/* Best effort: a failure only costs a rebuild next time, so it is logged, not returned. */
static void entry_write(int dirfd, const char *dir, const char *name, const uint8_t key[32],
                        const uint8_t *payload, size_t size) {
  uint8_t *file = malloc(ENTRY_HEADER + size);
  if (!file) return;
  uint32_t format = ENTRY_FORMAT, header_size = ENTRY_HEADER;
  uint64_t size64 = size;
  sha256_ctx s;
  memcpy(file, ENTRY_MAGIC, 8);
  memcpy(file + 8, &format, 4);
  memcpy(file + 12, &header_size, 4);
  memcpy(file + 16, key, 32);
  memcpy(file + 48, &size64, 8);
  sha256_init(&s);
  sha256_update(&s, payload, size);
  sha256_final(&s, file + 56);
  memcpy(file + ENTRY_HEADER, payload, size);
  if (clpar_trusted_file_write(dirfd, name, file, ENTRY_HEADER + size) != CLPAR_OK)
    clpar_log(CLPAR_LOG_WARN, "opencl: kernel cache in %s: %s", dir, clpar_last_error());
  free(file);
}

/* ---- building ---- */

static void append_build_log(clpar_ocl_device *dev, cl_program prog) {
  size_t len = 0;
  if (clGetProgramBuildInfo(prog, dev->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &len) != CL_SUCCESS ||
      len == 0)
    return;
  char *log = malloc(len + 1);
  if (!log) return;
  if (clGetProgramBuildInfo(prog, dev->device, CL_PROGRAM_BUILD_LOG, len, log, NULL) ==
      CL_SUCCESS) {
    log[len] = '\0';
    clpar_append_error("\nbuild log:\n%s", log);
  }
  free(log);
}

static clpar_status build_from_source(clpar_ocl_device *dev, const char *name, const char *source,
                                      size_t size, const char *options, cl_program *out) {
  cl_int err;
  cl_program prog = clCreateProgramWithSource(dev->context, 1, &source, &size, &err);
  if (err != CL_SUCCESS)
    return clpar_set_error(clpar_ocl_status(err), "clCreateProgramWithSource(%s): %s", name,
                           clpar_ocl_error_name(err));
  err = clBuildProgram(prog, 1, &dev->device, options, NULL, NULL);
  if (err != CL_SUCCESS) {
    clpar_status s = err == CL_OUT_OF_HOST_MEMORY ? CLPAR_ERROR_OUT_OF_MEMORY : CLPAR_ERROR_BUILD;
    clpar_set_error(s, "clBuildProgram(%s): %s", name, clpar_ocl_error_name(err));
    append_build_log(dev, prog);
    clReleaseProgram(prog);
    return s;
  }
  atomic_fetch_add(&stat_source_builds, 1);
  *out = prog;
  return CLPAR_OK;
}

static cl_program build_from_binary(clpar_ocl_device *dev, const uint8_t *bin, size_t size,
                                    const char *options) {
  cl_int err, bin_status;
  cl_program prog =
      clCreateProgramWithBinary(dev->context, 1, &dev->device, &size, &bin, &bin_status, &err);
  if (err != CL_SUCCESS) return NULL;
  if (bin_status != CL_SUCCESS ||
      clBuildProgram(prog, 1, &dev->device, options, NULL, NULL) != CL_SUCCESS) {
    clReleaseProgram(prog);
    return NULL;
  }
  return prog;
}

/* dev's binary of a built program (malloc'ed), or NULL when the driver gives none. A program
 * made from source in a context shared by several devices (CLPAR_OPENCL_CONTEXT=platform)
 * belongs to all of them, built for dev alone: its binary is the one at dev's position. */
static uint8_t *program_binary(cl_program prog, cl_device_id device, size_t *size) {
  cl_uint ndev = 0;
  if (clGetProgramInfo(prog, CL_PROGRAM_NUM_DEVICES, sizeof ndev, &ndev, NULL) != CL_SUCCESS ||
      ndev == 0 || ndev > 1024)
    return NULL;
  cl_device_id *devs = malloc(ndev * sizeof *devs);
  size_t *sizes = malloc(ndev * sizeof *sizes);
  uint8_t **bins = calloc(ndev, sizeof *bins);
  uint8_t *bin = NULL;
  cl_uint at = ndev;
  if (devs && sizes && bins &&
      clGetProgramInfo(prog, CL_PROGRAM_DEVICES, ndev * sizeof *devs, devs, NULL) == CL_SUCCESS &&
      clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, ndev * sizeof *sizes, sizes, NULL) ==
          CL_SUCCESS)
    for (at = 0; at < ndev && devs[at] != device; at++) continue;
  if (at < ndev && sizes[at] > 0 && sizes[at] <= ENTRY_MAX_PAYLOAD) {
    bins[at] = bin = malloc(sizes[at]);
    /* NULL entries: the driver skips those devices' binaries (OpenCL 1.2, 5.6.7). */
    if (bin && clGetProgramInfo(prog, CL_PROGRAM_BINARIES, ndev * sizeof *bins, bins, NULL) !=
                   CL_SUCCESS) {
      free(bin);
      bin = NULL;
    }
    *size = sizes[at];
  }
  free(devs);
  free(sizes);
  free(bins);
  return bin;
}

/* A program from the disk entry name in dirfd, or NULL (counted and logged when an entry was
 * there but is refused or not usable). */
static cl_program load_entry(clpar_ocl_device *dev, const char *what, int dirfd, const char *dir,
                             const char *name, const uint8_t key[32], const char *options) {
  void *file = NULL;
  size_t file_size = 0, bin_size = 0;
  if (clpar_trusted_file_read(dirfd, name, ENTRY_HEADER + ENTRY_MAX_PAYLOAD, &file, &file_size) !=
      CLPAR_OK) {
    atomic_fetch_add(&stat_disk_rejects, 1);
    clpar_log(CLPAR_LOG_WARN, "opencl: kernel cache in %s: %s; rebuilding %s", dir,
              clpar_last_error(), what);
    return NULL;
  }
  if (!file) return NULL; /* no entry yet */
  const uint8_t *bin = entry_payload(file, file_size, key, &bin_size);
  cl_program prog = bin ? build_from_binary(dev, bin, bin_size, options) : NULL;
  free(file);
  if (prog) {
    atomic_fetch_add(&stat_disk_loads, 1);
  } else {
    atomic_fetch_add(&stat_disk_rejects, 1);
    clpar_log(CLPAR_LOG_INFO,
              "opencl: kernel cache entry %s/%s is corrupt, truncated or stale; rebuilding %s", dir,
              name, what);
  }
  return prog;
}

/* Disk cache first, then source (saving the result); options are taken as they are. */
static clpar_status build_with(clpar_ocl_device *dev, const char *what, const char *source,
                               size_t size, const char *options, cl_program *out) {
  char dir[4096], name[72];
  uint8_t key[32];
  int dirfd = -1;
  int use_disk = clpar_cache_dir_open(dir, sizeof dir, &dirfd) == CLPAR_OK;
  cache_key(dev, source, size, options, key);
  entry_name(name, key);
  cl_program prog = use_disk ? load_entry(dev, what, dirfd, dir, name, key, options) : NULL;
  clpar_status s = CLPAR_OK;
  if (prog)
    *out = prog;
  else
    s = build_from_source(dev, what, source, size, options, out);
  if (s == CLPAR_OK && use_disk && !prog) {
    size_t bin_size = 0;
    uint8_t *bin = program_binary(*out, dev->device, &bin_size);
    if (bin) entry_write(dirfd, dir, name, key, bin, bin_size);
    free(bin);
  }
  if (dirfd >= 0) close(dirfd);
  return s;
}

/* build_with options and dev's suffix. Called with dev->prog_lock held. */
static clpar_status build(clpar_ocl_device *dev, const char *what, const char *source, size_t size,
                          const char *options, cl_program *out) {
  char *full = full_options(dev, options);
  if (!full) return CLPAR_ERROR_OUT_OF_MEMORY;
  clpar_status s = build_with(dev, what, source, size, full, out);
  free(full);
  return s;
}

/* ---- the in-memory cache ---- */

static clpar_ocl_program *find_program(clpar_ocl_device *dev, const char *name, int embedded,
                                       const char *source, size_t size, const char *options) {
  for (clpar_ocl_program *p = dev->programs; p; p = p->next) {
    if (strcmp(p->name, name) != 0 || strcmp(p->options, options) != 0) continue;
    if (embedded ? p->embedded : (p->size == size && memcmp(p->source, source, size) == 0))
      return p;
  }
  return NULL;
}

/* Called with prog_lock held. */
static clpar_status get_locked(clpar_ocl_device *dev, const char *name, int embedded,
                               const char *source, size_t size, const char *options,
                               clpar_ocl_program **out) {
  clpar_ocl_program *p = find_program(dev, name, embedded, source, size, options);
  if (p) {
    atomic_fetch_add(&stat_memory_hits, 1);
    *out = p;
    return CLPAR_OK;
  }
  p = calloc(1, sizeof *p);
  char *src_copy = malloc(size + 1), *opt_copy = strdup(options);
  if (!p || !src_copy || !opt_copy) {
    free(p);
    free(src_copy);
    free(opt_copy);
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "opencl: program cache entry for %s", name);
  }
  clpar_status s = build(dev, name, source, size, options, &p->program);
  if (s != CLPAR_OK) {
    free(p);
    free(src_copy);
    free(opt_copy);
    return s;
  }
  snprintf(p->name, sizeof p->name, "%s", name);
  memcpy(src_copy, source, size);
  src_copy[size] = '\0';
  p->source = src_copy;
  p->size = size;
  p->options = opt_copy;
  p->embedded = embedded;
  p->next = dev->programs;
  dev->programs = p;
  *out = p;
  return CLPAR_OK;
}

clpar_status clpar_ocl_program_get(clpar_ocl_device *dev, const char *name, const char *source,
                                   size_t size, const char *options, cl_program *out) {
  clpar_ocl_program *p = NULL;
  if (!options) options = "";
  pthread_mutex_lock(&dev->prog_lock);
  clpar_status s = get_locked(dev, name, 0, source, size, options, &p);
  if (s == CLPAR_OK) *out = p->program;
  pthread_mutex_unlock(&dev->prog_lock);
  return s;
}

static const clpar_embedded_source *embedded_source(const char *file) {
  for (const clpar_embedded_source *e = clpar_opencl_sources; e->name; e++)
    if (strcmp(e->name, file) == 0) return e;
  return NULL;
}

static clpar_status kernel_locked(clpar_ocl_device *dev, const char *file, const char *kernel_name,
                                  cl_kernel *out) {
  clpar_ocl_program *p = NULL;
  const clpar_embedded_source *e = embedded_source(file);
  if (!e) return clpar_set_error(CLPAR_ERROR_INTERNAL, "opencl: no kernel file %s", file);
  char tiled[256]; /* a tiled file's helpers (its tiled kernel with the default tiles) */
  if (clpar_ocl_conv_tiled_file(file)) clpar_ocl_conv_tile_options(NULL, tiled, sizeof tiled);
  const char *options = clpar_ocl_conv_tiled_file(file) ? tiled : CLPAR_OCL_BUILD_OPTIONS;
  clpar_status s = get_locked(dev, file, 1, e->source, e->size, options, &p);
  if (s != CLPAR_OK) return s;
  for (int i = 0; i < p->nkernels; i++) {
    if (strcmp(p->kernels[i].name, kernel_name) == 0) {
      *out = p->kernels[i].kernel;
      return CLPAR_OK;
    }
  }
  if (p->nkernels == MAX_KERNELS)
    return clpar_set_error(CLPAR_ERROR_INTERNAL, "opencl: too many kernels in %s", file);
  cl_int err;
  cl_kernel k = clCreateKernel(p->program, kernel_name, &err);
  if (err != CL_SUCCESS)
    return clpar_set_error(clpar_ocl_status(err), "clCreateKernel(%s): %s", kernel_name,
                           clpar_ocl_error_name(err));
  snprintf(p->kernels[p->nkernels].name, sizeof p->kernels[0].name, "%s", kernel_name);
  p->kernels[p->nkernels++].kernel = k;
  *out = k;
  return CLPAR_OK;
}

clpar_status clpar_ocl_kernel_get(clpar_ocl_device *dev, const char *file, const char *kernel_name,
                                  cl_kernel *out) {
  pthread_mutex_lock(&dev->prog_lock);
  clpar_status s = kernel_locked(dev, file, kernel_name, out);
  pthread_mutex_unlock(&dev->prog_lock);
  return s;
}

/* A kernel of a program made from generated source (element-wise chains): built once per
 * distinct source, kept with the program in the cache like an embedded file's kernels. */
clpar_status clpar_ocl_generated_kernel(clpar_ocl_device *dev, const char *name, const char *source,
                                        size_t size, const char *kernel_name, cl_kernel *out) {
  clpar_ocl_program *p = NULL;
  pthread_mutex_lock(&dev->prog_lock);
  clpar_status s = get_locked(dev, name, 0, source, size, CLPAR_OCL_BUILD_OPTIONS, &p);
  for (int i = 0; s == CLPAR_OK && i < p->nkernels; i++)
    if (strcmp(p->kernels[i].name, kernel_name) == 0) {
      *out = p->kernels[i].kernel;
      pthread_mutex_unlock(&dev->prog_lock);
      return CLPAR_OK;
    }
  if (s == CLPAR_OK && p->nkernels == MAX_KERNELS)
    s = clpar_set_error(CLPAR_ERROR_INTERNAL, "opencl: too many kernels in %s", name);
  cl_int err = CL_SUCCESS;
  cl_kernel k = s == CLPAR_OK ? clCreateKernel(p->program, kernel_name, &err) : NULL;
  if (s == CLPAR_OK && err != CL_SUCCESS)
    s = clpar_set_error(clpar_ocl_status(err), "clCreateKernel(%s): %s", kernel_name,
                        clpar_ocl_error_name(err));
  if (s == CLPAR_OK) {
    snprintf(p->kernels[p->nkernels].name, sizeof p->kernels[0].name, "%s", kernel_name);
    p->kernels[p->nkernels++].kernel = k;
    *out = k;
  }
  pthread_mutex_unlock(&dev->prog_lock);
  return s;
}

void clpar_ocl_program_cache_clear(clpar_ocl_device *dev) {
  /* lock too: no thread may be between getting a kernel and enqueueing it */
  pthread_mutex_lock(&dev->lock);
  pthread_mutex_lock(&dev->prog_lock);
  clpar_ocl_program *p = dev->programs;
  dev->programs = NULL;
  while (p) {
    clpar_ocl_program *next = p->next;
    for (int i = 0; i < p->nkernels; i++) clReleaseKernel(p->kernels[i].kernel);
    clReleaseProgram(p->program);
    free(p->source);
    free(p->options);
    free(p);
    p = next;
  }
  pthread_mutex_unlock(&dev->prog_lock);
  pthread_mutex_unlock(&dev->lock);
}
