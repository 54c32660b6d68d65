/*
** spec_mtp: speculative decoding engines behind the one speculator interface
** (tessera/plugin/speculator.h). The host evaluates each draft with its token in
** one batch, verifies it (greedy, or speculative sampling) and rolls back what
** it rejects; an engine only proposes.
**
**   lookup       prompt lookup: the tokens that followed the latest earlier
**                occurrence of the sequence's last n-gram (longest first).
**   draft_model  a separate GGUF with the target's vocabulary (host->spec opens
**                it, checking the vocabulary), drafting greedily from its own
**                KV cache, which follows the sequence by prefix reuse.
**
** The draft length adapts per sequence (setting adaptive): it grows by one when
** a whole draft was kept and falls to what was kept plus one when not, within
** [n_min, n_max]. draft_model stops a draft early where its own top token's
** probability is below p_min.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tessera/plugin.h>

#define MAX_SEQ 64

struct cand {
  int32_t id;
  float logit;
};

enum engine { ENGINE_LOOKUP, ENGINE_DRAFT_MODEL, ENGINE_NEXTN, ENGINE_ASSISTANT };

struct spec_state {
  enum engine engine;
  int64_t n_max, n_min, ngram_max, ngram_min, draft_context, draft_threads;
  double p_min;
  bool adaptive;
  const char *model, *draft_backend;
  struct tsr_plugin *self;
  struct tsr_spec_model *draft;
  float *logits; /* the draft model's, n_vocab */
  int32_t n_vocab;
  struct cand *cand; /* draw()'s ranking and weights, n_vocab each */
  double *weight;
  /* per sequence: the draft length to ask for next, and the last draft's length */
  int32_t n_next[MAX_SEQ], n_last[MAX_SEQ];
};

static const char *const g_engines[] = {"lookup", "draft_model", "nextn", "assistant", NULL};

/* ---- lookup ---- */

/* Proposes what followed the latest earlier occurrence of the last g tokens, for the
** longest g in [ngram_min, ngram_max] that occurs. */
static int32_t lookup(const struct spec_state *st, const int32_t *t, int32_t n, int32_t want,
                      int32_t *out) {
  for (int32_t g = (int32_t)st->ngram_max; g >= (int32_t)st->ngram_min; g--) {
    if (n <= g) continue;
    const int32_t *tail = t + n - g;
    for (int32_t s = n - g - 1; s >= 0; s--) {
      if (memcmp(t + s, tail, (size_t)g * sizeof *t)) continue;
      int32_t k = 0;
      for (int32_t i = s + g; i < n && k < want; i++) out[k++] = t[i];
      return k;
    }
  }
  return 0;
}

/* ---- draft_model ---- */

/* Candidates a sampled draft is drawn from: only tokens within this many nats of the top
** logit (at temperature 1) are ranked; the rest get probability 0 in the distribution
** handed to the host, which is then exactly the one drawn from. */
#define DRAFT_LOGIT_SPAN 16.0

static int by_logit(const void *a, const void *b) {
  const struct cand *x = a, *y = b;
  return x->logit > y->logit ? -1 : x->logit < y->logit ? 1 : (x->id > y->id) - (x->id < y->id);
}

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Draws a token from the draft's logits with the run's sampling (top-k, top-p and min-p at
** temperature 1, then the temperature: the host's chain), writing the distribution it drew
** from into q (n_q floats, zero outside the candidates); false when no token is finite. */
static bool draw(struct spec_state *st, const float *logits, const struct tsr_spec_request *r,
                 uint64_t *rng, float *q, int32_t n_q, int32_t *token) {
  const int32_t V = st->n_vocab < n_q ? st->n_vocab : n_q;
  float top = -INFINITY;
  for (int32_t i = 0; i < V; i++)
    if (logits[i] > top) top = logits[i];
  if (!isfinite(top)) return false;
  int32_t n = 0;
  for (int32_t i = 0; i < V; i++)
    if (logits[i] >= top - DRAFT_LOGIT_SPAN) st->cand[n++] = (struct cand){i, logits[i]};
  qsort(st->cand, (size_t)n, sizeof *st->cand, by_logit);
  if (r->top_k > 0 && r->top_k < n) n = r->top_k;
  double total = 0;
  for (int32_t i = 0; i < n; i++) total += exp((double)st->cand[i].logit - top);
  if (r->top_p < 1) { /* the shortest prefix reaching top_p, the crossing token kept */
    double cum = 0;
    for (int32_t i = 0; i < n; i++)
      if ((cum += exp((double)st->cand[i].logit - top)) >= r->top_p * total) {
        n = i + 1;
        break;
      }
  }
  if (r->min_p > 0)
    while (n > 1 && st->cand[n - 1].logit < top + log(r->min_p)) n--;
  memset(q, 0, (size_t)n_q * sizeof *q);
  double sum = 0;
  for (int32_t i = 0; i < n; i++)
    sum += st->weight[i] = exp(((double)st->cand[i].logit - top) / r->temperature);
  const double u = (double)(splitmix64(rng) >> 11) * 0x1.0p-53 * sum;
  double cum = 0;
  *token = st->cand[n - 1].id;
  for (int32_t i = 0; i < n; i++) {
    q[st->cand[i].id] = (float)(st->weight[i] / sum);
    if ((cum += st->weight[i]) > u && cum - st->weight[i] <= u) *token = st->cand[i].id;
  }
  return q[*token] > 0;
}

static int32_t argmax(const float *v, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; i++)
    if (v[i] > v[best]) best = i;
  return best;
}

/* Whether the draft's top token (at temperature 1) has probability p_min or more. */
static bool sure_enough(const float *v, int32_t n, int32_t top, double p_min) {
  if (p_min <= 0) return true; /* no softmax over the vocabulary when nothing is cut */
  double sum = 0;
  for (int32_t i = 0; i < n; i++) sum += exp((double)v[i] - v[top]);
  return 1.0 / sum >= p_min;
}

/* Greedy drafts at temperature 0; above it, drafts drawn from the draft model's own
** sampling distribution, handed to the host (r->draft_dist) for speculative sampling. The
** draws are seeded by the sequence itself, so a run is reproducible from its own seed. */
static tsr_status draft_model(struct spec_state *st, const struct tsr_host *host,
                              struct tsr_spec_request *r, int32_t want, int32_t *n_out) {
  *n_out = 0;
  const bool sampled = r->temperature > 0 && r->draft_dist && r->n_vocab > 0;
  uint64_t rng = 0x7370656354746b73ull;
  for (int32_t i = 0; sampled && i < r->n_tokens; i++) /* FNV-1a over the sequence */
    rng = (rng ^ (uint32_t)r->tokens[i]) * 0x100000001b3ull;
  tsr_status s = host->spec->sync(st->draft, r->tokens, r->n_tokens, st->logits);
  for (int32_t k = 0; s == TSR_OK && k < want; k++) {
    int32_t x = argmax(st->logits, st->n_vocab);
    /* the draft is unsure: the target decides from here */
    if (!sure_enough(st->logits, st->n_vocab, x, st->p_min)) break;
    if (sampled &&
        !draw(st, st->logits, r, &rng, r->draft_dist + (size_t)k * r->n_vocab, r->n_vocab, &x))
      break;
    r->draft[(*n_out)++] = x;
    if (k + 1 < want) s = host->spec->step(st->draft, x, st->logits);
  }
  r->dist_given = sampled && *n_out > 0;
  return s;
}

/* ---- the speculator ---- */

static tsr_status spec_draft(void *ctx, const struct tsr_host *host, struct tsr_spec_request *r,
                             int32_t *n_draft) {
  struct spec_state *st = ctx;
  *n_draft = 0;
  if (r->seq < 0 || r->seq >= MAX_SEQ)
    return host->set_error(TSR_ERR_UNSUPPORTED, "spec_mtp: sequence %d (it keeps %d)", r->seq,
                           MAX_SEQ);
  int32_t want = st->adaptive ? st->n_next[r->seq] : (int32_t)st->n_max;
  if (want > r->max_draft) want = r->max_draft;
  if (want <= 0) return TSR_OK;
  tsr_status s = TSR_OK;
  if (st->engine == ENGINE_LOOKUP)
    *n_draft = lookup(st, r->tokens, r->n_tokens, want, r->draft);
  else
    s = draft_model(st, host, r, want, n_draft);
  st->n_last[r->seq] = *n_draft;
  return s;
}

static void spec_accepted(void *ctx, int32_t seq, int32_t n_accepted) {
  struct spec_state *st = ctx;
  if (seq < 0 || seq >= MAX_SEQ || !st->adaptive || st->n_last[seq] == 0) return;
  int32_t next = n_accepted == st->n_last[seq] ? st->n_last[seq] + 1 : n_accepted + 1;
  if (next > st->n_max) next = (int32_t)st->n_max;
  if (next < st->n_min) next = (int32_t)st->n_min;
  st->n_next[seq] = next;
}

static tsr_status spec_negotiate(void *ctx, const struct tsr_host *host,
                                 const struct tsr_gguf *model) {
  struct spec_state *st = ctx;
  if (st->engine == ENGINE_NEXTN || st->engine == ENGINE_ASSISTANT)
    return host->set_error(TSR_ERR_UNSUPPORTED, "spec_mtp: engine %s is not built yet (built: "
                           "lookup, draft_model)", g_engines[st->engine]);
  if (st->n_min > st->n_max)
    return host->set_error(TSR_ERR_INVALID_ARG, "spec_mtp: n_min %lld is above n_max %lld",
                           (long long)st->n_min, (long long)st->n_max);
  if (st->ngram_min > st->ngram_max)
    return host->set_error(TSR_ERR_INVALID_ARG, "spec_mtp: ngram_min %lld is above ngram_max "
                           "%lld", (long long)st->ngram_min, (long long)st->ngram_max);
  if (st->engine == ENGINE_LOOKUP) {
    if (st->model && *st->model)
      return host->set_error(TSR_ERR_INVALID_ARG, "spec_mtp: model is set, but engine lookup "
                             "uses no model (engine: draft_model drafts with one)");
    return TSR_OK;
  }
  if (!st->model || !*st->model)
    return host->set_error(TSR_ERR_INVALID_ARG, "spec_mtp: engine draft_model needs a model "
                           "(the draft GGUF's path)");
  if (st->draft) return TSR_OK; /* a second negotiation of the same plugin */
  char context[48], threads[48], backend[64];
  const char *sets[3];
  int n = 0;
  snprintf(context, sizeof context, "context=%lld", (long long)st->draft_context);
  sets[n++] = context;
  if (st->draft_threads > 0) {
    snprintf(threads, sizeof threads, "threads=%lld", (long long)st->draft_threads);
    sets[n++] = threads;
  }
  snprintf(backend, sizeof backend, "backend=%s", st->draft_backend);
  sets[n++] = backend;
  tsr_status s = host->spec->open(model, st->model, sets, n, &st->draft);
  if (s != TSR_OK) return s;
  st->n_vocab = host->spec->n_vocab(st->draft);
  st->logits = malloc((size_t)st->n_vocab * sizeof *st->logits);
  st->cand = malloc((size_t)st->n_vocab * sizeof *st->cand);
  st->weight = malloc((size_t)st->n_vocab * sizeof *st->weight);
  if (!st->logits || !st->cand || !st->weight)
    return host->set_error(TSR_ERR_NOMEM, "spec_mtp: out of memory");
  return TSR_OK;
}

static const struct tsr_plugin_setting g_settings[] = {
    {"engine", TSR_SETTING_ENUM, 0, 0, "lookup", "lookup|draft_model|nextn|assistant",
     "what drafts: lookup (prompt n-grams) or draft_model (a separate GGUF); nextn and "
     "assistant are not built yet"},
    {"n_max", TSR_SETTING_INT, 1, 8, "4", NULL, "tokens a draft proposes at most"},
    {"n_min", TSR_SETTING_INT, 1, 8, "1", NULL, "the adaptive length's floor"},
    {"adaptive", TSR_SETTING_BOOL, 0, 0, "true", NULL,
     "adapt the draft length per sequence to what the target kept (else always n_max)"},
    {"ngram_max", TSR_SETTING_INT, 1, 16, "4", NULL, "lookup: the longest n-gram matched"},
    {"ngram_min", TSR_SETTING_INT, 1, 16, "2", NULL, "lookup: the shortest n-gram matched"},
    {"model", TSR_SETTING_STRING, 0, 0, "", NULL, "draft_model: the draft GGUF's path"},
    {"p_min", TSR_SETTING_FLOAT, 0, 1, "0.5", NULL,
     "draft_model: stop a draft where the draft's top token has a lower probability"},
    {"draft_context", TSR_SETTING_INT, 64, 16777216, "4096", NULL,
     "draft_model: the draft model's context"},
    {"draft_threads", TSR_SETTING_INT, 0, 4096, "0", NULL,
     "draft_model: its CPU threads (0: the default profile's)"},
    {"draft_backend", TSR_SETTING_ENUM, 0, 0, "cpu", "cpu|cuda",
     "draft_model: where the draft model runs"},
};
#define N_SETTINGS (sizeof g_settings / sizeof g_settings[0])

static tsr_status spec_init(const struct tsr_host *h, struct tsr_plugin *self) {
  struct spec_state *st = calloc(1, sizeof *st);
  if (!st) return h->set_error(TSR_ERR_NOMEM, "spec_mtp: out of memory");
  h->set_state(self, st);
  st->self = self;
  const char *engine = NULL;
  tsr_status s = h->setting_str(self, "engine", &engine);
  for (int i = 0; s == TSR_OK && g_engines[i]; i++)
    if (!strcmp(engine, g_engines[i])) st->engine = (enum engine)i;
  if (s == TSR_OK) s = h->setting_i64(self, "n_max", &st->n_max);
  if (s == TSR_OK) s = h->setting_i64(self, "n_min", &st->n_min);
  if (s == TSR_OK) s = h->setting_bool(self, "adaptive", &st->adaptive);
  if (s == TSR_OK) s = h->setting_i64(self, "ngram_max", &st->ngram_max);
  if (s == TSR_OK) s = h->setting_i64(self, "ngram_min", &st->ngram_min);
  if (s == TSR_OK) s = h->setting_str(self, "model", &st->model);
  if (s == TSR_OK) s = h->setting_f64(self, "p_min", &st->p_min);
  if (s == TSR_OK) s = h->setting_i64(self, "draft_context", &st->draft_context);
  if (s == TSR_OK) s = h->setting_i64(self, "draft_threads", &st->draft_threads);
  if (s == TSR_OK) s = h->setting_str(self, "draft_backend", &st->draft_backend);
  for (int i = 0; i < MAX_SEQ; i++) st->n_next[i] = (int32_t)st->n_max;
  const struct tsr_speculator_v1 spec = {
      .struct_size = sizeof spec,
      .name = "spec_mtp",
      .ctx = st,
      .negotiate = spec_negotiate,
      .draft = spec_draft,
      .accepted = spec_accepted,
  };
  if (s == TSR_OK) s = h->register_speculator(self, &spec);
  return s;
}

static void spec_destroy(const struct tsr_host *h, struct tsr_plugin *self) {
  struct spec_state *st = h->get_state(self);
  if (!st) return;
  if (st->draft) h->spec->close(st->draft);
  free(st->logits);
  free(st->cand);
  free(st->weight);
  free(st);
}

static const struct tsr_plugin_iface g_provides[] = {{TSR_IFACE_SPECULATOR, 1}};

static const struct tsr_plugin_descriptor g_descriptor = {
    .abi_major = TSR_PLUGIN_ABI_MAJOR,
    .abi_minor = TSR_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(struct tsr_plugin_descriptor),
    .name = "spec_mtp",
    .version = "0.1.0",
    .description = "speculative decoding: prompt lookup and a separate draft model",
    .provides = g_provides,
    .n_provides = 1,
    .settings = g_settings,
    .n_settings = N_SETTINGS,
    .init = spec_init,
    .destroy = spec_destroy,
};

TSR_PLUGIN_EXPORT const struct tsr_plugin_descriptor *tsr_plugin_entry(void) {
  return &g_descriptor;
}
