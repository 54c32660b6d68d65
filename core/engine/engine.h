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
#include "tessera/tessera.h"

/* The engine's calls that are also the embedding API (tsr_engine_n_vocab, _n_ctx,
** _n_seq, _eval, _seq_len, _seq_rm, _seq_cp, _seq_keep, _common_prefix,
** _context_shift) are declared, and their contracts stated, in tessera/tessera.h. */
struct tsr_engine;

struct tsr_engine_options {
  const char *profile_path;  /* NULL: the default profile the build ships */
  const char *const *sets;   /* --set overrides */
  int n_sets;
  const char *model_path;    /* overrides the profile's model (tessera run -m), or NULL */
  int n_threads;             /* <= 0: the profile's threads (0 there: all cores) */
};

tsr_status tsr_engine_new(const struct tsr_engine_options *opt, struct tsr_engine **out);
/* What tsr_engine_new loads first: the profile (or the built-in default one, with every arch
** plugin built) with its overrides, the model, its plugins and their composition. */
struct tsr_setup;
tsr_status tsr_engine_load_setup(const struct tsr_engine_options *opt, struct tsr_setup **out);
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

/* tsr_engine_seq_len of every sequence (the profile's server.parallel of them) in one
** pass over the cache: a caller tracking many sequences per step uses this. */
void tsr_engine_seq_lens(const struct tsr_engine *e, int32_t *lens);

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
/* The same for n sequences at once: sequence seqs[i] with its next[i], samplers[i] and at
** most max_draft[i] proposals; every sequence's token and proposals are verified in one
** batch, which must fit a ubatch (the sum of max_draft[i] + 1; when it would not, every
** sequence's is cut to ubatch / n - 1, and n past the ubatch is refused). out holds n rows of
** TSR_SPEC_MAX_DRAFT + 1 entries, n_out n counts. On a model with linear layers, whose
** state rolls back from the checkpoints of one sequence's batch, each sequence takes its
** own batch. */
tsr_status tsr_engine_speculate_multi(struct tsr_engine *e, int32_t n, const int32_t *seqs,
                                      const int32_t *next, struct tsr_sampler *const *samplers,
                                      const int32_t *max_draft, int32_t *out, int32_t *n_out);

/* What the speculative steps of the engine's life did: steps, tokens drafted and kept, and
** the seconds spent drafting and verifying (evaluating the batch, choosing, rolling back). */
#define TSR_ENGINE_SPEC_POSITIONS 8 /* = TSR_SPEC_MAX_DRAFT */
struct tsr_engine_spec_stats {
  int64_t steps, drafted, accepted;
  double draft_seconds, verify_seconds;
  /* per draft position i: steps whose draft reached it, and those that kept it */
  int64_t drafted_at[TSR_ENGINE_SPEC_POSITIONS], kept_at[TSR_ENGINE_SPEC_POSITIONS];
};
void tsr_engine_spec_stats(const struct tsr_engine *e, struct tsr_engine_spec_stats *out);

/* The model's NextN head over n entries of sequence seq through the engine's KV cache
** (host->spec->nextn, plugin/speculator.h): entries at held positions keep their K/V in
** the head's layer, entries past them (following without a gap) are evaluated in cells
** released before it returns. The last entry's logits and output hidden row go to
** logits and hidden_out where not NULL. */
tsr_status tsr_engine_nextn(struct tsr_engine *e, int32_t seq, const int32_t *tokens,
                            const int32_t *pos, const float *hidden, int32_t n, float *logits,
                            float *hidden_out);

/* One step of drafter d, a model whose layers read this engine's K/V (kv_shared_from -1,
** e.g. gemma4_assistant): token at position pos with hidden (the target's final hidden row,
** or the previous step's output), attending to what sequence seq holds in the last layer of
** each kind owning K/V, as the target's attention of that kind does. The logits (the
** target's vocabulary) and the next step's hidden row go to logits and hidden_out where not
** NULL. Where the target's codec is read through query and output transforms, the drafter's
** query and output go through those of the layer it reads. */
tsr_status tsr_engine_drafter_step(struct tsr_engine *e, const struct tsr_setup *d, int32_t seq,
                                   int32_t token, int32_t pos, const float *hidden,
                                   float *logits, float *hidden_out);

#endif
