/* half.cl — the half_convert entry (backend.h): float32 to and from bfloat16 and float16,
 * bit for bit as the host's scalar conversions (src/half.c). float16 goes through
 * vload_half / vstore_half_rte, which need no cl_khr_fp16; bfloat16 is ushort bit work, so
 * no floating-point unit (and no flush of subnormals) touches it. Offsets count 32-bit words:
 * 16-bit element i is ushort 2 off + i. One work-item per element. */

__kernel void f32_to_bf16(__global const uint *x, ulong x_off, __global ushort *out,
                          ulong out_off, ulong n) {
  ulong i = get_global_id(0);
  if (i >= n) return;
  uint u = x[x_off + i];
  ushort h;
  if ((u & 0x7fffffffu) > 0x7f800000u)
    h = (ushort)((u >> 16) | 0x0040u); /* a NaN stays a quiet NaN */
  else
    h = (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); /* to nearest, ties to even */
  out[2 * out_off + i] = h;
}

__kernel void bf16_to_f32(__global const ushort *x, ulong x_off, __global uint *out,
                          ulong out_off, ulong n) {
  ulong i = get_global_id(0);
  if (i >= n) return;
  out[out_off + i] = (uint)x[2 * x_off + i] << 16;
}

__kernel void f32_to_f16(__global const float *x, ulong x_off, __global half *out, ulong out_off,
                         ulong n) {
  ulong i = get_global_id(0);
  if (i >= n) return;
  uint u = as_uint(x[x_off + i]);
  if ((u & 0x7fffffffu) > 0x7f800000u) { /* a quiet NaN of its sign, as the host makes it */
    ushort h = (ushort)(((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x1ffu));
    ((__global ushort *)out)[2 * out_off + i] = h;
    return;
  }
  vstore_half_rte(x[x_off + i], 2 * out_off + i, out);
}

__kernel void f16_to_f32(__global const half *x, ulong x_off, __global float *out, ulong out_off,
                         ulong n) {
  ulong i = get_global_id(0);
  if (i >= n) return;
  out[out_off + i] = vload_half(2 * x_off + i, x);
}
