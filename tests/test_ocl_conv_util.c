/* test_ocl_conv_util.c — what the OpenCL convolution tests share (test_ocl_conv_util.h). */
#include "test_ocl_conv_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ocl_test_util.h"
#include "test_util.h"

static char cache_dir[256];

int tcu_setup(void **state, const char *tag) {
  if (tu_ocl_cache_dir_make(cache_dir, sizeof cache_dir, tag) != 0) return -1;
  unsetenv("CLPAR_TUNE");
  unsetenv("CLPAR_OCL_CONV");
  unsetenv("CLPAR_OCL_CONV_BWD");
  return tu_setup(state);
}

int tcu_teardown(void **state) {
  int r = tu_teardown(state);
  tu_remove_dir(cache_dir);
  return r;
}

clpar_ocl_device *tcu_ocl_of(clpar_device *dev) {
  return dev->bd.ctx;
}

clpar_device *tcu_need_ocl(clpar_ocl_device **d) {
  clpar_device *dev = tu_ocl_device();
  if (!dev) skip();
  if (d) *d = tcu_ocl_of(dev);
  return dev;
}

clpar_conv2d_options tcu_opt_of(const cshape *s) {
  clpar_conv2d_options opt = {{s->sh, s->sw}, {s->ph, s->pw}, {s->dh, s->dw}, s->groups};
  return opt;
}

void tcu_inputs(clpar_device *dev, const cshape *s, uint64_t seed, clpar_tensor **x,
                clpar_tensor **w) {
  int64_t xs[4] = {s->n, s->c, s->h, s->w}, ws[4] = {s->o, s->c / s->groups, s->kh, s->kw};
  *x = tu_make(dev, 4, xs, seed);
  *w = tu_make(dev, 4, ws, seed + 1);
}

void tcu_entry_removed(clpar_ocl_device *d, char *path, size_t size) {
  assert_int_equal(clpar_ocl_conv_path(d, path, size), 0);
  unlink(path);
}

void tcu_write_entry(clpar_ocl_device *d, const char *body, size_t len) {
  char path[4096];
  tcu_entry_removed(d, path, sizeof path);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(body, 1, len, f), len);
  fclose(f);
  chmod(path, 0600);
}

void tcu_header(clpar_ocl_device *d, char *out, size_t size) {
  snprintf(out, size, "clpar-conv 1\ndevice %s\ndriver %s\nplatform %s %s\n", d->dev_name,
           d->driver_version, d->platform_name, d->platform_version);
}

void tcu_stats_since(clpar_ocl_device *d, const clpar_ocl_conv_stats *a, clpar_ocl_conv_stats *b) {
  clpar_ocl_conv_stats_get(d, b);
  b->measured -= a->measured, b->disk_loads -= a->disk_loads, b->disk_rejects -= a->disk_rejects;
  b->bwd_measured -= a->bwd_measured;
  for (int i = 0; i < CLPAR_OCL_CONV_ALGOS; i++) {
    b->runs[i] -= a->runs[i], b->timed[i] -= a->timed[i];
    b->bwd_runs[0][i] -= a->bwd_runs[0][i], b->bwd_runs[1][i] -= a->bwd_runs[1][i];
  }
}
