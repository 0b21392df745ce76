/* lr_scheduler.c — learning-rate schedules with torch.optim.lr_scheduler's rates (StepLR,
 * LinearLR, CosineAnnealingLR) and nanoGPT's warm-up cosine. Each is the closed form of the
 * schedule, in double, set in the optimizer's groups with clpar_optimizer_set_lr: a host float
 * that the next step passes to its kernels, so a schedule never waits for a device. */
#include <math.h>
#include <stdlib.h>

#include "internal.h"

typedef enum { SCHED_STEP, SCHED_LINEAR, SCHED_COSINE, SCHED_WARMUP_COSINE } sched_kind;

struct clpar_lr_scheduler {
  sched_kind kind;
  clpar_optimizer *opt;
  int n_groups;
  double *base;  /* each group's rate when the scheduler was made */
  float *last;   /* each group's rate last set */
  int64_t epoch; /* PyTorch's last_epoch */
  int64_t a, b;  /* step_size | total_iters | t_max | warmup, decay_iters */
  double x, y;   /* gamma | start, end factor | eta_min | min_lr */
};

/* The rate of a group with base rate `base` at s->epoch. */
static double rate(const clpar_lr_scheduler *s, double base) {
  double e = (double)s->epoch;
  switch (s->kind) {
    case SCHED_STEP:
      return base * pow(s->x, (double)(s->epoch / s->a));
    case SCHED_LINEAR:
      return base *
             (s->x + (s->y - s->x) * (double)(s->epoch < s->a ? s->epoch : s->a) / (double)s->a);
    case SCHED_COSINE:
      return s->x + (base - s->x) * (1.0 + cos(M_PI * e / (double)s->a)) / 2.0;
    case SCHED_WARMUP_COSINE:
      if (s->epoch < s->a) return base * (e + 1.0) / ((double)s->a + 1.0);
      if (s->epoch > s->b) return s->x;
      return s->x +
             (base - s->x) * 0.5 * (1.0 + cos(M_PI * (e - (double)s->a) / (double)(s->b - s->a)));
  }
  return base;
}

/* Sets every group's rate for s->epoch. */
static clpar_status apply(clpar_lr_scheduler *s) {
  for (int k = 0; k < s->n_groups; k++) {
    float lr = (float)rate(s, s->base[k]);
    clpar_status st = clpar_optimizer_set_lr(s->opt, k, lr);
    if (st != CLPAR_OK) return st;
    s->last[k] = lr;
  }
  return CLPAR_OK;
}

static clpar_status make(const char *fn, clpar_optimizer *opt, sched_kind kind, int64_t a,
                         int64_t b, double x, double y, clpar_lr_scheduler **out) {
  if (!opt || !out)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: the optimizer and out are needed",
                           fn);
  clpar_lr_scheduler *s = calloc(1, sizeof *s);
  int n = clpar_optimizer_group_count(opt);
  double *base = calloc((size_t)n, sizeof *base);
  float *last = calloc((size_t)n, sizeof *last);
  if (!s || !base || !last) {
    free(s);
    free(base);
    free(last);
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  }
  *s = (clpar_lr_scheduler){kind, opt, n, base, last, 0, a, b, x, y};
  for (int k = 0; k < n; k++) base[k] = clpar_optimizer_lr(opt, k);
  clpar_status st = apply(s);
  if (st != CLPAR_OK) {
    clpar_lr_scheduler_free(s);
    return st;
  }
  *out = s;
  return CLPAR_OK;
}

/* A float argument (status.h's convention: 0 is def, CLPAR_ZERO 0) that must be finite and
 * >= 0; *v receives it. */
static clpar_status arg(const char *fn, const char *name, float given, float def, double *v) {
  float f = clpar_opt_float(given, def);
  if (!(f >= 0.0f) || isinf(f))
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: %s is %g; it must be finite and >= 0",
                           fn, name, (double)f);
  *v = f;
  return CLPAR_OK;
}

static clpar_status positive(const char *fn, const char *name, int64_t v) {
  if (v >= 1) return CLPAR_OK;
  return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: %s is %lld; it must be >= 1", fn, name,
                         (long long)v);
}

clpar_status clpar_step_lr_create(clpar_optimizer *opt, int64_t step_size, float gamma,
                                  clpar_lr_scheduler **out) {
  const char *fn = "clpar_step_lr_create";
  double g = 0;
  clpar_status s = positive(fn, "step_size", step_size);
  if (s == CLPAR_OK) s = arg(fn, "gamma", gamma, 0.1f, &g);
  return s != CLPAR_OK ? s : make(fn, opt, SCHED_STEP, step_size, 0, g, 0.0, out);
}

clpar_status clpar_linear_lr_create(clpar_optimizer *opt, float start_factor, float end_factor,
                                    int64_t total_iters, clpar_lr_scheduler **out) {
  const char *fn = "clpar_linear_lr_create";
  double a = 0, b = 0;
  clpar_status s = arg(fn, "start_factor", start_factor, 1.0f / 3.0f, &a);
  if (s == CLPAR_OK) s = arg(fn, "end_factor", end_factor, 1.0f, &b);
  if (s == CLPAR_OK && (a > 1.0 || b > 1.0 || a == 0.0))
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                        "%s: start_factor is %g and end_factor %g; as in PyTorch, start_factor "
                        "must be in (0, 1] and end_factor in [0, 1]",
                        fn, a, b);
  if (s == CLPAR_OK) s = positive(fn, "total_iters", total_iters);
  return s != CLPAR_OK ? s : make(fn, opt, SCHED_LINEAR, total_iters, 0, a, b, out);
}

clpar_status clpar_cosine_lr_create(clpar_optimizer *opt, int64_t t_max, float eta_min,
                                    clpar_lr_scheduler **out) {
  const char *fn = "clpar_cosine_lr_create";
  double e = 0;
  clpar_status s = positive(fn, "t_max", t_max);
  if (s == CLPAR_OK) s = arg(fn, "eta_min", eta_min, 0.0f, &e);
  return s != CLPAR_OK ? s : make(fn, opt, SCHED_COSINE, t_max, 0, e, 0.0, out);
}

clpar_status clpar_warmup_cosine_lr_create(clpar_optimizer *opt, int64_t warmup_iters,
                                           int64_t decay_iters, float min_lr,
                                           clpar_lr_scheduler **out) {
  const char *fn = "clpar_warmup_cosine_lr_create";
  double m = 0;
  clpar_status s = arg(fn, "min_lr", min_lr, 0.0f, &m);
  if (s == CLPAR_OK && (warmup_iters < 0 || decay_iters <= warmup_iters))
    s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                        "%s: warmup_iters is %lld and decay_iters %lld; need 0 <= warmup_iters < "
                        "decay_iters",
                        fn, (long long)warmup_iters, (long long)decay_iters);
  return s != CLPAR_OK ? s
                       : make(fn, opt, SCHED_WARMUP_COSINE, warmup_iters, decay_iters, m, 0.0, out);
}

clpar_status clpar_lr_scheduler_set_epoch(clpar_lr_scheduler *s, int64_t epoch) {
  if (!s || epoch < 0 || epoch == INT64_MAX)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_lr_scheduler_set_epoch: scheduler %s, epoch %lld (must be >= 0)",
                           s ? "given" : "NULL", (long long)epoch);
  s->epoch = epoch;
  return apply(s);
}

clpar_status clpar_lr_scheduler_step(clpar_lr_scheduler *s) {
  if (!s)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_lr_scheduler_step: scheduler is NULL");
  if (s->epoch == INT64_MAX - 1)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_lr_scheduler_step: the epoch count is at its largest");
  s->epoch++;
  return apply(s);
}

int64_t clpar_lr_scheduler_epoch(const clpar_lr_scheduler *s) {
  return s ? s->epoch : -1;
}

float clpar_lr_scheduler_lr(const clpar_lr_scheduler *s, int group) {
  if (!s || group < 0 || group >= s->n_groups) return NAN;
  return s->last[group];
}

void clpar_lr_scheduler_free(clpar_lr_scheduler *s) {
  if (!s) return;
  free(s->base);
  free(s->last);
  free(s);
}
