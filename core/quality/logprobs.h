/*
** Distribution arithmetic shared by the quality tools (perplexity, logit-eq):
** log-softmax, entropy, KL divergence, top-k selection and top-k total
** variation. Sums run in double; a row is a whole vocabulary (150k floats),
** so everything here is one or two passes over it.
*/
#ifndef TSR_LOGPROBS_H
#define TSR_LOGPROBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* logp[i] = x[i] - logsumexp(x); logp may be x itself. Returns logsumexp(x).
** -inf logits give -inf log-probs; a row of all -inf or any NaN gives NaN. */
double tsr_log_softmax(const float *x, int64_t n, float *logp);

/* Index of the largest value (the first of equals). */
int64_t tsr_logits_argmax(const float *x, int64_t n);

/* -sum p log p of a normalized log-prob row, in nats. */
double tsr_entropy(const float *logp, int64_t n);

/* KL(P || Q) = sum p (log p - log q) of two normalized log-prob rows, in nats;
** rounding below zero is clamped to 0. */
double tsr_kl(const float *logp_p, const float *logp_q, int64_t n);

/* The k largest values' indices, largest first (ties: lower index first).
** k is clamped to n; returns the number written. */
int64_t tsr_logits_top_k(const float *x, int64_t n, int64_t k, int32_t *idx);

/* Total variation between P and Q restricted to the union U of both top-k sets:
** 1/2 sum_{i in U} |p_i - q_i| with the full-vocabulary probabilities. It is a
** lower bound of the full TV and equals it when the mass outside U is negligible;
** it is what a server exposing top-k log-probs could compute. */
double tsr_top_k_tv(const float *logp_p, const int32_t *top_p, const float *logp_q,
                    const int32_t *top_q, int64_t k);

/* 64-bit FNV-1a, for fingerprints of texts and vocabularies (not security). */
uint64_t tsr_fnv1a64(uint64_t h, const void *data, size_t len);
#define TSR_FNV1A64_INIT 0xcbf29ce484222325ull

/* Sorts v (n doubles) ascending in place. */
void tsr_sort_doubles(double *v, int64_t n);
/* The q-quantile (q in [0, 1], nearest rank) of n sorted values; 0 when n is 0. */
double tsr_quantile_sorted(const double *sorted, int64_t n, double q);

#endif
