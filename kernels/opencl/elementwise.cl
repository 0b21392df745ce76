/* elementwise.cl — element-wise arithmetic: a (op) b with b either a's shape or one row
 * broadcast over every row (a bias), and scaling by a constant.
 * The pointers are not restrict: out may be a or b (in-place updates). */

#define CLPAR_BINARY(name, expr)                                                         \
  __kernel void name(__global const float *a, ulong a_off, __global const float *b,      \
                     ulong b_off, __global float *out, ulong out_off, ulong n) {         \
    ulong i = get_global_id(0);                                                          \
    if (i < n) {                                                                         \
      float x = a[a_off + i], y = b[b_off + i];                                          \
      out[out_off + i] = expr;                                                           \
    }                                                                                    \
  }                                                                                      \
  /* b is one row of cols values, repeated for every row of a. */                        \
  __kernel void name##_row(__global const float *a, ulong a_off, __global const float *b, \
                           ulong b_off, __global float *out, ulong out_off, ulong rows,  \
                           ulong cols) {                                                 \
    ulong c = get_global_id(0), r = get_global_id(1);                                    \
    if (c < cols && r < rows) {                                                          \
      ulong i = r * cols + c;                                                            \
      float x = a[a_off + i], y = b[b_off + c];                                          \
      out[out_off + i] = expr;                                                           \
    }                                                                                    \
  }

CLPAR_BINARY(binary_add, x + y)
CLPAR_BINARY(binary_sub, x - y)
CLPAR_BINARY(binary_mul, x * y)
CLPAR_BINARY(binary_div, x / y)

__kernel void scale_f32(__global const float *a, ulong a_off, __global float *out,
                        ulong out_off, ulong n, float alpha) {
  ulong i = get_global_id(0);
  if (i < n) out[out_off + i] = alpha * a[a_off + i];
}

/* out[r, c] = a[c]: one row repeated (the gradient of a broadcast, a bias expanded). */
__kernel void broadcast_rows_f32(__global const float *a, ulong a_off, __global float *out,
                                 ulong out_off, ulong rows, ulong cols) {
  ulong c = get_global_id(0), r = get_global_id(1);
  if (c < cols && r < rows) out[out_off + r * cols + c] = a[a_off + c];
}
