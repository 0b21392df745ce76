/* cuda_backend.c — clpar's CUDA backend: the CUDA runtime for memory, streams
 * and events, cuBLAS for GEMM, and clpar's own kernels (kernels/cuda/) for the element-wise
 * ops, the row-wise ones (softmax, the loss) and the optimizer updates.
 *
 * Each device gets one non-blocking stream (it must not wait on the legacy default stream
 * that other code in the process may use) and one cuBLAS handle bound to it, so every op of
 * a device runs in the order it was enqueued, as backend.h requires. The core calls the
 * QUEUE entries from the device's worker thread and the DIRECT ones from any thread; the
 * runtime's current device is per host thread, so every entry makes its device current
 * first. GEMMs still take a per-device lock (a cuBLAS handle is not meant to be used by two
 * threads at once), which costs nothing when only the worker enqueues.
 *
 * No entry waits for the device but finish, profile_read, destroy, host_free (cudaFreeHost
 * synchronizes the device) and the two that free device memory other work may still use
 * (release, and sum_rows when its scratch grows); each reports its wait to the core
 * (clpar_backend_waited), which counts it in clpar_device_host_waits. write and read are
 * cudaMemcpyAsync on the stream, and the core keeps their host memory alive until an event recorded
 * after them has completed. Events are CUDA events without timing, recorded on the stream;
 * event_then waits for one on a second stream of the device (then_stream) and calls back from the
 * runtime's callback thread.
 *
 * Profiling brackets each op with a pair of CUDA events recorded on the stream, so the time
 * between them is the device's time for that op. Events are made only while profiling is
 * on: otherwise an op pays one atomic load and nothing else. On a stream with nothing
 * enqueued the start event happens at once, so the pair then also counts the host's few
 * microseconds between the two records (the launch itself); on a busy stream it happens
 * when the work before it ends.
 *
 * Copies to another CUDA device (copy_peer) are cudaMemcpyPeerAsync on the source's stream,
 * after peer_access has checked cudaDeviceCanAccessPeer and enabled the access. Like the rest
 * of this module, that has been compiled but never run: no GPU was available.
 *
 * With NCCL (CMake option CLPAR_NCCL), the comm_ entries give DistributedDataParallel an
 * all-reduce between processes on the device's own stream (cuda_nccl.c); without it they are
 * NULL and DDP reduces CUDA devices' gradients in pinned host memory over MPI.
 *
 * A machine without a GPU or without the driver probes to no device, which is not an error:
 * the module is compiled and linked everywhere and runs where a GPU is.
 *
 * This file opens and closes devices and builds the table; the entries live in cuda_memory.c,
 * cuda_elementwise.c, cuda_gemm.c, cuda_conv.c, cuda_cudnn.c (convolutions through cuDNN) and
 * cuda_op.c (errors, profiling). */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_internal.h"
#ifdef CLPAR_HAVE_NCCL
#include "cuda/cuda_nccl.h"
#endif
#include "cuda/cuda_cudnn.h"

/* ---- the device ---- */

/* The core calls it with the queue idle, but a callback of event_then may still be pending
 * on then_stream: both streams are drained before they go. Errors are ignored: at process
 * exit the runtime may already be unloading. */
static clpar_status cuda_destroy(void *dev) {
  cuda_dev *d = dev;
  if (!d) return CLPAR_OK;
  if (cudaSetDevice(d->ordinal) == cudaSuccess) {
    if (d->stream) (void)cudaStreamSynchronize(d->stream);
    if (d->then_stream) (void)cudaStreamSynchronize(d->then_stream);
    clpar_backend_waited();
  }
  clpar_cuda_prof_discard(d);
#ifdef CLPAR_HAVE_CUDNN
  clpar_cudnn_release(d);
#endif
  clpar_cuda_lt_release(d);
  free(d->pairs);
  if (d->scratch) (void)cudaFree(d->scratch);
  if (d->blas) (void)cublasDestroy(d->blas);
  if (d->then_stream) (void)cudaStreamDestroy(d->then_stream);
  if (d->stream) (void)cudaStreamDestroy(d->stream);
  (void)cudaGetLastError();
  pthread_mutex_destroy(&d->then_lock);
  pthread_mutex_destroy(&d->prof_lock);
  pthread_mutex_destroy(&d->scratch_lock);
  pthread_mutex_destroy(&d->blas_lock);
  pthread_mutex_destroy(&d->peer_lock);
  free(d);
  return CLPAR_OK;
}

/* ---- collectives between processes: NCCL (cuda_nccl.c; CMake option CLPAR_NCCL) ---- */

#ifdef CLPAR_HAVE_NCCL
static clpar_status cuda_comm_id(void *dev, void *id, size_t bytes) {
  cuda_dev *d = dev;
  clpar_status s = clpar_cuda_use_device(d);
  return s == CLPAR_OK ? clpar_nccl_id(id, bytes) : s;
}

/* NCCL takes the communicator's device from the calling thread's current one. */
static clpar_status cuda_comm_init(void *dev, const void *id, size_t bytes, int nranks, int rank,
                                   void **comm) {
  cuda_dev *d = dev;
  clpar_status s = clpar_cuda_use_device(d);
  return s == CLPAR_OK ? clpar_nccl_init(d->ordinal, id, bytes, nranks, rank, comm) : s;
}

static clpar_status cuda_comm_query(void *dev, void *comm, int *pending) {
  cuda_dev *d = dev;
  clpar_status s = clpar_cuda_use_device(d);
  return s == CLPAR_OK ? clpar_nccl_query(comm, pending) : s;
}

static clpar_status cuda_comm_abort(void *dev, void *comm) {
  cuda_dev *d = dev;
  (void)clpar_cuda_use_device(d); /* abort whatever happens */
  clpar_clear_error();
  return clpar_nccl_abort(comm);
}

static clpar_status cuda_comm_free(void *dev, void *comm, double timeout_s) {
  cuda_dev *d = dev;
  (void)clpar_cuda_use_device(d);
  clpar_clear_error();
  return clpar_nccl_free(comm, timeout_s);
}

/* On the device's stream, in order with its other work: the gradients a backward kernel has
 * just written are averaged there, and the optimizer's kernels enqueued later read the
 * averages, with no host wait between (profiled as one op). */
static clpar_status cuda_comm_allreduce(void *dev, void *comm, clpar_bref data, size_t n,
                                        double timeout_s) {
  cuda_dev *d = dev;
  prof_pair prof;
  clpar_status s = clpar_cuda_op_begin(d, &prof);
  if (s != CLPAR_OK) return s;
  return clpar_cuda_op_end(d, &prof, clpar_nccl_allreduce(comm, at(data), n, d->stream, timeout_s));
}
#else
#define cuda_comm_id NULL
#define cuda_comm_init NULL
#define cuda_comm_query NULL
#define cuda_comm_abort NULL
#define cuda_comm_free NULL
#define cuda_comm_allreduce NULL
#endif

/* supports_op (below) refuses gemm_half without CLPAR_CUDA_HALF_GEMM=1, and xent and
 * xent_backward without CLPAR_CUDA_XENT=1. */
#define cuda_tune_gemm NULL
/* Element-wise chains stay single commands. */
#define cuda_ew_chain_prepare NULL
#define cuda_ew_chain NULL

/* Every entry of backend.h's list, cuda_<entry> (the comm_ entries NULL without NCCL). */
/* Whole convolutions through cuDNN (cuda_cudnn.c) when built with it and CLPAR_CUDA_CUDNN=1
 * (opt-in) finds cuDNN at run time; else im2col and GEMMs in the core. */
#ifdef CLPAR_HAVE_CUDNN
#define cuda_conv2d clpar_cuda_entry_conv2d
#define cuda_conv2d_backward clpar_cuda_entry_conv2d_backward
#else
#define cuda_conv2d NULL
#define cuda_conv2d_backward NULL
#endif
/* A Linear's backward: bias_act_backward then two cuBLAS GEMMs, the core's composition in one
 * posted entry. */
static clpar_status cuda_linear_act_backward(void *dev, clpar_act_kind act, size_t m, size_t n,
                                             size_t k, clpar_bref g, clpar_bref y, clpar_bref x,
                                             clpar_bref w, clpar_bref scratch, clpar_bref dx,
                                             clpar_bref dw, clpar_bref db, int accumulate) {
  return clpar_be_linear_act_backward("cuda", cuda_bias_act_backward, cuda_gemm, dev, act, m, n, k,
                                      g, y, x, w, scratch, dx, dw, db, accumulate);
}
/* A Linear's forward: with CLPAR_CUDA_LT=1, one cuBLASLt matmul with the bias and ReLU in its
 * epilogue where it applies (cuda_lt.c); else the cuBLAS GEMM, then bias_act (or the
 * activation's unary). */
static clpar_status cuda_linear_act(void *dev, clpar_act_kind act, size_t m, size_t n, size_t k,
                                    clpar_bref x, clpar_bref w, clpar_bref bias, clpar_bref out) {
  int done = 0;
  clpar_status s = clpar_cuda_lt_linear(dev, act, m, n, k, x, w, bias, out, &done);
  if (s != CLPAR_OK || done) return s;
  s = cuda_gemm(dev, 0, 1, m, n, k, 1.0f, x, k, w, k, 0.0f, out, n);
  if (s == CLPAR_OK && bias.buf) return cuda_bias_act(dev, act, m, n, out, bias, out);
  if (s == CLPAR_OK && act != CLPAR_ACT_NONE)
    s = cuda_unary(dev,
                   act == CLPAR_ACT_RELU      ? CLPAR_UNARY_RELU
                   : act == CLPAR_ACT_SIGMOID ? CLPAR_UNARY_SIGMOID
                                              : CLPAR_UNARY_TANH,
                   m * n, out, out);
  return s;
}

/* No prepared launches: a replay calls the entries (docs/graphs.md). */
#define cuda_prepare_begin NULL
#define cuda_prepare_end NULL
#define cuda_prepare_run NULL
#define cuda_prepare_free NULL
#define CLPAR_BE_PREFIX_ cuda
static const clpar_backend_iface cuda_iface = CLPAR_BACKEND_TABLE("cuda");
#undef CLPAR_BE_PREFIX_

#ifdef CLPAR_HAVE_CUDNN
/* cuda_iface without the cuDNN convolutions. */
static clpar_backend_iface cuda_iface_plain;
static pthread_once_t plain_once = PTHREAD_ONCE_INIT;

static void make_plain(void) {
  cuda_iface_plain = cuda_iface;
  cuda_iface_plain.conv2d = NULL;
  cuda_iface_plain.conv2d_backward = NULL;
}
#endif

/* What the probe read of CLPAR_CUDA_CUDNN, CLPAR_CUDA_TF32, CLPAR_CUDA_LT,
 * CLPAR_CUDA_HALF_GEMM and CLPAR_CUDA_XENT, for every device. */
typedef struct {
  const clpar_backend_iface *iface;
  int tf32;
  int lt;        /* CLPAR_CUDA_LT */
  int half_gemm; /* CLPAR_CUDA_HALF_GEMM */
  int xent;      /* CLPAR_CUDA_XENT */
} probe_opts;

/* The paths built but not yet run on a GPU, each opt-in: unset or "0" off, "1" on; anything
 * else is CLPAR_ERROR_INVALID_ARGUMENT naming the variable and what each value does. */
static const struct {
  const char *name, *on, *off;
} switches[] = {
    {"CLPAR_CUDA_LT", "a Linear's bias and ReLU in cuBLASLt's GEMM epilogue",
     "cuBLAS SGEMM, then bias_act"},
    {"CLPAR_CUDA_HALF_GEMM", "autocast's forward GEMMs on 16-bit operands through cublasGemmEx",
     "operands widened to float32, then cuBLAS SGEMM"},
    {"CLPAR_CUDA_XENT", "softmax cross-entropy as one kernel each way",
     "composed from log-softmax and the negative log-likelihood"},
};

static clpar_status env_switch(int i, int *use) {
  const char *v = getenv(switches[i].name);
  *use = 0;
  if (!v) return CLPAR_OK;
  if (strcmp(v, "0") == 0 || strcmp(v, "1") == 0) {
    *use = v[0] == '1';
    return CLPAR_OK;
  }
  return clpar_set_error(CLPAR_ERROR_INVALID_ARGUMENT,
                         "cuda backend: %s is \"%.32s\"; use 1 (%s) or 0 (%s)", switches[i].name, v,
                         switches[i].on, switches[i].off);
}

/* The optional entries an opt-in switch leaves off are refused; every other entry the backend
 * has runs everywhere. */
clpar_status cuda_supports_op(void *dev, const char *op, int *yes) {
  const cuda_dev *d = dev;
  if (strcmp(op, "gemm_half") == 0)
    *yes = d->half_gemm;
  else if (strcmp(op, "xent") == 0 || strcmp(op, "xent_backward") == 0)
    *yes = d->xent;
  else
    *yes = 1;
  return CLPAR_OK;
}

/* ---- probe ---- */

/* Errors of cudaGetDeviceCount that only mean "no CUDA here". */
static int means_no_device(cudaError_t e) {
  return e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorStubLibrary;
}

/* Makes the streams and the cuBLAS handle of device ordinal; the device is destroyed on
 * failure. */
static clpar_status cuda_dev_create(int ordinal, cuda_dev **out) {
  cuda_dev *d = calloc(1, sizeof *d);
  if (!d) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "out of host memory");
  d->ordinal = ordinal;
  pthread_mutex_init(&d->then_lock, NULL);
  pthread_mutex_init(&d->blas_lock, NULL);
  pthread_mutex_init(&d->scratch_lock, NULL);
  pthread_mutex_init(&d->prof_lock, NULL);
  pthread_mutex_init(&d->peer_lock, NULL);
  atomic_init(&d->profiling, 0);
  clpar_status s = clpar_cuda_use_device(d);
  if (s == CLPAR_OK)
    s = clpar_cuda_check(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking),
                         "cudaStreamCreateWithFlags");
  if (s == CLPAR_OK)
    s = clpar_cuda_check(cudaStreamCreateWithFlags(&d->then_stream, cudaStreamNonBlocking),
                         "cudaStreamCreateWithFlags(event_then)");
  if (s == CLPAR_OK) s = clpar_cuda_blas_check(cublasCreate(&d->blas), "cublasCreate");
  if (s == CLPAR_OK)
    s = clpar_cuda_blas_check(cublasSetStream(d->blas, d->stream), "cublasSetStream");
  if (s != CLPAR_OK) {
    cuda_destroy(d);
    return s;
  }
  *out = d;
  return CLPAR_OK;
}

static void fill_info(clpar_device_info *in, const struct cudaDeviceProp *prop, int driver) {
  snprintf(in->backend, sizeof in->backend, "cuda");
  snprintf(in->name, sizeof in->name, "%s", prop->name);
  snprintf(in->vendor, sizeof in->vendor, "NVIDIA");
  in->platform[0] = '\0';
  /* cudaDriverGetVersion gives 1000 * major + 10 * minor: 13000 is CUDA 13.0. */
  snprintf(in->driver_version, sizeof in->driver_version, "%d.%d", driver / 1000,
           (driver % 1000) / 10);
  in->type = CLPAR_DEVICE_GPU;
  in->global_mem_bytes = prop->totalGlobalMem;
  /* CUDA has no per-allocation limit below the device's memory. */
  in->max_alloc_bytes = prop->totalGlobalMem;
  in->compute_units = prop->multiProcessorCount;
}

/* Adds device ordinal, or skips it with a warning when clpar's kernels have no code for it
 * (the build's CMAKE_CUDA_ARCHITECTURES does not cover its compute capability): every op
 * would fail on it, and a device that is not listed is clearer than one that never works. */
static clpar_status probe_one(int ordinal, int driver, const probe_opts *o,
                              clpar_backend_device **devs, int *count) {
  struct cudaDeviceProp prop;
  clpar_status s =
      clpar_cuda_check(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
  if (s != CLPAR_OK) return s;
  s = clpar_cuda_check(cudaSetDevice(ordinal), "cudaSetDevice");
  cudaError_t image = s == CLPAR_OK ? clpar_cuda_kernel_image_check() : cudaSuccess;
  if (s == CLPAR_OK && image != cudaSuccess) {
    (void)cudaGetLastError();
    clpar_log(CLPAR_LOG_WARN,
              "CUDA device %d (%s, compute capability %d.%d) skipped: clpar's kernels were not "
              "built for it (%s); rebuild with CMAKE_CUDA_ARCHITECTURES including %d%d",
              ordinal, prop.name, prop.major, prop.minor, cudaGetErrorName(image), prop.major,
              prop.minor);
    return CLPAR_OK;
  }
  cuda_dev *d = NULL;
  if (s == CLPAR_OK) s = cuda_dev_create(ordinal, &d);
  if (s != CLPAR_OK) return s;
  d->cudnn_tf32 = o->tf32;
  d->lt_use = o->lt;
  d->half_gemm = o->half_gemm;
  d->xent = o->xent;
  clpar_backend_device *slot = clpar_backend_device_append(devs, count);
  if (!slot) {
    cuda_destroy(d);
    return CLPAR_ERROR_OUT_OF_MEMORY;
  }
  slot->iface = o->iface;
  slot->ctx = d;
  fill_info(&slot->info, &prop, driver);
  clpar_log(CLPAR_LOG_DEBUG, "CUDA device %d: %s, compute capability %d.%d, %d SMs, %zu MiB",
            ordinal, prop.name, prop.major, prop.minor, prop.multiProcessorCount,
            (size_t)(prop.totalGlobalMem >> 20));
  return CLPAR_OK;
}

/* The switches above, CLPAR_CUDA_CUDNN and CLPAR_CUDA_TF32 (cuda_cudnn.h), read whether or
 * not a GPU is present so that a wrong value is reported everywhere; cuDNN is opened once a
 * device is found. */
static clpar_status probe_options(int have_devices, probe_opts *o) {
  o->iface = &cuda_iface;
  o->tf32 = 0;
  clpar_status s = env_switch(0, &o->lt);
  if (s == CLPAR_OK) s = env_switch(1, &o->half_gemm);
  if (s == CLPAR_OK) s = env_switch(2, &o->xent);
  if (s != CLPAR_OK) return s;
  if (o->lt && have_devices)
    clpar_log(CLPAR_LOG_INFO, "CUDA Linear layers: bias and ReLU in cuBLASLt's GEMM epilogue");
  if (o->half_gemm && have_devices)
    clpar_log(CLPAR_LOG_INFO, "CUDA autocast GEMMs: 16-bit operands through cublasGemmEx");
#ifdef CLPAR_HAVE_CUDNN
  int use = 1, asked = 0;
  s = clpar_cudnn_settings(&use, &asked, &o->tf32);
  if (s != CLPAR_OK || !have_devices) return s;
  const char *why = "";
  if (use && !clpar_cudnn_load(&why)) {
    clpar_log(asked ? CLPAR_LOG_WARN : CLPAR_LOG_INFO,
              "CUDA convolutions run as im2col and cuBLAS GEMMs: cuDNN could not be used: %s", why);
    use = 0;
  } else if (use) {
    clpar_log(CLPAR_LOG_INFO, "CUDA convolutions through %s%s", why,
              o->tf32 ? " (TF32 allowed)" : "");
  }
  pthread_once(&plain_once, make_plain);
  if (!use) o->iface = &cuda_iface_plain;
#else
  (void)have_devices;
#endif
  return CLPAR_OK;
}

/* Devices are reported in CUDA's order, so that cuda:N is CUDA device N (unless one was
 * skipped); a device that fails stops the probe and the ones before it stay. */
clpar_status clpar_cuda_probe(clpar_backend_device **devs, int *count) {
  probe_opts opts;
  clpar_status s = probe_options(0, &opts);
  if (s != CLPAR_OK) return s;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (!means_no_device(e)) return clpar_cuda_fail("cudaGetDeviceCount", e);
    (void)cudaGetLastError();
    clpar_log(CLPAR_LOG_INFO, "no CUDA device: %s (%s)", cudaGetErrorName(e),
              cudaGetErrorString(e));
    return CLPAR_OK;
  }
  if (n <= 0) {
    clpar_log(CLPAR_LOG_INFO, "no CUDA device: the runtime reports 0 devices");
    return CLPAR_OK;
  }
  int driver = 0;
  s = probe_options(1, &opts);
  if (s == CLPAR_OK) s = clpar_cuda_check(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
  for (int i = 0; i < n && s == CLPAR_OK; i++) s = probe_one(i, driver, &opts, devs, count);
  return s;
}
