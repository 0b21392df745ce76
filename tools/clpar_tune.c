/* clpar_tune.c — the clpar-tune program: tunes CLBlast's GEMM for an OpenCL device on the
 * GEMM shapes of a model (clpar_device_tune_gemm) and saves the result under CLPAR_CACHE_DIR,
 * where every later clpar_init finds it. A progress bar goes to stderr, the result to stdout.
 *
 *   clpar-tune [--device ID|INDEX] [--quick] [--candidates N]
 *              [--mlp 784,1024,1024,10] [--batch 256] [--shape m,n,k[,trans_a,trans_b]]...
 *
 * --mlp lists the GEMMs of a stack of Linear layers (forward x W^T, and backward's dX and dW)
 * at --batch rows; without --shape or --mlp, the MLP 784-1024-1024-10 at batch 256 of
 * bench/train_step. --quick tries 2 candidates per GEMM kernel and 1 per pad/transpose kernel
 * (CI). --help says what it tunes. */
#include <clpar/clpar.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../samples/sample_clock.h" /* now_seconds */

#define MAX_SHAPES 64

static const char usage_text[] =
    "usage: clpar-tune [--device ID|INDEX] [--quick] [--candidates N]\n"
    "                  [--mlp IN,H,...,OUT] [--batch B] [--shape m,n,k[,ta,tb]]...\n";

static void usage(void) {
  fputs(usage_text, stderr);
}

static void help(void) {
  fputs(usage_text, stdout);
  fputs(
      "\n"
      "Tunes CLBlast's single-precision GEMM for an OpenCL device on the GEMM shapes of a\n"
      "model, timing whole GEMMs and checking every candidate's results: the indirect kernel\n"
      "(Xgemm), then the kernels its path pads and transposes the matrices with (Transpose,\n"
      "Padtranspose, Pad; each candidate kept only if faster than what is kept, timed in\n"
      "turns), the direct kernel (XgemmDirect), and the size where CLBlast switches between\n"
      "them. The result is kept only if it beats CLBlast's own parameters, saved under\n"
      "CLPAR_CACHE_DIR per device, driver and CLBlast version, and applied whenever clpar\n"
      "opens the device (CLPAR_TUNE=off ignores it). A progress bar goes to stderr, a JSON\n"
      "line with the result to stdout. After the GEMM it tunes the tile sizes of clpar's\n"
      "implicit-GEMM convolution on four ResNet-50 layers, conv1 (7x7, stride 2) included\n"
      "(each candidate checked against im2col + GEMM), then those of its backward data and\n"
      "backward weights kernels (each\n"
      "checked against im2col's backward), kept in the device's convolution entry\n"
      "(docs/opencl-conv.md).\n"
      "\n"
      "  --device ID|INDEX  the device (opencl:1, or its index; default 0)\n"
      "  --mlp IN,H,...,OUT the GEMMs of Linear layers: forward, dW and dX (default\n"
      "                     784,1024,1024,10, the MLP of bench/train_step)\n"
      "  --batch B          the MLP's batch (default 256)\n"
      "  --shape m,n,k[,ta,tb]  one GEMM, row-major C = op(A) op(B); repeat for more\n"
      "  --candidates N     candidates per kernel (default 16 for Xgemm, 8 for\n"
      "                     XgemmDirect, 4 for each pad/transpose kernel)\n"
      "  --quick            2 per GEMM kernel, 1 per pad/transpose kernel (CI)\n"
      "\n"
      "Each candidate compiles CLBlast's GEMM program (10-40 s on PoCL, then cached by\n"
      "PoCL): the default run on the MLP takes minutes.\n",
      stdout);
}

/* user: the start time. */
static void bar(void *user, int done, int total, const char *what) {
  int width = 40, filled = total > 0 ? done * width / total : 0;
  fprintf(stderr, "\r[%.*s%*s] %3d/%d %-20s %6.0f s", filled,
          "########################################", width - filled, "", done, total, what,
          now_seconds() - *(double *)user);
  if (done >= total) fputc('\n', stderr);
  fflush(stderr);
}

/* The GEMMs of Linear layers dims[0] -> dims[1] -> ... at batch rows: forward y = x W^T
 * (batch, out, in), dW = g^T x (out, in, batch), and dX = g W (batch, in, out) but for the
 * first layer, whose input needs no gradient. */
static int mlp_shapes(const long *dims, int nd, long batch, clpar_gemm_shape *out, int max) {
  int n = 0;
  for (int l = 0; l + 1 < nd && n + 3 <= max; l++) {
    long in = dims[l], o = dims[l + 1];
    out[n++] = (clpar_gemm_shape){batch, o, in, 0, 1};
    out[n++] = (clpar_gemm_shape){o, in, batch, 1, 0};
    if (l > 0) out[n++] = (clpar_gemm_shape){batch, in, o, 0, 0};
  }
  return n;
}

int main(int argc, char **argv) {
  const char *device = NULL;
  clpar_tune_options opt = {.progress = bar};
  clpar_gemm_shape shapes[MAX_SHAPES];
  int n = 0;
  long dims[16] = {784, 1024, 1024, 10}, batch = 256;
  int nd = 4, explicit_shapes = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      help();
      return 0;
    } else if (strcmp(a, "--quick") == 0) {
      opt.quick = 1;
    } else if (strcmp(a, "--device") == 0 && v) {
      device = v, i++;
    } else if (strcmp(a, "--candidates") == 0 && v) {
      opt.candidates = atoi(v), i++;
    } else if (strcmp(a, "--batch") == 0 && v) {
      batch = atol(v), i++;
    } else if (strcmp(a, "--mlp") == 0 && v) {
      nd = 0;
      for (const char *p = v; *p && nd < 16; nd++) {
        char *end;
        dims[nd] = strtol(p, &end, 10);
        if (end == p || dims[nd] < 1) {
          usage();
          return 2;
        }
        p = *end == ',' ? end + 1 : end;
      }
      i++;
    } else if (strcmp(a, "--shape") == 0 && v && n < MAX_SHAPES) {
      long m = 0, nn = 0, k = 0;
      int ta = 0, tb = 0;
      if (sscanf(v, "%ld,%ld,%ld,%d,%d", &m, &nn, &k, &ta, &tb) < 3) {
        usage();
        return 2;
      }
      shapes[n++] = (clpar_gemm_shape){m, nn, k, ta, tb};
      explicit_shapes = 1;
      i++;
    } else {
      usage();
      return 2;
    }
  }
  if (!explicit_shapes) n = mlp_shapes(dims, nd, batch, shapes, MAX_SHAPES);
  if (clpar_init() != CLPAR_OK) {
    fprintf(stderr, "clpar-tune: %s\n", clpar_last_error());
    return 1;
  }
  clpar_device *dev = NULL;
  if (!device)
    dev = clpar_device_get(0);
  else if (strchr(device, ':') || strcmp(device, "host") == 0)
    clpar_device_find(device, &dev);
  else
    dev = clpar_device_get(atoi(device));
  if (!dev) {
    fprintf(stderr, "clpar-tune: no device %s: %s\n", device ? device : "0", clpar_last_error());
    clpar_shutdown();
    return 1;
  }
  clpar_device_info info;
  clpar_device_get_info(dev, &info);
  fprintf(stderr, "clpar-tune: %s (%s), %d GEMM shapes%s\n", info.id, info.name, n,
          opt.quick ? ", quick grid" : "");
  double start = now_seconds();
  opt.user = &start;
  clpar_tune_result r;
  clpar_status s = clpar_device_tune_gemm(dev, shapes, n, &opt, &r);
  if (s != CLPAR_OK) {
    fprintf(stderr, "clpar-tune: %s: %s\n", clpar_status_name(s), clpar_last_error());
    clpar_shutdown();
    return 1;
  }
  printf(
      "{\"device\": \"%s\", \"shapes\": %d, \"candidates_tried\": %d, \"candidates_failed\": %d, "
      "\"default_ms\": %.3f, \"tuned_ms\": %.3f, \"speedup\": %.3f, \"entry\": \"%s\"}\n",
      info.id, n, r.candidates_tried, r.candidates_failed, r.default_seconds * 1e3,
      r.tuned_seconds * 1e3, r.tuned_seconds > 0 ? r.default_seconds / r.tuned_seconds : 0.0,
      r.path);
  clpar_shutdown();
  return 0;
}
