#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static _Thread_local char g_message[1024];

tsr_status tsr_error_set(tsr_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_message, sizeof g_message, fmt, ap);
  va_end(ap);
  return st;
}

void tsr_error_prefix(const char *fmt, ...) {
  char prefix[512], old[sizeof g_message];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, g_message, sizeof old);
  /* truncation of an over-long message is acceptable: the start names the place */
  size_t n = strlen(prefix);
  if (n > sizeof g_message - 3) n = sizeof g_message - 3;
  memcpy(g_message, prefix, n);
  memcpy(g_message + n, ": ", 2);
  size_t rest = sizeof g_message - n - 3;
  size_t m = strlen(old);
  if (m > rest) m = rest;
  memcpy(g_message + n + 2, old, m);
  g_message[n + 2 + m] = '\0';
}

void tsr_error_clear(void) { g_message[0] = '\0'; }

const char *tsr_error_message(void) { return g_message; }

const char *tsr_status_name(tsr_status st) {
  switch (st) {
  case TSR_OK: return "ok";
  case TSR_ERR_INVALID_ARG: return "invalid argument";
  case TSR_ERR_IO: return "i/o error";
  case TSR_ERR_FORMAT: return "format error";
  case TSR_ERR_UNSUPPORTED: return "unsupported";
  case TSR_ERR_NOMEM: return "out of memory";
  case TSR_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

#define TSR_STR2(x) #x
#define TSR_STR(x) TSR_STR2(x)
const char *tsr_version(void) {
  return TSR_STR(TSR_VERSION_MAJOR) "." TSR_STR(TSR_VERSION_MINOR) "." TSR_STR(
      TSR_VERSION_PATCH);
}

tsr_status tsr_exe_dir(char *buf, size_t cap) {
  ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
  if (n <= 0 || (size_t)n >= cap - 1) return tsr_error_set(TSR_ERR_IO, "cannot read /proc/self/exe");
  buf[n] = '\0';
  char *slash = strrchr(buf, '/');
  if (slash) *slash = '\0';
  return TSR_OK;
}
