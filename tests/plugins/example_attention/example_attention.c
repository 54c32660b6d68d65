/*
** An attention implementation written the way a third party would: against
** the installed <tessera/plugin.h> alone (built with pkg-config
** tessera-plugin, never with the source tree). It wraps the core's `flash`
** graph builder and counts the layers it built, so a run can prove it
** engaged (--require-engaged example_attention).
**
** Build flags it honours:
**   -DEXAMPLE_ABI_MAJOR_SKEW=1  claims the next ABI major, -1 the previous one (the
**                               host refuses both)
**   -DEXAMPLE_ABI_MINOR_SKEW=1  claims a newer minor (the host refuses it)
*/
#include <string.h>
#include <tessera/plugin.h>

#ifndef EXAMPLE_ABI_MAJOR_SKEW
#define EXAMPLE_ABI_MAJOR_SKEW 0
#endif
#ifndef EXAMPLE_ABI_MINOR_SKEW
#define EXAMPLE_ABI_MINOR_SKEW 0
#endif

static tsr_status example_negotiate(void *ctx, const struct tsr_layer_desc *layer,
                                    enum tsr_read_path *k_path, enum tsr_read_path *v_path) {
  (void)ctx;
  if (strcmp(layer->backend, "cpu")) return TSR_ERR_UNSUPPORTED;
  *k_path = (!strcmp(layer->k_codec, "f16") || !strcmp(layer->k_codec, "f32")) ? TSR_READ_NATIVE
                                                                               : TSR_READ_LIFT;
  *v_path = (!strcmp(layer->v_codec, "f16") || !strcmp(layer->v_codec, "f32")) ? TSR_READ_NATIVE
                                                                               : TSR_READ_LIFT;
  return TSR_OK;
}

static struct tsr_tensor *example_build(void *ctx, const struct tsr_host *host, struct tsr_graph *g,
                                        const struct tsr_attn_call *call) {
  struct tsr_tensor *out = host->graph->flash_attn(g, call);
  /* ctx is this registration's plugin handle: one library may serve
  ** several hosts in a process, so no global holds it */
  if (out) host->engaged(ctx, "layers_built", 1);
  return out;
}

static const struct tsr_attention_v1 g_attention = {
    .struct_size = sizeof(struct tsr_attention_v1),
    .name = "example_attention",
    .negotiate = example_negotiate,
    .build = example_build,
};

static const struct tsr_plugin_setting g_settings[] = {
    {"verbose", TSR_SETTING_BOOL, 1, 0, "false", NULL, "log each layer built"},
};

static tsr_status example_init(const struct tsr_host *host, struct tsr_plugin *self) {
  bool verbose = false;
  tsr_status st = host->setting_bool(self, "verbose", &verbose);
  if (st != TSR_OK) return st;
  if (verbose) host->log(self, TSR_LOG_INFO, "loaded; wrapping flash");
  struct tsr_attention_v1 attention = g_attention; /* the host keeps a copy */
  attention.ctx = self;
  return host->register_attention(self, &attention);
}

static const struct tsr_plugin_iface g_provides[] = {{TSR_IFACE_ATTENTION, 1}};

static const struct tsr_plugin_descriptor g_descriptor = {
    .abi_major = TSR_PLUGIN_ABI_MAJOR + EXAMPLE_ABI_MAJOR_SKEW,
    .abi_minor = TSR_PLUGIN_ABI_MINOR + EXAMPLE_ABI_MINOR_SKEW,
    .struct_size = sizeof(struct tsr_plugin_descriptor),
    .name = "example_attention",
    .version = "1.0.0",
    .description = "flash, wrapped by a third party, counting the layers it builds",
    .provides = g_provides,
    .n_provides = 1,
    .settings = g_settings,
    .n_settings = 1,
    .init = example_init,
};

TSR_PLUGIN_EXPORT const struct tsr_plugin_descriptor *tsr_plugin_entry(void) {
  return &g_descriptor;
}
