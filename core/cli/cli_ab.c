/*
** `tessera ab`: the same input through two configurations, quality and
** speed side by side from one run — the tool for swapping attention
** backends and KV tiers.
**
**  - --text FILE: the file's tokens in windows through A and B; quality is
**    B against A position by position (KL(A || B), real_frac, same top-1,
**    top-k TV); speed is each side's prefill tokens/s over the windows, and
**    its decode tokens/s over --decode greedy tokens after the last window.
**  - --task T: the same RULER items (core/quality/ruler.h) through both; quality is
**    each side's accuracy and how many items they scored differently; speed
**    comes from the same runs.
**
** The two engines are loaded together (memory for both); the windows
** alternate A, B so a machine's drift in speed touches both alike.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_quality.h"
#include "common/error.h"
#include "quality/logprobs.h"

#define MAX_SETS 64

struct ab_side {
  const char *profile;
  const char *sets[2 * MAX_SETS + 2];
  int n_sets;
  struct tsr_engine *e;
  struct tsr_tokenizer *tok;
  float *logits;
  double prefill_tokens, prefill_s, decode_tokens, decode_s;
  struct tsr_ruler_opts task; /* the task as this side runs it (its chat template) */
  struct tsr_ruler_result ruler;
};

struct ab_args {
  const char *model, *text, *json, *chat_template;
  struct ab_side side[2];
  int n_profiles, threads;
  int64_t ctx, chunks, decode, top_k;
  struct tsr_ruler_opts task;
  bool has_task;
  char ctx_set[40];
};

static void ab_usage(FILE *f) {
  fprintf(f,
          "usage: tessera ab --profile A --profile B [-m MODEL.gguf] [--set key=value]...\n"
          "                  [--a-set key=value]... [--b-set key=value]...\n"
          "                  (--text FILE [--ctx N] [--chunks N] [--decode N] [--top-k K]\n"
          "                   | --task passkey|niah_single|niah_multi|vt --ctx N --n K\n"
          "                     [--seed S] [--no-chat])\n"
          "                  [--threads N] [--json OUT]\n"
          "Runs the same input through A and B and prints quality and speed side by side.\n"
          "--text: windows of --ctx tokens (default 512) through both; B against A: mean\n"
          "KL(A||B), real_frac (argmax differs), same-top and top-K TV; prefill tokens/s per\n"
          "side, and decode tokens/s over --decode greedy tokens (default 32) after the\n"
          "last window. --task: the same seeded RULER items through both; accuracy per\n"
          "side and the items scored differently. Without --profile the built-in profile\n"
          "is used for a side: -m with --a-set/--b-set compares two settings of one model.\n");
}

static int usage_error(const char *what, const char *arg) {
  fprintf(stderr, "tessera ab: %s%s\n(tessera ab --help for usage)\n", what, arg);
  return TSR_EXIT_USAGE;
}

static int parse_args(int argc, char **argv, struct ab_args *a) {
  const char *both[MAX_SETS], *own[2][MAX_SETS];
  int n_both = 0, n_own[2] = {0, 0};
  a->decode = 32, a->top_k = 40, a->task.chat = true;
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (tsr_cli_is_help(f)) {
      ab_usage(stdout);
      return TSR_EXIT_OK;
    }
    if (!strcmp(f, "--no-chat")) { a->task.chat = false; continue; }
    if (f[0] != '-') return usage_error("unexpected argument ", f);
    if (i + 1 >= argc) return usage_error("a value is missing after ", f);
    const char *v = argv[++i];
    int64_t n = 0;
    bool ok = true;
    if (!strcmp(f, "--profile")) {
      if (a->n_profiles == 2) return usage_error("more than two --profile", "");
      a->side[a->n_profiles++].profile = v;
    } else if (!strcmp(f, "-m") || !strcmp(f, "--model")) a->model = v;
    else if (!strcmp(f, "--text")) a->text = v;
    else if (!strcmp(f, "--task")) {
      if (tsr_ruler_task_parse(v, &a->task.task) != TSR_OK)
        return usage_error(tsr_error_message(), "");
      a->has_task = true;
    } else if (!strcmp(f, "--ctx")) ok = tsr_cli_parse_i64(v, 16, 1 << 24, &a->ctx);
    else if (!strcmp(f, "--n")) ok = tsr_cli_parse_i64(v, 1, 1 << 20, &a->task.n);
    else if (!strcmp(f, "--seed")) ok = tsr_cli_parse_i64(v, 0, INT64_MAX, &n), a->task.seed = (uint64_t)n;
    else if (!strcmp(f, "--chunks")) ok = tsr_cli_parse_i64(v, 1, INT32_MAX, &a->chunks);
    else if (!strcmp(f, "--decode")) ok = tsr_cli_parse_i64(v, 0, 1 << 20, &a->decode);
    else if (!strcmp(f, "--top-k")) ok = tsr_cli_parse_i64(v, 1, 1 << 20, &a->top_k);
    else if (!strcmp(f, "--json")) a->json = v;
    else if (!strcmp(f, "--chat-template")) a->chat_template = v;
    else if (!strcmp(f, "--threads") || !strcmp(f, "-t"))
      ok = tsr_cli_parse_i64(v, 1, 4096, &n), a->threads = (int)n;
    else if (!strcmp(f, "--set") || !strcmp(f, "--a-set") || !strcmp(f, "--b-set")) {
      const char **list = f[2] == 's' ? both : own[f[2] == 'b'];
      int *count = f[2] == 's' ? &n_both : &n_own[f[2] == 'b'];
      if (*count == MAX_SETS) return usage_error("more than 64 of ", f);
      list[(*count)++] = v;
    } else return usage_error("unknown option ", f);
    if (!ok) return usage_error("not a valid value for ", f);
  }
  if (!a->text == !a->has_task) return usage_error("give either --text FILE or --task T", "");
  if (a->has_task && (!a->ctx || !a->task.n)) return usage_error("--task needs --ctx and --n", "");
  if (a->text && a->task.n) return usage_error("--n goes with --task", "");
  if (!a->model && a->n_profiles < 2)
    return usage_error("give --profile A --profile B, or -m MODEL (with --a-set/--b-set)", "");
  if (!a->ctx) a->ctx = 512;
  a->task.ctx = a->ctx;
  /* the context holds a window and the decode after it (text), or a task item */
  snprintf(a->ctx_set, sizeof a->ctx_set, "context=%lld",
           (long long)(a->ctx + (a->text ? a->decode : 0)));
  for (int k = 0; k < 2; k++) { /* --ctx, then --set, then the side's own: the most specific wins */
    struct ab_side *s = &a->side[k];
    s->sets[s->n_sets++] = a->ctx_set;
    for (int i = 0; i < n_both; i++) s->sets[s->n_sets++] = both[i];
    for (int i = 0; i < n_own[k]; i++) s->sets[s->n_sets++] = own[k][i];
  }
  return -1;
}

static tsr_status open_side(const struct ab_args *a, struct ab_side *s, const char *name) {
  struct tsr_engine_options eo = {.profile_path = s->profile, .sets = s->sets,
                                  .n_sets = s->n_sets, .model_path = a->model,
                                  .n_threads = a->threads};
  s->task = a->task;
  s->task.chat = a->text ? false : a->task.chat; /* a text file is no conversation */
  tsr_status st = tsr_ruler_open(&eo, a->chat_template, &s->task, &s->e, &s->tok);
  if (st != TSR_OK) tsr_error_prefix("%s", name);
  return st;
}

/* Greedy decode of n tokens after what sequence 0 holds, from its last logits. */
static tsr_status decode_run(struct ab_side *s, int64_t n, float *logits) {
  const int32_t V = tsr_engine_n_vocab(s->e);
  const double t0 = tsr_now_s();
  for (int64_t i = 0; i < n; i++) {
    int32_t t = (int32_t)tsr_logits_argmax(logits, V);
    tsr_status st = tsr_engine_eval(s->e, 0, &t, 1, logits, NULL);
    if (st != TSR_OK) return st;
  }
  s->decode_tokens += (double)n;
  s->decode_s += tsr_now_s() - t0;
  return TSR_OK;
}

static tsr_status run_text(struct ab_args *a, struct tsr_logit_cmp *cmp, int64_t *windows) {
  struct ab_side *A = &a->side[0], *B = &a->side[1];
  const int32_t V = tsr_engine_n_vocab(A->e);
  if (V != tsr_engine_n_vocab(B->e) || tsr_vocab_hash(A->tok) != tsr_vocab_hash(B->tok))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "A and B have different vocabularies (%d and %d "
                         "logits): their outputs cannot be compared", V,
                         tsr_engine_n_vocab(B->e));
  struct tsr_qtext text;
  tsr_status st = tsr_qtext_load(a->text, A->tok, false, &text);
  if (st != TSR_OK) return st;
  *windows = (int64_t)text.n_ids / a->ctx;
  if (a->chunks && a->chunks < *windows) *windows = a->chunks;
  if (*windows == 0)
    st = tsr_error_set(TSR_ERR_INVALID_ARG, "%s: %zu tokens, fewer than one window of %lld",
                       a->text, text.n_ids, (long long)a->ctx);
  int32_t *window = malloc((size_t)a->ctx * sizeof *window);
  for (int k = 0; k < 2 && st == TSR_OK; k++)
    if (!(a->side[k].logits = malloc((size_t)a->ctx * (size_t)V * sizeof(float))))
      st = tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  if (st == TSR_OK && !window) st = tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  if (st == TSR_OK) st = tsr_logit_cmp_init(cmp, V, a->top_k);
  /* an untimed first window: page faults and arena growth are not speed */
  for (int k = 0; k < 2 && st == TSR_OK; k++)
    st = tsr_qtext_eval_window(a->side[k].e, a->side[k].tok, &text, (int32_t)a->ctx, 0,
                               (int32_t)a->ctx, window, a->side[k].logits);
  for (int64_t w = 0; w < *windows && st == TSR_OK; w++) {
    for (int k = 0; k < 2 && st == TSR_OK; k++) {
      struct ab_side *s = &a->side[k];
      const double t0 = tsr_now_s();
      st = tsr_qtext_eval_window(s->e, s->tok, &text, (int32_t)a->ctx, w, (int32_t)a->ctx,
                                 window, s->logits);
      if (st != TSR_OK) tsr_error_prefix("%s", k ? "B" : "A");
      s->prefill_tokens += (double)a->ctx;
      s->prefill_s += tsr_now_s() - t0;
    }
    for (int64_t j = 0; j < a->ctx && st == TSR_OK; j++)
      tsr_logit_cmp_add(cmp, A->logits + (size_t)j * V, B->logits + (size_t)j * V);
  }
  /* decode continues the last window: its last row starts the greedy run */
  for (int k = 0; k < 2 && st == TSR_OK && a->decode > 0; k++) {
    struct ab_side *s = &a->side[k];
    memmove(s->logits, s->logits + (size_t)(a->ctx - 1) * V, (size_t)V * sizeof(float));
    st = decode_run(s, a->decode, s->logits);
    if (st != TSR_OK) tsr_error_prefix("%s: decode", k ? "B" : "A");
  }
  free(window);
  tsr_qtext_free(&text);
  return st;
}

static double rate(double tokens, double s) { return s > 0 ? tokens / s : 0; }

static void describe(const struct ab_side *s, const char *label) {
  const struct tsr_setup *set = tsr_engine_setup(s->e);
  const struct tsr_profile *p = set->profile;
  char kv[192];
  printf("%s: %s, %s, backend %s, attention %s, kv full %s\n", label,
         s->profile ? s->profile : "(built-in profile)", set->model_path, p->backend,
         p->attention, tsr_profile_kv_label(p, kv, sizeof kv));
}

static int write_json(const struct ab_args *a, cJSON *o) {
  char *text = cJSON_Print(o);
  FILE *f = text ? fopen(a->json, "w") : NULL;
  bool written = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
  if (f && fclose(f)) written = false;
  free(text);
  if (written) return TSR_EXIT_OK;
  fprintf(stderr, "tessera ab: cannot write %s\n", a->json);
  return TSR_EXIT_RUNTIME;
}

static int report(const struct ab_args *a, const struct tsr_logit_cmp *cmp, int64_t windows) {
  const struct ab_side *A = &a->side[0], *B = &a->side[1];
  describe(A, "A");
  describe(B, "B");
  cJSON *o = cJSON_CreateObject(), *sides = cJSON_AddArrayToObject(o, "sides");
  if (a->text) {
    printf("input: %s, %lld windows of %lld tokens, then %lld decoded\n", a->text,
           (long long)windows, (long long)a->ctx, (long long)a->decode);
    cJSON_AddStringToObject(o, "text", a->text);
  } else {
    printf("input: %s, ctx %lld, %lld items, seed %llu\n", tsr_ruler_task_name(a->task.task),
           (long long)a->ctx, (long long)a->task.n, (unsigned long long)a->task.seed);
    cJSON_AddStringToObject(o, "task", tsr_ruler_task_name(a->task.task));
    cJSON_AddNumberToObject(o, "n", (double)a->task.n);
    cJSON_AddNumberToObject(o, "seed", (double)a->task.seed);
  }
  cJSON_AddNumberToObject(o, "ctx", (double)a->ctx);
  printf("\n%-22s %14s %14s %8s\n", "", "A", "B", "B/A");
  double pa = rate(A->prefill_tokens, A->prefill_s), pb = rate(B->prefill_tokens, B->prefill_s);
  double da = rate(A->decode_tokens, A->decode_s), db = rate(B->decode_tokens, B->decode_s);
  printf("%-22s %14.1f %14.1f %8.3f\n", "prefill tokens/s", pa, pb, pa > 0 ? pb / pa : 0);
  printf("%-22s %14.1f %14.1f %8.3f\n", "decode tokens/s", da, db, da > 0 ? db / da : 0);
  for (int k = 0; k < 2; k++) {
    const struct ab_side *s = &a->side[k];
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "profile", s->profile ? s->profile : "(built-in profile)");
    cJSON_AddNumberToObject(x, "prefill_tokens_per_second", k ? pb : pa);
    cJSON_AddNumberToObject(x, "decode_tokens_per_second", k ? db : da);
    if (!a->text)
      cJSON_AddNumberToObject(x, "accuracy", s->ruler.n ? 100.0 * s->ruler.sum / s->ruler.n : 0);
    cJSON_AddItemToArray(sides, x);
  }
  if (a->text) {
    printf("\nB against A over %lld positions:\n", (long long)cmp->differ.n);
    printf("  %-20s %.6e +/- %.1e\n", "mean KL(A||B)", tsr_mean_of(&cmp->kl),
           tsr_mean_stderr(&cmp->kl));
    printf("  %-20s %.6f\n", "real_frac", tsr_mean_of(&cmp->differ));
    printf("  %-20s %.4f%%\n", "same top-1", 100.0 * (1.0 - tsr_mean_of(&cmp->differ)));
    printf("  %-20s %.6e (max %.6e)\n", "mean top-k TV", tsr_mean_of(&cmp->tv), cmp->max_tv);
    printf("  %-20s %.6f\n", "full top-k agree", tsr_mean_of(&cmp->agree));
    cJSON_AddNumberToObject(o, "positions", (double)cmp->differ.n);
    cJSON_AddNumberToObject(o, "mean_kl", tsr_mean_of(&cmp->kl));
    cJSON_AddNumberToObject(o, "real_frac", tsr_mean_of(&cmp->differ));
    cJSON_AddNumberToObject(o, "mean_top_k_tv", tsr_mean_of(&cmp->tv));
    cJSON_AddNumberToObject(o, "full_agree", tsr_mean_of(&cmp->agree));
  } else {
    int64_t differ = 0;
    for (int64_t i = 0; i < A->ruler.n && i < B->ruler.n; i++)
      differ += A->ruler.scores[i] != B->ruler.scores[i];
    printf("%-22s %13.1f%% %13.1f%%\n", "accuracy", 100.0 * A->ruler.sum / (double)A->ruler.n,
           100.0 * B->ruler.sum / (double)B->ruler.n);
    printf("\nitems scored differently: %lld of %lld\n", (long long)differ, (long long)a->task.n);
    cJSON_AddNumberToObject(o, "items_scored_differently", (double)differ);
  }
  int code = a->json ? write_json(a, o) : TSR_EXIT_OK;
  cJSON_Delete(o);
  return code;
}

int tsr_cli_ab(int argc, char **argv) {
  struct ab_args a = {0};
  int code = parse_args(argc, argv, &a);
  if (code >= 0) return code;
  tsr_status st = open_side(&a, &a.side[0], "A");
  if (st == TSR_OK) st = open_side(&a, &a.side[1], "B");
  struct tsr_logit_cmp cmp = {0};
  int64_t windows = 0;
  if (st == TSR_OK && a.text) {
    st = run_text(&a, &cmp, &windows);
  } else if (st == TSR_OK) {
    for (int k = 0; k < 2 && st == TSR_OK; k++) {
      struct ab_side *s = &a.side[k];
      st = tsr_ruler_run(s->e, s->tok, &s->task, &s->ruler);
      if (st != TSR_OK) tsr_error_prefix("%s", k ? "B" : "A");
      s->prefill_tokens = s->ruler.prefill_tokens, s->prefill_s = s->ruler.prefill_s;
      s->decode_tokens = s->ruler.decode_tokens, s->decode_s = s->ruler.decode_s;
    }
  }
  if (st != TSR_OK) {
    fprintf(stderr, "tessera ab: %s\n", tsr_error_message());
    code = st == TSR_ERR_NOMEM || st == TSR_ERR_INTERNAL || st == TSR_ERR_IO ? TSR_EXIT_RUNTIME
                                                                             : TSR_EXIT_USAGE;
  } else {
    code = report(&a, &cmp, windows);
  }
  tsr_logit_cmp_free(&cmp);
  for (int k = 0; k < 2; k++) {
    free(a.side[k].logits);
    tsr_ruler_result_free(&a.side[k].ruler);
    tsr_tokenizer_free(a.side[k].tok);
    tsr_engine_free(a.side[k].e);
  }
  return code;
}
