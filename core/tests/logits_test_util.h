/* Comparisons of logit rows shared by the engine tests. */
#ifndef TSR_LOGITS_TEST_UTIL_H
#define TSR_LOGITS_TEST_UTIL_H

#include <math.h>
#include <stdint.h>

/* max |a-b| / max |b| over one row: the parity tool's measure (NaN fails). */
static inline double tsr_test_row_rel(const float *a, const float *b, int64_t n) {
  double d = 0, scale = 0;
  for (int64_t i = 0; i < n; i++) {
    double x = fabs((double)a[i] - b[i]);
    if (!(x <= d)) d = x;
    if (fabs(b[i]) > scale) scale = fabs(b[i]);
  }
  return scale > 0 ? d / scale : d;
}

/* Index of the largest value, the first on ties. */
static inline int64_t tsr_test_argmax(const float *a, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; i++)
    if (a[i] > a[best]) best = i;
  return best;
}

#endif
