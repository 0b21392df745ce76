/* consumer.c — a user's program: links the installed libclpar, lists the devices and checks a
 * small GEMM on the first one against numbers worked out by hand. Exit 0 on success. Valid C
 * and C++ (cxx/ builds it as C++), and needs nothing but clpar to link (not even libm), so
 * that the README's pkg-config line builds it as it stands. */
#include <clpar/clpar.h>
#include <stdio.h>

int main(void) {
  clpar_status s = clpar_init();
  if (s != CLPAR_OK) {
    fprintf(stderr, "clpar_init: %s: %s\n", clpar_status_name(s), clpar_last_error());
    return 1;
  }
  printf("clpar %s (header %s), %d device(s)\n", clpar_version(), CLPAR_VERSION_STRING,
         clpar_device_count());
  float a[] = {1, 2, 3, 4, 5, 6}, b[] = {7, 8, 9, 10, 11, 12}, c[4];
  const float expect[] = {58, 64, 139, 154}; /* [2x3] @ [3x2] */
  int64_t as[] = {2, 3}, bs[] = {3, 2};
  clpar_device *dev = clpar_device_get(0);
  clpar_tensor *ta = NULL, *tb = NULL, *tc = NULL;
  s = clpar_tensor_from_host(dev, 2, as, a, &ta);
  if (s == CLPAR_OK) s = clpar_tensor_from_host(dev, 2, bs, b, &tb);
  if (s == CLPAR_OK) s = clpar_matmul(ta, tb, 0, 0, &tc);
  if (s == CLPAR_OK) s = clpar_tensor_read(tc, c, 4);
  int ok = s == CLPAR_OK;
  for (int i = 0; ok && i < 4; i++) ok = c[i] - expect[i] < 1e-4f && expect[i] - c[i] < 1e-4f;
  printf("%s: [[%g, %g], [%g, %g]] on %s\n", ok ? "ok" : "WRONG", c[0], c[1], c[2], c[3],
         clpar_device_id(dev));
  if (s != CLPAR_OK) fprintf(stderr, "%s: %s\n", clpar_status_name(s), clpar_last_error());
  clpar_tensor_free(ta);
  clpar_tensor_free(tb);
  clpar_tensor_free(tc);
  clpar_shutdown();
  return ok ? 0 : 1;
}
