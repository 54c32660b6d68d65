/*
** tessera plugin ABI: the speculator interface, which drafts tokens.
*/
#ifndef TESSERA_PLUGIN_SPECULATOR_H
#define TESSERA_PLUGIN_SPECULATOR_H

#include "tessera/plugin/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- speculator, version 1 --------------------------------------------- */

/* One draft the host asks of a speculator. */
struct tsr_spec_request {
  uint32_t struct_size;
  int32_t seq;
  /* the sequence so far; the last token is the one about to be evaluated */
  const int32_t *tokens;
  int32_t n_tokens;
  /* the target's final hidden row (what its LM head read) at the last position it
  ** evaluated, n_embd floats; NULL when the arch exports none */
  const float *hidden;
  int32_t n_embd;
  int32_t max_draft;   /* propose at most this many tokens */
  int32_t *draft;      /* out: the proposed tokens, following tokens[n_tokens - 1] */
  /* The target's sampling, for a drafter that samples its proposals: temperature
  ** 0 is greedy; otherwise top-k, top-p and min-p cut, then temperature, as the
  ** host's sampler does. */
  float temperature, top_p, min_p;
  int32_t top_k;
  /* Optional out: the distribution proposal i was drawn from, row i of n_vocab
  ** probabilities (summing to 1) in the host's buffer of max_draft rows; a drafter
  ** that fills them sets dist_given. Without them the host takes the drafter as
  ** certain of each proposal. */
  float *draft_dist;
  int32_t n_vocab;
  bool dist_given;
};

struct tsr_speculator_v1 {
  uint32_t struct_size;
  const char *name;
  void *ctx;
  /* Whether it can speculate for this model (e.g. needs a NextN head). */
  tsr_status (*negotiate)(void *ctx, const struct tsr_host *host, const struct tsr_gguf *model);
  /* Proposes up to r->max_draft tokens (*n_draft, 0 when it has none). The host
  ** evaluates the last token and the proposals in one batch and verifies them by
  ** speculative sampling: proposal x is kept with probability min(1, p(x) / q(x)),
  ** p the target's distribution there and q the drafter's (r->draft_dist, or
  ** certainty of x), and at the first rejection the token comes from max(0, p - q)
  ** normalised; when all are kept a bonus token comes from p. The output is
  ** distributed as the target's own sampling, and at temperature 0 it is the
  ** target's greedy text. The cache is rolled back past what was kept. */
  tsr_status (*draft)(void *ctx, const struct tsr_host *host, struct tsr_spec_request *r,
                      int32_t *n_draft);
  /* How many of its last proposals the target kept, so a drafter with state of
  ** its own can advance or roll it back; may be NULL. */
  void (*accepted)(void *ctx, int32_t seq, int32_t n_accepted);
};

/* ---- ABI 2.3: a model of the speculator's own (host->spec) ---------------- */

/* A draft model the host runs for a speculator: one sequence, its own KV cache. */
struct tsr_spec_model;

struct tsr_host_spec {
  uint32_t struct_size;
  /* Opens model (a GGUF path) under the host's built-in default profile with the
  ** overrides in sets ("context=4096", "backend=cuda", "threads=2"): every check a
  ** profile gets is made, and a failure names what was wrong. With target (the model
  ** the speculator drafts for) the draft must share its vocabulary, every token's
  ** bytes, or it is refused naming the first token that differs. */
  tsr_status (*open)(const struct tsr_gguf *target, const char *model, const char *const *sets,
                     int n_sets, struct tsr_spec_model **out);
  void (*close)(struct tsr_spec_model *m);
  int32_t (*n_vocab)(const struct tsr_spec_model *m);
  /* Makes the model hold exactly tokens[0..n) (reusing the prefix it holds already,
  ** evaluating the rest) and writes the last token's logits (n_vocab floats). */
  tsr_status (*sync)(struct tsr_spec_model *m, const int32_t *tokens, int32_t n, float *logits);
  /* Evaluates one more token after what it holds; its logits to logits. */
  tsr_status (*step)(struct tsr_spec_model *m, int32_t token, float *logits);
};

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_PLUGIN_SPECULATOR_H */
