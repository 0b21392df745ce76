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
 * buf p -= lr * g. Without momentum buf is never touched (the core may pass any pointer). */
template <bool Momentum>
__global__ void sgd_kernel(size_t n, float *param, const float *grad, float *buf,
                           clpar_sgd_args o) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float p = param[i];
    float g = grad[i] + o.weight_decay * p;
    if (Momentum) {
      float b = o.first ? g : o.momentum * buf[i] + (1.0f - o.dampening) * g;
      buf[i] = b;
      g = o.nesterov ? g + o.momentum * b : b;
    }
    param[i] = p - o.lr * g;
  }
}

/* What is the same for every element of an Adam step. */
struct adam_consts {
  float beta1, beta2, eps, weight_decay;
  float decay; /* AdamW: p *= 1 - lr * weight_decay */
  float step;  /* lr / bias1 */
  float root2; /* sqrt(bias2) */
  int decoupled;
};

/* Adam: g += weight_decay * p; AdamW: p *= 1 - lr * weight_decay. Then
 *   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
 *   p -= (lr / bias1) m / (sqrt(v) / sqrt(bias2) + eps) */
__global__ void adam_kernel(size_t n, float *param, const float *grad, float *m, float *v,
                            adam_consts k) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float p = param[i], g = grad[i];
    if (k.decoupled)
      p *= k.decay;
    else
      g += k.weight_decay * p;
    float mi = k.beta1 * m[i] + (1.0f - k.beta1) * g;
    float vi = k.beta2 * v[i] + (1.0f - k.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = p - k.step * mi / (sqrtf(vi) / k.root2 + k.eps);
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
  k.decay = 1.0f - args->lr * args->weight_decay;
  k.step = args->lr / args->bias1;
  k.root2 = sqrtf(args->bias2);
  k.decoupled = args->decoupled != 0;
  (void)cudaGetLastError(); /* report this launch's error, not an older one */
  adam_kernel<<<grid_for(n), block_size, 0, stream>>>(n, param, grad, m, v, k);
  return cudaGetLastError();
}
