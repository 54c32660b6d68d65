/* `tessera run`: generate text from a prompt, or chat, streaming to stdout. A client of
** the embedding API (tessera/tessera.h) and of nothing below it. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tessera/tessera.h"
#include "cli.h"
#include "common/error.h"
#include "common/file.h"

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

/* The prompt file's text, or NULL with the error set (a file that cannot be read, is not
** a regular file, or holds a NUL byte: the prompt is a C string and would end there). */
static char *read_file(const char *path) {
  FILE *f;
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
  const bool bad = ferror(f);
  fclose(f);
  if (!buf || bad) {
    free(buf);
    tsr_error_set(bad ? TSR_ERR_IO : TSR_ERR_NOMEM, "%s: %s", path,
                  bad ? strerror(EIO) : strerror(ENOMEM));
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

/* ---- generation: one sequence, streamed to stdout ---- */

struct gen {
  tsr_engine *e;
  tsr_sampler *smp;
  int32_t keep; /* tokens a context shift keeps at the start */
  bool progress, verbose;
  int64_t n_prompt, n_eval, n_sampled;
  double ms_prompt, ms_eval;
  char *reply; /* the text generated this turn (chat keeps it) */
  size_t reply_len;
};

static int stream_token(void *user, int32_t token, const char *text, size_t len) {
  struct gen *g = user;
  (void)token;
  if (!len) return 1;
  fwrite(text, 1, len, stdout);
  fflush(stdout);
  char *p = realloc(g->reply, g->reply_len + len + 1);
  if (!p) return 1; /* the transcript loses this piece; the output did not */
  memcpy(p + g->reply_len, text, len);
  g->reply_len += len;
  p[g->reply_len] = 0;
  g->reply = p;
  return 1;
}

static void show_progress(void *user, int64_t done, int64_t total) {
  (void)user;
  fprintf(stderr, done < total ? "\rprefill %lld/%lld tokens" : "\r\033[K", (long long)done,
          (long long)total);
}

static void show_notice(void *user, const char *text) {
  (void)user;
  fprintf(stderr, "\n(%s)\n", text);
}

/* Feeds the prompt (what the sequence already holds is reused) and streams up to max
** tokens (< 0: no limit). */
static tsr_status generate(struct gen *g, const int32_t *ids, size_t n, int64_t max) {
  free(g->reply);
  g->reply = NULL, g->reply_len = 0;
  enum tsr_stop stop = TSR_STOP_NONE;
  tsr_status st = tsr_generate(g->e, 0, g->smp, ids, n, max, g->keep, stream_token, g, &stop);
  const int64_t prompt = (int64_t)tsr_engine_stat(g->e, TSR_STAT_PROMPT_TOKENS);
  const int64_t reused = (int64_t)tsr_engine_stat(g->e, TSR_STAT_PROMPT_REUSED);
  const int64_t produced = (int64_t)tsr_engine_stat(g->e, TSR_STAT_GENERATED);
  g->n_prompt += prompt - reused;
  g->ms_prompt += tsr_engine_stat(g->e, TSR_STAT_PROMPT_MS);
  g->n_eval += (int64_t)tsr_engine_stat(g->e, TSR_STAT_EVAL_STEPS);
  g->ms_eval += tsr_engine_stat(g->e, TSR_STAT_EVAL_MS);
  g->n_sampled += produced;
  if (stop == TSR_STOP_CONTEXT_FULL) fprintf(stderr, "\n(stopped: %s)\n", tsr_error_message());
  if (g->verbose) {
    if (prompt)
      fprintf(stderr, "prompt: %lld tokens, %lld already held, %lld evaluated\n",
              (long long)prompt, (long long)reused, (long long)(prompt - reused));
    static const char *const why[] = {"error", "limit", "end of generation", "cancelled",
                                      "context full"};
    fprintf(stderr, "\ngenerated: %lld tokens (stop: %s)\n", (long long)produced,
            why[st == TSR_OK ? stop : TSR_STOP_NONE]);
  }
  return st;
}

/* ---- chat ---- */

struct conv {
  const char **role;
  char **content;
  size_t n, cap;
};

static bool conv_add(struct conv *c, const char *role, char *content /* owned */) {
  if (c->n == c->cap) {
    size_t cap = c->cap ? c->cap * 2 : 16;
    const char **r = realloc(c->role, cap * sizeof *r);
    if (r) c->role = r;
    char **m = r ? realloc(c->content, cap * sizeof *m) : NULL;
    if (!m) {
      free(content);
      return false;
    }
    c->content = m;
    c->cap = cap;
  }
  c->role[c->n] = role;
  c->content[c->n++] = content;
  return true;
}

static void conv_free(struct conv *c) {
  for (size_t i = 0; i < c->n; i++) free(c->content[i]);
  free(c->role);
  free(c->content);
}

/* One user turn: render everything so far, feed what is new, stream the reply. */
static tsr_status chat_turn(struct gen *g, struct conv *c, int64_t max, bool *nomem) {
  int32_t *ids = NULL;
  size_t n = 0;
  tsr_status st = TSR_OK;
  if (g->verbose) {
    char *prompt = NULL;
    st = tsr_chat_format(g->e, c->role, (const char *const *)c->content, c->n, 1, &prompt);
    if (st == TSR_OK) fprintf(stderr, "rendered prompt:\n%s\n", prompt);
    tsr_free(prompt);
  }
  if (st == TSR_OK)
    st = tsr_chat_tokenize(g->e, c->role, (const char *const *)c->content, c->n, 1, &ids, &n);
  if (st == TSR_OK) st = generate(g, ids, n, max);
  tsr_free(ids);
  if (g->reply || st == TSR_OK) {
    fputc('\n', stdout);
    fflush(stdout);
    char *reply = g->reply ? g->reply : calloc(1, 1);
    g->reply = NULL, g->reply_len = 0;
    if (!reply || !conv_add(c, "assistant", reply)) *nomem = true;
  }
  return st;
}

static tsr_status chat_loop(struct gen *g, const struct run_args *a, const char *first,
                            int64_t max, bool *nomem) {
  struct conv c = {0};
  tsr_status st = TSR_OK;
  if (a->system) {
    char *s = strdup(a->system);
    if (!s || !conv_add(&c, "system", s)) *nomem = true;
  }
  bool tty = isatty(STDIN_FILENO);
  char *line = NULL;
  size_t cap = 0;
  while (st == TSR_OK && !*nomem) {
    char *user = NULL;
    if (first) {
      user = strdup(first);
      first = NULL;
    } else {
      if (tty) fprintf(stderr, "> ");
      ssize_t len = getline(&line, &cap, stdin);
      if (len < 0) break;
      while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
      if (len == 0) continue;
      user = strdup(line);
    }
    if (!user || !conv_add(&c, "user", user)) *nomem = true;
    else st = chat_turn(g, &c, max, nomem);
  }
  free(line);
  conv_free(&c);
  return st;
}

/* ---- the command ---- */

static void print_timing(const struct gen *g, bool speculating) {
  fprintf(stderr, "prompt eval: %lld tokens in %.2f ms (%.2f tok/s)\n", (long long)g->n_prompt,
          g->ms_prompt, g->ms_prompt > 0 ? 1e3 * (double)g->n_prompt / g->ms_prompt : 0.0);
  if (speculating) /* a step evaluates its token and the drafts the target kept */
    fprintf(stderr, "eval: %lld speculative steps for %lld tokens in %.2f ms (%.2f tok/s)\n",
            (long long)g->n_eval, (long long)g->n_sampled, g->ms_eval,
            g->ms_eval > 0 ? 1e3 * (double)g->n_sampled / g->ms_eval : 0.0);
  else
    fprintf(stderr, "eval: %lld tokens in %.2f ms (%.2f tok/s)\n", (long long)g->n_eval,
            g->ms_eval, g->ms_eval > 0 ? 1e3 * (double)g->n_eval / g->ms_eval : 0.0);
}

/* Prints a report (tessera.h's TSR_REPORT_*) to stderr. */
static void report(tsr_engine *e, unsigned what) {
  char *text = NULL;
  if (tsr_engine_report(e, what, &text) == TSR_OK) fputs(text, stderr);
  tsr_free(text);
}

/* The sampler: the profile's settings, the flags over them. */
static tsr_status open_sampler(const struct run_args *a, tsr_engine *e, tsr_sampler **out) {
  char buf[5][64];
  const char *sets[5];
  int n = 0;
  if (a->has_temp) snprintf(buf[n], 64, "temperature=%.17g", a->temp), sets[n] = buf[n], n++;
  if (a->has_top_k) snprintf(buf[n], 64, "top_k=%lld", (long long)a->top_k), sets[n] = buf[n], n++;
  if (a->has_top_p) snprintf(buf[n], 64, "top_p=%.17g", a->top_p), sets[n] = buf[n], n++;
  if (a->has_min_p) snprintf(buf[n], 64, "min_p=%.17g", a->min_p), sets[n] = buf[n], n++;
  if (a->has_seed) snprintf(buf[n], 64, "seed=%lld", (long long)a->seed), sets[n] = buf[n], n++;
  return tsr_sampler_open(e, sets, n, out);
}

static int exit_code(tsr_status st) {
  return st == TSR_ERR_INVALID_ARG ? TSR_EXIT_USAGE : TSR_EXIT_RUNTIME;
}

static int run(const struct run_args *a, tsr_engine *e, const char *prompt_text) {
  struct gen g = {.e = e, .verbose = a->verbose, .keep = (int32_t)a->keep};
  g.progress = isatty(STDERR_FILENO);
  if (g.progress) tsr_engine_set_progress(e, show_progress, NULL);
  tsr_engine_set_notice(e, show_notice, NULL);
  const char *tmpl = NULL, *tmpl_source = NULL;
  if (a->chat && tsr_chat_template_choose(e, a->chat_template, &tmpl, &tmpl_source) != TSR_OK) {
    fprintf(stderr, "tessera run: %s (choose one with --chat-template chatml|gemma|gemma4)\n",
            tsr_error_message());
    return TSR_EXIT_USAGE;
  }
  /* a required plugin that is not even loaded can be named before any work */
  for (int i = 0; i < a->n_required; i++)
    if (!tsr_engine_has_plugin(e, a->required[i])) {
      tsr_engine_require_engaged(e, &a->required[i], 1);
      fprintf(stderr, "tessera run: %s\n", tsr_error_message());
      return TSR_EXIT_USAGE;
    }
  tsr_status st = open_sampler(a, e, &g.smp);
  if (st != TSR_OK) {
    fprintf(stderr, "tessera run: %s\n", tsr_error_message());
    return st == TSR_ERR_NOMEM ? TSR_EXIT_RUNTIME : TSR_EXIT_USAGE;
  }
  int64_t max = a->has_n ? a->n_predict : tsr_engine_max_tokens(e);
  if (a->verbose) {
    fprintf(stderr, "model: %s (%s)\n", tsr_engine_model_path(e), tsr_engine_arch(e));
    fprintf(stderr, "sampling: %s, n %lld\n", tsr_sampler_describe(g.smp), (long long)max);
    if (a->chat) fprintf(stderr, "chat template: %s (%s)\n", tmpl,
                         a->chat_template ? "--chat-template" : tmpl_source);
  }
  tsr_engine_reset_counters(e);
  bool nomem = false;
  if (a->chat) {
    st = chat_loop(&g, a, prompt_text, max, &nomem);
  } else {
    int32_t *ids = NULL;
    size_t n = 0;
    st = tsr_tokenize(e, prompt_text, strlen(prompt_text),
                      TSR_TOKENIZE_ADD_SPECIAL | TSR_TOKENIZE_PARSE_SPECIAL, &ids, &n);
    if (st == TSR_OK) st = generate(&g, ids, n, max);
    tsr_free(ids);
    fputc('\n', stdout);
    fflush(stdout);
  }
  int code = TSR_EXIT_OK;
  if (st != TSR_OK || nomem) {
    fprintf(stderr, "tessera run: %s\n", st != TSR_OK ? tsr_error_message() : "out of memory");
    code = st != TSR_OK ? exit_code(st) : TSR_EXIT_RUNTIME;
  }
  print_timing(&g, tsr_engine_stat(e, TSR_STAT_MAX_DRAFT) > 0);
  report(e, TSR_REPORT_DECODE);
  if (code == TSR_EXIT_OK) {
    if (a->verbose) report(e, TSR_REPORT_ENGAGEMENT | TSR_REPORT_GRAPHS);
    if ((st = tsr_engine_require_engaged(e, a->required, a->n_required)) != TSR_OK) {
      fprintf(stderr, "tessera run: %s\n", tsr_error_message());
      code = exit_code(st);
    }
  }
  free(g.reply);
  tsr_sampler_close(g.smp);
  return code;
}

int tsr_cli_run(int argc, char **argv) {
  struct run_args a = {.keep = 4};
  int code = parse_args(argc, argv, &a);
  if (code >= 0) return code;
  char *file_text = NULL;
  if (a.prompt_file && !(file_text = read_file(a.prompt_file))) {
    fprintf(stderr, "tessera run: cannot read the prompt: %s\n", tsr_error_message());
    return TSR_EXIT_USAGE;
  }
  /* --threads is the profile's `threads`, set before the user's --set overrides */
  char threads[32];
  const char *sets[MAX_SETS + 1];
  int n_sets = 0;
  if (a.threads > 0) snprintf(threads, sizeof threads, "threads=%d", a.threads), sets[n_sets++] = threads;
  for (int i = 0; i < a.n_sets; i++) sets[n_sets++] = a.sets[i];
  tsr_engine *e = NULL;
  tsr_status st = tsr_engine_open(a.profile, a.model, sets, n_sets, &e);
  if (st != TSR_OK) {
    fprintf(stderr, "tessera run: %s\n", tsr_error_message());
    free(file_text);
    return (st == TSR_ERR_NOMEM || st == TSR_ERR_INTERNAL) ? TSR_EXIT_RUNTIME : TSR_EXIT_USAGE;
  }
  code = run(&a, e, file_text ? file_text : a.prompt);
  tsr_engine_close(e);
  free(file_text);
  return code;
}
