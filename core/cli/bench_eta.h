#ifndef TSR_CLI_BENCH_ETA_H
#define TSR_CLI_BENCH_ETA_H
/*
** How long a long prefill has left, for bench's --progress lines. A token's cost grows
** with its position (causal attention reads every earlier key), so a rate-so-far
** extrapolation says "half done" at the halfway token when three quarters of the time
** is still to come. The cost is taken as a + b p: the mean over [0, done) and the last
** call's mean over [done - k, done) fix a and b (b >= 0, so noise never predicts a
** speed-up), and the rest is its integral over [done, n).
*/
#include <stdint.h>

static inline double bench_fill_seconds_left(int64_t n, int64_t done, int64_t k,
                                             double s_all, double s_last) {
  if (done <= 0 || k <= 0 || done >= n) return 0;
  const double mean = s_all / (double)done, last = s_last / (double)k;
  /* the two means sit at positions done / 2 and done - k / 2: (done - k) / 2 apart */
  double b = done > k ? (last - mean) / ((double)(done - k) / 2) : 0;
  if (b < 0) b = 0;
  double a = mean - b * (double)done / 2;
  if (a < 0) a = 0;
  return a * (double)(n - done) + b * ((double)n * n - (double)done * done) / 2;
}

#endif
