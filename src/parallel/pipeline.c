/* pipeline.c — pipeline parallel (include/clpar/pipeline.h): stages on devices, micro-batches
 * flowing through them.
 *
 * No host thread per stage: every op is posted to its device's worker and returns, so the
 * calling thread only has to post each device's work in the order that device should run it.
 * Micro-batch i of stage s is posted after micro-batch i of stage s-1 (its input comes by
 * clpar_tensor_to, which makes the stage's worker wait for the copy's event) and after
 * micro-batch i-1 of stage s; each device's queue then holds its micro-batches in order, and
 * stage s runs micro-batch i while stage s+1 runs micro-batch i-1, the copy between them
 * (a read on the source's queue, a write on the destination's) in between.
 *
 * Backward is the engine's (src/autograd.c): clpar_tensor_to is a differentiable copy, so
 * each micro-batch's graph spans the stages. The module's forward concatenates the
 * micro-batches' outputs, and one clpar_backward runs every micro-batch's backward (GPipe).
 * clpar_pipeline_train_step instead takes a loss per micro-batch and runs one backward per
 * micro-batch as soon as the schedule allows, then drops that micro-batch's graph (its
 * activations go back to the devices' caches): in 1F1B the forwards of micro-batch j+p-1-s on
 * stage s are posted before the backward of micro-batch j, so stage s holds at most p - s
 * micro-batches. Each forward of a stage runs in a scope of its own, so that nothing but the
 * graph keeps its intermediate tensors alive. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

typedef struct {
  int n;
  clpar_device **devices;
  clpar_module **stages; /* borrowed: the pipeline's children */
  const char **names;    /* borrowed: their names */
  pthread_mutex_t lock;  /* the options and the stats */
  int64_t split_size;
  int chunks;
  clpar_pipeline_schedule schedule;
  clpar_reduction reduction;
  clpar_pipeline_stats stats;
} pipe_state;

/* A micro-batch: rows [start, start + rows) of the batch, index i of m. */
typedef struct {
  int i, m;
  int64_t start, rows;
  clpar_tensor *x;              /* its activation: the input of stage next (retained) */
  clpar_tensor_transit *moving; /* x on its way to stage next's device, or NULL */
  int next;                     /* the next stage to run */
  clpar_tensor *loss;           /* train_step: its weighted loss, with its graph (retained) */
} micro;

static pipe_state *state_of(const clpar_module *m) {
  return m && m->parallel && strcmp(m->type, "Pipeline") == 0 ? m->parallel : NULL;
}

static clpar_status not_pipeline(const char *fn) {
  return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: not a Pipeline module", fn);
}

/* ---- options and the split ---- */

static clpar_status check_options(const char *fn, const clpar_pipeline_options *o) {
  if (!o) return CLPAR_OK;
  if (o->split_size < 0 || o->chunks < 0)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "%s: split_size %lld and chunks %d; neither may be negative", fn,
                           (long long)o->split_size, o->chunks);
  if (o->schedule != CLPAR_PIPELINE_GPIPE && o->schedule != CLPAR_PIPELINE_1F1B)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: unknown schedule %d", fn,
                           (int)o->schedule);
  if (o->loss_reduction != CLPAR_REDUCTION_MEAN && o->loss_reduction != CLPAR_REDUCTION_SUM)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: unknown loss reduction %d", fn,
                           (int)o->loss_reduction);
  return CLPAR_OK;
}

static void apply_options(pipe_state *st, const clpar_pipeline_options *o) {
  st->split_size = o ? o->split_size : 0;
  st->chunks = o && o->chunks > 0 ? o->chunks : 1;
  st->schedule = o ? o->schedule : CLPAR_PIPELINE_GPIPE;
  st->reduction = o ? o->loss_reduction : CLPAR_REDUCTION_MEAN;
}

/* Rows per micro-batch for a batch of rows (>= 1): split_size, or torch.chunk's ceil. */
static int64_t micro_rows(const pipe_state *st, int64_t rows) {
  if (st->split_size > 0) return st->split_size;
  return rows / st->chunks + (rows % st->chunks != 0);
}

static micro micro_at(int64_t rows, int64_t per, int i) {
  micro mb = {0};
  mb.i = i;
  mb.m = (int)(rows / per + (rows % per != 0));
  mb.start = (int64_t)i * per;
  mb.rows = rows - mb.start < per ? rows - mb.start : per;
  return mb;
}

int clpar_pipeline_split(const clpar_module *pipe, int64_t rows, int64_t *sizes, int max) {
  pipe_state *st = state_of(pipe);
  if (!st) return not_pipeline("clpar_pipeline_split");
  if (rows < 1)
    return clpar_set_error(CLPAR_ERROR_EMPTY,
                           "clpar_pipeline_split: %lld rows; a batch needs at least one",
                           (long long)rows);
  pthread_mutex_lock(&st->lock);
  int64_t per = micro_rows(st, rows);
  pthread_mutex_unlock(&st->lock);
  int64_t m = rows / per + (rows % per != 0);
  if (m > 0x7fffffff)
    return clpar_set_error(CLPAR_ERROR_TOO_LARGE, "clpar_pipeline_split: %lld micro-batches",
                           (long long)m);
  for (int i = 0; sizes && i < max && i < (int)m; i++) sizes[i] = micro_at(rows, per, i).rows;
  return (int)m;
}

/* ---- running stages ---- */

/* Wraps the error of stage s on micro-batch mb with where it happened. */
static clpar_status stage_error(const pipe_state *st, int s, const micro *mb, clpar_status e) {
  char message[1024];
  snprintf(message, sizeof message, "%s", clpar_last_error());
  return clpar_set_error(e,
                         "Pipeline stage %d (\"%s\", %s) on %s, micro-batch %d of %d (rows %lld "
                         "to %lld): %s",
                         s, st->names[s], clpar_module_type(st->stages[s]),
                         st->devices[s]->bd.info.id, mb->i, mb->m, (long long)mb->start,
                         (long long)(mb->start + mb->rows - 1), message);
}

/* Stage s on mb->x (copied to the stage's device first when it is elsewhere), in a scope of
 * its own: what the stage makes stays alive only through the graph. mb->x becomes the
 * stage's output. Its copy to the next stage's device is posted in two halves: the read on
 * this stage's queue now, right behind the forward, and the write on the next stage's queue
 * when that stage runs the micro-batch. Posted whole at either moment, 1F1B's devices took
 * turns instead of overlapping: at the consumer's forward, the read of micro-batch i + 1 sat
 * on the producer's queue behind the backward of micro-batch i, which waits for the
 * consumer; at the producer's forward, the write sat on the consumer's queue ahead of that
 * backward, which then waited for the producer's next forward. */
static clpar_status run_stage(const pipe_state *st, int s, micro *mb) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *in = mb->x, *out = NULL;
  clpar_status r = CLPAR_OK;
  if (mb->moving) {
    r = clpar_tensor_to_finish(mb->moving, &in);
    mb->moving = NULL;
  } else if (in->storage->dev != st->devices[s]) {
    r = clpar_tensor_to(mb->x, st->devices[s], &in);
  }
  if (r == CLPAR_OK) r = clpar_module_forward(st->stages[s], in, &out);
  if (r == CLPAR_OK && !out)
    r = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "the stage's forward gave no output");
  if (r == CLPAR_OK && s + 1 < st->n && out->storage->dev != st->devices[s + 1])
    r = clpar_tensor_to_begin(out, st->devices[s + 1], &mb->moving);
  if (r == CLPAR_OK) {
    clpar_tensor_retain(out);
    clpar_tensor_release(mb->x);
    mb->x = out;
    mb->next = s + 1;
  }
  clpar_scope_end(scope);
  return r == CLPAR_OK ? r : stage_error(st, s, mb, r);
}

/* mb's rows of input (a view, retained) as the input of stage 0. */
static clpar_status micro_input(clpar_tensor *input, micro *mb) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *x = NULL;
  clpar_status r = clpar_tensor_rows(input, mb->start, mb->rows, &x);
  if (r == CLPAR_OK) mb->x = clpar_tensor_retain(x);
  mb->next = 0;
  clpar_scope_end(scope);
  return r;
}

/* The output of the last stage on the last stage's device (a stage may move its output). */
static clpar_status micro_gather(const pipe_state *st, micro *mb) {
  clpar_device *last = st->devices[st->n - 1];
  if (mb->x->storage->dev == last) return CLPAR_OK;
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *y = NULL;
  clpar_status r = clpar_tensor_to(mb->x, last, &y);
  if (r == CLPAR_OK) {
    clpar_tensor_retain(y);
    clpar_tensor_release(mb->x);
    mb->x = y;
  }
  clpar_scope_end(scope);
  return r == CLPAR_OK ? r : stage_error(st, st->n - 1, mb, r);
}

static void micros_release(micro *mbs, int m) {
  for (int i = 0; mbs && i < m; i++) {
    clpar_tensor_to_cancel(mbs[i].moving);
    clpar_tensor_release(mbs[i].x);
    clpar_tensor_release(mbs[i].loss);
  }
  free(mbs);
}

static clpar_status check_input(const char *fn, const clpar_tensor *input) {
  if (!input) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: input is NULL", fn);
  clpar_status alive = clpar_check_alive(fn, input);
  if (alive != CLPAR_OK) return alive;
  if (input->ndim < 1 || input->shape[0] < 1)
    return clpar_set_error(CLPAR_ERROR_EMPTY, "%s: the input has no rows to split", fn);
  return CLPAR_OK;
}

/* The micro-batches of a batch of rows in *out (x and loss NULL), *m of them. */
static clpar_status micros_new(pipe_state *st, int64_t rows, micro **out, int *m) {
  pthread_mutex_lock(&st->lock);
  int64_t per = micro_rows(st, rows);
  pthread_mutex_unlock(&st->lock);
  int64_t count = rows / per + (rows % per != 0);
  *m = 0;
  *out = NULL;
  if (count > (1 << 24))
    return clpar_set_error(
        CLPAR_ERROR_TOO_LARGE,
        "Pipeline: %lld rows in micro-batches of %lld make %lld micro-batches (at "
        "most %d)",
        (long long)rows, (long long)per, (long long)count, 1 << 24);
  micro *mbs = calloc((size_t)count, sizeof *mbs);
  if (!mbs) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "Pipeline: out of host memory");
  for (int i = 0; i < (int)count; i++) mbs[i] = micro_at(rows, per, i);
  *m = (int)count;
  *out = mbs;
  return CLPAR_OK;
}

/* ---- the module's forward: GPipe through the ordinary autograd ---- */

static clpar_status pipe_forward(clpar_module *self, clpar_tensor *input, clpar_tensor **output,
                                 void *user) {
  pipe_state *st = user;
  (void)self;
  clpar_status r = check_input("Pipeline forward", input);
  if (r != CLPAR_OK) return r;
  double t0 = clpar_clock_seconds();
  int m = 0;
  micro *mbs = NULL;
  r = micros_new(st, input->shape[0], &mbs, &m);
  if (r != CLPAR_OK) return r;
  for (int i = 0; i < m && r == CLPAR_OK; i++) {
    r = micro_input(input, &mbs[i]);
    for (int s = 0; s < st->n && r == CLPAR_OK; s++) r = run_stage(st, s, &mbs[i]);
    if (r == CLPAR_OK) r = micro_gather(st, &mbs[i]);
  }
  clpar_tensor **parts = r == CLPAR_OK ? calloc((size_t)(m > 0 ? m : 1), sizeof *parts) : NULL;
  if (r == CLPAR_OK && !parts)
    r = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "Pipeline: out of host memory");
  for (int i = 0; r == CLPAR_OK && i < m; i++) parts[i] = mbs[i].x;
  if (r == CLPAR_OK)
    r = m == 1 ? clpar_tensor_reshape(parts[0], parts[0]->ndim, parts[0]->shape, output)
               : clpar_concat(parts, m, output);
  free(parts);
  micros_release(mbs, m);
  if (r == CLPAR_OK) {
    pthread_mutex_lock(&st->lock);
    st->stats.forwards++;
    st->stats.micro_batches += (uint64_t)m;
    st->stats.issue_seconds += clpar_clock_seconds() - t0;
    pthread_mutex_unlock(&st->lock);
  }
  return r;
}

/* ---- the training step: one backward per micro-batch, in the schedule's order ---- */

typedef struct {
  clpar_tensor *target;
  clpar_pipeline_loss_fn fn;
  void *user;
  int64_t batch_rows;
  clpar_reduction reduction;
} loss_spec;

/* mb's loss from its output (on the last device), weighed by rows / N for a mean; kept in
 * mb->loss with its graph, and mb->x dropped (the graph holds what backward needs). */
static clpar_status micro_loss(const pipe_state *st, const loss_spec *ls, micro *mb) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *target = NULL, *loss = NULL;
  clpar_status r = CLPAR_OK;
  if (ls->target) r = clpar_tensor_rows(ls->target, mb->start, mb->rows, &target);
  if (r == CLPAR_OK && target && target->storage->dev != mb->x->storage->dev)
    r = clpar_tensor_to(target, mb->x->storage->dev, &target);
  if (r == CLPAR_OK) r = ls->fn(mb->x, target, mb->start, ls->user, &loss);
  if (r == CLPAR_OK && (!loss || loss->numel != 1))
    r = clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                        "the loss function gave %s; it must give one element",
                        loss ? "more than one element" : "no tensor");
  if (r == CLPAR_OK && ls->reduction == CLPAR_REDUCTION_MEAN && mb->rows != ls->batch_rows)
    r = clpar_scale(loss, (float)((double)mb->rows / (double)ls->batch_rows), &loss);
  if (r == CLPAR_OK) {
    mb->loss = clpar_tensor_retain(loss);
    clpar_tensor_release(mb->x);
    mb->x = NULL;
  }
  clpar_scope_end(scope);
  if (r == CLPAR_OK) return r;
  char message[1024];
  snprintf(message, sizeof message, "%s", clpar_last_error());
  return clpar_set_error(r, "Pipeline loss of micro-batch %d of %d (rows %lld to %lld) on %s: %s",
                         mb->i, mb->m, (long long)mb->start, (long long)(mb->start + mb->rows - 1),
                         st->devices[st->n - 1]->bd.info.id, message);
}

/* mb's backward, then its graph dropped; its loss added (no gradient) into *total. */
static clpar_status micro_backward(micro *mb, clpar_tensor **total) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_status r = clpar_backward(mb->loss);
  int was = clpar_set_grad_enabled(0);
  clpar_tensor *value = NULL;
  if (r == CLPAR_OK) r = clpar_tensor_alias(mb->loss, &value);
  if (r == CLPAR_OK && *total) r = clpar_add(*total, value, &value);
  if (r == CLPAR_OK) {
    clpar_tensor_retain(value);
    clpar_tensor_release(*total);
    *total = value;
  }
  clpar_set_grad_enabled(was);
  clpar_scope_end(scope);
  clpar_tensor_release(mb->loss);
  mb->loss = NULL;
  return r;
}

/* The forwards the schedule posts before micro-batch j's backward: on stage s up to
 * micro-batch min(j + p - 1 - s, m - 1) (1F1B), or every one (GPipe). */
static int forward_target(clpar_pipeline_schedule schedule, int j, int s, int p, int m) {
  if (schedule == CLPAR_PIPELINE_GPIPE) return m - 1;
  int t = j + p - 1 - s;
  return t < m - 1 ? t : m - 1;
}

static clpar_status train_checks(const clpar_module *pipe, const clpar_tensor *input,
                                 const clpar_tensor *target, clpar_pipeline_loss_fn fn) {
  const char *f = "clpar_pipeline_train_step";
  if (!state_of(pipe)) return not_pipeline(f);
  clpar_status r = check_input(f, input);
  if (r != CLPAR_OK) return r;
  if (!fn) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: loss_fn is NULL", f);
  clpar_status alive = target ? clpar_check_alive(f, target) : CLPAR_OK;
  if (alive != CLPAR_OK) return alive;
  if (target && (target->ndim < 1 || target->shape[0] != input->shape[0])) {
    char a[128], b[128];
    return clpar_set_error(
        CLPAR_ERROR_SHAPE_MISMATCH, "%s: target %s and input %s differ in their rows (dim 0)", f,
        clpar_tensor_shape_str(target, a, sizeof a), clpar_tensor_shape_str(input, b, sizeof b));
  }
  if (!clpar_is_grad_enabled())
    return clpar_set_error(CLPAR_ERROR_NO_GRADIENT,
                           "%s: gradient recording is off on this thread (clpar_set_grad_enabled)",
                           f);
  return CLPAR_OK;
}

clpar_status clpar_pipeline_train_step(clpar_module *pipe, clpar_tensor *input,
                                       clpar_tensor *target, clpar_pipeline_loss_fn loss_fn,
                                       void *user, clpar_tensor **loss) {
  clpar_status r = train_checks(pipe, input, target, loss_fn);
  if (r != CLPAR_OK) return r;
  pipe_state *st = state_of(pipe);
  double t0 = clpar_clock_seconds();
  pthread_mutex_lock(&st->lock);
  loss_spec ls = {target, loss_fn, user, input->shape[0], st->reduction};
  clpar_pipeline_schedule schedule = st->schedule;
  pthread_mutex_unlock(&st->lock);
  int m = 0, p = st->n, in_flight = 0;
  micro *mbs = NULL;
  r = micros_new(st, input->shape[0], &mbs, &m);
  if (r != CLPAR_OK) return r;
  int *posted = calloc((size_t)p, sizeof *posted); /* per stage: micro-batches forwarded */
  if (!posted) {
    micros_release(mbs, m);
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "Pipeline: out of host memory");
  }
  clpar_tensor *total = NULL;
  for (int j = 0; j < m && r == CLPAR_OK; j++) {
    for (int s = 0; s < p && r == CLPAR_OK; s++) {
      int t = forward_target(schedule, j, s, p, m);
      while (r == CLPAR_OK && posted[s] <= t) {
        micro *mb = &mbs[posted[s]++];
        if (s == 0) r = micro_input(input, mb);
        if (r == CLPAR_OK) r = run_stage(st, s, mb);
        if (r == CLPAR_OK && s == p - 1) r = micro_gather(st, mb);
        if (r == CLPAR_OK && s == p - 1) r = micro_loss(st, &ls, mb);
      }
    }
    if (posted[0] - j > in_flight) in_flight = posted[0] - j;
    if (r == CLPAR_OK) r = micro_backward(&mbs[j], &total);
  }
  if (r == CLPAR_OK && loss) r = clpar_tensor_reshape(total, total->ndim, total->shape, loss);
  clpar_tensor_release(total);
  micros_release(mbs, m);
  free(posted);
  if (r == CLPAR_OK) {
    pthread_mutex_lock(&st->lock);
    st->stats.train_steps++;
    st->stats.micro_batches += (uint64_t)m;
    st->stats.max_in_flight = in_flight;
    st->stats.issue_seconds += clpar_clock_seconds() - t0;
    pthread_mutex_unlock(&st->lock);
  }
  return r;
}

/* ---- the wrapper ---- */

static void pipe_free(void *user) {
  pipe_state *st = user;
  if (!st) return;
  free(st->devices);
  free(st->stages);
  free(st->names);
  pthread_mutex_destroy(&st->lock);
  free(st);
}

/* Checks the arguments and makes the state (the stages not adopted yet). */
static clpar_status make_state(clpar_module *const *stages, clpar_device *const *devices, int n,
                               const clpar_pipeline_options *o, pipe_state **out) {
  const char *f = "clpar_pipeline_create";
  if (n < 1 || !stages)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: %d stages (at least one)", f, n);
  clpar_status r = check_options(f, o);
  if (r != CLPAR_OK) return r;
  if (!devices && clpar_device_count() < 1)
    return clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED, "%s: no device is selected", f);
  for (int s = 0; s < n; s++) {
    if (!stages[s])
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: stage %d is NULL", f, s);
    if (devices && !devices[s])
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: device %d is NULL", f, s);
    const char *name = o && o->stage_names ? o->stage_names[s] : NULL;
    if (o && o->stage_names && (!name || !*name || strchr(name, '.')))
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                             "%s: stage %d's name is %s; a name is not empty and has no '.'", f, s,
                             name ? "empty or dotted" : "NULL");
    for (int k = 0; k < s; k++) {
      if (stages[k] == stages[s])
        return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                               "%s: stages %d and %d are the same module", f, k, s);
      if (name && strcmp(o->stage_names[k], name) == 0)
        return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                               "%s: stages %d and %d are both named \"%s\"", f, k, s, name);
    }
  }
  pipe_state *st = calloc(1, sizeof *st);
  if (!st) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "Pipeline: out of host memory");
  pthread_mutex_init(&st->lock, NULL);
  st->n = n;
  st->devices = calloc((size_t)n, sizeof *st->devices);
  st->stages = calloc((size_t)n, sizeof *st->stages);
  st->names = calloc((size_t)n, sizeof *st->names);
  if (!st->devices || !st->stages || !st->names) {
    pipe_free(st);
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "Pipeline: out of host memory");
  }
  for (int s = 0; s < n; s++)
    st->devices[s] = devices ? devices[s] : clpar_device_get(s % clpar_device_count());
  apply_options(st, o);
  *out = st;
  return CLPAR_OK;
}

/* The stages' creator references, dropped when creation fails: each module once, however
 * often it was given, and none that a parent holds (a stage inside another stage goes with
 * it). Which to drop is decided before any is freed, since freeing one can free another. */
static void drop_stages(clpar_module *const *stages, int n) {
  char *drop = stages && n > 0 ? calloc((size_t)n, 1) : NULL;
  for (int s = 0; drop && s < n; s++) {
    drop[s] = stages[s] && !__atomic_load_n(&stages[s]->adopted, __ATOMIC_ACQUIRE);
    for (int k = 0; drop[s] && k < s; k++) drop[s] = stages[k] != stages[s];
  }
  for (int s = 0; drop && s < n; s++)
    if (drop[s]) clpar_module_free(stages[s]);
  free(drop); /* out of host memory: the stages are left, not risked */
}

clpar_status clpar_pipeline_create(clpar_module *const *stages, clpar_device *const *devices,
                                   int n_stages, const clpar_pipeline_options *options,
                                   clpar_module **out) {
  pipe_state *st = NULL;
  clpar_status r =
      out ? make_state(stages, devices, n_stages, options, &st)
          : clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_pipeline_create: out is NULL");
  for (int s = 0; r == CLPAR_OK && s < n_stages; s++) {
    r = clpar_module_to(stages[s], st->devices[s]);
    if (r != CLPAR_OK) {
      char message[1024];
      snprintf(message, sizeof message, "%s", clpar_last_error());
      r = clpar_set_error(r, "clpar_pipeline_create: stage %d to %s: %s", s,
                          st->devices[s]->bd.info.id, message);
    }
  }
  clpar_module *pipe = NULL;
  if (r == CLPAR_OK) r = clpar_module_create("Pipeline", pipe_forward, st, pipe_free, &pipe);
  if (r != CLPAR_OK) {
    pipe_free(st);
    drop_stages(stages, n_stages);
    return r;
  }
  pipe->parallel = st;
  int added = 0;
  for (int s = 0; r == CLPAR_OK && s < n_stages; s++, added++) {
    char name[24];
    snprintf(name, sizeof name, "%d", s);
    const char *given = options && options->stage_names ? options->stage_names[s] : name;
    r = clpar_module_add_child(pipe, given, stages[s]); /* frees the stage on error */
  }
  if (r != CLPAR_OK) drop_stages(stages + added, n_stages - added);
  if (r != CLPAR_OK) {
    clpar_module_free(pipe);
    return r;
  }
  for (int s = 0; s < n_stages; s++) {
    st->stages[s] = pipe->children[s].item;
    st->names[s] = pipe->children[s].name;
  }
  *out = pipe;
  return CLPAR_OK;
}

clpar_status clpar_pipeline_set_options(clpar_module *pipe, const clpar_pipeline_options *o) {
  pipe_state *st = state_of(pipe);
  if (!st) return not_pipeline("clpar_pipeline_set_options");
  clpar_status r = check_options("clpar_pipeline_set_options", o);
  if (r != CLPAR_OK) return r;
  pthread_mutex_lock(&st->lock);
  apply_options(st, o);
  pthread_mutex_unlock(&st->lock);
  return CLPAR_OK;
}

int clpar_pipeline_stage_count(const clpar_module *pipe) {
  pipe_state *st = state_of(pipe);
  return st ? st->n : not_pipeline("clpar_pipeline_stage_count");
}

clpar_module *clpar_pipeline_stage(const clpar_module *pipe, int s) {
  pipe_state *st = state_of(pipe);
  return st && s >= 0 && s < st->n ? st->stages[s] : NULL;
}

clpar_device *clpar_pipeline_device(const clpar_module *pipe, int s) {
  pipe_state *st = state_of(pipe);
  return st && s >= 0 && s < st->n ? st->devices[s] : NULL;
}

clpar_status clpar_pipeline_stats_get(const clpar_module *pipe, clpar_pipeline_stats *out) {
  pipe_state *st = state_of(pipe);
  if (!st || !out) return not_pipeline("clpar_pipeline_stats_get");
  pthread_mutex_lock(&st->lock);
  *out = st->stats;
  pthread_mutex_unlock(&st->lock);
  return CLPAR_OK;
}

clpar_status clpar_pipeline_stats_reset(clpar_module *pipe) {
  pipe_state *st = state_of(pipe);
  if (!st) return not_pipeline("clpar_pipeline_stats_reset");
  pthread_mutex_lock(&st->lock);
  memset(&st->stats, 0, sizeof st->stats);
  pthread_mutex_unlock(&st->lock);
  return CLPAR_OK;
}
