/* checkpoint.c — save and load of ResNet-50's parameters (torchvision's names and shapes: 161
 * tensors, 25,557,032 floats, 102 MB; BatchNorm's running statistics are buffers, which clpar
 * does not have yet) as safetensors, in MB/s, against the plain speed of the same disk in the
 * same run: the same bytes written with write + fsync, and read back with read. clpar's save
 * adds reading the parameters from the device, the header, the rename and the directory's
 * fsync; its load adds parsing and writing the parameters to the device. Each figure is the
 * best of `reps` runs; both reads come from the page cache alike (the file was just written).
 * Prints one JSON object.
 *
 *   ./bench_checkpoint [directory] [device-index] [reps] */
#include <clpar/clpar.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"

static clpar_status no_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y, void *u) {
  (void)self;
  (void)x;
  (void)y;
  (void)u;
  return CLPAR_ERROR_UNSUPPORTED;
}

static clpar_device *dev;
static uint64_t seed = 1;
static int64_t floats;

static clpar_module *node(void) {
  clpar_module *m = NULL;
  bench_ok(clpar_module_create("Module", no_forward, NULL, NULL, &m), "module");
  return m;
}

static int param(clpar_module *m, const char *name, int ndim, const int64_t *shape) {
  clpar_tensor *t;
  if (!bench_ok(clpar_tensor_rand_uniform(dev, ndim, shape, seed++, -0.1f, 0.1f, &t), "rand"))
    return 0;
  floats += clpar_tensor_numel(t);
  int ok = bench_ok(clpar_module_add_parameter(m, name, t), "add_parameter");
  clpar_tensor_free(t);
  return ok;
}

/* child name of m: a convolution's weight [out, in, k, k] */
static int conv(clpar_module *m, const char *name, int64_t out, int64_t in, int64_t k) {
  clpar_module *c = node();
  return c && param(c, "weight", 4, (int64_t[]){out, in, k, k}) &&
         bench_ok(clpar_module_add_child(m, name, c), "add_child");
}

/* child name of m: BatchNorm's weight and bias [n] */
static int bn(clpar_module *m, const char *name, int64_t n) {
  clpar_module *b = node();
  return b && param(b, "weight", 1, (int64_t[]){n}) && param(b, "bias", 1, (int64_t[]){n}) &&
         bench_ok(clpar_module_add_child(m, name, b), "add_child");
}

/* torchvision's resnet50(): Bottleneck blocks [3, 4, 6, 3]. */
static clpar_module *resnet50(void) {
  clpar_module *r = node();
  int ok = r && conv(r, "conv1", 64, 3, 7) && bn(r, "bn1", 64);
  const int blocks[4] = {3, 4, 6, 3};
  int64_t in = 64;
  for (int l = 0; ok && l < 4; l++) {
    int64_t p = 64 << l;
    clpar_module *layer = node();
    for (int b = 0; ok && layer && b < blocks[l]; b++) {
      clpar_module *blk = node();
      ok = blk && conv(blk, "conv1", p, in, 1) && bn(blk, "bn1", p) &&
           conv(blk, "conv2", p, p, 3) && bn(blk, "bn2", p) && conv(blk, "conv3", 4 * p, p, 1) &&
           bn(blk, "bn3", 4 * p);
      if (ok && b == 0) {
        clpar_module *down = node();
        ok = down && conv(down, "0", 4 * p, in, 1) && bn(down, "1", 4 * p) &&
             bench_ok(clpar_module_add_child(blk, "downsample", down), "add_child");
      }
      char name[16];
      snprintf(name, sizeof name, "%d", b);
      ok = ok && bench_ok(clpar_module_add_child(layer, name, blk), "add_child");
      in = 4 * p;
    }
    char name[16];
    snprintf(name, sizeof name, "layer%d", l + 1);
    ok = ok && layer && bench_ok(clpar_module_add_child(r, name, layer), "add_child");
  }
  clpar_module *fc = node();
  ok = ok && fc && param(fc, "weight", 2, (int64_t[]){1000, 2048}) &&
       param(fc, "bias", 1, (int64_t[]){1000}) &&
       bench_ok(clpar_module_add_child(r, "fc", fc), "add_child");
  if (!ok) {
    clpar_module_free(r);
    return NULL;
  }
  return r;
}

static int plain_write(const char *path, const void *buf, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return 0;
  const char *p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w <= 0) break;
    p += w;
    n -= (size_t)w;
  }
  int ok = n == 0 && fsync(fd) == 0;
  return close(fd) == 0 && ok;
}

static int plain_read(const char *path, void *buf, size_t n) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return 0;
  char *p = buf;
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r <= 0) break;
    p += r;
    n -= (size_t)r;
  }
  close(fd);
  return n == 0;
}

static double best(double a, double b) {
  return a < 0 || b < a ? b : a;
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : ".";
  int index = argc > 2 ? atoi(argv[2]) : 0, reps = argc > 3 ? atoi(argv[3]) : 3;
  if (!bench_ok(clpar_init(), "clpar_init")) return 1;
  dev = clpar_device_get(index);
  clpar_module *net = dev ? resnet50() : NULL;
  if (!net) {
    fprintf(stderr, "no model: %s\n", clpar_last_error());
    clpar_shutdown();
    return 1;
  }
  char path[4096], plain[4096];
  snprintf(path, sizeof path, "%s/bench_checkpoint.safetensors", dir);
  snprintf(plain, sizeof plain, "%s/bench_checkpoint.plain", dir);
  size_t bytes = (size_t)floats * sizeof(float);
  char *buf = malloc(bytes);
  for (size_t i = 0; buf && i < bytes; i++) buf[i] = (char)(i * 131);
  double w = -1, r = -1, save = -1, load = -1;
  int ok = buf != NULL;
  for (int i = 0; ok && i < reps; i++) {
    double t0 = now_seconds();
    ok = plain_write(plain, buf, bytes);
    double t1 = now_seconds();
    ok = ok && plain_read(plain, buf, bytes);
    double t2 = now_seconds();
    ok = ok && bench_ok(clpar_safetensors_save(net, path, NULL, NULL, 0), "save");
    double t3 = now_seconds();
    ok = ok && bench_ok(clpar_safetensors_load(net, path, 1, NULL), "load") &&
         bench_ok(clpar_device_synchronize(dev), "synchronize");
    double t4 = now_seconds();
    w = best(w, t1 - t0);
    r = best(r, t2 - t1);
    save = best(save, t3 - t2);
    load = best(load, t4 - t3);
  }
  if (ok) {
    double mb = (double)bytes / 1e6;
    printf(
        "{\"bench\": \"checkpoint\", \"model\": \"resnet50 parameters\", \"device\": \"%s\", "
        "\"tensors\": %d, \"MB\": %.1f, \"plain_write_MBps\": %.0f, \"save_MBps\": %.0f, "
        "\"save_ratio\": %.2f, \"plain_read_MBps\": %.0f, \"load_MBps\": %.0f, "
        "\"load_ratio\": %.2f, \"reps\": %d}\n",
        clpar_device_id(dev), clpar_module_parameter_count(net), mb, mb / w, mb / save, w / save,
        mb / r, mb / load, r / load, reps);
  } else {
    fprintf(stderr, "bench_checkpoint failed (in %s)\n", dir);
  }
  unlink(path);
  unlink(plain);
  free(buf);
  clpar_module_free(net);
  clpar_shutdown();
  return ok ? 0 : 1;
}
