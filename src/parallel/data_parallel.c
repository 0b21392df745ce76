/* data_parallel.c — DataParallel (PyTorch's nn.DataParallel) over any set of devices.
 *
 * Forward: the batch is split along dim 0 (torch.chunk sizes, or in proportion to weights);
 * one host thread per device (OpenMP) uploads its chunk, brings its replica's parameters up to
 * date, runs the replica's forward and downloads the output; the outputs are concatenated on
 * the output device. Every step of that is a differentiable op, so backward needs nothing
 * special: the gradient of each replica parameter flows through two "replicate" nodes (device
 * to host, host to the parameter's device) into the wrapped module's parameter; the replicas'
 * gradients add up on the host, and one upload per parameter reaches the parameter.
 *
 * Each device's queue is driven by one thread at a time: transfers cross through host memory,
 * the main thread does the ones that touch devices[0], the input's and the output's device
 * before and after the parallel part, and each worker only touches its own device. That is
 * what lets PoCL's devices, and any in-order queue, run at the same time (DESIGN.md); PoCL's
 * basic devices deadlocked when two threads drove one queue at once.
 *
 * Replicas persist between steps. Replica 0 is the module itself on devices[0]; the others
 * are copies of its tree whose parameters are refreshed only when the original's memory
 * changed (storage version): a forward after an optimizer step copies each parameter once
 * (one download, one upload per replica), and a forward with frozen parameters copies none. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

typedef struct {
  clpar_device *dev;
  clpar_module *module; /* the wrapped module itself for replica 0 */
  int n_params;
  clpar_named **slots;      /* the replica's parameter entries, in flat order */
  clpar_tensor **stored;    /* the replica's own parameter memory (NULL for replica 0) */
  uint64_t *synced_version; /* the staged version each stored parameter holds */
} replica;

/* The host copy of the source parameters that every replica uploads from. */
typedef struct {
  int n;
  clpar_tensor **host;      /* on the host device */
  clpar_storage **from;     /* the source memory each was last copied from ... */
  uint64_t *from_version;   /* ... and its version then */
  uint64_t *version;        /* bumped at each new copy */
  clpar_tensor **step_view; /* this forward's graph entries on the host (or NULL) */
} staging;

typedef struct {
  int n;
  clpar_device **devices;
  clpar_device *output;
  float *weights; /* NULL: torch.chunk */
  replica *replicas;
  staging stage;
  pthread_mutex_t forward_lock; /* the replicas and the staging serve one forward at a time */
  pthread_mutex_t stats_lock;
  clpar_data_parallel_stats stats;
} dp_state;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- splitting ---- */

/* Rows per device: torch.chunk sizes (ceil(rows / n) each, fewer chunks than devices when rows
 * is small) or in proportion to the weights (largest remainders get the leftover rows). */
static void split_rows(const dp_state *st, int64_t rows, int64_t *sizes) {
  if (!st->weights) {
    int chunks = clpar_chunk_sizes(rows, st->n, sizes); /* rows >= 1 here */
    for (int i = chunks < 0 ? 0 : chunks; i < st->n; i++) sizes[i] = 0;
    return;
  }
  double total = 0, frac[64];
  for (int i = 0; i < st->n; i++) total += st->weights[i];
  int64_t given = 0;
  for (int i = 0; i < st->n; i++) {
    double exact = (double)rows * st->weights[i] / total;
    sizes[i] = (int64_t)floor(exact);
    frac[i] = exact - (double)sizes[i];
    given += sizes[i];
  }
  for (; given < rows; given++) {
    int best = 0;
    for (int i = 1; i < st->n; i++) best = frac[i] > frac[best] ? i : best;
    sizes[best]++;
    frac[best] = -1;
  }
}

int clpar_data_parallel_split(const clpar_module *dp, int64_t rows, int64_t *sizes) {
  if (!dp || !dp->parallel || !sizes)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_data_parallel_split: not a DataParallel module");
  if (rows < 1)
    return clpar_set_error(CLPAR_ERROR_EMPTY,
                           "clpar_data_parallel_split: %lld rows; a batch needs at least one",
                           (long long)rows);
  const dp_state *st = dp->parallel;
  split_rows(st, rows, sizes);
  return st->n;
}

/* ---- replicas ---- */

/* The parameter entries of m's tree in flat order (its own, then each child's). */
static int collect_slots(clpar_module *m, clpar_named **slots, int at) {
  for (int i = 0; i < m->n_params; i++) slots[at++] = &m->params[i];
  for (int i = 0; i < m->n_children; i++) at = collect_slots(m->children[i].item, slots, at);
  return at;
}

/* A copy of src's tree on dev: same types, forwards and user data (shared, not owned), and
 * parameters of its own, uninitialized until the first sync. */
static clpar_status clone_tree(const clpar_module *src, clpar_device *dev, clpar_module **out) {
  clpar_module *m;
  clpar_status s = clpar_module_create(src->type, src->forward, src->user, NULL, &m);
  for (int i = 0; s == CLPAR_OK && i < src->n_params; i++) {
    const clpar_tensor *p = src->params[i].item;
    clpar_tensor *copy;
    s = clpar_tensor_empty(dev, p->ndim, p->shape, &copy);
    if (s != CLPAR_OK) break;
    clpar_tensor_unscope(copy);
    s = clpar_module_add_parameter(m, src->params[i].name, copy);
    copy->requires_grad = 0; /* gradients go to the original, through the replicate node */
    clpar_tensor_free(copy);
  }
  for (int i = 0; s == CLPAR_OK && i < src->n_children; i++) {
    clpar_module *child;
    s = clone_tree(src->children[i].item, dev, &child);
    if (s == CLPAR_OK) s = clpar_module_add_child(m, src->children[i].name, child);
  }
  if (s != CLPAR_OK) {
    clpar_module_free(m);
    return s;
  }
  *out = m;
  return CLPAR_OK;
}

static void replica_free(replica *r, int is_source) {
  if (!is_source) clpar_module_free(r->module); /* frees the per-step views in its slots */
  for (int j = 0; r->stored && j < r->n_params; j++) clpar_tensor_release(r->stored[j]);
  free(r->slots);
  free(r->stored);
  free(r->synced_version);
}

static clpar_status replica_init(replica *r, clpar_module *source, clpar_device *dev,
                                 int is_source) {
  r->dev = dev;
  r->n_params = clpar_module_entry_count(source);
  clpar_status s = is_source ? CLPAR_OK : clone_tree(source, dev, &r->module);
  if (is_source) r->module = source;
  size_t n = (size_t)(r->n_params ? r->n_params : 1);
  r->slots = calloc(n, sizeof *r->slots);
  r->stored = is_source ? NULL : calloc(n, sizeof *r->stored);
  r->synced_version = calloc(n, sizeof *r->synced_version);
  if (s == CLPAR_OK && (!r->slots || (!is_source && !r->stored) || !r->synced_version))
    s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "DataParallel: out of host memory");
  if (s == CLPAR_OK) collect_slots(r->module, r->slots, 0);
  for (int j = 0; s == CLPAR_OK && !is_source && j < r->n_params; j++)
    r->stored[j] = clpar_tensor_retain(r->slots[j]->item);
  return s;
}

static void staging_free(staging *sg) {
  for (int j = 0; j < sg->n; j++) {
    if (sg->host) clpar_tensor_free(sg->host[j]);
    if (sg->step_view) clpar_tensor_free(sg->step_view[j]);
  }
  free(sg->host);
  free(sg->from);
  free(sg->from_version);
  free(sg->version);
  free(sg->step_view);
}

static clpar_status staging_init(staging *sg, replica *source) {
  size_t n = (size_t)(source->n_params ? source->n_params : 1);
  sg->n = source->n_params;
  sg->host = calloc(n, sizeof *sg->host);
  sg->from = calloc(n, sizeof *sg->from);
  sg->from_version = calloc(n, sizeof *sg->from_version);
  sg->version = calloc(n, sizeof *sg->version);
  sg->step_view = calloc(n, sizeof *sg->step_view);
  if (!sg->host || !sg->from || !sg->from_version || !sg->version || !sg->step_view)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "DataParallel: out of host memory");
  for (int j = 0; j < sg->n; j++) {
    const clpar_tensor *p = source->slots[j]->item;
    clpar_status s = clpar_tensor_empty(clpar_device_host(), p->ndim, p->shape, &sg->host[j]);
    if (s != CLPAR_OK) return s;
    clpar_tensor_unscope(sg->host[j]);
  }
  return CLPAR_OK;
}

static void add_reduce_time(clpar_node *n, double dt) {
  dp_state *st = n->ctx;
  pthread_mutex_lock(&st->stats_lock);
  st->stats.reduce_seconds += dt;
  pthread_mutex_unlock(&st->stats_lock);
}

/* The two halves of the way back from a replica parameter to the source parameter: from the
 * replica's device to the host (run by that device's thread), and, once every replica's
 * gradient has been added up on the host, from the host to the source's device. */
static clpar_status replicate_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  double t0 = now();
  clpar_status s = clpar_tensor_to(g, n->inputs[0]->storage->dev, &gin[0]);
  add_reduce_time(n, now() - t0);
  return s;
}

/* A view of t's memory whose node (op, on device dev) leads back to input. */
static clpar_status graph_view(dp_state *st, clpar_tensor *t, clpar_tensor *input,
                               clpar_device *dev, clpar_tensor **out) {
  clpar_tensor *view;
  clpar_status s = clpar_tensor_alias(t, &view);
  if (s != CLPAR_OK) return s;
  clpar_tensor_unscope(view);
  if (input->requires_grad && clpar_is_grad_enabled()) {
    clpar_node *node = clpar_record(view, "DataParallel replicate", replicate_backward, &input, 1);
    if (!node) {
      clpar_tensor_free(view);
      return CLPAR_ERROR_OUT_OF_MEMORY;
    }
    node->dev = dev;
    node->ctx = st;
  }
  *out = view;
  return CLPAR_OK;
}

/* Main thread, before the replicas run: downloads each source parameter that changed since
 * the last forward, and makes this forward's host-side graph entries. Returns the number of
 * parameters downloaded, or -1 (error set). */
static int stage_parameters(dp_state *st) {
  staging *sg = &st->stage;
  int copied = 0;
  for (int j = 0; j < sg->n; j++) {
    clpar_tensor *src = st->replicas[0].slots[j]->item;
    if (sg->from[j] != src->storage || sg->from_version[j] != src->storage->version) {
      uint64_t version = src->storage->version; /* before the copy: a later change is seen */
      if (clpar_copy(sg->host[j], src) != CLPAR_OK) return -1;
      sg->from[j] = src->storage;
      sg->from_version[j] = version;
      sg->version[j]++;
      copied++;
    }
    clpar_tensor_free(sg->step_view[j]);
    sg->step_view[j] = NULL;
    if (graph_view(st, sg->host[j], src, src->storage->dev, &sg->step_view[j]) != CLPAR_OK)
      return -1;
  }
  return copied;
}

/* Worker k: uploads what changed into replica k's parameters and puts this forward's views of
 * them, leading back to the host entries, in its slots. Returns the uploads, or -1. */
static int replica_sync(dp_state *st, replica *r) {
  staging *sg = &st->stage;
  int copied = 0;
  for (int j = 0; j < r->n_params; j++) {
    if (r->synced_version[j] != sg->version[j]) {
      if (clpar_copy(r->stored[j], sg->host[j]) != CLPAR_OK) return -1;
      r->synced_version[j] = sg->version[j];
      copied++;
    }
    clpar_tensor *view;
    if (graph_view(st, r->stored[j], sg->step_view[j], r->dev, &view) != CLPAR_OK) return -1;
    clpar_tensor_release(r->slots[j]->item); /* the module's reference */
    r->slots[j]->item = view;
  }
  return copied;
}

/* ---- forward ---- */

typedef struct {
  int k;               /* the device */
  int64_t start, rows; /* its chunk */
  clpar_tensor *chunk; /* staged by the main thread (NULL: a view of the input will do) */
  clpar_tensor *out;   /* the replica's output, on its device or staged on the host */
  clpar_status status;
  char message[1024];
  double t_scatter, t_replicate, t_apply, t_gather;
  int copied;
} replica_run;

/* Worker k: chunk up, replica forward, output down. Touches device k (and the host) only. */
static void run_replica(dp_state *st, clpar_tensor *input, int grad, replica_run *rr) {
  replica *r = &st->replicas[rr->k];
  clpar_set_grad_enabled(grad);
  clpar_scope *scope = clpar_scope_begin(); /* what the forward makes on this thread */
  clpar_tensor *chunk = rr->chunk, *moved = NULL, *y = NULL, *down = NULL;
  double t0 = now();
  clpar_status s = chunk ? CLPAR_OK : clpar_tensor_rows(input, rr->start, rr->rows, &chunk);
  if (s == CLPAR_OK && chunk->storage->dev != r->dev) s = clpar_tensor_to(chunk, r->dev, &moved);
  double t1 = now();
  if (s == CLPAR_OK && rr->k > 0) {
    rr->copied = replica_sync(st, r);
    if (rr->copied < 0) s = CLPAR_ERROR_BACKEND; /* the message is set */
  }
  double t2 = now();
  if (s == CLPAR_OK) s = clpar_module_forward(r->module, moved ? moved : chunk, &y);
  double t3 = now();
  if (s == CLPAR_OK && y->storage->dev != st->output && y->storage->dev != clpar_device_host())
    s = clpar_tensor_to(y, clpar_device_host(), &down);
  if (s == CLPAR_OK) rr->out = clpar_tensor_retain(down ? down : y);
  rr->t_scatter = t1 - t0;
  rr->t_replicate = t2 - t1;
  rr->t_apply = t3 - t2;
  rr->t_gather = now() - t3;
  rr->status = s;
  if (s != CLPAR_OK) snprintf(rr->message, sizeof rr->message, "%s", clpar_last_error());
  clpar_scope_end(scope);
}

static double max_of(const replica_run *runs, int n, size_t offset) {
  double m = 0;
  for (int i = 0; i < n; i++) {
    double v = *(const double *)((const char *)&runs[i] + offset);
    m = v > m ? v : m;
  }
  return m;
}

static void add_stats(dp_state *st, const replica_run *runs, int used,
                      const double main_thread[3]) {
  pthread_mutex_lock(&st->stats_lock);
  st->stats.forwards++;
  st->stats.scatter_seconds +=
      main_thread[0] + max_of(runs, used, offsetof(replica_run, t_scatter));
  st->stats.replicate_seconds +=
      main_thread[1] + max_of(runs, used, offsetof(replica_run, t_replicate));
  st->stats.apply_seconds += max_of(runs, used, offsetof(replica_run, t_apply));
  st->stats.gather_seconds += main_thread[2] + max_of(runs, used, offsetof(replica_run, t_gather));
  for (int i = 0; i < used; i++)
    st->stats.parameters_copied += (uint64_t)(runs[i].copied > 0 ? runs[i].copied : 0);
  pthread_mutex_unlock(&st->stats_lock);
}

/* Main thread: the replicas' runs (which device, which rows), with the chunks that must leave
 * the input's device staged on the host. */
static clpar_status plan_runs(dp_state *st, clpar_tensor *input, replica_run *runs, int *used) {
  int64_t sizes[64];
  split_rows(st, input->shape[0], sizes);
  clpar_device *host = clpar_device_host();
  int n = 0;
  clpar_status s = CLPAR_OK;
  for (int k = 0, at = 0; k < st->n && s == CLPAR_OK; at += (int)sizes[k], k++) {
    if (sizes[k] == 0) continue;
    replica_run *rr = &runs[n++];
    rr->k = k;
    rr->start = at;
    rr->rows = sizes[k];
    clpar_device *from = input->storage->dev;
    if (from == st->devices[k] || from == host) continue;
    clpar_tensor *view;
    s = clpar_tensor_rows(input, at, sizes[k], &view);
    if (s == CLPAR_OK) s = clpar_tensor_to(view, host, &rr->chunk);
    if (s == CLPAR_OK) clpar_tensor_unscope(rr->chunk);
    clpar_tensor_free(view);
  }
  *used = n;
  return s;
}

/* Main thread: each output to the output device, then one tensor of them all. */
static clpar_status gather(dp_state *st, replica_run *runs, int used, clpar_tensor **output) {
  clpar_tensor *parts[64] = {0}, *moved[64] = {0};
  clpar_status s = CLPAR_OK;
  for (int i = 0; i < used && s == CLPAR_OK; i++) {
    if (runs[i].out->storage->dev == st->output)
      parts[i] = runs[i].out;
    else if ((s = clpar_tensor_to(runs[i].out, st->output, &moved[i])) == CLPAR_OK)
      parts[i] = moved[i];
  }
  if (s == CLPAR_OK)
    s = used == 1 ? clpar_tensor_reshape(parts[0], parts[0]->ndim, parts[0]->shape, output)
                  : clpar_concat(parts, used, output);
  for (int i = 0; i < used; i++) clpar_tensor_free(moved[i]);
  return s;
}

static clpar_status dp_forward_locked(dp_state *st, clpar_tensor *input, clpar_tensor **output) {
  replica_run *runs = calloc((size_t)st->n, sizeof *runs);
  if (!runs) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "DataParallel: out of host memory");
  int used = 0, grad = clpar_is_grad_enabled();
  double main_thread[3], t0 = now();
  clpar_status s = plan_runs(st, input, runs, &used);
  double t1 = now();
  int replicas_run = 0;
  for (int i = 0; i < used; i++) replicas_run |= runs[i].k > 0;
  if (s == CLPAR_OK && replicas_run && stage_parameters(st) < 0) s = CLPAR_ERROR_BACKEND;
  main_thread[0] = t1 - t0;
  main_thread[1] = now() - t1;
  if (s == CLPAR_OK) {
#pragma omp parallel for num_threads(used) schedule(static, 1) if (used > 1)
    for (int i = 0; i < used; i++) run_replica(st, input, grad, &runs[i]);
  }
  for (int i = 0; i < used && s == CLPAR_OK; i++)
    if (runs[i].status != CLPAR_OK)
      s = clpar_set_error(runs[i].status, "DataParallel replica on %s: %s",
                          st->devices[runs[i].k]->bd.info.id, runs[i].message);
  double t2 = now();
  if (s == CLPAR_OK) s = gather(st, runs, used, output);
  main_thread[2] = now() - t2;
  for (int i = 0; i < used; i++) {
    clpar_tensor_release(runs[i].out); /* retained by its worker */
    clpar_tensor_free(runs[i].chunk);
  }
  if (s == CLPAR_OK) add_stats(st, runs, used, main_thread);
  free(runs);
  return s;
}

static clpar_status dp_forward(clpar_module *self, clpar_tensor *input, clpar_tensor **output,
                               void *user) {
  dp_state *st = user;
  (void)self;
  if (input->ndim < 1 || input->shape[0] < 1)
    return clpar_set_error(CLPAR_ERROR_EMPTY, "DataParallel: the input has no rows to split");
  pthread_mutex_lock(&st->forward_lock);
  clpar_status s = dp_forward_locked(st, input, output);
  pthread_mutex_unlock(&st->forward_lock);
  return s;
}

/* ---- the wrapper ---- */

static void dp_free(void *user) {
  dp_state *st = user;
  if (!st) return;
  staging_free(&st->stage);
  for (int k = 0; st->replicas && k < st->n; k++) replica_free(&st->replicas[k], k == 0);
  free(st->replicas);
  free(st->devices);
  free(st->weights);
  pthread_mutex_destroy(&st->stats_lock);
  pthread_mutex_destroy(&st->forward_lock);
  free(st);
}

/* Checks the options and copies them into a new state (replicas not made yet). */
static clpar_status make_state(const clpar_data_parallel_options *o, dp_state **out) {
  int n = o && o->n_devices > 0 ? o->n_devices : clpar_device_count();
  if (o && o->n_devices > 0 && !o->devices)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_data_parallel_create: %d devices but devices is NULL",
                           o->n_devices);
  if (n < 1 || n > 64)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_data_parallel_create: %d devices (1 to 64)", n);
  dp_state *st = calloc(1, sizeof *st);
  if (!st) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "DataParallel: out of host memory");
  pthread_mutex_init(&st->stats_lock, NULL);
  pthread_mutex_init(&st->forward_lock, NULL);
  st->n = n;
  st->devices = calloc((size_t)n, sizeof *st->devices);
  st->replicas = calloc((size_t)n, sizeof *st->replicas);
  st->weights = o && o->weights ? calloc((size_t)n, sizeof *st->weights) : NULL;
  clpar_status s =
      st->devices && st->replicas && (!o || !o->weights || st->weights)
          ? CLPAR_OK
          : clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "DataParallel: out of host memory");
  for (int i = 0; s == CLPAR_OK && i < n; i++) {
    st->devices[i] = o && o->n_devices > 0 ? o->devices[i] : clpar_device_get(i);
    if (!st->devices[i])
      s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                          "clpar_data_parallel_create: device %d is NULL", i);
    for (int j = 0; s == CLPAR_OK && j < i; j++)
      if (st->devices[j] == st->devices[i])
        s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                            "clpar_data_parallel_create: %s is listed twice",
                            st->devices[i]->bd.info.id);
    if (s == CLPAR_OK && st->weights) {
      st->weights[i] = o->weights[i];
      if (!(o->weights[i] > 0.0f) || !isfinite(o->weights[i]))
        s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                            "clpar_data_parallel_create: weight %d is %g; weights must be > 0", i,
                            (double)o->weights[i]);
    }
  }
  st->output = o && o->output_device ? o->output_device : st->devices[0];
  if (s != CLPAR_OK) {
    dp_free(st);
    return s;
  }
  *out = st;
  return CLPAR_OK;
}

clpar_status clpar_data_parallel_create(clpar_module *module,
                                        const clpar_data_parallel_options *options,
                                        clpar_module **out) {
  if (!module || !out) {
    clpar_module_free(module);
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_data_parallel_create: NULL module or out");
  }
  dp_state *st = NULL;
  clpar_status s = make_state(options, &st);
  /* The parameters live on devices[0] (moved there in place if they are elsewhere). */
  if (s == CLPAR_OK) s = clpar_module_to(module, st->devices[0]);
  for (int k = 0; s == CLPAR_OK && k < st->n; k++)
    s = replica_init(&st->replicas[k], module, st->devices[k], k == 0);
  if (s == CLPAR_OK && st->n > 1) s = staging_init(&st->stage, &st->replicas[0]);
  clpar_module *dp = NULL;
  if (s == CLPAR_OK)
    s = clpar_module_create("DataParallel", dp_forward, st, dp_free, &dp);
  else
    dp_free(st);
  if (s != CLPAR_OK) {
    clpar_module_free(module);
    return s;
  }
  dp->parallel = st;
  s = clpar_module_add_child(dp, "module", module); /* frees module on error */
  if (s != CLPAR_OK) {
    clpar_module_free(dp);
    return s;
  }
  *out = dp;
  return CLPAR_OK;
}

clpar_status clpar_data_parallel_stats_get(const clpar_module *dp, clpar_data_parallel_stats *out) {
  if (!dp || !dp->parallel || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_data_parallel_stats_get: not a DataParallel module");
  dp_state *st = dp->parallel;
  pthread_mutex_lock(&st->stats_lock);
  *out = st->stats;
  pthread_mutex_unlock(&st->stats_lock);
  return CLPAR_OK;
}

clpar_status clpar_data_parallel_stats_reset(clpar_module *dp) {
  if (!dp || !dp->parallel)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_data_parallel_stats_reset: not a DataParallel module");
  dp_state *st = dp->parallel;
  pthread_mutex_lock(&st->stats_lock);
  memset(&st->stats, 0, sizeof st->stats);
  pthread_mutex_unlock(&st->stats_lock);
  return CLPAR_OK;
}
