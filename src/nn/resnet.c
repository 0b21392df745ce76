/* resnet.c — torchvision's ResNets (torchvision/models/resnet.py, v0.14): BasicBlock,
 * Bottleneck and ResNet, built from the public modules (Conv2d, BatchNorm2d, ReLU, MaxPool2d,
 * AdaptiveAvgPool2d, Linear, Sequential) with torchvision's child names and registration
 * order, so that the state_dict has torchvision's names in torchvision's order. The forwards
 * find their children by name, so a program may look at or replace a child
 * (clpar_module_child) and the model stays a plain module tree. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

#define BN_EPS 1e-5f
#define BN_MOMENTUM 0.1f

/* x through self's children named names[0..n-1] in order; x stays the caller's, every
 * intermediate is freed (the graph keeps what backward needs). */
static clpar_status chain(clpar_module *self, const char *const *names, int n, clpar_tensor *x,
                          clpar_tensor **y) {
  clpar_tensor *cur = x;
  for (int i = 0; i < n; i++) {
    clpar_module *child = clpar_module_child(self, names[i]);
    clpar_tensor *next = NULL;
    clpar_status s = child ? clpar_module_forward(child, cur, &next)
                           : clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                                             "%s forward: the child \"%s\" is missing",
                                             clpar_module_type(self), names[i]);
    if (cur != x) clpar_tensor_free(cur);
    if (s != CLPAR_OK) return s;
    cur = next;
  }
  *y = cur;
  return CLPAR_OK;
}

/* relu(body(x) + identity), identity = downsample(x) when the block has one, else x. */
static clpar_status block_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                  void *user) {
  (void)user;
  static const char *const basic[] = {"conv1", "bn1", "relu", "conv2", "bn2"};
  static const char *const bottleneck[] = {"conv1", "bn1",  "relu",  "conv2",
                                           "bn2",   "relu", "conv3", "bn3"};
  int is_bottleneck = clpar_module_child(self, "conv3") != NULL;
  clpar_tensor *body = NULL, *identity = x, *sum = NULL;
  clpar_status s =
      is_bottleneck ? chain(self, bottleneck, 8, x, &body) : chain(self, basic, 5, x, &body);
  clpar_module *down = clpar_module_child(self, "downsample");
  if (s == CLPAR_OK && down) s = clpar_module_forward(down, x, &identity);
  if (s == CLPAR_OK) s = clpar_add(body, identity, &sum);
  if (s == CLPAR_OK) s = clpar_relu(sum, y);
  clpar_tensor_free(body);
  if (identity != x) clpar_tensor_free(identity);
  clpar_tensor_free(sum);
  return s;
}

static clpar_status resnet_forward(clpar_module *self, clpar_tensor *x, clpar_tensor **y,
                                   void *user) {
  (void)user;
  static const char *const trunk[] = {"conv1",  "bn1",    "relu",   "maxpool", "layer1",
                                      "layer2", "layer3", "layer4", "avgpool"};
  clpar_tensor *pooled = NULL, *flat = NULL;
  clpar_status s = chain(self, trunk, 9, x, &pooled);
  if (s == CLPAR_OK) s = clpar_tensor_flatten(pooled, 1, -1, &flat);
  const char *fc[] = {"fc"};
  if (s == CLPAR_OK) s = chain(self, fc, 1, flat, y);
  clpar_tensor_free(pooled);
  clpar_tensor_free(flat);
  return s;
}

/* Conv2d without bias, weight Kaiming normal with fan_out (torchvision's ResNet init:
 * kaiming_normal_(mode="fan_out", nonlinearity="relu"), std = sqrt(2 / fan_out)). */
static clpar_status conv_create(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t pad,
                                clpar_device *dev, clpar_module **m) {
  clpar_conv2d_options opt = {
      .stride = {stride, stride}, .padding = {pad, pad}, .dilation = {1, 1}, .groups = 1};
  clpar_status s = clpar_conv2d_create(in, out, k, k, &opt, 0, dev, m);
  if (s != CLPAR_OK) return s;
  clpar_tensor *w = clpar_module_parameter(*m, "weight"), *init = NULL;
  int64_t shape[4] = {out, in, k, k};
  float std = sqrtf(2.0f / (float)(out * k * k));
  s = clpar_tensor_rand_normal(dev, 4, shape, clpar_param_seed_next(), 0.0f, std, &init);
  if (s == CLPAR_OK) s = clpar_copy(w, init);
  clpar_tensor_free(init);
  if (s != CLPAR_OK) {
    clpar_module_free(*m);
    *m = NULL;
  }
  return s;
}

static clpar_status bn_create(int64_t c, clpar_device *dev, clpar_module **m) {
  clpar_batchnorm2d_options o = {.eps = BN_EPS, .momentum = BN_MOMENTUM};
  return clpar_batchnorm2d_create(c, &o, dev, m);
}

/* After a success so far (s), makes a child with `make` (a create call that sets c) and
 * registers it in m under name (add_child frees it on error). */
#define ADD_CHILD(m, name, make)                                     \
  do {                                                               \
    if (s == CLPAR_OK) {                                             \
      c = NULL;                                                      \
      s = (make);                                                    \
      if (s == CLPAR_OK) s = clpar_module_add_child((m), (name), c); \
    }                                                                \
  } while (0)

/* Sequential(conv1x1(in, out, stride), BatchNorm2d(out)) */
static clpar_status downsample_create(int64_t in, int64_t out, int64_t stride, clpar_device *dev,
                                      clpar_module **m) {
  clpar_module *parts[2] = {NULL, NULL};
  clpar_status s = conv_create(in, out, 1, stride, 0, dev, &parts[0]);
  if (s == CLPAR_OK) s = bn_create(out, dev, &parts[1]);
  if (s != CLPAR_OK) {
    clpar_module_free(parts[0]);
    return s;
  }
  return clpar_sequential_create(parts, 2, m);
}

static int64_t expansion(clpar_resnet_block block) {
  return block == CLPAR_RESNET_BOTTLENECK ? 4 : 1;
}

/* The children in torchvision's __init__ order (the state_dict's order). */
static clpar_status block_children(clpar_module *m, clpar_resnet_block block, int64_t in,
                                   int64_t planes, int64_t stride, clpar_device *dev) {
  clpar_module *c = NULL;
  int64_t out = planes * expansion(block);
  clpar_status s = CLPAR_OK;
  if (block == CLPAR_RESNET_BASIC) {
    ADD_CHILD(m, "conv1", conv_create(in, planes, 3, stride, 1, dev, &c));
    ADD_CHILD(m, "bn1", bn_create(planes, dev, &c));
    ADD_CHILD(m, "relu", clpar_relu_create(&c));
    ADD_CHILD(m, "conv2", conv_create(planes, planes, 3, 1, 1, dev, &c));
    ADD_CHILD(m, "bn2", bn_create(planes, dev, &c));
  } else {
    ADD_CHILD(m, "conv1", conv_create(in, planes, 1, 1, 0, dev, &c));
    ADD_CHILD(m, "bn1", bn_create(planes, dev, &c));
    ADD_CHILD(m, "conv2", conv_create(planes, planes, 3, stride, 1, dev, &c));
    ADD_CHILD(m, "bn2", bn_create(planes, dev, &c));
    ADD_CHILD(m, "conv3", conv_create(planes, out, 1, 1, 0, dev, &c));
    ADD_CHILD(m, "bn3", bn_create(out, dev, &c));
    ADD_CHILD(m, "relu", clpar_relu_create(&c));
  }
  if (stride != 1 || in != out)
    ADD_CHILD(m, "downsample", downsample_create(in, out, stride, dev, &c));
  return s;
}

clpar_status clpar_resnet_block_create(clpar_resnet_block block, int64_t inplanes, int64_t planes,
                                       int64_t stride, clpar_device *dev, clpar_module **out) {
  if (!out || !dev || (block != CLPAR_RESNET_BASIC && block != CLPAR_RESNET_BOTTLENECK) ||
      inplanes < 1 || planes < 1 || planes > INT64_MAX / 4 || stride < 1)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_resnet_block_create: bad arguments (block %d, inplanes %lld, "
                           "planes %lld, stride %lld, device %p, out %p)",
                           (int)block, (long long)inplanes, (long long)planes, (long long)stride,
                           (void *)dev, (void *)out);
  clpar_module *m;
  clpar_status s = clpar_module_create(block == CLPAR_RESNET_BASIC ? "BasicBlock" : "Bottleneck",
                                       block_forward, NULL, NULL, &m);
  if (s == CLPAR_OK) s = block_children(m, block, inplanes, planes, stride, dev);
  if (s != CLPAR_OK) {
    clpar_module_free(m);
    return s;
  }
  *out = m;
  return CLPAR_OK;
}

/* layerN: Sequential of n blocks, the first with the stride (and downsample when needed). */
static clpar_status layer_create(clpar_resnet_block block, int64_t *inplanes, int64_t planes, int n,
                                 int64_t stride, clpar_device *dev, clpar_module **out) {
  clpar_module **blocks = calloc((size_t)n, sizeof *blocks);
  if (!blocks)
    return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "clpar_resnet_create: out of host memory");
  clpar_status s = CLPAR_OK;
  for (int i = 0; i < n && s == CLPAR_OK; i++) {
    s = clpar_resnet_block_create(block, *inplanes, planes, i == 0 ? stride : 1, dev, &blocks[i]);
    *inplanes = planes * expansion(block);
  }
  if (s == CLPAR_OK) {
    s = clpar_sequential_create(blocks, n, out);
  } else {
    for (int i = 0; i < n; i++) clpar_module_free(blocks[i]);
  }
  free(blocks);
  return s;
}

static clpar_status resnet_children(clpar_module *m, clpar_resnet_block block, const int layers[4],
                                    int64_t num_classes, clpar_device *dev) {
  clpar_module *c = NULL;
  int64_t inplanes = 64, k3[2] = {3, 3}, s2[2] = {2, 2}, p1[2] = {1, 1};
  clpar_status s = CLPAR_OK;
  ADD_CHILD(m, "conv1", conv_create(3, 64, 7, 2, 3, dev, &c));
  ADD_CHILD(m, "bn1", bn_create(64, dev, &c));
  ADD_CHILD(m, "relu", clpar_relu_create(&c));
  ADD_CHILD(m, "maxpool", clpar_max_pool2d_create(k3, s2, p1, &c));
  for (int i = 0; i < 4; i++) {
    char name[8];
    snprintf(name, sizeof name, "layer%d", i + 1);
    ADD_CHILD(m, name,
              layer_create(block, &inplanes, (int64_t)64 << i, layers[i], i == 0 ? 1 : 2, dev, &c));
  }
  ADD_CHILD(m, "avgpool", clpar_adaptive_avg_pool2d_create(1, 1, &c));
  ADD_CHILD(m, "fc", clpar_linear_create(inplanes, num_classes, 1, dev, &c));
  return s;
}

clpar_status clpar_resnet_create(clpar_resnet_block block, const int layers[4], int64_t num_classes,
                                 clpar_device *dev, clpar_module **out) {
  int good = out && dev && layers && num_classes >= 1 &&
             (block == CLPAR_RESNET_BASIC || block == CLPAR_RESNET_BOTTLENECK);
  for (int i = 0; good && i < 4; i++) good = layers[i] >= 1 && layers[i] <= 1000;
  if (!good)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_resnet_create: bad arguments (block %d, layers %s, num_classes "
                           "%lld, device %p, out %p); every layer needs 1 to 1000 blocks",
                           (int)block, layers ? "given" : "NULL", (long long)num_classes,
                           (void *)dev, (void *)out);
  if (!clpar_is_initialized())
    return clpar_set_error(CLPAR_ERROR_NOT_INITIALIZED,
                           "clpar_resnet_create: call clpar_init first");
  clpar_module *m;
  clpar_status s = clpar_module_create("ResNet", resnet_forward, NULL, NULL, &m);
  if (s == CLPAR_OK) s = resnet_children(m, block, layers, num_classes, dev);
  if (s != CLPAR_OK) {
    clpar_module_free(m);
    return s;
  }
  *out = m;
  return CLPAR_OK;
}

clpar_status clpar_resnet18(int64_t num_classes, clpar_device *dev, clpar_module **out) {
  return clpar_resnet_create(CLPAR_RESNET_BASIC, (const int[4]){2, 2, 2, 2}, num_classes, dev, out);
}

clpar_status clpar_resnet34(int64_t num_classes, clpar_device *dev, clpar_module **out) {
  return clpar_resnet_create(CLPAR_RESNET_BASIC, (const int[4]){3, 4, 6, 3}, num_classes, dev, out);
}

clpar_status clpar_resnet50(int64_t num_classes, clpar_device *dev, clpar_module **out) {
  return clpar_resnet_create(CLPAR_RESNET_BOTTLENECK, (const int[4]){3, 4, 6, 3}, num_classes, dev,
                             out);
}

clpar_status clpar_resnet101(int64_t num_classes, clpar_device *dev, clpar_module **out) {
  return clpar_resnet_create(CLPAR_RESNET_BOTTLENECK, (const int[4]){3, 4, 23, 3}, num_classes, dev,
                             out);
}

clpar_status clpar_resnet152(int64_t num_classes, clpar_device *dev, clpar_module **out) {
  return clpar_resnet_create(CLPAR_RESNET_BOTTLENECK, (const int[4]){3, 8, 36, 3}, num_classes, dev,
                             out);
}

/* The model-parallel tutorial's cut: Sequentials over the ResNet's own children (each child gains a
 * parent, nn.h: a module may be a child at several places), so head and tail share the parameters,
 * buffers and training flags with resnet and outlive it when it is freed. */
clpar_status clpar_resnet_split(clpar_module *resnet, int split, clpar_module **head,
                                clpar_module **tail) {
  static const char *const names[] = {"conv1",  "bn1",    "relu",   "maxpool", "layer1",
                                      "layer2", "layer3", "layer4", "avgpool", "fc"};
  enum { N_NAMES = 10, FIRST_LAYER = 4 };
  if (!resnet || !head || !tail || split < 1 || split > 3)
    return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                           "clpar_resnet_split: bad arguments (resnet %p, split %d, head %p, tail "
                           "%p); split is the last layer of the head, 1 to 3",
                           (void *)resnet, split, (void *)head, (void *)tail);
  clpar_module *c[N_NAMES + 1];
  for (int i = 0; i < N_NAMES; i++)
    if (!(c[i] = clpar_module_child(resnet, names[i])))
      return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                             "clpar_resnet_split: the %s module has no child \"%s\"; a ResNet of "
                             "clpar_resnet_create is needed",
                             clpar_module_type(resnet), names[i]);
  int n_head = FIRST_LAYER + split, n_tail = N_NAMES - n_head;
  /* the tail: layer<split+1> .. layer4, avgpool, Flatten(1, -1), fc */
  c[N_NAMES] = c[N_NAMES - 1];
  clpar_module *h = NULL, *t = NULL;
  clpar_status s = clpar_flatten_create(1, -1, &c[N_NAMES - 1]);
  if (s != CLPAR_OK) return s;
  s = clpar_sequential_create(c, n_head, &h);
  if (s == CLPAR_OK) {
    s = clpar_sequential_create(c + n_head, n_tail + 1, &t);
  } else {
    clpar_module_free(c[N_NAMES - 1]); /* the Flatten no Sequential took */
  }
  if (s != CLPAR_OK) {
    clpar_module_free(h);
    return s;
  }
  *head = h;
  *tail = t;
  return CLPAR_OK;
}
