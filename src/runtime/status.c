/* status.c — names and messages of the status codes, and the thread-local error message
 * that carries the details of the last failure on a thread. */
#include <stdio.h>
#include <string.h>

#include "runtime.h"

#define CLPAR_ERROR_CAPACITY 8192

static _Thread_local char error_message[CLPAR_ERROR_CAPACITY];

const char *clpar_status_name(clpar_status s) {
  switch (s) {
#define CLPAR_STATUS_NAME_(name, value, msg) \
  case name:                                 \
    return #name;
    CLPAR_STATUS_LIST(CLPAR_STATUS_NAME_)
#undef CLPAR_STATUS_NAME_
  }
  return "CLPAR_UNKNOWN_STATUS";
}

const char *clpar_status_string(clpar_status s) {
  switch (s) {
#define CLPAR_STATUS_STRING_(name, value, msg) \
  case name:                                   \
    return msg;
    CLPAR_STATUS_LIST(CLPAR_STATUS_STRING_)
#undef CLPAR_STATUS_STRING_
  }
  return "unknown status";
}

const char *clpar_last_failure(void) {
  return error_message;
}

const char *clpar_last_error(void) {
  return error_message;
}

void clpar_clear_error(void) {
  error_message[0] = '\0';
}

clpar_status clpar_set_error(clpar_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(error_message, sizeof error_message, fmt, ap);
  va_end(ap);
  clpar_log(CLPAR_LOG_DEBUG, "%s: %s", clpar_status_name(status), error_message);
  return status;
}

void clpar_prefix_error(const char *fmt, ...) {
  char prefix[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  size_t plen = n < 0 ? 0 : (size_t)n < sizeof prefix ? (size_t)n : sizeof prefix - 1;
  size_t len = strlen(error_message);
  if (len + plen + 1 > sizeof error_message) len = sizeof error_message - plen - 1;
  memmove(error_message + plen, error_message, len);
  error_message[plen + len] = '\0';
  memcpy(error_message, prefix, plen);
}

void clpar_append_error(const char *fmt, ...) {
  size_t used = strlen(error_message);
  if (used + 1 >= sizeof error_message) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(error_message + used, sizeof error_message - used, fmt, ap);
  va_end(ap);
}

clpar_status clpar_device_fail(const clpar_device *dev, clpar_status s) {
  /* Shift the message right and write "<id>: " in front of it, once. */
  size_t plen = strlen(dev->bd.info.id) + 2, len = strlen(error_message);
  if (strncmp(error_message, dev->bd.info.id, plen - 2) == 0 && error_message[plen - 2] == ':')
    return s;
  if (len + plen + 1 > sizeof error_message) len = sizeof error_message - plen - 1;
  memmove(error_message + plen, error_message, len);
  error_message[plen + len] = '\0';
  memcpy(error_message, dev->bd.info.id, plen - 2);
  memcpy(error_message + plen - 2, ": ", 2);
  return s;
}

/* Byte i of s (len bytes) as it is shown, in piece (8 bytes); returns the bytes written and
 * sets *used to the bytes of s taken (2 for a UTF-8 C1 control). */
static size_t escape_one(const char *s, size_t len, size_t i, char *piece, size_t *used) {
  static const char hex[] = "0123456789abcdef";
  unsigned char c = (unsigned char)s[i];
  int c1 = c == 0xc2 && i + 1 < len && (unsigned char)s[i + 1] >= 0x80 &&
           (unsigned char)s[i + 1] <= 0x9f;
  size_t n = 0;
  *used = 1 + (size_t)c1;
  if (c < 0x20 || c == 0x7f || c1) {
    for (size_t k = 0; k < *used; k++) {
      unsigned char b = (unsigned char)s[i + k];
      piece[n++] = '\\';
      piece[n++] = 'x';
      piece[n++] = hex[b >> 4];
      piece[n++] = hex[b & 15];
    }
  } else if (c == '\\') {
    piece[n++] = '\\';
    piece[n++] = '\\';
  } else {
    piece[n++] = (char)c;
  }
  return n;
}

const char *clpar_escape(const char *s, size_t len, char *buf, size_t size) {
  char piece[8];
  size_t used, total = 0;
  for (size_t i = 0; i < len; i += used) total += escape_one(s, len, i, piece, &used);
  size_t room = total < size ? size - 1 : size - 4; /* cut: room for "..." */
  size_t at = 0;
  for (size_t i = 0; i < len; i += used) {
    size_t n = escape_one(s, len, i, piece, &used);
    if (at + n > room) break;
    memcpy(buf + at, piece, n);
    at += n;
  }
  if (total >= size) {
    memcpy(buf + at, "...", 3);
    at += 3;
  }
  buf[at] = '\0';
  return buf;
}
