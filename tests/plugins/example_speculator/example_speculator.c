/*
** A speculator written the way a third party would, against the installed
** <tessera/plugin.h> alone: prompt lookup. It finds the latest earlier place
** where the sequence's last `ngram` tokens occurred and proposes the tokens that
** followed them there (no model, no state). The host verifies the proposals in
** one batch and keeps what the target agrees with (the speculator interface). A test
** instrument for the interface; spec_mtp's lookup engine is the real one.
*/
#include <stdlib.h>
#include <tessera/plugin.h>

struct lookup_state {
  int64_t ngram;
};

static tsr_status lookup_draft(void *ctx, const struct tsr_host *host, struct tsr_spec_request *r,
                               int32_t *n_draft) {
  const struct lookup_state *st = ctx;
  (void)host;
  *n_draft = 0;
  const int32_t n = r->n_tokens, g = (int32_t)st->ngram;
  if (n <= g) return TSR_OK;
  const int32_t *tail = r->tokens + n - g;
  /* the latest earlier start whose g tokens equal the tail */
  for (int32_t s = n - g - 1; s >= 0; s--) {
    int32_t k = 0;
    while (k < g && r->tokens[s + k] == tail[k]) k++;
    if (k < g) continue;
    for (int32_t i = s + g; i < n && *n_draft < r->max_draft; i++)
      r->draft[(*n_draft)++] = r->tokens[i];
    return TSR_OK;
  }
  return TSR_OK;
}

static tsr_status lookup_negotiate(void *ctx, const struct tsr_host *host,
                                   const struct tsr_gguf *model) {
  (void)ctx, (void)host, (void)model;
  return TSR_OK; /* needs nothing of the model */
}

static const struct tsr_plugin_setting g_settings[] = {
    {"ngram", TSR_SETTING_INT, 1, 8, "2", NULL, "tokens of the sequence's end to look up"},
};

static tsr_status lookup_init(const struct tsr_host *h, struct tsr_plugin *self) {
  struct lookup_state *st = calloc(1, sizeof *st);
  if (!st) return h->set_error(TSR_ERR_NOMEM, "example_speculator: out of memory");
  h->set_state(self, st);
  tsr_status s = h->setting_i64(self, "ngram", &st->ngram);
  const struct tsr_speculator_v1 spec = {
      .struct_size = sizeof spec,
      .name = "example_lookup",
      .ctx = st,
      .negotiate = lookup_negotiate,
      .draft = lookup_draft,
  };
  if (s == TSR_OK) s = h->register_speculator(self, &spec);
  return s;
}

static void lookup_destroy(const struct tsr_host *h, struct tsr_plugin *self) {
  free(h->get_state(self));
}

static const struct tsr_plugin_iface g_provides[] = {{TSR_IFACE_SPECULATOR, 1}};

static const struct tsr_plugin_descriptor g_descriptor = {
    .abi_major = TSR_PLUGIN_ABI_MAJOR,
    .abi_minor = TSR_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(struct tsr_plugin_descriptor),
    .name = "example_speculator",
    .version = "1.0.0",
    .description = "prompt lookup: proposes what followed the sequence's last n-gram before",
    .provides = g_provides,
    .n_provides = 1,
    .settings = g_settings,
    .n_settings = 1,
    .init = lookup_init,
    .destroy = lookup_destroy,
};

TSR_PLUGIN_EXPORT const struct tsr_plugin_descriptor *tsr_plugin_entry(void) {
  return &g_descriptor;
}
