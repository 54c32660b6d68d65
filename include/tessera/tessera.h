/*
** tessera — public embedding API.
**
** Every fallible call returns a tsr_status; on failure the message that
** names what went wrong (file, field, layer) is kept per thread and read
** with tsr_error_message(). The message stays valid until the next failing
** call on the same thread.
*/
#ifndef TESSERA_H
#define TESSERA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TSR_VERSION_MAJOR 0
#define TSR_VERSION_MINOR 1
#define TSR_VERSION_PATCH 0

enum tsr_status {
  TSR_OK = 0,
  TSR_ERR_INVALID_ARG,   /* a caller passed something impossible */
  TSR_ERR_IO,            /* open/read/write/mmap failed */
  TSR_ERR_FORMAT,        /* malformed input file or data */
  TSR_ERR_UNSUPPORTED,   /* well-formed but not something this build does */
  TSR_ERR_NOMEM,         /* allocation failed or a size overflowed */
  TSR_ERR_INTERNAL,      /* a broken invariant inside tessera */
};
typedef enum tsr_status tsr_status;

/* The message of the last failure on this thread ("" if none). */
const char *tsr_error_message(void);

/* Human name of a status code, e.g. "format error". */
const char *tsr_status_name(tsr_status st);

/* Version string of the linked library, e.g. "0.1.0". */
const char *tsr_version(void);

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_H */
