/* log.h — the library logs to stderr (never stdout), or to a callback, by level.
 * CLPAR_LOG_LEVEL (error, warn, info, debug, or 0..4) sets the level at clpar_init. */
#ifndef CLPAR_LOG_H
#define CLPAR_LOG_H

#include "export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum clpar_log_level {
  CLPAR_LOG_OFF = 0,
  CLPAR_LOG_ERROR = 1,
  CLPAR_LOG_WARN = 2,
  CLPAR_LOG_INFO = 3,
  CLPAR_LOG_DEBUG = 4
} clpar_log_level;

typedef void (*clpar_log_fn)(clpar_log_level level, const char *message, void *user);

CLPAR_API void clpar_log_set_level(clpar_log_level level);
CLPAR_API clpar_log_level clpar_log_get_level(void);
/* NULL restores logging to stderr. The callback is called without any lock held, possibly
 * from several threads at once (and possibly still running on another thread when this
 * returns); it may call any clpar function. A message logged from inside the callback on the
 * same thread goes to stderr, not back into the callback. */
CLPAR_API void clpar_log_set_callback(clpar_log_fn fn, void *user);

#ifdef __cplusplus
}
#endif
#endif
