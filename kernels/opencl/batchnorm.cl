/* batchnorm.cl — batch norm over x [n, c, p] per channel (backend.h's formulas): the batch
 * statistics (two passes: mean, then the mean squared deviation from it) with the running
 * statistics' update, the normalization, and the backward's two per-channel sums and the
 * input's gradient. The reductions run one work-group per channel: a power of two of
 * work-items tree-added in local memory, or on CPU devices a single work-item that reads the
 * channel's planes in order, 8 lanes at a time (ocl_conv.c). Each work-item (lane) keeps its
 * part of the sum with Kahan compensation, since a channel may hold hundreds of thousands of
 * elements. The apply kernels run a work-item per row of p elements. */

typedef struct {
  float sum, comp;
} kahan;

static void kahan_add(kahan *k, float v) {
  float t = v - k->comp, s = k->sum + t;
  k->comp = (s - k->sum) - t;
  k->sum = s;
}

/* Kahan addition on 8 independent lanes (a CPU device's SIMD register). */
#define KAHAN8(sum, comp, v)                                                                  \
  {                                                                                          \
    float8 t_ = (v) - (comp), s_ = (sum) + t_;                                               \
    (comp) = (s_ - (sum)) - t_;                                                              \
    (sum) = s_;                                                                              \
  }

static float lanes_sum(float8 v) {
  float4 h = v.lo + v.hi;
  return h.x + h.y + h.z + h.w;
}

/* A work-group of one work-item (CPU devices: ocl_conv.c) walks each image's plane of its
 * channel in order, 8 elements at a time (VEC with off the offset of 8 elements, then SCALAR
 * for the plane's tail): contiguous reads and 8 independent compensated sums. */
#define PLANE_LOOP(VEC, SCALAR)                                                               \
  for (ulong b_ = 0; b_ < n; b_++) {                                                         \
    ulong o_ = b_ * c * p, q_ = 0;                                                           \
    for (; q_ + 8 <= p; q_ += 8) {                                                           \
      ulong off = o_ + q_;                                                                   \
      VEC;                                                                                   \
    }                                                                                        \
    for (; q_ < p; q_++) {                                                                   \
      ulong off = o_ + q_;                                                                   \
      SCALAR;                                                                                \
    }                                                                                        \
  }

/* The sum over the work-group of v, in every work-item; scratch holds get_local_size(0). */
static float group_sum(float v, __local float *scratch) {
  uint lid = get_local_id(0), n = get_local_size(0);
  if (n == 1) return v; /* one work-item: nothing to add, no local memory touched */
  scratch[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (uint s = n / 2; s > 0; s /= 2) {
    if (lid < s) scratch[lid] += scratch[lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  float r = scratch[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return r;
}

/* Runs body with off at element e = lid, lid + ls, ... of a channel's n * p elements (image
 * e / p, position e % p): off is the element's offset from the channel's first element of
 * image 0. The image and position advance by adding, with no division in the loop. */
#define CH_LOOP(body)                                                                         \
  {                                                                                          \
    uint b_ = lid / (uint)p, q_ = lid - b_ * (uint)p;                                         \
    for (ulong e = lid; e < M; e += ls) {                                                    \
      ulong off = (ulong)b_ * c * p + q_;                                                    \
      body;                                                                                  \
      for (q_ += ls; q_ >= (uint)p; q_ -= (uint)p) b_++;                                     \
    }                                                                                        \
  }

__kernel void bn_stats_f32(__global const float *x, ulong x_off, __global float *mean,
                           ulong m_off, __global float *var, ulong v_off, __global float *rmean,
                           ulong rm_off, __global float *rvar, ulong rv_off, int running,
                           float momentum, ulong n, ulong c, ulong p, __local float *scratch) {
  ulong ch = get_group_id(0), M = n * p, base = x_off + ch * p;
  uint lid = get_local_id(0), ls = get_local_size(0);
  kahan k = {0.0f, 0.0f}, d = {0.0f, 0.0f};
  float8 s8 = 0.0f, c8 = 0.0f;
  if (ls == 1)
    PLANE_LOOP(KAHAN8(s8, c8, vload8(0, x + base + off)), kahan_add(&k, x[base + off]))
  else
    CH_LOOP(kahan_add(&k, x[base + off]));
  float mu = (group_sum(k.sum, scratch) + lanes_sum(s8)) / (float)M;
  s8 = c8 = 0.0f;
  if (ls == 1) {
    PLANE_LOOP(float8 t = vload8(0, x + base + off) - mu; KAHAN8(s8, c8, t * t);
               , float t = x[base + off] - mu; kahan_add(&d, t * t))
  } else {
    CH_LOOP(float t = x[base + off] - mu; kahan_add(&d, t * t));
  }
  float sq = group_sum(d.sum, scratch) + lanes_sum(s8);
  if (lid == 0) {
    mean[m_off + ch] = mu;
    var[v_off + ch] = sq / (float)M;
    if (running) {
      rmean[rm_off + ch] = (1.0f - momentum) * rmean[rm_off + ch] + momentum * mu;
      rvar[rv_off + ch] = (1.0f - momentum) * rvar[rv_off + ch] + momentum * (sq / (float)(M - 1));
    }
  }
}

/* A work-item per row b * c + ch of p elements (the per-channel factors once per row). */
__kernel void bn_apply_f32(__global const float *x, ulong x_off, __global const float *mean,
                           ulong m_off, __global const float *var, ulong v_off,
                           __global const float *weight, ulong w_off, int has_weight,
                           __global const float *bias, ulong b_off, int has_bias, float eps,
                           __global float *y, ulong y_off, ulong n, ulong c, ulong p) {
  ulong row = get_global_id(0);
  if (row >= n * c) return;
  ulong ch = row % c;
  float mul = rsqrt(var[v_off + ch] + eps) * (has_weight ? weight[w_off + ch] : 1.0f);
  float add = has_bias ? bias[b_off + ch] : 0.0f, mu = mean[m_off + ch];
  __global const float *xr = x + x_off + row * p;
  __global float *yr = y + y_off + row * p;
  for (ulong q = 0; q < p; q++) yr[q] = (xr[q] - mu) * mul + add;
}

__kernel void bn_backward_reduce_f32(__global const float *x, ulong x_off, __global const float *g,
                                     ulong g_off, __global const float *mean, ulong m_off,
                                     __global const float *var, ulong v_off, float eps,
                                     __global float *sum_g, ulong sg_off,
                                     __global float *sum_gxhat, ulong sx_off, ulong n, ulong c,
                                     ulong p, __local float *scratch) {
  ulong ch = get_group_id(0), M = n * p, xb = x_off + ch * p, gb = g_off + ch * p;
  uint lid = get_local_id(0), ls = get_local_size(0);
  float mu = mean[m_off + ch];
  kahan a = {0.0f, 0.0f}, b = {0.0f, 0.0f};
  float8 a8 = 0.0f, ac8 = 0.0f, b8 = 0.0f, bc8 = 0.0f;
  if (ls == 1) {
    PLANE_LOOP(float8 gv = vload8(0, g + gb + off); KAHAN8(a8, ac8, gv);
               KAHAN8(b8, bc8, gv * (vload8(0, x + xb + off) - mu));
               , float gv = g[gb + off]; kahan_add(&a, gv); kahan_add(&b, gv * (x[xb + off] - mu)))
  } else {
    CH_LOOP(float gv = g[gb + off]; kahan_add(&a, gv); kahan_add(&b, gv * (x[xb + off] - mu)));
  }
  float sg = group_sum(a.sum, scratch) + lanes_sum(a8);
  float sgx = group_sum(b.sum, scratch) + lanes_sum(b8);
  if (lid == 0) {
    sum_g[sg_off + ch] = sg;
    sum_gxhat[sx_off + ch] = sgx * rsqrt(var[v_off + ch] + eps);
  }
}

__kernel void bn_backward_apply_f32(__global const float *x, ulong x_off, __global const float *g,
                                    ulong g_off, __global const float *mean, ulong m_off,
                                    __global const float *var, ulong v_off,
                                    __global const float *weight, ulong w_off, int has_weight,
                                    float eps, __global const float *sum_g, ulong sg_off,
                                    __global const float *sum_gxhat, ulong sx_off, int training,
                                    __global float *dx, ulong d_off, ulong n, ulong c, ulong p) {
  ulong row = get_global_id(0);
  if (row >= n * c) return;
  ulong ch = row % c;
  float istd = rsqrt(var[v_off + ch] + eps), M = (float)(n * p), mu = mean[m_off + ch];
  float mul = istd * (has_weight ? weight[w_off + ch] : 1.0f);
  float mg = training ? sum_g[sg_off + ch] / M : 0.0f;
  float mgx = training ? sum_gxhat[sx_off + ch] / M : 0.0f;
  __global const float *xr = x + x_off + row * p, *gr = g + g_off + row * p;
  __global float *dr = dx + d_off + row * p;
  for (ulong q = 0; q < p; q++) dr[q] = mul * (gr[q] - mg - (xr[q] - mu) * istd * mgx);
}
