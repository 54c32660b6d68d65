/*
** the speculator interface, proven with the out-of-tree example speculator
** (example_speculator/: prompt lookup) on reference fixtures:
**   - greedy decoding through tsr_engine_speculate gives the tokens plain greedy
**     decoding gives, while the speculator drafted and the target kept some of
**     its proposals (lossless, and it really speculated);
**   - so it does on a model with recurrent (linear) layers, whose state a rejected
**     draft rolls back to the checkpoint of the last kept token.
** usage: test_speculator [--backend cuda] OUT_DIR PLUGIN_DIR MODEL.gguf GOLDEN.gguf RECURRENT.gguf
**        (tests/gpu/run.sh check RUN spec runs it on cuda)
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "common/error.h"
#include "model/gguf.h"
#include "abi/plugin_host.h"
#include "engine/sampler.h"
#include "abi/setup.h"
#include "tests/harness.h"
#include "tests/logits_test_util.h"

enum { PROMPT = 24, GEN = 96, MAX_DRAFT = 6 };

static const char *g_out, *g_plugins, *g_model, *g_recurrent, *g_backend = "cpu";
static struct tsr_test_golden g_gs;

static struct tsr_engine *engine_of(const char *model, bool speculate, int n_seq) {
  static char path[1024];
  static int serial;
  snprintf(path, sizeof path, "%s/spec_%d.yaml", g_out, serial++);
  FILE *f = fopen(path, "w");
  if (!f) return NULL;
  fprintf(f, "model: %s\nbackend: %s\ncontext: %d\nubatch: 32\nserver: {parallel: %d}\n"
          "plugins:\n  - arch_qwen\n  - name: example_speculator\n    path: %s/example_speculator\n%s",
          model, g_backend, 256 * n_seq, n_seq, g_plugins,
          speculate ? "speculator: {name: example_lookup}\n" : "");
  fclose(f);
  struct tsr_engine_options opt = {.profile_path = path, .n_threads = 2};
  struct tsr_engine *e = NULL;
  if (tsr_engine_new(&opt, &e) != TSR_OK) return NULL;
  return e;
}

static struct tsr_engine *engine(const char *model, bool speculate) {
  return engine_of(model, speculate, 1);
}

/* The golden prompt in the model's vocabulary (the fixtures' vocabularies differ), from
** golden token `from` on (a sequence of several gets its own). */
static const int32_t *prompt_from(struct tsr_engine *e, int from) {
  static int32_t ids[PROMPT];
  for (int i = 0; i < PROMPT; i++) ids[i] = g_gs.ids[(i + from) % g_gs.n] % tsr_engine_n_vocab(e);
  return ids;
}

static const int32_t *prompt(struct tsr_engine *e) { return prompt_from(e, 0); }

/* GEN greedy tokens after the prompt, one eval a token. */
static bool plain_from(struct tsr_engine *e, int from, int32_t *out) {
  const int32_t v = tsr_engine_n_vocab(e);
  float *logits = malloc(sizeof(float) * (size_t)v);
  tsr_status st = tsr_engine_eval(e, 0, prompt_from(e, from), PROMPT, logits, NULL);
  for (int32_t i = 0; i < GEN && st == TSR_OK; i++) {
    out[i] = (int32_t)tsr_test_argmax(logits, v);
    if (i + 1 < GEN) st = tsr_engine_eval(e, 0, &out[i], 1, logits, NULL);
  }
  free(logits);
  CHECK_MSG(st == TSR_OK, "%s", tsr_error_message());
  return st == TSR_OK;
}

static bool plain(struct tsr_engine *e, int32_t *out) { return plain_from(e, 0, out); }

/* The same through speculative steps; *steps counts them. */
static bool speculated(struct tsr_engine *e, int32_t *out, int *steps) {
  const int32_t v = tsr_engine_n_vocab(e);
  float *logits = malloc(sizeof(float) * (size_t)v);
  struct tsr_sampler *s = NULL;
  const struct tsr_sampler_params greedy = {.temperature = 0, .top_p = 1};
  tsr_status st = tsr_sampler_new(&greedy, v, &s);
  if (st == TSR_OK) st = tsr_engine_eval(e, 0, prompt(e), PROMPT, logits, NULL);
  int32_t n = 0, step[MAX_DRAFT + 1], got;
  if (st == TSR_OK) out[n++] = (int32_t)tsr_test_argmax(logits, v);
  *steps = 0;
  while (st == TSR_OK && n < GEN) {
    st = tsr_engine_speculate(e, 0, out[n - 1], s, MAX_DRAFT, step, &got);
    ++*steps;
    for (int32_t i = 0; st == TSR_OK && i < got && n < GEN; i++) out[n++] = step[i];
  }
  tsr_sampler_free(s);
  free(logits);
  CHECK_MSG(st == TSR_OK, "%s", tsr_error_message());
  return st == TSR_OK;
}

/* rejected: some proposals were rejected, so the cache (and recurrent state) rolled back */
static void lossless(const char *model, bool want_rejections) {
  struct tsr_engine *a = engine(model, false), *b = engine(model, true);
  CHECK_MSG(a && b, "%s", tsr_error_message());
  int32_t want[GEN], got[GEN];
  int steps = 0;
  if (a && b && plain(a, want) && speculated(b, got, &steps)) {
    const struct tsr_plugin *p =
        tsr_plugin_host_find_plugin(tsr_engine_setup(b)->host, "example_speculator");
    const uint64_t drafted = p ? tsr_plugin_engaged(p, "tokens_drafted") : 0;
    const uint64_t accepted = p ? tsr_plugin_engaged(p, "tokens_accepted") : 0;
    int same = 0;
    while (same < GEN && want[same] == got[same]) same++;
    printf("  %d tokens in %d speculative steps: %llu drafted, %llu accepted; the same as plain "
           "greedy for %d of %d\n", GEN, steps, (unsigned long long)drafted,
           (unsigned long long)accepted, same, GEN);
    CHECK(same == GEN);
    CHECK(drafted > 0 && accepted > 0 && steps < GEN - 1);
    if (want_rejections) CHECK_MSG(accepted < drafted, "no proposal was rejected");
  }
  tsr_engine_free(a);
  tsr_engine_free(b);
}

static void test_greedy_speculation_is_lossless_and_speculates(void) { lossless(g_model, false); }

static void test_recurrent_state_rolls_back_to_the_last_kept_token(void) {
  lossless(g_recurrent, true);
}

/* N_SEQ sequences, each from its own prompt, speculating together: every step verifies
** all their drafts in one batch (a model with linear layers, one batch each). Each gets
** the tokens it gets decoding alone, and the sequences' drafts were kept and cut. */
enum { N_SEQ = 3 };
static void together(const char *model) {
  struct tsr_engine *a = engine(model, false), *b = engine_of(model, true, N_SEQ);
  CHECK_MSG(a && b, "%s", tsr_error_message());
  if (!a || !b) goto done;
  const int32_t v = tsr_engine_n_vocab(b);
  int32_t want[N_SEQ][GEN], got[N_SEQ][GEN], n[N_SEQ], seqs[N_SEQ], next[N_SEQ], drafts[N_SEQ];
  int32_t out[N_SEQ][TSR_SPEC_MAX_DRAFT + 1], n_out[N_SEQ];
  struct tsr_sampler *smp[N_SEQ] = {0};
  float *logits = malloc(sizeof(float) * (size_t)v);
  const struct tsr_sampler_params greedy = {.temperature = 0, .top_p = 1};
  tsr_status st = TSR_OK;
  for (int k = 0; k < N_SEQ && st == TSR_OK; k++) {
    CHECK(tsr_engine_seq_rm(a, 0, -1, -1) == TSR_OK);
    if (!plain_from(a, 7 * k, want[k])) st = TSR_ERR_INTERNAL;
    if (st == TSR_OK) st = tsr_sampler_new(&greedy, v, &smp[k]);
    if (st == TSR_OK) st = tsr_engine_eval(b, k, prompt_from(b, 7 * k), PROMPT, logits, NULL);
    if (st == TSR_OK) got[k][0] = (int32_t)tsr_test_argmax(logits, v), n[k] = 1;
  }
  int steps = 0, cut = 0;
  while (st == TSR_OK) {
    int m = 0;
    for (int k = 0; k < N_SEQ; k++)
      if (n[k] < GEN) seqs[m] = k, next[m] = got[k][n[k] - 1], drafts[m] = MAX_DRAFT, m++;
    if (!m) break;
    struct tsr_sampler *s[N_SEQ];
    for (int i = 0; i < m; i++) s[i] = smp[seqs[i]];
    st = tsr_engine_speculate_multi(b, m, seqs, next, s, drafts, &out[0][0], n_out);
    steps++;
    for (int i = 0; st == TSR_OK && i < m; i++) {
      const int k = seqs[i];
      cut += n_out[i] < MAX_DRAFT + 1;
      for (int32_t j = 0; j < n_out[i] && n[k] < GEN; j++) got[k][n[k]++] = out[i][j];
    }
  }
  CHECK_MSG(st == TSR_OK, "%s", tsr_error_message());
  const struct tsr_plugin *p =
      tsr_plugin_host_find_plugin(tsr_engine_setup(b)->host, "example_speculator");
  const uint64_t accepted = p ? tsr_plugin_engaged(p, "tokens_accepted") : 0;
  printf("  %d sequences, %d tokens each in %d shared steps (%d drafts cut short), %llu "
         "accepted\n", N_SEQ, GEN, steps, cut, (unsigned long long)accepted);
  for (int k = 0; st == TSR_OK && k < N_SEQ; k++)
    CHECK_MSG(!memcmp(want[k], got[k], sizeof want[k]), "sequence %d differs from its plain "
              "greedy tokens", k);
  CHECK(accepted > 0 && steps < GEN);
  for (int k = 0; k < N_SEQ; k++) tsr_sampler_free(smp[k]);
  free(logits);
done:
  tsr_engine_free(a);
  tsr_engine_free(b);
}

static void test_sequences_speculate_in_one_batch(void) { together(g_model); }

/* A step for sequences that cannot take one is refused, naming why, and changes nothing. */
static void test_bad_speculative_steps_are_refused(void) {
  struct tsr_engine *e = engine_of(g_model, true, 2);
  if (!e) return;
  const int32_t v = tsr_engine_n_vocab(e);
  float *logits = malloc(sizeof(float) * (size_t)v);
  struct tsr_sampler *s = NULL;
  const struct tsr_sampler_params greedy = {.temperature = 0, .top_p = 1};
  CHECK_OK(tsr_sampler_new(&greedy, v, &s));
  CHECK_OK(tsr_engine_eval(e, 0, prompt(e), PROMPT, logits, NULL));
  int32_t out[3][TSR_SPEC_MAX_DRAFT + 1], n_out[3];
  struct tsr_sampler *ss[3] = {s, s, s}, *none[1] = {NULL};
  const int32_t two[2] = {0, 0}, next[3] = {1, 1, 1}, d[3] = {2, 2, 2}, far[1] = {5};
  CHECK(tsr_engine_speculate_multi(e, 2, two, next, ss, d, &out[0][0], n_out) == TSR_ERR_INVALID_ARG);
  CHECK_MSG(strstr(tsr_error_message(), "sequence 0 twice") != NULL, "%s", tsr_error_message());
  const int32_t three[3] = {0, 1, 2};
  CHECK(tsr_engine_speculate_multi(e, 3, three, next, ss, d, &out[0][0], n_out) == TSR_ERR_INVALID_ARG);
  CHECK(tsr_engine_speculate_multi(e, 1, far, next, ss, d, &out[0][0], n_out) == TSR_ERR_INVALID_ARG);
  CHECK(tsr_engine_speculate_multi(e, 1, two, next, none, d, &out[0][0], n_out) == TSR_ERR_INVALID_ARG);
  CHECK_MSG(strstr(tsr_error_message(), "without a sampler") != NULL, "%s", tsr_error_message());
  CHECK(tsr_engine_seq_len(e, 0) == PROMPT && tsr_engine_seq_len(e, 1) == 0);
  tsr_sampler_free(s);
  free(logits);
  tsr_engine_free(e);
}

static void test_sequences_with_recurrent_state_speculate_together(void) {
  together(g_recurrent);
}

int main(int argc, char **argv) {
  if (argc > 2 && !strcmp(argv[1], "--backend")) g_backend = argv[2], argc -= 2, argv += 2;
  if (argc != 6) {
    fprintf(stderr, "usage: %s OUT_DIR PLUGIN_DIR MODEL.gguf GOLDEN.gguf RECURRENT.gguf\n",
            argv[0]);
    return 2;
  }
  g_out = argv[1], g_plugins = argv[2], g_model = argv[3], g_recurrent = argv[5];
  struct tsr_gguf *gold = NULL;
  if (!tsr_test_golden_seq0(argv[4], PROMPT, &gold, &g_gs)) return 2;
  TSR_RUN(test_greedy_speculation_is_lossless_and_speculates);
  TSR_RUN(test_recurrent_state_rolls_back_to_the_last_kept_token);
  TSR_RUN(test_sequences_speculate_in_one_batch);
  TSR_RUN(test_bad_speculative_steps_are_refused);
  TSR_RUN(test_sequences_with_recurrent_state_speculate_together);
  tsr_gguf_close(gold);
  return TSR_TEST_EXIT();
}
