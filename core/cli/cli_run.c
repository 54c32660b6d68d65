/* `tessera run`: generate text from a prompt, or chat, streaming to stdout. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "graph/backend.h"
#include "model/chat.h"
#include "cli.h"
#include "engine/engine.h"
#include "common/file.h"
#include "common/error.h"
#include "engine/sampler.h"
#include "model/tokenizer.h"

#define MAX_SETS 64
#define MAX_REQUIRED 16

static void run_usage(FILE *f) {
  fprintf(f,
          "usage: tessera run (-m MODEL.gguf | --profile P) [-p PROMPT | -f FILE] [-n N]\n"
          "                   [--temp T] [--top-k K] [--top-p P] [--min-p P] [--seed S]\n"
          "                   [--chat] [--chat-template chatml|gemma|gemma4] [--system TEXT]\n"
          "                   [--set key=value]... [--threads N] [--require-engaged PLUGIN]...\n"
          "                   [--keep N] [--verbose]\n"
          "Streams the continuation of PROMPT to stdout (special tokens in it are parsed).\n"
          "Sampling flags override the profile's sampling defaults; --seed -1 draws a random\n"
          "seed (--verbose prints it). -n N stops after N tokens (-1: until an end-of-\n"
          "generation token). A full context is shifted: the first --keep N tokens (default\n"
          "4) stay, half of the rest is dropped, a note goes to stderr; a model that cannot\n"
          "shift (recurrent layers) stops there (-n -1) or fails (a fixed -n). -m without\n"
          "--profile runs the model with\n"
          "the default profile. --chat reads user lines from stdin (PROMPT, if given, is the\n"
          "first) and renders the conversation with the model's chat template, or the one\n"
          "--chat-template names. Timing goes to stderr. --require-engaged fails the run\n"
          "(exit 1) if PLUGIN counted no work (exit 2 if it is not loaded).\n");
}

struct run_args {
  const char *model, *profile, *prompt, *prompt_file, *system, *chat_template;
  const char *sets[MAX_SETS];
  int n_sets;
  const char *required[MAX_REQUIRED];
  int n_required;
  bool has_n, has_temp, has_top_k, has_top_p, has_min_p, has_seed;
  int64_t n_predict, seed;
  double temp, top_p, min_p;
  int64_t top_k, keep;
  int threads;
  bool chat, verbose;
};

static int usage_error(const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "tessera run: ");
  fprintf(stderr, fmt, a, b);
  fprintf(stderr, "\n(tessera run --help for usage)\n");
  return TSR_EXIT_USAGE;
}

static bool parse_f64(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v)) return false;
  *out = v;
  return true;
}

/* Returns -1 when parsing succeeded, else the exit code. */
static int parse_args(int argc, char **argv, struct run_args *a) {
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (tsr_cli_is_help(f)) {
      run_usage(stdout);
      return TSR_EXIT_OK;
    }
    if (!strcmp(f, "--chat")) { a->chat = true; continue; }
    if (!strcmp(f, "--verbose") || !strcmp(f, "-v")) { a->verbose = true; continue; }
    if (f[0] != '-') return usage_error("unexpected argument '%s'%s", f, "");
    if (i + 1 >= argc) return usage_error("%s needs a value%s", f, "");
    const char *v = argv[++i];
    int64_t iv;
    bool ok = true;
    if (!strcmp(f, "-m") || !strcmp(f, "--model")) a->model = v;
    else if (!strcmp(f, "--profile")) a->profile = v;
    else if (!strcmp(f, "-p") || !strcmp(f, "--prompt")) a->prompt = v;
    else if (!strcmp(f, "-f") || !strcmp(f, "--file")) a->prompt_file = v;
    else if (!strcmp(f, "--system")) a->system = v;
    else if (!strcmp(f, "--chat-template")) a->chat_template = v;
    else if (!strcmp(f, "-n") || !strcmp(f, "--n-predict"))
      ok = a->has_n = tsr_cli_parse_i64(v, -1, INT32_MAX, &a->n_predict);
    else if (!strcmp(f, "--temp")) ok = a->has_temp = parse_f64(v, &a->temp);
    else if (!strcmp(f, "--top-k")) ok = a->has_top_k = tsr_cli_parse_i64(v, 0, INT32_MAX, &a->top_k);
    else if (!strcmp(f, "--top-p")) ok = a->has_top_p = parse_f64(v, &a->top_p);
    else if (!strcmp(f, "--min-p")) ok = a->has_min_p = parse_f64(v, &a->min_p);
    else if (!strcmp(f, "--seed")) ok = a->has_seed = tsr_cli_parse_i64(v, INT64_MIN, INT64_MAX, &a->seed);
    else if (!strcmp(f, "--keep")) ok = tsr_cli_parse_i64(v, 0, INT32_MAX, &a->keep);
    else if (!strcmp(f, "--threads") || !strcmp(f, "-t")) {
      ok = tsr_cli_parse_i64(v, 1, 4096, &iv);
      a->threads = (int)iv;
    } else if (!strcmp(f, "--set")) {
      if (a->n_sets == MAX_SETS) return usage_error("more than 64 --set%s%s", "", "");
      a->sets[a->n_sets++] = v;
    } else if (!strcmp(f, "--require-engaged")) {
      if (a->n_required == MAX_REQUIRED)
        return usage_error("more than 16 --require-engaged%s%s", "", "");
      a->required[a->n_required++] = v;
    } else return usage_error("unknown option '%s'%s", f, "");
    if (!ok) return usage_error("%s: '%s' is not a valid value", f, v);
  }
  if (!a->model && !a->profile) return usage_error("give -m MODEL.gguf or --profile P%s%s", "", "");
  if (a->prompt && a->prompt_file) return usage_error("-p and -f both given%s%s", "", "");
  if (!a->chat && !a->prompt && !a->prompt_file)
    return usage_error("no prompt: give -p PROMPT, -f FILE or --chat%s%s", "", "");
  if (!a->chat && (a->system || a->chat_template))
    return usage_error("%s needs --chat", a->system ? "--system" : "--chat-template", "");
  return -1;
}

static int exit_for(tsr_status st) {
  return (st == TSR_ERR_NOMEM || st == TSR_ERR_INTERNAL) ? TSR_EXIT_RUNTIME : TSR_EXIT_USAGE;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static uint64_t random_seed(void) {
  uint64_t s = 0;
  FILE *f = fopen("/dev/urandom", "rb");
  if (!f || fread(&s, sizeof s, 1, f) != 1)
    s = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
  if (f) fclose(f);
  return s;
}

/* NULL with the error set when the file cannot be opened or holds a NUL byte (the
** prompt is a C string: it would end there) */
static char *read_file(const char *path) {
  FILE *f;
  tsr_error_clear();
  if (tsr_file_fopen(path, &f) != TSR_OK) return NULL;
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  while (buf) {
    len += fread(buf + len, 1, cap - 1 - len, f);
    if (len < cap - 1) break;
    char *nb = realloc(buf, cap * 2);
    if (!nb) free(buf);
    buf = nb;
    cap *= 2;
  }
  bool bad = ferror(f);
  fclose(f);
  if (!buf || bad) {
    free(buf);
    errno = bad ? EIO : ENOMEM;
    return NULL;
  }
  buf[len] = 0;
  const char *nul = memchr(buf, 0, len);
  if (nul) {
    tsr_error_set(TSR_ERR_INVALID_ARG, "%s holds a NUL byte at offset %zu; a prompt is text",
                  path, (size_t)(nul - buf));
    free(buf);
    return NULL;
  }
  return buf;
}

/* ---- the generation state: one sequence, the tokens it holds, timings ---- */

struct gen {
  struct tsr_engine *e;
  struct tsr_tokenizer *tok;
  struct tsr_sampler *smp;
  float *logits;
  int32_t ubatch, keep; /* keep: tokens a context shift keeps at the start */
  int32_t max_draft;    /* > 0: decode through the profile's speculator, drafting this many */
  bool progress, verbose;
  int64_t n_prompt, n_eval, n_sampled;
  double ms_prompt, ms_eval;
};

/* Makes the sequence hold exactly tokens[0..n) and leaves the last one's logits in
** g->logits, evaluating only what differs from what it holds already. */
static tsr_status feed(struct gen *g, const int32_t *tokens, size_t n) {
  if (n == 0) return tsr_error_set(TSR_ERR_INVALID_ARG, "the prompt is empty (0 tokens)");
  /* the engine remembers what the sequence holds: reuse the common prefix */
  size_t keep = (size_t)tsr_engine_common_prefix(g->e, 0, tokens,
                                                 n > INT32_MAX ? INT32_MAX : (int32_t)n);
  if (keep == n) keep = n - 1; /* the last token is evaluated again for its logits */
  if ((int32_t)keep < tsr_engine_seq_len(g->e, 0)) {
    tsr_status st = tsr_engine_seq_rm(g->e, 0, (int32_t)keep, -1);
    if (st != TSR_OK && keep > 0) {
      /* a recurrent state cannot forget part of a sequence: start it again */
      keep = 0;
      st = tsr_engine_seq_rm(g->e, 0, 0, -1);
    }
    if (st != TSR_OK) return st;
  }
  size_t todo = n - keep;
  size_t chunk = g->progress && todo > (size_t)g->ubatch * 2 ? (size_t)g->ubatch : todo;
  double t0 = now_ms();
  for (size_t done = 0; done < todo;) {
    size_t m = todo - done < chunk ? todo - done : chunk;
    tsr_status st = tsr_engine_eval(g->e, 0, tokens + keep + done, (int32_t)m, g->logits, NULL);
    if (st != TSR_OK) return st;
    done += m;
    if (chunk < todo) fprintf(stderr, "\rprefill %zu/%zu tokens", done, todo);
  }
  if (chunk < todo) fprintf(stderr, "\r\033[K");
  g->ms_prompt += now_ms() - t0;
  g->n_prompt += (int64_t)todo;
  if (g->verbose)
    fprintf(stderr, "prompt: %zu tokens, %zu already held, %zu evaluated\n", n, keep, todo);
  return TSR_OK;
}

/* A full context: keep the first g->keep tokens, drop half of the rest, say so. */
static tsr_status shift(struct gen *g) {
  const int32_t len = tsr_engine_seq_len(g->e, 0);
  const int32_t discard = len > g->keep ? (len - g->keep) / 2 : 0;
  if (discard < 1)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "cannot shift: --keep %d leaves nothing of the %d "
                         "tokens to drop", g->keep, len);
  tsr_status st = tsr_engine_context_shift(g->e, 0, g->keep, discard);
  if (st == TSR_OK)
    fprintf(stderr, "\n(context full at %d tokens: shifted, kept the first %d, dropped the next "
            "%d)\n", len, g->keep, discard);
  return st;
}

static void emit(const char *s, size_t n, char **text, size_t *len) {
  if (!n) return;
  fwrite(s, 1, n, stdout);
  fflush(stdout);
  if (!text) return;
  char *p = realloc(*text, *len + n + 1);
  if (!p) return; /* the transcript loses this piece; the output did not */
  memcpy(p + *len, s, n);
  *len += n;
  p[*len] = 0;
  *text = p;
}

/* Samples up to max tokens (< 0: no limit) after the logits in g->logits, streaming them.
** When text is not NULL it gets the generated text (malloc'd). */
static tsr_status generate(struct gen *g, int64_t max, char **text) {
  struct tsr_utf8_stream us = TSR_UTF8_STREAM_INIT;
  char *out = NULL;
  size_t out_len = 0;
  int64_t produced = 0;
  const char *why = "limit";
  tsr_status st = TSR_OK;
  char buf[512];
  /* with a speculator: the tokens of the last speculative step still to emit (the
  ** kept drafts, in the cache already, then the target's token, not yet evaluated) */
  int32_t step[64], n_step = 0, at = 0;
  while (max < 0 || produced < max) {
    int32_t t;
    if (at < n_step) t = step[at++];
    else st = tsr_sampler_sample(g->smp, g->logits, &t);
    if (st != TSR_OK) break;
    if (tsr_tokenizer_is_eog(g->tok, t)) {
      why = "end of generation";
      break;
    }
    produced++;
    size_t len = 0;
    const char *piece = tsr_tokenizer_piece(g->tok, t, &len);
    while (piece && len) {
      size_t m = len < sizeof buf - 3 ? len : sizeof buf - 3;
      emit(buf, tsr_utf8_stream_push(&us, piece, m, buf), &out, &out_len);
      piece += m;
      len -= m;
    }
    if (max >= 0 && produced == max) break; /* the last token need not be evaluated */
    if (at < n_step) continue; /* a kept draft: evaluated in its step */
    double t0 = now_ms();
    if (g->max_draft > 0) {
      at = 0;
      st = tsr_engine_speculate(g->e, 0, t, g->smp, g->max_draft, step, &n_step);
      g->ms_eval += now_ms() - t0;
      if (st != TSR_OK) break; /* a full context ends it: shifting under drafts is not built */
      g->n_eval++;
      continue;
    }
    st = tsr_engine_eval(g->e, 0, &t, 1, g->logits, NULL);
    if (st == TSR_ERR_NOMEM) {
      char full[512];
      snprintf(full, sizeof full, "%s", tsr_error_message());
      st = shift(g);
      if (st == TSR_OK) {
        st = tsr_engine_eval(g->e, 0, &t, 1, g->logits, NULL);
      } else if (st == TSR_ERR_UNSUPPORTED && max < 0) {
        /* running until a context that cannot shift is full is a normal way to stop */
        fprintf(stderr, "\n(stopped: %s; %s)\n", full, tsr_error_message());
        why = "context full";
        st = TSR_OK;
        break;
      } else {
        char why_not[512];
        snprintf(why_not, sizeof why_not, "%s", tsr_error_message());
        st = tsr_error_set(st == TSR_ERR_UNSUPPORTED ? TSR_ERR_NOMEM : st, "%s; %s", full,
                           why_not);
      }
    }
    g->ms_eval += now_ms() - t0;
    if (st != TSR_OK) break;
    g->n_eval++;
  }
  emit(buf, tsr_utf8_stream_flush(&us, buf), &out, &out_len);
  g->n_sampled += produced;
  if (g->verbose) fprintf(stderr, "\ngenerated: %lld tokens (stop: %s)\n", (long long)produced,
                          st == TSR_OK ? why : "error");
  if (text) *text = out ? out : calloc(1, 1);
  else free(out);
  return st;
}

/* special_ok: which bytes may hold special tokens (NULL: all). */
static tsr_status encode(struct gen *g, const char *text, const unsigned char *special_ok,
                         int32_t **ids, size_t *n) {
  return tsr_tokenizer_encode_marked(g->tok, text, strlen(text), true, special_ok, true, ids, n);
}

/* ---- chat ---- */

struct conv {
  struct tsr_chat_message *m;
  size_t n, cap;
};

static tsr_status conv_add(struct conv *c, const char *role, char *content /* owned */) {
  if (c->n == c->cap) {
    size_t cap = c->cap ? c->cap * 2 : 16;
    struct tsr_chat_message *p = realloc(c->m, cap * sizeof *p);
    if (!p) {
      free(content);
      return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
    }
    c->m = p;
    c->cap = cap;
  }
  c->m[c->n++] = (struct tsr_chat_message){role, content};
  return TSR_OK;
}

static void conv_free(struct conv *c) {
  for (size_t i = 0; i < c->n; i++) free((char *)c->m[i].content);
  free(c->m);
}

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

/* One user turn: render everything so far, feed what is new, stream the reply. */
static tsr_status chat_turn(struct gen *g, enum tsr_chat_template tmpl, struct conv *c,
                            int64_t max) {
  char *prompt = NULL;
  int32_t *ids = NULL;
  size_t n = 0;
  unsigned char *template_bytes = NULL;
  tsr_status st = tsr_chat_render_marked(tmpl, c->m, c->n, true, &prompt, &template_bytes);
  if (st == TSR_OK && g->verbose) fprintf(stderr, "rendered prompt:\n%s\n", prompt);
  if (st == TSR_OK) st = encode(g, prompt, template_bytes, &ids, &n);
  if (st == TSR_OK) st = feed(g, ids, n);
  free(prompt);
  free(template_bytes);
  free(ids);
  char *reply = NULL;
  if (st == TSR_OK) st = generate(g, max, &reply);
  if (reply) {
    fputc('\n', stdout);
    fflush(stdout);
    tsr_status st2 = conv_add(c, "assistant", reply);
    if (st == TSR_OK) st = st2;
  }
  return st;
}

static tsr_status chat_loop(struct gen *g, enum tsr_chat_template tmpl, const struct run_args *a,
                            const char *first, int64_t max) {
  struct conv c = {0};
  tsr_status st = TSR_OK;
  if (a->system) {
    char *s = dup_str(a->system);
    st = s ? conv_add(&c, "system", s) : tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  }
  bool tty = isatty(STDIN_FILENO);
  char *line = NULL;
  size_t cap = 0;
  while (st == TSR_OK) {
    char *user = NULL;
    if (first) {
      user = dup_str(first);
      first = NULL;
    } else {
      if (tty) fprintf(stderr, "> ");
      ssize_t len = getline(&line, &cap, stdin);
      if (len < 0) break;
      while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
      if (len == 0) continue;
      user = dup_str(line);
    }
    if (!user) st = tsr_error_set(TSR_ERR_NOMEM, "out of memory");
    if (st == TSR_OK) st = conv_add(&c, "user", user);
    if (st == TSR_OK) st = chat_turn(g, tmpl, &c, max);
  }
  free(line);
  conv_free(&c);
  return st;
}

/* ---- the command ---- */

static void print_timing(const struct gen *g) {
  fprintf(stderr, "prompt eval: %lld tokens in %.2f ms (%.2f tok/s)\n", (long long)g->n_prompt,
          g->ms_prompt, g->ms_prompt > 0 ? 1e3 * (double)g->n_prompt / g->ms_prompt : 0.0);
  if (g->max_draft > 0) /* a step evaluates its token and the drafts the target kept */
    fprintf(stderr, "eval: %lld speculative steps for %lld tokens in %.2f ms (%.2f tok/s)\n",
            (long long)g->n_eval, (long long)g->n_sampled, g->ms_eval,
            g->ms_eval > 0 ? 1e3 * (double)g->n_sampled / g->ms_eval : 0.0);
  else
    fprintf(stderr, "eval: %lld tokens in %.2f ms (%.2f tok/s)\n", (long long)g->n_eval,
            g->ms_eval, g->ms_eval > 0 ? 1e3 * (double)g->n_eval / g->ms_eval : 0.0);
}

static tsr_status sampler_params(const struct run_args *a, const struct tsr_profile *p,
                                 struct tsr_sampler_params *sp, bool *random) {
  sp->temperature = (float)(a->has_temp ? a->temp : p->sampling.temperature);
  sp->top_k = (int32_t)(a->has_top_k ? a->top_k : p->sampling.top_k);
  sp->top_p = (float)(a->has_top_p ? a->top_p : p->sampling.top_p);
  sp->min_p = (float)(a->has_min_p ? a->min_p : p->sampling.min_p);
  int64_t seed = a->has_seed ? a->seed : p->sampling.seed;
  *random = seed == -1;
  sp->seed = *random ? random_seed() : (uint64_t)seed;
  return TSR_OK;
}

static int run(const struct run_args *a, struct tsr_engine *e, const char *prompt_text) {
  const struct tsr_setup *s = tsr_engine_setup(e);
  struct gen g = {.e = e, .verbose = a->verbose, .keep = (int32_t)a->keep};
  g.ubatch = s->profile->ubatch > 0 ? s->profile->ubatch : 512;
  /* a speculator drafts up to 8 tokens a step; a draft and its token fit one ubatch */
  if (s->profile->has_speculator)
    g.max_draft = g.ubatch - 1 < TSR_SPEC_MAX_DRAFT ? g.ubatch - 1 : TSR_SPEC_MAX_DRAFT;
  g.progress = isatty(STDERR_FILENO);
  const char *where = s->model_path;
  tsr_status st = tsr_tokenizer_load(s->model, &g.tok);
  if (st != TSR_OK) {
    fprintf(stderr, "tessera run: %s\n", tsr_error_message()); /* it names the file */
    return exit_for(st);
  }
  int code = TSR_EXIT_OK;
  enum tsr_chat_template tmpl = 0;
  const char *tmpl_source = NULL;
  if (a->chat && (st = tsr_setup_chat_template(s, a->chat_template,
                                               tsr_tokenizer_chat_template(g.tok), &tmpl,
                                               &tmpl_source)) != TSR_OK) {
    fprintf(stderr, "tessera run: %s: %s (choose one with --chat-template chatml|gemma|gemma4)\n",
            where, tsr_error_message());
    code = TSR_EXIT_USAGE;
    goto done;
  }
  /* a required plugin that is not even loaded can be named before any work */
  for (int i = 0; i < a->n_required; i++)
    if (!tsr_plugin_host_find_plugin(s->host, a->required[i])) {
      st = tsr_plugin_host_require_engaged(s->host, &a->required[i], 1);
      fprintf(stderr, "tessera run: %s\n", tsr_error_message());
      code = exit_for(st);
      goto done;
    }
  struct tsr_sampler_params sp;
  bool random = false;
  sampler_params(a, s->profile, &sp, &random);
  st = tsr_sampler_new(&sp, tsr_engine_n_vocab(e), &g.smp);
  g.logits = malloc((size_t)tsr_engine_n_vocab(e) * sizeof *g.logits);
  if (st != TSR_OK || !g.logits) {
    fprintf(stderr, "tessera run: %s\n", st != TSR_OK ? tsr_error_message() : "out of memory");
    code = st != TSR_OK ? TSR_EXIT_USAGE : TSR_EXIT_RUNTIME;
    goto done;
  }
  int64_t max = a->has_n ? a->n_predict : s->profile->sampling.max_tokens;
  if (a->verbose) {
    fprintf(stderr, "model: %s (%s)\n", where, s->arch_name ? s->arch_name : "?");
    fprintf(stderr, "sampling: temp %g, top_k %d, top_p %g, min_p %g, seed %llu%s, n %lld\n",
            sp.temperature, sp.top_k, sp.top_p, sp.min_p, (unsigned long long)sp.seed,
            random ? " (random)" : "", (long long)max);
    if (a->chat) fprintf(stderr, "chat template: %s (%s)\n", tsr_chat_template_name(tmpl),
                         a->chat_template ? "--chat-template" : tmpl_source);
  }
  tsr_plugin_host_reset_engagement(s->host);
  if (a->chat) {
    st = chat_loop(&g, tmpl, a, prompt_text, max);
  } else {
    int32_t *ids = NULL;
    size_t n = 0;
    st = encode(&g, prompt_text, NULL, &ids, &n);
    if (st == TSR_OK) st = feed(&g, ids, n);
    free(ids);
    if (st == TSR_OK) st = generate(&g, max, NULL);
    fputc('\n', stdout);
    fflush(stdout);
  }
  if (st != TSR_OK) {
    fprintf(stderr, "tessera run: %s\n", tsr_error_message());
    code = st == TSR_ERR_INVALID_ARG ? TSR_EXIT_USAGE : TSR_EXIT_RUNTIME;
  }
  print_timing(&g);
  tsr_plugin_host_print_decode_counters(s->host, stderr);
  if (code == TSR_EXIT_OK) {
    if (a->verbose) tsr_plugin_host_print_engagement(s->host, stderr);
    uint64_t captures = 0, replays = 0;
    if (a->verbose && tsr_backend_graph_counts(tsr_engine_backend(e), &captures, &replays))
      fprintf(stderr, "  %-12s graphs: %llu captured, %llu replays\n",
              tsr_backend_name(tsr_engine_backend(e)), (unsigned long long)captures,
              (unsigned long long)replays);
    st = tsr_plugin_host_require_engaged(s->host, a->required, a->n_required);
    if (st != TSR_OK) {
      fprintf(stderr, "tessera run: %s\n", tsr_error_message());
      code = st == TSR_ERR_INVALID_ARG ? TSR_EXIT_USAGE : TSR_EXIT_RUNTIME;
    }
  }
done:
  free(g.logits);
  tsr_sampler_free(g.smp);
  tsr_tokenizer_free(g.tok);
  return code;
}

int tsr_cli_run(int argc, char **argv) {
  struct run_args a = {.keep = 4};
  int code = parse_args(argc, argv, &a);
  if (code >= 0) return code;
  char *file_text = NULL;
  if (a.prompt_file && !(file_text = read_file(a.prompt_file))) {
    fprintf(stderr, "tessera run: cannot read the prompt: %s\n",
            tsr_error_message()[0] ? tsr_error_message() : strerror(errno));
    return TSR_EXIT_USAGE;
  }
  struct tsr_engine_options opt = {
      .profile_path = a.profile, .sets = a.sets, .n_sets = a.n_sets, .model_path = a.model,
      .n_threads = a.threads};
  struct tsr_engine *e = NULL;
  tsr_status st = tsr_engine_new(&opt, &e);
  if (st != TSR_OK) {
    fprintf(stderr, "tessera run: %s\n", tsr_error_message());
    free(file_text);
    return exit_for(st);
  }
  code = run(&a, e, file_text ? file_text : a.prompt);
  tsr_engine_free(e);
  free(file_text);
  return code;
}
