/* The layer plan a loaded arch plugin's describe() makes from a GGUF file,
** shared by the arch plugins' tests. Needs harness.h included first. */
#ifndef TSR_ARCH_TEST_UTIL_H
#define TSR_ARCH_TEST_UTIL_H

#include "model/gguf.h"
#include "abi/plugin_host.h"

/* Loads plugin from plugin_dir into a fresh host, opens path and describes
** it with the arch its general.architecture names (up to 64 layers). */
static inline tsr_status tsr_test_describe(const char *plugin, const char *plugin_dir,
                                           const char *path, struct tsr_arch_layer *layers,
                                           int32_t *n) {
  struct tsr_plugin_host *h;
  struct tsr_gguf *g;
  CHECK_OK(tsr_plugin_host_new(&h));
  CHECK_OK(tsr_plugin_host_load(h, plugin, plugin_dir, NULL, 0, NULL));
  tsr_status st = tsr_gguf_open(path, &g);
  if (st == TSR_OK) {
    const char *arch = "";
    CHECK_OK(tsr_gguf_get_str(g, "general.architecture", &arch));
    const struct tsr_arch_v1 *a = tsr_plugin_host_arch(h, arch, NULL);
    CHECK(a != NULL);
    st = a ? a->describe(a->ctx, tsr_plugin_host_services(), g, layers, 64, n) : TSR_ERR_INTERNAL;
    tsr_gguf_close(g);
  }
  tsr_plugin_host_free(h);
  return st;
}

#endif
