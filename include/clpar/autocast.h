/* autocast.h — mixed precision by region (torch.autocast): inside
 * clpar_autocast_begin(dtype) .. clpar_autocast_end() on the calling thread, clpar_linear (and
 * so Linear modules and Sequential's fused Linear+activation) rounds its input and weight to
 * dtype (bfloat16 or float16), computes in float32 from those 16-bit values (the devices have
 * no 16-bit arithmetic to rely on) and returns its output in dtype, as PyTorch's autocast
 * does. Its node keeps the 16-bit input, weight and output, so the activations kept for
 * backward take half the bytes. A following Linear takes the 16-bit output as it is.
 * clpar_matmul is cast the same way (its result in dtype, its gradients in its inputs'
 * dtypes), and so is clpar_conv2d (Conv2d modules), though its node keeps float32 copies (no
 * memory saved). The losses (clpar_cross_entropy, clpar_mse_loss) convert a 16-bit input to
 * float32 and run in float32. ReLU and the other activations, clpar_batch_norm and the
 * poolings take a 16-bit input, run in float32 and return its dtype; clpar_add/sub/mul/div
 * run in float32 and return the inputs' dtype when they share one (bfloat16 + bfloat16 is
 * bfloat16; with a float32 input, float32), so a residual block works. A 16-bit activation
 * may feed several ops (its gradients are summed in float32). Other ops refuse a 16-bit
 * tensor with CLPAR_ERROR_DTYPE naming it (convert with clpar_to_dtype). Parameters and their
 * gradients stay float32 (a weight's gradient passes through dtype on its way back, as in
 * PyTorch). DataParallel and the pipeline post their replicas' and stages' forwards from the
 * calling thread, so a region opened around their forward (or clpar_pipeline_train_step)
 * covers every device. begin with a dtype other than bfloat16/float16 is
 * CLPAR_ERROR_INVALID_ARGUMENT; regions nest up to 16 deep, end closing the innermost. */
#ifndef CLPAR_AUTOCAST_H
#define CLPAR_AUTOCAST_H

#include "export.h"
#include "status.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

CLPAR_API clpar_status clpar_autocast_begin(clpar_dtype dtype);
CLPAR_API void clpar_autocast_end(void);
/* The dtype of the innermost open region on this thread, or CLPAR_FLOAT32 when none is. */
CLPAR_API clpar_dtype clpar_autocast_dtype(void);

#ifdef __cplusplus
}
#endif
#endif
