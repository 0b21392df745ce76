/* status.h — every fallible call returns a clpar_status; one X-macro list gives the codes,
 * their names and their messages. Details of the last failure (shapes, device, the OpenCL
 * error name, a build log) are kept in a thread-local message. Also the conventions every
 * options struct follows (CLPAR_ZERO). */
#ifndef CLPAR_STATUS_H
#define CLPAR_STATUS_H

#include "export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, value, message) */
#define CLPAR_STATUS_LIST(X)                                                             \
  X(CLPAR_OK, 0, "success")                                                              \
  X(CLPAR_ERROR_INVALID_ARGUMENT, -1, "invalid argument")                                \
  X(CLPAR_ERROR_SHAPE_MISMATCH, -2, "tensor shapes do not match")                        \
  X(CLPAR_ERROR_EMPTY, -3, "a tensor with no rows or no elements where some are needed") \
  X(CLPAR_ERROR_DEVICE_NOT_FOUND, -4, "no such device")                                  \
  X(CLPAR_ERROR_DEVICE_MISMATCH, -5, "tensors are on different devices")                 \
  X(CLPAR_ERROR_OUT_OF_MEMORY, -6, "out of memory")                                      \
  X(CLPAR_ERROR_TOO_LARGE, -7, "allocation larger than the device allows")               \
  X(CLPAR_ERROR_BUILD, -8, "kernel program failed to build")                             \
  X(CLPAR_ERROR_BACKEND, -9, "the backend (OpenCL, CUDA or a library below it) failed")  \
  X(CLPAR_ERROR_BUFFER_TOO_SMALL, -10, "host buffer too small")                          \
  X(CLPAR_ERROR_NOT_INITIALIZED, -11, "clpar_init has not been called")                  \
  X(CLPAR_ERROR_UNSUPPORTED, -12, "operation not supported on this device")              \
  X(CLPAR_ERROR_IO, -13, "file input or output failed")                                  \
  X(CLPAR_ERROR_CORRUPT, -14, "corrupt or truncated data")                               \
  X(CLPAR_ERROR_NO_GRADIENT, -15, "tensor does not require a gradient")                  \
  X(CLPAR_ERROR_INDEX, -16, "index out of range")                                        \
  X(CLPAR_ERROR_INTERNAL, -17, "internal error")                                         \
  X(CLPAR_ERROR_BUSY, -18, "in use by another thread")                                   \
  X(CLPAR_ERROR_TIMEOUT, -19, "a collective did not complete within the deadline")       \
  X(CLPAR_ERROR_DTYPE, -20, "a tensor's dtype does not fit the operation")               \
  X(CLPAR_ERROR_UNEVEN_INPUTS, -21, "a rank ran out of inputs before the others")

typedef enum clpar_status {
#define CLPAR_STATUS_ENUM_(name, value, msg) name = value,
  CLPAR_STATUS_LIST(CLPAR_STATUS_ENUM_)
#undef CLPAR_STATUS_ENUM_
} clpar_status;

/* "CLPAR_ERROR_SHAPE_MISMATCH"; "CLPAR_UNKNOWN_STATUS" for a value not in the list. */
CLPAR_API const char *clpar_status_name(clpar_status s);
/* "tensor shapes do not match" */
CLPAR_API const char *clpar_status_string(clpar_status s);
/* The message of the last failure on this thread ("" if none since the start or since
 * clpar_clear_error), as errno: a call that succeeds leaves it as it was, so read it only
 * right after a call returned a status other than CLPAR_OK. Valid until the next clpar call
 * on this thread. */
CLPAR_API const char *clpar_last_failure(void);
/* The same message as clpar_last_failure (the older name). */
CLPAR_API const char *clpar_last_error(void);
/* Empties the message. */
CLPAR_API void clpar_clear_error(void);

/* CLPAR_CHECK(expr): evaluates expr (a clpar_status) once and, when it is not CLPAR_OK, returns
 * it from the enclosing function (which must return clpar_status); clpar_last_failure() then
 * says why. CLPAR_CHECK_GOTO(expr, status, label): stores expr's status in the variable status
 * and jumps to label when it is not CLPAR_OK, for functions that free what they made:
 *
 *   clpar_status s;
 *   CLPAR_CHECK_GOTO(clpar_module_forward(m, x, &y), s, done);
 *   CLPAR_CHECK_GOTO(clpar_mse_loss(y, t, CLPAR_REDUCTION_MEAN, &loss), s, done);
 * done:
 *   clpar_tensor_free(y);
 *   return s; */
#define CLPAR_CHECK(expr)                      \
  do {                                         \
    clpar_status clpar_check_status_ = (expr); \
    if (clpar_check_status_ != CLPAR_OK) {     \
      return clpar_check_status_;              \
    }                                          \
  } while (0)
#define CLPAR_CHECK_GOTO(expr, status, label) \
  do {                                        \
    (status) = (expr);                        \
    if ((status) != CLPAR_OK) {               \
      goto label;                             \
    }                                         \
  } while (0)

/* Options structs (clpar_adam_options, clpar_conv2d_options, ...) may be NULL, which means
 * PyTorch's defaults, and may be zero-initialized but for the fields wanted
 * ((clpar_adam_options){.lr = 1e-2f}): a field whose PyTorch default is not zero takes that
 * default when it is 0, as each header says field by field. Where a literal zero is a
 * meaningful setting of such a field (Adam's beta1, AdamW's weight_decay, BatchNorm2d's
 * momentum, ...), write CLPAR_ZERO; the headers say which fields take it. Its value is far
 * outside every field's range, so it is never taken for a setting of its own. */
#define CLPAR_ZERO (-1.0e30f)

#ifdef __cplusplus
}
#endif
#endif
