/* log.c — leveled logging to stderr or a user callback; never to stdout. The callback runs
 * without any lock held, so it may call back into clpar; a message logged from inside the
 * callback on the same thread goes to stderr instead of recursing into it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "runtime.h"

static clpar_log_level log_level = CLPAR_LOG_WARN;
static clpar_log_fn log_fn = NULL;
static void *log_user = NULL;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int in_callback; /* this thread is inside the user's callback */

void clpar_log_set_level(clpar_log_level level) {
  if (level < CLPAR_LOG_OFF) level = CLPAR_LOG_OFF;
  if (level > CLPAR_LOG_DEBUG) level = CLPAR_LOG_DEBUG;
  __atomic_store_n(&log_level, level, __ATOMIC_RELAXED);
}

clpar_log_level clpar_log_get_level(void) {
  return __atomic_load_n(&log_level, __ATOMIC_RELAXED);
}

void clpar_log_set_callback(clpar_log_fn fn, void *user) {
  pthread_mutex_lock(&log_lock);
  log_fn = fn;
  log_user = user;
  pthread_mutex_unlock(&log_lock);
}

void clpar_log_init_from_env(void) {
  static const char *names[] = {"off", "error", "warn", "info", "debug"};
  const char *v = getenv("CLPAR_LOG_LEVEL");
  if (!v || !*v) return;
  for (int i = 0; i <= CLPAR_LOG_DEBUG; i++) {
    if (strcasecmp(v, names[i]) == 0 || (v[0] == '0' + i && v[1] == '\0')) {
      clpar_log_set_level((clpar_log_level)i);
      return;
    }
  }
  clpar_log(CLPAR_LOG_WARN, "CLPAR_LOG_LEVEL=%s is not one of off, error, warn, info, debug", v);
}

void clpar_log(clpar_log_level level, const char *fmt, ...) {
  static const char *tags[] = {"", "error", "warn", "info", "debug"};
  if (level <= CLPAR_LOG_OFF || level > clpar_log_get_level()) return;
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&log_lock);
  clpar_log_fn fn = log_fn;
  void *user = log_user;
  pthread_mutex_unlock(&log_lock);
  if (fn && !in_callback) {
    in_callback = 1;
    fn(level, msg, user);
    in_callback = 0;
  } else {
    fprintf(stderr, "clpar %s: %s\n", tags[level], msg);
  }
}
