/* batchnorm2d.c — the BatchNorm2d module (nn.BatchNorm2d): parameters weight and bias, buffers
 * running_mean, running_var and num_batches_tracked, over clpar_batch_norm in the mode
 * clpar_module_is_training gives.
 *
 * num_batches_tracked is an int64 tensor, and no op adds to int tensors on a device. Reading
 * it back before each increment would make every training forward wait for the device once
 * per BatchNorm (53 times a step in a ResNet-50), so the module remembers the value it last
 * wrote, with the tensor and the tensor's storage version after that write: while both are
 * unchanged the next value is written without a read. Anything else that wrote the counter
 * (a checkpoint load, a copy, a move) changed the version, and the value is then read once.
 * The remembered state is in the module's user data, which a DataParallel replica shares: it
 * is locked, and it names the tensor it counted. A replica on another device does not count:
 * DataParallel overwrites its buffers from the module's before every forward, so its count
 * would never be seen (PyTorch's replicas count and drop it), and counting would read its
 * freshly copied counter back, one host wait per BatchNorm per replica per step. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct {
  int64_t num_features;
  float eps, momentum;
  int track;
  pthread_mutex_t lock;
  clpar_tensor *counted; /* the counter last written (a reference), NULL before */
  uint64_t counted_version;
  int64_t count;
} bn_config;

static void bn_config_free(void *user) {
  bn_config *c = user;
  if (!c) return;
  clpar_graph_invalidate_all("the freeing of a BatchNorm2d module"); /* a graph's write uses c */
  clpar_tensor_release(c->counted);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

/* The next count into value, the counter's version moved as a write moves it: a captured
 * step's write of the counter (clpar_capture_host_write), at the capture and at each replay. */
static void count_again(void *user, void *value) {
  bn_config *c = user;
  pthread_mutex_lock(&c->lock);
  c->count++;
  memcpy(value, &c->count, sizeof c->count);
  clpar_tensor_touch(c->counted);
  c->counted_version = __atomic_load_n(&c->counted->storage->version, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&c->lock);
}

/* num_batches_tracked += 1, reading it only when someone else may have written it. */
static clpar_status count_batch(bn_config *c, clpar_tensor *counter) {
  clpar_device *dev = counter->storage->dev;
  pthread_mutex_lock(&c->lock);
  int known = c->counted == counter &&
              c->counted_version == __atomic_load_n(&counter->storage->version, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&c->lock);
  if (known && clpar_capture_active(dev)) /* counted at each replay too */
    return clpar_capture_host_write(dev, counter->storage->buf, counter->offset * CLPAR_WORD_BYTES,
                                    sizeof c->count, count_again, c, NULL);
  pthread_mutex_lock(&c->lock);
  int64_t n = c->count;
  clpar_status s = CLPAR_OK;
  if (c->counted != counter ||
      c->counted_version != __atomic_load_n(&counter->storage->version, __ATOMIC_RELAXED))
    s = clpar_tensor_read_raw(counter, &n, sizeof n);
  if (s == CLPAR_OK) {
    n++;
    s = clpar_tensor_write_raw(counter, &n, sizeof n);
  }
  if (s == CLPAR_OK) {
    if (c->counted != counter) {
      clpar_tensor_release(c->counted);
      c->counted = clpar_tensor_retain(counter);
    }
    c->counted_version = __atomic_load_n(&counter->storage->version, __ATOMIC_RELAXED);
    c->count = n;
  }
  pthread_mutex_unlock(&c->lock);
  return s;
}

static clpar_status bn_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y, void *user) {
  bn_config *c = user;
  if (x->ndim != 4) {
    char b[128];
    return clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                           "BatchNorm2d: expected 4-D input [N, %lld, H, W], got %s",
                           (long long)c->num_features, clpar_tensor_shape_str(x, b, sizeof b));
  }
  int training = clpar_module_is_training(self);
  clpar_tensor *mean = NULL, *var = NULL, *counter = NULL;
  if (c->track) {
    mean = clpar_module_buffer(self, "running_mean");
    var = clpar_module_buffer(self, "running_var");
    counter = clpar_module_buffer(self, "num_batches_tracked");
    if (!mean || !var || !counter)
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                             "BatchNorm2d: a running-statistics buffer was removed");
  }
  /* As PyTorch's _BatchNorm: batch statistics when training or when no running statistics are
   * kept; the running statistics are updated only when training. */
  clpar_status s = clpar_batch_norm(x, mean, var, clpar_module_parameter(self, "weight"),
                                    clpar_module_parameter(self, "bias"), training || !c->track,
                                    c->momentum, c->eps, y);
  if (s == CLPAR_OK && training && c->track && !self->replica) {
    s = count_batch(c, counter);
    if (s != CLPAR_OK) {
      clpar_tensor_free(*y);
      *y = NULL;
    }
  }
  return s;
}

/* Creates a [n] float tensor filled with value and registers it (parameter or buffer). */
static clpar_status add_filled(clpar_module *m, const char *name, int is_buffer, int64_t n,
                               float value, clpar_device *dev) {
  clpar_tensor *t = NULL;
  clpar_status s = clpar_tensor_zeros(dev, 1, &n, &t);
  if (s == CLPAR_OK && value != 0.0f) s = clpar_fill(t, value);
  if (s == CLPAR_OK)
    s = is_buffer ? clpar_module_add_buffer(m, name, t) : clpar_module_add_parameter(m, name, t);
  clpar_tensor_free(t);
  return s;
}

clpar_status clpar_batchnorm2d_create(int64_t num_features,
                                      const clpar_batchnorm2d_options *options, clpar_device *dev,
                                      clpar_module **out) {
  const char *fn = "clpar_batchnorm2d_create";
  clpar_batchnorm2d_options o = options ? *options : (clpar_batchnorm2d_options){0};
  float eps = clpar_opt_float(o.eps, 1e-5f), momentum = clpar_opt_float(o.momentum, 0.1f);
  int affine = !o.no_affine, track_running_stats = !o.no_running_stats;
  if (!out || !dev)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL device or out", fn);
  if (num_features < 1)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: num_features is %lld; must be >= 1",
                           fn, (long long)num_features);
  if (!(eps > 0.0f) || !(momentum >= 0.0f && momentum <= 1.0f))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: options.eps %g must be > 0 and options.momentum %g in [0, 1] "
                           "(0 is written CLPAR_ZERO, since 0 means PyTorch's default 0.1)",
                           fn, (double)eps, (double)momentum);
  if (!clpar_is_initialized())
    return clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED, "%s: call clpar_init first", fn);
  int64_t numel;
  clpar_status s = clpar_check_size("clpar_batchnorm2d_create", dev, 1, &num_features, &numel);
  if (s != CLPAR_OK) return s;
  bn_config *c = calloc(1, sizeof *c);
  if (!c)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY,
                           "clpar_batchnorm2d_create: out of host memory");
  *c = (bn_config){.num_features = num_features,
                   .eps = eps,
                   .momentum = momentum,
                   .track = track_running_stats != 0};
  pthread_mutex_init(&c->lock, NULL);
  clpar_module *m;
  s = clpar_module_create("BatchNorm2d", bn_forward, c, bn_config_free, &m);
  if (s != CLPAR_OK) {
    bn_config_free(c);
    return s;
  }
  if (affine) {
    s = add_filled(m, "weight", 0, num_features, 1.0f, dev);
    if (s == CLPAR_OK) s = add_filled(m, "bias", 0, num_features, 0.0f, dev);
  }
  if (s == CLPAR_OK && c->track) {
    s = add_filled(m, "running_mean", 1, num_features, 0.0f, dev);
    if (s == CLPAR_OK) s = add_filled(m, "running_var", 1, num_features, 1.0f, dev);
    clpar_tensor *counter = NULL;
    if (s == CLPAR_OK) s = clpar_tensor_zeros_dtype(dev, CLPAR_INT64, 0, NULL, &counter);
    if (s == CLPAR_OK) s = clpar_module_add_buffer(m, "num_batches_tracked", counter);
    clpar_tensor_free(counter);
  }
  if (s != CLPAR_OK) {
    clpar_module_free(m);
    return s;
  }
  *out = m;
  return CLPAR_OK;
}
