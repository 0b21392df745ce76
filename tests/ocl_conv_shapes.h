/* ocl_conv_shapes.h — the convolution shapes the OpenCL convolution tests run (test_ocl_conv,
 * test_ocl_conv_bwd): stride, padding, dilation, groups (depthwise included), odd sizes, batch 1,
 * tiles that do not divide the sizes, and exact ResNet-50 layer shapes at small spatial sizes. */
#ifndef CLPAR_TEST_OCL_CONV_SHAPES_H
#define CLPAR_TEST_OCL_CONV_SHAPES_H

#include <stdint.h>

typedef struct {
  int64_t n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, groups;
  int bias;
} cshape;

/* The shapes: the corner cases, then ResNet-50's layers (torchvision v1.5) at 8x8 or less. */
static const struct {
  const char *name;
  cshape s;
} shapes[] = {
    {"3x3 pad 1", {2, 5, 9, 7, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1}},
    {"stride 2, odd", {2, 3, 11, 8, 7, 3, 3, 2, 2, 1, 1, 1, 1, 1, 0}},
    {"per-axis stride, padding, dilation", {1, 4, 9, 10, 5, 3, 2, 2, 1, 2, 0, 2, 3, 1, 1}},
    {"dilation 2", {2, 3, 10, 10, 4, 3, 3, 1, 1, 2, 2, 2, 2, 1, 0}},
    {"groups 2", {2, 6, 7, 7, 4, 3, 3, 1, 1, 1, 1, 1, 1, 2, 1}},
    {"depthwise", {2, 8, 9, 9, 8, 3, 3, 1, 1, 1, 1, 1, 1, 8, 1}},
    {"depthwise x2, stride 2", {1, 4, 8, 8, 8, 3, 3, 2, 2, 1, 1, 1, 1, 4, 0}},
    {"batch 1, 1x1", {1, 7, 5, 3, 9, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1}},
    {"1x1 direct (P 256) with bias", {2, 8, 16, 16, 70, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1}},
    {"3x3 over 256 pixels", {2, 9, 16, 16, 13, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1}},
    {"3x3 no padding, odd", {2, 3, 7, 6, 4, 3, 3, 1, 1, 0, 0, 1, 1, 1, 1}},
    {"3x3 padding 2", {1, 2, 5, 5, 3, 3, 3, 1, 1, 2, 2, 1, 1, 1, 0}},
    {"kernel = image", {3, 2, 4, 5, 3, 4, 5, 1, 1, 0, 0, 1, 1, 1, 1}},
    {"rows past a tile", {1, 3, 6, 6, 130, 2, 2, 1, 1, 0, 0, 1, 1, 1, 0}},
    {"resnet50 conv1", {1, 3, 32, 32, 64, 7, 7, 2, 2, 3, 3, 1, 1, 1, 0}},
    {"resnet50 layer1 conv1", {2, 64, 8, 8, 64, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0}},
    {"resnet50 layer1 conv2", {2, 64, 8, 8, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0}},
    {"resnet50 layer1 conv3", {2, 64, 8, 8, 256, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0}},
    {"resnet50 layer2 conv2 s2", {2, 128, 8, 8, 128, 3, 3, 2, 2, 1, 1, 1, 1, 1, 0}},
    {"resnet50 layer2 downsample", {2, 256, 8, 8, 512, 1, 1, 2, 2, 0, 0, 1, 1, 1, 0}},
    {"resnet50 layer3 conv2", {1, 256, 4, 4, 256, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0}},
    {"resnet50 layer4 conv2", {1, 512, 2, 2, 512, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0}},
    {"resnet50 layer4 conv3", {2, 512, 2, 2, 2048, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0}},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

/* An output side of a convolution: input in, kernel k, stride s, padding p, dilation d. */
static inline int64_t cs_out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

#endif
