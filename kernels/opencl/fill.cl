/* fill.cl — sets a range of a buffer to one value (tensor creation, zeroing gradients).
 * Offsets are kernel arguments rather than sub-buffers, which have alignment rules. */

__kernel void fill_f32(__global float *out, ulong out_off, ulong n, float value) {
  ulong i = get_global_id(0);
  if (i < n) out[out_off + i] = value;
}
