/*
** The engine: one loaded model ready to run token batches through its KV
** cache. Built from a profile (tsr_setup: plugins, model, composition,
** memory plan), it allocates the KV cache with the negotiated codecs and a
** backend, and evaluates batches of tokens of a sequence: prefill splits a
** batch into ubatches, decode is a batch of one.
*/
#ifndef TSR_ENGINE_H
#define TSR_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "abi/setup.h"

struct tsr_engine;

struct tsr_engine_options {
  const char *profile_path;  /* NULL: the default profile the build ships */
  const char *const *sets;   /* --set overrides */
  int n_sets;
  const char *model_path;    /* overrides the profile's model (tessera run -m), or NULL */
  int n_threads;             /* <= 0: the profile's threads (0 there: all cores) */
};

tsr_status tsr_engine_new(const struct tsr_engine_options *opt, struct tsr_engine **out);
void tsr_engine_free(struct tsr_engine *e);

/* The resolved profile, host, model, composition and memory plan. */
const struct tsr_setup *tsr_engine_setup(const struct tsr_engine *e);
/* Tokens one forward pass takes at most (the profile's ubatch, within the context). */
int32_t tsr_engine_n_ubatch(const struct tsr_engine *e);
/* The slot where the embedding API keeps its per-engine state (api/embed.h);
** tsr_engine_free frees what it holds. */
struct tsr_embed;
struct tsr_embed **tsr_engine_embed(struct tsr_engine *e);
/* Rows of logits the LM head has computed so far: a token's logits are computed only
** when read (the last of a prefill, unless all are asked for), when the arch takes
** tsr_arch_forward.output_rows. */
int64_t tsr_engine_logits_rows(const struct tsr_engine *e);
/* The backend the engine computes on (tessera bench probes it). */
struct tsr_backend *tsr_engine_backend(const struct tsr_engine *e);

/* Runs n tokens at the next positions of sequence seq (0 when serving one):
** prefill in ubatches of the profile's ubatch size, decode when n is 1.
** Writes the logits of the last token to logits_last (n_vocab floats), and
** when logits_all is not NULL those of every token (n x n_vocab). A
** context that is full is TSR_ERR_NOMEM naming n_ctx; the cache is then as
** before the call. */
tsr_status tsr_engine_eval(struct tsr_engine *e, int32_t seq, const int32_t *tokens, int32_t n,
                           float *logits_last, float *logits_all);

/* Tokens of several sequences in one pass (continuous batching): token i
** goes to the next position of sequence seq[i], a sequence's tokens in
** batch order. logits (when not NULL) receives one row of n_vocab floats per
** token whose logits[i] is true, in batch order (logits NULL: the last token
** of each sequence). Split into ubatches as eval; a failure puts every
** sequence the batch touched back as it was (or drops one whole when its
** tail cannot be cut, saying so). */
struct tsr_engine_batch {
  int32_t n;
  const int32_t *tokens;
  const int32_t *seq;
  const bool *logits;
};
tsr_status tsr_engine_eval_batch(struct tsr_engine *e, const struct tsr_engine_batch *b,
                                 float *logits);

/* For benchmarks only: appends n positions to seq as a fill would, computing nothing: the
** cells take their positions (and the sliding ring its releases); on the cpu their K/V rows
** are written with zero bytes, on a device backend its copy keeps what the cells held
** (zeros in a fresh cache, else an earlier computed context). So a decode can be timed at a
** depth without the fill's minutes (cuda's tensor-core attention reads every key whatever
** the values; the cpu's skips V rows whose weights underflow, none of which do over
** zeros). The ids are not remembered (prompt reuse never matches them). Refused for a
** model with recurrent layers, whose state only a computed fill gives, and past the free
** cells; a fill refused partway takes back what it added. */
tsr_status tsr_engine_fill_positions(struct tsr_engine *e, int32_t seq, int32_t n);

/* Next position of seq (= tokens it holds). */
int32_t tsr_engine_seq_len(const struct tsr_engine *e, int32_t seq);
/* The same for every sequence (the profile's server.parallel of them) in one
** pass over the cache: a caller tracking many sequences per step uses this. */
void tsr_engine_seq_lens(const struct tsr_engine *e, int32_t *lens);
/* Forgets positions [p0, p1) of seq (p1 < 0: to the end). Refused, naming
** why, when seq could not resume at p0 (recurrent state, or sliding-ring
** keys already released). */
tsr_status tsr_engine_seq_rm(struct tsr_engine *e, int32_t seq, int32_t p0, int32_t p1);

/* Prompt-prefix reuse: how many leading tokens of tokens[0..n) seq already
** holds at positions 0.. (the engine remembers the ids eval gave it). A
** caller keeps those (seq_rm from there on) and evaluates only the rest.
** 0 when the sequence cannot resume there (a sliding ring has released the
** keys a query at that position needs): everything is evaluated again. */
int32_t tsr_engine_common_prefix(const struct tsr_engine *e, int32_t seq, const int32_t *tokens,
                                 int32_t n);

/* One speculative step of sequence seq through the profile's speculator:
** `next` is the token to evaluate next (sampled, not yet in the cache). The
** speculator proposes up to max_draft tokens after it; next and the proposals
** are evaluated in one batch (max_draft + 1 must fit a ubatch) and verified by
** speculative sampling with sampler (engine/spec_verify.h): the output is
** distributed as sampler's own draws would be, the target's greedy text at
** temperature 0. The cache is rolled back past what was kept. out (max_draft + 1 entries) gets the
** kept proposals and then the target's own token, which is the new `next`;
** *n_out their count (1 at least). The speculator's plugin counts
** tokens_drafted and tokens_accepted. */
struct tsr_sampler;
tsr_status tsr_engine_speculate(struct tsr_engine *e, int32_t seq, int32_t next,
                                struct tsr_sampler *sampler, int32_t max_draft, int32_t *out,
                                int32_t *n_out);

/* Context shift: drops positions [n_keep, n_keep + n_discard) of seq and
** moves the later ones down by n_discard, re-rotating their cached keys
** through the arch's shift_keys (K is cached after RoPE), so the sequence
** goes on as if the dropped tokens had never been there but the kept ones
** were computed with them. Refused with TSR_ERR_UNSUPPORTED and the cache
** unchanged, naming why, for a model with linear (recurrent) layers, an arch
** without shift_keys, sliding layers whose ring has released positions the
** shifted sequence would see again, or cells shared with another sequence. */
tsr_status tsr_engine_context_shift(struct tsr_engine *e, int32_t seq, int32_t n_keep,
                                    int32_t n_discard);

#endif
