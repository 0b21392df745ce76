/* host_half.c — the host backend's half_convert entry (backend.h): the core's scalar
 * conversions (clpar/half.h) over the elements, so that the host is the reference the other
 * backends match. */
#include <stdint.h>

#include "clpar/half.h"
#include "host/host_tensor_ops.h"

#define HOST_PAR 65536 /* elements above which a loop runs on OpenMP's team */

clpar_status clpar_host_half_convert(void *dev, int to_half, int bf16, size_t n, clpar_bref x,
                                     clpar_bref out) {
  (void)dev;
  if (to_half) {
    const float *px = (const float *)x.buf + x.off;
    uint16_t *po = (uint16_t *)((uint32_t *)out.buf + out.off);
#pragma omp parallel for if (n > HOST_PAR) schedule(static)
    for (size_t i = 0; i < n; i++)
      po[i] = bf16 ? clpar_float_to_bf16(px[i]) : clpar_float_to_fp16(px[i]);
    return CLPAR_OK;
  }
  const uint16_t *px = (const uint16_t *)((const uint32_t *)x.buf + x.off);
  float *po = (float *)out.buf + out.off;
#pragma omp parallel for if (n > HOST_PAR) schedule(static)
  for (size_t i = 0; i < n; i++)
    po[i] = bf16 ? clpar_bf16_to_float(px[i]) : clpar_fp16_to_float(px[i]);
  return CLPAR_OK;
}
