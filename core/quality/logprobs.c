#include "quality/logprobs.h"

#include <math.h>
#include <stdlib.h>

double tsr_log_softmax(const float *x, int64_t n, float *logp) {
  float mx = -INFINITY;
  bool nan = false;
  for (int64_t i = 0; i < n; i++) {
    if (x[i] > mx) mx = x[i];
    nan |= isnan(x[i]);
  }
  if (nan || mx == -INFINITY) {
    for (int64_t i = 0; i < n; i++) logp[i] = NAN;
    return NAN;
  }
  double z = 0;
  for (int64_t i = 0; i < n; i++) z += exp((double)x[i] - mx);
  double lse = mx + log(z);
  for (int64_t i = 0; i < n; i++) logp[i] = (float)((double)x[i] - lse);
  return lse;
}

int64_t tsr_logits_argmax(const float *x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return best;
}

double tsr_entropy(const float *logp, int64_t n) {
  double h = 0;
  for (int64_t i = 0; i < n; i++)
    if (logp[i] > -INFINITY) h -= exp(logp[i]) * logp[i];
  return h;
}

double tsr_kl(const float *logp_p, const float *logp_q, int64_t n) {
  double kl = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!(logp_p[i] > -INFINITY)) continue; /* p = 0 adds nothing, whatever q is */
    kl += exp(logp_p[i]) * ((double)logp_p[i] - logp_q[i]);
  }
  return kl > 0 ? kl : (isnan(kl) ? kl : 0);
}

int64_t tsr_logits_top_k(const float *x, int64_t n, int64_t k, int32_t *idx) {
  if (k > n) k = n;
  if (k <= 0) return 0;
  int64_t m = 0; /* idx[0..m) sorted: largest first, ties by lower index */
  for (int64_t i = 0; i < n; i++) {
    if (m == k && !(x[i] > x[idx[k - 1]])) continue; /* the common case: one compare */
    int64_t j = m < k ? m++ : k - 1;
    while (j > 0 && x[i] > x[idx[j - 1]]) {
      idx[j] = idx[j - 1];
      j--;
    }
    idx[j] = (int32_t)i;
  }
  return m;
}

double tsr_top_k_tv(const float *logp_p, const int32_t *top_p, const float *logp_q,
                    const int32_t *top_q, int64_t k) {
  double tv = 0;
  for (int64_t i = 0; i < k; i++)
    tv += fabs(exp(logp_p[top_p[i]]) - exp(logp_q[top_p[i]]));
  for (int64_t i = 0; i < k; i++) {
    bool seen = false; /* already counted through P's set */
    for (int64_t j = 0; j < k && !seen; j++) seen = top_q[i] == top_p[j];
    if (!seen) tv += fabs(exp(logp_p[top_q[i]]) - exp(logp_q[top_q[i]]));
  }
  return tv / 2;
}

uint64_t tsr_fnv1a64(uint64_t h, const void *data, size_t len) {
  const unsigned char *p = data;
  for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

void tsr_sort_doubles(double *v, int64_t n) {
  if (n > 1) qsort(v, (size_t)n, sizeof *v, cmp_double);
}

double tsr_quantile_sorted(const double *sorted, int64_t n, double q) {
  if (n <= 0) return 0;
  double r = ceil(q * (double)n) - 1; /* nearest rank */
  int64_t i = r < 0 ? 0 : (int64_t)r;
  return sorted[i < n ? i : n - 1];
}
