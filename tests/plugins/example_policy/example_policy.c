/*
** A decode policy written the way a third party would, against the installed
** <tessera/plugin.h> alone: it asks every attention layer to skip, on decode
** steps, the V rows whose weight against the running max is below `threshold`,
** never the first `sink` keys nor the last `recent` (struct tsr_decode_params).
** The attention's kernel does the skipping and counts it; the host reports the
** counts as this plugin's engagement (full.v_rows_read, ..., per layer kind). A test
** instrument for the decode_policy interface, not a tuned policy: sparse_v is
** the real one.
*/
#include <stdlib.h>
#include <tessera/plugin.h>

struct policy_state {
  const struct tsr_host *host;
  double threshold;
  int64_t sink, recent;
};

static tsr_status policy_negotiate(void *ctx, const struct tsr_layer_desc *layer,
                                   const struct tsr_attention_v1 *attention) {
  const struct policy_state *st = ctx;
  if (!attention->v_skip)
    return st->host->set_error(TSR_ERR_UNSUPPORTED, "example_policy skips V rows; attention %s "
                               "does not (layer %d)", attention->name, (int)layer->layer);
  return TSR_OK;
}

static tsr_status policy_params(void *ctx, const struct tsr_layer_desc *layer,
                                struct tsr_decode_params *p) {
  const struct policy_state *st = ctx;
  (void)layer;
  p->v_skip_threshold = (float)st->threshold;
  p->sink = (int32_t)st->sink;
  p->recent = (int32_t)st->recent;
  return TSR_OK;
}

static const struct tsr_plugin_setting g_settings[] = {
    {"threshold", TSR_SETTING_FLOAT, 0, 0.5, "0.001", NULL,
     "skip a V row whose weight against the running max is below this (0: off)"},
    {"sink", TSR_SETTING_INT, 0, 1 << 30, "4", NULL, "keys at positions below this are kept"},
    {"recent", TSR_SETTING_INT, 0, 1 << 30, "16", NULL,
     "keys within this many positions of the query are kept"},
};

static tsr_status policy_init(const struct tsr_host *h, struct tsr_plugin *self) {
  struct policy_state *st = calloc(1, sizeof *st);
  if (!st) return h->set_error(TSR_ERR_NOMEM, "example_policy: out of memory");
  st->host = h;
  h->set_state(self, st);
  tsr_status s = h->setting_f64(self, "threshold", &st->threshold);
  if (s == TSR_OK) s = h->setting_i64(self, "sink", &st->sink);
  if (s == TSR_OK) s = h->setting_i64(self, "recent", &st->recent);
  const struct tsr_decode_policy_v1 policy = {
      .struct_size = sizeof policy,
      .name = "example_policy",
      .ctx = st,
      .negotiate = policy_negotiate,
      .params = policy_params,
  };
  if (s == TSR_OK) s = h->register_decode_policy(self, &policy);
  return s;
}

static void policy_destroy(const struct tsr_host *h, struct tsr_plugin *self) {
  free(h->get_state(self));
}

static const struct tsr_plugin_iface g_provides[] = {{TSR_IFACE_DECODE_POLICY, 1}};

static const struct tsr_plugin_descriptor g_descriptor = {
    .abi_major = TSR_PLUGIN_ABI_MAJOR,
    .abi_minor = TSR_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(struct tsr_plugin_descriptor),
    .name = "example_policy",
    .version = "1.0.0",
    .description = "V rows below a threshold skipped on decode steps, with sink and recent guards",
    .provides = g_provides,
    .n_provides = 1,
    .settings = g_settings,
    .n_settings = 3,
    .init = policy_init,
    .destroy = policy_destroy,
};

TSR_PLUGIN_EXPORT const struct tsr_plugin_descriptor *tsr_plugin_entry(void) {
  return &g_descriptor;
}
