/* capture_fuse.c — at capture end, runs of element-wise commands of a device's list become one
 * ew_chain command (backend.h), on backends that have it.
 *
 * A run is consecutive fill, binary (no broadcast), scale, unary, unary_backward and pointwise
 * commands over the same element count n, none waited for by a caller. Element i of the fused
 * kernel computes every op of the run in order and stores every output the commands stored,
 * so later commands and the host see the same memory. That is the same as running the
 * commands one after another exactly when no element of one op depends on another element of
 * an op before it: so a command joins a run only if every buffer it reads or writes that an
 * op of the run also touches (one of the two writing) is used at the same offset, or not
 * overlapping. A run ends at anything else (a GEMM, a wait, a copy). */
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

static int fuse_off; /* test hook: 1 keeps every command as it is */

void clpar_capture_fuse_disable(int off) {
  fuse_off = off;
}

/* One command seen as an op of a chain: its type, kind, scalar, inputs and output. */
typedef struct {
  size_t n;
  clpar_ew_op op;
  clpar_bref in[2], out;
  int n_in;
} ew_view;

static int view_of(const clpar_command *c, ew_view *v) {
  memset(v, 0, sizeof *v);
  if (c->result) return 0; /* a caller waits for its own result */
  switch (c->op) {
    case CLPAR_ENTRY_fill:
      *v = (ew_view){
          c->u.fill.n, {CLPAR_EW_FILL, 0, 0, c->u.fill.value, {0}, 0}, {{0}}, c->u.fill.out, 0};
      return 1;
    case CLPAR_ENTRY_binary: {
      const clpar_args_binary *a = &c->u.binary;
      if (a->b_rows != a->rows) return 0; /* a broadcast row */
      *v = (ew_view){a->rows * a->cols,
                     {CLPAR_EW_BINARY, (int)a->kind, 0, 0, {0}, 0},
                     {a->a, a->b},
                     a->out,
                     2};
      return (int)a->kind >= 0 && a->kind <= CLPAR_BINARY_DIV;
    }
    case CLPAR_ENTRY_scale:
      *v = (ew_view){c->u.scale.n,
                     {CLPAR_EW_SCALE, 0, 0, c->u.scale.alpha, {0}, 0},
                     {c->u.scale.a},
                     c->u.scale.out,
                     1};
      return 1;
    case CLPAR_ENTRY_unary:
      *v = (ew_view){c->u.unary.n,
                     {CLPAR_EW_UNARY, (int)c->u.unary.kind, 0, 0, {0}, 0},
                     {c->u.unary.a},
                     c->u.unary.out,
                     1};
      return (int)c->u.unary.kind >= 0 && c->u.unary.kind <= CLPAR_UNARY_NEG;
    case CLPAR_ENTRY_unary_backward: {
      const clpar_args_unary_backward *a = &c->u.unary_backward;
      *v = (ew_view){
          a->n, {CLPAR_EW_UNARY_BACKWARD, (int)a->kind, 0, 0, {0}, 0}, {a->g, a->saved}, a->out, 2};
      return (int)a->kind >= 0 && a->kind <= CLPAR_UNARY_TANH;
    }
    case CLPAR_ENTRY_pointwise: {
      const clpar_args_pointwise *a = &c->u.pointwise;
      int has_g = a->g.buf != NULL;
      *v = (ew_view){a->n,
                     {CLPAR_EW_POINTWISE, (int)a->kind, has_g, a->p, {0}, 0},
                     {a->x, a->g},
                     a->out,
                     1 + has_g};
      return (int)a->kind >= 0 && a->kind <= CLPAR_PW_GELU_ERF;
    }
    default:
      return 0;
  }
}

/* 1 when accesses x and y of n elements may be in one run: other buffers, the same offset, or
 * ranges that do not overlap; two reads always. */
static int compatible(clpar_bref x, int x_writes, clpar_bref y, int y_writes, size_t n) {
  if (x.buf != y.buf || x.off == y.off || (!x_writes && !y_writes)) return 1;
  return x.off + n <= y.off || y.off + n <= x.off;
}

/* 1 when op v may join the run of k ops views[0 .. k). */
static int may_join(const ew_view *views, int k, const ew_view *v) {
  if (k == CLPAR_EW_MAX_OPS || v->n != views[0].n) return 0;
  for (int j = 0; j < k; j++) {
    const ew_view *u = &views[j];
    for (int a = 0; a <= v->n_in; a++) {
      clpar_bref x = a < v->n_in ? v->in[a] : v->out;
      int xw = a == v->n_in;
      for (int b = 0; b <= u->n_in; b++)
        if (!compatible(x, xw, b < u->n_in ? u->in[b] : u->out, b == u->n_in, v->n)) return 0;
    }
  }
  return 1;
}

static int ref_index(clpar_ew_chain *c, clpar_bref r) {
  for (int i = 0; i < c->n_refs; i++)
    if (c->refs[i].buf == r.buf && c->refs[i].off == r.off) return i;
  c->refs[c->n_refs] = r;
  return c->n_refs++;
}

/* The chain of the run's k ops: an input an earlier op of the run wrote (the same buffer and
 * offset: it is element i of that op's output) is taken from that op's result. */
static void build_chain(const ew_view *views, int k, clpar_ew_chain *c) {
  memset(c, 0, sizeof *c);
  c->n = views[0].n;
  c->n_ops = k;
  for (int j = 0; j < k; j++) {
    clpar_ew_op op = views[j].op;
    for (int a = 0; a < views[j].n_in; a++) {
      int from = -1; /* the last earlier op that wrote this input */
      for (int e = 0; e < j; e++)
        if (views[e].out.buf == views[j].in[a].buf && views[e].out.off == views[j].in[a].off)
          from = e;
      op.in[a] = from >= 0 ? -1 - from : ref_index(c, views[j].in[a]);
    }
    op.out = ref_index(c, views[j].out);
    c->ops[j] = op;
  }
}

/* The list of chains a device's fused commands point at (freed with the graph). */
struct clpar_fused {
  clpar_ew_chain *chains;
  size_t n;
};

void clpar_capture_fused_free(clpar_fused *f) {
  if (!f) return;
  free(f->chains);
  free(f);
}

/* The length (>= 2) of the run that may start at cmds[i], views filled; 0 if none. */
static int run_at(const clpar_command *cmds, size_t n, size_t i, ew_view *views) {
  int k = 0;
  while (i + (size_t)k < n && view_of(&cmds[i + k], &views[k]) && may_join(views, k, &views[k]))
    k++;
  return k >= 2 ? k : 0;
}

/* Counts the runs, to size the chain list once (the commands then point into it). */
static size_t count_runs(const clpar_command *cmds, size_t n) {
  ew_view views[CLPAR_EW_MAX_OPS + 1];
  size_t runs = 0;
  for (size_t i = 0; i < n;) {
    int k = run_at(cmds, n, i, views);
    runs += k > 0;
    i += k > 0 ? (size_t)k : 1;
  }
  return runs;
}

void clpar_capture_fuse(clpar_device *dev, clpar_command *cmds, size_t *n, size_t **map,
                        clpar_fused **fused) {
  *map = NULL;
  *fused = NULL;
  const clpar_backend_iface *f = dev->bd.iface;
  const char *env = getenv("CLPAR_GRAPH_FUSE"); /* "0": off (benchmarks' comparison) */
  if (fuse_off || (env && strcmp(env, "0") == 0) || !f->ew_chain || !f->ew_chain_prepare) return;
  size_t runs = count_runs(cmds, *n);
  if (runs == 0) return;
  clpar_fused *fu = calloc(1, sizeof *fu);
  size_t *m = malloc(*n * sizeof *m);
  if (fu) fu->chains = calloc(runs, sizeof *fu->chains);
  if (!fu || !m || !fu->chains) {
    clpar_capture_fused_free(fu);
    free(m);
    return; /* out of memory: the commands stay as they are */
  }
  ew_view views[CLPAR_EW_MAX_OPS + 1];
  size_t w = 0;
  for (size_t i = 0; i < *n;) {
    int k = run_at(cmds, *n, i, views);
    clpar_ew_chain *c = k ? &fu->chains[fu->n] : NULL;
    if (c) build_chain(views, k, c);
    if (c && f->ew_chain_prepare(dev->bd.ctx, c) == CLPAR_OK) { /* else kept as they are */
      for (int j = 0; j < k; j++) m[i + j] = w;
      cmds[w] = (clpar_command){.op = CLPAR_ENTRY_ew_chain, .result = NULL};
      cmds[w++].u.ew_chain.chain = c;
      fu->n++;
      i += (size_t)k;
      continue;
    }
    if (c) clpar_clear_error();
    for (int j = 0; j < (k ? k : 1); j++, i++) {
      m[i] = w;
      cmds[w++] = cmds[i];
    }
  }
  *n = w;
  *map = m;
  *fused = fu;
}
