/* optim.cu — the optimizer updates of the CUDA backend, in place, with PyTorch's rules
 * (torch.optim.SGD, Adam, AdamW) as backend.h spells them out in clpar_sgd_args and
 * clpar_adam_args, in the order of operations of the host reference.
 *
 * One fused pass per parameter tensor: each element is read, updated and written by one
 * thread, so param, grad and the state buffers need no synchronization. Hyper-parameters
 * travel by value in the launch (they change between steps: schedules, bias corrections),
 * and the ones that are the same for every element are computed once on the host, rounded
 * as the host reference rounds them. */
#include <math.h>

#include "cuda/cuda_kernels.h"

namespace {

constexpr unsigned block_size = 256;
constexpr size_t max_blocks = 65535; /* grid-stride loop: any cap is correct */

/* g = grad + weight_decay * p; with momentum:
 *   buf = first ? g : momentum * buf + (1 - dampening) * g;  g = nesterov ? g + momentum * buf :
 * buf p -= lr * g. Without momentum buf is never touched (the core may pass any pointer).
 * Rounded as the host backend and the OpenCL kernel round (host_optim.c): fmaf for each added
 * multiple, momentum * buf + (1 - dampening) * g as fmaf(momentum, buf, (1 - dampening) * g). */
template <bool Momentum>
__global__ void sgd_kernel(size_t n, float *param, const float *grad, float *buf,
                           clpar_sgd_args o) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float p = param[i];
    float g = fmaf(o.weight_decay, p, grad[i]);
    if (Momentum) {
      float b = o.first ? g : fmaf(o.momentum, buf[i], (1.0f - o.dampening) * g);
      buf[i] = b;
      g = o.nesterov ? fmaf(o.momentum, b, g) : b;
    }
    param[i] = fmaf(-o.lr, g, p);
  }
}

/* What is the same for every element of an Adam step. */
struct adam_consts {
  float beta1, beta2, eps, weight_decay;
  float decay; /* AdamW: p *= 1 - lr * weight_decay */
  float one_minus_beta1, one_minus_beta2;
  float step;  /* lr / (1 - beta1^t) */
  float root2; /* sqrt(1 - beta2^t) */
  int decoupled;
};

/* In the order of clpar_adam_args (backend.h): fmaf where PyTorch rounds once, __fmul_rn
 * and __fdiv_rn where it rounds a product or quotient on its own (nvcc would otherwise fuse
 * a * b + c). */
__global__ void adam_kernel(size_t n, float *param, const float *grad, float *m, float *v,
                            adam_consts k) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float p = param[i], g = grad[i];
    if (k.decoupled)
      p *= k.decay;
    else
      g = __fmaf_rn(k.weight_decay, p, g);
    float mi = __fmaf_rn(k.one_minus_beta1, g, __fmul_rn(k.beta1, m[i]));
    float vi = __fmaf_rn(__fmul_rn(k.one_minus_beta2, g), g, __fmul_rn(k.beta2, v[i]));
    m[i] = mi;
    v[i] = vi;
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.root2), k.eps);
    param[i] = __fsub_rn(p, __fdiv_rn(__fmul_rn(k.step, mi), denom));
  }
}

unsigned grid_for(size_t n) {
  size_t blocks = (n + block_size - 1) / block_size;
  return (unsigned)(blocks > max_blocks ? max_blocks : blocks);
}

}  // namespace

extern "C" cudaError_t clpar_cuda_sgd_step(cudaStream_t stream, size_t n, float *param,
                                           const float *grad, float *buf,
                                           const clpar_sgd_args *args) {
  if (n == 0) return cudaSuccess;
  unsigned blocks = grid_for(n);
  (void)cudaGetLastError(); /* report this launch's error, not an older one */
  if (args->momentum != 0.0f)
    sgd_kernel<true><<<blocks, block_size, 0, stream>>>(n, param, grad, buf, *args);
  else
    sgd_kernel<false><<<blocks, block_size, 0, stream>>>(n, param, grad, buf, *args);
  return cudaGetLastError();
}

extern "C" cudaError_t clpar_cuda_adam_step(cudaStream_t stream, size_t n, float *param,
                                            const float *grad, float *m, float *v,
                                            const clpar_adam_args *args) {
  if (n == 0) return cudaSuccess;
  adam_consts k;
  k.beta1 = args->beta1;
  k.beta2 = args->beta2;
  k.eps = args->eps;
  k.weight_decay = args->weight_decay;
  k.decay = args->keep;
  k.one_minus_beta1 = args->one_minus_beta1;
  k.one_minus_beta2 = args->one_minus_beta2;
  k.step = args->step;
  k.root2 = args->root2;
  k.decoupled = args->decoupled != 0;
  (void)cudaGetLastError(); /* report this launch's error, not an older one */
  adam_kernel<<<grid_for(n), block_size, 0, stream>>>(n, param, grad, m, v, k);
  return cudaGetLastError();
}
