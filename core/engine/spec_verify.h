/*
** Verifying a speculator's draft against the target, once for every
** speculator (engine.c: tsr_engine_speculate). Speculative sampling: with
** p the target's distribution at a row (the sampler's, after top-k, top-p,
** min-p and temperature) and q the distribution the drafter drew proposal x
** from, x is kept with probability min(1, p(x) / q(x)); at the first
** rejection the token is drawn from max(0, p - q) normalised, and when every
** proposal is kept a bonus token is drawn from p at the row after the last.
** The tokens that come out are distributed exactly as sampling the target
** alone would give. A drafter that gives no q is certain of each proposal
** (q a point mass), which keeps x with probability p(x) and otherwise draws
** from p without x; at temperature 0 p is a point mass at the argmax, so a
** proposal is kept exactly when it is the target's greedy token and no
** randomness is used.
*/
#ifndef TSR_SPEC_VERIFY_H
#define TSR_SPEC_VERIFY_H

#include <stdint.h>

#include "engine/sampler.h"

/* Scratch for one verification: n_vocab ids and probabilities. */
struct tsr_spec_scratch {
  int32_t *ids;
  double *probs;
  int32_t n_vocab;
};

tsr_status tsr_spec_scratch_init(struct tsr_spec_scratch *s, int32_t n_vocab);
void tsr_spec_scratch_free(struct tsr_spec_scratch *s);

/* Whether dist (n_draft rows of n_vocab) holds distributions the proposals can have
** been drawn from: a row with a negative or NaN entry, a sum off 1 by more than 1e-3,
** or no probability on its own proposal is refused, naming the row. Checked before the
** verify batch runs, so a bad drafter leaves the cache as it was. */
tsr_status tsr_spec_check_dists(const float *dist, int32_t n_vocab, const int32_t *draft,
                                int32_t n_draft);

/* logits: n_draft + 1 rows of n_vocab, row i the target's after the token before
** draft[i] (row n_draft: after the last proposal). dist: NULL, or n_draft rows of
** n_vocab probabilities the proposals were drawn from (tsr_spec_check_dists passed).
** out (n_draft + 1 entries) gets the kept proposals then the target's own token,
** *n_out their count (1 at least) and *kept the proposals kept. */
tsr_status tsr_spec_verify(struct tsr_sampler *sampler, struct tsr_spec_scratch *scratch,
                           const float *logits, const int32_t *draft, int32_t n_draft,
                           const float *dist, int32_t *out, int32_t *n_out, int32_t *kept);

#endif
