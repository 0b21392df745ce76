/* index.cl — one element per row at an int32 index (backend.h's pick): the primitive the
 * core composes nll and its backward from. Indices are checked by the caller to lie in
 * 0 .. cols-1. */

/* out[r] = a[r, idx[r]] */
__kernel void pick_gather_f32(__global const int *idx, ulong i_off, __global const float *a,
                              ulong a_off, __global float *out, ulong out_off, ulong rows,
                              ulong cols) {
  ulong r = get_global_id(0);
  if (r < rows) out[out_off + r] = a[a_off + r * cols + (ulong)idx[i_off + r]];
}

/* out[r, idx[r]] = a[r]; the row's other elements are left as they are */
__kernel void pick_scatter_f32(__global const int *idx, ulong i_off, __global const float *a,
                               ulong a_off, __global float *out, ulong out_off, ulong rows,
                               ulong cols) {
  ulong r = get_global_id(0);
  if (r < rows) out[out_off + r * cols + (ulong)idx[i_off + r]] = a[a_off + r];
}
