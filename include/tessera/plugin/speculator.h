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

/* ABI 2.4: the target engine a speculator drafts for, and a drafter reading its K/V
** (host->spec), opaque */
struct tsr_spec_target;
struct tsr_spec_drafter;

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
  /* ABI 2.4: the target engine the draft is for, which host->spec's head calls
  ** (nextn) run on */
  struct tsr_spec_target *target;
};

/* ABI 2.4: tokens of one or more sequences the target has just evaluated and
** keeps (a prompt's ubatches, plain decode steps, the kept rows of a verify batch),
** with each one's final hidden row (what its LM head reads), for a speculator that
** asked for them (tsr_speculator_v1.rows). */
struct tsr_spec_rows {
  uint32_t struct_size;
  struct tsr_spec_target *target;
  int32_t n, n_embd;
  const int32_t *tokens, *pos, *seq; /* n each */
  const float *hidden;               /* n rows of n_embd floats */
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
  /* ABI 2.4. Optional: called with every token the target evaluates and keeps,
  ** in order (struct tsr_spec_rows), so a drafter can advance a cache of its own
  ** over the prompt and the kept tokens (NextN's). An error fails the target's
  ** evaluation. The hidden rows of every token cost nothing beyond a copy. */
  tsr_status (*rows)(void *ctx, const struct tsr_host *host, const struct tsr_spec_rows *r);
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
  /* ABI 2.4: the target's own NextN head (tsr_arch_v1.build_nextn) over n
  ** entries of sequence seq, through the target's KV cache. Entry i is token
  ** tokens[i] with the trunk's final hidden row hidden[i] (n_embd floats) at
  ** position pos[i] (increasing); it predicts the token after tokens[i]. An entry
  ** at a position the sequence holds writes the head's K/V into that position's
  ** cell, where it stays (the head's own cache, which later entries attend to);
  ** entries past the held positions (a draft's chain) must follow them without a
  ** gap and are evaluated in cells released before the call returns. Any n: the
  ** host splits it into ubatches. The last entry's logits (n_vocab floats) and
  ** output hidden row (the next depth's input, n_embd floats) go to logits and
  ** hidden_out where not NULL. A target without a NextN head is refused by name. */
  tsr_status (*nextn)(struct tsr_spec_target *t, int32_t seq, const int32_t *tokens,
                      const int32_t *pos, const float *hidden, int32_t n, float *logits,
                      float *hidden_out);
  /* ABI 2.4: a drafter, a model whose layers all read the target's K/V
  ** (tsr_arch_layer.kv_shared_from -1: Gemma 4's assistant). open_drafter loads the
  ** GGUF under the host's built-in default profile and refuses, by name, a model
  ** that is not a drafter or whose vocabulary is not target's. drafter_step runs
  ** one step for sequence seq of t: token at position pos with hidden (the target's
  ** final hidden row, or the previous step's hidden_out), each layer attending to
  ** what seq holds in the target's last layer of its kind owning K/V, as the
  ** target's attention of that kind does; it writes the logits (the target's
  ** vocabulary) and the next step's hidden row where not NULL. Nothing of the
  ** target changes. */
  tsr_status (*open_drafter)(const struct tsr_gguf *target, const char *model,
                             struct tsr_spec_drafter **out);
  void (*close_drafter)(struct tsr_spec_drafter *d);
  tsr_status (*drafter_step)(struct tsr_spec_drafter *d, struct tsr_spec_target *t, int32_t seq,
                             int32_t token, int32_t pos, const float *hidden, float *logits,
                             float *hidden_out);
};

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_PLUGIN_SPECULATOR_H */
