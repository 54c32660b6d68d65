/*
** host->spec (plugin/speculator.h): a draft model a speculator runs, one engine of
** its own opened through the embedding API under the built-in default profile,
** holding one sequence (ABI 2.3); the target's own NextN head and a drafter reading the
** target's K/V (ABI 2.4).
*/
#include <stdlib.h>
#include <string.h>

#include "api/embed.h"
#include "abi/plugin_host.h"
#include "abi/setup.h"
#include "engine/engine.h"
#include "common/error.h"
#include "model/tokenizer.h"
#include "tessera/plugin.h"

struct tsr_spec_model {
  tsr_engine *e;
  int32_t n_vocab;
};

/* Whether the draft's vocabulary is the target's: the same tokens, the same bytes each. */
static tsr_status same_vocabulary(const struct tsr_gguf *target, const struct tsr_gguf *draft,
                                  const char *model) {
  struct tsr_tokenizer *tok = NULL, *dtok = NULL;
  tsr_status st = tsr_tokenizer_load(target, &tok);
  if (st == TSR_OK && (st = tsr_tokenizer_load(draft, &dtok)) != TSR_OK)
    tsr_error_prefix("draft model %s", model);
  const int32_t n = st == TSR_OK ? tsr_tokenizer_n_vocab(tok) : 0;
  const int32_t n_draft = st == TSR_OK ? tsr_tokenizer_n_vocab(dtok) : 0;
  if (st == TSR_OK && n != n_draft)
    st = tsr_error_set(TSR_ERR_UNSUPPORTED, "draft model %s has %d tokens, the target %d: a "
                       "draft must share the target's vocabulary", model, n_draft, n);
  for (int32_t id = 0; st == TSR_OK && id < n; id++) {
    size_t a = 0, b = 0;
    const char *pa = tsr_tokenizer_piece(tok, id, &a), *pb = tsr_tokenizer_piece(dtok, id, &b);
    if (!pa || !pb || a != b || memcmp(pa, pb, a))
      st = tsr_error_set(TSR_ERR_UNSUPPORTED, "draft model %s: token %d is '%.*s' there and "
                         "'%.*s' in the target: a draft must share the target's vocabulary",
                         model, id, pb ? (int)(b < 40 ? b : 40) : 0, pb ? pb : "",
                         pa ? (int)(a < 40 ? a : 40) : 0, pa ? pa : "");
  }
  tsr_tokenizer_free(tok);
  tsr_tokenizer_free(dtok);
  return st;
}

static tsr_status model_open(const struct tsr_gguf *target, const char *model,
                             const char *const *sets, int n_sets, struct tsr_spec_model **out) {
  *out = NULL;
  if (!model || !*model)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "draft model: no GGUF path given");
  struct tsr_spec_model *m = calloc(1, sizeof *m);
  if (!m) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  tsr_status st = tsr_engine_open(NULL, model, sets, n_sets, &m->e);
  if (st != TSR_OK) {
    tsr_error_prefix("draft model %s", model);
    free(m);
    return st;
  }
  m->n_vocab = tsr_engine_n_vocab(m->e);
  if (target && (st = same_vocabulary(target, tsr_engine_setup(m->e)->model, model)) != TSR_OK) {
    tsr_engine_close(m->e);
    free(m);
    return st;
  }
  *out = m;
  return TSR_OK;
}

static void model_close(struct tsr_spec_model *m) {
  if (!m) return;
  tsr_engine_close(m->e);
  free(m);
}

static int32_t model_n_vocab(const struct tsr_spec_model *m) { return m->n_vocab; }

static tsr_status model_sync(struct tsr_spec_model *m, const int32_t *tokens, int32_t n,
                             float *logits) {
  if (n < 1) return tsr_error_set(TSR_ERR_INVALID_ARG, "draft model: sync to %d tokens", n);
  int32_t keep;
  tsr_status st = tsr_embed_hold_prefix(m->e, 0, tokens, n, &keep);
  return st != TSR_OK ? st : tsr_engine_eval(m->e, 0, tokens + keep, n - keep, logits, NULL);
}

static tsr_status model_step(struct tsr_spec_model *m, int32_t token, float *logits) {
  return tsr_engine_eval(m->e, 0, &token, 1, logits, NULL);
}

static tsr_status target_nextn(struct tsr_spec_target *t, int32_t seq, const int32_t *tokens,
                               const int32_t *pos, const float *hidden, int32_t n, float *logits,
                               float *hidden_out) {
  if (!t) return tsr_error_set(TSR_ERR_INVALID_ARG, "NextN: no target engine given");
  return tsr_engine_nextn((struct tsr_engine *)t, seq, tokens, pos, hidden, n, logits,
                          hidden_out);
}

struct tsr_spec_drafter {
  struct tsr_setup *setup;
};

static tsr_status drafter_open(const struct tsr_gguf *target, const char *model,
                               struct tsr_spec_drafter **out) {
  *out = NULL;
  if (!model || !*model) return tsr_error_set(TSR_ERR_INVALID_ARG, "drafter: no GGUF path given");
  struct tsr_spec_drafter *d = calloc(1, sizeof *d);
  if (!d) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  const struct tsr_engine_options opt = {.model_path = model};
  tsr_status st = tsr_engine_load_setup(&opt, &d->setup);
  if (st != TSR_OK) tsr_error_prefix("drafter %s", model);
  for (int32_t l = 0; st == TSR_OK && l < d->setup->n_layers; l++)
    if (d->setup->layers[l].kv_shared_from >= 0)
      st = tsr_error_set(TSR_ERR_UNSUPPORTED, "%s is not a drafter: its layer %d has K/V of its "
                         "own (engine draft_model runs a separate model)", model, l);
  if (st == TSR_OK && !d->setup->arch->build)
    st = tsr_error_set(TSR_ERR_UNSUPPORTED, "drafter %s: arch plugin %s builds no graphs", model,
                       tsr_plugin_name(d->setup->arch_owner));
  if (st == TSR_OK && target) st = same_vocabulary(target, d->setup->model, model);
  if (st != TSR_OK) {
    tsr_setup_free(d->setup);
    free(d);
    return st;
  }
  *out = d;
  return TSR_OK;
}

static void drafter_close(struct tsr_spec_drafter *d) {
  if (!d) return;
  tsr_setup_free(d->setup);
  free(d);
}

static tsr_status drafter_step(struct tsr_spec_drafter *d, struct tsr_spec_target *t,
                               int32_t seq, int32_t token, int32_t pos, const float *hidden,
                               float *logits, float *hidden_out) {
  if (!d || !t) return tsr_error_set(TSR_ERR_INVALID_ARG, "drafter step: no drafter or target");
  return tsr_engine_drafter_step((struct tsr_engine *)t, d->setup, seq, token, pos, hidden,
                                 logits, hidden_out);
}

const struct tsr_host_spec tsr_host_spec_services = {
    .struct_size = sizeof(struct tsr_host_spec),
    .open = model_open,
    .close = model_close,
    .n_vocab = model_n_vocab,
    .sync = model_sync,
    .step = model_step,
    .nextn = target_nextn,
    .open_drafter = drafter_open,
    .close_drafter = drafter_close,
    .drafter_step = drafter_step,
};
