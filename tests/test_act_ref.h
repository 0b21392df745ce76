/* test_act_ref.h — float64 references for the fused Linear + activation tests: the activation,
 * its gradient from the output, and central finite differences of sum(R * act(x W^T + b)). */
#ifndef CLPAR_TEST_ACT_REF_H
#define CLPAR_TEST_ACT_REF_H

#include "internal.h" /* clpar_act_kind */

/* act(z). */
double tu_act(clpar_act_kind act, double z);

/* d act / d z, from y = act(z). */
double tu_act_grad(clpar_act_kind act, double y);

/* The shapes of x [rows, in], W [out, in], b [out] and R [rows, out]. */
typedef struct {
  int rows, in, out;
} tu_linear_dims;

/* Central differences (h = 1e-6) of sum(R * act(x W^T + b)) in float64 (b may be NULL) with
 * respect to v[0 .. n), v one of x, w, b; into out. */
void tu_act_fd(clpar_act_kind act, tu_linear_dims d, double *x, double *w, double *b,
               const float *r, double *v, int n, float *out);

#endif
