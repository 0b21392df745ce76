/* data_parallel.c — DataParallel (PyTorch's nn.DataParallel) over any set of devices.
 *
 * The wrapped module is flattened on devices[0] (src/nn/flatten.c): its parameters are views
 * of one flat buffer, their gradients of another, and the flat leaf G holds both. Each other
 * device k keeps a replica: a copy of the module's tree whose parameters are views, at the
 * same offsets, of one flat buffer R_k of its own.
 *
 * Forward, all issued by the calling thread (every op is posted to its device's worker and
 * returns, so the replicas compute at the same time without a host thread each):
 *   1. the batch is split along dim 0 (torch.chunk sizes, or in proportion to weights);
 *   2. each replica whose R_k is older than G (storage version) gets one flat copy G -> R_k;
 *   3. its chunk goes to its device (one transfer, none when the input is there already);
 *   4. its forward runs; its output goes to the output device (one transfer), and the outputs
 *      are concatenated there. Nothing waits for a device.
 * Every step of that is a differentiable op. A replica's parameters are views of this
 * forward's "DataParallel replicate" tensor (R_k with a node leading to G); backward adds each
 * parameter's gradient into its slice of that tensor's gradient on device k, then the
 * replicate node copies the whole flat gradient to devices[0] (one transfer) and the engine
 * adds it into G's gradient (one add): the replicas' gradients are reduced on the main device,
 * never through the host. The nodes own what they use (G, the replica's memory, a
 * reference-counted stats block), so backward after the wrapper was freed is safe.
 *
 * Replica 0 is the module itself on devices[0]; its gradients go straight into the flat
 * gradient's slices.
 *
 * Buffers (running statistics) are PyTorch's too: replica 0 uses the module's own buffers, so
 * what its forward writes there stays; every other replica has buffers of its own, which get
 * the module's values at each forward (one copy of the bytes per buffer, whatever changed), so
 * what a replica writes there lasts until the next forward only. Each forward also gives every
 * replica module the training flag of the module it copies. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

typedef struct {
  clpar_device *dev;
  clpar_module *module; /* the wrapped module itself for replica 0 */
  int n_slots;
  clpar_named **slots; /* the replica's parameter entries, in walk order */
  size_t *offsets;     /* each slot's element offset in the flat buffer */
  clpar_tensor *flat;  /* the replica's parameter memory, R_k (NULL for replica 0) */
  int synced;          /* R_k holds G's values as of synced_version */
  uint64_t synced_version;
} replica;

/* The statistics, shared with the graph's nodes (which may outlive the wrapper), and which
 * thread's graphs are alive: graphs counts the "DataParallel replicate" nodes not yet freed,
 * all made by owner's forwards. */
typedef struct {
  int refs; /* atomic */
  pthread_mutex_t lock;
  clpar_data_parallel_stats stats;
  int graphs;      /* under lock */
  pthread_t owner; /* under lock; meaningful while graphs > 0 */
} dp_stats;

typedef struct {
  int n;
  clpar_device **devices;
  clpar_device *output;
  float *weights; /* NULL: torch.chunk */
  replica *replicas;
  clpar_tensor *flat; /* G: the wrapped module's flat leaf on devices[0] (NULL: no parameters) */
  pthread_mutex_t forward_lock; /* the replicas serve one forward at a time */
  dp_stats *stats;
} dp_state;

static dp_stats *stats_retain(dp_stats *b) {
  __atomic_add_fetch(&b->refs, 1, __ATOMIC_RELAXED);
  return b;
}

static void stats_release(void *p) {
  dp_stats *b = p;
  if (!b || __atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  pthread_mutex_destroy(&b->lock);
  free(b);
}

/* A replicate node's context: the stats block, counting the node among the live graphs. */
static dp_stats *graph_retain(dp_stats *b) {
  pthread_mutex_lock(&b->lock);
  b->graphs++;
  pthread_mutex_unlock(&b->lock);
  return stats_retain(b);
}

static void graph_release(void *p) {
  dp_stats *b = p;
  pthread_mutex_lock(&b->lock);
  b->graphs--;
  pthread_mutex_unlock(&b->lock);
  stats_release(b);
}

/* One thread at a time trains a DataParallel: its gradients, its replicas' buffers and the
 * optimizer's view of its parameters are shared, and two threads' steps interleaved on the
 * devices' queues would mix them. A forward that records a graph is refused while a graph of
 * another thread's forward is alive (until its tensors are freed: clpar_scope_end). */
static clpar_status claim_graphs(dp_state *st) {
  if (!st->flat || !st->flat->requires_grad || !clpar_is_grad_enabled()) return CLPAR_OK;
  dp_stats *b = st->stats;
  pthread_t self = pthread_self();
  pthread_mutex_lock(&b->lock);
  int other = b->graphs > 0 && !pthread_equal(b->owner, self);
  if (!other) b->owner = self;
  int live = b->graphs;
  pthread_mutex_unlock(&b->lock);
  if (!other) return CLPAR_OK;
  return clpar_set_error(CLPAR_ERROR_BUSY,
                         "DataParallel: another thread's forward still has a graph (%d replica "
                         "node(s) alive); one thread at a time may train a DataParallel: free "
                         "that thread's outputs and losses (clpar_scope_end) first, or give "
                         "each thread a module of its own",
                         live);
}

/* A DataParallel wrapper (the `parallel` state of another wrapper is not ours). */
static int is_dp(const clpar_module *m) {
  return m && m->parallel && strcmp(m->type, "DataParallel") == 0;
}

/* ---- splitting ---- */

/* Rows per device: torch.chunk sizes (ceil(rows / n) each, fewer chunks than devices when rows
 * is small) or in proportion to the weights (clpar_weighted_sizes: no overflow, no loop, even
 * for INT64_MAX rows). */
static void split_rows(const dp_state *st, int64_t rows, int64_t *sizes) {
  if (!st->weights) {
    int chunks = clpar_chunk_sizes(rows, st->n, sizes); /* rows >= 1 here */
    for (int i = chunks < 0 ? 0 : chunks; i < st->n; i++) sizes[i] = 0;
    return;
  }
  clpar_weighted_sizes(rows, st->weights, st->n, sizes);
}

int clpar_data_parallel_split(const clpar_module *dp, int64_t rows, int64_t *sizes) {
  if (!is_dp(dp) || !sizes)
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

/* The parameter entries of m's tree in walk order (its own, then each child's). */
static int collect_slots(clpar_module *m, clpar_named **slots, int at) {
  for (int i = 0; i < m->n_params; i++) slots[at++] = &m->params[i];
  for (int i = 0; i < m->n_children; i++) at = collect_slots(m->children[i].item, slots, at);
  return at;
}

/* Buffers of a replica made so far, so that a buffer the source tree holds at two places is
 * one buffer in the replica too. */
typedef struct {
  int n, cap;
  clpar_tensor **src, **dst; /* borrowed */
} buffer_map;

/* The replica's copy of buffer b on dev (a new reference): made at the first place b is met. */
static clpar_status replica_buffer(buffer_map *map, clpar_tensor *b, clpar_device *dev,
                                   clpar_tensor **out) {
  for (int i = 0; i < map->n; i++)
    if (map->src[i] == b) {
      *out = clpar_tensor_retain(map->dst[i]);
      return CLPAR_OK;
    }
  if (map->n == map->cap) {
    int cap = map->cap ? 2 * map->cap : 16;
    clpar_tensor **src = realloc(map->src, (size_t)cap * sizeof *src);
    if (src) map->src = src;
    clpar_tensor **dst = realloc(map->dst, (size_t)cap * sizeof *dst);
    if (dst) map->dst = dst;
    if (!src || !dst)
      return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "DataParallel: out of host memory");
    map->cap = cap;
  }
  clpar_tensor *copy; /* a buffer needs no gradient, so the copy is a leaf */
  clpar_status s = clpar_tensor_to(b, dev, &copy);
  if (s != CLPAR_OK) return s;
  clpar_tensor_unscope(copy);
  map->src[map->n] = b;
  map->dst[map->n++] = copy; /* the map's reference, dropped once the replica holds it */
  *out = clpar_tensor_retain(copy);
  return CLPAR_OK;
}

/* A copy of src's tree on dev: same types, forwards and user data (shared, not owned); each
 * parameter a view of flat at the offset its original has in G; buffers of its own. */
static clpar_status clone_tree(const clpar_module *src, const clpar_tensor *g, clpar_tensor *flat,
                               clpar_device *dev, buffer_map *map, clpar_module **out) {
  clpar_module *m;
  clpar_status s = clpar_module_create(src->type, src->forward, src->user, NULL, &m);
  if (s == CLPAR_OK) m->replica = 1;
  for (int i = 0; s == CLPAR_OK && i < src->n_params; i++) {
    const clpar_tensor *p = src->params[i].item;
    clpar_tensor *view;
    s = clpar_tensor_view_at(flat, p->offset - g->offset, p->ndim, p->shape, &view);
    if (s != CLPAR_OK) break;
    s = clpar_module_add_parameter(m, src->params[i].name, view);
    view->requires_grad = 0; /* gradients reach G through the replicate node */
    clpar_tensor_release(view);
  }
  for (int i = 0; s == CLPAR_OK && i < src->n_buffers; i++) {
    clpar_tensor *b = NULL;
    s = replica_buffer(map, src->buffers[i].item, dev, &b);
    if (s == CLPAR_OK) s = clpar_module_add_buffer(m, src->buffers[i].name, b);
    clpar_tensor_release(b);
  }
  for (int i = 0; s == CLPAR_OK && i < src->n_children; i++) {
    clpar_module *child;
    s = clone_tree(src->children[i].item, g, flat, dev, map, &child);
    if (s == CLPAR_OK) s = clpar_module_add_child(m, src->children[i].name, child);
  }
  if (s != CLPAR_OK) {
    clpar_module_free(m);
    return s;
  }
  m->training = src->training;
  *out = m;
  return CLPAR_OK;
}

/* Before a replica's forward: the source's training flags, and its buffers' bytes copied into
 * the replica's (posted, nothing waits). The trees were alike when the replica was made; a
 * module given buffers or children since then is an error. */
static clpar_status sync_tree(const clpar_module *src, clpar_module *rep) {
  if (src->n_buffers != rep->n_buffers || src->n_children != rep->n_children)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "DataParallel: the wrapped %s module was given %s since "
                           "clpar_data_parallel_create; make a new wrapper",
                           src->type, src->n_buffers != rep->n_buffers ? "buffers" : "children");
  rep->training = src->training;
  for (int i = 0; i < src->n_buffers; i++) {
    const clpar_tensor *b = src->buffers[i].item;
    clpar_tensor *r = rep->buffers[i].item;
    clpar_tensor_touch(r);
    clpar_status s =
        clpar_transfer(r->storage->dev, r->storage, clpar_tensor_byte_offset(r), b->storage->dev,
                       b->storage, clpar_tensor_byte_offset(b), clpar_tensor_nbytes(b));
    if (s != CLPAR_OK) return s;
  }
  for (int i = 0; i < src->n_children; i++) {
    clpar_status s = sync_tree(src->children[i].item, rep->children[i].item);
    if (s != CLPAR_OK) return s;
  }
  return CLPAR_OK;
}

static void replica_free(replica *r, int is_source) {
  if (!is_source) clpar_module_free(r->module); /* frees the per-step views in its slots */
  clpar_tensor_release(r->flat);
  free(r->slots);
  free(r->offsets);
}

static clpar_status replica_init(replica *r, clpar_module *source, const clpar_tensor *g,
                                 clpar_device *dev, int is_source) {
  r->dev = dev;
  r->n_slots = clpar_module_entry_count(source);
  clpar_status s = CLPAR_OK;
  buffer_map map = {0};
  if (is_source) {
    r->module = source;
  } else if (g) {
    s = clpar_tensor_empty(dev, 1, g->shape, &r->flat);
    if (s == CLPAR_OK) clpar_tensor_unscope(r->flat);
    if (s == CLPAR_OK) s = clone_tree(source, g, r->flat, dev, &map, &r->module);
  } else {
    s = clone_tree(source, NULL, NULL, dev, &map, &r->module);
  }
  for (int i = 0; i < map.n; i++) clpar_tensor_release(map.dst[i]); /* the replica holds them */
  free(map.src);
  free(map.dst);
  size_t n = (size_t)(r->n_slots ? r->n_slots : 1);
  r->slots = calloc(n, sizeof *r->slots);
  r->offsets = calloc(n, sizeof *r->offsets);
  if (s == CLPAR_OK && (!r->slots || !r->offsets))
    s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "DataParallel: out of host memory");
  if (s == CLPAR_OK) collect_slots(r->module, r->slots, 0);
  for (int j = 0; s == CLPAR_OK && !is_source && j < r->n_slots; j++)
    r->offsets[j] = ((clpar_tensor *)r->slots[j]->item)->offset - r->flat->offset;
  return s;
}

/* The way back from a replica's parameters to G: the whole flat gradient, accumulated on the
 * replica's device, goes to G's device in one transfer; the engine adds it into G's grad. */
static clpar_status replicate_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  double t0 = clpar_clock_seconds();
  clpar_status s = clpar_tensor_to(g, n->inputs[0]->storage->dev, &gin[0]);
  dp_stats *b = n->ctx;
  pthread_mutex_lock(&b->lock);
  b->stats.reduce_seconds += clpar_clock_seconds() - t0;
  pthread_mutex_unlock(&b->lock);
  return s;
}

/* A replica parameter's gradient is added into its slice of the flat gradient (a partial
 * node: the engine places it at the node's offset). */
static clpar_status slice_backward(clpar_node *n, clpar_tensor *g, clpar_tensor **gin) {
  (void)n;
  return clpar_tensor_alias(g, &gin[0]);
}

/* Replica k before its forward: the module's buffers and training flags (sync_tree), one flat
 * copy G -> R_k when G changed since the last one (*copied = 1), and this forward's parameter
 * views in its slots (leading back to G when a gradient is wanted). */
static clpar_status replica_sync(dp_state *st, replica *r, int *copied) {
  clpar_status s0 = sync_tree(st->replicas[0].module, r->module);
  if (s0 != CLPAR_OK) return s0;
  clpar_tensor *g = st->flat;
  if (!g) return CLPAR_OK;
  uint64_t version = __atomic_load_n(&g->storage->version, __ATOMIC_RELAXED);
  if (!r->synced || r->synced_version != version) { /* version read first: a later change shows */
    clpar_status s =
        clpar_transfer(r->dev, r->flat->storage, r->flat->offset * sizeof(float), g->storage->dev,
                       g->storage, g->offset * sizeof(float), (size_t)g->numel * sizeof(float));
    if (s != CLPAR_OK) return s;
    r->synced = 1;
    r->synced_version = version;
    *copied = 1;
  }
  clpar_tensor *base = r->flat; /* borrowed unless a node is made */
  int grad = g->requires_grad && clpar_is_grad_enabled();
  if (grad) {
    clpar_tensor *step;
    clpar_status s = clpar_tensor_view_at(r->flat, 0, 1, r->flat->shape, &step);
    if (s != CLPAR_OK) return s;
    clpar_node *node = clpar_record(step, "DataParallel replicate", replicate_backward, &g, 1);
    if (!node) {
      clpar_tensor_release(step);
      return CLPAR_ERROR_OUT_OF_MEMORY;
    }
    node->transfer = 1;
    node->ctx = graph_retain(st->stats);
    node->ctx_free = graph_release;
    base = step;
  }
  clpar_status s = CLPAR_OK;
  for (int j = 0; s == CLPAR_OK && j < r->n_slots; j++) {
    clpar_tensor *old = r->slots[j]->item, *view = NULL;
    s = clpar_tensor_view_at(base, r->offsets[j], old->ndim, old->shape, &view);
    if (s == CLPAR_OK && grad) {
      clpar_node *node =
          clpar_record(view, "DataParallel replica parameter", slice_backward, &base, 1);
      if (node)
        node->partial_offset = (int64_t)r->offsets[j];
      else
        s = CLPAR_ERROR_OUT_OF_MEMORY;
    }
    if (s != CLPAR_OK) {
      clpar_tensor_release(view);
      break;
    }
    clpar_tensor_release(old); /* the module's reference */
    r->slots[j]->item = view;
  }
  if (grad) clpar_tensor_release(base); /* the slots' nodes hold it */
  return s;
}

/* After replica k's forward: its slots get plain views of R_k again, so that the module does
 * not keep this forward's graph alive (the graph's nodes hold the views they used). */
static void replica_unbind(replica *r) {
  for (int j = 0; j < r->n_slots; j++) {
    clpar_tensor *old = r->slots[j]->item, *view;
    if (!old->node) continue;
    if (clpar_tensor_view_at(r->flat, r->offsets[j], old->ndim, old->shape, &view) != CLPAR_OK) {
      clpar_clear_error(); /* the graph then lives until the next forward: no harm but that */
      continue;
    }
    clpar_tensor_release(old);
    r->slots[j]->item = view;
  }
}

/* ---- forward ---- */

/* The wrapped module's parameters must still be G's members on devices[0], and its buffers
 * there too. */
static clpar_status check_parameters(dp_state *st) {
  replica *r0 = &st->replicas[0];
  int nb = clpar_module_buffer_count(r0->module);
  for (int j = 0; j < nb; j++) {
    const char *name;
    clpar_tensor *b;
    clpar_status s = clpar_module_buffer_at(r0->module, j, &name, &b);
    if (s != CLPAR_OK) return s;
    if (b->storage->dev != st->devices[0])
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                             "DataParallel: buffer \"%s\" was moved (%s) since "
                             "clpar_data_parallel_create; the buffers must stay on %s",
                             name, b->storage->dev->bd.info.id, st->devices[0]->bd.info.id);
  }
  for (int j = 0; j < r0->n_slots; j++) {
    clpar_tensor *p = r0->slots[j]->item;
    if (p->flat != st->flat || p->storage->dev != st->devices[0])
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                             "DataParallel: parameter \"%s\" was moved (%s) or re-flattened since "
                             "clpar_data_parallel_create; the parameters must stay on %s",
                             r0->slots[j]->name, p->storage->dev->bd.info.id,
                             st->devices[0]->bd.info.id);
  }
  return CLPAR_OK;
}

/* The forward in three passes over the replicas, so that no device's queue waits behind
 * another's computation: first every replica's inputs (its chunk and, when they changed, its
 * parameters: the reads from the main device are posted before its own forward), then every
 * forward (the other devices' first), then the outputs to the output device. */
typedef struct {
  int k;
  int64_t start, rows;
  clpar_tensor *x; /* the chunk on the replica's device */
  clpar_tensor *y; /* its output on the output device */
} replica_run;

/* What the forward of a replica other than replica 0 runs on this thread: every module of
 * the replica's tree is a replica module, so a module with parameters or buffers that is not
 * one (the wrapped module's own, reached through user data) is remembered, to explain the
 * error it leads to. */
static _Thread_local struct {
  int watching;
  const clpar_module *foreign;
} replica_watch;

void clpar_data_parallel_note_forward(const clpar_module *m) {
  if (replica_watch.watching && !replica_watch.foreign && !m->replica &&
      (m->n_params > 0 || m->n_buffers > 0))
    replica_watch.foreign = m;
}

/* Replica k's forward (k > 0) failed with s: when it ran a module of the wrapped tree itself,
 * or failed on a device mismatch with devices[0], says so and what to do instead. */
static clpar_status explain_replica_failure(const dp_state *st, int k, const clpar_module *foreign,
                                            clpar_status s) {
  const char *dev0 = st->devices[0]->bd.info.id, *devk = st->devices[k]->bd.info.id;
  if (foreign)
    return clpar_set_error(
        s,
        "its forward ran the original module's %s (its parameters and buffers are on %s, "
        "the replica's input on %s) instead of the replica's own: a forward must reach its "
        "children and parameters through self (clpar_module_child(self, name), "
        "clpar_module_parameter(self, name)), not through its user data or globals, since "
        "each replica is another self",
        foreign->type, dev0, devk);
  if (s == CLPAR_ERROR_DEVICE_MISMATCH && strstr(clpar_last_failure(), dev0))
    clpar_append_error(
        " (if the forward reaches this parameter through its user data rather "
        "than through self, every replica uses the original module's, on %s: "
        "reach it with clpar_module_parameter(self, name))",
        dev0);
  return s;
}

static clpar_status dp_forward_locked(dp_state *st, clpar_tensor *input, clpar_tensor **output) {
  clpar_status s = check_parameters(st);
  if (s == CLPAR_OK) s = claim_graphs(st);
  if (s != CLPAR_OK) return s;
  int64_t sizes[64];
  split_rows(st, input->shape[0], sizes);
  replica_run runs[64];
  int used = 0, copies = 0, failed = -1;
  int64_t at = 0;
  for (int k = 0; k < st->n; at += sizes[k], k++)
    if (sizes[k] > 0) runs[used++] = (replica_run){k, at, sizes[k], NULL, NULL};
  clpar_tensor *parts[64] = {0};
  double t[5];
  clpar_scope *scope = clpar_scope_begin(); /* what the replicas make besides their outputs */
  t[0] = clpar_clock_seconds();
  for (int i = 0; i < used && s == CLPAR_OK; i++) { /* chunks */
    replica_run *rr = &runs[i];
    clpar_device *dev = st->devices[rr->k];
    clpar_tensor *chunk;
    s = clpar_tensor_rows(input, rr->start, rr->rows, &chunk);
    rr->x = chunk;
    if (s == CLPAR_OK && chunk->storage->dev != dev) s = clpar_tensor_to(chunk, dev, &rr->x);
    if (s != CLPAR_OK) failed = rr->k;
  }
  t[1] = clpar_clock_seconds();
  for (int i = 0; i < used && s == CLPAR_OK; i++) { /* parameters */
    int copied = 0;
    if (runs[i].k > 0) s = replica_sync(st, &st->replicas[runs[i].k], &copied);
    copies += copied;
    if (s != CLPAR_OK) failed = runs[i].k;
  }
  t[2] = clpar_clock_seconds();
  for (int j = 0; j < used && s == CLPAR_OK; j++) { /* forwards: replica 0 (runs[0]) last */
    replica_run *rr = &runs[runs[0].k == 0 ? (j + 1) % used : j];
    replica_watch.watching = rr->k > 0;
    s = clpar_module_forward(st->replicas[rr->k].module, rr->x, &rr->y);
    const clpar_module *foreign = replica_watch.foreign;
    replica_watch.watching = 0;
    replica_watch.foreign = NULL;
    if (s != CLPAR_OK && rr->k > 0) s = explain_replica_failure(st, rr->k, foreign, s);
    if (s != CLPAR_OK) failed = rr->k;
  }
  t[3] = clpar_clock_seconds();
  for (int i = 0; i < used && s == CLPAR_OK; i++) { /* outputs */
    replica_run *rr = &runs[i];
    clpar_tensor *y = rr->y;
    if (y->storage->dev != st->output) s = clpar_tensor_to(y, st->output, &y);
    if (s == CLPAR_OK) parts[i] = clpar_tensor_retain(y);
    if (s != CLPAR_OK) failed = rr->k;
  }
  clpar_scope_end(scope);
  for (int i = 0; i < used; i++)
    if (runs[i].k > 0) replica_unbind(&st->replicas[runs[i].k]);
  if (s != CLPAR_OK && failed >= 0) {
    char message[1024];
    snprintf(message, sizeof message, "%s", clpar_last_error());
    s = clpar_set_error(s, "DataParallel replica on %s: %s", st->devices[failed]->bd.info.id,
                        message);
  }
  if (s == CLPAR_OK)
    s = used == 1 ? clpar_tensor_reshape(parts[0], parts[0]->ndim, parts[0]->shape, output)
                  : clpar_concat(parts, used, output);
  t[4] = clpar_clock_seconds();
  for (int i = 0; i < used; i++) clpar_tensor_release(parts[i]);
  if (s == CLPAR_OK) {
    dp_stats *b = st->stats;
    pthread_mutex_lock(&b->lock);
    b->stats.forwards++;
    b->stats.scatter_seconds += t[1] - t[0];
    b->stats.replicate_seconds += t[2] - t[1];
    b->stats.apply_seconds += t[3] - t[2];
    b->stats.gather_seconds += t[4] - t[3];
    b->stats.parameters_copied += (uint64_t)copies;
    pthread_mutex_unlock(&b->lock);
  }
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
  for (int k = 0; st->replicas && k < st->n; k++) replica_free(&st->replicas[k], k == 0);
  clpar_tensor_release(st->flat);
  free(st->replicas);
  free(st->devices);
  free(st->weights);
  stats_release(st->stats); /* the graph's nodes may hold it longer */
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
  pthread_mutex_init(&st->forward_lock, NULL);
  st->n = n;
  st->devices = calloc((size_t)n, sizeof *st->devices);
  st->replicas = calloc((size_t)n, sizeof *st->replicas);
  st->weights = o && o->weights ? calloc((size_t)n, sizeof *st->weights) : NULL;
  st->stats = calloc(1, sizeof *st->stats);
  if (st->stats) {
    st->stats->refs = 1;
    pthread_mutex_init(&st->stats->lock, NULL);
  }
  clpar_status s =
      st->devices && st->replicas && st->stats && (!o || !o->weights || st->weights)
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
  /* The parameters live on devices[0] (moved there in place if they are elsewhere), in one
   * flat buffer. */
  if (s == CLPAR_OK) s = clpar_module_to(module, st->devices[0]);
  if (s == CLPAR_OK) s = clpar_module_flatten(module);
  if (s == CLPAR_OK && clpar_module_parameter_count(module) > 0) {
    clpar_tensor *p;
    s = clpar_module_parameter_at(module, 0, NULL, &p);
    if (s == CLPAR_OK) st->flat = clpar_tensor_retain(p->flat);
  }
  for (int k = 0; s == CLPAR_OK && k < st->n; k++)
    s = replica_init(&st->replicas[k], module, st->flat, st->devices[k], k == 0);
  /* Pinned staging for the flat copies of two steps in flight (the caller runs ahead of the
   * devices): G -> R_k from devices[0]'s pool, each replica's gradient back from its own. */
  size_t flat_bytes =
      s == CLPAR_OK && st->flat ? (size_t)clpar_tensor_numel(st->flat) * sizeof(float) : 0;
  if (s == CLPAR_OK && st->n > 1)
    s = clpar_staging_reserve(st->devices[0], 2 * (st->n - 1), flat_bytes);
  for (int k = 1; s == CLPAR_OK && k < st->n; k++)
    s = clpar_staging_reserve(st->devices[k], 2, flat_bytes);
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
  if (!is_dp(dp) || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_data_parallel_stats_get: not a DataParallel module");
  dp_stats *b = ((dp_state *)dp->parallel)->stats;
  pthread_mutex_lock(&b->lock);
  *out = b->stats;
  pthread_mutex_unlock(&b->lock);
  return CLPAR_OK;
}

clpar_status clpar_data_parallel_stats_reset(clpar_module *dp) {
  if (!is_dp(dp))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_data_parallel_stats_reset: not a DataParallel module");
  dp_stats *b = ((dp_state *)dp->parallel)->stats;
  pthread_mutex_lock(&b->lock);
  memset(&b->stats, 0, sizeof b->stats);
  pthread_mutex_unlock(&b->lock);
  return CLPAR_OK;
}
