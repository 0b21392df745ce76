/* ocl_prepared.c — prepared launches for captured graphs (backend.h's prepare_* entries).
 *
 * While the worker runs an entry between prepare_begin and prepare_end, every launch that goes
 * through clpar_ocl_launch_locked is recorded: a kernel object of the graph's own, made from
 * the same program (clCreateKernel: the build targets OpenCL 1.2, where clCloneKernel is
 * absent), its arguments set once, with the launch's sizes. A replay enqueues those kernels
 * with one clEnqueueNDRangeKernel each, instead of setting the arguments again. An entry is
 * recorded only when it is on the list below (entries that enqueue through
 * clpar_ocl_launch_locked alone) and it did not call CLBlast (blast_begin reports it): a
 * transfer, a library call or an enqueue of its own keeps the entry path. */
#include <stdlib.h>
#include <string.h>

#include "ocl_internal.h"

#define PREP_MAX 4 /* launches one entry may record */

typedef struct {
  cl_kernel k;
  cl_uint dims;
  int has_local;
  size_t global[3], local[3];
} prep_launch;

typedef struct {
  int n;
  prep_launch l[PREP_MAX];
  cl_mem scratch; /* d->scratch when recorded (retained: a larger one may replace it) */
} prepared;

typedef struct clpar_ocl_recording {
  int foreign; /* something the recording cannot hold was enqueued */
  prepared p;
} recording;

/* Entries whose OpenCL implementation enqueues through clpar_ocl_launch_locked only (or
 * CLBlast, which marks the recording foreign). The core keeps the commands it patches per
 * replay (the optimizers' steps, dropout's masks) on the entry path. */
static const char *const recordable[] = {"fill",
                                         "binary",
                                         "scale",
                                         "sum_rows",
                                         "gemm",
                                         "gemm_batched",
                                         "broadcast_rows",
                                         "reduce_sum",
                                         "expand",
                                         "unary",
                                         "unary_backward",
                                         "softmax",
                                         "pick",
                                         "softmax_backward",
                                         "nll",
                                         "nll_backward",
                                         "xent",
                                         "xent_backward",
                                         "bias_act",
                                         "bias_act_backward",
                                         "linear_act",
                                         "linear_act_backward",
                                         "strided_copy",
                                         "pointwise",
                                         "mask_upper",
                                         "argmax",
                                         "nll_ignore",
                                         "nll_ignore_backward",
                                         "embedding",
                                         "embedding_backward",
                                         "layernorm",
                                         "layernorm_backward",
                                         "half_convert",
                                         "sgd_step",
                                         "adam_step",
                                         "dropout_mask"};

static int is_recordable(const char *op) {
  for (size_t i = 0; op && i < sizeof recordable / sizeof *recordable; i++)
    if (strcmp(op, recordable[i]) == 0) return 1;
  return 0;
}

static void release_launches(prepared *p) {
  for (int i = 0; i < p->n; i++) clReleaseKernel(p->l[i].k);
  p->n = 0;
}

clpar_status ocl_prepare_begin(void *dev) {
  clpar_ocl_device *d = dev;
  recording *r = d->recording ? d->recording : calloc(1, sizeof *r);
  if (!r) return clpar_set_error(CLPAR_ERROR_OUT_OF_MEMORY, "opencl prepare_begin: no memory");
  release_launches(&r->p); /* an earlier recording left open */
  r->foreign = 0;
  d->recording = r;
  return CLPAR_OK;
}

void clpar_ocl_prepare_foreign(clpar_ocl_device *d) {
  if (d->recording) d->recording->foreign = 1;
}

/* A kernel of the graph's own for the launch just enqueued, its arguments set as k's. */
static cl_kernel kernel_copy(cl_kernel k, const char *name, const karg *args, int nargs) {
  cl_program program;
  cl_int err = clGetKernelInfo(k, CL_KERNEL_PROGRAM, sizeof program, &program, NULL);
  cl_kernel copy = err == CL_SUCCESS ? clCreateKernel(program, name, &err) : NULL;
  for (int i = 0; copy && err == CL_SUCCESS && i < nargs; i++)
    err = clSetKernelArg(copy, (cl_uint)i, args[i].size, args[i].value);
  if (copy && err != CL_SUCCESS) {
    clReleaseKernel(copy);
    copy = NULL;
  }
  return copy;
}

void clpar_ocl_prepare_launch(clpar_ocl_device *d, cl_kernel k, const char *name, const karg *args,
                              int nargs, cl_uint dims, const size_t *global, const size_t *local) {
  recording *r = d->recording;
  if (!r || r->foreign) return;
  cl_kernel copy = r->p.n < PREP_MAX && dims <= 3 ? kernel_copy(k, name, args, nargs) : NULL;
  if (!copy) {
    r->foreign = 1;
    return;
  }
  prep_launch *l = &r->p.l[r->p.n++];
  *l = (prep_launch){copy, dims, local != NULL, {0}, {0}};
  memcpy(l->global, global, dims * sizeof *global);
  if (local) memcpy(l->local, local, dims * sizeof *local);
}

clpar_status ocl_prepare_end(void *dev, const char *op, void **launch) {
  clpar_ocl_device *d = dev;
  recording *r = d->recording;
  *launch = NULL;
  d->recording = NULL;
  if (!r) return CLPAR_OK;
  int keep = !r->foreign && r->p.n > 0 && is_recordable(op);
  prepared *p = keep ? malloc(sizeof *p) : NULL;
  if (p) {
    *p = r->p;
    r->p.n = 0;
  }
  release_launches(&r->p);
  free(r);
  if (!p) return CLPAR_OK;
  pthread_mutex_lock(&d->lock);
  p->scratch = d->scratch;
  if (p->scratch) clRetainMemObject(p->scratch);
  pthread_mutex_unlock(&d->lock);
  *launch = p;
  return CLPAR_OK;
}

clpar_status ocl_prepare_run(void *dev, void *launch) {
  clpar_ocl_device *d = dev;
  const prepared *p = launch;
  clpar_status s = CLPAR_OK;
  pthread_mutex_lock(&d->lock);
  for (int i = 0; i < p->n && s == CLPAR_OK; i++) {
    const prep_launch *l = &p->l[i];
    cl_event ev;
    cl_int err = clEnqueueNDRangeKernel(d->queue, l->k, l->dims, NULL, l->global,
                                        l->has_local ? l->local : NULL, 0, NULL,
                                        clpar_ocl_profile_slot(d, &ev));
    if (err == CL_SUCCESS)
      clpar_ocl_profile_keep(d, ev);
    else
      s = clpar_ocl_fail(err, "clEnqueueNDRangeKernel", "a prepared launch");
  }
  pthread_mutex_unlock(&d->lock);
  return s;
}

clpar_status ocl_prepare_free(void *dev, void *launch) {
  (void)dev;
  prepared *p = launch;
  if (!p) return CLPAR_OK;
  release_launches(p);
  if (p->scratch) clReleaseMemObject(p->scratch);
  free(p);
  return CLPAR_OK;
}
