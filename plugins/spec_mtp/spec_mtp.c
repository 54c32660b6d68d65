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
**   nextn        the target's own NextN head (host->spec->nextn) with its own
**                K/V in the target's cache: every token the target keeps adds
**                the head's entry (the token with the hidden row before it),
**                prompt included, so each draft attends to the whole sequence;
**                deeper drafts feed the head its own output hidden row.
**   assistant    a drafter GGUF whose layers read the target's K/V (Gemma 4's
**                assistant; host->spec->drafter_step): every step at the
**                target's next position, the first with the target's hidden
**                row, each later one with the drafter's own.
**
** The draft length adapts per sequence (setting adaptive): it grows by one when
** a whole draft was kept and falls to what was kept plus one when not, within
** [n_min, n_max]. draft_model stops a draft early where its own top token's
** probability is below p_min.
*/
#include <math.h>
#include <stddef.h>
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
  struct tsr_spec_drafter *drafter;
  float *logits; /* the draft model's, n_vocab */
  int32_t n_vocab;
  struct cand *cand; /* draw()'s ranking and weights, n_vocab each */
  double *weight;
  /* per sequence: the draft length to ask for next, and the last draft's length */
  int32_t n_next[MAX_SEQ], n_last[MAX_SEQ];
  /* nextn: per sequence the last kept token's position and hidden row (its entry
  ** waits for the token after it; -1: none), and the head's entry buffers */
  int32_t pend_pos[MAX_SEQ];
  float *pend[MAX_SEQ];
  int32_t n_embd, entries_cap;
  int32_t *e_tok, *e_pos;
  float *e_hidden;
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

/* How a model's drafts are chosen: greedily at temperature 0; above it drawn from the
** model's own sampling distribution, handed to the host (r->draft_dist) for speculative
** sampling. The draws are seeded by the sequence itself, so a run is reproducible from
** its own seed. */
struct chooser {
  bool sampled;
  uint64_t rng;
};

static struct chooser chooser_for(const struct tsr_spec_request *r) {
  struct chooser c = {r->temperature > 0 && r->draft_dist && r->n_vocab > 0, 0x7370656354746b73ull};
  for (int32_t i = 0; c.sampled && i < r->n_tokens; i++) /* FNV-1a over the sequence */
    c.rng = (c.rng ^ (uint32_t)r->tokens[i]) * 0x100000001b3ull;
  return c;
}

/* Draft k from st->logits into r->draft[k]; false where the model is unsure (its top
** token below p_min: the target decides from here) or nothing can be drawn. */
static bool choose(struct spec_state *st, struct chooser *c, struct tsr_spec_request *r,
                   int32_t k) {
  int32_t x = argmax(st->logits, st->n_vocab);
  if (!sure_enough(st->logits, st->n_vocab, x, st->p_min)) return false;
  if (c->sampled &&
      !draw(st, st->logits, r, &c->rng, r->draft_dist + (size_t)k * r->n_vocab, r->n_vocab, &x))
    return false;
  r->draft[k] = x;
  return true;
}

static tsr_status draft_model(struct spec_state *st, const struct tsr_host *host,
                              struct tsr_spec_request *r, int32_t want, int32_t *n_out) {
  *n_out = 0;
  struct chooser c = chooser_for(r);
  tsr_status s = host->spec->sync(st->draft, r->tokens, r->n_tokens, st->logits);
  for (int32_t k = 0; s == TSR_OK && k < want && choose(st, &c, r, k); k++) {
    ++*n_out;
    if (k + 1 < want) s = host->spec->step(st->draft, r->draft[k], st->logits);
  }
  r->dist_given = c.sampled && *n_out > 0;
  return s;
}

/* ---- nextn ---- */

/* Room for n entries of the head (or rows of the drafter), and the vocabulary-sized
** buffers, once the target's widths are known. */
static tsr_status reserve(struct spec_state *st, const struct tsr_host *host, int32_t n,
                                int32_t n_embd, int32_t n_vocab) {
  if (st->n_embd && n_embd != st->n_embd)
    return host->set_error(TSR_ERR_INTERNAL, "spec_mtp: the target's hidden rows changed "
                           "width, %d to %d", st->n_embd, n_embd);
  st->n_embd = n_embd;
  if (n > st->entries_cap) {
    int32_t *tok = realloc(st->e_tok, (size_t)n * sizeof *tok);
    if (tok) st->e_tok = tok;
    int32_t *pos = realloc(st->e_pos, (size_t)n * sizeof *pos);
    if (pos) st->e_pos = pos;
    float *h = realloc(st->e_hidden, (size_t)n * (size_t)n_embd * sizeof *h);
    if (h) st->e_hidden = h;
    if (!tok || !pos || !h) return host->set_error(TSR_ERR_NOMEM, "spec_mtp: out of memory");
    st->entries_cap = n;
  }
  if (n_vocab > 0 && !st->logits) {
    st->n_vocab = n_vocab;
    st->logits = malloc((size_t)n_vocab * sizeof *st->logits);
    st->cand = malloc((size_t)n_vocab * sizeof *st->cand);
    st->weight = malloc((size_t)n_vocab * sizeof *st->weight);
    if (!st->logits || !st->cand || !st->weight)
      return host->set_error(TSR_ERR_NOMEM, "spec_mtp: out of memory");
  }
  return TSR_OK;
}

/* What the head engines read from a request: the target's hidden row of its last
** evaluated token, and the target itself (ABI 2.4). */
static tsr_status needs_target(const struct tsr_host *host, const struct tsr_spec_request *r,
                               const char *engine) {
  if (!r->hidden || r->n_embd <= 0 || r->n_tokens < 2)
    return host->set_error(TSR_ERR_UNSUPPORTED, "spec_mtp: engine %s needs the target's hidden "
                           "row of its last evaluated token, and the target gave none", engine);
  if (r->struct_size < offsetof(struct tsr_spec_request, target) + sizeof r->target || !r->target)
    return host->set_error(TSR_ERR_UNSUPPORTED, "spec_mtp: engine %s needs a host of ABI 2.4 "
                           "(the target engine in the draft request)", engine);
  return TSR_OK;
}

/* The head's entries for what the target kept: the entry at position p is token p + 1
** with the hidden row of p, so each kept token completes the entry before it (the first
** one the entry of the sequence's previous last token, whose row waited in pend). */
static tsr_status nextn_rows(void *ctx, const struct tsr_host *host,
                             const struct tsr_spec_rows *r) {
  struct spec_state *st = ctx;
  tsr_status s = reserve(st, host, r->n, r->n_embd, 0);
  const size_t row = (size_t)r->n_embd * sizeof(float);
  for (int32_t i0 = 0; s == TSR_OK && i0 < r->n; i0++) {
    const int32_t seq = r->seq[i0];
    bool first = true;
    for (int32_t j = 0; j < i0 && first; j++) first = r->seq[j] != seq;
    if (!first) continue; /* this sequence's rows were taken with its first */
    if (seq < 0 || seq >= MAX_SEQ)
      return host->set_error(TSR_ERR_UNSUPPORTED, "spec_mtp: sequence %d (it keeps %d)", seq,
                             MAX_SEQ);
    if (!st->pend[seq] && !(st->pend[seq] = malloc(row)))
      return host->set_error(TSR_ERR_NOMEM, "spec_mtp: out of memory");
    int32_t n = 0;
    for (int32_t i = i0; i < r->n; i++) {
      if (r->seq[i] != seq) continue;
      const int32_t p = r->pos[i];
      const float *before = NULL; /* the hidden row of p - 1 */
      if (p > 0 && st->pend_pos[seq] == p - 1) before = st->pend[seq];
      if (before) {
        st->e_tok[n] = r->tokens[i], st->e_pos[n] = p - 1;
        memcpy(st->e_hidden + (size_t)n * r->n_embd, before, row);
        n++;
      }
      memcpy(st->pend[seq], r->hidden + (size_t)i * r->n_embd, row);
      st->pend_pos[seq] = p;
    }
    if (n) s = host->spec->nextn(r->target, seq, st->e_tok, st->e_pos, st->e_hidden, n, NULL, NULL);
  }
  return s;
}

/* Drafts from the head: the first entry is the token about to be evaluated with the hidden
** row of the last one evaluated (a held position: it stays in the head's cache); each
** deeper one is the previous draft with the head's own output row, the chain evaluated
** whole each time past the held positions. */
static tsr_status nextn_draft(struct spec_state *st, const struct tsr_host *host,
                              struct tsr_spec_request *r, int32_t want, int32_t *n_out) {
  *n_out = 0;
  tsr_status s = needs_target(host, r, "nextn");
  if (s == TSR_OK) s = reserve(st, host, want, r->n_embd, r->n_vocab);
  if (s != TSR_OK) return s;
  struct chooser c = chooser_for(r);
  const int32_t last = r->n_tokens - 2; /* the last evaluated position */
  /* draft k comes with the head's output row k (e_hidden row k), which chain entry k
  ** (draft k at position last + 1 + k) takes as its hidden row */
  float *rows = st->e_hidden;
  s = host->spec->nextn(r->target, r->seq, r->tokens + r->n_tokens - 1, &last, r->hidden, 1,
                        st->logits, rows);
  for (int32_t k = 0; s == TSR_OK && k < want && choose(st, &c, r, k); k++) {
    ++*n_out;
    if (k + 1 == want) break;
    st->e_tok[k] = r->draft[k], st->e_pos[k] = last + 1 + k;
    s = host->spec->nextn(r->target, r->seq, st->e_tok, st->e_pos, rows, k + 1, st->logits,
                          rows + (size_t)(k + 1) * r->n_embd);
  }
  r->dist_given = c.sampled && *n_out > 0;
  return s;
}

/* ---- assistant ---- */

/* Draft k is the drafter's step on draft k - 1 (the first on the token about to be
** evaluated) with the previous step's hidden row (the first with the target's), all at the
** position that token takes. */
static tsr_status assistant_draft(struct spec_state *st, const struct tsr_host *host,
                                  struct tsr_spec_request *r, int32_t want, int32_t *n_out) {
  *n_out = 0;
  tsr_status s = needs_target(host, r, "assistant");
  if (s == TSR_OK) s = reserve(st, host, 2, r->n_embd, r->n_vocab);
  struct chooser c = chooser_for(r);
  const int32_t pos = r->n_tokens - 1;
  int32_t token = r->tokens[pos];
  const float *h = r->hidden;
  for (int32_t k = 0; s == TSR_OK && k < want; k++) {
    float *out = st->e_hidden + (size_t)(k & 1) * r->n_embd; /* not h, which is the other */
    s = host->spec->drafter_step(st->drafter, r->target, r->seq, token, pos, h, st->logits, out);
    if (s != TSR_OK || !choose(st, &c, r, k)) break;
    ++*n_out;
    token = r->draft[k], h = out;
  }
  r->dist_given = c.sampled && *n_out > 0;
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
  else if (st->engine == ENGINE_NEXTN)
    s = nextn_draft(st, host, r, want, n_draft);
  else if (st->engine == ENGINE_ASSISTANT)
    s = assistant_draft(st, host, r, want, n_draft);
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

/* Whether the target has a NextN head: <arch>.nextn_predict_layers above 0. */
static tsr_status nextn_negotiate(const struct tsr_host *host, const struct tsr_gguf *model) {
  const char *arch = NULL;
  char key[96];
  uint32_t n = 0;
  if (host->gguf->get_str(model, "general.architecture", &arch) != TSR_OK) return TSR_ERR_FORMAT;
  snprintf(key, sizeof key, "%s.nextn_predict_layers", arch);
  if (host->gguf->has_key(model, key) && host->gguf->get_u32(model, key, &n) != TSR_OK)
    return TSR_ERR_FORMAT;
  if (!n)
    return host->set_error(TSR_ERR_UNSUPPORTED, "spec_mtp: engine nextn drafts with the model's "
                           "own NextN head, and this %s model has none (%s is %s)", arch, key,
                           host->gguf->has_key(model, key) ? "0" : "absent");
  return TSR_OK;
}

static tsr_status spec_negotiate(void *ctx, const struct tsr_host *host,
                                 const struct tsr_gguf *model) {
  struct spec_state *st = ctx;
  if (st->n_min > st->n_max)
    return host->set_error(TSR_ERR_INVALID_ARG, "spec_mtp: n_min %lld is above n_max %lld",
                           (long long)st->n_min, (long long)st->n_max);
  if (st->ngram_min > st->ngram_max)
    return host->set_error(TSR_ERR_INVALID_ARG, "spec_mtp: ngram_min %lld is above ngram_max "
                           "%lld", (long long)st->ngram_min, (long long)st->ngram_max);
  if (st->engine == ENGINE_LOOKUP || st->engine == ENGINE_NEXTN) {
    if (st->model && *st->model)
      return host->set_error(TSR_ERR_INVALID_ARG, "spec_mtp: model is set, but engine %s uses "
                             "no model of its own (engine: draft_model drafts with one)",
                             g_engines[st->engine]);
    return st->engine == ENGINE_NEXTN ? nextn_negotiate(host, model) : TSR_OK;
  }
  if (!st->model || !*st->model)
    return host->set_error(TSR_ERR_INVALID_ARG, "spec_mtp: engine %s needs a model (the %s "
                           "GGUF's path)", g_engines[st->engine],
                           st->engine == ENGINE_ASSISTANT ? "drafter" : "draft");
  if (st->draft || st->drafter) return TSR_OK; /* a second negotiation of the same plugin */
  if (st->engine == ENGINE_ASSISTANT)
    return host->spec->open_drafter(model, st->model, &st->drafter);
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
     "what drafts: lookup (prompt n-grams), draft_model (a separate GGUF), nextn (the "
     "model's own NextN head) or assistant (a drafter GGUF reading the model's K/V)"},
    {"n_max", TSR_SETTING_INT, 1, 8, "4", NULL, "tokens a draft proposes at most"},
    {"n_min", TSR_SETTING_INT, 1, 8, "1", NULL, "the adaptive length's floor"},
    {"adaptive", TSR_SETTING_BOOL, 0, 0, "true", NULL,
     "adapt the draft length per sequence to what the target kept (else always n_max)"},
    {"ngram_max", TSR_SETTING_INT, 1, 16, "4", NULL, "lookup: the longest n-gram matched"},
    {"ngram_min", TSR_SETTING_INT, 1, 16, "2", NULL, "lookup: the shortest n-gram matched"},
    {"model", TSR_SETTING_STRING, 0, 0, "", NULL,
     "draft_model: the draft GGUF's path; assistant: the drafter's"},
    {"p_min", TSR_SETTING_FLOAT, 0, 1, "0.5", NULL,
     "draft_model, nextn, assistant: stop a draft where the drafter's top token has a lower "
     "probability"},
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
  for (int i = 0; i < MAX_SEQ; i++) st->n_next[i] = (int32_t)st->n_max, st->pend_pos[i] = -1;
  const struct tsr_speculator_v1 spec = {
      .struct_size = sizeof spec,
      .name = "spec_mtp",
      .ctx = st,
      .negotiate = spec_negotiate,
      .draft = spec_draft,
      .accepted = spec_accepted,
      .rows = st->engine == ENGINE_NEXTN ? nextn_rows : NULL,
  };
  if (s == TSR_OK) s = h->register_speculator(self, &spec);
  return s;
}

static void spec_destroy(const struct tsr_host *h, struct tsr_plugin *self) {
  struct spec_state *st = h->get_state(self);
  if (!st) return;
  if (st->draft) h->spec->close(st->draft);
  if (st->drafter) h->spec->close_drafter(st->drafter);
  free(st->logits);
  free(st->cand);
  free(st->weight);
  for (int i = 0; i < MAX_SEQ; i++) free(st->pend[i]);
  free(st->e_tok);
  free(st->e_pos);
  free(st->e_hidden);
  free(st);
}

static const struct tsr_plugin_iface g_provides[] = {{TSR_IFACE_SPECULATOR, 1}};

static const struct tsr_plugin_descriptor g_descriptor = {
    .abi_major = TSR_PLUGIN_ABI_MAJOR,
    .abi_minor = TSR_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(struct tsr_plugin_descriptor),
    .name = "spec_mtp",
    .version = "0.1.0",
    .description = "speculative decoding: prompt lookup, a separate draft model, the model's "
                   "NextN head, Gemma 4's assistant drafter",
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
