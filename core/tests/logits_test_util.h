/* Comparisons of logit rows shared by the engine tests. */
#ifndef TSR_LOGITS_TEST_UTIL_H
#define TSR_LOGITS_TEST_UTIL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/error.h"
#include "model/gguf.h"

/* max |a-b| / max |b| over one row: the parity tool's measure (NaN fails). */
static inline double tsr_test_row_rel(const float *a, const float *b, int64_t n) {
  double d = 0, scale = 0;
  for (int64_t i = 0; i < n; i++) {
    double x = fabs((double)a[i] - b[i]);
    if (!(x <= d)) d = x;
    if (fabs(b[i]) > scale) scale = fabs(b[i]);
  }
  return scale > 0 ? d / scale : d;
}

/* Index of the largest value, the first on ties. */
static inline int64_t tsr_test_argmax(const float *a, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; i++)
    if (a[i] > a[best]) best = i;
  return best;
}

/* Golden sequence 0 of a reference golden.gguf: its ids (i32, more than
** min_tokens) and logits (f32 [vocab, n]). Opens path into *gold (close it
** after use); on any problem prints what is missing and returns false. */
struct tsr_test_golden {
  const int32_t *ids;
  const float *logits;
  int32_t n, vocab;
};
static inline bool tsr_test_golden_seq0(const char *path, int32_t min_tokens,
                                        struct tsr_gguf **gold, struct tsr_test_golden *out) {
  *gold = NULL;
  if (tsr_gguf_open(path, gold) != TSR_OK) {
    fprintf(stderr, "%s\n", tsr_error_message());
    return false;
  }
  const struct tsr_gguf_tensor *ids = tsr_gguf_find_tensor(*gold, "seq.0.ids");
  const struct tsr_gguf_tensor *lg = tsr_gguf_find_tensor(*gold, "seq.0.logits");
  if (!ids || !lg || ids->dtype != TSR_I32 || lg->dtype != TSR_F32 || lg->n_dims != 2 ||
      lg->ne[1] != ids->n_elements || ids->n_elements <= min_tokens) {
    fprintf(stderr, "%s: want seq.0.ids (i32, > %d) and seq.0.logits (f32 [vocab, n])\n", path,
            min_tokens);
    return false;
  }
  *out = (struct tsr_test_golden){ids->data, lg->data, (int32_t)ids->n_elements,
                                  (int32_t)lg->ne[0]};
  return true;
}

#endif
