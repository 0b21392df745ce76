/* resnet50.c — the train() loop of PyTorch's "Single-Machine Model Parallel Best Practices":
 * torchvision's ResNet-50 trained on random images against random one-hot labels with MSE and SGD
 * (lr 0.001), batch 120 of 3x128x128, 3 batches, 1000 classes, on one device (the first selected
 * one; pick it with CLPAR_DEVICES). Prints the time of each batch and images per second. Flags make
 * a run small enough for a CPU:
 *
 *   CLPAR_DEVICES=opencl:0 ./resnet50                       (the tutorial's sizes)
 *   CLPAR_DEVICES=host ./resnet50 --model resnet18 --batch 8 --image-size 32 --classes 10
 *   flags: --batch N  --image-size S  --classes C  --batches B  --model resnet18|resnet50
 *
 * As the tutorial does, each batch's images are new normal noise (made on the host before the
 * batch's clock starts) and the one-hot indices are drawn once. A batch's time covers the
 * upload of images and labels, zero_grad, forward, loss, backward and the SGD step, and the
 * loss read back at its end (which waits for the device). The first batch also compiles the
 * device's kernels; the mean leaves it out when there is more than one batch. At the end, the
 * device's peak memory per category (parameters, gradients, optimizer state, activations,
 * communication buffers, total) goes to stderr. */
#include <clpar/clpar.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sample_util.h"

typedef struct {
  int64_t batch, size, classes;
  int batches, resnet18;
} options;

static int parse(int argc, char **argv, options *o) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) {
      fprintf(stderr, "%s needs a value\n", a);
      return 0;
    }
    if (strcmp(a, "--batch") == 0)
      o->batch = atoll(v);
    else if (strcmp(a, "--image-size") == 0)
      o->size = atoll(v);
    else if (strcmp(a, "--classes") == 0)
      o->classes = atoll(v);
    else if (strcmp(a, "--batches") == 0)
      o->batches = atoi(v);
    else if (strcmp(a, "--model") == 0 && (!strcmp(v, "resnet18") || !strcmp(v, "resnet50")))
      o->resnet18 = strcmp(v, "resnet18") == 0;
    else {
      fprintf(stderr,
              "unknown flag %s %s\nusage: resnet50 [--batch N] [--image-size S] [--classes C] "
              "[--batches B] [--model resnet18|resnet50]\n",
              a, v);
      return 0;
    }
    i++;
  }
  /* ResNet's stem and four stride-2 stages need at least 32x32 to keep every map >= 1x1 */
  if (o->batch < 1 || o->batch > 4096 || o->size < 32 || o->size > 4096 || o->classes < 1 ||
      o->classes > 1000000 || o->batches < 1) {
    fprintf(stderr,
            "bad sizes: batch 1..4096, image size 32..4096, classes 1..1000000, "
            "batches >= 1\n");
    return 0;
  }
  return 1;
}

/* One batch: upload, zero_grad, forward, MSE against the one-hot labels, backward, step; the
 * loss is read back into *loss. */
static int train_batch(clpar_module *model, clpar_optimizer *opt, clpar_device *dev,
                       const options *o, const float *images, const float *labels, float *loss) {
  clpar_scope *scope = clpar_scope_begin();
  clpar_tensor *x, *y, *out, *l;
  int64_t xs[4] = {o->batch, 3, o->size, o->size}, ys[2] = {o->batch, o->classes};
  int ok = check(clpar_tensor_from_host(dev, 4, xs, images, &x), "upload images") &&
           check(clpar_tensor_from_host(dev, 2, ys, labels, &y), "upload labels") &&
           check(clpar_optimizer_zero_grad(opt), "zero_grad") &&
           check(clpar_module_forward(model, x, &out), "forward") &&
           check(clpar_mse_loss(out, y, CLPAR_REDUCTION_MEAN, &l), "loss") &&
           check(clpar_backward(l), "backward") && check(clpar_optimizer_step(opt), "step") &&
           check(clpar_tensor_read(l, loss, 1), "read loss");
  clpar_scope_end(scope);
  return ok;
}

int main(int argc, char **argv) {
  options o = {.batch = 120, .size = 128, .classes = 1000, .batches = 3};
  if (!parse(argc, argv, &o)) return 2;
  if (!check(clpar_init(), "clpar_init")) return 1;
  clpar_device *dev = clpar_device_get(0);
  size_t n_img = (size_t)(o.batch * 3 * o.size * o.size), n_lab = (size_t)(o.batch * o.classes);
  float *images = malloc(n_img * sizeof *images), *labels = calloc(n_lab, sizeof *labels);
  clpar_module *model = NULL;
  clpar_optimizer *opt = NULL;
  clpar_manual_seed(0);
  int ok = images && labels &&
           check(o.resnet18 ? clpar_resnet18(o.classes, dev, &model)
                            : clpar_resnet50(o.classes, dev, &model),
                 "model") &&
           check(clpar_module_train(model, 1), "train mode") &&
           check(clpar_sgd_create_for(model, &(clpar_sgd_options){.lr = 0.001f}, &opt), "SGD");
  /* one_hot_indices = torch.LongTensor(batch_size).random_(0, num_classes) */
  for (int64_t i = 0; ok && i < o.batch; i++)
    labels[i * o.classes + (int64_t)(uniform() * (double)o.classes)] = 1.0f;
  if (ok)
    printf(
        "%s on %s: batch %lld of 3x%lldx%lld, %lld classes, MSE on one-hot labels, SGD lr "
        "0.001, %d batches\n",
        o.resnet18 ? "ResNet-18" : "ResNet-50", clpar_device_id(dev), (long long)o.batch,
        (long long)o.size, (long long)o.size, (long long)o.classes, o.batches);
  double total = 0;
  for (int b = 0; ok && b < o.batches; b++) {
    randn(images, n_img); /* inputs = torch.randn(batch_size, 3, image_w, image_h) */
    float loss = 0;
    double t0 = now_seconds();
    ok = train_batch(model, opt, dev, &o, images, labels, &loss);
    double t = now_seconds() - t0;
    if (!ok) break;
    if (b > 0 || o.batches == 1) total += t;
    printf("batch %d: loss %.6f  %.3f s  %.1f images/s%s\n", b + 1, (double)loss, t,
           (double)o.batch / t, b == 0 && o.batches > 1 ? "  (warm-up)" : "");
    fflush(stdout);
  }
  if (ok) {
    int counted = o.batches > 1 ? o.batches - 1 : 1;
    printf("mean over %d batch%s: %.3f s per batch, %.1f images/s\n", counted,
           counted > 1 ? "es" : "", total / counted, (double)o.batch * counted / total);
    print_memory_peaks(dev);
  }
  clpar_optimizer_free(opt);
  clpar_module_free(model);
  free(images);
  free(labels);
  clpar_shutdown();
  return ok ? 0 : 1;
}
