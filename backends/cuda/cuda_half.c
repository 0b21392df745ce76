/* cuda_half.c — the CUDA backend's half_convert entry (backend.h): kernels/cuda/half.cu run
 * as a profiled op of the device's stream. */
#include "cuda/cuda_internal.h"

clpar_status cuda_half_convert(void *dev, int to_half, int bf16, size_t n, clpar_bref x,
                               clpar_bref out) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  /* offsets count words: a 16-bit side starts at byte 4 off, its element i 2 bytes on */
  void *px = (uint32_t *)x.buf + x.off, *po = (uint32_t *)out.buf + out.off;
  if (s == CLPAR_OK)
    s = clpar_cuda_check(clpar_cuda_half_convert(d->stream, to_half, bf16, n, px, po),
                         "half_convert kernel launch");
  return clpar_cuda_op_end(d, &prof, s);
}
