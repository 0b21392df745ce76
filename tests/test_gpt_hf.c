/* test_gpt_hf.c — clpar_gpt_load_hf: a tiny GPT-2 in Hugging Face's layout (Conv1D weights
 * [in, out], the causal-mask buffers, no lm_head.weight), written by
 * tests/reference/make_gpt2_hf.py under the hub's GPT2Model names and under GPT2LMHeadModel's,
 * loads into clpar_gpt_create's model and gives PyTorch's logits, on the host and on every
 * selected device; a file of another configuration is refused, naming what differs, and leaves
 * the model as it was. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/gpt2_hf_ref.h"
#include "test_util.h"

static const clpar_gpt_config tiny = {16, 65, 2, 2, 32, 0.0f, 1};

static void check_file(const char *file, clpar_device *dev) {
  char path[512], what[600];
  snprintf(path, sizeof path, "%s/%s", CLPAR_TEST_REFERENCE_DIR, file);
  clpar_module *m;
  clpar_tensor *ids, *logits;
  tu_ok(clpar_gpt_create(&tiny, dev, &m));
  tu_ok(clpar_gpt_load_hf(m, path));
  tu_ok(clpar_tensor_from_host_dtype(dev, CLPAR_INT32, 2, (int64_t[]){2, 8}, gpt2_hf_ids, &ids));
  tu_ok(clpar_module_forward(m, ids, &logits));
  float *got = tu_read(logits);
  snprintf(what, sizeof what, "%s on %s: logits", file, clpar_device_id(dev));
  tu_assert_close(got, gpt2_hf_logits, 2 * 8 * 65, 1e-4f, 1e-5f, what);
  free(got);
  clpar_tensor_free(ids);
  clpar_tensor_free(logits);
  clpar_module_free(m);
}

static void test_loads_both_layouts(void **state) {
  (void)state;
  for (int d = -1; d < clpar_device_count(); d++) {
    clpar_device *dev = d < 0 ? tu_host() : clpar_device_get(d);
    check_file("gpt2_hf_tiny.safetensors", dev);
    check_file("gpt2_hf_tiny_lm.safetensors", dev);
  }
}

static void test_refuses_another_configuration(void **state) {
  (void)state;
  char path[512];
  snprintf(path, sizeof path, "%s/gpt2_hf_tiny.safetensors", CLPAR_TEST_REFERENCE_DIR);
  clpar_gpt_config wider = tiny;
  wider.n_embd = 64;
  clpar_module *m;
  tu_ok(clpar_gpt_create(&wider, tu_host(), &m));
  clpar_tensor *wte = clpar_module_parameter(
      clpar_module_child(clpar_module_child(m, "transformer"), "wte"), "weight");
  float *before = tu_read(wte);
  assert_int_equal(clpar_gpt_load_hf(m, path), CLPAR_ERROR_SHAPE_MISMATCH);
  assert_non_null(strstr(clpar_last_error(), "clpar_gpt_load_hf"));
  assert_non_null(strstr(clpar_last_error(), "h.0.attn.c_attn.weight"));
  float *after = tu_read(wte);
  assert_memory_equal(before, after, sizeof(float) * 65 * 64); /* nothing changed */
  free(before);
  free(after);
  clpar_module_free(m);
  /* a module that is no GPT, a missing file */
  clpar_module *lin;
  tu_ok(clpar_linear_create(2, 2, 1, tu_host(), &lin));
  assert_int_equal(clpar_gpt_load_hf(lin, path), CLPAR_ERROR_INVALID_ARGUMENT);
  assert_int_equal(clpar_gpt_load_hf(NULL, path), CLPAR_ERROR_INVALID_ARGUMENT);
  clpar_module_free(lin);
  tu_ok(clpar_gpt_create(&tiny, tu_host(), &m));
  assert_int_not_equal(clpar_gpt_load_hf(m, "/nonexistent/gpt2.safetensors"), CLPAR_OK);
  clpar_module_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_loads_both_layouts),
      cmocka_unit_test(test_refuses_another_configuration),
  };
  return cmocka_run_group_tests_name("gpt_hf", tests, tu_setup, tu_teardown);
}
