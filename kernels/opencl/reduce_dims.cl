/* reduce_dims.cl — sums along dimensions and their broadcast back (clpar_sum_dims and its
 * gradient). a is seen as [outer, red, inner], row-major; the host side picks the kernel:
 * - reduce_sum_items_f32: one work-item per output (o, i), looping over r: neighbouring
 *   work-items read neighbouring addresses when inner is wide. Blocks of 16 terms in four
 *   accumulators, added with Kahan compensation (as sum_rows_f32 in reduce.cl).
 * - reduce_sum_group_f32: one work-group per output, its work-items striding over r, then a
 *   tree in local memory: a narrow inner (the H, W of an NCHW tensor: inner == 1) would
 *   otherwise leave one work-item to sum a whole long run.
 * A reduction with outer == 1 and a wide inner is sum_rows_f32's shape and takes it. */

#define RD_GROUP 64 /* the most work-items reduce_sum_group_f32 is launched with */

__kernel void reduce_sum_items_f32(__global const float *a, ulong a_off, ulong outer, ulong red,
                                   ulong inner, __global float *out, ulong out_off) {
  ulong i = get_global_id(0), o = get_global_id(1);
  /* Work-items past the edge compute the last output and do not store (no early return). */
  ulong ic = min(i, inner - 1), oc = min(o, outer - 1);
  __global const float *p = a + a_off + oc * red * inner + ic;
  float sum = 0.0f, comp = 0.0f;
  for (ulong r = 0; r < red; r += 16) {
    ulong end = min(red, r + 16), q = r;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    for (; q + 4 <= end; q += 4) {
      s0 += p[q * inner];
      s1 += p[(q + 1) * inner];
      s2 += p[(q + 2) * inner];
      s3 += p[(q + 3) * inner];
    }
    for (; q < end; q++) s0 += p[q * inner];
    float y = ((s0 + s1) + (s2 + s3)) - comp;
    float t = sum + y;
    comp = isfinite(t) ? (t - sum) - y : 0.0f; /* past an infinity a plain sum keeps inf */
    sum = t;
  }
  if (i < inner && o < outer) out[out_off + o * inner + i] = sum;
}

/* Group g sums output g = o * inner + i. The local size is a power of two <= RD_GROUP. */
__kernel void reduce_sum_group_f32(__global const float *a, ulong a_off, ulong red, ulong inner,
                                   __global float *out, ulong out_off) {
  __local float part[RD_GROUP];
  ulong g = get_group_id(0), o = g / inner, i = g % inner;
  uint lid = (uint)get_local_id(0), ls = (uint)get_local_size(0);
  __global const float *p = a + a_off + o * red * inner + i;
  float sum = 0.0f, comp = 0.0f;
  for (ulong r = lid; r < red; r += ls) {
    float y = p[r * inner] - comp;
    float t = sum + y;
    comp = isfinite(t) ? (t - sum) - y : 0.0f;
    sum = t;
  }
  part[lid] = sum;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (uint step = ls / 2; step > 0; step /= 2) {
    if (lid < step) part[lid] += part[lid + step];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0) out[out_off + g] = part[0];
}

/* out[(o * red + r) * inner + i] = a[o * inner + i], one work-item per output element. */
__kernel void expand_f32(__global const float *a, ulong a_off, ulong red, ulong inner,
                         __global float *out, ulong out_off, ulong n) {
  ulong j = get_global_id(0);
  if (j < n) {
    ulong i = j % inner, o = j / (red * inner);
    out[out_off + j] = a[a_off + o * inner + i];
  }
}
