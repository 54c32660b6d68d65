/*
** Minimal test harness: each test file defines static test functions and a
** main() that runs them with TSR_RUN. A failed CHECK prints file:line and
** marks the test failed; main returns non-zero if any test failed.
*/
#ifndef TSR_TEST_HARNESS_H
#define TSR_TEST_HARNESS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int tsr_test_failures_ = 0;   /* checks failed in the current test */
static int tsr_tests_failed_ = 0;    /* tests with at least one failure */
static int tsr_tests_run_ = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      tsr_test_failures_++;                                                    \
    }                                                                          \
  } while (0)

#define CHECK_MSG(cond, ...)                                                   \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "  %s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                            \
      fputc('\n', stderr);                                                     \
      tsr_test_failures_++;                                                    \
    }                                                                          \
  } while (0)

/* |a-b| <= atol + rtol*|b| */
#define CHECK_CLOSE(a, b, atol, rtol)                                          \
  do {                                                                         \
    double a_ = (a), b_ = (b);                                                 \
    if (!(fabs(a_ - b_) <= (atol) + (rtol) * fabs(b_))) {                      \
      fprintf(stderr, "  %s:%d: %s = %.9g, expected %s = %.9g\n", __FILE__,    \
              __LINE__, #a, a_, #b, b_);                                       \
      tsr_test_failures_++;                                                    \
    }                                                                          \
  } while (0)

#define CHECK_OK(expr)                                                         \
  do {                                                                         \
    tsr_status st_ = (expr);                                                   \
    if (st_ != TSR_OK) {                                                       \
      fprintf(stderr, "  %s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr,   \
              tsr_error_message());                                            \
      tsr_test_failures_++;                                                    \
    }                                                                          \
  } while (0)

/* st_expr fails with a message holding needle */
#define CHECK_ERR_HAS(st_expr, needle)                                         \
  do {                                                                         \
    tsr_status s_ = (st_expr);                                                 \
    CHECK_MSG(s_ != TSR_OK, "expected a failure");                             \
    CHECK_MSG(strstr(tsr_error_message(), needle) != NULL,                     \
              "message '%s' lacks '%s'", tsr_error_message(), needle);         \
  } while (0)

#define TSR_RUN(fn)                                                            \
  do {                                                                         \
    tsr_test_failures_ = 0;                                                    \
    tsr_tests_run_++;                                                          \
    fn();                                                                      \
    printf("%s %s\n", tsr_test_failures_ ? "FAIL" : "ok  ", #fn);              \
    fflush(stdout);                                                            \
    if (tsr_test_failures_) tsr_tests_failed_++;                               \
  } while (0)

#define TSR_TEST_EXIT()                                                        \
  (printf("%d tests, %d failed\n", tsr_tests_run_, tsr_tests_failed_),         \
   tsr_tests_failed_ ? 1 : 0)

/* Deterministic generator (xorshift64*), so failures reproduce. */
static uint64_t tsr_test_rng_ = 0x9e3779b97f4a7c15ull;
static inline void tsr_test_seed(uint64_t s) { tsr_test_rng_ = s ? s : 1; }
static inline uint64_t tsr_test_next(void) {
  tsr_test_rng_ ^= tsr_test_rng_ >> 12;
  tsr_test_rng_ ^= tsr_test_rng_ << 25;
  tsr_test_rng_ ^= tsr_test_rng_ >> 27;
  return tsr_test_rng_ * 0x2545f4914f6cdd1dull;
}
/* uniform in [lo, hi) */
static inline float tsr_test_uniform(float lo, float hi) {
  return lo + (hi - lo) * (float)((tsr_test_next() >> 40) * (1.0 / 16777216.0));
}
static inline float tsr_test_normal(void) {
  double u1 = ((tsr_test_next() >> 11) + 1.0) * (1.0 / 9007199254740993.0);
  double u2 = (tsr_test_next() >> 11) * (1.0 / 9007199254740992.0);
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

#endif
