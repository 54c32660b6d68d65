/* What `tessera perplexity` and `tessera logit-eq` share: a text file cut into
** windows of the model's tokens, each evaluated in a fresh sequence. */
#ifndef TSR_CLI_QUALITY_H
#define TSR_CLI_QUALITY_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "model/chat.h"
#include "engine/engine.h"
#include "model/json.h"
#include "quality/ruler.h"
#include "model/tokenizer.h"

struct tsr_qtext {
  char *bytes;        /* the file, NUL-terminated */
  size_t len;
  uint64_t hash;      /* FNV-1a of the bytes */
  int32_t *ids;       /* its tokens */
  size_t n_ids;
};

/* Reads and tokenizes path; messages name the file. As text (prompt false): special-token
** names stay text, no BOS/EOS added; as a prompt: they are tokens, the model's BOS/EOS added
** as its tokenizer asks. */
tsr_status tsr_qtext_load(const char *path, const struct tsr_tokenizer *tok, bool prompt,
                          struct tsr_qtext *t);
void tsr_qtext_free(struct tsr_qtext *t);

/* A fingerprint of the vocabulary: every token's stored text and type. */
uint64_t tsr_vocab_hash(const struct tsr_tokenizer *tok);

/* Window w: ctx tokens from w * ctx, the first replaced by BOS when the model
** wants one (llama.cpp's convention), evaluated from position 0 of sequence 0
** after forgetting whatever it held: tokens before decode_from as one prefill, the
** rest a token at a time, as decode steps (decode_from = ctx: all one prefill).
** logits gets ctx x n_vocab floats. */
tsr_status tsr_qtext_eval_window(struct tsr_engine *e, const struct tsr_tokenizer *tok,
                                 const struct tsr_qtext *t, int32_t ctx, int64_t w,
                                 int32_t decode_from, int32_t *window, float *logits);

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

/* Position-by-position comparison of a reference's and a candidate's logits
** (logit-eq, ab): argmax disagreement (real_frac), top-k total variation,
** full top-k agreement and KL(ref || cand). */
struct tsr_logit_cmp {
  struct tsr_mean_acc differ, tv, agree, kl;
  double max_tv;
  int64_t k;
  int32_t n_vocab;
  float *lp_r, *lp_c;
  int32_t *top_r, *top_c;
};
tsr_status tsr_logit_cmp_init(struct tsr_logit_cmp *c, int32_t n_vocab, int64_t k);
void tsr_logit_cmp_add(struct tsr_logit_cmp *c, const float *ref, const float *cand);
void tsr_logit_cmp_free(struct tsr_logit_cmp *c);

/* A RULER run (cli_ruler.c), shared by `tessera ruler` and `tessera ab`. */
struct tsr_ruler_opts {
  enum tsr_ruler_task task;
  int64_t ctx, n;
  uint64_t seed;
  bool chat;                       /* render with the chat template */
  enum tsr_chat_template template; /* set by tsr_ruler_open */
  bool verbose, json_items;
};
struct tsr_ruler_result {
  double sum;                      /* of the item scores */
  int64_t n;
  double *scores;                  /* per item */
  cJSON *items;                    /* per item, when json_items */
  double prefill_tokens, prefill_s, decode_tokens, decode_s;
};
/* The engine and tokenizer for a run, and o->template (unless o->chat is
** false): chat_template, else the GGUF's, else the arch plugin's. */
tsr_status tsr_ruler_open(const struct tsr_engine_options *eo, const char *chat_template,
                          struct tsr_ruler_opts *o, struct tsr_engine **e,
                          struct tsr_tokenizer **tok);
tsr_status tsr_ruler_run(struct tsr_engine *e, const struct tsr_tokenizer *tok,
                         const struct tsr_ruler_opts *o, struct tsr_ruler_result *r);
void tsr_ruler_result_free(struct tsr_ruler_result *r);

#endif
