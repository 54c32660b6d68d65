/*
** Opens the CUDA backend, a separate shared object (core/cuda/), so that a
** binary built with it still runs on a machine with no GPU, and one built
** without it still names what is missing when a profile asks for cuda.
**
** Where the .so is looked for, first hit wins:
**   $TESSERA_CUDA_BACKEND        a path to the .so itself
**   <exe dir>/libtessera-cuda.so  an installed or copied tree
**   <exe dir>/../../core/cuda/    the build tree, wherever it was copied
**                                 (executables sit two levels below its root)
**   the build tree this core was compiled in, then the install libdir.
** The library is never closed: the CUDA runtime does not support being
** unloaded while its driver state lives on.
*/
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graph/backend.h"
#include "graph/cuda_settings.h"
#include "graph/dtype.h"
#include "cuda/cuda_abi.h"
#include "common/error.h"
#include "graph/graph_internal.h"
#include "abi/op_registry.h"

#ifndef TSR_BUILD_CUDA_BACKEND
#define TSR_BUILD_CUDA_BACKEND ""
#endif
#ifndef TSR_INSTALL_CUDA_BACKEND
#define TSR_INSTALL_CUDA_BACKEND ""
#endif

#define CUDA_SO "libtessera-cuda.so"

static void host_set_error(const char *message) { tsr_error_set(TSR_OK, "%s", message); }

/* The first candidate that exists, in *path; false if none does. */
static bool find_library(char *path, size_t cap, char *tried, size_t tried_cap) {
  const char *env = getenv("TESSERA_CUDA_BACKEND");
  if (env && *env) {
    snprintf(path, cap, "%s", env);
    snprintf(tried, tried_cap, "%s (from TESSERA_CUDA_BACKEND)", env);
    return access(path, F_OK) == 0;
  }
  char dir[1024];
  const char *cands[4] = {0};
  char beside[1100] = "", tree[1100] = "";
  if (tsr_exe_dir(dir, sizeof dir) == TSR_OK) {
    snprintf(beside, sizeof beside, "%s/" CUDA_SO, dir);
    snprintf(tree, sizeof tree, "%s/../../core/cuda/" CUDA_SO, dir);
    cands[0] = beside;
    cands[1] = tree;
  }
  cands[2] = *TSR_BUILD_CUDA_BACKEND ? TSR_BUILD_CUDA_BACKEND : NULL;
  cands[3] = *TSR_INSTALL_CUDA_BACKEND ? TSR_INSTALL_CUDA_BACKEND : NULL;
  size_t used = 0;
  tried[0] = '\0';
  for (int i = 0; i < 4; i++) {
    if (!cands[i]) continue;
    if (access(cands[i], F_OK) == 0) {
      snprintf(path, cap, "%s", cands[i]);
      return true;
    }
    int n = snprintf(tried + used, tried_cap - used, "%s%s", used ? ", " : "", cands[i]);
    if (n > 0 && (size_t)n < tried_cap - used) used += (size_t)n;
  }
  return false;
}

tsr_status tsr_backend_cuda_new(struct tsr_backend **out) {
  *out = NULL;
  struct tsr_cuda_settings set;
  tsr_cuda_settings_default(&set);
  const char *from_env[TSR_CUDA_N_SETTINGS];
  tsr_status st = tsr_cuda_settings_from_env(&set, from_env);
  if (st == TSR_OK) st = tsr_cuda_settings_resolve(&set, from_env, NULL);
  return st == TSR_OK ? tsr_backend_cuda_open(&set, out) : st;
}

tsr_status tsr_backend_cuda_open(const struct tsr_cuda_settings *settings,
                                 struct tsr_backend **out) {
  *out = NULL;
  char path[PATH_MAX], tried[4096];
  if (!find_library(path, sizeof path, tried, sizeof tried))
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "cuda backend: %s not found (looked at %s); "
                         "this build has no CUDA backend (build with -Dcuda=enabled where nvcc "
                         "is installed) or TESSERA_CUDA_BACKEND names a missing file",
                         CUDA_SO, tried);
  void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    const char *why = dlerror();
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "cuda backend: cannot load %s: %s (the CUDA "
                         "runtime libraries it links, libcublas and libcublasLt, must be on the "
                         "library path)", path, why ? why : "unknown dlopen error");
  }
  tsr_cuda_open_fn open_fn = (tsr_cuda_open_fn)(uintptr_t)dlsym(dl, TSR_CUDA_ENTRY);
  if (!open_fn)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "cuda backend: %s has no entry point %s; it is "
                         "not a tessera CUDA backend", path, TSR_CUDA_ENTRY);
  static const struct tsr_cuda_host host = {
      .abi_version = TSR_CUDA_ABI_VERSION,
      .struct_size = sizeof(struct tsr_cuda_host),
      .tensor_size = sizeof(struct tsr_tensor),
      .graph_size = sizeof(struct tsr_graph),
      .backend_size = sizeof(struct tsr_backend),
      .set_error = host_set_error,
      .get_error = tsr_error_message,
      .custom_op_name = tsr_op_registry_name,
      .custom_op_kernel = tsr_op_registry_resolve,
      .set_device_call = tsr_op_registry_set_device_call,
      .custom_op_replayable = tsr_op_registry_replayable,
      .dtype_traits = tsr_dtype_traits,
      .codec_ops = tsr_dtype_codec_ops,
  };
  tsr_status st = open_fn(&host, settings, out);
  if (st != TSR_OK) {
    *out = NULL;
    tsr_error_prefix("cuda backend (%s)", path);
  }
  return st;
}

tsr_status tsr_backend_keep(struct tsr_backend *b, const void *host, size_t size) {
  return b->i.keep ? b->i.keep(b->context, host, size) : TSR_OK;
}

tsr_status tsr_backend_sync_to_host(struct tsr_backend *b, void *host, size_t size) {
  return b->i.sync_to_host ? b->i.sync_to_host(b->context, host, size) : TSR_OK;
}

tsr_status tsr_backend_sync_to_device(struct tsr_backend *b, const void *host, size_t size) {
  return b->i.sync_to_device ? b->i.sync_to_device(b->context, host, size) : TSR_OK;
}

void tsr_backend_forget(struct tsr_backend *b, const void *host, size_t size) {
  if (b->i.forget) b->i.forget(b->context, host, size);
}

bool tsr_backend_has_device_copies(const struct tsr_backend *b) { return b && b->i.keep; }

tsr_status tsr_backend_probe(struct tsr_backend *b, struct tsr_backend_ceilings *out) {
  return b->i.probe ? b->i.probe(b->context, out) : TSR_ERR_UNSUPPORTED;
}

tsr_status tsr_backend_memory(struct tsr_backend *b, struct tsr_backend_memory *out) {
  return b->i.memory ? b->i.memory(b->context, out) : TSR_ERR_UNSUPPORTED;
}

bool tsr_backend_graph_counts(const struct tsr_backend *b, uint64_t *captures, uint64_t *replays) {
  if (!b || !b->i.graph_counts) return false;
  b->i.graph_counts(b->context, captures, replays);
  return true;
}
