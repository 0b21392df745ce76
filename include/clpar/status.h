/* status.h — every fallible call returns a clpar_status; one X-macro list gives the codes,
 * their names and their messages. Details of the last error (shapes, device, the OpenCL
 * error name, a build log) are kept in a thread-local message. */
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
  X(CLPAR_ERROR_DTYPE, -20, "a tensor's dtype does not fit the operation")

typedef enum clpar_status {
#define CLPAR_STATUS_ENUM_(name, value, msg) name = value,
  CLPAR_STATUS_LIST(CLPAR_STATUS_ENUM_)
#undef CLPAR_STATUS_ENUM_
} clpar_status;

/* "CLPAR_ERROR_SHAPE_MISMATCH"; "CLPAR_UNKNOWN_STATUS" for a value not in the list. */
CLPAR_API const char *clpar_status_name(clpar_status s);
/* "tensor shapes do not match" */
CLPAR_API const char *clpar_status_string(clpar_status s);
/* Details of the last error raised on this thread ("" if none). Valid until the next
 * clpar call on this thread. */
CLPAR_API const char *clpar_last_error(void);
CLPAR_API void clpar_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif
