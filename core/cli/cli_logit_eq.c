/*
** `tessera logit-eq FILE`: the same tokens through two configurations, the
** reference and the candidate, compared position by position.
**
** Flags: -m MODEL and --set apply to both sides; --ref P / --cand P name each
** side's profile (default: the built-in profile) and --ref-set / --cand-set
** override one side only. So `-m M --cand-set kv.k=q4_0` compares the model's
** f16 KV with q4_0 keys, and `--ref A.yaml --cand B.yaml` two deployments.
**
** Per position (every position of every window, not only the second half:
** this is an equivalence check, not a perplexity):
**  - real_frac: the fraction whose argmax differs;
**  - mean top-k TV: 1/2 sum |p - q| over the union of both top-k sets
**    (logprobs.h), averaged;
**  - full agreement: the fraction whose top-k ids are identical and in the
**    same order;
**  - max_rel: the largest max |cand - ref| / max |ref| of a position (the
**    exact mode's measure of two backends that should agree to rounding).
** Windows are cut as `tessera perplexity` cuts them. It reports and exits 0
** whatever the figures are; only an error exits otherwise.
*/
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_quality.h"
#include "common/error.h"
#include "quality/logprobs.h"

#define MAX_SETS 64

static void leq_usage(FILE *f) {
  fprintf(f,
          "usage: tessera logit-eq FILE [--ref P1] [--cand P2] [-m MODEL.gguf]\n"
          "                        [--set key=value]... [--ref-set key=value]...\n"
          "                        [--cand-set key=value]... [--ctx N] [--chunks N]\n"
          "                        [--top-k K] [--threads N]\n"
          "Runs FILE's tokens, in windows of --ctx (default: the reference profile's context,\n"
          "at most 512), through the reference and the candidate and compares every\n"
          "position: real_frac (argmax differs), mean top-K total variation (K = 40) and\n"
          "the fraction whose top-K lists agree fully. --ref/--cand are profiles (default:\n"
          "the built-in one); -m and --set apply to both, --ref-set/--cand-set to one.\n"
          "Exit: 0 (whatever the figures), 1 runtime error, 2 usage or input error.\n");
}

struct side {
  const char *profile;
  const char *sets[2 * MAX_SETS + 1];
  int n_sets;
  struct tsr_engine *e;
  struct tsr_tokenizer *tok;
  float *logits;
};

struct leq_args {
  const char *file, *model;
  struct side ref, cand;
  int64_t ctx, chunks, top_k;
  int threads;
  char ctx_set[32];
};

static int usage_error(const char *fmt, const char *a) {
  fprintf(stderr, "tessera logit-eq: ");
  fprintf(stderr, fmt, a);
  fprintf(stderr, "\n(tessera logit-eq --help for usage)\n");
  return TSR_EXIT_USAGE;
}

static int parse_args(int argc, char **argv, struct leq_args *a) {
  const char *both[MAX_SETS], *ref[MAX_SETS], *cand[MAX_SETS];
  int n_both = 0, n_ref = 0, n_cand = 0;
  a->top_k = 40;
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (tsr_cli_is_help(f)) {
      leq_usage(stdout);
      return TSR_EXIT_OK;
    }
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
    else if (!strcmp(f, "--ref")) a->ref.profile = v;
    else if (!strcmp(f, "--cand")) a->cand.profile = v;
    else if (!strcmp(f, "--ctx") || !strcmp(f, "-c")) ok = tsr_cli_parse_i64(v, 2, 1 << 24, &a->ctx);
    else if (!strcmp(f, "--chunks")) ok = tsr_cli_parse_i64(v, 1, INT32_MAX, &a->chunks);
    else if (!strcmp(f, "--top-k")) ok = tsr_cli_parse_i64(v, 1, 1 << 20, &a->top_k);
    else if (!strcmp(f, "--threads") || !strcmp(f, "-t")) {
      ok = tsr_cli_parse_i64(v, 1, 4096, &iv);
      a->threads = (int)iv;
    } else if (!strcmp(f, "--set") || !strcmp(f, "--ref-set") || !strcmp(f, "--cand-set")) {
      const char **list = f[2] == 's' ? both : f[2] == 'r' ? ref : cand;
      int *n = f[2] == 's' ? &n_both : f[2] == 'r' ? &n_ref : &n_cand;
      if (*n == MAX_SETS) return usage_error("more than 64 %s", f);
      list[(*n)++] = v;
    } else return usage_error("unknown option '%s'", f);
    if (!ok) return usage_error("%s: not a valid value", f);
  }
  if (!a->file) return usage_error("no text FILE given%s", "");
  if (!a->model && (!a->ref.profile || !a->cand.profile))
    return usage_error("give --ref P1 --cand P2, or -m MODEL.gguf (with --ref-set/--cand-set)%s",
                       "");
  if (a->ctx) snprintf(a->ctx_set, sizeof a->ctx_set, "context=%lld", (long long)a->ctx);
  /* order: --ctx, then --set, then the side's own: the most specific wins */
  struct side *sides[2] = {&a->ref, &a->cand};
  for (int k = 0; k < 2; k++) {
    struct side *s = sides[k];
    if (a->ctx) s->sets[s->n_sets++] = a->ctx_set;
    for (int i = 0; i < n_both; i++) s->sets[s->n_sets++] = both[i];
    for (int i = 0; i < (k ? n_cand : n_ref); i++) s->sets[s->n_sets++] = k ? cand[i] : ref[i];
  }
  return -1;
}

static int exit_for(tsr_status st) {
  return (st == TSR_ERR_NOMEM || st == TSR_ERR_INTERNAL || st == TSR_ERR_IO) ? TSR_EXIT_RUNTIME
                                                                            : TSR_EXIT_USAGE;
}

static tsr_status open_side(const struct leq_args *a, struct side *s, const char *name) {
  struct tsr_engine_options opt = {.profile_path = s->profile, .sets = s->sets,
                                   .n_sets = s->n_sets, .model_path = a->model,
                                   .n_threads = a->threads};
  tsr_status st = tsr_engine_new(&opt, &s->e);
  if (st == TSR_OK) st = tsr_tokenizer_load(tsr_engine_setup(s->e)->model, &s->tok);
  if (st != TSR_OK) tsr_error_prefix("%s", name);
  return st;
}

static void describe(const char *label, const struct side *s) {
  const struct tsr_setup *set = tsr_engine_setup(s->e);
  char kv[192];
  printf("%s: %s, %s, attention %s, kv %s\n", label,
         s->profile ? s->profile : "(built-in profile)", set->model_path,
         set->profile->attention, tsr_profile_kv_label(set->profile, kv, sizeof kv));
}

static int compare(const struct leq_args *a, struct side *ref, struct side *cand) {
  const int32_t V = tsr_engine_n_vocab(ref->e);
  if (V != tsr_engine_n_vocab(cand->e) || tsr_vocab_hash(ref->tok) != tsr_vocab_hash(cand->tok)) {
    fprintf(stderr, "tessera logit-eq: the reference and the candidate have different "
            "vocabularies (%d and %d logits): their logits cannot be compared\n", V,
            tsr_engine_n_vocab(cand->e));
    return TSR_EXIT_USAGE;
  }
  struct tsr_qtext text;
  tsr_status st = tsr_qtext_load(a->file, ref->tok, false, &text);
  if (st != TSR_OK) {
    fprintf(stderr, "tessera logit-eq: %s\n", tsr_error_message());
    return TSR_EXIT_USAGE; /* an unreadable or untokenizable input */
  }
  const struct tsr_profile *rp = tsr_engine_setup(ref->e)->profile,
                           *cp = tsr_engine_setup(cand->e)->profile;
  int64_t ctx = a->ctx ? a->ctx : (rp->context < 512 ? rp->context : 512);
  int64_t windows = (int64_t)text.n_ids / ctx;
  if (a->chunks && a->chunks < windows) windows = a->chunks;
  const int64_t k = a->top_k < V ? a->top_k : V;
  int code = TSR_EXIT_OK;
  if (ctx > rp->context || ctx > cp->context) {
    fprintf(stderr, "tessera logit-eq: --ctx %lld exceeds a profile's context (%lld, %lld)\n",
            (long long)ctx, (long long)rp->context, (long long)cp->context);
    code = TSR_EXIT_USAGE;
  } else if (windows == 0) {
    fprintf(stderr, "tessera logit-eq: %s: %zu tokens, fewer than one window of %lld\n", a->file,
            text.n_ids, (long long)ctx);
    code = TSR_EXIT_USAGE;
  }
  int32_t *window = malloc((size_t)ctx * sizeof *window);
  ref->logits = malloc((size_t)ctx * (size_t)V * sizeof(float));
  cand->logits = malloc((size_t)ctx * (size_t)V * sizeof(float));
  struct tsr_logit_cmp cmp;
  bool have_cmp = tsr_logit_cmp_init(&cmp, V, k) == TSR_OK;
  if (code == TSR_EXIT_OK && (!window || !have_cmp || !ref->logits || !cand->logits)) {
    fprintf(stderr, "tessera logit-eq: out of memory\n");
    code = TSR_EXIT_RUNTIME;
  }
  double t0 = tsr_now_s(), max_rel = 0;
  const bool progress = isatty(STDERR_FILENO);
  if (code == TSR_EXIT_OK) {
    printf("logit-eq: %s, %zu tokens; %lld windows of %lld, every position, top-%lld\n",
           a->file, text.n_ids, (long long)windows, (long long)ctx, (long long)k);
    describe("ref ", ref);
    describe("cand", cand);
    fflush(stdout);
  }
  for (int64_t w = 0; w < windows && code == TSR_EXIT_OK; w++) {
    st = tsr_qtext_eval_window(ref->e, ref->tok, &text, (int32_t)ctx, w, (int32_t)ctx, window,
                               ref->logits);
    if (st != TSR_OK) tsr_error_prefix("reference");
    if (st == TSR_OK) {
      st = tsr_qtext_eval_window(cand->e, cand->tok, &text, (int32_t)ctx, w, (int32_t)ctx, window,
                                 cand->logits);
      if (st != TSR_OK) tsr_error_prefix("candidate");
    }
    if (st != TSR_OK) {
      fprintf(stderr, "tessera logit-eq: %s\n", tsr_error_message());
      code = exit_for(st);
      break;
    }
    for (int64_t j = 0; j < ctx; j++) {
      const float *r = ref->logits + (size_t)j * V, *c = cand->logits + (size_t)j * V;
      tsr_logit_cmp_add(&cmp, r, c);
      double scale = 0, diff = 0;
      for (int32_t i = 0; i < V; i++) {
        const double d = fabs((double)c[i] - r[i]);
        scale = fmax(scale, fabs((double)r[i]));
        diff = d == d ? fmax(diff, d) : INFINITY; /* a NaN is as far as can be */
      }
      max_rel = fmax(max_rel, diff / (scale > 0 ? scale : 1));
    }
    if (progress)
      fprintf(stderr, "\r[%lld/%lld] real_frac %.4f", (long long)w + 1, (long long)windows,
              tsr_mean_of(&cmp.differ));
  }
  if (progress) fprintf(stderr, "\r\033[K");
  if (code == TSR_EXIT_OK) {
    printf("%-20s %lld\n", "positions", (long long)cmp.differ.n);
    printf("%-20s %.6f (%lld positions' argmax differ)\n", "real_frac",
           tsr_mean_of(&cmp.differ), (long long)llround(cmp.differ.sum));
    printf("%-20s %.6e +/- %.6e (max %.6e)\n", "mean_tv", tsr_mean_of(&cmp.tv),
           tsr_mean_stderr(&cmp.tv), cmp.max_tv);
    printf("%-20s %.6f\n", "full_agree", tsr_mean_of(&cmp.agree));
    printf("%-20s %.6e\n", "max_rel", max_rel);
    printf("%-20s %.3f s\n", "time", tsr_now_s() - t0);
  }
  free(window);
  if (have_cmp) tsr_logit_cmp_free(&cmp);
  tsr_qtext_free(&text);
  return code;
}

int tsr_cli_logit_eq(int argc, char **argv) {
  struct leq_args a = {0};
  int code = parse_args(argc, argv, &a);
  if (code >= 0) return code;
  tsr_status st = open_side(&a, &a.ref, "reference");
  if (st == TSR_OK) st = open_side(&a, &a.cand, "candidate");
  if (st != TSR_OK) {
    fprintf(stderr, "tessera logit-eq: %s\n", tsr_error_message());
    code = exit_for(st);
  } else {
    code = compare(&a, &a.ref, &a.cand);
  }
  struct side *sides[2] = {&a.ref, &a.cand};
  for (int i = 0; i < 2; i++) {
    free(sides[i]->logits);
    tsr_tokenizer_free(sides[i]->tok);
    tsr_engine_free(sides[i]->e);
  }
  return code;
}
