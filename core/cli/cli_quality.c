#include "cli_quality.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/file.h"
#include "quality/logprobs.h"
#include "graph/op_times.h"

/* NULL with the error set when the file cannot be read */
static char *slurp(const char *path, size_t *len) {
  FILE *f;
  if (tsr_file_fopen(path, &f) != TSR_OK) return NULL;
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    n += fread(buf + n, 1, cap - 1 - n, f);
    if (n < cap - 1) break;
    char *grown = realloc(buf, cap * 2);
    if (!grown) free(buf);
    buf = grown;
    cap *= 2;
  }
  int bad = ferror(f);
  fclose(f);
  if (!buf || bad) {
    free(buf);
    errno = bad ? EIO : ENOMEM;
    return NULL;
  }
  buf[n] = 0;
  *len = n;
  return buf;
}

tsr_status tsr_qtext_load(const char *path, const struct tsr_tokenizer *tok, bool prompt,
                          struct tsr_qtext *t) {
  memset(t, 0, sizeof *t);
  tsr_error_clear();
  if (!(t->bytes = slurp(path, &t->len))) {
    if (tsr_error_message()[0]) return TSR_ERR_IO;
    return tsr_error_set(TSR_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
  }
  t->hash = tsr_fnv1a64(TSR_FNV1A64_INIT, t->bytes, t->len);
  /* text: special-token names in it stay text; a prompt: they are tokens, its BOS added */
  tsr_status st = tsr_tokenizer_encode(tok, t->bytes, t->len, prompt, prompt, &t->ids, &t->n_ids);
  if (st != TSR_OK) tsr_error_prefix("%s", path);
  return st;
}

void tsr_qtext_free(struct tsr_qtext *t) {
  free(t->bytes);
  free(t->ids);
  memset(t, 0, sizeof *t);
}

uint64_t tsr_vocab_hash(const struct tsr_tokenizer *tok) {
  uint64_t h = TSR_FNV1A64_INIT;
  int32_t n = tsr_tokenizer_n_vocab(tok);
  h = tsr_fnv1a64(h, &n, sizeof n);
  for (int32_t i = 0; i < n; i++) {
    const char *s = tsr_tokenizer_token_text(tok, i);
    int32_t type = (int32_t)tsr_tokenizer_token_type(tok, i);
    h = tsr_fnv1a64(h, s ? s : "", s ? strlen(s) + 1 : 1);
    h = tsr_fnv1a64(h, &type, sizeof type);
  }
  return h;
}

tsr_status tsr_qtext_eval_window(struct tsr_engine *e, const struct tsr_tokenizer *tok,
                                 const struct tsr_qtext *t, int32_t ctx, int64_t w,
                                 int32_t decode_from, int32_t *window, float *logits) {
  memcpy(window, t->ids + (size_t)w * (size_t)ctx, (size_t)ctx * sizeof *window);
  if (tsr_tokenizer_adds_bos(tok) && tsr_tokenizer_bos(tok) >= 0) window[0] = tsr_tokenizer_bos(tok);
  const int32_t split = decode_from < 1 ? 1 : decode_from < ctx ? decode_from : ctx;
  const size_t row = (size_t)tsr_engine_n_vocab(e);
  tsr_status st = tsr_engine_seq_rm(e, 0, 0, -1);
  if (st == TSR_OK) st = tsr_engine_eval(e, 0, window, split, NULL, logits);
  for (int32_t j = split; j < ctx && st == TSR_OK; j++)
    st = tsr_engine_eval(e, 0, window + j, 1, NULL, logits + (size_t)j * row);
  if (st != TSR_OK) tsr_error_prefix("window %lld", (long long)w + 1);
  return st;
}

double tsr_mean_of(const struct tsr_mean_acc *a) { return a->n ? a->sum / (double)a->n : 0; }

double tsr_mean_stderr(const struct tsr_mean_acc *a) {
  if (a->n < 2) return 0;
  double m = a->sum / (double)a->n, var = a->sum2 / (double)a->n - m * m;
  return var > 0 ? sqrt(var / (double)(a->n - 1)) : 0;
}

double tsr_now_s(void) { return tsr_op_times_now(); }

tsr_status tsr_logit_cmp_init(struct tsr_logit_cmp *c, int32_t n_vocab, int64_t k) {
  memset(c, 0, sizeof *c);
  c->n_vocab = n_vocab;
  c->k = k < n_vocab ? k : n_vocab;
  c->lp_r = malloc((size_t)n_vocab * sizeof *c->lp_r);
  c->lp_c = malloc((size_t)n_vocab * sizeof *c->lp_c);
  c->top_r = malloc((size_t)c->k * sizeof *c->top_r);
  c->top_c = malloc((size_t)c->k * sizeof *c->top_c);
  if (c->lp_r && c->lp_c && c->top_r && c->top_c) return TSR_OK;
  tsr_logit_cmp_free(c);
  return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
}

void tsr_logit_cmp_add(struct tsr_logit_cmp *c, const float *ref, const float *cand) {
  const int32_t V = c->n_vocab;
  tsr_log_softmax(ref, V, c->lp_r);
  tsr_log_softmax(cand, V, c->lp_c);
  tsr_logits_top_k(ref, V, c->k, c->top_r);
  tsr_logits_top_k(cand, V, c->k, c->top_c);
  const double d = tsr_top_k_tv(c->lp_r, c->top_r, c->lp_c, c->top_c, c->k);
  tsr_mean_add(&c->tv, d);
  if (d > c->max_tv) c->max_tv = d;
  tsr_mean_add(&c->differ, c->top_r[0] != c->top_c[0]);
  tsr_mean_add(&c->agree, !memcmp(c->top_r, c->top_c, (size_t)c->k * sizeof *c->top_r));
  tsr_mean_add(&c->kl, tsr_kl(c->lp_r, c->lp_c, V));
}

void tsr_logit_cmp_free(struct tsr_logit_cmp *c) {
  free(c->lp_r), free(c->lp_c), free(c->top_r), free(c->top_c);
  c->lp_r = c->lp_c = NULL;
  c->top_r = c->top_c = NULL;
}
