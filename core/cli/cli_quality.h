/* What `tessera perplexity` and `tessera logit-eq` share: a text file cut into
** windows of the model's tokens, each evaluated in a fresh sequence. */
#ifndef TSR_CLI_QUALITY_H
#define TSR_CLI_QUALITY_H

#include <stdint.h>
#include <stdio.h>

#include "engine.h"
#include "tokenizer.h"

struct tsr_qtext {
  char *bytes;        /* the file, NUL-terminated */
  size_t len;
  uint64_t hash;      /* FNV-1a of the bytes */
  int32_t *ids;       /* its tokens (no BOS/EOS added) */
  size_t n_ids;
};

/* Reads and tokenizes path; messages name the file. */
tsr_status tsr_qtext_load(const char *path, const struct tsr_tokenizer *tok, struct tsr_qtext *t);
void tsr_qtext_free(struct tsr_qtext *t);

/* A fingerprint of the vocabulary: every token's stored text and type. */
uint64_t tsr_vocab_hash(const struct tsr_tokenizer *tok);

/* Window w: ctx tokens from w * ctx, the first replaced by BOS when the model
** wants one (llama.cpp's convention), evaluated from position 0 of sequence 0
** after forgetting whatever it held. logits gets ctx x n_vocab floats. */
tsr_status tsr_qtext_eval_window(struct tsr_engine *e, const struct tsr_tokenizer *tok,
                                 const struct tsr_qtext *t, int32_t ctx, int64_t w,
                                 int32_t *window, float *logits);

/* "value +/- err" helpers: the mean of n samples and its standard error. */
struct tsr_mean_acc {
  double sum, sum2;
  int64_t n;
};
static inline void tsr_mean_add(struct tsr_mean_acc *a, double x) {
  a->sum += x;
  a->sum2 += x * x;
  a->n++;
}
double tsr_mean_of(const struct tsr_mean_acc *a);
double tsr_mean_stderr(const struct tsr_mean_acc *a);

double tsr_now_s(void);

#endif
