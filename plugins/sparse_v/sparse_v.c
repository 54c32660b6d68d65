/*
** sparse_v: attention-gated V skipping on decode steps, as a decode policy.
**
** On a layer it acts on, the attention's kernel reads every key, keeps the running
** max and sum of the softmax exact, and skips the V row of a key whose weight against
** the running max, exp(s - m_run), is below `threshold` for every query head that
** shares the row (struct tsr_decode_params): conservative, since the final weight can
** only be smaller. With a mass `budget` (the cpu's kernels), a first pass finds each
** row's final max and sum and a row is skipped only when it weighs under budget /
** (visible keys) of every sharing row's softmax: no row drops more than `budget` of
** its mass. The first `sink` positions and the last `recent` are never skipped. The
** kernels count rows read and skipped and the softmax mass the skipped rows carried;
** the host reports them as this plugin's engagement.
**
** Which layers (`layers`): auto (the default) acts on the full-attention layers of a
** model that also has sliding-window layers (iSWA) when their V is quantized: there
** the global layers' attention is concentrated and a quantized V row is costly to
** read. A model of full attention only gets no static threshold by default (on
** diffuse long-context attention it drops what matters): there auto applies the
** budget alone, when one is set. An f16/bf16/f32 V is left alone. full, sliding and
** all name the layers outright. The composition printout says per group of layers
** what the policy does there and why.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tessera/plugin.h>

struct sparse_v {
  const struct tsr_host *host;
  double threshold, budget;
  int64_t sink, recent;
  const char *layers; /* auto | full | sliding | all */
};

static bool unquantized(const char *codec) {
  return !codec || !strcmp(codec, "f16") || !strcmp(codec, "bf16") || !strcmp(codec, "f32");
}

/* What the policy does on the layer: its threshold and budget (both 0: nothing); *why
** says why, in a few words. */
static void acts_on(const struct sparse_v *sv, const struct tsr_layer_desc *l, float *threshold,
                    float *budget, const char **why) {
  *threshold = 0.0f, *budget = 0.0f;
  if (l->kind == TSR_LAYER_LINEAR) return (void)(*why = "recurrent layer");
  if (!(sv->threshold > 0.0) && !(sv->budget > 0.0))
    return (void)(*why = "threshold and budget 0");
  const bool full = l->kind == TSR_LAYER_FULL;
  bool acts, threshold_too = true;
  if (!strcmp(sv->layers, "all")) {
    acts = true, *why = "layers: all";
  } else if (!strcmp(sv->layers, "full")) {
    acts = full, *why = full ? "layers: full" : "layers: full only";
  } else if (!strcmp(sv->layers, "sliding")) {
    acts = !full, *why = full ? "layers: sliding only" : "layers: sliding";
  } else { /* auto */
    const uint32_t iswa = 1u << TSR_LAYER_FULL | 1u << TSR_LAYER_SLIDING;
    const bool has_kinds = l->struct_size >= offsetof(struct tsr_layer_desc, model_kinds) +
                                                 sizeof l->model_kinds;
    const bool is_iswa = has_kinds && (l->model_kinds & iswa) == iswa;
    if (!full) {
      acts = false, *why = "auto: sliding-window layer";
    } else if (unquantized(l->v_codec)) {
      acts = false, *why = "auto: V is not quantized";
    } else if (is_iswa) {
      acts = true, *why = "auto: full-attention layer of an iSWA model, quantized V";
    } else { /* full attention only: a static threshold is not lossless there */
      acts = sv->budget > 0.0, threshold_too = false;
      *why = acts ? "auto: the model is not iSWA: the mass budget alone"
                  : "auto: the model is not iSWA; a static threshold is not lossless on full "
                    "attention alone (set a budget, or layers to force a threshold)";
    }
  }
  if (!acts) return;
  *threshold = threshold_too ? (float)sv->threshold : 0.0f;
  *budget = (float)sv->budget;
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
  float threshold, budget;
  acts_on(sv, layer, &threshold, &budget, &why);
  if (!(threshold > 0.0f) && !(budget > 0.0f)) return TSR_OK;
  p->v_skip_threshold = threshold;
  if (p->struct_size >= offsetof(struct tsr_decode_params, v_skip_budget) + sizeof(float))
    p->v_skip_budget = budget;
  else if (budget > 0.0f)
    return sv->host->set_error(TSR_ERR_UNSUPPORTED, "sparse_v: this tessera takes no mass "
                               "budget (its decode parameters are older than ABI 2.2)");
  p->sink = (int32_t)sv->sink;
  p->recent = (int32_t)sv->recent;
  return TSR_OK;
}

static void sv_describe(void *ctx, const struct tsr_layer_desc *layer, char *out, size_t n) {
  const char *why;
  float threshold, budget;
  acts_on(ctx, layer, &threshold, &budget, &why);
  snprintf(out, n, "%s", why);
}

static const struct tsr_plugin_setting g_settings[] = {
    {"threshold", TSR_SETTING_FLOAT, 0, 0.5, "0.05", NULL,
     "skip a V row whose weight against the running max is below this for every query head "
     "reading it (0: off)"},
    {"budget", TSR_SETTING_FLOAT, 0, 0.5, "0", NULL,
     "a mass budget (cpu only): skip a V row only while no row drops more than this of its "
     "softmax, against its final normaliser (0: none)"},
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
  if (st == TSR_OK) st = h->setting_f64(self, "budget", &sv->budget);
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
