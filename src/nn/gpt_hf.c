/* gpt_hf.c — a GPT-2 checkpoint in Hugging Face's layout loaded into clpar's GPT.
 *
 * HF's GPT2 keeps the four projections of a block as Conv1D, whose weight is [in, out], the
 * transpose of nn.Linear's [out, in]; its files also hold each block's causal mask
 * (h.<i>.attn.bias) and masked_bias, and leave out the tied lm_head.weight; the hub's GPT2Model
 * files name the tensors without "transformer.". The file is read into a shadow tree of
 * modules that has the file's names and shapes (safetensors' own checks, strict about what
 * the GPT needs), then each tensor is copied into the GPT, the Conv1D weights transposed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static const char *const conv1d[] = {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                                     "mlp.c_proj.weight"};

static int is_conv1d(const char *name) {
  size_t n = strlen(name);
  for (int i = 0; i < 4; i++) {
    size_t k = strlen(conv1d[i]);
    if (n > k && strcmp(name + n - k, conv1d[i]) == 0 && name[n - k - 1] == '.') return 1;
  }
  return 0;
}

static clpar_status no_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y, void *u) {
  (void)x, (void)y, (void)u;
  return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: holds a file's tensors only",
                         clpar_module_type(self));
}

/* Adds t to root under the dotted name, making the modules on the way. */
static clpar_status shadow_add(clpar_module *root, const char *name, clpar_tensor *t) {
  char path[512];
  if (snprintf(path, sizeof path, "%s", name) >= (int)sizeof path)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_gpt_load_hf: name %s too long",
                           name);
  clpar_module *m = root;
  char *part = path, *dot;
  clpar_status s = CLPAR_OK;
  while (s == CLPAR_OK && (dot = strchr(part, '.'))) {
    *dot = '\0';
    clpar_module *child = clpar_module_child(m, part);
    if (!child) {
      s = clpar_module_create("HFTensors", no_forward, NULL, NULL, &child);
      if (s == CLPAR_OK) s = clpar_module_add_child(m, part, child);
    }
    m = child;
    part = dot + 1;
  }
  return s == CLPAR_OK ? clpar_module_add_parameter(m, part, t) : s;
}

/* The shadow of gpt: each of its tensors under the file's name (without "transformer." when
 * bare), a Conv1D weight [in, out], on the host. */
static clpar_status make_shadow(clpar_module *gpt, int bare, clpar_module **out) {
  clpar_status s = clpar_module_create("HFTensors", no_forward, NULL, NULL, out);
  for (int i = 0; s == CLPAR_OK && i < clpar_module_state_count(gpt); i++) {
    const char *name;
    clpar_tensor *p, *t = NULL;
    s = clpar_module_state_at(gpt, i, &name, &p, NULL);
    if (s != CLPAR_OK) break;
    int64_t shape[8];
    memcpy(shape, p->shape, sizeof(int64_t) * (size_t)p->ndim);
    if (is_conv1d(name)) shape[0] = p->shape[1], shape[1] = p->shape[0];
    if (bare && strncmp(name, "transformer.", 12) == 0) name += 12;
    s = clpar_tensor_zeros(clpar_device_host(), p->ndim, shape, &t);
    if (s == CLPAR_OK) s = shadow_add(*out, name, t);
    clpar_tensor_free(t);
  }
  if (s != CLPAR_OK) clpar_module_free(*out), *out = NULL;
  return s;
}

/* The file's names the GPT has no place for: only HF's masks and the tied head may be there. */
static int only_extras(const char *unexpected) {
  char list[4096];
  if (snprintf(list, sizeof list, "%s", unexpected) >= (int)sizeof list) return 0;
  for (char *save = NULL, *n = strtok_r(list, ", ", &save); n; n = strtok_r(NULL, ", ", &save)) {
    size_t k = strlen(n);
    int mask = (k > 10 && strcmp(n + k - 10, ".attn.bias") == 0) ||
               (k > 17 && strcmp(n + k - 17, ".attn.masked_bias") == 0);
    if (!mask && strcmp(n, "lm_head.weight") != 0) return 0;
  }
  return 1;
}

/* The shadow's tensor for the GPT's name (with or without "transformer."). */
static clpar_status shadow_find(const clpar_module *shadow, const char *name, clpar_tensor **t) {
  const char *bare = strncmp(name, "transformer.", 12) == 0 ? name + 12 : name;
  for (int i = 0; i < clpar_module_state_count(shadow); i++) {
    const char *n;
    clpar_status s = clpar_module_state_at(shadow, i, &n, t, NULL);
    if (s != CLPAR_OK || strcmp(n, name) == 0 || strcmp(n, bare) == 0) return s;
  }
  return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "clpar_gpt_load_hf: no %s read", name);
}

/* Reads path into a shadow of gpt, trying the GPT2LMHeadModel names, then the bare ones. */
static clpar_status read_shadow(clpar_module *gpt, const char *path, clpar_module **shadow) {
  const char *fn = "clpar_gpt_load_hf";
  clpar_status s = CLPAR_OK;
  for (int bare = 0; bare < 2; bare++) {
    clpar_load_report r = {0};
    s = make_shadow(gpt, bare, shadow);
    if (s == CLPAR_OK) s = clpar_safetensors_load(*shadow, path, 0, &r);
    int none = s == CLPAR_OK && r.loaded == 0 && !bare;
    if (s == CLPAR_OK && !none && (*r.missing || *r.mismatched || !only_extras(r.unexpected)))
      s = clpar_set_error(CLPAR_ERROR_SHAPE_MISMATCH,
                          "%s: %s is not this GPT in GPT-2's layout: missing [%s], unexpected "
                          "[%s], of another shape or dtype [%s]",
                          fn, path, r.missing, r.unexpected, r.mismatched);
    clpar_load_report_free(&r);
    if (s == CLPAR_OK && !none) return CLPAR_OK;
    clpar_module_free(*shadow);
    *shadow = NULL;
    if (s != CLPAR_OK) return s;
  }
  return s;
}

clpar_status clpar_gpt_load_hf(clpar_module *gpt, const char *path) {
  const char *fn = "clpar_gpt_load_hf";
  if (!gpt || !path) return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (strcmp(clpar_module_type(gpt), "GPT") != 0)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT, "%s: the module is a %s, not a GPT", fn,
                           clpar_module_type(gpt));
  clpar_module *shadow = NULL;
  clpar_status s = read_shadow(gpt, path, &shadow);
  int was = clpar_set_grad_enabled(0);
  for (int i = 0; s == CLPAR_OK && i < clpar_module_state_count(gpt); i++) {
    const char *name;
    clpar_tensor *p, *src, *moved = NULL, *t = NULL;
    s = clpar_module_state_at(gpt, i, &name, &p, NULL);
    if (s == CLPAR_OK) s = shadow_find(shadow, name, &src);
    if (s == CLPAR_OK) s = clpar_tensor_to(src, p->storage->dev, &moved);
    if (s == CLPAR_OK && is_conv1d(name)) s = clpar_transpose(moved, 0, 1, &t);
    if (s == CLPAR_OK) s = clpar_copy(p, t ? t : moved);
    clpar_tensor_free(moved);
    clpar_tensor_free(t);
  }
  clpar_set_grad_enabled(was);
  clpar_module_free(shadow);
  return s;
}
