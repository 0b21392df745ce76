/* batchnorm.cl — batch norm over x [n, c, p] per channel (backend.h's formulas): the batch
 * statistics (two passes: mean, then the mean squared deviation from it) with the running
 * statistics' update, the normalization, and the backward's two per-channel sums and the
 * input's gradient. The reductions run one work-group per channel (a power of two of
 * work-items, tree-added in local memory); each work-item keeps its part of the sum with
 * Kahan compensation, since a channel may hold hundreds of thousands of elements. */

typedef struct {
  float sum, comp;
} kahan;

static void kahan_add(kahan *k, float v) {
  float t = v - k->comp, s = k->sum + t;
  k->comp = (s - k->sum) - t;
  k->sum = s;
}

/* The sum over the work-group of v, in every work-item; scratch holds get_local_size(0). */
static float group_sum(float v, __local float *scratch) {
  uint lid = get_local_id(0), n = get_local_size(0);
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

#define CH_ELEM(base, e) ((base) + ((e) / p) * (ulong)c * p + ((e) % p))

__kernel void bn_stats_f32(__global const float *x, ulong x_off, __global float *mean,
                           ulong m_off, __global float *var, ulong v_off, __global float *rmean,
                           ulong rm_off, __global float *rvar, ulong rv_off, int running,
                           float momentum, ulong n, ulong c, ulong p, __local float *scratch) {
  ulong ch = get_group_id(0), M = n * p, base = x_off + ch * p;
  uint lid = get_local_id(0), ls = get_local_size(0);
  kahan k = {0.0f, 0.0f};
  for (ulong e = lid; e < M; e += ls) kahan_add(&k, x[CH_ELEM(base, e)]);
  float mu = group_sum(k.sum, scratch) / (float)M;
  kahan d = {0.0f, 0.0f};
  for (ulong e = lid; e < M; e += ls) {
    float t = x[CH_ELEM(base, e)] - mu;
    kahan_add(&d, t * t);
  }
  float sq = group_sum(d.sum, scratch);
  if (lid == 0) {
    mean[m_off + ch] = mu;
    var[v_off + ch] = sq / (float)M;
    if (running) {
      rmean[rm_off + ch] = (1.0f - momentum) * rmean[rm_off + ch] + momentum * mu;
      rvar[rv_off + ch] = (1.0f - momentum) * rvar[rv_off + ch] + momentum * (sq / (float)(M - 1));
    }
  }
}

/* Work-item (q, b * c + ch). */
__kernel void bn_apply_f32(__global const float *x, ulong x_off, __global const float *mean,
                           ulong m_off, __global const float *var, ulong v_off,
                           __global const float *weight, ulong w_off, int has_weight,
                           __global const float *bias, ulong b_off, int has_bias, float eps,
                           __global float *y, ulong y_off, ulong c, ulong p) {
  ulong q = get_global_id(0), row = get_global_id(1);
  if (q >= p) return;
  ulong ch = row % c;
  float mul = rsqrt(var[v_off + ch] + eps) * (has_weight ? weight[w_off + ch] : 1.0f);
  float add = has_bias ? bias[b_off + ch] : 0.0f;
  y[y_off + row * p + q] = (x[x_off + row * p + q] - mean[m_off + ch]) * mul + add;
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
  for (ulong e = lid; e < M; e += ls) {
    float gv = g[CH_ELEM(gb, e)];
    kahan_add(&a, gv);
    kahan_add(&b, gv * (x[CH_ELEM(xb, e)] - mu));
  }
  float sg = group_sum(a.sum, scratch), sgx = group_sum(b.sum, scratch);
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
  ulong q = get_global_id(0), row = get_global_id(1);
  if (q >= p) return;
  ulong ch = row % c, k = row * p + q;
  float istd = rsqrt(var[v_off + ch] + eps), M = (float)(n * p);
  float mul = istd * (has_weight ? weight[w_off + ch] : 1.0f);
  float mg = training ? sum_g[sg_off + ch] / M : 0.0f;
  float mgx = training ? sum_gxhat[sx_off + ch] / M : 0.0f;
  float xhat = (x[x_off + k] - mean[m_off + ch]) * istd;
  dx[d_off + k] = mul * (g[g_off + k] - mg - xhat * mgx);
}
