/*
** Speculative sampling's verification (engine/spec_verify.h), against the
** property that defines it: whatever the drafter proposes and whatever
** distribution it drew from, the tokens that come out are distributed as the
** target's own sampling. Checked by Monte Carlo with fixed seeds (so every run
** draws the same numbers) on a 6-token vocabulary, where 100,000 trials put
** each frequency within 0.002 (one sigma) of its probability and the bound is
** 0.01; plus greedy exactness, no randomness at temperature 0, and refusals of
** a distribution that is not one.
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "engine/spec_verify.h"
#include "harness.h"

enum { V = 6, TRIALS = 100000 };

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static double unit(void) { /* the drafter's own generator */
  g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(g_rng >> 11) * 0x1p-53;
}

static int32_t draw(const float *q) {
  const double u = unit();
  double cum = 0;
  for (int32_t j = 0; j < V; j++)
    if ((cum += q[j]) > u) return j;
  return V - 1;
}

/* softmax of logits at temperature 1, what the sampler's distribution is */
static void softmax(const float *l, double *p) {
  double m = l[0], z = 0;
  for (int j = 1; j < V; j++) m = fmax(m, l[j]);
  for (int j = 0; j < V; j++) z += p[j] = exp(l[j] - m);
  for (int j = 0; j < V; j++) p[j] /= z;
}

static const float g_logits[3][V] = {
    {1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 0.0f},
    {0.0f, -0.5f, 2.5f, 1.0f, 0.2f, 0.7f},
    {3.0f, 0.0f, 0.0f, 1.0f, 0.0f, 0.0f},
};

/* n_draft 2 through verify TRIALS times; the first output's frequencies against p
** (row 0), the second's (when the first proposal was kept) against row 1 */
static void check_lossless(struct tsr_sampler *s, const float q[2][V], const char *what) {
  struct tsr_spec_scratch sc;
  CHECK_OK(tsr_spec_scratch_init(&sc, V));
  double f0[V] = {0}, f1[V] = {0}, n1 = 0;
  for (int t = 0; t < TRIALS; t++) {
    int32_t draft[2], out[3], n_out, kept;
    const int32_t fixed[2] = {4, 2}; /* a deterministic drafter's proposals */
    for (int i = 0; i < 2; i++) draft[i] = q ? draw(q[i]) : fixed[i];
    if (tsr_spec_verify(s, &sc, &g_logits[0][0], draft, 2, q ? &q[0][0] : NULL, out, &n_out,
                        &kept) != TSR_OK) {
      CHECK_MSG(0, "%s: %s", what, tsr_error_message());
      break;
    }
    CHECK(n_out == kept + 1);
    f0[out[0]]++;
    if (n_out > 1) f1[out[1]]++, n1++;
  }
  double p0[V], p1[V], worst = 0;
  softmax(g_logits[0], p0);
  softmax(g_logits[1], p1);
  for (int j = 0; j < V; j++) {
    worst = fmax(worst, fabs(f0[j] / TRIALS - p0[j]));
    if (n1 > 1000) worst = fmax(worst, fabs(f1[j] / n1 - p1[j]));
  }
  printf("  %s: largest |frequency - p| %.4f (second token over %.0f trials)\n", what, worst, n1);
  CHECK_MSG(worst < 0.01, "%s: a frequency is %.4f off the target's probability", what, worst);
  tsr_spec_scratch_free(&sc);
}

static void test_output_is_distributed_as_the_target(void) {
  struct tsr_sampler *s;
  CHECK_OK(tsr_sampler_new(&(struct tsr_sampler_params){1.0f, 0, 1.0f, 0.0f, 7}, V, &s));
  const float close[2][V] = {{0.15f, 0.35f, 0.1f, 0.05f, 0.25f, 0.1f},
                             {0.05f, 0.05f, 0.5f, 0.15f, 0.1f, 0.15f}};
  const float far[2][V] = {{0.0f, 0.0f, 0.5f, 0.5f, 0.0f, 0.0f}, /* no mass on p's favourite */
                           {0.9f, 0.02f, 0.02f, 0.02f, 0.02f, 0.02f}};
  check_lossless(s, close, "drafter near the target");
  check_lossless(s, far, "drafter far from the target");
  check_lossless(s, NULL, "deterministic drafter (no distribution)");
  tsr_sampler_free(s);
}

static void test_greedy_keeps_exactly_the_argmax_and_draws_nothing(void) {
  struct tsr_sampler *s, *fresh;
  const struct tsr_sampler_params greedy = {0.0f, 0, 1.0f, 0.0f, 11};
  CHECK_OK(tsr_sampler_new(&greedy, V, &s));
  CHECK_OK(tsr_sampler_new(&greedy, V, &fresh));
  struct tsr_spec_scratch sc;
  CHECK_OK(tsr_spec_scratch_init(&sc, V));
  int32_t out[3], n_out, kept;
  const int32_t all[2] = {1, 2}; /* the argmaxes of rows 0 and 1 */
  CHECK_OK(tsr_spec_verify(s, &sc, &g_logits[0][0], all, 2, NULL, out, &n_out, &kept));
  CHECK(kept == 2 && n_out == 3 && out[0] == 1 && out[1] == 2 && out[2] == 0);
  const int32_t wrong[2] = {1, 3};
  CHECK_OK(tsr_spec_verify(s, &sc, &g_logits[0][0], wrong, 2, NULL, out, &n_out, &kept));
  CHECK(kept == 1 && n_out == 2 && out[0] == 1 && out[1] == 2);
  const float q[2][V] = {{0.1f, 0.5f, 0.1f, 0.1f, 0.1f, 0.1f},
                         {0.2f, 0.2f, 0.2f, 0.2f, 0.1f, 0.1f}};
  const int32_t first_wrong[2] = {0, 2};
  CHECK_OK(tsr_spec_verify(s, &sc, &g_logits[0][0], first_wrong, 2, &q[0][0], out, &n_out, &kept));
  CHECK(kept == 0 && n_out == 1 && out[0] == 1);
  CHECK_MSG(tsr_sampler_uniform(s) == tsr_sampler_uniform(fresh),
            "greedy verification consumed random draws");
  tsr_spec_scratch_free(&sc);
  tsr_sampler_free(s), tsr_sampler_free(fresh);
}

/* top-k 2 cuts tokens 0, 3, 5 from row 0: a proposal there is never kept and never comes out */
static void test_cut_tokens_never_come_out(void) {
  struct tsr_sampler *s;
  CHECK_OK(tsr_sampler_new(&(struct tsr_sampler_params){1.0f, 2, 1.0f, 0.0f, 3}, V, &s));
  struct tsr_spec_scratch sc;
  CHECK_OK(tsr_spec_scratch_init(&sc, V));
  int bad = 0;
  for (int t = 0; t < 2000; t++) {
    int32_t out[2], n_out, kept;
    const int32_t draft[1] = {t % 2 ? 0 : 3};
    CHECK_OK(tsr_spec_verify(s, &sc, &g_logits[0][0], draft, 1, NULL, out, &n_out, &kept));
    bad += kept != 0 || (out[0] != 1 && out[0] != 4);
  }
  CHECK_MSG(bad == 0, "%d trials kept a cut proposal or gave a cut token", bad);
  tsr_spec_scratch_free(&sc);
  tsr_sampler_free(s);
}

static void test_a_distribution_that_is_not_one_is_refused(void) {
  const int32_t draft[1] = {2};
  const float nan_row[V] = {0.5f, NAN, 0.5f, 0, 0, 0}, half[V] = {0.25f, 0.25f, 0, 0, 0, 0},
              zero_at_proposal[V] = {0.5f, 0.5f, 0, 0, 0, 0}, fine[V] = {0, 0, 1.0f, 0, 0, 0};
  CHECK(tsr_spec_check_dists(nan_row, V, draft, 1) != TSR_OK);
  CHECK(strstr(tsr_error_message(), "gives token 1 probability nan") != NULL);
  CHECK(tsr_spec_check_dists(half, V, draft, 1) != TSR_OK);
  CHECK(strstr(tsr_error_message(), "sums to 0.500000") != NULL);
  CHECK(tsr_spec_check_dists(zero_at_proposal, V, draft, 1) != TSR_OK);
  CHECK(strstr(tsr_error_message(), "proposal 0 (token 2) has probability 0") != NULL);
  CHECK_OK(tsr_spec_check_dists(fine, V, draft, 1));
}

int main(void) {
  TSR_RUN(test_output_is_distributed_as_the_target);
  TSR_RUN(test_greedy_keeps_exactly_the_argmax_and_draws_nothing);
  TSR_RUN(test_cut_tokens_never_come_out);
  TSR_RUN(test_a_distribution_that_is_not_one_is_refused);
  return TSR_TEST_EXIT();
}
