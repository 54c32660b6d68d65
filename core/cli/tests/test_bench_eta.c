/*
** bench's fill estimate (bench_fill_seconds_left): exact on costs linear in the position,
** the plain rate extrapolation on a flat cost, and never below it when the last call ran
** faster than the mean.
*/
#include <math.h>

#include "../bench_eta.h"
#include "harness.h"

/* seconds to evaluate positions [lo, hi) at cost a + b p a token */
static double cost(double a, double b, int64_t lo, int64_t hi) {
  return a * (double)(hi - lo) + b * ((double)hi * hi - (double)lo * lo) / 2;
}

static void exact_on_a_cost_linear_in_position(void) {
  const double a = 2e-4, b = 3e-9;
  const int64_t n = 1048544, k = 65536;
  for (int64_t done = 2 * k; done < n; done += k) {
    const double left = bench_fill_seconds_left(n, done, k, cost(a, b, 0, done),
                                                cost(a, b, done - k, done));
    const double want = cost(a, b, done, n);
    CHECK_MSG(fabs(left - want) < 1e-9 * want, "done %lld: %.6f s, want %.6f",
              (long long)done, left, want);
  }
}

static void flat_cost_is_the_rate_extrapolation(void) {
  /* the first call alone, and any call of a flat cost */
  CHECK(fabs(bench_fill_seconds_left(1000, 100, 100, 5.0, 5.0) - 45.0) < 1e-9);
  CHECK(fabs(bench_fill_seconds_left(1000, 300, 100, 15.0, 5.0) - 35.0) < 1e-9);
  CHECK(bench_fill_seconds_left(1000, 1000, 100, 50.0, 5.0) == 0);
}

static void a_faster_last_call_never_predicts_a_speed_up(void) {
  /* last call cheaper than the mean: slope 0, the mean rate carries on */
  const double left = bench_fill_seconds_left(1000, 500, 100, 50.0, 5.0);
  CHECK(fabs(left - 50.0) < 1e-9);
}

/* the H200's 1M fill (docs/PERFORMANCE.md): at 524,288 of 1,048,544 tokens after 7.3 min,
** the call before at 5.8 min, it finished at 25.5 min; the rate extrapolation said 7.3 left */
static void the_1m_fill(void) {
  const double left = bench_fill_seconds_left(1048544, 524288, 65536, 7.3 * 60, 1.5 * 60) / 60;
  CHECK_MSG(left > 17.0 && left < 19.5, "%.2f min left, finished 18.2 min later", left);
}

int main(void) {
  TSR_RUN(exact_on_a_cost_linear_in_position);
  TSR_RUN(flat_cost_is_the_rate_extrapolation);
  TSR_RUN(a_faster_last_call_never_predicts_a_speed_up);
  TSR_RUN(the_1m_fill);
  return TSR_TEST_EXIT();
}
