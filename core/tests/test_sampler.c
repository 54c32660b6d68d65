/*
** Sampler tests.
**
** The expected distributions come from a reference written out plainly in this file
** (sort everything, softmax, cut in probability space, temper, renormalise), so the
** sampler's partial selection, lazy ranking and logit-space cuts are checked against
** something that shares none of their code.
**
** With --bench: prints the time per sample at vocab 151936 and 262144 for common settings.
*/
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "harness.h"
#include "engine/sampler.h"

#define P(t, k, tp, mp, sd) ((struct tsr_sampler_params){(t), (k), (tp), (mp), (sd)})

/* ---- reference ------------------------------------------------------------------------ */

static const float *g_sort_logits;
static int by_rank(const void *pa, const void *pb) {
  int a = *(const int *)pa, b = *(const int *)pb;
  float la = g_sort_logits[a], lb = g_sort_logits[b];
  if (la != lb) return la > lb ? -1 : 1;
  return a - b;
}

/* prob[0 .. n): the chain's distribution over token ids (finite logits, NaN and -inf only).
** Returns the number of kept tokens. */
static int ref_dist(const float *l, int n, struct tsr_sampler_params p, double *prob) {
  int *ord = malloc((size_t)n * sizeof *ord), m = 0;
  double *q = malloc((size_t)n * sizeof *q);
  for (int i = 0; i < n; i++)
    if (isfinite(l[i])) ord[m++] = i;
  g_sort_logits = l;
  qsort(ord, (size_t)m, sizeof *ord, by_rank);
  if (p.top_k > 0 && p.top_k < m) m = p.top_k;
  double z = 0;
  for (int i = 0; i < m; i++) z += q[i] = exp((double)l[ord[i]] - l[ord[0]]);
  for (int i = 0; i < m; i++) q[i] /= z;
  if (p.top_p < 1) {
    double cum = 0;
    for (int i = 0; i < m; i++) {
      cum += q[i];
      if (cum >= p.top_p) {
        m = i + 1;
        break;
      }
    }
  }
  /* renormalising over the survivors does not change ratios to the top one */
  for (int i = 1; i < m; i++)
    if (q[i] < p.min_p * q[0]) {
      m = i;
      break;
    }
  memset(prob, 0, (size_t)n * sizeof *prob);
  z = 0;
  double q0 = q[0];
  for (int i = 0; i < m; i++) z += q[i] = pow(q[i] / q0, 1.0 / p.temperature);
  for (int i = 0; i < m; i++) prob[ord[i]] = q[i] / z;
  free(ord);
  free(q);
  return m;
}

static struct tsr_sampler *make(struct tsr_sampler_params p, int n) {
  struct tsr_sampler *s = NULL;
  CHECK_OK(tsr_sampler_new(&p, n, &s));
  return s;
}

static int32_t draw(struct tsr_sampler *s, const float *l) {
  int32_t t = -1;
  CHECK_OK(tsr_sampler_sample(s, l, &t));
  return t;
}

static void fill_normal(float *l, int n, float scale) {
  for (int i = 0; i < n; i++) l[i] = scale * tsr_test_normal();
}

/* ---- greedy and bad logits ------------------------------------------------------------ */

static void test_greedy_picks_argmax_and_lower_id_on_ties(void) {
  float l[] = {1, 3, 2, 3, -5};
  struct tsr_sampler *s = make(P(0, 0, 1, 0, 1), 5);
  CHECK(draw(s, l) == 1);
  tsr_sampler_free(s);

  enum { N = 5000 };
  static float big[N];
  tsr_test_seed(11);
  fill_normal(big, N, 2);
  big[4321] = big[777] = 50; /* a tie at the top: the lower id wins */
  s = make(P(0, 40, 0.5f, 0.2f, 9), N); /* greedy ignores the other settings */
  CHECK(draw(s, big) == 777);
  tsr_sampler_free(s);
}

/* -0.0 and +0.0 are equal logits, so the lower id ranks first, also where ranking goes by
** the bits (a row long enough for the radix paths). */
static void test_signed_zeros_tie_to_the_lower_id(void) {
  enum { N = 5000 };
  static float l[N];
  for (int i = 0; i < N; i++) l[i] = -1;
  l[10] = -0.0f;
  l[20] = 0.0f;
  struct tsr_sampler *g = make(P(0, 0, 1, 0, 1), N), *k1 = make(P(1, 1, 1, 0, 1), N),
                     *k2 = make(P(1, 2, 1, 0, 1), N), *all = make(P(1, 0, 1, 0, 1), N);
  CHECK(draw(g, l) == 10);
  CHECK(draw(k1, l) == 10);
  int32_t *ids = malloc(N * sizeof *ids), n = 0;
  double *pr = malloc(N * sizeof *pr);
  CHECK_OK(tsr_sampler_distribution(k2, l, ids, pr, &n));
  CHECK(n == 2 && ids[0] == 10 && ids[1] == 20);
  CHECK_OK(tsr_sampler_distribution(all, l, ids, pr, &n));
  CHECK(n == N && ids[0] == 10 && ids[1] == 20 && ids[2] == 0 && ids[N - 1] == N - 1);
  free(ids);
  free(pr);
  tsr_sampler_free(g);
  tsr_sampler_free(k1);
  tsr_sampler_free(k2);
  tsr_sampler_free(all);
}

static void test_nan_never_wins(void) {
  float l[] = {NAN, 1, NAN, 2, NAN, -INFINITY};
  struct tsr_sampler *g = make(P(0, 0, 1, 0, 1), 6);
  CHECK(draw(g, l) == 3); /* NaN at index 0 must not seed the maximum */
  float only[] = {NAN, -INFINITY, -7, NAN, -INFINITY, NAN};
  CHECK(draw(g, only) == 2);
  tsr_sampler_free(g);

  struct tsr_sampler *s = make(P(5, 0, 1, 0, 2), 6);
  int bad = 0, seen[6] = {0};
  for (int i = 0; i < 20000; i++) {
    int32_t t = draw(s, l);
    if (t < 0 || t > 5) bad++;
    else seen[t]++;
  }
  CHECK(bad == 0);
  CHECK(seen[0] == 0 && seen[2] == 0 && seen[4] == 0 && seen[5] == 0);
  CHECK(seen[1] > 0 && seen[3] > 0);
  tsr_sampler_free(s);
}

static void test_row_without_usable_logit_is_an_error(void) {
  float inf[] = {-INFINITY, -INFINITY, -INFINITY};
  float nan[] = {NAN, NAN, NAN};
  float mix[] = {NAN, -INFINITY, NAN};
  const float *rows[] = {inf, nan, mix};
  struct tsr_sampler_params ps[] = {P(0, 0, 1, 0, 1), P(1, 0, 1, 0, 1), P(0.7f, 2, 0.9f, 0.1f, 1)};
  for (int r = 0; r < 3; r++)
    for (int k = 0; k < 3; k++) {
      struct tsr_sampler *s = make(ps[k], 3);
      int32_t t = 12345;
      CHECK(tsr_sampler_sample(s, rows[r], &t) == TSR_ERR_INVALID_ARG);
      CHECK(t == 12345);
      CHECK_MSG(strstr(tsr_error_message(), "NaN or -inf") != NULL, "%s", tsr_error_message());
      int32_t ids[3], n = 0;
      double pr[3];
      CHECK(tsr_sampler_distribution(s, rows[r], ids, pr, &n) == TSR_ERR_INVALID_ARG);
      tsr_sampler_free(s);
    }
}

static void test_pos_inf_tokens_share_all_mass(void) {
  float l[] = {1, INFINITY, 3, INFINITY, NAN};
  struct tsr_sampler *g = make(P(0, 0, 1, 0, 1), 5);
  CHECK(draw(g, l) == 1);
  tsr_sampler_free(g);
  struct tsr_sampler *s = make(P(1, 0, 1, 0, 3), 5);
  int seen[5] = {0}, n = 20000;
  for (int i = 0; i < n; i++) seen[draw(s, l)]++;
  CHECK(seen[1] + seen[3] == n);
  CHECK_MSG(abs(seen[1] - n / 2) < 5 * sqrt(n * 0.25), "%d vs %d", seen[1], seen[3]);
  tsr_sampler_free(s);
}

/* ---- parameters ----------------------------------------------------------------------- */

static void test_bad_params_are_refused_naming_field_and_value(void) {
  struct {
    struct tsr_sampler_params p;
    const char *field, *value;
  } bad[] = {
      {P(-0.5f, 0, 1, 0, 0), "temperature", "-0.5"},
      {P(NAN, 0, 1, 0, 0), "temperature", "nan"},
      {P(INFINITY, 0, 1, 0, 0), "temperature", "inf"},
      {P(1, -3, 1, 0, 0), "top_k", "-3"},
      {P(1, 0, 0, 0, 0), "top_p", "= 0 "},
      {P(1, 0, 1.5f, 0, 0), "top_p", "1.5"},
      {P(1, 0, -0.25f, 0, 0), "top_p", "-0.25"},
      {P(1, 0, 1, 1, 0), "min_p", "= 1 "},
      {P(1, 0, 1, -0.125f, 0), "min_p", "-0.125"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    struct tsr_sampler *s = (struct tsr_sampler *)&bad[i]; /* must be reset to NULL */
    CHECK(tsr_sampler_new(&bad[i].p, 10, &s) == TSR_ERR_INVALID_ARG);
    CHECK(s == NULL);
    const char *m = tsr_error_message();
    CHECK_MSG(strstr(m, bad[i].field) && strstr(m, bad[i].value), "case %zu: %s", i, m);
  }
  struct tsr_sampler *s = NULL;
  struct tsr_sampler_params ok = P(1, 0, 1, 0, 0);
  CHECK(tsr_sampler_new(&ok, 0, &s) == TSR_ERR_INVALID_ARG);
  CHECK(strstr(tsr_error_message(), "n_vocab") != NULL);
  struct tsr_sampler_params edge = P(0, 100, 1, 0.999f, UINT64_MAX); /* all at their limits */
  CHECK_OK(tsr_sampler_new(&edge, 10, &s));
  tsr_sampler_free(s);
}

/* ---- the chain ------------------------------------------------------------------------ */

static void test_cut_semantics_on_small_rows(void) {
  int32_t ids[5], n = 0;
  double pr[5];
  /* top-k ties at the boundary go to the lower id */
  float tie[] = {1, 3, 3, 5, 3};
  struct tsr_sampler *s = make(P(1, 2, 1, 0, 0), 5);
  CHECK_OK(tsr_sampler_distribution(s, tie, ids, pr, &n));
  CHECK(n == 2 && ids[0] == 3 && ids[1] == 1);
  tsr_sampler_free(s);

  /* probabilities 0.5, 0.3, 0.2: the token that crosses top_p is kept */
  float l[] = {logf(0.2f), logf(0.5f), logf(0.3f)};
  struct {
    struct tsr_sampler_params p;
    int n;
  } cases[] = {
      {P(1, 0, 0.45f, 0, 0), 1}, {P(1, 0, 0.55f, 0, 0), 2}, {P(1, 0, 0.85f, 0, 0), 3},
      {P(1, 0, 1, 0.5f, 0), 2},  {P(1, 0, 1, 0.7f, 0), 1},
      /* temperature last: at T = 100 the tempered row is nearly flat, and top-p applied
      ** to it would keep all three */
      {P(100, 0, 0.7f, 0, 0), 2},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    s = make(cases[i].p, 3);
    CHECK_OK(tsr_sampler_distribution(s, l, ids, pr, &n));
    CHECK_MSG(n == cases[i].n, "case %zu: kept %d, expected %d", i, n, cases[i].n);
    CHECK(ids[0] == 1 && (n < 2 || ids[1] == 2));
    tsr_sampler_free(s);
  }
}

static void test_top_k_1_is_greedy_at_any_temperature(void) {
  enum { N = 3000 };
  static float l[N];
  float temps[] = {0.01f, 1, 10, 1e4f};
  tsr_test_seed(5);
  for (int ti = 0; ti < 4; ti++) {
    struct tsr_sampler *g = make(P(0, 0, 1, 0, 0), N), *s = make(P(temps[ti], 1, 1, 0, ti), N);
    for (int r = 0; r < 20; r++) {
      fill_normal(l, N, 1);
      if (r == 0) l[100] = l[2000] = 9; /* tie */
      CHECK(draw(s, l) == draw(g, l));
    }
    tsr_sampler_free(g);
    tsr_sampler_free(s);
  }
}

/* 200k draws per setting, each bucket within 5 sigma of the reference, zero where the
** reference is zero; and the sampler's own distribution equal to the reference. */
static void test_draws_match_reference_distribution(void) {
  enum { N = 48, DRAWS = 200000 };
  float l[N];
  tsr_test_seed(21);
  fill_normal(l, N, 1.5f);
  l[7] = l[30] = l[11]; /* ties inside the kept sets */
  l[40] = NAN;
  l[41] = -INFINITY;
  struct tsr_sampler_params ps[] = {
      P(1, 0, 1, 0, 101),          P(0.7f, 10, 1, 0, 102),     P(1.3f, 0, 0.8f, 0, 103),
      P(0.9f, 0, 1, 0.1f, 104),    P(1.5f, 20, 0.9f, 0.05f, 105), P(2.5f, 0, 0.6f, 0, 106),
      P(0.25f, 30, 0.95f, 0, 107),
  };
  double expect[N], got[N];
  int32_t ids[N], counts[N];
  for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
    int kept = ref_dist(l, N, ps[k], expect);
    bool cuts = ps[k].top_k || ps[k].top_p < 1 || ps[k].min_p > 0;
    CHECK_MSG(kept > 1 && (!cuts || kept < N - 2), "setting %zu keeps %d: tests no cut", k, kept);
    struct tsr_sampler *s = make(ps[k], N);
    int32_t n = 0;
    CHECK_OK(tsr_sampler_distribution(s, l, ids, got, &n));
    CHECK_MSG(n == kept, "setting %zu: kept %d, reference %d", k, n, kept);
    for (int i = 0; i < n && n == kept; i++) {
      CHECK_CLOSE(got[i], expect[ids[i]], 1e-12, 1e-9);
      if (i > 0) {
        float a = l[ids[i - 1]], b = l[ids[i]];
        CHECK(a > b || (a == b && ids[i - 1] < ids[i])); /* rank order */
      }
    }
    memset(counts, 0, sizeof counts);
    for (int d = 0; d < DRAWS; d++) counts[draw(s, l)]++;
    for (int i = 0; i < N; i++) {
      double mu = DRAWS * expect[i], sd = sqrt(mu * (1 - expect[i]));
      if (expect[i] == 0)
        CHECK_MSG(counts[i] == 0, "setting %zu: token %d outside the kept set drawn %d times",
                  k, i, counts[i]);
      else
        CHECK_MSG(fabs(counts[i] - mu) <= 5 * sd + 1,
                  "setting %zu: token %d drawn %d, expected %.1f", k, i, counts[i], mu);
    }
    tsr_sampler_free(s);
  }
}

/* At full vocabulary size the lazy ranking and quickselect paths are the ones that run. */
static void test_large_vocab_keeps_reference_set(void) {
  enum { N = 151936 };
  float *l = malloc(N * sizeof *l);
  double *expect = malloc(N * sizeof *expect), *got = malloc(N * sizeof *got);
  int32_t *ids = malloc(N * sizeof *ids);
  tsr_test_seed(77);
  struct tsr_sampler_params ps[] = {
      P(0.8f, 40, 0.95f, 0.05f, 1), P(1, 0, 0.9f, 0, 2), P(1, 0, 1, 0.02f, 3),
      P(0.6f, 5000, 1, 0, 4),       P(1.2f, 0, 1, 0, 5),
  };
  for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
    fill_normal(l, N, 3.5f); /* a tail of a few hundred tokens holds most of the mass */
    l[k * 1000] = NAN;
    int kept = ref_dist(l, N, ps[k], expect);
    struct tsr_sampler *s = make(ps[k], N);
    int32_t n = 0;
    CHECK_OK(tsr_sampler_distribution(s, l, ids, got, &n));
    CHECK_MSG(n == kept, "setting %zu: kept %d, reference %d", k, n, kept);
    int mismatch = 0;
    for (int i = 0; i < n && n == kept; i++)
      mismatch += !(fabs(got[i] - expect[ids[i]]) <= 1e-12 + 1e-9 * expect[ids[i]]);
    CHECK_MSG(mismatch == 0, "setting %zu: %d probabilities differ", k, mismatch);
    int outside = 0;
    for (int d = 0; d < 200; d++) outside += expect[draw(s, l)] == 0;
    CHECK(outside == 0);
    tsr_sampler_free(s);
  }
  free(l);
  free(expect);
  free(got);
  free(ids);
}

/* ---- determinism ---------------------------------------------------------------------- */

static void test_seed_reproduces_sequence_and_different_seeds_differ(void) {
  enum { N = 64, LEN = 200 };
  float l[N];
  tsr_test_seed(3);
  fill_normal(l, N, 1);
  int32_t a[LEN], b[LEN], c[LEN];
  struct tsr_sampler *sa = make(P(1, 0, 0.95f, 0, 42), N), *sb = make(P(1, 0, 0.95f, 0, 42), N),
                     *sc = make(P(1, 0, 0.95f, 0, 43), N);
  for (int i = 0; i < LEN; i++) {
    a[i] = draw(sa, l);
    c[i] = draw(sc, l);
  }
  for (int i = 0; i < LEN; i++) b[i] = draw(sb, l);
  CHECK(memcmp(a, b, sizeof a) == 0);
  int differ = 0;
  for (int i = 0; i < LEN; i++) differ += a[i] != c[i];
  CHECK_MSG(differ > LEN / 4, "seeds 42 and 43 differ at %d of %d draws", differ, LEN);
  tsr_sampler_free(sa);
  tsr_sampler_free(sb);
  tsr_sampler_free(sc);
}

/* The stream is fixed by the algorithm: logits, parameters and seed give these tokens on
** every machine. A change here changes every seeded run users have recorded. */
static void test_seeded_sequence_is_pinned(void) {
  enum { N = 16, LEN = 16 };
  float l[N];
  for (int i = 0; i < N; i++) l[i] = -0.25f * (float)((i * 7) % N); /* exact values */
  static const int32_t want[LEN] = {3, 5, 0, 7, 12, 12, 14, 7, 7, 10, 0, 7, 3, 5, 6, 15};
  struct tsr_sampler *s = make(P(1, 0, 1, 0, 1234), N);
  int32_t got[LEN];
  for (int i = 0; i < LEN; i++) got[i] = draw(s, l);
  CHECK(memcmp(got, want, sizeof got) == 0);
  tsr_sampler_free(s);
}

static void test_low_temperature_approaches_greedy(void) {
  enum { N = 32, DRAWS = 20000 };
  float l[N];
  for (int i = 0; i < N; i++) l[i] = (float)((i * 13) % N) * 0.5f; /* argmax 27, gap 0.5 */
  float temps[] = {1, 0.3f, 0.1f, 0.03f, 1e-3f, 1e-30f};
  int prev = -1;
  for (int ti = 0; ti < 6; ti++) {
    struct tsr_sampler *s = make(P(temps[ti], 0, 1, 0, 9), N);
    int hits = 0;
    for (int d = 0; d < DRAWS; d++) hits += draw(s, l) == 27;
    /* the argmax share is 1 / (1 + sum exp(-0.5 j / T)): rising toward 1 */
    double share = 0;
    for (int j = 0; j < N; j++) share += exp(-0.5 * j / temps[ti]);
    double p = 1 / share;
    CHECK_MSG(fabs(hits - DRAWS * p) <= 5 * sqrt(DRAWS * p * (1 - p)) + 1, "T=%g: %d hits",
              (double)temps[ti], hits);
    CHECK(hits >= prev);
    prev = hits;
    tsr_sampler_free(s);
  }
  CHECK(prev == DRAWS);
}

/* ---- bench ---------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void bench(void) {
  int sizes[] = {151936, 262144};
  float scales[] = {1, 4};
  struct {
    const char *name;
    struct tsr_sampler_params p;
  } set[] = {
      {"greedy", P(0, 0, 1, 0, 1)},
      {"T=1 only", P(1, 0, 1, 0, 1)},
      {"top_k=40", P(0.8f, 40, 1, 0, 1)},
      {"top_p=0.95", P(0.8f, 0, 0.95f, 0, 1)},
      {"min_p=0.05", P(0.8f, 0, 1, 0.05f, 1)},
      {"k40 p0.95 m0.05", P(0.8f, 40, 0.95f, 0.05f, 1)},
  };
  for (int z = 0; z < 2; z++) {
    int n = sizes[z];
    float *l = malloc((size_t)n * sizeof *l);
    for (int sc = 0; sc < 2; sc++) {
      tsr_test_seed(1);
      fill_normal(l, n, scales[sc]);
      for (size_t k = 0; k < sizeof set / sizeof set[0]; k++) {
        struct tsr_sampler *s = make(set[k].p, n);
        /* CPU time, median of 41 draws: the draw's cost depends on where u falls */
        double t[41];
        for (int r = 0; r < 41; r++) {
          double t0 = cpu_now();
          draw(s, l);
          t[r] = cpu_now() - t0;
        }
        qsort(t, 41, sizeof t[0], cmp_double);
        printf("vocab %6d  logits N(0,%g^2)  %-16s %8.3f ms/sample\n", n, (double)scales[sc],
               set[k].name, t[20] * 1e3);
        tsr_sampler_free(s);
      }
    }
    free(l);
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--bench")) {
    bench();
    return 0;
  }
  TSR_RUN(test_greedy_picks_argmax_and_lower_id_on_ties);
  TSR_RUN(test_signed_zeros_tie_to_the_lower_id);
  TSR_RUN(test_nan_never_wins);
  TSR_RUN(test_row_without_usable_logit_is_an_error);
  TSR_RUN(test_pos_inf_tokens_share_all_mass);
  TSR_RUN(test_bad_params_are_refused_naming_field_and_value);
  TSR_RUN(test_cut_semantics_on_small_rows);
  TSR_RUN(test_top_k_1_is_greedy_at_any_temperature);
  TSR_RUN(test_draws_match_reference_distribution);
  TSR_RUN(test_large_vocab_keeps_reference_set);
  TSR_RUN(test_seed_reproduces_sequence_and_different_seeds_differ);
  TSR_RUN(test_seeded_sequence_is_pinned);
  TSR_RUN(test_low_temperature_approaches_greedy);
  return TSR_TEST_EXIT();
}
