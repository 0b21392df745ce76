/* conv.h — convolutional layers as PyTorch has them: 2-D convolution (stride, padding,
 * dilation, groups), max and adaptive average pooling, batch norm (F.batch_norm), and the
 * modules nn.Conv2d, nn.BatchNorm2d, nn.MaxPool2d, nn.AdaptiveAvgPool2d and nn.Flatten. Images are
 * NCHW float32 tensors. Every op is differentiable, runs on any device (host, OpenCL, CUDA), and on
 * bad input returns an error naming the shapes with nothing allocated or changed. */
#ifndef CLPAR_CONV_H
#define CLPAR_CONV_H

#include <stdint.h>

#include "export.h"
#include "nn.h"
#include "status.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* [0] is the height's, [1] the width's. A field left 0 takes PyTorch's default (status.h's
 * convention): stride 0 means 1, dilation 0 means 1, groups 0 means 1; padding's default is 0,
 * so 0 is literal. {.padding = {1, 1}} is nn.Conv2d(..., padding=1). */
typedef struct clpar_conv2d_options {
  int64_t stride[2];   /* 0: 1 */
  int64_t padding[2];  /* 0 */
  int64_t dilation[2]; /* 0: 1 */
  int64_t groups;      /* 0: 1 */
} clpar_conv2d_options;

/* F.conv2d: x [N, C, H, W], weight [O, C / groups, kh, kw], bias [O] or NULL; options NULL
 * means stride 1, padding 0, dilation 1, groups 1. out: [N, O, oh, ow] with
 * oh = (H + 2 padding - dilation (kh - 1) - 1) / stride + 1. Computed as im2col + the device's
 * GEMM over chunks of images whose columns take at most 64 MiB (or one image's, when that is
 * more); a 1x1 convolution with stride 1 and no padding multiplies the images directly. */
CLPAR_API clpar_status clpar_conv2d(const clpar_tensor *x, const clpar_tensor *weight,
                                    const clpar_tensor *bias, const clpar_conv2d_options *options,
                                    clpar_tensor **out);
/* F.max_pool2d: x [N, C, H, W] (or [C, H, W]); stride NULL means the kernel, padding NULL
 * means 0 (at most half the kernel, as PyTorch requires); padding never wins. Backward sends
 * each output's gradient to its window's maximum. */
CLPAR_API clpar_status clpar_max_pool2d(const clpar_tensor *x, const int64_t kernel[2],
                                        const int64_t stride[2], const int64_t padding[2],
                                        clpar_tensor **out);
/* F.adaptive_avg_pool2d: x [N, C, H, W] (or [C, H, W]) to [N, C, out_h, out_w]; bin i covers
 * rows floor(i H / out_h) to ceil((i + 1) H / out_h) - 1, and columns likewise. */
CLPAR_API clpar_status clpar_adaptive_avg_pool2d(const clpar_tensor *x, int64_t out_h,
                                                 int64_t out_w, clpar_tensor **out);
/* F.batch_norm: x [N, C, ...]; running_mean and running_var [C] (may both be NULL when
 * training); weight and bias [C] or NULL. Training: normalizes with the batch's mean and
 * biased variance over every dimension but 1, and updates the running statistics in place
 * (running = (1 - momentum) running + momentum batch, with the unbiased variance); needs more
 * than one value per channel. Eval: normalizes with the running statistics. */
CLPAR_API clpar_status clpar_batch_norm(const clpar_tensor *x, clpar_tensor *running_mean,
                                        clpar_tensor *running_var, const clpar_tensor *weight,
                                        const clpar_tensor *bias, int training, float momentum,
                                        float eps, clpar_tensor **out);

/* nn.Conv2d: parameters "weight" [out_ch, in_ch / groups, kh, kw] and "bias" [out_ch] (when
 * bias is nonzero), both uniform in +-1/sqrt(in_ch / groups * kh * kw) (PyTorch's default
 * kaiming_uniform(a = sqrt(5))), from the generator clpar_manual_seed seeds. */
CLPAR_API clpar_status clpar_conv2d_create(int64_t in_ch, int64_t out_ch, int64_t kh, int64_t kw,
                                           const clpar_conv2d_options *options, int bias,
                                           clpar_device *dev, clpar_module **out);
/* nn.BatchNorm2d's arguments. A field left 0 takes PyTorch's default (status.h's
 * convention); the flags are named so that 0 is PyTorch's True. */
typedef struct clpar_batchnorm2d_options {
  float eps;            /* 0: 1e-5; must be > 0 */
  float momentum;       /* 0: 0.1; CLPAR_ZERO: 0 (the running statistics stay as they are);
                         * in [0, 1] (PyTorch's momentum=None, a cumulative average, is not
                         * offered) */
  int no_affine;        /* 0: affine=True; nonzero: affine=False (no weight and bias) */
  int no_running_stats; /* 0: track_running_stats=True; nonzero: False */
} clpar_batchnorm2d_options;

/* nn.BatchNorm2d(num_features) on dev, for input [N, num_features, H, W]; options NULL means
 * PyTorch's defaults (eps 1e-5, momentum 0.1, affine, tracking). affine: parameters "weight"
 * (ones) and "bias" (zeros). Tracking: buffers "running_mean" (zeros), "running_var" (ones) and
 * "num_batches_tracked" (int64, 0-d, 0). In training mode (clpar_module_train) it normalizes
 * with the batch's statistics and, when tracking, updates the running statistics in place
 * (new = (1 - momentum) * old + momentum * batch value, the variance unbiased) and adds one to
 * num_batches_tracked; in eval mode (clpar_module_eval) it normalizes with the running
 * statistics. A module that does not track always uses the batch's statistics. */
CLPAR_API clpar_status clpar_batchnorm2d_create(int64_t num_features,
                                                const clpar_batchnorm2d_options *options,
                                                clpar_device *dev, clpar_module **out);
/* nn.MaxPool2d (stride NULL: the kernel; padding NULL: 0). */
CLPAR_API clpar_status clpar_max_pool2d_create(const int64_t kernel[2], const int64_t stride[2],
                                               const int64_t padding[2], clpar_module **out);
/* nn.AdaptiveAvgPool2d((out_h, out_w)). */
CLPAR_API clpar_status clpar_adaptive_avg_pool2d_create(int64_t out_h, int64_t out_w,
                                                        clpar_module **out);
/* nn.Flatten(start_dim, end_dim) (PyTorch's defaults: 1, -1): a view of the input with those
 * dimensions merged into one. */
CLPAR_API clpar_status clpar_flatten_create(int start_dim, int end_dim, clpar_module **out);

#ifdef __cplusplus
}
#endif
#endif
