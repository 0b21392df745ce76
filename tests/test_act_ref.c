/* test_act_ref.c — see test_act_ref.h. */
#include "test_act_ref.h"

#include <math.h>

double tu_act(clpar_act_kind act, double z) {
  return act == CLPAR_ACT_RELU      ? (z > 0 ? z : 0)
         : act == CLPAR_ACT_SIGMOID ? 1.0 / (1.0 + exp(-z))
         : act == CLPAR_ACT_TANH    ? tanh(z)
                                    : z;
}

double tu_act_grad(clpar_act_kind act, double y) {
  return act == CLPAR_ACT_RELU      ? (y > 0 ? 1.0 : 0.0)
         : act == CLPAR_ACT_SIGMOID ? y * (1.0 - y)
         : act == CLPAR_ACT_TANH    ? 1.0 - y * y
                                    : 1.0;
}

/* sum(R * act(x W^T + b)) in float64. */
static double loss_of(clpar_act_kind act, tu_linear_dims d, const double *x, const double *w,
                      const double *b, const float *r) {
  double sum = 0;
  for (int i = 0; i < d.rows; i++)
    for (int o = 0; o < d.out; o++) {
      double z = b ? b[o] : 0;
      for (int k = 0; k < d.in; k++) z += x[i * d.in + k] * w[o * d.in + k];
      sum += r[i * d.out + o] * tu_act(act, z);
    }
  return sum;
}

void tu_act_fd(clpar_act_kind act, tu_linear_dims d, double *x, double *w, double *b,
               const float *r, double *v, int n, float *out) {
  const double h = 1e-6;
  for (int i = 0; i < n; i++) {
    double keep = v[i];
    v[i] = keep + h;
    double up = loss_of(act, d, x, w, b, r);
    v[i] = keep - h;
    double down = loss_of(act, d, x, w, b, r);
    v[i] = keep;
    out[i] = (float)((up - down) / (2 * h));
  }
}
