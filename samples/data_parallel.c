/* data_parallel.c — PyTorch's "Optional: Data Parallelism" tutorial, line for line, in C
 * (pytorch.org tutorials): a Model of one Linear(5, 2) whose forward prints the size
 * of what each replica sees, a random data set of 100 rows of 5 features, batches of 30, and
 * DataParallel over every selected device. With 2, 3, 4 or 8 devices it prints the chunk
 * sizes of the tutorial's tables ([15, 5] twice per batch of 30 on 2 devices, and so on).
 *
 *   POCL_DEVICES="pthread pthread pthread" ./data_parallel */
#include <clpar/clpar.h>
#include <pthread.h>
#include <stdio.h>

#include "sample_util.h"

/* Parameters and DataLoaders */
enum { INPUT_SIZE = 5, OUTPUT_SIZE = 2, BATCH_SIZE = 30, DATA_SIZE = 100 };

static pthread_mutex_t print_lock = PTHREAD_MUTEX_INITIALIZER; /* replicas print in parallel */

/* class Model(nn.Module): self.fc = nn.Linear(input_size, output_size) */
static clpar_status model_forward(clpar_module *self, clpar_tensor *input, clpar_tensor **output,
                                  void *user) {
  (void)user;
  clpar_status s = clpar_module_forward(clpar_module_child(self, "fc"), input, output);
  if (s != CLPAR_OK) return s;
  char in[64], out[64];
  pthread_mutex_lock(&print_lock);
  printf("\tIn Model: input size %s output size %s\n", clpar_tensor_shape_str(input, in, sizeof in),
         clpar_tensor_shape_str(*output, out, sizeof out));
  fflush(stdout);
  pthread_mutex_unlock(&print_lock);
  return CLPAR_OK;
}

static clpar_status model_create(int64_t input_size, int64_t output_size, clpar_device *dev,
                                 clpar_module **out) {
  clpar_module *fc;
  clpar_status s = clpar_linear_create(input_size, output_size, 1, dev, &fc);
  if (s != CLPAR_OK) return s;
  s = clpar_module_create("Model", model_forward, NULL, NULL, out);
  if (s != CLPAR_OK) {
    clpar_module_free(fc);
    return s;
  }
  return clpar_module_add_child(*out, "fc", fc);
}

int main(void) {
  if (!check(clpar_init(), "clpar_init")) return 1;
  clpar_device *device = clpar_device_get(0); /* device = torch.device("cuda:0") */
  /* rand_loader: RandomDataset(input_size, 100), batch_size 30 */
  clpar_tensor *data;
  int64_t shape[] = {DATA_SIZE, INPUT_SIZE};
  int ok = check(clpar_tensor_rand_normal(device, 2, shape, 0, 0.0f, 1.0f, &data), "dataset");
  clpar_module *model = NULL;
  ok = ok && check(model_create(INPUT_SIZE, OUTPUT_SIZE, device, &model), "Model");
  if (ok && clpar_device_count() > 1) {
    printf("Let's use %d GPUs!\n", clpar_device_count());
    clpar_module *dp = NULL;
    ok = check(clpar_data_parallel_create(model, NULL, &dp), "DataParallel"); /* takes model */
    model = dp;
  }
  clpar_set_grad_enabled(0); /* the tutorial only runs forward */
  for (int64_t start = 0; ok && start < DATA_SIZE; start += BATCH_SIZE) {
    clpar_scope *batch = clpar_scope_begin();
    int64_t rows = DATA_SIZE - start < BATCH_SIZE ? DATA_SIZE - start : BATCH_SIZE;
    clpar_tensor *input, *output;
    ok = check(clpar_tensor_rows(data, start, rows, &input), "batch") &&
         check(clpar_module_forward(model, input, &output), "forward");
    if (ok) {
      char in[64], out[64];
      printf("Outside: input size %s output_size %s\n",
             clpar_tensor_shape_str(input, in, sizeof in),
             clpar_tensor_shape_str(output, out, sizeof out));
    }
    clpar_scope_end(batch);
  }
  clpar_module_free(model);
  clpar_tensor_free(data);
  clpar_shutdown();
  return ok ? 0 : 1;
}
