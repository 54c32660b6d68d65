/* State shared by the plugin host's files (loading, registry, negotiation). */
#ifndef TSR_PLUGIN_HOST_INTERNAL_H
#define TSR_PLUGIN_HOST_INTERNAL_H

#include <pthread.h>

#include "abi/plugin_host.h"

#define TSR_HOST_MAX_PLUGINS 64
#define TSR_HOST_MAX_DIRS 16
#define TSR_HOST_MAX_CAPS 64
#define TSR_CODEC_MAX_KERNEL_SETS 8 /* device backends one kv codec has kernels for */
#define TSR_PLUGIN_MAX_SETTINGS 32
#define TSR_PLUGIN_MAX_COUNTERS 16

struct plugin_setting {
  const struct tsr_plugin_setting *decl;
  char value[256]; /* validated text; the declared default when the profile is silent */
};

struct plugin_counter {
  char name[48];
  uint64_t value;
};

struct tsr_plugin {
  struct tsr_plugin_host *host;
  const struct tsr_plugin_descriptor *desc;
  struct tsr_manifest manifest; /* empty for the built-in core */
  char library[1024];           /* "" for the built-in core */
  void *state;
  struct plugin_setting settings[TSR_PLUGIN_MAX_SETTINGS];
  int n_settings;
  struct plugin_counter counters[TSR_PLUGIN_MAX_COUNTERS];
  int n_counters;
};

/* One registered capability: a copy of the plugin's struct (up to the size
** both sides know) and its owner. */
struct registered {
  struct tsr_plugin *owner;
  union {
    struct tsr_attention_v1 attention;
    struct tsr_kv_codec_v1 codec;
    struct tsr_arch_v1 arch;
    struct tsr_convert_v1 convert;
    struct tsr_decode_policy_v1 policy;
    struct tsr_speculator_v1 speculator;
  } u;
  /* a kv codec's kernel sets, copied: u.codec.kernels points here (the plugin's
  ** array need not outlive its registration) */
  struct tsr_kv_codec_kernels codec_kernels[TSR_CODEC_MAX_KERNEL_SETS];
};

struct cap_list {
  struct registered items[TSR_HOST_MAX_CAPS];
  int n;
};

struct tsr_plugin_host {
  struct tsr_plugin *plugins[TSR_HOST_MAX_PLUGINS];
  int n_plugins;
  char dirs[TSR_HOST_MAX_DIRS][1024];
  int n_dirs, n_caller_dirs;
  struct cap_list attention, codecs, archs, converters, policies, speculators;
  pthread_mutex_t counter_lock;
};

/* The built-in core plugin's descriptor (core/abi/builtin_plugin.c). */
const struct tsr_plugin_descriptor *tsr_builtin_core_descriptor(void);

/* Removes every capability a plugin registered (init failed). */
void tsr_plugin_host_unregister(struct tsr_plugin_host *h, const struct tsr_plugin *p);

#endif
