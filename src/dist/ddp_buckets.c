/* ddp_buckets.c — DistributedDataParallel's buckets: which parameters each holds, where in its
 * host memory each gradient goes, and the runs of adjacent gradients copied in one go. */
#include <limits.h>
#include <stdlib.h>

#include "dist/ddp_internal.h"

int clpar_ddp_pin_cpu = 0;

/* a's gradient lies right below b's in one device buffer, and right below it in the bucket's
 * buffer too (host offsets given at creation; a follows b in bucket order) */
static int adjacent(const ddp_param *b, const ddp_param *a) {
  const clpar_tensor *ga = a->param->grad, *gb = b->param->grad;
  return ga && gb && ga->storage == gb->storage && ga->offset + (size_t)a->numel == gb->offset &&
         a->offset + a->numel == b->offset;
}

/* The bucket's runs, from its parameters' gradients as they are now; a parameter with no
 * gradient memory (never reached, find_unused_parameters) is in none, and gets zeros. */
void clpar_ddp_make_runs(ddp_state *st, ddp_bucket *b) {
  b->n_runs = 0;
  ddp_run *r = NULL;
  for (int i = b->first; i < b->first + b->count; i++) {
    ddp_param *p = &st->params[i];
    clpar_tensor *g = p->param->grad;
    if (!g) {
      r = NULL;
      continue;
    }
    if (r && i > b->first && adjacent(&st->params[i - 1], p)) {
      r->word = g->offset;
      r->host = p->offset;
      r->numel += p->numel;
    } else {
      r = &b->runs[b->n_runs++];
      r->storage = g->storage;
      r->word = g->offset;
      r->host = p->offset;
      r->numel = p->numel;
    }
  }
}

/* Buckets over the parameters in reverse order: the first up to min(1 MiB, cap), the
 * others up to cap; a bucket closes once it has reached its limit, and where the next
 * parameter lives on another device. In a bucket's buffer, parameters whose gradients lie one
 * below the other in a flat gradient (clpar_module_flatten: the module's order, so reversed
 * here) keep that layout, so that each such run is one copy each way. Each buffer is pinned
 * host memory from the device's backend when it gives some. */
clpar_status clpar_ddp_make_buckets(ddp_state *st, double cap_mb) {
  double cap = cap_mb * 1024.0 * 1024.0, limit = cap < 1048576.0 ? cap : 1048576.0;
  st->buckets = calloc((size_t)st->n_params, sizeof *st->buckets);
  if (!st->buckets) return clpar_ddp_oom();
  ddp_bucket *b = NULL;
  for (int i = 0; i < st->n_params; i++) {
    ddp_param *p = &st->params[i];
    clpar_device *dev = p->param->storage->dev;
    if (b && b->dev != dev) {
      b = NULL;
      limit = cap;
    }
    if (!b) {
      b = &st->buckets[st->n_buckets++];
      b->first = i;
      b->dev = dev;
    }
    p->bucket = (int)(b - st->buckets);
    p->numel = clpar_tensor_numel(p->param);
    b->numel += p->numel;
    b->count++;
    if (b->numel > INT_MAX)
      return clpar_set_error(CLPAR_ERROR_TOO_LARGE,
                             "clpar_ddp_create: a bucket of %lld floats is more than MPI takes "
                             "in one call; lower bucket_cap_mb",
                             (long long)b->numel);
    if ((double)b->numel * sizeof(float) >= limit) {
      b = NULL;
      limit = cap;
    }
  }
  for (int k = 0; k < st->n_buckets; k++) {
    b = &st->buckets[k];
    /* runs of gradients adjacent (in reverse) in one device buffer, each laid out as there */
    int64_t host = 0;
    for (int i = b->first; i < b->first + b->count;) {
      int j = i + 1;
      int64_t run = st->params[i].numel;
      for (; j < b->first + b->count; j++) {
        const clpar_tensor *ga = st->params[j].param->grad, *gb = st->params[j - 1].param->grad;
        if (!ga || !gb || ga->storage != gb->storage ||
            ga->offset + (size_t)st->params[j].numel != gb->offset)
          break;
        run += st->params[j].numel;
      }
      for (int q = i; q < j; q++) {
        const clpar_tensor *g = st->params[q].param->grad;
        st->params[q].offset =
            j - i > 1 ? host + (int64_t)(g->offset - st->params[j - 1].param->grad->offset) : host;
      }
      host += run;
      i = j;
    }
    b->pending = b->count;
    if (!(b->runs = calloc((size_t)b->count, sizeof *b->runs))) return clpar_ddp_oom();
  }
  st->stats.buckets = st->n_buckets;
  return CLPAR_OK;
}

/* MPI: each bucket's host memory, pinned from the device's backend when it gives some. */
clpar_status clpar_ddp_alloc_host_buffers(ddp_state *st) {
  for (int k = 0; k < st->n_buckets; k++) {
    ddp_bucket *b = &st->buckets[k];
    size_t bytes = (size_t)b->numel * sizeof(float);
    void *ptr = NULL;
    /* pinned memory where the device copies by DMA; on a CPU device (PoCL's CPU driver, the
     * host backend) it buys nothing, and PoCL's made MPI_Allreduce several times slower than
     * malloc'd memory (bench/ddp: 43-79 against 8-16 ms per step) */
    int pin = b->dev->bd.info.type != CLPAR_DEVICE_CPU || clpar_ddp_pin_cpu;
    if (pin && clpar_dev_host_alloc_sync(b->dev, bytes, &b->pin, &ptr) == CLPAR_OK && ptr) {
      b->buf = ptr;
    } else {
      clpar_clear_error();
      b->pin = NULL;
      if (!(b->buf = malloc(bytes))) return clpar_ddp_oom();
    }
  }
  return CLPAR_OK;
}
