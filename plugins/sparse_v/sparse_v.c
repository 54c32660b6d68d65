/*
** sparse_v: attention-gated V skipping on decode steps, as a decode policy.
**
** On a layer it acts on, the attention's kernel reads every key, keeps the running
** max and sum of the softmax exact, and skips the V row of a key whose weight against
** the running max, exp(s - m_run), is below `threshold` for every query head that
** shares the row (struct tsr_decode_params): conservative, since the final weight can
** only be smaller. The first `sink` positions and the last `recent` are never skipped.
** The kernels count rows read and skipped and the softmax mass the skipped rows
** carried; the host reports them as this plugin's engagement.
**
** Which layers (`layers`): auto (the default) acts on the full-attention layers of a
** model that also has sliding-window layers (iSWA) when their V is quantized: there
** the global layers' attention is concentrated and a quantized V row is costly to
** read. A model of full attention only gets no static threshold by default (on
** diffuse long-context attention it drops what matters), nor does an f16/bf16/f32 V.
** full, sliding and all name the layers outright. The composition printout says per
** group of layers what the policy does there and why.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tessera/plugin.h>

struct sparse_v {
  const struct tsr_host *host;
  double threshold;
  int64_t sink, recent;
  const char *layers; /* auto | full | sliding | all */
};

static bool unquantized(const char *codec) {
  return !codec || !strcmp(codec, "f16") || !strcmp(codec, "bf16") || !strcmp(codec, "f32");
}

/* Whether the policy acts on the layer; *why says why (or why not) in a few words. */
static bool acts_on(const struct sparse_v *sv, const struct tsr_layer_desc *l, const char **why) {
  if (l->kind == TSR_LAYER_LINEAR) return *why = "recurrent layer", false;
  if (!(sv->threshold > 0.0)) return *why = "threshold 0", false;
  const bool full = l->kind == TSR_LAYER_FULL;
  if (!strcmp(sv->layers, "all")) return *why = "layers: all", true;
  if (!strcmp(sv->layers, "full")) return *why = full ? "layers: full" : "layers: full only", full;
  if (!strcmp(sv->layers, "sliding"))
    return *why = full ? "layers: sliding only" : "layers: sliding", !full;
  /* auto */
  const uint32_t iswa = 1u << TSR_LAYER_FULL | 1u << TSR_LAYER_SLIDING;
  const bool has_kinds = l->struct_size >= offsetof(struct tsr_layer_desc, model_kinds) +
                                               sizeof l->model_kinds;
  if (!has_kinds || (l->model_kinds & iswa) != iswa)
    return *why = "auto: the model is not iSWA; a static threshold is not lossless on full "
                  "attention alone (set layers to force it)",
           false;
  if (!full) return *why = "auto: sliding-window layer", false;
  if (unquantized(l->v_codec)) return *why = "auto: V is not quantized", false;
  return *why = "auto: full-attention layer of an iSWA model, quantized V", true;
}

static tsr_status sv_negotiate(void *ctx, const struct tsr_layer_desc *layer,
                               const struct tsr_attention_v1 *attention) {
  const struct sparse_v *sv = ctx;
  if (!attention->v_skip)
    return sv->host->set_error(TSR_ERR_UNSUPPORTED, "sparse_v skips V rows in the attention "
                               "kernel; attention %s has no V skipping (layer %d)",
                               attention->name, (int)layer->layer);
  return TSR_OK;
}

static tsr_status sv_params(void *ctx, const struct tsr_layer_desc *layer,
                            struct tsr_decode_params *p) {
  const struct sparse_v *sv = ctx;
  const char *why;
  if (!acts_on(sv, layer, &why)) return TSR_OK;
  p->v_skip_threshold = (float)sv->threshold;
  p->sink = (int32_t)sv->sink;
  p->recent = (int32_t)sv->recent;
  return TSR_OK;
}

static void sv_describe(void *ctx, const struct tsr_layer_desc *layer, char *out, size_t n) {
  const char *why;
  acts_on(ctx, layer, &why);
  snprintf(out, n, "%s", why);
}

static const struct tsr_plugin_setting g_settings[] = {
    {"threshold", TSR_SETTING_FLOAT, 0, 0.5, "0.05", NULL,
     "skip a V row whose weight against the running max is below this for every query head "
     "reading it (0: off)"},
    {"layers", TSR_SETTING_ENUM, 0, 0, "auto", "auto|full|sliding|all",
     "where to skip; auto: the full-attention layers of an iSWA model with a quantized V"},
    {"sink", TSR_SETTING_INT, 0, 1 << 30, "64", NULL,
     "keys at positions below this are never skipped (attention sinks)"},
    {"recent", TSR_SETTING_INT, 0, 1 << 30, "256", NULL,
     "keys within this many positions of the query are never skipped"},
};
#define N_SETTINGS (sizeof g_settings / sizeof g_settings[0])

static tsr_status sv_init(const struct tsr_host *h, struct tsr_plugin *self) {
  struct sparse_v *sv = calloc(1, sizeof *sv);
  if (!sv) return h->set_error(TSR_ERR_NOMEM, "sparse_v: out of memory");
  sv->host = h;
  h->set_state(self, sv);
  tsr_status st = h->setting_f64(self, "threshold", &sv->threshold);
  if (st == TSR_OK) st = h->setting_str(self, "layers", &sv->layers);
  if (st == TSR_OK) st = h->setting_i64(self, "sink", &sv->sink);
  if (st == TSR_OK) st = h->setting_i64(self, "recent", &sv->recent);
  const struct tsr_decode_policy_v1 policy = {
      .struct_size = sizeof policy,
      .name = "sparse_v",
      .ctx = sv,
      .negotiate = sv_negotiate,
      .params = sv_params,
      .describe = sv_describe,
  };
  if (st == TSR_OK) st = h->register_decode_policy(self, &policy);
  return st;
}

static void sv_destroy(const struct tsr_host *h, struct tsr_plugin *self) {
  free(h->get_state(self));
}

static const struct tsr_plugin_iface g_provides[] = {{TSR_IFACE_DECODE_POLICY, 1}};

static const struct tsr_plugin_descriptor g_descriptor = {
    .abi_major = TSR_PLUGIN_ABI_MAJOR,
    .abi_minor = TSR_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(struct tsr_plugin_descriptor),
    .name = "sparse_v",
    .version = "0.1.0",
    .description = "attention-gated V skipping during decode",
    .provides = g_provides,
    .n_provides = 1,
    .settings = g_settings,
    .n_settings = N_SETTINGS,
    .init = sv_init,
    .destroy = sv_destroy,
};

TSR_PLUGIN_EXPORT const struct tsr_plugin_descriptor *tsr_plugin_entry(void) {
  return &g_descriptor;
}
