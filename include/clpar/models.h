/* models.h — torchvision's ResNets (ResNet-18/34/50/101/152) with
 * torchvision's module tree, parameter and buffer names ("layer1.0.conv1.weight",
 * "bn1.running_mean", "layer4.2.bn3.num_batches_tracked", "fc.bias") and initialization, so
 * that a state_dict moves between clpar and PyTorch by name, and a program can take the
 * children apart by name (clpar_module_child(m, "layer3"))  as PyTorch's model-parallel
 * tutorial does. */
#ifndef CLPAR_MODELS_H
#define CLPAR_MODELS_H

#include <stdint.h>

#include "conv.h" /* BatchNorm2d and the other layers the ResNets are made of */
#include "device.h"
#include "export.h"
#include "nn.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* torchvision's residual blocks. */
typedef enum clpar_resnet_block {
  CLPAR_RESNET_BASIC = 0,     /* BasicBlock: 3x3, 3x3; expansion 1 */
  CLPAR_RESNET_BOTTLENECK = 1 /* Bottleneck: 1x1, 3x3 (with the stride: "v1.5"), 1x1; expansion 4 */
} clpar_resnet_block;

/* One block taking inplanes channels to planes * expansion, with torchvision's children:
 * BasicBlock conv1 bn1 relu conv2 bn2 [downsample]; Bottleneck conv1 bn1 conv2 bn2 conv3 bn3
 * relu [downsample]. downsample (Sequential: "0" a 1x1 convolution with the stride, "1" a
 * BatchNorm2d) is made when stride != 1 or inplanes != planes * expansion, as ResNet's
 * _make_layer does. Forward: relu(block(x) + identity). Initialized as clpar_resnet_create. */
CLPAR_API clpar_status clpar_resnet_block_create(clpar_resnet_block block, int64_t inplanes,
                                                 int64_t planes, int64_t stride, clpar_device *dev,
                                                 clpar_module **out);

/* torchvision.models.resnet.ResNet(block, layers, num_classes) on dev: children conv1 (7x7,
 * stride 2, padding 3, no bias), bn1, relu, maxpool (3x3, stride 2, padding 1), layer1 ..
 * layer4 (Sequential of blocks "0", "1", ...; 64, 128, 256, 512 planes, strides 1, 2, 2, 2),
 * avgpool (adaptive, 1x1), fc (Linear(512 * expansion, num_classes)); forward flattens between
 * avgpool and fc. Input [N, 3, H, W], output [N, num_classes]. Initialization as torchvision's:
 * convolutions Kaiming normal with fan_out (std sqrt(2 / (out_channels * kh * kw))),
 * BatchNorm weight 1 and bias 0, fc as nn.Linear; from clpar_manual_seed's generator, so not
 * PyTorch's values. Made in training mode. */
CLPAR_API clpar_status clpar_resnet_create(clpar_resnet_block block, const int layers[4],
                                           int64_t num_classes, clpar_device *dev,
                                           clpar_module **out);
/* resnet18: BasicBlock, [2, 2, 2, 2]; resnet34: BasicBlock, [3, 4, 6, 3]; resnet50:
 * Bottleneck, [3, 4, 6, 3]; resnet101: [3, 4, 23, 3]; resnet152: [3, 8, 36, 3]. */
CLPAR_API clpar_status clpar_resnet18(int64_t num_classes, clpar_device *dev, clpar_module **out);
CLPAR_API clpar_status clpar_resnet34(int64_t num_classes, clpar_device *dev, clpar_module **out);
CLPAR_API clpar_status clpar_resnet50(int64_t num_classes, clpar_device *dev, clpar_module **out);
CLPAR_API clpar_status clpar_resnet101(int64_t num_classes, clpar_device *dev, clpar_module **out);
CLPAR_API clpar_status clpar_resnet152(int64_t num_classes, clpar_device *dev, clpar_module **out);

/* The cut of a ResNet in "Single-Machine Model Parallel Best Practices" (with
 * split 2: ModelParallelResNet50's seq1 and seq2 + fc): *head = Sequential(conv1, bn1, relu,
 * maxpool, layer1 .. layer<split>), *tail = Sequential(layer<split+1> .. layer4, avgpool,
 * Flatten(1, -1), fc), so that tail(head(x)) is resnet(x) and the two are ready to be stages of
 * clpar_pipeline_create. split: 1 to 3. resnet must have clpar_resnet_create's children. The
 * Sequentials hold resnet's own child modules (a module may be a child at several places,
 * nn.h), not copies: parameters, buffers and training mode are shared with resnet, which may
 * be kept or freed (its children then live on in head and tail). Nothing is moved: put head
 * and tail on their devices with clpar_module_to or clpar_pipeline_create. Parameter names are
 * Sequential's: "0.weight" (conv1), "4.0.conv1.weight" (layer1.0.conv1) in head. On error
 * nothing is made and resnet is unchanged. */
CLPAR_API clpar_status clpar_resnet_split(clpar_module *resnet, int split, clpar_module **head,
                                          clpar_module **tail);

#ifdef __cplusplus
}
#endif
#endif
