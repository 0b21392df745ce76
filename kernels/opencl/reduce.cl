/* reduce.cl — sum over rows (dim 0) of a row-major matrix: bias gradients, batch sums.
 * One work-item per column and per chunk of rows; neighbouring work-items read neighbouring
 * addresses. The host picks short chunks for long matrices (a work-group's tile of rows then
 * stays in cache) and adds the partial sums with a second launch of the same kernel.
 * Accuracy: blocks of 16 rows are summed in four independent float accumulators (which also
 * breaks the dependency chain), and the block sums are added with Kahan compensation. The
 * build does not use -cl-fast-relaxed-math, which would be allowed to drop it. */

/* out[g * cols + c] = sum of a[r, c] for r in chunk g = [g * chunk, min(rows, (g+1) * chunk)) */
__kernel void sum_rows_f32(__global const float *a, ulong a_off, ulong rows, ulong cols,
                           ulong chunk, __global float *out, ulong out_off) {
  ulong c = get_global_id(0), g = get_global_id(1);
  ulong r0 = g * chunk;
  ulong r1 = min(rows, r0 + chunk);
  /* Work-items past the last column compute column cols-1 and do not store: an early return
   * would keep the compiler from running the work-items of a group in lockstep. */
  __global const float *p = a + a_off + min(c, cols - 1);
  float sum = 0.0f, comp = 0.0f;
  for (ulong r = r0; r < r1; r += 16) {
    ulong end = min(r1, r + 16), q = r;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    for (; q + 4 <= end; q += 4) {
      s0 += p[q * cols];
      s1 += p[(q + 1) * cols];
      s2 += p[(q + 2) * cols];
      s3 += p[(q + 3) * cols];
    }
    for (; q < end; q++) s0 += p[q * cols];
    float y = ((s0 + s1) + (s2 + s3)) - comp;
    float t = sum + y;
    /* Past an infinity the compensation would turn into NaN; a plain sum keeps inf. */
    comp = isfinite(t) ? (t - sum) - y : 0.0f;
    sum = t;
  }
  if (c < cols) out[out_off + g * cols + c] = sum;
}
