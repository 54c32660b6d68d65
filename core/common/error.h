/* Internal error helpers: set the per-thread message and return the code. */
#ifndef TSR_ERROR_H
#define TSR_ERROR_H

#include "tessera/tessera.h"

#if defined(__GNUC__)
#define TSR_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TSR_PRINTF(a, b)
#endif

/* Formats the message, stores it for tsr_error_message(), returns st. */
tsr_status tsr_error_set(tsr_status st, const char *fmt, ...) TSR_PRINTF(2, 3);

/* Prepends "prefix: " to the current message (adds context on the way up). */
void tsr_error_prefix(const char *fmt, ...) TSR_PRINTF(1, 2);

void tsr_error_clear(void);

/* Directory of the running executable (from /proc/self/exe), for paths that
** must follow a build tree copied elsewhere. */
tsr_status tsr_exe_dir(char *buf, size_t cap);

/* Overflow-checked size arithmetic: return 0 and leave *out untouched on
** overflow. Every size derived from untrusted input goes through these. */
static inline int tsr_size_mul(size_t a, size_t b, size_t *out) {
  size_t r;
  if (__builtin_mul_overflow(a, b, &r)) return 0;
  *out = r;
  return 1;
}
static inline int tsr_size_add(size_t a, size_t b, size_t *out) {
  size_t r;
  if (__builtin_add_overflow(a, b, &r)) return 0;
  *out = r;
  return 1;
}

#endif
