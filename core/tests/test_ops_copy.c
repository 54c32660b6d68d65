/* CPU cpy/cast, set_rows, concat, top_k and argmax against naive references. */
#include <string.h>

#include "common/error.h"
#include "op_test_util.h"

static const int g_threads[] = {1, 3};
#define N_THREAD_COUNTS 2

/* ---- cpy ---------------------------------------------------------------- */

/* What the reference converter makes of n f32 values in dtype dt. */
static void ref_convert(enum tsr_dtype dt, const float *v, void *out, int64_t n) {
  CHECK_OK(tsr_dtype_from_f32(dt, v, out, n));
}

/* tsr_cast of a [k,3,2] tensor: each output row must be, byte for byte, the
** reference conversion of the dequantized input row (or the input row itself
** when the dtype does not change). */
static void check_cast(enum tsr_dtype from, enum tsr_dtype to, int64_t k) {
  struct tsr_test_graph tg;
  tsr_test_graph_init(&tg, 8);
  struct tsr_tensor *a = tsr_new_tensor_3d(tg.g, from, k, 3, 2);
  struct tsr_tensor *y = tsr_cast(tg.g, a, to);
  tsr_graph_mark_output(y);
  CHECK_OK(tsr_test_graph_alloc(&tg));
  if (!y) goto out;
  tsr_test_fill_normal(a, 2.0f);
  const size_t rs = tsr_tensor_row_size(y);
  float *row = malloc((size_t)k * sizeof *row);
  char *want = malloc(rs);
  for (int ti = 0; ti < N_THREAD_COUNTS; ti++) {
    memset(y->data, 0xff, tsr_tensor_nbytes(y));
    CHECK_OK(tsr_test_graph_run(&tg, g_threads[ti]));
    for (int64_t i2 = 0; i2 < 2; i2++)
      for (int64_t i1 = 0; i1 < 3; i1++) {
        for (int64_t i = 0; i < k; i++) row[i] = (float)tsr_test_get(a, i, i1, i2, 0);
        if (from == to) /* a byte copy: requantizing is not idempotent for every type */
          memcpy(want, tsr_test_addr(a, 0, i1, i2, 0), rs);
        else
          ref_convert(to, row, want, k);
        CHECK_MSG(memcmp(tsr_test_addr(y, 0, i1, i2, 0), want, rs) == 0, "%s -> %s row %lld,%lld",
                  tsr_dtype_name(from), tsr_dtype_name(to), (long long)i1, (long long)i2);
      }
  }
  free(row), free(want);
out:
  tsr_test_graph_free(&tg);
}

static void test_cast_matches_reference_conversion(void) {
  tsr_test_seed(11);
  const enum tsr_dtype types[] = {TSR_F32, TSR_F16, TSR_BF16, TSR_Q8_0, TSR_Q4_0, TSR_Q4_K,
                                  TSR_Q6_K};
  const int nt = sizeof types / sizeof types[0];
  for (int i = 0; i < nt; i++)
    for (int j = 0; j < nt; j++) check_cast(types[i], types[j], 256);
  check_cast(TSR_F32, TSR_F16, 7); /* odd rows */
  check_cast(TSR_F16, TSR_F32, 1);
}

/* cpy from a (possibly strided) source into a destination of another shape:
** elements pair up in row-major order. */
static void check_flat_copy(enum tsr_dtype from, enum tsr_dtype to, const int64_t sne[4],
                            bool transposed, const int64_t dne[4]) {
  struct tsr_test_graph tg;
  tsr_test_graph_init(&tg, 8);
  struct tsr_tensor *a =
      transposed ? tsr_transpose(tg.g, tsr_new_tensor_4d(tg.g, from, sne[1], sne[0], sne[2], sne[3]))
                 : tsr_new_tensor(tg.g, from, 4, sne);
  struct tsr_tensor *d = tsr_new_tensor(tg.g, to, 4, dne);
  struct tsr_tensor *y = tsr_cpy(tg.g, a, d);
  tsr_graph_mark_output(y);
  CHECK_OK(tsr_test_graph_alloc(&tg));
  if (!y) goto out;
  CHECK(y->view_src == d && y->data == d->data);
  tsr_test_fill_normal(a, 1.0f);
  const int64_t n = tsr_tensor_nelements(a);
  double *src = tsr_test_read_alloc(a);
  /* the expected destination: flat source values, converted row by row */
  float *f = malloc((size_t)n * sizeof *f);
  for (int64_t i = 0; i < n; i++) f[i] = (float)src[i];
  struct tsr_tensor ref = {.dtype = to, .ne = {dne[0], dne[1], dne[2], dne[3]}};
  tsr_tensor_set_contiguous_strides(&ref);
  ref.data = malloc(tsr_tensor_nbytes(&ref));
  for (int64_t r = 0; r < tsr_tensor_nrows(&ref); r++)
    ref_convert(to, f + r * dne[0], (char *)ref.data + r * (int64_t)ref.nb[1], dne[0]);
  double *want = tsr_test_read_alloc(&ref), *got = malloc((size_t)n * sizeof *got);
  for (int ti = 0; ti < N_THREAD_COUNTS; ti++) {
    memset(d->data, 0xff, tsr_tensor_nbytes(d));
    CHECK_OK(tsr_test_graph_run(&tg, g_threads[ti]));
    tsr_test_read(y, got);
    CHECK_MSG(memcmp(got, want, (size_t)n * sizeof *got) == 0, "%s -> %s, %d threads",
              tsr_dtype_name(from), tsr_dtype_name(to), g_threads[ti]);
  }
  free(src), free(f), free(ref.data), free(want), free(got);
out:
  tsr_test_graph_free(&tg);
}

static void test_cpy_pairs_elements_in_row_major_order(void) {
  tsr_test_seed(12);
  check_flat_copy(TSR_F32, TSR_F32, (int64_t[]){6, 10, 1, 1}, true, (int64_t[]){15, 4, 1, 1});
  check_flat_copy(TSR_F32, TSR_F16, (int64_t[]){6, 10, 2, 1}, true, (int64_t[]){4, 5, 3, 2});
  check_flat_copy(TSR_F16, TSR_F32, (int64_t[]){7, 3, 2, 2}, false, (int64_t[]){2, 42, 1, 1});
  check_flat_copy(TSR_F16, TSR_F16, (int64_t[]){5, 9, 1, 1}, true, (int64_t[]){5, 9, 1, 1});
  check_flat_copy(TSR_I32, TSR_I32, (int64_t[]){3, 8, 1, 1}, true, (int64_t[]){24, 1, 1, 1});
  /* block types: same dtype moves whole blocks, a cast requantizes flat rows */
  check_flat_copy(TSR_Q8_0, TSR_Q8_0, (int64_t[]){64, 6, 1, 1}, false, (int64_t[]){96, 4, 1, 1});
  check_flat_copy(TSR_F32, TSR_Q8_0, (int64_t[]){96, 4, 1, 1}, false, (int64_t[]){64, 6, 1, 1});
  check_flat_copy(TSR_F32, TSR_Q8_0, (int64_t[]){6, 32, 1, 1}, true, (int64_t[]){32, 6, 1, 1});
  check_flat_copy(TSR_Q4_K, TSR_F16, (int64_t[]){256, 3, 1, 1}, false, (int64_t[]){128, 6, 1, 1});
}

/* tsr_cpy into a strided view of a caller-owned buffer touches only the view. */
static void test_cpy_into_view_leaves_the_rest(void) {
  tsr_test_seed(13);
  const int64_t k = 16, r = 10;
  uint16_t *cache = malloc((size_t)(k * r) * sizeof *cache);
  for (int64_t i = 0; i < k * r; i++) cache[i] = (uint16_t)(0x3c00 + i); /* f16 1.0 and up */
  uint16_t *before = malloc((size_t)(k * r) * sizeof *before);
  memcpy(before, cache, (size_t)(k * r) * sizeof *cache);
  struct tsr_test_graph tg;
  tsr_test_graph_init(&tg, 8);
  struct tsr_tensor *c = tsr_new_external(tg.g, TSR_F16, 2, (int64_t[]){k, r}, cache);
  /* elements 2..7 of rows 3..6 */
  struct tsr_tensor *v = tsr_view(tg.g, c, 2, (int64_t[]){6, 4}, (size_t[]){2, c->nb[1]},
                                  3 * c->nb[1] + 2 * 2);
  struct tsr_tensor *a = tsr_new_tensor_2d(tg.g, TSR_F32, 6, 4);
  struct tsr_tensor *y = tsr_cpy(tg.g, a, v);
  CHECK_OK(tsr_test_graph_alloc(&tg));
  if (!y) goto out;
  tsr_test_fill_normal(a, 1.0f);
  CHECK_OK(tsr_test_graph_run(&tg, 3));
  for (int64_t j = 0; j < r; j++)
    for (int64_t i = 0; i < k; i++) {
      bool inside = j >= 3 && j < 7 && i >= 2 && i < 8;
      uint16_t want = inside ? tsr_f32_to_f16((float)tsr_test_get(a, i - 2, j - 3, 0, 0))
                             : before[j * k + i];
      CHECK_MSG(cache[j * k + i] == want, "cache[%lld][%lld] = %04x, want %04x", (long long)j,
                (long long)i, cache[j * k + i], want);
    }
out:
  tsr_test_graph_free(&tg);
  free(cache), free(before);
}

/* A copy within one dtype is a byte copy: i32 beyond 2^24 and quantized blocks
** come through exactly. */
static void test_cont_within_a_dtype_is_exact(void) {
  tsr_test_seed(14);
  struct tsr_test_graph tg;
  tsr_test_graph_init(&tg, 8);
  struct tsr_tensor *ints = tsr_new_tensor_2d(tg.g, TSR_I32, 5, 7);
  struct tsr_tensor *ci = tsr_cont(tg.g, tsr_transpose(tg.g, ints));
  struct tsr_tensor *q = tsr_new_tensor_2d(tg.g, TSR_Q4_K, 256, 3);
  struct tsr_tensor *cq = tsr_cont(tg.g, q);
  tsr_graph_mark_output(ci);
  tsr_graph_mark_output(cq);
  CHECK_OK(tsr_test_graph_alloc(&tg));
  if (!cq) goto out;
  for (int64_t j = 0; j < 7; j++)
    for (int64_t i = 0; i < 5; i++) tsr_test_set(ints, i, j, 0, 0, (1 << 30) + 17 * (int)(i + 5 * j));
  tsr_test_fill_normal(q, 1.0f);
  CHECK_OK(tsr_test_graph_run(&tg, 2));
  for (int64_t j = 0; j < 7; j++)
    for (int64_t i = 0; i < 5; i++)
      CHECK(tsr_test_get(ci, j, i, 0, 0) == (double)((1 << 30) + 17 * (int)(i + 5 * j)));
  CHECK(memcmp(cq->data, q->data, tsr_tensor_nbytes(q)) == 0);
out:
  tsr_test_graph_free(&tg);
}

/* f32 -> t -> f32 keeps values within t's precision; f16 -> f32 -> f16 is exact. */
static void test_cast_round_trips(void) {
  tsr_test_seed(15);
  const enum tsr_dtype types[] = {TSR_F16, TSR_BF16, TSR_Q8_0, TSR_Q4_K};
  const double bound[] = {1.0 / 2048, 1.0 / 256, .006 * 1.5, .07 * 1.5}; /* relative */
  for (int t = 0; t < 4; t++) {
    struct tsr_test_graph tg;
    tsr_test_graph_init(&tg, 8);
    struct tsr_tensor *a = tsr_new_tensor_2d(tg.g, TSR_F32, 512, 8);
    struct tsr_tensor *back = tsr_cast(tg.g, tsr_cast(tg.g, a, types[t]), TSR_F32);
    struct tsr_tensor *again = tsr_cast(tg.g, tsr_cast(tg.g, back, types[t]), TSR_F32);
    tsr_graph_mark_output(back);
    tsr_graph_mark_output(again);
    CHECK_OK(tsr_test_graph_alloc(&tg));
    if (!again) {
      tsr_test_graph_free(&tg);
      continue;
    }
    tsr_test_fill_normal(a, 1.0f);
    CHECK_OK(tsr_test_graph_run(&tg, 2));
    double err = 0, ref = 0, worst = 0;
    for (int64_t j = 0; j < 8; j++)
      for (int64_t i = 0; i < 512; i++) {
        double x = tsr_test_get(a, i, j, 0, 0), y = tsr_test_get(back, i, j, 0, 0);
        err += (x - y) * (x - y), ref += x * x;
        if (types[t] == TSR_F16 || types[t] == TSR_BF16)
          worst = fmax(worst, fabs(x - y) / fmax(fabs(x), 1e-4)); /* f16 subnormals */
      }
    double rel = types[t] == TSR_F16 || types[t] == TSR_BF16 ? worst : sqrt(err / ref);
    CHECK_MSG(rel <= bound[t], "%s round trip: relative error %g > %g", tsr_dtype_name(types[t]),
              rel, bound[t]);
    if (types[t] == TSR_F16 || types[t] == TSR_BF16) /* a second trip changes nothing */
      CHECK(memcmp(back->data, again->data, tsr_tensor_nbytes(back)) == 0);
    tsr_test_graph_free(&tg);
  }
}

static void test_cpy_check_rejects_types_without_converters(void) {
  static char zeros[4096];
  struct tsr_backend *be = NULL;
  CHECK_OK(tsr_backend_cpu_new(1, &be));
  if (!be) return;
  struct tsr_graph *g = tsr_graph_new(8);
  struct tsr_tensor *a = tsr_new_tensor_2d(g, TSR_F32, 256, 2);
  tsr_tensor_set_name(a, "acts");
  struct tsr_tensor *y = tsr_cast(g, a, TSR_IQ2_XXS);
  CHECK(y != NULL);
  CHECK(tsr_backend_check_graph(be, g) == TSR_ERR_UNSUPPORTED);
  CHECK_MSG(strstr(tsr_error_message(), "iq2_xxs"), "%s", tsr_error_message());
  tsr_graph_free(g);

  g = tsr_graph_new(8);
  a = tsr_new_external(g, TSR_IQ3_S, 2, (int64_t[]){256, 2}, zeros);
  tsr_tensor_set_name(a, "blk.3.attn_q");
  CHECK(tsr_cast(g, a, TSR_F32) != NULL);
  CHECK(tsr_backend_check_graph(be, g) == TSR_ERR_UNSUPPORTED);
  CHECK_MSG(strstr(tsr_error_message(), "iq3_s") && strstr(tsr_error_message(), "blk.3.attn_q"),
            "%s", tsr_error_message());
  tsr_graph_free(g);

  /* a same-dtype copy of a type we cannot compute with is still a byte copy */
  g = tsr_graph_new(8);
  a = tsr_new_external(g, TSR_IQ3_S, 2, (int64_t[]){256, 2}, zeros);
  CHECK(tsr_cont(g, a) != NULL);
  CHECK_OK(tsr_backend_check_graph(be, g));
  tsr_graph_free(g);
  tsr_backend_free(be);
}

/* ---- set_rows ------------------------------------------------------------- */

struct sr_case {
  enum tsr_dtype dt;
  int64_t k, r, n, h;
  bool per_batch;  /* idx [N,H] instead of [N] */
  bool src_layout; /* src a transposed view (strided dim 0) */
};

static void check_set_rows(struct sr_case cs) {
  const size_t rs = tsr_dtype_row_size(cs.dt, cs.k);
  const size_t bytes = rs * (size_t)(cs.r * cs.h);
  char *cache = malloc(bytes), *init = malloc(bytes), *want = malloc(bytes);
  for (size_t i = 0; i < bytes; i++) init[i] = (char)(tsr_test_next() & 0x3f); /* finite halves */
  struct tsr_test_graph tg;
  tsr_test_graph_init(&tg, 8);
  struct tsr_tensor *c = tsr_new_external(tg.g, cs.dt, 3, (int64_t[]){cs.k, cs.r, cs.h}, cache);
  struct tsr_tensor *src = cs.src_layout
      ? tsr_permute(tg.g, tsr_new_tensor_3d(tg.g, TSR_F32, cs.n, cs.h, cs.k), 1, 2, 0, 3)
      : tsr_new_tensor_3d(tg.g, TSR_F32, cs.k, cs.n, cs.h);
  struct tsr_tensor *idx = tsr_new_tensor_2d(tg.g, TSR_I32, cs.n, cs.per_batch ? cs.h : 1);
  struct tsr_tensor *y = tsr_set_rows(tg.g, c, src, idx);
  CHECK_OK(tsr_test_graph_alloc(&tg));
  if (!y) goto out;
  CHECK(y->view_src == c);
  tsr_test_fill_normal(src, 1.0f);
  for (int64_t b = 0; b < idx->ne[1]; b++)
    for (int64_t i = 0; i < cs.n; i++)
      tsr_test_set(idx, i, b, 0, 0, (double)(tsr_test_next() % (uint64_t)cs.r));
  if (cs.n >= 4) { /* a repeat (the later one must win) and two bad indices */
    tsr_test_set(idx, cs.n - 1, 0, 0, 0, tsr_test_get(idx, 0, 0, 0, 0));
    tsr_test_set(idx, 1, 0, 0, 0, (double)cs.r);
    tsr_test_set(idx, 2, 0, 0, 0, -1);
  }
  /* the reference: rows written in index order by the reference converter */
  memcpy(want, init, bytes);
  float *row = malloc((size_t)cs.k * sizeof *row);
  for (int64_t b = 0; b < cs.h; b++)
    for (int64_t i = 0; i < cs.n; i++) {
      int64_t r = (int64_t)tsr_test_get(idx, i, cs.per_batch ? b : 0, 0, 0);
      if (r < 0 || r >= cs.r) continue;
      for (int64_t j = 0; j < cs.k; j++) row[j] = (float)tsr_test_get(src, j, i, b, 0);
      ref_convert(cs.dt, row, want + (size_t)(b * cs.r + r) * rs, cs.k);
    }
  for (int ti = 0; ti < N_THREAD_COUNTS; ti++) {
    memcpy(cache, init, bytes);
    CHECK_OK(tsr_test_graph_run(&tg, g_threads[ti]));
    CHECK_MSG(memcmp(cache, want, bytes) == 0, "%s k=%lld n=%lld h=%lld, %d threads",
              tsr_dtype_name(cs.dt), (long long)cs.k, (long long)cs.n, (long long)cs.h,
              g_threads[ti]);
  }
  free(row);
out:
  tsr_test_graph_free(&tg);
  free(cache), free(init), free(want);
}

static void test_set_rows_writes_reference_rows(void) {
  tsr_test_seed(16);
  const struct sr_case cases[] = {
      {TSR_F32, 8, 10, 5, 3, false, false},
      {TSR_F16, 64, 12, 6, 4, false, false},
      {TSR_F16, 64, 12, 1, 4, false, false}, /* decode: one row per head */
      {TSR_F16, 24, 9, 5, 3, true, true},
      {TSR_BF16, 16, 7, 4, 2, true, false},
      {TSR_Q8_0, 128, 11, 7, 2, false, true},
      {TSR_Q4_0, 64, 6, 4, 3, true, false},
      {TSR_Q4_K, 256, 5, 4, 1, false, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_set_rows(cases[i]);
}

static void test_set_rows_check_rejects_unquantizable_target(void) {
  static char zeros[4096];
  struct tsr_graph *g = tsr_graph_new(8);
  struct tsr_tensor *c = tsr_new_external(g, TSR_IQ4_NL, 2, (int64_t[]){64, 8}, zeros);
  tsr_tensor_set_name(c, "cache_k_l0");
  struct tsr_tensor *src = tsr_new_tensor_2d(g, TSR_F32, 64, 2);
  struct tsr_tensor *idx = tsr_new_tensor_1d(g, TSR_I32, 2);
  CHECK(tsr_set_rows(g, c, src, idx) != NULL);
  struct tsr_backend *be = NULL;
  CHECK_OK(tsr_backend_cpu_new(1, &be));
  if (be) {
    CHECK(tsr_backend_check_graph(be, g) == TSR_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(tsr_error_message(), "iq4_nl") && strstr(tsr_error_message(), "cache_k_l0"),
              "%s", tsr_error_message());
  }
  tsr_backend_free(be);
  tsr_graph_free(g);
}

/* ---- concat --------------------------------------------------------------- */

static void check_concat(enum tsr_dtype dt, int dim, bool permuted_b) {
  int64_t ane[4] = {3, 4, 2, 2}, bne[4] = {3, 4, 2, 2};
  bne[dim] = 5;
  struct tsr_test_graph tg;
  tsr_test_graph_init(&tg, 8);
  struct tsr_tensor *a = tsr_new_tensor(tg.g, dt, 4, ane);
  struct tsr_tensor *b =
      permuted_b ? tsr_permute(tg.g, tsr_new_tensor_4d(tg.g, dt, bne[3], bne[1], bne[0], bne[2]),
                               3, 1, 0, 2)
                 : tsr_new_tensor(tg.g, dt, 4, bne);
  struct tsr_tensor *y = tsr_concat(tg.g, a, b, dim);
  tsr_graph_mark_output(y);
  CHECK_OK(tsr_test_graph_alloc(&tg));
  if (!y) goto out;
  CHECK(y->ne[dim] == ane[dim] + bne[dim]);
  tsr_test_fill_uniform(a, -100, 100);
  tsr_test_fill_uniform(b, -100, 100);
  for (int ti = 0; ti < N_THREAD_COUNTS; ti++) {
    memset(y->data, 0xff, tsr_tensor_nbytes(y));
    CHECK_OK(tsr_test_graph_run(&tg, g_threads[ti]));
    int bad = 0;
    for (int64_t i3 = 0; i3 < y->ne[3]; i3++)
      for (int64_t i2 = 0; i2 < y->ne[2]; i2++)
        for (int64_t i1 = 0; i1 < y->ne[1]; i1++)
          for (int64_t i0 = 0; i0 < y->ne[0]; i0++) {
            int64_t i[4] = {i0, i1, i2, i3};
            const struct tsr_tensor *s = a;
            if (i[dim] >= ane[dim]) s = b, i[dim] -= ane[dim];
            double want = tsr_test_get(s, i[0], i[1], i[2], i[3]);
            double got = tsr_test_get(y, i0, i1, i2, i3);
            if (got != want && bad++ < 3)
              CHECK_MSG(0, "%s dim %d at %lld,%lld,%lld,%lld: %g, want %g", tsr_dtype_name(dt), dim,
                        (long long)i0, (long long)i1, (long long)i2, (long long)i3, got, want);
          }
  }
out:
  tsr_test_graph_free(&tg);
}

static void test_concat_matches_reference_along_every_dim(void) {
  tsr_test_seed(17);
  for (int dim = 0; dim < 4; dim++) {
    check_concat(TSR_F32, dim, false);
    check_concat(TSR_F32, dim, true);
    check_concat(TSR_F16, dim, true);
    check_concat(TSR_I32, dim, false);
  }
}

/* ---- top_k and argmax ------------------------------------------------------ */

/* a ranks above b: larger first, NaN below every number, lower index on ties */
static bool ref_above(double va, int64_t ia, double vb, int64_t ib) {
  if (isnan(va) != isnan(vb)) return isnan(vb);
  if (!isnan(va) && va != vb) return va > vb;
  return ia < ib;
}

/* Rows of a [n, rows] tensor (transposed view when asked) with many ties and
** some NaNs; top_k must list the reference order, argmax its head. */
static void check_top_k(int64_t n, int64_t rows, int k, bool transposed, bool ties) {
  struct tsr_test_graph tg;
  tsr_test_graph_init(&tg, 8);
  struct tsr_tensor *a = transposed ? tsr_transpose(tg.g, tsr_new_tensor_2d(tg.g, TSR_F32, rows, n))
                                    : tsr_new_tensor_2d(tg.g, TSR_F32, n, rows);
  struct tsr_tensor *top = tsr_top_k(tg.g, a, k);
  struct tsr_tensor *am = tsr_argmax(tg.g, a);
  tsr_graph_mark_output(top);
  tsr_graph_mark_output(am);
  CHECK_OK(tsr_test_graph_alloc(&tg));
  if (!am) goto out;
  for (int64_t j = 0; j < rows; j++)
    for (int64_t i = 0; i < n; i++) {
      double v = ties ? (double)(tsr_test_next() % 5) : tsr_test_normal();
      if (j % 3 == 1 && tsr_test_next() % 4 == 0) v = NAN;
      if (j == rows - 1 && rows > 2) v = NAN; /* one row all NaN */
      tsr_test_set(a, i, j, 0, 0, v);
    }
  int64_t *order = malloc((size_t)n * sizeof *order);
  for (int ti = 0; ti < N_THREAD_COUNTS; ti++) {
    CHECK_OK(tsr_test_graph_run(&tg, g_threads[ti]));
    int bad = 0;
    for (int64_t j = 0; j < rows; j++) {
      for (int64_t i = 0; i < n; i++) { /* insertion sort by rank */
        int64_t at = i;
        while (at > 0 && ref_above(tsr_test_get(a, i, j, 0, 0), i,
                                   tsr_test_get(a, order[at - 1], j, 0, 0), order[at - 1])) {
          order[at] = order[at - 1];
          at--;
        }
        order[at] = i;
      }
      for (int i = 0; i < k; i++)
        if (tsr_test_get(top, i, j, 0, 0) != (double)order[i] && bad++ < 3)
          CHECK_MSG(0, "n=%lld k=%d row %lld: top[%d] = %g, want %lld", (long long)n, k,
                    (long long)j, i, tsr_test_get(top, i, j, 0, 0), (long long)order[i]);
      if (tsr_test_get(am, j, 0, 0, 0) != (double)order[0] && bad++ < 3)
        CHECK_MSG(0, "argmax row %lld = %g, want %lld", (long long)j, tsr_test_get(am, j, 0, 0, 0),
                  (long long)order[0]);
    }
  }
  free(order);
out:
  tsr_test_graph_free(&tg);
}

static void test_top_k_and_argmax_rank_like_the_reference(void) {
  tsr_test_seed(18);
  check_top_k(9, 7, 1, false, true);
  check_top_k(9, 7, 4, true, true);
  check_top_k(9, 7, 9, false, true);
  check_top_k(33, 5, 8, true, false);
  check_top_k(1, 3, 1, false, false);
  check_top_k(700, 4, 40, false, false);
}

static void test_argmax_picks_first_max_and_skips_nan(void) {
  struct tsr_test_graph tg;
  tsr_test_graph_init(&tg, 8);
  struct tsr_tensor *a = tsr_new_tensor_2d(tg.g, TSR_F32, 5, 4);
  struct tsr_tensor *am = tsr_argmax(tg.g, a);
  tsr_graph_mark_output(am);
  CHECK_OK(tsr_test_graph_alloc(&tg));
  if (!am) goto out;
  const float rows[4][5] = {
      {1, 3, 2, 3, 0},                          /* tie: the first 3 */
      {NAN, -1, NAN, -2, -1},                   /* NaN never wins */
      {-INFINITY, -INFINITY, -INFINITY, -5, 0}, /* ordinary */
      {NAN, NAN, NAN, NAN, NAN},                /* all NaN: 0 */
  };
  tsr_test_fill_from(a, &rows[0][0]);
  CHECK_OK(tsr_test_graph_run(&tg, 2));
  const int want[4] = {1, 1, 4, 0};
  for (int j = 0; j < 4; j++) CHECK(tsr_test_get(am, j, 0, 0, 0) == want[j]);
out:
  tsr_test_graph_free(&tg);
}

static void test_builders_reject_mismatched_shapes(void) {
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *a = tsr_new_tensor_2d(g, TSR_F32, 4, 3);
  struct tsr_tensor *b = tsr_new_tensor_2d(g, TSR_F32, 4, 5);
  CHECK(tsr_concat(g, a, b, 0) == NULL);
  CHECK(tsr_graph_status(g) == TSR_ERR_INVALID_ARG);
  CHECK_MSG(strstr(tsr_error_message(), "concat"), "%s", tsr_error_message());
  tsr_graph_free(g);

  g = tsr_graph_new(16);
  a = tsr_new_tensor_2d(g, TSR_F32, 4, 3);
  b = tsr_new_tensor_2d(g, TSR_F16, 4, 4);
  CHECK(tsr_cpy(g, a, b) == NULL);
  CHECK_MSG(strstr(tsr_error_message(), "cpy"), "%s", tsr_error_message());
  tsr_graph_free(g);

  g = tsr_graph_new(16);
  struct tsr_tensor *c = tsr_new_tensor_3d(g, TSR_F16, 64, 10, 2);
  struct tsr_tensor *src = tsr_new_tensor_3d(g, TSR_F32, 32, 3, 2); /* rows too short */
  struct tsr_tensor *idx = tsr_new_tensor_1d(g, TSR_I32, 3);
  CHECK(tsr_set_rows(g, c, src, idx) == NULL);
  CHECK_MSG(strstr(tsr_error_message(), "set_rows"), "%s", tsr_error_message());
  tsr_graph_free(g);

  g = tsr_graph_new(16);
  a = tsr_new_tensor_2d(g, TSR_F32, 4, 3);
  CHECK(tsr_top_k(g, a, 5) == NULL);
  CHECK_MSG(strstr(tsr_error_message(), "top_k"), "%s", tsr_error_message());
  tsr_graph_free(g);
}

int main(void) {
  TSR_RUN(test_cast_matches_reference_conversion);
  TSR_RUN(test_cpy_pairs_elements_in_row_major_order);
  TSR_RUN(test_cpy_into_view_leaves_the_rest);
  TSR_RUN(test_cont_within_a_dtype_is_exact);
  TSR_RUN(test_cast_round_trips);
  TSR_RUN(test_cpy_check_rejects_types_without_converters);
  TSR_RUN(test_set_rows_writes_reference_rows);
  TSR_RUN(test_set_rows_check_rejects_unquantizable_target);
  TSR_RUN(test_concat_matches_reference_along_every_dim);
  TSR_RUN(test_top_k_and_argmax_rank_like_the_reference);
  TSR_RUN(test_argmax_picks_first_max_and_skips_nan);
  TSR_RUN(test_builders_reject_mismatched_shapes);
  return TSR_TEST_EXIT();
}
