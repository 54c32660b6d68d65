#include "engine/spec_verify.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "common/error.h"

tsr_status tsr_spec_scratch_init(struct tsr_spec_scratch *s, int32_t n_vocab) {
  s->n_vocab = n_vocab;
  s->ids = malloc((size_t)n_vocab * sizeof *s->ids);
  s->probs = malloc((size_t)n_vocab * sizeof *s->probs);
  if (s->ids && s->probs) return TSR_OK;
  tsr_spec_scratch_free(s);
  return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
}

void tsr_spec_scratch_free(struct tsr_spec_scratch *s) {
  free(s->ids), free(s->probs);
  s->ids = NULL, s->probs = NULL;
}

static tsr_status check_dist(const float *q, int32_t n_vocab, int32_t row, int32_t proposal) {
  double sum = 0;
  for (int32_t j = 0; j < n_vocab; j++) {
    if (!(q[j] >= 0.0f) || !isfinite(q[j]))
      return tsr_error_set(TSR_ERR_INTERNAL, "speculator: draft distribution %d gives token %d "
                           "probability %g", row, j, (double)q[j]);
    sum += q[j];
  }
  if (fabs(sum - 1.0) > 1e-3)
    return tsr_error_set(TSR_ERR_INTERNAL, "speculator: draft distribution %d sums to %.6f, not "
                         "1", row, sum);
  if (!(q[proposal] > 0.0f))
    return tsr_error_set(TSR_ERR_INTERNAL, "speculator: proposal %d (token %d) has probability 0 "
                         "in the distribution it was drawn from", row, proposal);
  return TSR_OK;
}

tsr_status tsr_spec_check_dists(const float *dist, int32_t n_vocab, const int32_t *draft,
                                int32_t n_draft) {
  for (int32_t i = 0; i < n_draft; i++) {
    tsr_status st = check_dist(dist + (size_t)i * n_vocab, n_vocab, i, draft[i]);
    if (st != TSR_OK) return st;
  }
  return TSR_OK;
}

/* A token from max(0, p - q) normalised, over p's kept ids (p is 0 elsewhere); q NULL:
** the point mass at x. */
static int32_t draw_residual(struct tsr_sampler *s, const struct tsr_spec_scratch *sc, int32_t n,
                             const float *q, int32_t x) {
  if (n == 1) return sc->ids[0]; /* greedy: p's one token, no draw */
  double total = 0;
  for (int32_t i = 0; i < n; i++) {
    const double qi = q ? q[sc->ids[i]] : sc->ids[i] == x;
    total += fmax(0.0, sc->probs[i] - qi);
  }
  const double target = tsr_sampler_uniform(s) * total;
  double cum = 0;
  int32_t last = -1;
  for (int32_t i = 0; i < n; i++) {
    const double qi = q ? q[sc->ids[i]] : sc->ids[i] == x;
    const double w = fmax(0.0, sc->probs[i] - qi);
    cum += w;
    if (w > 0) last = i;
    if (w > 0 && cum > target) return sc->ids[i];
  }
  return sc->ids[last >= 0 ? last : 0]; /* u within rounding of 1 */
}

tsr_status tsr_spec_verify(struct tsr_sampler *sampler, struct tsr_spec_scratch *sc,
                           const float *logits, const int32_t *draft, int32_t n_draft,
                           const float *dist, int32_t *out, int32_t *n_out, int32_t *kept) {
  const int32_t V = sc->n_vocab;
  *n_out = *kept = 0;
  for (int32_t i = 0; i <= n_draft; i++) {
    int32_t n;
    tsr_status st =
        tsr_sampler_distribution(sampler, logits + (size_t)i * V, sc->ids, sc->probs, &n);
    if (st != TSR_OK) return st;
    if (i == n_draft) { /* every proposal kept: the bonus token, from p */
      double target = n > 1 ? tsr_sampler_uniform(sampler) : 0, cum = 0;
      int32_t y = sc->ids[n - 1];
      for (int32_t j = 0; j < n; j++) {
        cum += sc->probs[j];
        if (cum > target) {
          y = sc->ids[j];
          break;
        }
      }
      out[(*n_out)++] = y;
      return TSR_OK;
    }
    const int32_t x = draft[i];
    const float *q = dist ? dist + (size_t)i * V : NULL;
    double px = 0;
    for (int32_t j = 0; j < n; j++)
      if (sc->ids[j] == x) px = sc->probs[j];
    const double qx = q ? q[x] : 1.0;
    /* kept surely when p(x) >= q(x), never when p(x) is 0: a draw only in between */
    const bool keep = px >= qx || (px > 0 && tsr_sampler_uniform(sampler) < px / qx);
    if (!keep) {
      out[(*n_out)++] = draw_residual(sampler, sc, n, q, x);
      return TSR_OK;
    }
    out[(*n_out)++] = x;
    (*kept)++;
  }
  return TSR_OK;
}
