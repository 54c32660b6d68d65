/*
** `tessera perplexity FILE`: teacher-forced perplexity over a text file, and
** KL divergence of a candidate configuration against a saved base run.
**
** Windows (llama.cpp's convention): the file's tokens are cut into windows of
** --ctx tokens; each runs in a fresh sequence, its first token replaced by BOS
** when the model wants one, and only the second half is scored: the logits at
** positions ctx/2 .. ctx-2 predict the tokens after them, so every scored token
** sees at least ctx/2 tokens of context.
**
** The base file (--kl-divergence-base OUT) is a GGUF holding, per scored
** position, the full-vocabulary log-probabilities as uint16 (stored in an i16
** tensor): d = max_logit - logit, clamped to range = min(40, max - min) nats,
** quantized linearly, q = round(d / range * 65535); the row's range is kept as
** f32. Decoding renormalizes (log-softmax of -d), so the quantization error of
** a log-probability is at most range / 131070 <= 3.1e-4 nats, and the KL bias
** it adds is about E[err^2] / 2 < 1e-7 (measured: < 1e-8, see docs/QUALITY.md).
** Tokens more than 40 nats below the top (probability ratio < 4e-18) are
** stored at 40. The base's per-token NLL (f32) and argmax (i32) are stored
** exactly, so PPL(base) and same-top are not subject to that rounding. The
** file also records the model, KV codecs, vocabulary size and fingerprint, ctx,
** window count, text bytes and hash and the window tokens, and a candidate run
** refuses a base that differs in anything but the model and its settings.
**
** Validity gate: a KL report is refused when the base's mean entropy exceeds
** 0.9 ln(n_vocab). A base that flat (a random-weight model, or a corpus the
** model cannot predict) puts so little mass anywhere that every candidate's KL
** is near zero whatever it damages: the figures would look good and mean
** nothing. Trained models on natural text sit at a few nats (Qwen2.5 0.5B on
** GPL-3: ~1.5 nats against ln(151936) = 11.9). --allow-flat-base reports anyway
** (for tests on random-weight fixtures) and says so on the report.
*/
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "abi/plugin_host.h"
#include "cli.h"
#include "cli_quality.h"
#include "common/error.h"
#include "model/gguf.h"
#include "quality/logprobs.h"

#define MAX_SETS 64
#define LOGPROB_RANGE_MAX 40.0f
#define FLAT_ENTROPY_RATIO 0.9
#define K "tessera.kl_base."

static void ppl_usage(FILE *f) {
  fprintf(f,
          "usage: tessera perplexity FILE (--profile P | -m MODEL.gguf) [--ctx N] [--chunks N]\n"
          "                          [--set key=value]... [--threads N] [--decode]\n"
          "                          [--kl-divergence-base OUT.gguf | --kl-divergence BASE.gguf\n"
          "                           [--allow-flat-base]]\n"
          "Teacher-forced perplexity of FILE in windows of --ctx tokens (default: the\n"
          "profile's context, at most 512; a given --ctx also sizes the context), each in a\n"
          "fresh sequence, scoring the second half of each window. --chunks limits the\n"
          "number of windows. --decode evaluates each window's scored half a token at a time,\n"
          "as decode steps (what decode-only settings act on: decode policies), the first\n"
          "half as one prefill; a base and its candidates must agree on it.\n"
          "--kl-divergence-base saves the run's full-vocabulary\n"
          "log-probabilities (uint16, <= 3.1e-4 nats error) for a later --kl-divergence run,\n"
          "which reports both PPLs, KL(base || this run) mean/median/p99/max and same-top %%.\n"
          "A KL report on a near-flat base (mean entropy > 0.9 ln vocab) is refused (exit 1)\n"
          "unless --allow-flat-base. Run a q8_0 KV candidate as the control: its KL should\n"
          "be near zero, or the instrument is not measuring the codec (docs/QUALITY.md).\n"
          "Exit: 0 ok, 1 runtime error or refused report, 2 usage error or mismatched base.\n");
}

struct ppl_args {
  const char *file, *model, *profile, *base_out, *base_in;
  const char *sets[MAX_SETS + 1];
  int n_sets;
  int64_t ctx, chunks;
  int threads;
  bool allow_flat, decode;
  char ctx_set[32];
};

static int usage_error(const char *fmt, const char *a) {
  fprintf(stderr, "tessera perplexity: ");
  fprintf(stderr, fmt, a);
  fprintf(stderr, "\n(tessera perplexity --help for usage)\n");
  return TSR_EXIT_USAGE;
}

/* Returns -1 when parsing succeeded, else the exit code. */
static int parse_args(int argc, char **argv, struct ppl_args *a) {
  const char *user_sets[MAX_SETS];
  int n_user = 0;
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (tsr_cli_is_help(f)) {
      ppl_usage(stdout);
      return TSR_EXIT_OK;
    }
    if (!strcmp(f, "--allow-flat-base")) { a->allow_flat = true; continue; }
    if (!strcmp(f, "--decode")) { a->decode = true; continue; }
    if (f[0] != '-') {
      if (a->file) return usage_error("unexpected argument '%s'", f);
      a->file = f;
      continue;
    }
    if (i + 1 >= argc) return usage_error("%s needs a value", f);
    const char *v = argv[++i];
    int64_t iv = 0;
    bool ok = true;
    if (!strcmp(f, "-m") || !strcmp(f, "--model")) a->model = v;
    else if (!strcmp(f, "--profile")) a->profile = v;
    else if (!strcmp(f, "--kl-divergence-base")) a->base_out = v;
    else if (!strcmp(f, "--kl-divergence")) a->base_in = v;
    else if (!strcmp(f, "--ctx") || !strcmp(f, "-c")) ok = tsr_cli_parse_i64(v, 4, 1 << 24, &a->ctx);
    else if (!strcmp(f, "--chunks")) ok = tsr_cli_parse_i64(v, 1, INT32_MAX, &a->chunks);
    else if (!strcmp(f, "--threads") || !strcmp(f, "-t")) {
      ok = tsr_cli_parse_i64(v, 1, 4096, &iv);
      a->threads = (int)iv;
    } else if (!strcmp(f, "--set")) {
      if (n_user == MAX_SETS) return usage_error("more than 64 --set%s", "");
      user_sets[n_user++] = v;
    } else return usage_error("unknown option '%s'", f);
    if (!ok) return usage_error("%s: not a valid value", f);
  }
  if (!a->file) return usage_error("no text FILE given%s", "");
  if (!a->model && !a->profile) return usage_error("give -m MODEL.gguf or --profile P%s", "");
  if (a->base_out && a->base_in)
    return usage_error("--kl-divergence-base and --kl-divergence are two separate runs%s", "");
  if (a->allow_flat && !a->base_in) return usage_error("--allow-flat-base needs --kl-divergence%s", "");
  /* --ctx sizes the context first, so a user's own --set context=... still wins */
  if (a->ctx) {
    snprintf(a->ctx_set, sizeof a->ctx_set, "context=%lld", (long long)a->ctx);
    a->sets[a->n_sets++] = a->ctx_set;
  }
  for (int i = 0; i < n_user; i++) a->sets[a->n_sets++] = user_sets[i];
  return -1;
}

static int exit_for(tsr_status st) {
  return (st == TSR_ERR_NOMEM || st == TSR_ERR_INTERNAL || st == TSR_ERR_IO) ? TSR_EXIT_RUNTIME
                                                                            : TSR_EXIT_USAGE;
}

/* ---- the run's identity, written into and checked against a base file ---- */

struct ident {
  char model[256], kv[128], text_hash[17], vocab_hash[17];
  const char *eval; /* "prefill" or "decode" (--decode) */
  uint32_t n_vocab, n_ctx, n_windows;
  uint64_t text_bytes;
};

static void ident_fill(struct ident *id, const struct tsr_setup *s, const struct tsr_tokenizer *tok,
                       const struct tsr_qtext *t, int32_t n_vocab, int32_t ctx, int64_t windows) {
  const char *name = NULL;
  if (tsr_gguf_find_key(s->model, "general.name") >= 0)
    tsr_gguf_get_str(s->model, "general.name", &name);
  if (!name) {
    name = strrchr(s->model_path, '/');
    name = name ? name + 1 : s->model_path;
  }
  snprintf(id->model, sizeof id->model, "%.255s", name);
  tsr_profile_kv_label(s->profile, id->kv, sizeof id->kv);
  snprintf(id->text_hash, sizeof id->text_hash, "%016llx", (unsigned long long)t->hash);
  snprintf(id->vocab_hash, sizeof id->vocab_hash, "%016llx",
           (unsigned long long)tsr_vocab_hash(tok));
  id->n_vocab = (uint32_t)n_vocab;
  id->n_ctx = (uint32_t)ctx;
  id->n_windows = (uint32_t)windows;
  id->text_bytes = t->len;
}

/* ---- statistics ---- */

struct ppl_stats {
  struct tsr_mean_acc nll, nll_base, dnll, kl, same_top, entropy_base;
  double *kls;
  int64_t n_scored;
};

static void print_pm(const char *label, double v, double err, const char *unit) {
  printf("%-26s %.6f +/- %.6f%s\n", label, v, err, unit);
}

static void report_ppl(const char *label, const struct tsr_mean_acc *a) {
  double ppl = exp(tsr_mean_of(a));
  print_pm(label, ppl, ppl * tsr_mean_stderr(a), "");
}

/* Returns the exit code. */
static int report_kl(struct ppl_stats *s, int32_t n_vocab, bool allow_flat) {
  double h = tsr_mean_of(&s->entropy_base), flat = FLAT_ENTROPY_RATIO * log((double)n_vocab);
  bool is_flat = h > flat;
  printf("base mean entropy          %.4f nats (ln vocab %.4f; flat above %.4f)\n", h,
         log((double)n_vocab), flat);
  if (is_flat && !allow_flat) {
    fprintf(stderr, "tessera perplexity: refusing the KL report: the base is near-flat (mean "
            "entropy %.4f nats > 0.9 ln(%d) = %.4f), so every KL figure would be near zero "
            "whatever the candidate does. Use a trained model and natural text (or "
            "--allow-flat-base to report anyway).\n", h, n_vocab, flat);
    return TSR_EXIT_RUNTIME;
  }
  if (is_flat) printf("WARNING: near-flat base; these KL figures do not measure quality\n");
  report_ppl("PPL(base)", &s->nll_base);
  report_ppl("PPL(cand)", &s->nll);
  print_pm("ln(PPL(cand)/PPL(base))", tsr_mean_of(&s->dnll), tsr_mean_stderr(&s->dnll), "");
  printf("%-26s %.6e +/- %.6e nats\n", "mean KL", tsr_mean_of(&s->kl), tsr_mean_stderr(&s->kl));
  tsr_sort_doubles(s->kls, s->n_scored);
  printf("%-26s %.6e nats\n", "median KL", tsr_quantile_sorted(s->kls, s->n_scored, 0.5));
  printf("%-26s %.6e nats\n", "p99 KL", tsr_quantile_sorted(s->kls, s->n_scored, 0.99));
  printf("%-26s %.6e nats\n", "max KL", s->n_scored ? s->kls[s->n_scored - 1] : 0.0);
  double p = tsr_mean_of(&s->same_top), n = (double)s->n_scored;
  print_pm("same top", 100 * p, n > 1 ? 100 * sqrt(p * (1 - p) / (n - 1)) : 0, " %");
  return TSR_EXIT_OK;
}

/* ---- the base file ---- */

struct base_rows {
  uint16_t *q;    /* n_scored x n_vocab */
  float *range, *nll;
  int32_t *argmax, *tokens;
};

static void encode_row(const float *x, int32_t n, uint16_t *q, float *range) {
  float mx = -INFINITY, mn = INFINITY;
  for (int32_t i = 0; i < n; i++) {
    if (x[i] > mx) mx = x[i];
    if (x[i] < mn) mn = x[i];
  }
  float r = mx - mn < LOGPROB_RANGE_MAX ? mx - mn : LOGPROB_RANGE_MAX;
  *range = r;
  double scale = r > 0 ? 65535.0 / r : 0;
  for (int32_t i = 0; i < n; i++) {
    double v = ((double)mx - x[i]) * scale;
    q[i] = (uint16_t)(v >= 65535.0 ? 65535 : lrint(v));
  }
}

static void decode_row(const uint16_t *q, float range, int32_t n, float *logp) {
  const double step = range / 65535.0;
  for (int32_t i = 0; i < n; i++) logp[i] = (float)(-(double)q[i] * step);
  tsr_log_softmax(logp, n, logp);
}

static tsr_status write_base(const char *path, const struct ident *id, const struct base_rows *b,
                             int64_t n_scored) {
  struct tsr_gguf_writer *w = NULL;
  tsr_status st = tsr_gguf_writer_new(&w);
  const int64_t ne_tok[2] = {id->n_ctx, id->n_windows}, ne_q[2] = {id->n_vocab, n_scored},
                ne_row[1] = {n_scored};
  if (st == TSR_OK) st = tsr_gguf_writer_add_u32(w, K "format", 1);
  if (st == TSR_OK) st = tsr_gguf_writer_add_str(w, K "model", id->model);
  if (st == TSR_OK) st = tsr_gguf_writer_add_str(w, K "kv", id->kv);
  if (st == TSR_OK) st = tsr_gguf_writer_add_str(w, K "eval", id->eval);
  if (st == TSR_OK) st = tsr_gguf_writer_add_u32(w, K "n_vocab", id->n_vocab);
  if (st == TSR_OK) st = tsr_gguf_writer_add_u32(w, K "n_ctx", id->n_ctx);
  if (st == TSR_OK) st = tsr_gguf_writer_add_u32(w, K "n_windows", id->n_windows);
  if (st == TSR_OK) st = tsr_gguf_writer_add_u64(w, K "text_bytes", id->text_bytes);
  if (st == TSR_OK) st = tsr_gguf_writer_add_str(w, K "text_hash", id->text_hash);
  if (st == TSR_OK) st = tsr_gguf_writer_add_str(w, K "vocab_hash", id->vocab_hash);
  if (st == TSR_OK) st = tsr_gguf_writer_add_str(w, K "logprob_encoding",
                                                 "u16 (max - logit) / range * 65535, range <= 40");
  if (st == TSR_OK) st = tsr_gguf_writer_add_tensor(w, "tokens", TSR_I32, 2, ne_tok, b->tokens);
  if (st == TSR_OK) st = tsr_gguf_writer_add_tensor(w, "logprobs_q", TSR_I16, 2, ne_q, b->q);
  if (st == TSR_OK)
    st = tsr_gguf_writer_add_tensor(w, "logprobs_range", TSR_F32, 1, ne_row, b->range);
  if (st == TSR_OK) st = tsr_gguf_writer_add_tensor(w, "nll", TSR_F32, 1, ne_row, b->nll);
  if (st == TSR_OK) st = tsr_gguf_writer_add_tensor(w, "argmax", TSR_I32, 1, ne_row, b->argmax);
  if (st == TSR_OK) st = tsr_gguf_writer_write(w, path);
  tsr_gguf_writer_free(w);
  return st;
}

static tsr_status base_tensor(const struct tsr_gguf *g, const char *name, enum tsr_dtype dt,
                              int64_t n, const void **data) {
  const struct tsr_gguf_tensor *t = tsr_gguf_find_tensor(g, name);
  if (!t || t->dtype != dt || t->n_elements != n)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor '%s' is missing or not %s with %lld values",
                         tsr_gguf_path(g), name, tsr_dtype_name(dt), (long long)n);
  *data = t->data;
  return TSR_OK;
}

static tsr_status mismatch(const char *path, const char *what, const char *base, const char *ours) {
  return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: %s differs: the base has %s, this run %s; KL "
                       "against it would compare unlike with unlike (make a new base with "
                       "--kl-divergence-base)", path, what, base, ours);
}

/* Opens a base file and checks it was made on the same text, windows and vocabulary. */
static tsr_status open_base(const char *path, const struct ident *ours, struct tsr_gguf **out,
                            struct base_rows *b, int64_t *n_windows) {
  struct tsr_gguf *g = NULL;
  tsr_status st = tsr_gguf_open(path, &g);
  if (st != TSR_OK) return st;
  uint32_t fmt = 0, n_vocab = 0, n_ctx = 0, nw = 0;
  uint64_t bytes = 0;
  const char *model = NULL, *kv = NULL, *th = NULL, *vh = NULL;
  char a[64], c[64];
  if ((st = tsr_gguf_get_u32(g, K "format", &fmt)) == TSR_OK && fmt != 1)
    st = tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: base format %u (this tessera reads 1)", path, fmt);
  if (st == TSR_OK) st = tsr_gguf_get_str(g, K "model", &model);
  if (st == TSR_OK) st = tsr_gguf_get_str(g, K "kv", &kv);
  if (st == TSR_OK) st = tsr_gguf_get_u32(g, K "n_vocab", &n_vocab);
  if (st == TSR_OK) st = tsr_gguf_get_u32(g, K "n_ctx", &n_ctx);
  if (st == TSR_OK) st = tsr_gguf_get_u32(g, K "n_windows", &nw);
  if (st == TSR_OK) st = tsr_gguf_get_u64(g, K "text_bytes", &bytes);
  if (st == TSR_OK) st = tsr_gguf_get_str(g, K "text_hash", &th);
  if (st == TSR_OK) st = tsr_gguf_get_str(g, K "vocab_hash", &vh);
  const char *eval = "prefill"; /* a base from before --decode evaluated windows whole */
  if (st == TSR_OK && tsr_gguf_find_key(g, K "eval") >= 0)
    st = tsr_gguf_get_str(g, K "eval", &eval);
  if (st == TSR_OK && strcmp(eval, ours->eval))
    st = mismatch(path, "how the scored tokens were evaluated (--decode)", eval, ours->eval);
  if (st == TSR_OK && n_vocab != ours->n_vocab) {
    snprintf(a, sizeof a, "%u", n_vocab), snprintf(c, sizeof c, "%u", ours->n_vocab);
    st = mismatch(path, "the vocabulary size", a, c);
  }
  if (st == TSR_OK && strcmp(vh, ours->vocab_hash))
    st = mismatch(path, "the vocabulary (fingerprint)", vh, ours->vocab_hash);
  if (st == TSR_OK && n_ctx != ours->n_ctx) {
    snprintf(a, sizeof a, "%u", n_ctx), snprintf(c, sizeof c, "%u", ours->n_ctx);
    st = mismatch(path, "the window size (--ctx)", a, c);
  }
  if (st == TSR_OK && (bytes != ours->text_bytes || strcmp(th, ours->text_hash))) {
    snprintf(a, sizeof a, "%llu bytes, hash %s", (unsigned long long)bytes, th);
    snprintf(c, sizeof c, "%llu bytes, hash %s", (unsigned long long)ours->text_bytes,
             ours->text_hash);
    st = mismatch(path, "the text", a, c);
  }
  const int64_t n_scored = (int64_t)nw * (n_ctx - 1 - n_ctx / 2);
  const void *p = NULL;
  if (st == TSR_OK && (st = base_tensor(g, "tokens", TSR_I32, (int64_t)nw * n_ctx, &p)) == TSR_OK)
    b->tokens = (int32_t *)p;
  if (st == TSR_OK &&
      (st = base_tensor(g, "logprobs_q", TSR_I16, n_scored * (int64_t)n_vocab, &p)) == TSR_OK)
    b->q = (uint16_t *)p;
  if (st == TSR_OK && (st = base_tensor(g, "logprobs_range", TSR_F32, n_scored, &p)) == TSR_OK)
    b->range = (float *)p;
  if (st == TSR_OK && (st = base_tensor(g, "nll", TSR_F32, n_scored, &p)) == TSR_OK)
    b->nll = (float *)p;
  if (st == TSR_OK && (st = base_tensor(g, "argmax", TSR_I32, n_scored, &p)) == TSR_OK)
    b->argmax = (int32_t *)p;
  if (st != TSR_OK) {
    tsr_gguf_close(g);
    return st;
  }
  if (strcmp(model, ours->model))
    fprintf(stderr, "note: base model %s, this run %s\n", model, ours->model);
  fprintf(stderr, "base: %s (%s), kv %s; this run: kv %s\n", path, model, kv, ours->kv);
  *n_windows = nw;
  *out = g;
  return TSR_OK;
}

/* ---- the command ---- */

struct ppl_run {
  struct tsr_engine *e;
  struct tsr_tokenizer *tok;
  struct tsr_qtext text;
  struct tsr_gguf *base;
  struct base_rows b;    /* the base's rows (read), or this run's (written) */
  float *logits, *logp, *logp_base;
  int32_t *window;
};

static int run(const struct ppl_args *a, struct ppl_run *r) {
  const struct tsr_setup *s = tsr_engine_setup(r->e);
  const int32_t n_vocab = tsr_engine_n_vocab(r->e);
  tsr_status st = tsr_tokenizer_load(s->model, &r->tok);
  if (st != TSR_OK) {
    fprintf(stderr, "tessera perplexity: %s\n", tsr_error_message());
    return exit_for(st);
  }
  if ((st = tsr_qtext_load(a->file, r->tok, false, &r->text)) != TSR_OK) {
    fprintf(stderr, "tessera perplexity: %s\n", tsr_error_message());
    return TSR_EXIT_USAGE; /* an unreadable or untokenizable input */
  }
  int64_t ctx = a->ctx ? a->ctx : (s->profile->context < 512 ? s->profile->context : 512);
  if (ctx > s->profile->context) {
    fprintf(stderr, "tessera perplexity: --ctx %lld exceeds the profile's context %lld\n",
            (long long)ctx, (long long)s->profile->context);
    return TSR_EXIT_USAGE;
  }
  if (ctx < 4) return usage_error("a window needs at least 4 tokens (--ctx)%s", "");
  int64_t windows = (int64_t)r->text.n_ids / ctx;
  if (a->chunks && a->chunks < windows) windows = a->chunks;
  if (windows == 0) {
    fprintf(stderr, "tessera perplexity: %s: %zu tokens, fewer than one window of %lld\n",
            a->file, r->text.n_ids, (long long)ctx);
    return TSR_EXIT_USAGE;
  }
  const int32_t first = (int32_t)(ctx / 2), per_window = (int32_t)(ctx - 1 - first);
  struct ident id;
  ident_fill(&id, s, r->tok, &r->text, n_vocab, (int32_t)ctx, windows);
  id.eval = a->decode ? "decode" : "prefill";
  if (a->base_in) {
    int64_t base_windows = 0;
    st = open_base(a->base_in, &id, &r->base, &r->b, &base_windows);
    if (st == TSR_OK && a->chunks && a->chunks != base_windows)
      st = tsr_error_set(TSR_ERR_INVALID_ARG, "%s: the base holds %lld windows, --chunks asks "
                         "for %lld", a->base_in, (long long)base_windows, (long long)a->chunks);
    if (st == TSR_OK && base_windows * ctx > (int64_t)r->text.n_ids)
      st = tsr_error_set(TSR_ERR_INVALID_ARG, "%s: the base holds %lld windows, the text has "
                         "tokens for %lld: the tokenizers differ", a->base_in,
                         (long long)base_windows, (long long)windows);
    if (st != TSR_OK) {
      fprintf(stderr, "tessera perplexity: %s\n", tsr_error_message());
      return exit_for(st);
    }
    windows = base_windows;
  }
  const int64_t n_scored = windows * per_window;
  const size_t V = (size_t)n_vocab;
  r->logits = malloc((size_t)ctx * V * sizeof *r->logits);
  r->logp = malloc(V * sizeof *r->logp);
  r->logp_base = malloc(V * sizeof *r->logp_base);
  r->window = malloc((size_t)ctx * sizeof *r->window);
  struct ppl_stats ps = {.n_scored = n_scored};
  ps.kls = a->base_in ? malloc((size_t)n_scored * sizeof *ps.kls) : NULL;
  bool oom = !r->logits || !r->logp || !r->logp_base || !r->window || (a->base_in && !ps.kls);
  if (a->base_out && !oom) {
    r->b.q = malloc((size_t)n_scored * V * sizeof *r->b.q);
    r->b.range = malloc((size_t)n_scored * sizeof(float));
    r->b.nll = malloc((size_t)n_scored * sizeof(float));
    r->b.argmax = malloc((size_t)n_scored * sizeof(int32_t));
    r->b.tokens = malloc((size_t)(windows * ctx) * sizeof(int32_t));
    oom = !r->b.q || !r->b.range || !r->b.nll || !r->b.argmax || !r->b.tokens;
  }
  if (oom) {
    fprintf(stderr, "tessera perplexity: out of memory (%lld positions x %d vocabulary)\n",
            (long long)n_scored, n_vocab);
    free(ps.kls);
    return TSR_EXIT_RUNTIME;
  }
  printf("perplexity: %s, %zu bytes, %zu tokens; %lld windows of %lld, scoring %d per window "
         "(second half%s)\n", a->file, r->text.len, r->text.n_ids, (long long)windows,
         (long long)ctx, per_window, a->decode ? ", decoded a token at a time" : "");
  printf("model: %s, kv %s\n", id.model, id.kv);
  fflush(stdout);
  const double t0 = tsr_now_s();
  const bool progress = isatty(STDERR_FILENO);
  int code = TSR_EXIT_OK;
  for (int64_t w = 0; w < windows && code == TSR_EXIT_OK; w++) {
    st = tsr_qtext_eval_window(r->e, r->tok, &r->text, (int32_t)ctx, w,
                               a->decode ? first : (int32_t)ctx, r->window, r->logits);
    if (st == TSR_OK && a->base_in &&
        memcmp(r->window, r->b.tokens + w * ctx, (size_t)ctx * sizeof *r->window))
      st = tsr_error_set(TSR_ERR_INVALID_ARG, "%s: window %lld holds other tokens than this "
                         "run's: the tokenizers differ", a->base_in, (long long)w + 1);
    if (st != TSR_OK) {
      fprintf(stderr, "tessera perplexity: %s\n", tsr_error_message());
      code = exit_for(st);
      break;
    }
    if (a->base_out) memcpy(r->b.tokens + w * ctx, r->window, (size_t)ctx * sizeof *r->window);
    for (int32_t j = first; j < ctx - 1; j++) {
      const int64_t k = w * per_window + (j - first);
      const float *row = r->logits + (size_t)j * V;
      tsr_log_softmax(row, n_vocab, r->logp);
      const double nll = -(double)r->logp[r->window[j + 1]];
      tsr_mean_add(&ps.nll, nll);
      const int32_t top = (int32_t)tsr_logits_argmax(row, n_vocab);
      if (a->base_out) {
        encode_row(row, n_vocab, r->b.q + (size_t)k * V, &r->b.range[k]);
        r->b.nll[k] = (float)nll;
        r->b.argmax[k] = top;
        tsr_mean_add(&ps.entropy_base, tsr_entropy(r->logp, n_vocab));
      }
      if (a->base_in) {
        decode_row(r->b.q + (size_t)k * V, r->b.range[k], n_vocab, r->logp_base);
        tsr_mean_add(&ps.entropy_base, tsr_entropy(r->logp_base, n_vocab));
        tsr_mean_add(&ps.nll_base, r->b.nll[k]);
        tsr_mean_add(&ps.dnll, nll - r->b.nll[k]);
        double kl = tsr_kl(r->logp_base, r->logp, n_vocab);
        ps.kls[k] = kl;
        tsr_mean_add(&ps.kl, kl);
        tsr_mean_add(&ps.same_top, top == r->b.argmax[k]);
      }
    }
    if (progress)
      fprintf(stderr, "\r[%lld/%lld] PPL %.4f", (long long)w + 1, (long long)windows,
              exp(tsr_mean_of(&ps.nll)));
  }
  if (progress) fprintf(stderr, "\r\033[K");
  const double secs = tsr_now_s() - t0;
  if (code == TSR_EXIT_OK) {
    report_ppl("PPL", &ps.nll);
    printf("%-26s %lld\n", "tokens scored", (long long)n_scored);
    printf("%-26s %.3f s (%.1f tokens/s evaluated)\n", "time", secs,
           secs > 0 ? (double)(windows * ctx) / secs : 0.0);
    tsr_plugin_host_print_decode_counters(s->host, stdout);
    if (a->base_out) {
      printf("%-26s %.4f nats (ln vocab %.4f)\n", "mean entropy", tsr_mean_of(&ps.entropy_base),
             log((double)n_vocab));
      st = write_base(a->base_out, &id, &r->b, n_scored);
      if (st != TSR_OK) {
        fprintf(stderr, "tessera perplexity: %s\n", tsr_error_message());
        code = TSR_EXIT_RUNTIME;
      } else {
        printf("base written: %s (%lld positions)\n", a->base_out, (long long)n_scored);
      }
    }
    if (a->base_in) code = report_kl(&ps, n_vocab, a->allow_flat);
  }
  free(ps.kls);
  return code;
}

int tsr_cli_perplexity(int argc, char **argv) {
  struct ppl_args a = {0};
  int code = parse_args(argc, argv, &a);
  if (code >= 0) return code;
  struct tsr_engine_options opt = {.profile_path = a.profile, .sets = a.sets, .n_sets = a.n_sets,
                                   .model_path = a.model, .n_threads = a.threads};
  struct ppl_run r = {0};
  tsr_status st = tsr_engine_new(&opt, &r.e);
  if (st != TSR_OK) {
    fprintf(stderr, "tessera perplexity: %s\n", tsr_error_message());
    return exit_for(st);
  }
  code = run(&a, &r);
  if (r.base) {
    tsr_gguf_close(r.base);
  } else {
    free(r.b.q), free(r.b.range), free(r.b.nll), free(r.b.argmax), free(r.b.tokens);
  }
  free(r.logits), free(r.logp), free(r.logp_base), free(r.window);
  tsr_qtext_free(&r.text);
  tsr_tokenizer_free(r.tok);
  tsr_engine_free(r.e);
  return code;
}
