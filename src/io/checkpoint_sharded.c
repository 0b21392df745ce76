/* checkpoint_sharded.c — a training checkpoint written by every rank of a job: each rank
 * writes the whole tensors assigned to it (balanced by bytes, the same assignment on every
 * rank since it depends only on the names and sizes) as one safetensors file, and rank 0
 * writes model.safetensors.index.json in Hugging Face's layout. The checkpoint exists once
 * the index is renamed into place, which rank 0 does only after every rank reported its shard
 * durable; the old index is removed before any shard is overwritten, so a crash in between
 * leaves no checkpoint rather than a mix of two. Reading is src/io/shard_index.c. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>
#include <zlib.h>

#include "clpar/dist.h"
#include "io/checkpoint_internal.h"

#define FN "clpar_checkpoint_save_sharded"
#define NOMEM() clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, FN ": out of host memory")

static uint64_t entry_bytes(const clpar_st_entry *e) {
  return (uint64_t)clpar_tensor_numel(e->src) * clpar_st_dtype_size(e->dtype);
}

void clpar_ckpt_shard_name(char *buf, size_t size, int rank, int world) {
  snprintf(buf, size, "model-%05d-of-%05d.safetensors", rank + 1, world);
}

typedef struct {
  uint64_t bytes;
  const char *name;
  int entry;
} sized;

static int by_size_then_name(const void *a, const void *b) {
  const sized *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* owner[i]: the rank that writes entry i; an entry whose owner is set already (>= 0) keeps
 * it. The others largest first, each to the rank with the fewest bytes so far (the lowest
 * such rank): a function of names and sizes only, and no rank gets more than the largest
 * tensor beyond another. */
static clpar_status assign(const clpar_ckpt_set *w, int world, int *owner) {
  sized *order = malloc(((size_t)w->n + 1) * sizeof *order);
  uint64_t *load = calloc((size_t)world, sizeof *load);
  if (!order || !load) {
    free(order);
    free(load);
    return NOMEM();
  }
  int n = 0;
  for (int i = 0; i < w->n; i++) {
    if (owner[i] >= 0 && owner[i] < world)
      load[owner[i]] += entry_bytes(&w->e[i]);
    else
      order[n++] = (sized){entry_bytes(&w->e[i]), w->e[i].name, i};
  }
  qsort(order, (size_t)n, sizeof *order, by_size_then_name);
  for (int k = 0; k < n; k++) {
    int best = 0;
    for (int r = 1; r < world; r++)
      if (load[r] < load[best]) best = r;
    owner[order[k].entry] = best;
    load[best] += order[k].bytes;
  }
  free(order);
  free(load);
  return CLPAR_OK;
}

/* A crc32 of every entry's name, dtype and shape: the ranks must agree on it. */
static uint32_t layout_hash(const clpar_ckpt_set *w) {
  uLong crc = crc32(0, Z_NULL, 0);
  for (int i = 0; i < w->n; i++) {
    const clpar_tensor *t = w->e[i].src;
    int64_t dims[CLPAR_MAX_DIMS + 2] = {w->e[i].dtype, clpar_tensor_ndim(t)};
    for (int k = 0; k < clpar_tensor_ndim(t); k++) dims[k + 2] = clpar_tensor_dim(t, k);
    crc = crc32(crc, (const Bytef *)w->e[i].name, (uInt)strlen(w->e[i].name) + 1);
    crc = crc32(crc, (const Bytef *)dims, (uInt)sizeof dims);
  }
  return (uint32_t)crc;
}

/* The text of model.safetensors.index.json: total_size and the checkpoint's metadata (step,
 * generator, optimizer kind and options; "shard.id" names this save) beside each tensor's
 * file, in w's order (model, then optimizer state). */
static clpar_status index_text(const clpar_ckpt_set *w, const int *owner, int world, const char *id,
                               char **out) {
  json_t *root = json_object(), *meta = json_object(), *map = json_object();
  int bad = !root || !meta || !map;
  uint64_t total = 0;
  for (int i = 0; i < w->n; i++) total += entry_bytes(&w->e[i]);
  bad = bad || json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
  for (int i = 0; !bad && i < w->n_meta; i++)
    bad = json_object_set_new(meta, w->keys[i], json_string(w->values[i])) != 0;
  bad = bad || json_object_set_new(meta, "shard.id", json_string(id));
  for (int i = 0; !bad && i < w->n; i++) {
    char file[64];
    clpar_ckpt_shard_name(file, sizeof file, owner[i], world);
    bad = json_object_set_new(map, w->e[i].name, json_string(file)) != 0;
  }
  bad = bad || json_object_set(root, "metadata", meta) || json_object_set(root, "weight_map", map);
  *out = bad ? NULL : json_dumps(root, JSON_INDENT(2));
  json_decref(meta);
  json_decref(map);
  json_decref(root);
  return *out ? CLPAR_OK : NOMEM();
}

static clpar_status one_part(void *user, int i, const void **data, size_t *size) {
  (void)i;
  *data = user;
  *size = strlen(user);
  return CLPAR_OK;
}

/* Keeps only the entries this rank owns. */
static void keep_own(clpar_ckpt_set *w, const int *owner, int rank) {
  int k = 0;
  for (int i = 0; i < w->n; i++) {
    if (owner[i] != rank) {
      free((void *)w->e[i].name);
      continue;
    }
    w->e[k] = w->e[i];
    memcpy(w->shapes[k], w->shapes[i], sizeof w->shapes[k]);
    k++;
  }
  w->n = k;
}

/* Rank 0 before any shard is written: the directory made if missing, the old index removed
 * (the directory synced), so that a crash while shards are overwritten leaves no index. */
static clpar_status prepare_dir(const char *dir, const char *index) {
  struct stat st;
  if (mkdir(dir, 0777) != 0 && errno != EEXIST)
    return clpar_set_error(CLPAR_ERROR_IO, FN ": cannot make directory %s: %s", dir,
                           strerror(errno));
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
    return clpar_set_error(CLPAR_ERROR_IO, FN ": %s is not a directory", dir);
  if (unlink(index) != 0 && errno != ENOENT)
    return clpar_set_error(CLPAR_ERROR_IO, FN ": cannot remove the old index %s: %s", index,
                           strerror(errno));
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0)
    return clpar_set_error(CLPAR_ERROR_IO, FN ": cannot open directory %s: %s", dir,
                           strerror(errno));
  int synced = fsync(fd) == 0 || errno == EINVAL || errno == EROFS;
  close(fd);
  return synced ? CLPAR_OK : clpar_set_error(CLPAR_ERROR_IO, FN ": cannot sync directory %s", dir);
}

/* A sum over the ranks of n small integers held in floats (exact below 2^24). */
static clpar_status agree(float *v, int n, int world) {
  return world > 1 ? clpar_dist_all_reduce_sum(v, n) : CLPAR_OK;
}

typedef struct {
  const char *dir;
  int rank, world;
  char index[4096];
  char id[17];
  char why[1024]; /* this rank's own error, kept across the collectives */
} save_ctx;

/* Keeps s's message so that it survives the collectives that follow. */
static clpar_status remember(save_ctx *c, clpar_status s) {
  if (s != CLPAR_OK) snprintf(c->why, sizeof c->why, "%s", clpar_last_error());
  return s;
}

static clpar_status recall(const save_ctx *c, clpar_status s) {
  return clpar_set_error(s, "%s", c->why);
}

/* Every rank checks that each collected its tensors and that all collected the same names,
 * dtypes and shapes, before anything on disk changes. */
static clpar_status phase_agree(save_ctx *c, clpar_status mine, uint32_t hash) {
  int n = 3 * c->world;
  float *v = calloc((size_t)n, sizeof *v);
  if (!v) return NOMEM();
  v[3 * c->rank] = (float)(hash >> 16);
  v[3 * c->rank + 1] = (float)(hash & 0xffff);
  v[3 * c->rank + 2] = mine != CLPAR_OK;
  clpar_status s = agree(v, n, c->world);
  if (s == CLPAR_OK && mine != CLPAR_OK) s = recall(c, mine);
  for (int r = 0; s == CLPAR_OK && r < c->world; r++) {
    if (v[3 * r + 2] != 0)
      s = clpar_set_error(CLPAR_ERROR_IO,
                          FN ": rank %d could not gather its tensors; nothing was written", r);
    else if (v[3 * r] != v[3 * c->rank] || v[3 * r + 1] != v[3 * c->rank + 1])
      s = clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                          FN
                          ": rank %d's model or optimizer has other tensors (names, dtypes "
                          "or shapes) than rank %d's; nothing was written",
                          r, c->rank);
  }
  free(v);
  return s;
}

/* Rank 0 prepares the directory and draws the save's id, which every rank learns. */
static clpar_status phase_prepare(save_ctx *c) {
  float v[5] = {0};
  clpar_status prep = CLPAR_OK;
  if (c->rank == 0) {
    uint64_t id = 0;
    prep = remember(c, prepare_dir(c->dir, c->index));
    if (getentropy(&id, sizeof id) != 0) id = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull;
    for (int k = 0; k < 4; k++) v[k] = (float)((id >> (16 * k)) & 0xffff);
    v[4] = prep != CLPAR_OK;
  }
  clpar_status s = agree(v, 5, c->world);
  uint64_t id = 0;
  for (int k = 0; k < 4; k++) id |= (uint64_t)v[k] << (16 * k);
  snprintf(c->id, sizeof c->id, "%016llx", (unsigned long long)id);
  if (s == CLPAR_OK && prep != CLPAR_OK) s = recall(c, prep);
  if (s == CLPAR_OK && v[4] != 0)
    s = clpar_set_error(CLPAR_ERROR_IO, FN ": rank 0 could not prepare %s; nothing was written",
                        c->dir);
  return s;
}

/* Every rank writes its shard; the ranks then learn which failed. */
static clpar_status phase_write(save_ctx *c, clpar_ckpt_set *w, clpar_status pre) {
  float *v = calloc((size_t)c->world, sizeof *v);
  if (!v) return NOMEM();
  char path[4096 + 64], file[64];
  clpar_ckpt_shard_name(file, sizeof file, c->rank, c->world);
  snprintf(path, sizeof path, "%s/%s", c->dir, file);
  clpar_status mine = pre == CLPAR_OK ? clpar_ckpt_meta_add(w, "shard.id", c->id) : pre;
  if (mine == CLPAR_OK) mine = clpar_ckpt_add_checksums(w);
  if (mine == CLPAR_OK && w->n > 0) mine = clpar_ckpt_write(w, path);
  v[c->rank] = remember(c, mine) != CLPAR_OK;
  clpar_status s = agree(v, c->world, c->world);
  if (s == CLPAR_OK && mine != CLPAR_OK) s = recall(c, mine);
  for (int r = 0; s == CLPAR_OK && r < c->world; r++)
    if (v[r] != 0)
      s = clpar_set_error(CLPAR_ERROR_IO,
                          FN ": rank %d could not write its shard; %s holds no checkpoint", r,
                          c->dir);
  free(v);
  return s;
}

/* Rank 0 renames the index into place; every rank returns whether it did. */
static clpar_status phase_index(save_ctx *c, const char *text) {
  clpar_status mine = CLPAR_OK;
  if (c->rank == 0)
    mine = remember(c, clpar_file_write_atomic(c->index, 1, strlen(text), one_part, (void *)text));
  float v = mine != CLPAR_OK;
  clpar_status s = agree(&v, 1, c->world);
  if (s == CLPAR_OK && mine != CLPAR_OK) s = recall(c, mine);
  if (s == CLPAR_OK && v != 0)
    s = clpar_set_error(CLPAR_ERROR_IO, FN ": rank 0 could not write the index of %s", c->dir);
  return s;
}

clpar_status clpar_ckpt_save_sharded_set(const char *dir, clpar_ckpt_set *w, int *owner,
                                         clpar_status mine) {
  save_ctx c = {.dir = dir, .rank = clpar_dist_rank(), .world = clpar_dist_world_size()};
  if (c.rank < 0 || c.world < 1) c.rank = 0, c.world = 1;
  snprintf(c.index, sizeof c.index, "%s/%s", dir, INDEX_NAME);
  char *text = NULL;
  if (mine == CLPAR_OK) mine = assign(w, c.world, owner);
  remember(&c, mine);
  clpar_status s = phase_agree(&c, mine, mine == CLPAR_OK ? layout_hash(w) : 0);
  if (s == CLPAR_OK) s = phase_prepare(&c);
  if (s != CLPAR_OK) return s;
  mine = c.rank == 0 ? index_text(w, owner, c.world, c.id, &text) : CLPAR_OK;
  keep_own(w, owner, c.rank);
  s = phase_write(&c, w, mine);
  if (s == CLPAR_OK) s = phase_index(&c, c.rank == 0 ? text : "");
  free(text);
  return s;
}

clpar_status clpar_checkpoint_save_sharded(const char *dir, const clpar_module *m,
                                           const clpar_optimizer *opt, int64_t step,
                                           int64_t epoch) {
  if (!dir || !*dir || !m)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, FN ": NULL or empty dir, or NULL module");
  if (strlen(dir) + sizeof "/" INDEX_NAME > 4096)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, FN ": dir is too long");
  clpar_ckpt_set w = {0};
  int *owner = NULL;
  clpar_status mine = clpar_ckpt_collect(&w, m, opt, step, epoch);
  if (mine == CLPAR_OK && !(owner = malloc(((size_t)w.n + 1) * sizeof *owner))) mine = NOMEM();
  for (int i = 0; mine == CLPAR_OK && i < w.n; i++) owner[i] = -1;
  clpar_status s = clpar_ckpt_save_sharded_set(dir, &w, owner, mine);
  free(owner);
  clpar_ckpt_set_free(&w);
  return s;
}

clpar_status clpar_checkpoint_load_sharded(const char *dir, clpar_module *m, clpar_optimizer *opt,
                                           int64_t *step, int64_t *epoch) {
  if (!dir || !*dir || !m)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_checkpoint_load_sharded: NULL or empty dir, or NULL module");
  clpar_ckpt_sharded *h;
  const clpar_st_file *f;
  clpar_status s = clpar_ckpt_open_sharded(dir, &h, &f);
  if (s == CLPAR_OK) s = clpar_ckpt_load_file(f, dir, m, opt, step, epoch);
  clpar_ckpt_close_sharded(h);
  return s;
}

static clpar_status read_source(const void *src, void *dst, size_t bytes) {
  const clpar_st_source *from = src;
  (void)bytes; /* the tensor's size, as the entry's shape says */
  return clpar_st_tensor_read(from->file, from->index, dst);
}

/* The view's tensors as entries to write, each read from its shard as the file is written. */
static clpar_status view_entries(const clpar_st_file *f, clpar_st_entry *e,
                                 int64_t (*shapes)[CLPAR_MAX_DIMS], clpar_st_source *src) {
  for (int i = 0; i < f->n; i++) {
    const clpar_st_tensor *t = &f->tensors[i];
    if (t->ndim > CLPAR_MAX_DIMS)
      return clpar_set_error(CLPAR_ERROR_UNSUPPORTED,
                             "clpar_checkpoint_consolidate: tensor %d has more than %d "
                             "dimensions",
                             i, CLPAR_MAX_DIMS);
    for (int k = 0; k < t->ndim; k++) shapes[i][k] = (int64_t)t->shape[k];
    src[i] = (clpar_st_source){f, i};
    e[i] = (clpar_st_entry){t->name, t->dtype, t->ndim, shapes[i], NULL, read_source, &src[i]};
  }
  return CLPAR_OK;
}

clpar_status clpar_checkpoint_consolidate(const char *dir, const char *path) {
  if (!dir || !*dir || !path || !*path)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_checkpoint_consolidate: NULL or empty dir or path");
  clpar_ckpt_sharded *h;
  const clpar_st_file *f;
  clpar_status s = clpar_ckpt_open_sharded(dir, &h, &f);
  if (s != CLPAR_OK) return s;
  s = clpar_ckpt_verify(f, dir);
  clpar_st_entry *e = calloc((size_t)f->n + 1, sizeof *e);
  int64_t(*shapes)[CLPAR_MAX_DIMS] = calloc((size_t)f->n + 1, sizeof *shapes);
  clpar_st_source *src = calloc((size_t)f->n + 1, sizeof *src);
  if (s == CLPAR_OK && (!e || !shapes || !src))
    s = clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "clpar_checkpoint_consolidate: out of memory");
  if (s == CLPAR_OK) s = view_entries(f, e, shapes, src);
  if (s == CLPAR_OK)
    s = clpar_st_write(path, e, f->n, (const char *const *)f->meta_keys,
                       (const char *const *)f->meta_values, f->n_meta);
  free(e);
  free(shapes);
  free(src);
  clpar_ckpt_close_sharded(h);
  return s;
}
