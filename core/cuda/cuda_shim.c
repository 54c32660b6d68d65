/*
** The shared object compiles a few core files of its own (dtype, quant,
** tensor: names, sizes and byte spans). Their errors, and the backend's,
** must reach the core's per-thread message, not a copy of it inside the
** .so: these definitions replace core/common/error.c here and forward to the host.
*/
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "cuda_abi.h"

const struct tsr_cuda_host *tsr_cuda_host_table;

tsr_status tsr_error_set(tsr_status st, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (tsr_cuda_host_table) tsr_cuda_host_table->set_error(msg);
  return st;
}

void tsr_error_prefix(const char *fmt, ...) {
  char prefix[512], msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  const char *old = tsr_cuda_host_table ? tsr_cuda_host_table->get_error() : "";
  snprintf(msg, sizeof msg, "%s: %s", prefix, old);
  if (tsr_cuda_host_table) tsr_cuda_host_table->set_error(msg);
}

const char *tsr_error_message(void) {
  return tsr_cuda_host_table ? tsr_cuda_host_table->get_error() : "";
}
