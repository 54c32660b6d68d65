/*
** KV tiers against f16 KV on a reference fixture: the golden token sequence
** runs through the engine in ubatches of 16, so every position after the
** first ubatch attends over keys and values read back from the cache in the
** pair's codecs. Per pair: mean KL(f16 || pair) of the next-token
** distributions over all positions, and the fraction of positions whose
** argmax agrees. Asserted: KL grows as bits shrink across the symmetric
** tiers (q8_0, q6_0, q5_*, q4_*), and a q8_0 K with a q4_0 V is at least as
** good as q4_0 for both. The table is printed (core/kv/KV_CODECS.md records it).
** usage: test_kv_tiers MODEL.gguf GOLDEN.gguf (a fixture converted at f32;
** run_kv_tiers.sh converts it).
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "common/error.h"
#include "model/gguf.h"
#include "tests/harness.h"
#include "tests/logits_test_util.h"

/* Slack on each ordering, relative: a tier may measure up to this much above
** the next lower-bit tier's KL before the order counts as broken. On the
** fixtures the smallest step between groups is a factor of 3.1 (qwen3_5,
** q6_0 -> q5_1; KV_CODECS.md), so 25% leaves room for noise and still catches
** a tier that lost a bit. Argmax agreement may differ by one position. */
#define SLACK 0.25

struct pair {
  const char *k, *v;
  int group; /* symmetric tiers by bits: 0 q8_0, 1 q6_0, 2 q5_*, 3 q4_*; -1 not ordered */
  double kl, agree;
};

static struct pair g_pairs[] = {
    {"f32", "f32", -1, 0, 0},  {"q8_0", "q8_0", 0, 0, 0}, {"q6_0", "q6_0", 1, 0, 0},
    {"q5_1", "q5_1", 2, 0, 0}, {"q5_0", "q5_0", 2, 0, 0}, {"q4_1", "q4_1", 3, 0, 0},
    {"q4_0", "q4_0", 3, 0, 0}, {"q8_0", "q4_0", -1, 0, 0}, {"q8_0", "q6_0", -1, 0, 0},
    {"f16", "q4_0", -1, 0, 0}, {"q4_0", "q8_0", -1, 0, 0},
};
#define N_PAIRS ((int)(sizeof g_pairs / sizeof g_pairs[0]))

static const char *g_model;
static const int32_t *g_ids;
static int32_t g_n, g_vocab;
static double *g_base_lp; /* [g_n][vocab] log-probabilities with f16 KV */

/* Logits of the whole sequence with K and V in codecs k, v; NULL on failure. */
static float *run(const char *k, const char *v) {
  char ks[32], vs[32];
  snprintf(ks, sizeof ks, "kv.k=%s", k);
  snprintf(vs, sizeof vs, "kv.v=%s", v);
  const char *const sets[] = {ks, vs, "ubatch=16"};
  struct tsr_engine_options opt = {.sets = sets, .n_sets = 3, .model_path = g_model,
                                   .n_threads = 2};
  struct tsr_engine *e = NULL;
  tsr_status st = tsr_engine_new(&opt, &e);
  CHECK_MSG(st == TSR_OK, "K %s V %s: %s", k, v, tsr_error_message());
  if (st != TSR_OK) return NULL;
  CHECK(tsr_engine_n_vocab(e) == g_vocab);
  float *all = malloc((size_t)g_n * g_vocab * sizeof *all);
  st = tsr_engine_eval(e, 0, g_ids, g_n, NULL, all);
  CHECK_MSG(st == TSR_OK, "K %s V %s: %s", k, v, tsr_error_message());
  tsr_engine_free(e);
  if (st != TSR_OK) free(all);
  return st == TSR_OK ? all : NULL;
}

static void log_softmax(const float *x, double *out, int32_t n) {
  double mx = -INFINITY, sum = 0;
  for (int32_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
  for (int32_t i = 0; i < n; i++) sum += exp((double)x[i] - mx);
  const double lse = mx + log(sum);
  for (int32_t i = 0; i < n; i++) out[i] = (double)x[i] - lse;
}

static int32_t argmax_d(const double *x, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return best;
}

static void measure(struct pair *p) {
  float *all = run(p->k, p->v);
  p->kl = NAN, p->agree = 0;
  if (!all) return;
  double *lp = malloc((size_t)g_vocab * sizeof *lp), kl = 0;
  int agree = 0;
  for (int32_t t = 0; t < g_n; t++) {
    const double *base = g_base_lp + (size_t)t * g_vocab;
    log_softmax(all + (size_t)t * g_vocab, lp, g_vocab);
    double k = 0;
    for (int32_t i = 0; i < g_vocab; i++) k += exp(base[i]) * (base[i] - lp[i]);
    kl += k;
    agree += argmax_d(base, g_vocab) == argmax_d(lp, g_vocab);
  }
  p->kl = kl / g_n;
  p->agree = (double)agree / g_n;
  free(lp);
  free(all);
}

static double bits_per_value(const char *codec) {
  static const struct { const char *name; double bits; } k_bits[] = {
      {"f32", 32}, {"f16", 16}, {"q8_0", 8.5}, {"q6_0", 6.5}, {"q5_1", 6},
      {"q5_0", 5.5}, {"q4_1", 5}, {"q4_0", 4.5}};
  for (size_t i = 0; i < sizeof k_bits / sizeof k_bits[0]; i++)
    if (!strcmp(k_bits[i].name, codec)) return k_bits[i].bits;
  return 0;
}

static void test_every_pair_against_f16(void) {
  float *base = run("f16", "f16");
  if (!base) return;
  g_base_lp = malloc((size_t)g_n * g_vocab * sizeof *g_base_lp);
  for (int32_t t = 0; t < g_n; t++)
    log_softmax(base + (size_t)t * g_vocab, g_base_lp + (size_t)t * g_vocab, g_vocab);
  free(base);
  printf("  | K | V | bits/value (K+V)/2 | mean KL vs f16 KV | argmax agreement |\n");
  printf("  |---|---|---|---|---|\n");
  for (int i = 0; i < N_PAIRS; i++) {
    measure(&g_pairs[i]);
    printf("  | %s | %s | %.2f | %.3e | %.4f |\n", g_pairs[i].k, g_pairs[i].v,
           (bits_per_value(g_pairs[i].k) + bits_per_value(g_pairs[i].v)) / 2, g_pairs[i].kl,
           g_pairs[i].agree);
    CHECK_MSG(g_pairs[i].kl >= -1e-12 && isfinite(g_pairs[i].kl), "K %s V %s: KL %g",
              g_pairs[i].k, g_pairs[i].v, g_pairs[i].kl);
  }
}

static const struct pair *find(const char *k, const char *v) {
  for (int i = 0; i < N_PAIRS; i++)
    if (!strcmp(g_pairs[i].k, k) && !strcmp(g_pairs[i].v, v)) return &g_pairs[i];
  return NULL;
}

/* Every tier of a group at most (1 + SLACK) times every tier of the next. */
static void test_symmetric_tiers_are_monotone_in_bits(void) {
  for (int i = 0; i < N_PAIRS; i++)
    for (int j = 0; j < N_PAIRS; j++) {
      const struct pair *hi = &g_pairs[i], *lo = &g_pairs[j];
      if (hi->group < 0 || lo->group != hi->group + 1) continue;
      CHECK_MSG(hi->kl <= lo->kl * (1 + SLACK), "%s (KL %.3e) is worse than %s (KL %.3e)",
                hi->k, hi->kl, lo->k, lo->kl);
    }
  /* f32 KV is the f16 base's own noise floor: below every quantized tier */
  CHECK(find("f32", "f32")->kl <= find("q8_0", "q8_0")->kl);
  CHECK(find("q8_0", "q8_0")->agree + 1.0 / g_n >= find("q4_0", "q4_0")->agree);
}

static void test_high_precision_k_low_v_beats_symmetric_low(void) {
  const struct pair *kv = find("q8_0", "q4_0"), *low = find("q4_0", "q4_0");
  CHECK_MSG(kv->kl <= low->kl, "q8_0/q4_0 KL %.3e vs q4_0/q4_0 %.3e", kv->kl, low->kl);
  CHECK(kv->agree + 1.0 / g_n >= low->agree);
  /* and raising V to q6_0 with the same K only helps */
  const struct pair *k8v6 = find("q8_0", "q6_0");
  CHECK_MSG(k8v6->kl <= kv->kl * (1 + SLACK), "q8_0/q6_0 KL %.3e vs q8_0/q4_0 %.3e", k8v6->kl,
            kv->kl);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s MODEL.gguf GOLDEN.gguf\n", argv[0]);
    return 2;
  }
  g_model = argv[1];
  struct tsr_gguf *gold = NULL;
  struct tsr_test_golden gs;
  if (!tsr_test_golden_seq0(argv[2], 32, &gold, &gs)) return 2;
  g_ids = gs.ids, g_n = gs.n, g_vocab = gs.vocab;
  printf("%s: %d tokens in ubatches of 16, vocabulary %d\n", g_model, g_n, g_vocab);
  TSR_RUN(test_every_pair_against_f16);
  if (g_base_lp) {
    TSR_RUN(test_symmetric_tiers_are_monotone_in_bits);
    TSR_RUN(test_high_precision_k_low_v_beats_symmetric_low);
  }
  free(g_base_lp);
  tsr_gguf_close(gold);
  return TSR_TEST_EXIT();
}
