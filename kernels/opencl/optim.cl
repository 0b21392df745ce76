/* optim.cl — optimizer updates, in place, one work-item per parameter, with PyTorch's rules
 * (torch.optim.SGD, Adam, AdamW) as backend.h spells them out. Hyper-parameters arrive as
 * kernel arguments: they change between steps (learning-rate schedules, bias corrections),
 * so baking them into the source would mean a rebuild per step. */

/* SGD rounds where the host backend's does (host_optim.c): fma for each added multiple,
 * momentum * buf + (1 - dampening) * g as fma(momentum, buf, (1 - dampening) * g), and no
 * other contraction, so that either backend gives an element the same bits.
 * p -= lr * (grad + weight_decay * p) */
__kernel void sgd_f32(__global float *p, ulong p_off, __global const float *grad, ulong g_off,
                      ulong n, float lr, float weight_decay) {
#pragma OPENCL FP_CONTRACT OFF
  ulong i = get_global_id(0);
  if (i >= n) return;
  float w = p[p_off + i];
  p[p_off + i] = fma(-lr, fma(weight_decay, w, grad[g_off + i]), w);
}

/* With a momentum buffer: buf = first ? g : momentum * buf + (1 - dampening) * g, then
 * g = nesterov ? g + momentum * buf : buf. */
__kernel void sgd_momentum_f32(__global float *p, ulong p_off, __global const float *grad,
                               ulong g_off, __global float *buf, ulong b_off, ulong n, float lr,
                               float momentum, float dampening, float weight_decay, int nesterov,
                               int first) {
#pragma OPENCL FP_CONTRACT OFF
  ulong i = get_global_id(0);
  if (i >= n) return;
  float w = p[p_off + i];
  float g = fma(weight_decay, w, grad[g_off + i]);
  float b = first ? g : fma(momentum, buf[b_off + i], (1.0f - dampening) * g);
  buf[b_off + i] = b;
  g = nesterov ? fma(momentum, b, g) : b;
  p[p_off + i] = fma(-lr, g, w);
}

/* Adam (decoupled == 0) or AdamW in the order of PyTorch's CPU kernels (clpar_adam_args in
 * backend.h): fma where PyTorch rounds once, and no other contraction (a compiler may fuse
 * a * b + c otherwise, which PoCL did, so the device and the host backend differed). The
 * scalars one_minus_beta1/2 = 1 - beta, keep = 1 - lr * weight_decay, step = lr / (1 - beta1^t)
 * and root2 = sqrt(1 - beta2^t) come from the host. */
__kernel void adam_f32(__global float *p, ulong p_off, __global const float *grad, ulong g_off,
                       __global float *m, ulong m_off, __global float *v, ulong v_off, ulong n,
                       float beta1, float beta2, float one_minus_beta1, float one_minus_beta2,
                       float eps, float weight_decay, float keep, float step, float root2,
                       int decoupled) {
#pragma OPENCL FP_CONTRACT OFF
  ulong i = get_global_id(0);
  if (i >= n) return;
  float w = p[p_off + i], g = grad[g_off + i];
  if (decoupled)
    w *= keep;
  else
    g = fma(weight_decay, w, g);
  float mi = fma(one_minus_beta1, g, beta1 * m[m_off + i]);
  float vi = fma(one_minus_beta2 * g, g, beta2 * v[v_off + i]);
  m[m_off + i] = mi;
  v[v_off + i] = vi;
  p[p_off + i] = w - step * mi / (sqrt(vi) / root2 + eps);
}
