/* test_act_ref.h — float64 references for the fused Linear + activation tests: the activation,
 * its gradient from the output, and central finite differences of sum(R * act(x W^T + b)). */
#ifndef CLPAR_TEST_ACT_REF_H
#define CLPAR_TEST_ACT_REF_H

#include "internal.h" /* clpar_act_kind */

/* "none", "relu", "sigmoid" or "tanh". */
const char *tu_act_name(clpar_act_kind act);

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

/* On the host and every selected device, for each activation, with and without a bias:
 * y = linear_act(x, W, b) (clpar_linear for CLPAR_ACT_NONE where plain_none), loss =
 * sum(y * R), x, W, b and R made from seed .. seed + 3, x, W and b requiring gradients: their
 * gradients against tu_act_fd's within 1e-3 relative, 1e-4 absolute. */
void tu_act_check_gradients(tu_linear_dims d, uint64_t seed, int plain_none);

#endif
