/* ocl_half.c — the OpenCL backend's half_convert entry (backend.h): argument marshalling for
 * kernels/opencl/half.cl. */
#include "ocl_internal.h"

clpar_status clpar_ocl_half_convert(void *dev, int to_half, int bf16, size_t n, clpar_bref x,
                                    clpar_bref out) {
  static const char *const names[2][2] = {{"f16_to_f32", "bf16_to_f32"},
                                          {"f32_to_f16", "f32_to_bf16"}};
  cl_mem xm = AS_MEM(x.buf), om = AS_MEM(out.buf);
  cl_ulong xo = x.off, oo = out.off, cn = n;
  karg args[] = {KARG(xm), KARG(xo), KARG(om), KARG(oo), KARG(cn)};
  return clpar_ocl_launch_1d(dev, "half.cl", names[!!to_half][!!bf16], args, 5, n);
}
