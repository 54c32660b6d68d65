/*
** Token sampling: see sampler.h for the chain, its order and the draw.
**
** Speed at vocab sizes of 150k-260k: one pass finds the maximum, one copies the usable
** candidates, and after that only what can matter is ranked. top-k is a quickselect of k
** followed by a sort of those k. Without top-k, the ranking is extended lazily (select the
** next best 64, 128, 256, ... and sort only those) while top-p or the draw walks it, so a
** peaked distribution costs a few hundred ranked tokens, not a sort of the vocabulary.
*/
#include "sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "error.h"

struct cand {
  float logit;
  int32_t id;
};

struct tsr_sampler {
  struct tsr_sampler_params p;
  int32_t n_vocab;
  uint64_t rng;
  struct cand *c; /* n_vocab entries of scratch */
};

/* What one pass over the row finds. */
struct row {
  float max;
  int32_t argmax, n_usable, n_posinf;
};

/* The kept set: c[0 .. n), of which c[0 .. ranked) are in rank order. */
struct kept {
  double max; /* the top logit, which every cut keeps */
  int32_t n, ranked;
  double z_t; /* sum of exp((logit - max) / T) over the kept set */
};

/* splitmix64: one 64-bit state, every seed (0 included) fine, same stream everywhere. */
static uint64_t next_u64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
static double next_unit(uint64_t *x) { return (double)(next_u64(x) >> 11) * 0x1p-53; }

static tsr_status check_params(const struct tsr_sampler_params *p) {
  if (!(p->temperature >= 0) || isinf(p->temperature))
    return tsr_error_set(TSR_ERR_INVALID_ARG,
                         "sampler: temperature = %g: must be finite and >= 0 (0 is greedy)",
                         (double)p->temperature);
  if (p->top_k < 0)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "sampler: top_k = %d: must be >= 0 (0 is off)",
                         (int)p->top_k);
  if (!(p->top_p > 0 && p->top_p <= 1))
    return tsr_error_set(TSR_ERR_INVALID_ARG,
                         "sampler: top_p = %g is outside (0, 1] (1 is off)", (double)p->top_p);
  if (!(p->min_p >= 0 && p->min_p < 1))
    return tsr_error_set(TSR_ERR_INVALID_ARG,
                         "sampler: min_p = %g is outside [0, 1) (0 is off)", (double)p->min_p);
  return TSR_OK;
}

tsr_status tsr_sampler_new(const struct tsr_sampler_params *params, int32_t n_vocab,
                           struct tsr_sampler **out) {
  if (!params || !out) return tsr_error_set(TSR_ERR_INVALID_ARG, "sampler: NULL argument");
  *out = NULL;
  tsr_status st = check_params(params);
  if (st) return st;
  if (n_vocab <= 0)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "sampler: n_vocab = %d: must be > 0",
                         (int)n_vocab);
  struct tsr_sampler *s = calloc(1, sizeof *s);
  if (s) s->c = malloc((size_t)n_vocab * sizeof *s->c);
  if (!s || !s->c) {
    free(s);
    return tsr_error_set(TSR_ERR_NOMEM, "sampler: no memory for %d candidates", (int)n_vocab);
  }
  s->p = *params;
  s->n_vocab = n_vocab;
  s->rng = params->seed;
  *out = s;
  return TSR_OK;
}

void tsr_sampler_free(struct tsr_sampler *s) {
  if (!s) return;
  free(s->c);
  free(s);
}

/* `v > max` is false for NaN, so a NaN never becomes the maximum, even at index 0. */
static tsr_status scan_row(const float *l, int32_t n, struct row *r) {
  float max = -INFINITY;
  int32_t arg = -1, usable = 0, posinf = 0;
  for (int32_t i = 0; i < n; i++) {
    float v = l[i];
    if (!(v > -INFINITY)) continue; /* NaN or -inf */
    usable++;
    posinf += v == INFINITY;
    if (v > max || arg < 0) {
      max = v;
      arg = i;
    }
  }
  if (usable == 0)
    return tsr_error_set(TSR_ERR_INVALID_ARG,
                         "sampler: all %d logits are NaN or -inf: nothing to sample", (int)n);
  *r = (struct row){.max = max, .argmax = arg, .n_usable = usable, .n_posinf = posinf};
  return TSR_OK;
}

static inline bool ranks_before(struct cand a, struct cand b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

static int cmp_rank(const void *pa, const void *pb) {
  struct cand a = *(const struct cand *)pa, b = *(const struct cand *)pb;
  return ranks_before(a, b) ? -1 : ranks_before(b, a) ? 1 : 0;
}

/* Rearranges c[0 .. n) so that c[0 .. m) hold its m best-ranked entries, in no order.
** Quickselect with pseudo-random pivots for expected linear time; no two entries rank
** equal, so which entries end up in front does not depend on the pivots. */
static void select_best(struct cand *c, int32_t n, int32_t m) {
  uint64_t x = 0x2545f4914f6cdd1dull;
  int32_t lo = 0, hi = n; /* c[0 .. lo) are among the best m, c[hi .. n) are not */
  while (lo < m && m < hi) {
    int32_t pi = lo + (int32_t)(next_u64(&x) % (uint64_t)(hi - lo));
    struct cand pv = c[pi];
    c[pi] = c[hi - 1];
    int32_t store = lo;
    for (int32_t i = lo; i < hi - 1; i++) {
      if (ranks_before(c[i], pv)) {
        struct cand t = c[i];
        c[i] = c[store];
        c[store++] = t;
      }
    }
    c[hi - 1] = c[store];
    c[store] = pv;
    if (store < m)
      lo = store + 1;
    else
      hi = store;
  }
}

/* Extends the ranked prefix: the next best entries, doubling each time, selected then sorted. */
static void rank_more(struct cand *c, struct kept *k) {
  int64_t to = k->ranked < 32 ? 64 : 2 * (int64_t)k->ranked;
  if (to > k->n) to = k->n;
  select_best(c + k->ranked, k->n - k->ranked, (int32_t)to - k->ranked);
  qsort(c + k->ranked, (size_t)(to - k->ranked), sizeof *c, cmp_rank);
  k->ranked = (int32_t)to;
}

/* Copies the usable logits into s->c in id order. With a +inf present only the +inf
** tokens are usable, each at logit 0: the limit of softmax gives them equal shares. */
static int32_t gather(struct tsr_sampler *s, const float *l, const struct row *r) {
  int32_t n = 0;
  if (r->n_posinf) {
    for (int32_t i = 0; i < s->n_vocab; i++)
      if (l[i] == INFINITY) s->c[n++] = (struct cand){0.0f, i};
  } else {
    for (int32_t i = 0; i < s->n_vocab; i++)
      if (l[i] > -INFINITY) s->c[n++] = (struct cand){l[i], i};
  }
  return n;
}

/* Applies top-k, top-p and min-p, in that order, and totals the tempered weights. */
static void keep(struct tsr_sampler *s, const float *l, const struct row *r, struct kept *k) {
  const struct tsr_sampler_params *p = &s->p;
  struct cand *c = s->c;
  *k = (struct kept){.max = r->n_posinf ? 0.0 : r->max, .n = gather(s, l, r)};

  if (p->top_k > 0 && p->top_k < k->n) {
    select_best(c, k->n, p->top_k);
    qsort(c, (size_t)p->top_k, sizeof *c, cmp_rank);
    k->n = k->ranked = p->top_k;
  }

  /* top-p renormalises over what top-k left, so its total is taken before min-p cuts */
  double z1 = 0;
  if (p->top_p < 1)
    for (int32_t i = 0; i < k->n; i++) z1 += exp((double)c[i].logit - k->max);

  if (p->min_p > 0) {
    /* min-p after top-p would give the same set: it only drops a tail of the ranking */
    double floor_ = k->max + log((double)p->min_p);
    if (k->ranked == k->n) {
      while (k->n > 1 && (double)c[k->n - 1].logit < floor_) k->n--;
      k->ranked = k->n;
    } else { /* nothing ranked yet: drop in place, keeping id order */
      int32_t m = 0;
      for (int32_t i = 0; i < k->n; i++)
        if ((double)c[i].logit >= floor_) c[m++] = c[i];
      k->n = m;
    }
  }

  if (p->top_p < 1) {
    double target = (double)p->top_p * z1, cum = 0;
    for (int32_t i = 0; i < k->n; i++) {
      if (i == k->ranked) rank_more(c, k);
      cum += exp((double)c[i].logit - k->max);
      if (cum >= target) {
        k->n = i + 1;
        break;
      }
    }
  }

  double t = p->temperature;
  k->z_t = 0;
  for (int32_t i = 0; i < k->n; i++) k->z_t += exp(((double)c[i].logit - k->max) / t);
}

tsr_status tsr_sampler_sample(struct tsr_sampler *s, const float *logits, int32_t *token) {
  if (!s || !logits || !token) return tsr_error_set(TSR_ERR_INVALID_ARG, "sampler: NULL argument");
  struct row r;
  tsr_status st = scan_row(logits, s->n_vocab, &r);
  if (st) return st;
  if (s->p.temperature == 0) {
    *token = r.argmax;
    return TSR_OK;
  }
  struct kept k;
  keep(s, logits, &r, &k);
  double t = s->p.temperature;
  double target = next_unit(&s->rng) * k.z_t, cum = 0;
  int32_t last = 0; /* the last token walked whose weight is not 0 */
  for (int32_t i = 0; i < k.n; i++) {
    if (i == k.ranked) rank_more(s->c, &k);
    double w = exp(((double)s->c[i].logit - k.max) / t);
    cum += w;
    if (cum > target) {
      *token = s->c[i].id;
      return TSR_OK;
    }
    if (w > 0) last = i;
  }
  /* Rounding left the walk's total (rank order) a hair under z_t (summed in another order
  ** when nothing cut the candidates): u was within 1e-16 of 1, so the last token that can
  ** be drawn at all. */
  *token = s->c[last].id;
  return TSR_OK;
}

tsr_status tsr_sampler_distribution(struct tsr_sampler *s, const float *logits, int32_t *ids,
                                    double *probs, int32_t *n) {
  if (!s || !logits || !ids || !probs || !n)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "sampler: NULL argument");
  struct row r;
  tsr_status st = scan_row(logits, s->n_vocab, &r);
  if (st) return st;
  if (s->p.temperature == 0) {
    ids[0] = r.argmax;
    probs[0] = 1;
    *n = 1;
    return TSR_OK;
  }
  struct kept k;
  keep(s, logits, &r, &k);
  while (k.ranked < k.n) rank_more(s->c, &k);
  double t = s->p.temperature;
  for (int32_t i = 0; i < k.n; i++) {
    ids[i] = s->c[i].id;
    probs[i] = exp(((double)s->c[i].logit - k.max) / t) / k.z_t;
  }
  *n = k.n;
  return TSR_OK;
}
