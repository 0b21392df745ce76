/* activation.cl — element-wise activations and their gradients (relu, sigmoid, tanh), and
 * the forward-only exp, sqrt and negation that the core composes fused ops from.
 * The kind is a kernel argument: it is the same for every work-item, so the branch costs
 * nothing, and one kernel serves all three. Values match backend.h's clpar_unary_kind. */

#define CLPAR_RELU 0
#define CLPAR_SIGMOID 1
#define CLPAR_TANH 2
#define CLPAR_EXP 3
#define CLPAR_SQRT 4

/* out[i] = f(a[i]); out may be a. */
__kernel void unary_f32(__global const float *a, ulong a_off, __global float *out,
                        ulong out_off, ulong n, int kind) {
  ulong i = get_global_id(0);
  if (i >= n) return;
  float x = a[a_off + i];
  out[out_off + i] = kind == CLPAR_RELU      ? fmax(x, 0.0f)
                     : kind == CLPAR_SIGMOID ? 1.0f / (1.0f + exp(-x))
                     : kind == CLPAR_TANH    ? tanh(x)
                     : kind == CLPAR_EXP     ? exp(x)
                     : kind == CLPAR_SQRT    ? sqrt(x)
                                             : -x;
}

/* out[i] = g[i] * f'(.), from the input x (relu) or the output y (sigmoid, tanh); out may
 * be g. relu's gradient at exactly 0 is 0, as in PyTorch. */
__kernel void unary_backward_f32(__global const float *g, ulong g_off, __global const float *saved,
                                 ulong s_off, __global float *out, ulong out_off, ulong n,
                                 int kind) {
  ulong i = get_global_id(0);
  if (i >= n) return;
  float s = saved[s_off + i];
  float d = kind == CLPAR_RELU      ? (s > 0.0f ? 1.0f : 0.0f)
            : kind == CLPAR_SIGMOID ? s * (1.0f - s)
                                    : 1.0f - s * s;
  out[out_off + i] = g[g_off + i] * d;
}
