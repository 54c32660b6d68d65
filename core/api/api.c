/*
** The embedding API (tessera/tessera.h) over the engine: opening and
** describing, tokens and chat templates, sequences, samplers, streamed
** generation with prefix reuse, context shift and speculation, log-probs and
** the plugins' counters. `tessera run` and `tessera serve` are its clients.
*/
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "api/embed.h"
#include "common/error.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "graph/backend.h"
#include "model/chat.h"
#include "model/tokenizer.h"
#include "profile/profile.h"

enum { GEN_IDLE, GEN_RUNNING, GEN_CANCELLED };

struct tsr_embed {
  struct tsr_tokenizer *tok;
  bool have_template;
  enum tsr_chat_template tmpl;
  const char *tmpl_source;
  float *logits; /* the last evaluated token's (n_vocab) */
  atomic_int generating; /* GEN_IDLE, GEN_RUNNING, or GEN_CANCELLED by tsr_engine_cancel */
  tsr_progress_fn progress;
  void *progress_user;
  tsr_notice_fn notice;
  void *notice_user;
  double stat[TSR_STAT_MAX_DRAFT + 1];
};

void tsr_embed_free(struct tsr_embed *s) {
  if (!s) return;
  tsr_tokenizer_free(s->tok);
  free(s->logits);
  free(s);
}

void tsr_free(void *p) { free(p); }

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The engine's embedding state, made on first use. */
static struct tsr_embed *embed_of(struct tsr_engine *e) {
  struct tsr_embed **slot = tsr_engine_embed(e);
  if (*slot) return *slot;
  struct tsr_embed *s = calloc(1, sizeof *s);
  if (s && !(s->logits = malloc((size_t)tsr_engine_n_vocab(e) * sizeof *s->logits))) {
    free(s);
    s = NULL;
  }
  if (!s) {
    tsr_error_set(TSR_ERR_NOMEM, "out of memory");
    return NULL;
  }
  atomic_init(&s->generating, GEN_IDLE);
  return *slot = s;
}

static tsr_status tokenizer_of(struct tsr_engine *e, struct tsr_tokenizer **out) {
  struct tsr_embed *s = embed_of(e);
  if (!s) return TSR_ERR_NOMEM;
  if (!s->tok) {
    tsr_status st = tsr_tokenizer_load(tsr_engine_setup(e)->model, &s->tok);
    if (st != TSR_OK) return st;
  }
  *out = s->tok;
  return TSR_OK;
}

/* ---- opening ---- */

tsr_status tsr_engine_open(const char *profile, const char *model, const char *const *sets,
                           int n_sets, tsr_engine **out) {
  if (!out) return tsr_error_set(TSR_ERR_INVALID_ARG, "tsr_engine_open: out is NULL");
  *out = NULL;
  if (n_sets < 0 || (n_sets > 0 && !sets))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "tsr_engine_open: %d overrides at %p", n_sets,
                         (const void *)sets);
  for (int i = 0; i < n_sets; i++)
    if (!sets[i]) return tsr_error_set(TSR_ERR_INVALID_ARG, "tsr_engine_open: override %d is NULL", i);
  struct tsr_engine_options opt = {.profile_path = profile, .sets = sets, .n_sets = n_sets,
                                   .model_path = model};
  struct tsr_engine *e = NULL;
  tsr_status st = tsr_engine_new(&opt, &e);
  if (st != TSR_OK) return st;
  /* made now, not on first use: tsr_engine_cancel and the read-only token calls may
  ** come from other threads */
  struct tsr_tokenizer *tok;
  if (!embed_of(e) || (st = tokenizer_of(e, &tok)) != TSR_OK) {
    tsr_engine_free(e);
    return st != TSR_OK ? st : TSR_ERR_NOMEM;
  }
  /* the model's own chat template when it has one; chat calls name it missing otherwise */
  if (tsr_chat_template_choose(e, NULL, NULL, NULL) != TSR_OK) tsr_error_clear();
  *out = e;
  return TSR_OK;
}

void tsr_engine_close(tsr_engine *e) { tsr_engine_free(e); }

/* Runs print into a malloc'd string. */
static tsr_status capture(void (*print)(const void *arg, unsigned flags, FILE *f),
                          const void *arg, unsigned flags, char **text) {
  size_t len = 0;
  *text = NULL;
  FILE *f = open_memstream(text, &len);
  if (!f) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  print(arg, flags, f);
  if (fclose(f) != 0 || !*text) {
    free(*text);
    *text = NULL;
    return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  }
  return TSR_OK;
}

static void print_setup(const void *arg, unsigned flags, FILE *f) {
  tsr_setup_print(arg, true, f);
}

tsr_status tsr_engine_describe(tsr_engine *e, char **text) {
  return capture(print_setup, tsr_engine_setup(e), 0, text);
}

const char *tsr_engine_model_path(const tsr_engine *e) { return tsr_engine_setup(e)->model_path; }
const char *tsr_engine_arch(const tsr_engine *e) {
  const char *a = tsr_engine_setup(e)->arch_name;
  return a ? a : "";
}
tsr_status tsr_engine_setting(const tsr_engine *e, const char *key, char **value,
                              const char **where) {
  *value = NULL;
  const struct tsr_profile *p = tsr_engine_setup(e)->profile;
  char buf[1024];
  if (!key || !tsr_profile_value(p, key, buf, sizeof buf))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "setting '%s': not one value of the profile's "
                         "schema", key ? key : "(null)");
  if (!(*value = strdup(buf))) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  if (where) *where = tsr_profile_where(p, key);
  return TSR_OK;
}

int tsr_engine_has_plugin(const tsr_engine *e, const char *name) {
  return name && tsr_plugin_host_find_plugin(tsr_engine_setup(e)->host, name) != NULL;
}
int32_t tsr_engine_max_tokens(const tsr_engine *e) {
  return tsr_engine_setup(e)->profile->sampling.max_tokens;
}

/* ---- tokens and chat ---- */

tsr_status tsr_tokenize(tsr_engine *e, const char *text, size_t len, unsigned flags,
                        int32_t **tokens, size_t *n) {
  *tokens = NULL, *n = 0;
  if (!text && len) return tsr_error_set(TSR_ERR_INVALID_ARG, "tsr_tokenize: text is NULL");
  if (flags & ~(unsigned)(TSR_TOKENIZE_ADD_SPECIAL | TSR_TOKENIZE_PARSE_SPECIAL))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "tsr_tokenize: unknown flags 0x%x", flags);
  struct tsr_tokenizer *tok;
  tsr_status st = tokenizer_of(e, &tok);
  if (st != TSR_OK) return st;
  return tsr_tokenizer_encode(tok, text ? text : "", len, flags & TSR_TOKENIZE_PARSE_SPECIAL,
                              flags & TSR_TOKENIZE_ADD_SPECIAL, tokens, n);
}

tsr_status tsr_detokenize(tsr_engine *e, const int32_t *tokens, size_t n, char **text,
                          size_t *len) {
  *text = NULL;
  if (!tokens && n) return tsr_error_set(TSR_ERR_INVALID_ARG, "tsr_detokenize: tokens is NULL");
  struct tsr_tokenizer *tok;
  tsr_status st = tokenizer_of(e, &tok);
  return st != TSR_OK ? st : tsr_tokenizer_decode(tok, tokens, n, text, len);
}

const char *tsr_embed_piece(tsr_engine *e, int32_t id, size_t *len) {
  struct tsr_tokenizer *tok;
  *len = 0;
  return tokenizer_of(e, &tok) == TSR_OK ? tsr_tokenizer_piece(tok, id, len) : NULL;
}

int32_t tsr_embed_n_tokens(tsr_engine *e) {
  struct tsr_tokenizer *tok;
  return tokenizer_of(e, &tok) == TSR_OK ? tsr_tokenizer_n_vocab(tok) : 0;
}

int tsr_token_is_eog(tsr_engine *e, int32_t token) {
  struct tsr_tokenizer *tok;
  return tokenizer_of(e, &tok) == TSR_OK && tsr_tokenizer_is_eog(tok, token);
}

struct tsr_text_stream {
  const struct tsr_tokenizer *tok;
  struct tsr_utf8_stream utf8;
  char *buf;
  size_t cap;
};

tsr_status tsr_text_stream_open(tsr_engine *e, tsr_text_stream **out) {
  *out = NULL;
  struct tsr_tokenizer *tok;
  tsr_status st = tokenizer_of(e, &tok);
  if (st != TSR_OK) return st;
  tsr_text_stream *t = calloc(1, sizeof *t);
  if (!t) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  t->tok = tok;
  t->utf8 = (struct tsr_utf8_stream)TSR_UTF8_STREAM_INIT;
  *out = t;
  return TSR_OK;
}

void tsr_text_stream_close(tsr_text_stream *t) {
  if (t) free(t->buf);
  free(t);
}

tsr_status tsr_text_stream_push(tsr_text_stream *t, int32_t token, const char **text,
                                size_t *len) {
  *text = "", *len = 0;
  size_t n = 0;
  const char *piece = tsr_tokenizer_piece(t->tok, token, &n);
  if (!piece)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "token %d is outside the vocabulary of %d", token,
                         tsr_tokenizer_n_vocab(t->tok));
  if (n + 4 > t->cap) {
    char *grown = realloc(t->buf, n + 4);
    if (!grown) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
    t->buf = grown, t->cap = n + 4;
  }
  *len = tsr_utf8_stream_push(&t->utf8, piece, n, t->buf);
  *text = t->buf;
  return TSR_OK;
}

void tsr_text_stream_flush(tsr_text_stream *t, const char **text, size_t *len) {
  static char none[1];
  if (t->cap < 4) { /* nothing was pushed, so nothing is pending */
    *text = none, *len = 0;
    return;
  }
  *len = tsr_utf8_stream_flush(&t->utf8, t->buf);
  *text = t->buf;
}

tsr_status tsr_chat_template_choose(tsr_engine *e, const char *name, const char **chosen,
                                    const char **source) {
  struct tsr_tokenizer *tok;
  tsr_status st = tokenizer_of(e, &tok);
  if (st != TSR_OK) return st;
  struct tsr_embed *s = embed_of(e);
  enum tsr_chat_template t;
  const char *from;
  st = tsr_setup_chat_template(tsr_engine_setup(e), name, tsr_tokenizer_chat_template(tok), &t,
                               &from);
  if (st != TSR_OK) {
    tsr_error_prefix("%s", tsr_engine_model_path(e));
    return st;
  }
  s->tmpl = t, s->tmpl_source = from, s->have_template = true;
  if (chosen) *chosen = tsr_chat_template_name(t);
  if (source) *source = from;
  return TSR_OK;
}

/* Renders the messages with the chosen template (the model's own when none was chosen). */
static tsr_status chat_render(tsr_engine *e, const char *const *roles, const char *const *contents,
                              size_t n, int add_generation_prompt, char **text,
                              unsigned char **template_bytes) {
  *text = NULL;
  if (n && (!roles || !contents))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "chat: %zu messages without roles or contents", n);
  struct tsr_embed *s = embed_of(e);
  if (!s) return TSR_ERR_NOMEM;
  if (!s->have_template)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: the model has no chat template and the arch "
                         "plugin none for it: choose one (chatml, gemma, gemma4)",
                         tsr_engine_model_path(e));
  tsr_status st = TSR_OK;
  struct tsr_chat_message *m = calloc(n ? n : 1, sizeof *m);
  if (!m) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < n && st == TSR_OK; i++) {
    if (!roles[i] || !contents[i])
      st = tsr_error_set(TSR_ERR_INVALID_ARG, "chat: message %zu has no %s", i,
                         roles[i] ? "content" : "role");
    m[i] = (struct tsr_chat_message){roles[i], contents[i]};
  }
  if (st == TSR_OK)
    st = template_bytes ? tsr_chat_render_marked(s->tmpl, m, n, add_generation_prompt, text,
                                                 template_bytes)
                        : tsr_chat_render(s->tmpl, m, n, add_generation_prompt, text);
  free(m);
  return st;
}

tsr_status tsr_chat_format(tsr_engine *e, const char *const *roles, const char *const *contents,
                           size_t n, int add_generation_prompt, char **text) {
  return chat_render(e, roles, contents, n, add_generation_prompt, text, NULL);
}

tsr_status tsr_chat_tokenize(tsr_engine *e, const char *const *roles, const char *const *contents,
                             size_t n, int add_generation_prompt, int32_t **tokens,
                             size_t *n_tokens) {
  *tokens = NULL, *n_tokens = 0;
  char *text = NULL;
  unsigned char *marks = NULL;
  struct tsr_tokenizer *tok;
  tsr_status st = tokenizer_of(e, &tok);
  if (st == TSR_OK) st = chat_render(e, roles, contents, n, add_generation_prompt, &text, &marks);
  if (st == TSR_OK)
    st = tsr_tokenizer_encode_marked(tok, text, strlen(text), true, marks, true, tokens, n_tokens);
  free(text);
  free(marks);
  return st;
}

/* ---- evaluation ---- */

tsr_status tsr_engine_eval_multi(tsr_engine *e, int32_t n, const int32_t *tokens,
                                 const int32_t *seqs, const unsigned char *want_logits,
                                 float *logits) {
  if (n < 0 || (n > 0 && (!tokens || !seqs)))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "eval_multi: %d tokens without tokens or sequences",
                         n);
  bool *want = NULL;
  if (want_logits && n > 0) {
    if (!(want = malloc((size_t)n * sizeof *want)))
      return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; i < n; i++) want[i] = want_logits[i] != 0;
  }
  struct tsr_engine_batch b = {.n = n, .tokens = tokens, .seq = seqs, .logits = want};
  tsr_status st = tsr_engine_eval_batch(e, &b, logits);
  free(want);
  return st;
}

/* After a failure partway through evaluating chunks: seq back to its first p positions (or
** emptied, where it cannot resume there). The failure's message stays. */
static void forget_from(tsr_engine *e, int32_t seq, int32_t p, tsr_status failure) {
  char why[1024];
  snprintf(why, sizeof why, "%s", tsr_error_message());
  if (tsr_engine_seq_rm(e, seq, p, -1) != TSR_OK) tsr_engine_seq_rm(e, seq, 0, -1);
  tsr_error_set(failure, "%s", why);
}

tsr_status tsr_engine_logprobs(tsr_engine *e, int32_t seq, const int32_t *tokens, int32_t n,
                               float *out) {
  if (n < 1 || !tokens || (n > 1 && !out))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "logprobs: %d tokens (at least one, and room for "
                         "n - 1 log-probs)", n);
  const int32_t V = tsr_engine_n_vocab(e);
  /* a few rows at a time: a full ubatch of logits is ubatch x n_vocab floats */
  int32_t chunk = tsr_engine_n_ubatch(e);
  if (chunk > 64) chunk = 64;
  float *rows = malloc((size_t)chunk * (size_t)V * sizeof *rows);
  if (!rows) return tsr_error_set(TSR_ERR_NOMEM, "out of memory for %d rows of logits", chunk);
  const int32_t start = tsr_engine_seq_len(e, seq);
  tsr_status st = TSR_OK;
  for (int32_t a = 0; a < n && st == TSR_OK; a += chunk) {
    const int32_t m = n - a < chunk ? n - a : chunk;
    st = tsr_engine_eval(e, seq, tokens + a, m, NULL, rows);
    for (int32_t r = 0; st == TSR_OK && r < m && a + r + 1 < n; r++) {
      const float *row = rows + (size_t)r * V;
      const int32_t next = tokens[a + r + 1];
      if (next < 0 || next >= V) {
        st = tsr_error_set(TSR_ERR_INVALID_ARG, "logprobs: token %d at %d is outside the "
                           "vocabulary of %d", next, a + r + 1, V);
        break;
      }
      double mx = -INFINITY, sum = 0;
      for (int32_t j = 0; j < V; j++) mx = row[j] > mx ? row[j] : mx;
      for (int32_t j = 0; j < V; j++) sum += exp((double)row[j] - mx);
      out[a + r] = (float)((double)row[next] - mx - log(sum));
    }
  }
  free(rows);
  if (st != TSR_OK && start >= 0) forget_from(e, seq, start, st);
  return st;
}

/* ---- samplers ---- */

static uint64_t random_seed(void) {
  uint64_t s = 0;
  FILE *f = fopen("/dev/urandom", "rb");
  if (!f || fread(&s, sizeof s, 1, f) != 1)
    s = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
  if (f) fclose(f);
  return s;
}

static bool parse_num(const char *v, double *out) {
  char *end;
  double d = strtod(v, &end);
  if (end == v || *end || !isfinite(d)) return false;
  *out = d;
  return true;
}

tsr_status tsr_sampler_open(const tsr_engine *e, const char *const *sets, int n_sets,
                            tsr_sampler **out) {
  *out = NULL;
  const struct tsr_profile_sampling *d = &tsr_engine_setup(e)->profile->sampling;
  double temp = d->temperature, top_k = d->top_k, top_p = d->top_p, min_p = d->min_p;
  bool seed_random = d->seed == -1;
  unsigned long long seed_value = d->seed < 0 ? 0 : (unsigned long long)d->seed;
  for (int i = 0; i < n_sets; i++) {
    const char *kv = sets ? sets[i] : NULL;
    const char *eq = kv ? strchr(kv, '=') : NULL;
    if (!eq) return tsr_error_set(TSR_ERR_INVALID_ARG, "sampler setting %d: '%s' is not key=value",
                                  i, kv ? kv : "(null)");
    const size_t klen = (size_t)(eq - kv);
    static const char *const keys[] = {"temperature", "top_k", "top_p", "min_p", "seed"};
    double *slots[] = {&temp, &top_k, &top_p, &min_p, NULL};
    int k = -1;
    for (int j = 0; j < 5; j++)
      if (strlen(keys[j]) == klen && !strncmp(kv, keys[j], klen)) k = j;
    if (k < 0)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "sampler setting '%.*s': unknown (temperature, "
                           "top_k, top_p, min_p, seed)", (int)klen, kv);
    double v;
    if (k == 4) { /* a seed is any 64-bit value: read exactly, not through a double */
      char *end;
      errno = 0;
      const bool neg = eq[1] == '-';
      const unsigned long long u = neg ? 0 : strtoull(eq + 1, &end, 10);
      if (neg ? strcmp(eq + 1, "-1") : (errno || end == eq + 1 || *end))
        return tsr_error_set(TSR_ERR_INVALID_ARG, "sampler setting seed: '%s' is not a 64-bit "
                             "unsigned integer or -1", eq + 1);
      seed_random = neg, seed_value = u;
      continue;
    }
    if (!parse_num(eq + 1, &v) || (k == 1 && v != floor(v)))
      return tsr_error_set(TSR_ERR_INVALID_ARG, "sampler setting %s: '%s' is not %s", keys[k],
                           eq + 1, k == 1 ? "an integer" : "a number");
    *slots[k] = v;
  }
  if (top_k < 0 || top_k > INT32_MAX)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "sampler setting top_k: %g is out of range "
                         "[0, %d]", top_k, INT32_MAX);
  struct tsr_sampler_params p = {.temperature = (float)temp, .top_k = (int32_t)top_k,
                                 .top_p = (float)top_p, .min_p = (float)min_p,
                                 .seed = seed_random ? random_seed() : (uint64_t)seed_value};
  tsr_status st = tsr_sampler_new(&p, tsr_engine_n_vocab(e), out);
  if (st == TSR_OK && seed_random) tsr_sampler_seed_drawn(*out);
  return st;
}

void tsr_sampler_close(tsr_sampler *s) { tsr_sampler_free(s); }
uint64_t tsr_sampler_seed(const tsr_sampler *s) { return tsr_sampler_params_of(s)->seed; }

/* ---- generation ---- */

void tsr_engine_cancel(tsr_engine *e) {
  struct tsr_embed *s = *tsr_engine_embed(e);
  int running = GEN_RUNNING;
  /* only a running generation takes it: one that has ended leaves nothing behind */
  if (s) atomic_compare_exchange_strong(&s->generating, &running, GEN_CANCELLED);
}

void tsr_engine_set_progress(tsr_engine *e, tsr_progress_fn fn, void *user) {
  struct tsr_embed *s = embed_of(e);
  if (s) s->progress = fn, s->progress_user = user;
}

void tsr_engine_set_notice(tsr_engine *e, tsr_notice_fn fn, void *user) {
  struct tsr_embed *s = embed_of(e);
  if (s) s->notice = fn, s->notice_user = user;
}

double tsr_engine_stat(const tsr_engine *e, enum tsr_stat what) {
  const struct tsr_embed *s = *tsr_engine_embed((tsr_engine *)e);
  return s && what >= 0 && what <= TSR_STAT_MAX_DRAFT ? s->stat[what] : 0;
}

static bool cancelled(struct tsr_embed *s) {
  return atomic_load(&s->generating) == GEN_CANCELLED;
}

tsr_status tsr_embed_hold_prefix(tsr_engine *e, int32_t seq, const int32_t *tokens, int32_t n,
                                 int32_t *keep) {
  *keep = tsr_engine_common_prefix(e, seq, tokens, n);
  if (*keep == n) *keep = n - 1; /* the last token is evaluated again for its logits */
  if (*keep >= tsr_engine_seq_len(e, seq)) return TSR_OK;
  if (tsr_engine_seq_rm(e, seq, *keep, -1) == TSR_OK) return TSR_OK;
  /* a recurrent state cannot forget part of a sequence: start it again */
  *keep = 0;
  return tsr_engine_seq_rm(e, seq, 0, -1);
}

/* Makes seq hold exactly tokens[0..n) and leaves the last one's logits in s->logits,
** evaluating only what differs from what it holds already. */
static tsr_status feed(tsr_engine *e, struct tsr_embed *s, int32_t seq, const int32_t *tokens,
                       size_t n, bool *stopped) {
  if (n == 0) return tsr_error_set(TSR_ERR_INVALID_ARG, "the prompt is empty (0 tokens)");
  if (n > (size_t)tsr_engine_n_ctx(e))
    return tsr_error_set(TSR_ERR_NOMEM, "the prompt has %zu tokens; the context holds %d", n,
                         tsr_engine_n_ctx(e));
  int32_t held;
  tsr_status hst = tsr_embed_hold_prefix(e, seq, tokens, (int32_t)n, &held);
  if (hst != TSR_OK) return hst;
  const size_t keep = (size_t)held, todo = n - keep;
  const size_t ubatch = (size_t)tsr_engine_n_ubatch(e);
  /* in chunks of a ubatch when someone watches or may cancel, else in one call */
  const size_t chunk = s->progress || todo > ubatch * 2 ? ubatch : todo;
  s->stat[TSR_STAT_PROMPT_TOKENS] = (double)n;
  s->stat[TSR_STAT_PROMPT_REUSED] = (double)keep;
  const double t0 = now_ms();
  tsr_status st = TSR_OK;
  for (size_t done = 0; done < todo && st == TSR_OK;) {
    if (cancelled(s)) {
      *stopped = true;
      break;
    }
    const size_t m = todo - done < chunk ? todo - done : chunk;
    st = tsr_engine_eval(e, seq, tokens + keep + done, (int32_t)m, s->logits, NULL);
    done += m;
    if (st == TSR_OK && s->progress) s->progress(s->progress_user, (int64_t)done, (int64_t)todo);
  }
  s->stat[TSR_STAT_PROMPT_MS] = now_ms() - t0;
  if (st != TSR_OK) forget_from(e, seq, (int32_t)keep, st);
  return st;
}

/* A full context: keep the first n_keep tokens, drop half of the rest. */
static tsr_status shift(tsr_engine *e, struct tsr_embed *s, int32_t seq, int32_t n_keep) {
  const int32_t len = tsr_engine_seq_len(e, seq);
  const int32_t discard = len > n_keep ? (len - n_keep) / 2 : 0;
  if (discard < 1)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "cannot shift: keeping %d leaves nothing of the "
                         "%d tokens to drop", n_keep, len);
  tsr_status st = tsr_engine_context_shift(e, seq, n_keep, discard);
  if (st != TSR_OK) return st;
  s->stat[TSR_STAT_SHIFTS]++;
  if (s->notice) {
    char text[160];
    snprintf(text, sizeof text, "context full at %d tokens: shifted, kept the first %d, dropped "
             "the next %d", len, n_keep, discard);
    s->notice(s->notice_user, text);
  }
  return TSR_OK;
}

/* One decode step of token t; a full context shifts (n_keep >= 0) or ends the generation
** (*full) when max_tokens < 0. */
static tsr_status step(tsr_engine *e, struct tsr_embed *s, int32_t seq, int32_t t,
                       int64_t max_tokens, int32_t n_keep, bool *full) {
  tsr_status st = tsr_engine_eval(e, seq, &t, 1, s->logits, NULL);
  if (st != TSR_ERR_NOMEM) return st;
  char why_full[512];
  snprintf(why_full, sizeof why_full, "%s", tsr_error_message());
  st = n_keep >= 0 ? shift(e, s, seq, n_keep)
                   : tsr_error_set(TSR_ERR_UNSUPPORTED, "context shift not asked for");
  if (st == TSR_OK) return tsr_engine_eval(e, seq, &t, 1, s->logits, NULL);
  char why_not[512];
  snprintf(why_not, sizeof why_not, "%s", tsr_error_message());
  st = tsr_error_set(st == TSR_ERR_UNSUPPORTED ? TSR_ERR_NOMEM : st, "%s; %s", why_full, why_not);
  if (st != TSR_ERR_NOMEM || max_tokens >= 0) return st;
  /* running until a context that cannot shift is full is a normal way to stop; the
  ** message stays to say why */
  *full = true;
  return TSR_OK;
}

int32_t tsr_engine_max_draft(const tsr_engine *e) {
  if (!e || !tsr_engine_setup(e)->profile->has_speculator) return 0;
  /* a draft and its token fit a ubatch */
  const int32_t m = tsr_engine_n_ubatch(e) - 1;
  return m < TSR_SPEC_MAX_DRAFT ? m : TSR_SPEC_MAX_DRAFT;
}

_Static_assert(TSR_MAX_DRAFT == TSR_SPEC_MAX_DRAFT, "the API's bound is the engine's");

tsr_status tsr_speculate_multi(tsr_engine *e, int32_t n, const int32_t *seqs, const int32_t *next,
                               tsr_sampler *const *samplers, const int32_t *max_draft,
                               int32_t *out, int32_t *n_out) {
  if (!e || n < 1 || !seqs || !next || !samplers || !max_draft || !out || !n_out)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "speculate: no engine, %d sequences, or a missing "
                         "array", n);
  for (int32_t i = 0; i < n; i++) {
    if (next[i] < 0 || next[i] >= tsr_engine_n_vocab(e))
      return tsr_error_set(TSR_ERR_INVALID_ARG, "speculate: token %d is outside the vocabulary "
                           "of %d", next[i], tsr_engine_n_vocab(e));
    if (max_draft[i] > tsr_engine_max_draft(e))
      return tsr_error_set(TSR_ERR_INVALID_ARG, "speculate: %d drafts, and this engine allows "
                           "%d", max_draft[i], tsr_engine_max_draft(e));
  }
  return tsr_engine_speculate_multi(e, n, seqs, next, samplers, max_draft, out, n_out);
}

tsr_status tsr_speculate(tsr_engine *e, int32_t seq, int32_t next, tsr_sampler *s,
                         int32_t max_draft, int32_t *out, int32_t *n_out) {
  int32_t row[TSR_MAX_DRAFT + 1];
  if (!out || !n_out) return tsr_error_set(TSR_ERR_INVALID_ARG, "speculate: no output");
  *n_out = 0;
  tsr_status st = tsr_speculate_multi(e, 1, &seq, &next, &s, &max_draft, row, n_out);
  if (st == TSR_OK) memcpy(out, row, (size_t)*n_out * sizeof *out);
  return st;
}

tsr_status tsr_generate(tsr_engine *e, int32_t seq, tsr_sampler *smp, const int32_t *prompt,
                        size_t n_prompt, int64_t max_tokens, int32_t n_keep, tsr_token_fn fn,
                        void *user, enum tsr_stop *stop) {
  if (stop) *stop = TSR_STOP_NONE;
  struct tsr_embed *s = embed_of(e);
  if (!s) return TSR_ERR_NOMEM;
  if (!smp || (!prompt && n_prompt))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "generate: no %s", smp ? "prompt" : "sampler");
  if (seq < 0 || seq >= tsr_engine_n_seq(e))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "generate: sequence %d (the cache holds %d)", seq,
                         tsr_engine_n_seq(e));
  struct tsr_tokenizer *tok;
  tsr_status st = tokenizer_of(e, &tok);
  if (st != TSR_OK) return st;
  memset(s->stat, 0, sizeof s->stat);
  const int32_t max_draft = tsr_engine_max_draft(e);
  s->stat[TSR_STAT_MAX_DRAFT] = max_draft;
  bool stopped = false, full = false;
  enum tsr_stop why = TSR_STOP_LIMIT;
  atomic_store(&s->generating, GEN_RUNNING);
  st = feed(e, s, seq, prompt, n_prompt, &stopped);
  struct tsr_utf8_stream us = TSR_UTF8_STREAM_INIT;
  char buf[512];
  int64_t produced = 0;
  double eval_ms = 0;
  /* with a speculator: the tokens of the last speculative step still to emit (the kept
  ** drafts, in the cache already, then the target's token, not yet evaluated) */
  int32_t spec[TSR_SPEC_MAX_DRAFT + 1], n_spec = 0, at = 0;
  while (st == TSR_OK && !stopped && (max_tokens < 0 || produced < max_tokens)) {
    if (cancelled(s)) {
      stopped = true;
      break;
    }
    int32_t t;
    if (at < n_spec) t = spec[at++];
    else if ((st = tsr_sampler_sample(smp, s->logits, &t)) != TSR_OK) break;
    if (tsr_tokenizer_is_eog(tok, t)) {
      why = TSR_STOP_EOG;
      break;
    }
    produced++;
    size_t len = 0;
    const char *piece = tsr_tokenizer_piece(tok, t, &len);
    size_t out = 0;
    bool go_on = true;
    do { /* a long piece in slices the buffer holds; the callback gets each */
      const size_t m = len < sizeof buf - 3 ? len : sizeof buf - 3;
      out = piece ? tsr_utf8_stream_push(&us, piece, m, buf) : 0;
      if (fn && !fn(user, t, buf, out)) go_on = false;
      if (piece) piece += m;
      len -= m;
    } while (len && go_on);
    if (!go_on) {
      stopped = true;
      break;
    }
    if (max_tokens >= 0 && produced == max_tokens) break; /* the last need not be evaluated */
    if (at < n_spec) continue; /* a kept draft: evaluated in its step */
    const double t0 = now_ms();
    if (max_draft > 0) {
      at = 0;
      /* a full context ends it: shifting under drafts is not built */
      st = tsr_engine_speculate(e, seq, t, smp, max_draft, spec, &n_spec);
    } else {
      st = step(e, s, seq, t, max_tokens, n_keep, &full);
    }
    eval_ms += now_ms() - t0;
    if (full) break;
    if (st == TSR_OK) s->stat[TSR_STAT_EVAL_STEPS]++;
  }
  /* what a split character still holds (reported with no token: -1) */
  const size_t tail = st == TSR_OK ? tsr_utf8_stream_flush(&us, buf) : 0;
  if (tail && fn) fn(user, -1, buf, tail);
  s->stat[TSR_STAT_GENERATED] = (double)produced;
  s->stat[TSR_STAT_EVAL_MS] = eval_ms;
  atomic_store(&s->generating, GEN_IDLE);
  if (stop && st == TSR_OK)
    *stop = stopped ? TSR_STOP_CANCELLED : full ? TSR_STOP_CONTEXT_FULL : why;
  return st;
}

/* ---- counters and reports ---- */

void tsr_engine_counters(const tsr_engine *e, tsr_counter_fn fn, void *user) {
  if (fn) tsr_plugin_host_each_counter(tsr_engine_setup(e)->host, fn, user);
}

void tsr_engine_reset_counters(tsr_engine *e) {
  tsr_plugin_host_reset_engagement(tsr_engine_setup(e)->host);
}

tsr_status tsr_engine_require_engaged(const tsr_engine *e, const char *const *names, int n) {
  if (n < 0 || (n > 0 && !names))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "require_engaged: %d names", n);
  return tsr_plugin_host_require_engaged(tsr_engine_setup(e)->host, names, n);
}

static void print_report(const void *arg, unsigned what, FILE *f) {
  const tsr_engine *e = arg;
  const struct tsr_plugin_host *h = tsr_engine_setup(e)->host;
  if (what & TSR_REPORT_DECODE) tsr_plugin_host_print_decode_counters(h, f);
  if (what & TSR_REPORT_ENGAGEMENT) tsr_plugin_host_print_engagement(h, f);
  uint64_t captures = 0, replays = 0;
  struct tsr_backend *b = tsr_engine_backend(e);
  if ((what & TSR_REPORT_GRAPHS) && tsr_backend_graph_counts(b, &captures, &replays))
    fprintf(f, "  %-12s graphs: %llu captured, %llu replays\n", tsr_backend_name(b),
            (unsigned long long)captures, (unsigned long long)replays);
}

tsr_status tsr_engine_report(const tsr_engine *e, unsigned what, char **text) {
  if (what & ~(unsigned)(TSR_REPORT_DECODE | TSR_REPORT_ENGAGEMENT | TSR_REPORT_GRAPHS)) {
    *text = NULL;
    return tsr_error_set(TSR_ERR_INVALID_ARG, "report: unknown parts 0x%x", what);
  }
  return capture(print_report, e, what, text);
}
