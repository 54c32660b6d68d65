/*
** Token sampling from one row of logits.
**
** The chain, in this order (llama.cpp's common sampler chain, so a setting
** means the same thing here as there):
**
**   top-k -> top-p -> min-p -> temperature -> draw
**
** Temperature comes last, so top-p and min-p judge the model's own
** distribution (softmax at T = 1): how many tokens survive does not depend on
** the temperature, and temperature only reshapes the mass among survivors.
** With it first, a high temperature would flatten the distribution and let
** top-p admit hundreds of tokens, which is the opposite of what top-p is set
** for.
**
**  - top-k keeps the k tokens with the highest logits.
**  - top-p keeps the shortest prefix of what is left (highest first) whose
**    probability, renormalised over what is left, reaches top_p; the token
**    that crosses the threshold is kept.
**  - min-p keeps tokens whose probability is at least min_p times the
**    largest one, i.e. logit >= max_logit + log(min_p).
**  - temperature: the survivors are drawn with probability proportional to
**    exp((logit - max_logit) / T).
**
** Order and ties: candidates are ranked by logit, highest first, ties to the
** lower token id; every cut above is a prefix of that ranking and the draw
** walks it with double-precision cumulative sums, choosing the first token
** whose cumulative weight exceeds u * total (u uniform in [0, 1)). So a small
** u picks the most likely token, and the result depends only on the logits,
** the parameters and the seed: the generator is the sampler's own (splitmix64),
** never rand(), and each non-greedy sample consumes exactly one draw of it (a
** call that fails consumes none). The weights come from libm's exp() in
** double; a libm rounding its last bit differently could change a draw only
** when u falls within ~1e-16 of a boundary between two tokens.
**
** Greedy (temperature 0) is the argmax, ties to the lower id, and ignores the
** other settings (each of them keeps the argmax anyway); it uses no randomness.
**
** Logits: NaN and -inf are never chosen. A row with no other value is
** TSR_ERR_INVALID_ARG (never a made-up token). A +inf logit is the limit of
** softmax: the +inf tokens share all the mass equally and the rest get none.
**
** A sampler holds its generator state and scratch space: one thread at a time.
*/
#ifndef TSR_SAMPLER_H
#define TSR_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "tessera/tessera.h"

struct tsr_sampler_params {
  float temperature; /* 0: greedy; otherwise finite and > 0 */
  int32_t top_k;     /* 0: off; >= n_vocab is also off */
  float top_p;       /* in (0, 1]; 1: off */
  float min_p;       /* in [0, 1); 0: off */
  uint64_t seed;     /* any value, 0 included */
};

struct tsr_sampler; /* opaque */

/* Validates the parameters (a bad one is TSR_ERR_INVALID_ARG naming the field and its
** value) and allocates scratch space for n_vocab candidates. */
tsr_status tsr_sampler_new(const struct tsr_sampler_params *params, int32_t n_vocab,
                           struct tsr_sampler **out);
void tsr_sampler_free(struct tsr_sampler *s);

/* Picks one token from logits[0 .. n_vocab). */
tsr_status tsr_sampler_sample(struct tsr_sampler *s, const float *logits, int32_t *token);

/*
** The distribution tsr_sampler_sample draws from, without drawing: the kept tokens in
** rank order (highest logit first, ties to the lower id) in ids[0 .. *n) and their
** probabilities in probs (summing to 1). ids and probs hold n_vocab entries each.
** Greedy gives the argmax with probability 1. Uses no randomness. Meant for speculative
** decoding (acceptance needs the target's probabilities) and for reporting logprobs.
*/
tsr_status tsr_sampler_distribution(struct tsr_sampler *s, const float *logits, int32_t *ids,
                                    double *probs, int32_t *n);

/* One draw of the sampler's generator, uniform in [0, 1) (speculative sampling's
** acceptance and residual draws share the stream with sampling). */
double tsr_sampler_uniform(struct tsr_sampler *s);

/* The parameters the sampler was made with. */
const struct tsr_sampler_params *tsr_sampler_params_of(const struct tsr_sampler *s);
/* Marks the seed as drawn at random: tsr_sampler_describe says so. */
void tsr_sampler_seed_drawn(struct tsr_sampler *s);

#endif
