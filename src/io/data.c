/* data.c — datasets in host memory and the batch loader.
 *
 * The loader keeps two host slots: while the caller holds one (its batch's labels stay valid
 * until the next call), a background thread gathers the rows of the next batch into the other,
 * in the order of the epoch's permutation. clpar_loader_next then uploads the ready slot with
 * clpar_tensor_from_host, which copies into the runtime's staging memory and posts the write to
 * the device's worker, so the caller does not wait for the transfer. The producer runs across
 * epoch boundaries; each epoch's permutation comes from (seed, epoch) alone, so a resumed run
 * (clpar_loader_set_epoch) sees the batches an uninterrupted one would have. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "io/dataset.h"

/* ---- datasets ---- */

clpar_status clpar_dataset_adopt(int64_t n, int ndim, const int64_t *shape, float *x, int32_t *y,
                                 clpar_dataset **out) {
  clpar_dataset *ds = calloc(1, sizeof *ds);
  if (!ds) {
    free(x);
    free(y);
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "dataset: out of host memory");
  }
  ds->n = n;
  ds->ndim = ndim;
  ds->row = 1;
  for (int i = 0; i < ndim; i++) {
    ds->shape[i] = shape[i];
    ds->row *= shape[i];
  }
  ds->x = x;
  ds->y = y;
  *out = ds;
  return CLPAR_OK;
}

/* Checks the sample shape and n; *row: floats per sample. */
static clpar_status check_shape(const char *fn, int64_t n, int ndim, const int64_t *shape,
                                int64_t *row) {
  if (n < 1)
    return clpar_set_error(CLPAR_ERROR_EMPTY, "%s: no samples (n = %lld)", fn, (long long)n);
  if (ndim < 1 || ndim > CLPAR_NPY_MAX_DIMS - 1 || !shape)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: a sample needs 1 to %d dimensions, got %d", fn,
                           CLPAR_NPY_MAX_DIMS - 1, ndim);
  int64_t r = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 1 || r > INT64_MAX / 8 / shape[i] / n)
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                             "%s: sample dimension %d is %lld (or the size overflows)", fn, i,
                             (long long)shape[i]);
    r *= shape[i];
  }
  *row = r;
  return CLPAR_OK;
}

clpar_status clpar_dataset_from_arrays(int64_t n, int sample_ndim, const int64_t *sample_shape,
                                       const float *features, const int32_t *labels,
                                       clpar_dataset **out) {
  const char *fn = "clpar_dataset_from_arrays";
  if (!features || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL features or out", fn);
  int64_t row;
  clpar_status s = check_shape(fn, n, sample_ndim, sample_shape, &row);
  if (s != CLPAR_OK) return s;
  float *x = malloc((size_t)(n * row) * sizeof *x);
  int32_t *y = calloc((size_t)n, sizeof *y);
  if (!x || !y) {
    free(x);
    free(y);
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  }
  memcpy(x, features, (size_t)(n * row) * sizeof *x);
  if (labels) memcpy(y, labels, (size_t)n * sizeof *y);
  return clpar_dataset_adopt(n, sample_ndim, sample_shape, x, y, out);
}

/* Converts a's data to float in place; NULL when out of memory. */
static float *to_float(clpar_npy_array *a) {
  if (a->dtype == CLPAR_NPY_F32) return a->data;
  float *x = malloc((size_t)(a->numel ? a->numel : 1) * sizeof *x);
  if (!x) return NULL;
  for (int64_t i = 0; i < a->numel; i++)
    x[i] =
        a->dtype == CLPAR_NPY_I32 ? (float)((int32_t *)a->data)[i] : (float)((int64_t *)a->data)[i];
  free(a->data);
  a->data = x;
  return x;
}

static clpar_status to_labels(const char *path, clpar_npy_array *a) {
  if (a->dtype == CLPAR_NPY_F32)
    return clpar_set_error(CLPAR_ERROR_CORRUPT, "%s: labels must be int32 or int64, not float32",
                           path);
  if (a->dtype == CLPAR_NPY_I32) return CLPAR_OK;
  const int64_t *v = a->data;
  int32_t *y = malloc((size_t)(a->numel ? a->numel : 1) * sizeof *y);
  if (!y) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", path);
  for (int64_t i = 0; i < a->numel; i++) {
    if (v[i] < INT32_MIN || v[i] > INT32_MAX) {
      free(y);
      return clpar_set_error(CLPAR_ERROR_CORRUPT, "%s: label %lld (element %lld) is outside int32",
                             path, (long long)v[i], (long long)i);
    }
    y[i] = (int32_t)v[i];
  }
  free(a->data);
  a->data = y;
  a->dtype = CLPAR_NPY_I32;
  return CLPAR_OK;
}

clpar_status clpar_dataset_from_npy(const char *features_path, const char *labels_path,
                                    clpar_dataset **out) {
  if (!features_path || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_dataset_from_npy: NULL features_path or out");
  clpar_npy_array x = {0}, y = {0};
  int64_t row;
  clpar_status s = clpar_npy_read(features_path, &x);
  if (s == CLPAR_OK && x.ndim < 2)
    s = clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                        "%s: features need shape (N, ...) with at least 2 dimensions, got %d",
                        features_path, x.ndim);
  if (s == CLPAR_OK) s = check_shape(features_path, x.shape[0], x.ndim - 1, x.shape + 1, &row);
  if (s == CLPAR_OK && !to_float(&x))
    s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", features_path);
  if (s == CLPAR_OK && labels_path) {
    s = clpar_npy_read(labels_path, &y);
    if (s == CLPAR_OK && (y.ndim != 1 || y.shape[0] != x.shape[0]))
      s = clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                          "%s: labels need shape (%lld,) to match %s, got %d dimensions of "
                          "first size %lld",
                          labels_path, (long long)x.shape[0], features_path, y.ndim,
                          (long long)(y.ndim ? y.shape[0] : 0));
    if (s == CLPAR_OK) s = to_labels(labels_path, &y);
  } else if (s == CLPAR_OK) {
    y.data = calloc((size_t)x.shape[0], sizeof(int32_t));
    if (!y.data) s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: no memory", features_path);
  }
  if (s != CLPAR_OK) {
    clpar_npy_array_free(&x);
    clpar_npy_array_free(&y);
    return s;
  }
  return clpar_dataset_adopt(x.shape[0], x.ndim - 1, x.shape + 1, x.data, y.data, out);
}

int64_t clpar_dataset_size(const clpar_dataset *ds) {
  return ds ? ds->n : 0;
}
int clpar_dataset_sample_ndim(const clpar_dataset *ds) {
  return ds ? ds->ndim : 0;
}
int64_t clpar_dataset_sample_dim(const clpar_dataset *ds, int i) {
  return ds && i >= 0 && i < ds->ndim ? ds->shape[i] : 0;
}
const float *clpar_dataset_features(const clpar_dataset *ds, int64_t i) {
  return ds && i >= 0 && i < ds->n ? ds->x + i * ds->row : NULL;
}
int32_t clpar_dataset_label(const clpar_dataset *ds, int64_t i) {
  return ds && i >= 0 && i < ds->n ? ds->y[i] : 0;
}
void clpar_dataset_free(clpar_dataset *ds) {
  if (!ds) return;
  free(ds->x);
  free(ds->y);
  free(ds);
}

/* ---- the permutation ---- */

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* order[0..n) for epoch: identity, or Fisher-Yates from a stream seeded by (seed, epoch). */
static void epoch_order(int shuffle, uint64_t seed, int64_t epoch, int64_t n, int64_t *order) {
  for (int64_t i = 0; i < n; i++) order[i] = i;
  if (!shuffle) return;
  uint64_t st = seed;
  uint64_t mix = splitmix64(&st) ^ (uint64_t)epoch * 0xD1B54A32D192ED03ull;
  st = mix;
  for (int64_t i = n - 1; i > 0; i--) {
    uint64_t m = (uint64_t)i + 1, limit = UINT64_MAX - UINT64_MAX % m, r;
    do r = splitmix64(&st);
    while (r >= limit); /* rejection: no modulo bias */
    int64_t j = (int64_t)(r % m), t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
}

/* ---- the loader ---- */

enum { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_HELD };

typedef struct loader_slot {
  int state;
  float *x;   /* (batch_size, row) */
  int32_t *y; /* (batch_size) */
  int64_t n;  /* rows filled */
} loader_slot;

struct clpar_loader {
  const clpar_dataset *ds;
  clpar_device *dev;
  clpar_loader_options opt;
  int64_t batches;
  int64_t epoch, b; /* the caller's next batch */
  uint64_t c_seq;   /* batches handed out since the thread started */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t thread;
  int running, stop;
  loader_slot slot[2];
  /* the producer's own */
  int64_t p_epoch, p_b, order_epoch;
  uint64_t p_seq;
  int64_t *order;
};

static void gather(clpar_loader *l, loader_slot *s) {
  if (l->order_epoch != l->p_epoch) {
    epoch_order(l->opt.shuffle, l->opt.seed, l->p_epoch, l->ds->n, l->order);
    l->order_epoch = l->p_epoch;
  }
  int64_t first = l->p_b * l->opt.batch_size, n = l->ds->n - first;
  if (n > l->opt.batch_size) n = l->opt.batch_size;
  size_t row = (size_t)l->ds->row;
  for (int64_t r = 0; r < n; r++) {
    int64_t i = l->order[first + r];
    memcpy(s->x + (size_t)r * row, l->ds->x + (size_t)i * row, row * sizeof(float));
    s->y[r] = l->ds->y[i];
  }
  s->n = n;
  if (++l->p_b == l->batches) {
    l->p_b = 0;
    l->p_epoch++;
  }
}

static void *producer(void *arg) {
  clpar_loader *l = arg;
  pthread_mutex_lock(&l->mu);
  for (;;) {
    loader_slot *s = &l->slot[l->p_seq % 2];
    while (!l->stop && s->state != SLOT_FREE) pthread_cond_wait(&l->cv, &l->mu);
    if (l->stop) break;
    s->state = SLOT_FILLING;
    pthread_mutex_unlock(&l->mu);
    gather(l, s);
    pthread_mutex_lock(&l->mu);
    s->state = SLOT_READY;
    l->p_seq++;
    pthread_cond_broadcast(&l->cv);
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

static void stop_thread(clpar_loader *l) {
  if (!l->running) return;
  pthread_mutex_lock(&l->mu);
  l->stop = 1;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
  pthread_join(l->thread, NULL);
  l->running = 0;
  l->stop = 0;
}

clpar_status clpar_loader_create(const clpar_dataset *ds, clpar_device *dev,
                                 const clpar_loader_options *opt, clpar_loader **out) {
  const char *fn = "clpar_loader_create";
  if (!ds || !dev || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL dataset, device or out", fn);
  clpar_loader_options given = opt ? *opt : (clpar_loader_options){0};
  if (given.batch_size == 0) given.batch_size = 1; /* DataLoader's default */
  opt = &given;
  if (opt->batch_size < 1)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: options.batch_size is %lld; must be >= 1 (0 means 1)", fn,
                           (long long)opt->batch_size);
  int64_t bs = opt->batch_size > ds->n ? ds->n : opt->batch_size;
  /* a ceiling without n + batch_size - 1, which overflows for a batch_size near INT64_MAX */
  int64_t batches = ds->n / opt->batch_size + (!opt->drop_last && ds->n % opt->batch_size != 0);
  if (batches < 1)
    return clpar_set_error(CLPAR_ERROR_EMPTY,
                           "%s: an epoch has no batch: %lld samples are fewer than batch_size "
                           "%lld and drop_last drops the partial batch",
                           fn, (long long)ds->n, (long long)opt->batch_size);
  clpar_loader *l = calloc(1, sizeof *l);
  if (!l) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  l->order = malloc((size_t)ds->n * sizeof *l->order);
  int ok = l->order != NULL;
  for (int k = 0; k < 2 && ok; k++) {
    l->slot[k].x = malloc((size_t)(bs * ds->row) * sizeof(float));
    l->slot[k].y = malloc((size_t)bs * sizeof(int32_t));
    ok = l->slot[k].x && l->slot[k].y;
  }
  if (!ok || pthread_mutex_init(&l->mu, NULL) != 0) {
    clpar_loader_free(l); /* nothing started: running is 0 and the mutex never locked */
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  }
  if (pthread_cond_init(&l->cv, NULL) != 0) {
    pthread_mutex_destroy(&l->mu);
    clpar_loader_free(l); /* l->ds is still NULL: free destroys neither */
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: cannot make a condition variable", fn);
  }
  l->ds = ds;
  l->dev = dev;
  l->opt = *opt;
  l->batches = batches;
  l->order_epoch = -1;
  *out = l;
  return CLPAR_OK;
}

static clpar_status start_thread(clpar_loader *l) {
  l->slot[0].state = l->slot[1].state = SLOT_FREE;
  l->p_epoch = l->epoch;
  l->p_b = l->b;
  l->p_seq = l->c_seq = 0;
  int e = pthread_create(&l->thread, NULL, producer, l);
  if (e != 0)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY,
                           "clpar_loader_next: cannot start the loader's thread (error %d)", e);
  l->running = 1;
  return CLPAR_OK;
}

clpar_status clpar_loader_next(clpar_loader *l, clpar_tensor **features, const int32_t **labels,
                               int64_t *batch) {
  if (!l) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_loader_next: NULL loader");
  if (features) *features = NULL;
  if (labels) *labels = NULL;
  if (batch) *batch = 0;
  if (!l->running) {
    clpar_status s = start_thread(l);
    if (s != CLPAR_OK) return s;
  }
  pthread_mutex_lock(&l->mu);
  loader_slot *held = &l->slot[(l->c_seq + 1) % 2];
  if (held->state == SLOT_HELD) { /* the previous batch: its labels are no longer the caller's */
    held->state = SLOT_FREE;
    pthread_cond_broadcast(&l->cv);
  }
  if (l->b == l->batches) { /* the end of the epoch */
    l->b = 0;
    l->epoch++;
    pthread_mutex_unlock(&l->mu);
    return CLPAR_OK;
  }
  loader_slot *s = &l->slot[l->c_seq % 2];
  while (s->state != SLOT_READY) pthread_cond_wait(&l->cv, &l->mu);
  pthread_mutex_unlock(&l->mu);
  if (features) {
    int64_t shape[CLPAR_NPY_MAX_DIMS];
    shape[0] = s->n;
    memcpy(shape + 1, l->ds->shape, (size_t)l->ds->ndim * sizeof *shape);
    clpar_status st = clpar_tensor_from_host(l->dev, 1 + l->ds->ndim, shape, s->x, features);
    if (st != CLPAR_OK) return st; /* the slot stays ready: the next call retries this batch */
  }
  pthread_mutex_lock(&l->mu);
  s->state = SLOT_HELD;
  l->c_seq++;
  l->b++;
  pthread_mutex_unlock(&l->mu);
  if (labels) *labels = s->y;
  if (batch) *batch = s->n;
  return CLPAR_OK;
}

int64_t clpar_loader_batches(const clpar_loader *l) {
  return l ? l->batches : 0;
}

clpar_status clpar_loader_order(const clpar_loader *l, int64_t epoch, int64_t *order) {
  if (!l || !order || epoch < 0)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_loader_order: NULL loader or order, or epoch < 0");
  epoch_order(l->opt.shuffle, l->opt.seed, epoch, l->ds->n, order);
  return CLPAR_OK;
}

int64_t clpar_loader_epoch(const clpar_loader *l) {
  return l ? l->epoch : 0;
}

clpar_status clpar_loader_set_epoch(clpar_loader *l, int64_t epoch) {
  if (!l || epoch < 0)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_loader_set_epoch: NULL loader or epoch < 0");
  stop_thread(l);
  l->epoch = epoch;
  l->b = 0;
  return CLPAR_OK;
}

void clpar_loader_free(clpar_loader *l) {
  if (!l) return;
  stop_thread(l);
  if (l->ds) { /* fully made: the mutex and condition exist */
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
  }
  for (int k = 0; k < 2; k++) {
    free(l->slot[k].x);
    free(l->slot[k].y);
  }
  free(l->order);
  free(l);
}
