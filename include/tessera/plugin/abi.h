/*
** tessera plugin ABI: its version, the descriptor a plugin exports, interface
** names and the vocabulary the interfaces share. tessera/plugin.h describes
** the ABI as a whole.
**
** Growth: every struct of the ABI but struct tsr_arch_layer (an array
** element) carries a struct_size. Within a major, a later minor only appends
** fields at the end of a struct or of a services sub-table, each group under a
** comment "ABI 2.N" naming the minor that added it, and bumps
** TSR_PLUGIN_ABI_MINOR; nothing is removed or reordered. Whoever reads a
** struct the other side filled checks its struct_size before touching a
** field appended after the minor that side was built for. Fields without such
** a comment are ABI 2.0's, present in every struct of major 2.
*/
#ifndef TESSERA_PLUGIN_ABI_H
#define TESSERA_PLUGIN_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tessera/tessera.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TSR_PLUGIN_ABI_MAJOR 2
#define TSR_PLUGIN_ABI_MINOR 7
#define TSR_PLUGIN_ENTRY_SYMBOL "tsr_plugin_entry"

#if defined(__GNUC__)
#define TSR_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define TSR_PLUGIN_EXPORT
#endif

/* Interface names (each interface is version 1 in ABI major 2). */
#define TSR_IFACE_ARCH "arch"
#define TSR_IFACE_CONVERT "convert"
#define TSR_IFACE_ATTENTION "attention"
#define TSR_IFACE_KV_CODEC "kv_codec"
#define TSR_IFACE_DECODE_POLICY "decode_policy"
#define TSR_IFACE_SPECULATOR "speculator"

/* Opaque to plugins. */
struct tsr_plugin; /* the host's handle for one loaded plugin */
struct tsr_graph;
struct tsr_tensor;
struct tsr_gguf;   /* the host's validated GGUF reader, read through host calls */
struct tsr_convert; /* the host's context for one `tessera convert` run */
struct tsr_kv_cache; /* the host's KV cache */
struct tsr_host;     /* the services table (host.h) */

/* ---- descriptor ---------------------------------------------------------- */

struct tsr_plugin_iface {
  const char *name;  /* one of TSR_IFACE_* */
  uint32_t version;  /* interface version */
};

enum tsr_setting_type {
  TSR_SETTING_INT = 0,
  TSR_SETTING_FLOAT = 1,
  TSR_SETTING_BOOL = 2,
  TSR_SETTING_STRING = 3,
  TSR_SETTING_ENUM = 4, /* a string from `choices` */
};

/* A setting the plugin accepts from the profile (plugins[].settings). The
** host validates the profile against these before init (type, range,
** choices) and reports FILE:LINE:COL of a bad value. */
struct tsr_plugin_setting {
  const char *key;
  enum tsr_setting_type type;
  double min, max;           /* INT and FLOAT; min > max means unbounded */
  const char *default_value; /* as the profile would write it */
  const char *choices;       /* ENUM: "a|b|c" */
  const char *description;
};

struct tsr_plugin_descriptor {
  uint32_t abi_major;  /* TSR_PLUGIN_ABI_MAJOR the plugin was built with */
  uint32_t abi_minor;
  uint32_t struct_size; /* sizeof(struct tsr_plugin_descriptor) at build */
  const char *name;     /* matches the folder and plugin.ini name */
  const char *version;  /* the plugin's own version, "1.2.0" */
  const char *description;
  const struct tsr_plugin_iface *provides;
  uint32_t n_provides;
  const struct tsr_plugin_iface *requires;
  uint32_t n_requires;
  const struct tsr_plugin_setting *settings;
  uint32_t n_settings;
  /* Registers the plugin's capabilities. A failure rolls back everything
  ** it registered; the message set through host->set_error is reported. */
  tsr_status (*init)(const struct tsr_host *host, struct tsr_plugin *self);
  /* Frees what init made (state from host->get_state). May be NULL. */
  void (*destroy)(const struct tsr_host *host, struct tsr_plugin *self);
};

typedef const struct tsr_plugin_descriptor *(*tsr_plugin_entry_fn)(void);

/* ---- shared vocabulary ------------------------------------------------- */

enum tsr_layer_kind {
  TSR_LAYER_FULL = 0,    /* global attention over the whole context */
  TSR_LAYER_SLIDING = 1, /* sliding-window attention */
  TSR_LAYER_LINEAR = 2,  /* linear / recurrent (no KV; state slots) */
  TSR_LAYER_KIND_COUNT = 3,
};

/* How an attention implementation reads a KV codec. */
enum tsr_read_path {
  TSR_READ_NONE = 0,        /* cannot read it */
  TSR_READ_NATIVE = 1,      /* the codec is a float type the kernel reads as is */
  TSR_READ_LIFT = 2,        /* decoded to f16 before the kernel */
  TSR_READ_IN_REGISTER = 3, /* decoded inside the kernel */
};

/* What the host knows about one attention layer when it negotiates. */
struct tsr_layer_desc {
  uint32_t struct_size;
  int32_t layer;             /* index in the model */
  enum tsr_layer_kind kind;
  int32_t n_head, n_head_kv;
  int32_t head_dim_k, head_dim_v; /* as the kernel sees them: the codecs' storage dims */
  int32_t window;            /* SLIDING: window in tokens; else 0 */
  const char *k_codec, *v_codec;
  const char *backend;       /* "cpu", "cuda" */
  /* ABI 2.2 */
  uint32_t model_kinds;      /* bit k set: the model has a layer of kind k (an iSWA
                             ** model has TSR_LAYER_SLIDING's and TSR_LAYER_FULL's) */
};

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_PLUGIN_ABI_H */
