/*
** tessera plugin ABI: the services table the host hands a plugin's init()
** and every call after it.
**
** The table's own entries are what every plugin uses: logging, errors, its
** state and settings, registering what it provides, counting what it did.
** Each concern beyond that is a sub-table declared in its interface's header,
** with a struct_size of its own, so each grows on its own minor:
**   host->gguf     reading and checking a model file     (plugin/gguf.h)
**   host->graph    building graphs                       (plugin/graph.h)
**   host->arch     an arch's KV cache and attention      (plugin/arch.h)
**   host->convert  a checkpoint's config and tensors in, GGUF out (plugin/convert.h)
**   host->kernel   plugin ops, their kernels, device calls (plugin/kernel.h)
**   host->spec     a speculator's own draft model (plugin/speculator.h; ABI 2.3)
** A call that fails returns a tsr_status and sets the message the host
** reports; the plugin's own refusals go through set_error the same way.
*/
#ifndef TESSERA_PLUGIN_HOST_H
#define TESSERA_PLUGIN_HOST_H

#include "tessera/plugin/abi.h"
#include "tessera/plugin/arch.h"
#include "tessera/plugin/attention.h"
#include "tessera/plugin/convert.h"
#include "tessera/plugin/decode_policy.h"
#include "tessera/plugin/dtype.h"
#include "tessera/plugin/gguf.h"
#include "tessera/plugin/graph.h"
#include "tessera/plugin/kernel.h"
#include "tessera/plugin/kv_codec.h"
#include "tessera/plugin/speculator.h"

#ifdef __cplusplus
extern "C" {
#endif

enum tsr_log_level { TSR_LOG_DEBUG = 0, TSR_LOG_INFO = 1, TSR_LOG_WARN = 2, TSR_LOG_ERROR = 3 };

struct tsr_host {
  uint32_t abi_major, abi_minor;
  uint32_t struct_size;

  /* logging and errors */
  void (*log)(struct tsr_plugin *self, enum tsr_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
      __attribute__((format(printf, 3, 4)))
#endif
      ;
  /* Sets the message the host reports and returns st. */
  tsr_status (*set_error)(tsr_status st, const char *fmt, ...)
#if defined(__GNUC__)
      __attribute__((format(printf, 2, 3)))
#endif
      ;

  /* plugin state */
  void (*set_state)(struct tsr_plugin *self, void *state);
  void *(*get_state)(const struct tsr_plugin *self);

  /* settings from the profile, validated against the descriptor, with the
  ** declared defaults applied; asking for an undeclared key is an error */
  tsr_status (*setting_i64)(const struct tsr_plugin *self, const char *key, int64_t *out);
  tsr_status (*setting_f64)(const struct tsr_plugin *self, const char *key, double *out);
  tsr_status (*setting_bool)(const struct tsr_plugin *self, const char *key, bool *out);
  tsr_status (*setting_str)(const struct tsr_plugin *self, const char *key, const char **out);

  /* registration: one call per capability, under an interface the descriptor
  ** provides; names must be unique per interface. The host keeps a copy. */
  tsr_status (*register_arch)(struct tsr_plugin *self, const struct tsr_arch_v1 *arch);
  tsr_status (*register_convert)(struct tsr_plugin *self, const struct tsr_convert_v1 *convert);
  tsr_status (*register_attention)(struct tsr_plugin *self, const struct tsr_attention_v1 *impl);
  tsr_status (*register_kv_codec)(struct tsr_plugin *self, const struct tsr_kv_codec_v1 *codec);
  tsr_status (*register_decode_policy)(struct tsr_plugin *self,
                                       const struct tsr_decode_policy_v1 *policy);
  tsr_status (*register_speculator)(struct tsr_plugin *self, const struct tsr_speculator_v1 *spec);

  /* a registered codec of self's host, by name, or by dtype when name is
  ** NULL (what a kernel's K/V tensor holds); NULL when none. It lives as long
  ** as the host. */
  const struct tsr_kv_codec_v1 *(*find_kv_codec)(const struct tsr_plugin *self, const char *name,
                                                 int32_t dtype);

  /* counts what the plugin actually did ("attention_calls", "v_rows_skipped");
  ** --require-engaged NAME fails a run in which NAME counted nothing */
  void (*engaged)(struct tsr_plugin *self, const char *counter, uint64_t n);

  /* the services of each concern (see above) */
  const struct tsr_host_gguf *gguf;
  const struct tsr_host_graph *graph;
  const struct tsr_host_arch *arch;
  const struct tsr_host_convert *convert;
  const struct tsr_host_kernel *kernel;
  /* ABI 2.3 */
  const struct tsr_host_spec *spec;
};

/* The rows of x (a residual [n_embd, n_tokens]) whose logits the host reads
** (tsr_arch_forward.output_rows), or x when it reads every row: an arch calls it
** just before its final norm and LM head, which then work on those rows only. */
static inline struct tsr_tensor *tsr_arch_output_rows(const struct tsr_host *h,
                                                      struct tsr_arch_forward *fw,
                                                      struct tsr_tensor *x) {
  return fw->output_rows ? h->graph->get_rows(fw->g, x, fw->output_rows) : x;
}

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_PLUGIN_HOST_H */
