/*
** Reference parity: run a model on golden token ids and compare its logits
** (and, for sequence 0, the hidden state after each layer) with golden
** outputs saved by a reference implementation (tests/reference writes them
** as golden.gguf: seq.<i>.ids i32 [n], seq.<i>.logits f32 [vocab, n],
** seq.0.hidden.<layer> f32 [embd, n]).
**
** Per position: max |a - b|, that divided by max |b| of the row (relative
** error on the row's scale, so near-zero logits do not blow it up), argmax
** agreement and KL(softmax(golden) || softmax(ours)).
*/
#ifndef TSR_PARITY_H
#define TSR_PARITY_H

#include <stdbool.h>
#include <stdio.h>

#include "tessera/tessera.h"

#define TSR_PARITY_MAX_SEQS 16
#define TSR_PARITY_MAX_LAYERS 256

struct tsr_parity_stats {
  int64_t n_positions;
  double max_abs, max_rel;   /* over all positions */
  double argmax_agreement;   /* fraction of positions */
  double mean_kl, max_kl;
};

struct tsr_parity_layer {
  double max_abs, max_rel;
};

struct tsr_parity_report {
  char arch[64];
  int n_seqs;
  struct tsr_parity_stats seqs[TSR_PARITY_MAX_SEQS];
  struct tsr_parity_stats total;
  int n_layers;              /* hidden states compared (sequence 0), 0 if none */
  struct tsr_parity_layer layers[TSR_PARITY_MAX_LAYERS];
  bool has_embed;
  struct tsr_parity_layer embed;
};

struct tsr_parity_options {
  int n_threads;             /* <= 0: all cores */
  const char *attention;     /* NULL: flash */
  const char *plugin_dir;    /* extra plugin search directory, or NULL */
  const char *const *require_engaged; /* plugins that must have counted work */
  int n_require_engaged;
};

/* Compares one row: updates stats with a (ours) against b (golden). */
void tsr_parity_compare_row(const float *a, const float *b, int64_t n, struct tsr_parity_stats *s,
                            double *kl_sum);

/* Same from a top-k golden row: ids and logits of its k largest (highest
** first) and the log-sum-exp of the full row; KL over the top set plus one
** bucket for the rest of the vocabulary. */
void tsr_parity_compare_top(const float *a, int64_t n, const int32_t *top_ids,
                            const float *top_logits, int64_t k, float golden_lse,
                            struct tsr_parity_stats *s, double *kl_sum);

tsr_status tsr_parity_run(const char *model_path, const char *golden_path,
                          const struct tsr_parity_options *opt, struct tsr_parity_report *out);
void tsr_parity_print(const struct tsr_parity_report *r, FILE *f);

#endif
