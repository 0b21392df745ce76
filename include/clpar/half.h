/* half.h — 16-bit floats: bfloat16 (CLPAR_BFLOAT16: float32's 8 exponent bits, 7 mantissa
 * bits) and IEEE float16 (CLPAR_FLOAT16: 5 and 10), as storage. The math ops take float32
 * only: a half tensor is converted with clpar_to_dtype, which is differentiable.
 *
 * Conversions, everywhere (these scalar functions, the host backend, the OpenCL and CUDA
 * kernels): float32 to half rounds to nearest, ties to even; a value past the largest finite
 * half becomes +-Inf; halves' subnormals are produced and read exactly; a NaN stays a quiet
 * NaN of its sign (payload kept where it fits). Half to float32 is exact. */
#ifndef CLPAR_HALF_H
#define CLPAR_HALF_H

#include <stdint.h>

#include "export.h"
#include "status.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The scalar conversions (bit patterns of the 16-bit types as uint16_t). */
CLPAR_API uint16_t clpar_float_to_bf16(float f);
CLPAR_API float clpar_bf16_to_float(uint16_t h);
CLPAR_API uint16_t clpar_float_to_fp16(float f);
CLPAR_API float clpar_fp16_to_float(uint16_t h);

/* A new tensor of dtype (float32, bfloat16 or float16) on dev from count floats, converted
 * as above. */
CLPAR_API clpar_status clpar_tensor_from_floats(clpar_device *dev, clpar_dtype dtype, int ndim,
                                                const int64_t *shape, const float *data,
                                                clpar_tensor **out);
/* clpar_tensor_read / clpar_tensor_write for float32, bfloat16 and float16 tensors: numel
 * floats out of or into the tensor, converted as above (an int tensor is CLPAR_ERROR_DTYPE).
 * The raw 16-bit patterns: clpar_tensor_read_raw / write_raw. */
CLPAR_API clpar_status clpar_tensor_read_floats(const clpar_tensor *t, float *dst,
                                                size_t dst_count);
CLPAR_API clpar_status clpar_tensor_write_floats(clpar_tensor *t, const float *src,
                                                 size_t src_count);

/* y = x converted to dtype (float32, bfloat16, float16) on x's device, as torch's
 * x.to(dtype): differentiable, the gradient converted back to x's dtype. x already of dtype
 * gives a view of x (no copy). Int tensors in or out are CLPAR_ERROR_DTYPE. */
CLPAR_API clpar_status clpar_to_dtype(const clpar_tensor *x, clpar_dtype dtype, clpar_tensor **y);

#ifdef __cplusplus
}
#endif
#endif
