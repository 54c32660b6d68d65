/* CPU get_rows, mat_mul and mat_mul_id against naive double-precision references. */
#include <string.h>

#include "common/error.h"
#include "cpu/vec.h"
#include "op_test_util.h"

static const int g_threads[] = {1, 3};
#define N_THREAD_COUNTS 2

/* ---- references ------------------------------------------------------------ */

/* out[m,n,i2,i3] = sum_k w[k,m,i2/r2,i3/r3] x[k,n,i2,i3], from dense double copies
** (w: K*M*W2*W3, x: K*N*X2*X3, both row-major); also the product of norms per
** output, which scales the rounding error a correct f32 dot can make. */
static void ref_mat_mul(const double *w, const double *x, const int64_t wne[4],
                        const int64_t xne[4], double *out, double *scale) {
  const int64_t k = wne[0], m = wne[1], n = xne[1];
  const int64_t r2 = xne[2] / wne[2], r3 = xne[3] / wne[3];
  for (int64_t i3 = 0; i3 < xne[3]; i3++)
    for (int64_t i2 = 0; i2 < xne[2]; i2++)
      for (int64_t in = 0; in < n; in++)
        for (int64_t im = 0; im < m; im++) {
          const double *wr = w + (((i3 / r3) * wne[2] + i2 / r2) * m + im) * k;
          const double *xc = x + ((i3 * xne[2] + i2) * n + in) * k;
          double s = 0, ww = 0, xx = 0;
          for (int64_t i = 0; i < k; i++) s += wr[i] * xc[i], ww += wr[i] * wr[i], xx += xc[i] * xc[i];
          int64_t o = ((i3 * xne[2] + i2) * n + in) * m + im;
          out[o] = s;
          if (scale) scale[o] = sqrt(ww * xx);
        }
}

static double rms(const double *a, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += a[i] * a[i];
  return sqrt(s / (double)n);
}

/* ---- mat_mul --------------------------------------------------------------- */

struct mm_shape {
  int64_t k, m, n, x2, x3, w2, w3;
};

enum x_layout {
  X_DENSE,
  X_TRANSPOSED, /* [N,K] transposed: nb0 is a row stride, so columns are gathered */
  X_PADDED,     /* rows of K inside rows of K+5 */
  X_PERMUTED,   /* [K,X2,N,X3] with dims 1 and 2 swapped */
};

static struct tsr_tensor *make_x(struct tsr_graph *g, const int64_t ne[4], enum x_layout lay) {
  switch (lay) {
  case X_DENSE: return tsr_new_tensor_4d(g, TSR_F32, ne[0], ne[1], ne[2], ne[3]);
  case X_TRANSPOSED:
    return tsr_transpose(g, tsr_new_tensor_4d(g, TSR_F32, ne[1], ne[0], ne[2], ne[3]));
  case X_PADDED: {
    struct tsr_tensor *big = tsr_new_tensor_4d(g, TSR_F32, ne[0] + 5, ne[1], ne[2], ne[3]);
    if (!big) return NULL;
    size_t nb[4] = {4, big->nb[1], big->nb[2], big->nb[3]};
    return tsr_view(g, big, 4, ne, nb, 0);
  }
  case X_PERMUTED:
    return tsr_permute(g, tsr_new_tensor_4d(g, TSR_F32, ne[0], ne[2], ne[1], ne[3]), 0, 2, 1, 3);
  }
  return NULL;
}

/* Relative RMS error of dot products with N(0,1) weights against the
** unquantized weights: the type's round-trip error (core/graph/quant.c), times 1.6
** because a few dozen dot products estimate it only to some 30%. */
static double type_error_bound(enum tsr_dtype t) {
  switch (t) {
  case TSR_F32: return 1e-6;
  case TSR_F16: return 1e-3;
  case TSR_BF16: return 6e-3;
  case TSR_Q8_0: return .006 * 1.6;
  case TSR_Q8_K: return .008 * 1.6;
  case TSR_Q6_K: return .015 * 1.6;
  case TSR_Q5_0: return .045 * 1.6;
  case TSR_Q5_1: return .04 * 1.6;
  case TSR_Q5_K: return .035 * 1.6;
  case TSR_Q4_0: return .09 * 1.6;
  case TSR_Q4_1: return .08 * 1.6;
  case TSR_Q4_K: return .07 * 1.6;
  case TSR_Q3_K: return .16 * 1.6;
  case TSR_Q2_K: return .32 * 1.6;
  default: return 0;
  }
}

/* Runs one mat_mul with 1 and 3 threads and checks it against the reference on
** the dequantized weights (tight) and on the original f32 weights (the type's
** error). */
static void check_mat_mul(enum tsr_dtype wt, struct mm_shape s, enum x_layout lay) {
  const int64_t wne[4] = {s.k, s.m, s.w2, s.w3}, xne[4] = {s.k, s.n, s.x2, s.x3};
  struct tsr_test_graph tg;
  tsr_test_graph_init(&tg, 16);
  struct tsr_tensor *w = tsr_new_tensor(tg.g, wt, 4, wne);
  struct tsr_tensor *x = make_x(tg.g, xne, lay);
  struct tsr_tensor *y = tsr_mat_mul(tg.g, w, x);
  tsr_graph_mark_output(y);
  CHECK_OK(tsr_test_graph_alloc(&tg));
  if (!y || !tg.arena) {
    tsr_test_graph_free(&tg);
    return;
  }
  const int64_t nw = tsr_tensor_nelements(w);
  const int64_t ny = tsr_tensor_nelements(y);
  float *wf = malloc((size_t)nw * sizeof *wf);
  for (int64_t i = 0; i < nw; i++) wf[i] = tsr_test_normal();
  tsr_test_fill_from(w, wf);
  tsr_test_fill_normal(x, 1.0f);

  double *wd = tsr_test_read_alloc(w), *xd = tsr_test_read_alloc(x);
  double *worig = malloc((size_t)nw * sizeof *worig);
  for (int64_t i = 0; i < nw; i++) worig[i] = wf[i];
  double *ref = malloc((size_t)ny * sizeof *ref), *scale = malloc((size_t)ny * sizeof *scale);
  double *ref_orig = malloc((size_t)ny * sizeof *ref_orig);
  double *got = malloc((size_t)ny * sizeof *got), *first = malloc((size_t)ny * sizeof *first);
  ref_mat_mul(wd, xd, wne, xne, ref, scale);
  ref_mat_mul(worig, xd, wne, xne, ref_orig, NULL);

  for (int ti = 0; ti < N_THREAD_COUNTS; ti++) {
    memset(y->data, 0xff, tsr_tensor_nbytes(y));
    CHECK_OK(tsr_test_graph_run(&tg, g_threads[ti]));
    tsr_test_read(y, got);
    int bad = 0;
    for (int64_t i = 0; i < ny && bad < 3; i++) {
      if (!(fabs(got[i] - ref[i]) <= 1e-5 * scale[i] + 1e-6)) {
        bad++;
        CHECK_MSG(0, "%s k=%lld m=%lld n=%lld layout %d, %d threads: out[%lld] = %.7g, ref %.7g",
                  tsr_dtype_name(wt), (long long)s.k, (long long)s.m, (long long)s.n, (int)lay,
                  g_threads[ti], (long long)i, got[i], ref[i]);
      }
    }
    if (ti == 0) memcpy(first, got, (size_t)ny * sizeof *got);
    else CHECK_MSG(memcmp(first, got, (size_t)ny * sizeof *got) == 0,
                   "%s: results differ between thread counts", tsr_dtype_name(wt));
  }
  /* against the unquantized weights: the error the type is known to make */
  double *diff = malloc((size_t)ny * sizeof *diff);
  for (int64_t i = 0; i < ny; i++) diff[i] = got[i] - ref_orig[i];
  double rel = rms(diff, ny) / rms(ref_orig, ny);
  CHECK_MSG(rel <= type_error_bound(wt), "%s: relative rms error %.4g vs f32 weights, bound %.4g",
            tsr_dtype_name(wt), rel, type_error_bound(wt));

  free(diff), free(wf), free(wd), free(xd), free(worig), free(ref), free(scale);
  free(ref_orig), free(got), free(first);
  tsr_test_graph_free(&tg);
}

static const struct mm_shape g_plain_shapes[] = {
    {64, 33, 1, 1, 1, 1, 1},   /* decode */
    {96, 17, 5, 1, 1, 1, 1},
    {40, 7, 3, 6, 2, 3, 1},    /* broadcast over dim 2 (6 / 3) and dim 3 (2 / 1) */
    {32, 70, 9, 2, 3, 1, 3},   /* one weight matrix per dim 3, shared over dim 2 */
    {300, 130, 2, 1, 1, 1, 1}, /* odd K, a partial last tile */
    {2048, 20, 3, 1, 1, 1, 1}, /* long rows: small tiles, swept in several k blocks */
    {1100, 9, 4, 1, 1, 1, 1},  /* k blocks with a ragged end */
    {5, 3, 37, 1, 1, 1, 1},    /* one tile: columns are chunked over threads */
};

static void test_mat_mul_plain_weights_match_reference(void) {
  tsr_test_seed(1);
  const enum tsr_dtype types[] = {TSR_F32, TSR_F16, TSR_BF16};
  for (size_t t = 0; t < 3; t++)
    for (size_t i = 0; i < sizeof g_plain_shapes / sizeof g_plain_shapes[0]; i++)
      check_mat_mul(types[t], g_plain_shapes[i], X_DENSE);
}

static void test_mat_mul_strided_inputs_match_reference(void) {
  tsr_test_seed(2);
  const enum x_layout lays[] = {X_TRANSPOSED, X_PADDED, X_PERMUTED};
  const struct mm_shape shapes[] = {
      {48, 13, 7, 3, 2, 1, 2}, {33, 9, 1, 4, 1, 2, 1}, {1030, 6, 3, 1, 1, 1, 1}};
  for (int l = 0; l < 3; l++)
    for (int i = 0; i < 3; i++) {
      check_mat_mul(TSR_F32, shapes[i], lays[l]);
      check_mat_mul(TSR_F16, shapes[i], lays[l]);
    }
  check_mat_mul(TSR_Q4_K, (struct mm_shape){256, 11, 6, 2, 1, 1, 1}, X_TRANSPOSED);
  check_mat_mul(TSR_Q8_0, (struct mm_shape){64, 11, 6, 2, 2, 2, 1}, X_PERMUTED);
}

static void test_mat_mul_block_weights_match_dequantized_reference(void) {
  tsr_test_seed(3);
  const enum tsr_dtype types[] = {TSR_Q4_0, TSR_Q4_1, TSR_Q5_0, TSR_Q5_1, TSR_Q8_0, TSR_Q2_K,
                                  TSR_Q3_K, TSR_Q4_K, TSR_Q5_K, TSR_Q6_K, TSR_Q8_K};
  /* one or two columns take the register kernels where a type has one (vec_quant.c);
  ** more, the dequantized tiles */
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
    check_mat_mul(types[t], (struct mm_shape){512, 19, 1, 1, 1, 1, 1}, X_DENSE);
    check_mat_mul(types[t], (struct mm_shape){2048, 7, 2, 1, 1, 1, 1}, X_DENSE);
    check_mat_mul(types[t], (struct mm_shape){256, 9, 2, 1, 1, 1, 1}, X_PADDED);
    check_mat_mul(types[t], (struct mm_shape){256, 70, 4, 2, 1, 1, 1}, X_DENSE);
  }
}

/* f32 weights: a batch of columns (two at a time through tsr_vec_dot2x2_f32) gives each
** column exactly what the column alone gives (decode), for odd and even counts of rows,
** columns and values (tails of the vector loop). */
static void test_mat_mul_f32_batch_equals_its_columns(void) {
  tsr_test_seed(7);
  /* rows for several tiles, so that columns are not split over the threads */
  const int64_t shapes[][3] = {{300, 201, 7}, {64, 300, 4}, {1033, 71, 3}, {17, 130, 2}};
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    const int64_t k = shapes[si][0], m = shapes[si][1], n = shapes[si][2];
    struct tsr_test_graph tg;
    tsr_test_graph_init(&tg, 8 + 3 * (int)n);
    struct tsr_tensor *w = tsr_new_tensor_2d(tg.g, TSR_F32, k, m);
    struct tsr_tensor *x = tsr_new_tensor_2d(tg.g, TSR_F32, k, n);
    struct tsr_tensor *y = tsr_mat_mul(tg.g, w, x);
    tsr_graph_mark_output(y);
    struct tsr_tensor *ys[8];
    for (int64_t c = 0; c < n; c++) { /* column c alone: a view of x */
      struct tsr_tensor *xc = tsr_view(tg.g, x, 2, (int64_t[]){k, 1}, x->nb, (size_t)c * x->nb[1]);
      ys[c] = tsr_mat_mul(tg.g, w, xc);
      tsr_graph_mark_output(ys[c]);
    }
    CHECK_OK(tsr_test_graph_alloc(&tg));
    if (!tg.arena) {
      tsr_test_graph_free(&tg);
      continue;
    }
    tsr_test_fill_normal(w, 1.0f);
    tsr_test_fill_normal(x, 1.0f);
    CHECK_OK(tsr_test_graph_run(&tg, 2));
    for (int64_t c = 0; c < n; c++)
      CHECK_MSG(!memcmp((const float *)y->data + c * m, ys[c]->data, (size_t)m * sizeof(float)),
                "k %lld m %lld: column %lld of a batch of %lld differs from it alone",
                (long long)k, (long long)m, (long long)c, (long long)n);
    tsr_test_graph_free(&tg);
  }
}

/* Blocks of every size (1..4 rows x 1..3 columns) give each output the value the 1 x 1
** block gives, bit for bit, over lengths with and without a tail. */
static void test_dot_blocks_sum_every_output_alike(void) {
  tsr_test_seed(8);
  const int64_t lens[] = {1, 7, 8, 9, 31, 64, 300, 1033};
  for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
    const int64_t n = lens[li];
    float *buf = malloc(sizeof(float) * (size_t)n * 7);
    for (int64_t i = 0; i < n * 7; i++) buf[i] = tsr_test_normal();
    const float *w[4], *x[3];
    for (int r = 0; r < 4; r++) w[r] = buf + r * n;
    for (int c = 0; c < 3; c++) x[c] = buf + (4 + c) * n;
    float one[3][4];
    for (int c = 0; c < 3; c++)
      for (int r = 0; r < 4; r++) tsr_vec_dot_block_f32(&w[r], 1, &x[c], 1, n, &one[c][r]);
    for (int R = 1; R <= 4; R++)
      for (int C = 1; C <= 3; C++) {
        float out[12];
        tsr_vec_dot_block_f32(w, R, x, C, n, out);
        for (int c = 0; c < C; c++)
          for (int r = 0; r < R; r++)
            CHECK_MSG(!memcmp(&out[c * R + r], &one[c][r], sizeof(float)), "n %lld, block %dx%d: "
                      "output (%d, %d) %.9g, alone %.9g", (long long)n, R, C, r, c,
                      out[c * R + r], one[c][r]);
      }
    free(buf);
  }
}

/* A transposed f16 weight view: rows are not contiguous, so they are gathered. */
static void test_mat_mul_transposed_weights_match_reference(void) {
  tsr_test_seed(4);
  const int64_t k = 24, m = 10, n = 3;
  struct tsr_test_graph tg;
  tsr_test_graph_init(&tg, 16);
  struct tsr_tensor *wsrc = tsr_new_tensor_2d(tg.g, TSR_F16, m, k);
  struct tsr_tensor *w = tsr_transpose(tg.g, wsrc);
  struct tsr_tensor *x = tsr_new_tensor_2d(tg.g, TSR_F32, k, n);
  struct tsr_tensor *y = tsr_mat_mul(tg.g, w, x);
  tsr_graph_mark_output(y);
  CHECK_OK(tsr_test_graph_alloc(&tg));
  if (!y) goto out;
  tsr_test_fill_normal(wsrc, 1.0f);
  tsr_test_fill_normal(x, 1.0f);
  CHECK_OK(tsr_test_graph_run(&tg, 2));
  for (int64_t in = 0; in < n; in++)
    for (int64_t im = 0; im < m; im++) {
      double s = 0;
      for (int64_t i = 0; i < k; i++) s += tsr_test_get(w, i, im, 0, 0) * tsr_test_get(x, i, in, 0, 0);
      CHECK_CLOSE(tsr_test_get(y, im, in, 0, 0), s, 1e-5, 1e-5);
    }
out:
  tsr_test_graph_free(&tg);
}

static void test_mat_mul_check_rejects_unsupported_weight_types(void) {
  const enum tsr_dtype bad[] = {TSR_IQ2_XXS, TSR_I32, TSR_Q8_1};
  static char zeros[4096];
  struct tsr_backend *be = NULL;
  CHECK_OK(tsr_backend_cpu_new(1, &be));
  for (int i = 0; i < 3 && be; i++) {
    struct tsr_graph *g = tsr_graph_new(8);
    struct tsr_tensor *w = tsr_new_external(g, bad[i], 2, (int64_t[]){256, 4}, zeros);
    tsr_tensor_set_name(w, "blk.0.ffn_up");
    struct tsr_tensor *x = tsr_new_tensor_2d(g, TSR_F32, 256, 1);
    struct tsr_tensor *y = tsr_mat_mul(g, w, x);
    CHECK(y != NULL);
    tsr_status st = tsr_backend_check_graph(be, g);
    CHECK(st == TSR_ERR_UNSUPPORTED);
    const char *msg = tsr_error_message();
    CHECK_MSG(strstr(msg, tsr_dtype_name(bad[i])) && strstr(msg, "blk.0.ffn_up"),
              "message does not name the dtype and tensor: %s", msg);
    tsr_graph_free(g);
  }
  tsr_backend_free(be);
}

static void test_builders_reject_mismatched_shapes(void) {
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *w = tsr_new_tensor_2d(g, TSR_F32, 64, 8);
  struct tsr_tensor *x = tsr_new_tensor_2d(g, TSR_F32, 32, 2);
  tsr_tensor_set_name(w, "wq");
  CHECK(tsr_mat_mul(g, w, x) == NULL);
  CHECK(tsr_graph_status(g) == TSR_ERR_INVALID_ARG);
  CHECK_MSG(strstr(tsr_error_message(), "mat_mul") && strstr(tsr_error_message(), "wq"),
            "%s", tsr_error_message());
  tsr_graph_free(g);

  g = tsr_graph_new(16);
  w = tsr_new_tensor_3d(g, TSR_F32, 64, 8, 4);
  x = tsr_new_tensor_3d(g, TSR_F32, 64, 2, 5);
  struct tsr_tensor *ids = tsr_new_tensor_2d(g, TSR_I32, 2, 4); /* 4 tokens, x has 5 */
  CHECK(tsr_mat_mul_id(g, w, x, ids) == NULL);
  CHECK(tsr_graph_status(g) == TSR_ERR_INVALID_ARG);
  CHECK_MSG(strstr(tsr_error_message(), "mat_mul_id"), "%s", tsr_error_message());
  tsr_graph_free(g);

  g = tsr_graph_new(16);
  struct tsr_tensor *table = tsr_new_tensor_2d(g, TSR_F16, 16, 100);
  struct tsr_tensor *fidx = tsr_new_tensor_1d(g, TSR_F32, 3);
  CHECK(tsr_get_rows(g, table, fidx) == NULL);
  CHECK(tsr_graph_status(g) == TSR_ERR_INVALID_ARG);
  CHECK_MSG(strstr(tsr_error_message(), "get_rows") && strstr(tsr_error_message(), "i32"), "%s",
            tsr_error_message());
  tsr_graph_free(g);
}

/* ---- mat_mul_id ------------------------------------------------------------ */

struct id_case {
  enum tsr_dtype wt;
  int64_t k, m, e, u, t;
  bool x_shared;   /* x[K,1,T]: every slot reads the token's one column */
  bool strided;    /* x permuted, ids a padded view */
  bool bad_ids;    /* a few ids outside [0, E) */
};

static void check_mat_mul_id(struct id_case cs) {
  const int64_t ux = cs.x_shared ? 1 : cs.u;
  struct tsr_test_graph tg;
  tsr_test_graph_init(&tg, 16 + (int)cs.e * 2);
  struct tsr_graph *g = tg.g;
  struct tsr_tensor *w = tsr_new_tensor_3d(g, cs.wt, cs.k, cs.m, cs.e);
  struct tsr_tensor *x, *ids;
  if (cs.strided) {
    x = tsr_permute(g, tsr_new_tensor_3d(g, TSR_F32, cs.k, cs.t, ux), 0, 2, 1, 3);
    struct tsr_tensor *big = tsr_new_tensor_2d(g, TSR_I32, cs.u + 2, cs.t);
    ids = tsr_view(g, big, 2, (int64_t[]){cs.u, cs.t}, (size_t[]){4, big->nb[1]}, 4);
  } else {
    x = tsr_new_tensor_3d(g, TSR_F32, cs.k, ux, cs.t);
    ids = tsr_new_tensor_2d(g, TSR_I32, cs.u, cs.t);
  }
  struct tsr_tensor *y = tsr_mat_mul_id(g, w, x, ids);
  tsr_graph_mark_output(y);
  /* per-expert mat_mul over every column: the id result must agree with it */
  struct tsr_tensor *per[64] = {0};
  for (int64_t e = 0; e < cs.e && e < 64; e++) {
    struct tsr_tensor *we = tsr_view(g, w, 2, (int64_t[]){cs.k, cs.m}, (size_t[]){w->nb[0], w->nb[1]},
                                     (size_t)e * w->nb[2]);
    per[e] = tsr_mat_mul(g, we, x);
    tsr_graph_mark_output(per[e]);
  }
  CHECK_OK(tsr_test_graph_alloc(&tg));
  if (!y || !tg.arena) {
    tsr_test_graph_free(&tg);
    return;
  }
  tsr_test_fill_normal(w, 1.0f);
  tsr_test_fill_normal(x, 1.0f);
  for (int64_t t = 0; t < cs.t; t++)
    for (int64_t u = 0; u < cs.u; u++)
      tsr_test_set(ids, u, t, 0, 0, (double)(tsr_test_next() % (uint64_t)cs.e));
  if (cs.bad_ids) {
    tsr_test_set(ids, 0, 0, 0, 0, (double)cs.e);
    tsr_test_set(ids, cs.u - 1, cs.t - 1, 0, 0, -1);
  }
  double *wd = tsr_test_read_alloc(w);
  for (int ti = 0; ti < N_THREAD_COUNTS; ti++) {
    memset(y->data, 0xff, tsr_tensor_nbytes(y));
    CHECK_OK(tsr_test_graph_run(&tg, g_threads[ti]));
    int bad = 0;
    for (int64_t t = 0; t < cs.t; t++)
      for (int64_t u = 0; u < cs.u; u++) {
        int64_t e = (int64_t)tsr_test_get(ids, u, t, 0, 0), xu = cs.x_shared ? 0 : u;
        for (int64_t m = 0; m < cs.m; m++) {
          double got = tsr_test_get(y, m, u, t, 0), want = 0, ww = 0, xx = 0;
          if (e < 0 || e >= cs.e) {
            if (got != 0.0 && bad++ < 3) CHECK_MSG(0, "bad id %lld: out = %g, want 0", (long long)e, got);
            continue;
          }
          for (int64_t i = 0; i < cs.k; i++) {
            double wv = wd[(e * cs.m + m) * cs.k + i], xv = tsr_test_get(x, i, xu, t, 0);
            want += wv * xv, ww += wv * wv, xx += xv * xv;
          }
          if (!(fabs(got - want) <= 1e-5 * sqrt(ww * xx) + 1e-6) && bad++ < 3)
            CHECK_MSG(0, "%s u=%lld t=%lld m=%lld: %.7g, want %.7g", tsr_dtype_name(cs.wt),
                      (long long)u, (long long)t, (long long)m, got, want);
          /* equal up to the f16 path: few columns dot f16 in place, more convert */
          if (per[e] && !(fabs(got - tsr_test_get(per[e], m, xu, t, 0)) <= 1e-6 * sqrt(ww * xx)) &&
              bad++ < 3)
            CHECK_MSG(0, "differs from mat_mul of expert %lld", (long long)e);
        }
      }
  }
  free(wd);
  tsr_test_graph_free(&tg);
}

static void test_mat_mul_id_matches_per_expert_reference(void) {
  tsr_test_seed(5);
  const struct id_case cases[] = {
      {TSR_F32, 48, 13, 6, 2, 5, false, false, false},
      {TSR_F32, 48, 13, 6, 2, 5, true, false, false},   /* shared x */
      {TSR_F16, 40, 9, 4, 3, 1, false, true, false},    /* decode, strided */
      {TSR_Q8_0, 64, 21, 8, 4, 7, false, true, true},   /* bad ids */
      {TSR_Q4_K, 256, 17, 5, 2, 3, true, false, false},
      {TSR_BF16, 32, 70, 3, 2, 40, false, false, true}, /* busy experts: columns chunked */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_mat_mul_id(cases[i]);
}

/* ---- get_rows --------------------------------------------------------------- */

static void check_get_rows(enum tsr_dtype dt, int64_t k, int64_t r, int64_t n, int64_t b,
                           bool transposed) {
  struct tsr_test_graph tg;
  tsr_test_graph_init(&tg, 16);
  struct tsr_tensor *a = transposed
                             ? tsr_transpose(tg.g, tsr_new_tensor_3d(tg.g, dt, r, k, b))
                             : tsr_new_tensor_3d(tg.g, dt, k, r, b);
  struct tsr_tensor *big = tsr_new_tensor_2d(tg.g, TSR_I32, n + 1, b);
  struct tsr_tensor *idx = tsr_view(tg.g, big, 2, (int64_t[]){n, b}, (size_t[]){4, big->nb[1]}, 4);
  struct tsr_tensor *y = tsr_get_rows(tg.g, a, idx);
  tsr_graph_mark_output(y);
  CHECK_OK(tsr_test_graph_alloc(&tg));
  if (!y) {
    tsr_test_graph_free(&tg);
    return;
  }
  tsr_test_fill_normal(a, 1.0f);
  tsr_test_fill_uniform(idx, -1, (float)r + 1); /* -1 and r are out of range */
  for (int ti = 0; ti < N_THREAD_COUNTS; ti++) {
    memset(y->data, 0xff, tsr_tensor_nbytes(y));
    CHECK_OK(tsr_test_graph_run(&tg, g_threads[ti]));
    int bad = 0;
    for (int64_t ib = 0; ib < b; ib++)
      for (int64_t i = 0; i < n; i++) {
        int64_t row = (int64_t)tsr_test_get(idx, i, ib, 0, 0);
        for (int64_t j = 0; j < k; j++) {
          double want = row < 0 || row >= r ? 0.0 : tsr_test_get(a, j, row, ib, 0);
          double got = tsr_test_get(y, j, i, ib, 0);
          if (got != want && bad++ < 3)
            CHECK_MSG(0, "%s row %lld elem %lld: %g, want %g", tsr_dtype_name(dt), (long long)row,
                      (long long)j, got, want);
        }
      }
  }
  tsr_test_graph_free(&tg);
}

static void test_get_rows_matches_table_and_zeroes_bad_indices(void) {
  tsr_test_seed(6);
  check_get_rows(TSR_F32, 7, 11, 5, 3, false);
  check_get_rows(TSR_F32, 7, 11, 1, 1, false);
  check_get_rows(TSR_F32, 9, 6, 4, 2, true);
  check_get_rows(TSR_F16, 13, 8, 9, 1, false);
  check_get_rows(TSR_F16, 5, 8, 9, 2, true);
  check_get_rows(TSR_BF16, 16, 4, 3, 2, false);
  check_get_rows(TSR_Q8_0, 64, 10, 6, 2, false);
  check_get_rows(TSR_Q4_K, 256, 5, 7, 1, false);
  check_get_rows(TSR_Q6_K, 512, 3, 2, 1, false);
}

static void test_get_rows_check_rejects_undequantizable_table(void) {
  static char zeros[4096];
  struct tsr_graph *g = tsr_graph_new(8);
  struct tsr_tensor *a = tsr_new_external(g, TSR_IQ4_XS, 2, (int64_t[]){256, 4}, zeros);
  tsr_tensor_set_name(a, "token_embd");
  struct tsr_tensor *idx = tsr_new_tensor_1d(g, TSR_I32, 2);
  CHECK(tsr_get_rows(g, a, idx) != NULL);
  struct tsr_backend *be = NULL;
  CHECK_OK(tsr_backend_cpu_new(1, &be));
  if (be) {
    CHECK(tsr_backend_check_graph(be, g) == TSR_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(tsr_error_message(), "iq4_xs") && strstr(tsr_error_message(), "token_embd"),
              "%s", tsr_error_message());
  }
  tsr_backend_free(be);
  tsr_graph_free(g);
}

/* ---- planning ---------------------------------------------------------------- */

/* A chain of products: intermediates share memory once dead, but a marked
** output keeps its values after every later node has run. */
static void test_planner_reuses_memory_and_keeps_outputs(void) {
  tsr_test_seed(7);
  const int64_t k = 32, n = 4, depth = 6;
  struct tsr_test_graph tg;
  tsr_test_graph_init(&tg, 32);
  struct tsr_tensor *x = tsr_new_tensor_2d(tg.g, TSR_F32, k, n);
  struct tsr_tensor *w[6], *h[6];
  struct tsr_tensor *cur = x;
  for (int i = 0; i < depth; i++) {
    w[i] = tsr_new_tensor_2d(tg.g, TSR_F32, k, k);
    h[i] = tsr_mat_mul(tg.g, w[i], cur);
    cur = h[i];
  }
  tsr_graph_mark_output(h[1]);
  tsr_graph_mark_output(h[depth - 1]);
  CHECK_OK(tsr_test_graph_alloc(&tg));
  if (!cur) goto out;
  CHECK_MSG(tg.plan.arena_bytes < tg.plan.naive_bytes, "arena %zu, naive %zu", tg.plan.arena_bytes,
            tg.plan.naive_bytes);
  tsr_test_fill_normal(x, 1.0f);
  for (int i = 0; i < depth; i++) tsr_test_fill_uniform(w[i], -0.3f, 0.3f);
  CHECK_OK(tsr_test_graph_run(&tg, 2));
  /* recompute the chain in doubles */
  double *v = tsr_test_read_alloc(x), *nv = malloc((size_t)(k * n) * sizeof *nv);
  double *wd = malloc((size_t)(k * k) * sizeof *wd);
  for (int i = 0; i < depth; i++) {
    tsr_test_read(w[i], wd);
    const int64_t wne[4] = {k, k, 1, 1}, xne[4] = {k, n, 1, 1};
    ref_mat_mul(wd, v, wne, xne, nv, NULL);
    memcpy(v, nv, (size_t)(k * n) * sizeof *v);
    if (i != 1 && i != depth - 1) continue;
    for (int64_t j = 0; j < k * n; j++)
      CHECK_CLOSE(tsr_test_get(h[i], j % k, j / k, 0, 0), v[j], 1e-4, 1e-4);
  }
  free(v), free(nv), free(wd);
out:
  tsr_test_graph_free(&tg);
}

/* activations: q8: n columns of x against every block type with an integer kernel, on 1
** and 3 threads. Each column is coded alone and meets the rows in its own lanes, so a
** column's product is the same bits in a batch of 1, 2 or 7; and each is the exact product
** of the dequantized weights with the values the column's codes stand for, within 1e-5 of
** sum |w x|. */
static void test_mat_mul_q8_activations_agree_across_batches(void) {
  static const enum tsr_dtype types[] = {TSR_Q8_0, TSR_Q4_0, TSR_Q4_1, TSR_Q5_0,
                                         TSR_Q5_1, TSR_Q4_K, TSR_Q5_K, TSR_Q6_K};
  enum { K = 512, M = 37, N = 19 }; /* past 8 columns a tile's rows are expanded once */
  tsr_test_seed(41);
  float *xs = malloc(sizeof(float) * K * N), *coded = malloc(sizeof(float) * K * N);
  for (int i = 0; i < K * N; i++) xs[i] = tsr_test_normal();
  for (int c = 0; c < N; c++) {
    struct tsr_q8_act a[K / TSR_Q8_ACT_BLOCK];
    tsr_vec_quantize_q8(xs + c * K, K, a);
    for (int i = 0; i < K; i++) coded[c * K + i] = a[i / 32].d * (float)a[i / 32].q[i % 32];
  }
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    float alone[M]; /* column 0 in a batch of one */
    const int batches[] = {1, 2, 7, N};
    for (int bi = 0; bi < 4; bi++) {
      const int n = batches[bi];
      struct tsr_test_graph tg;
      tsr_test_graph_init(&tg, 8);
      struct tsr_tensor *w = tsr_new_tensor_2d(tg.g, types[ti], K, M);
      struct tsr_tensor *x = tsr_new_tensor_2d(tg.g, TSR_F32, K, n);
      struct tsr_tensor *y = tsr_mat_mul(tg.g, w, x);
      tsr_graph_mark_output(y);
      CHECK_OK(tsr_test_graph_alloc(&tg));
      if (!y || !tg.arena) {
        tsr_test_graph_free(&tg);
        continue;
      }
      tsr_test_seed(1000 + ti); /* the same weights in every batch */
      float *wf = malloc(sizeof(float) * K * M);
      for (int i = 0; i < K * M; i++) wf[i] = tsr_test_normal();
      tsr_test_fill_from(w, wf);
      memcpy(x->data, xs, sizeof(float) * K * (size_t)n);
      double *wd = tsr_test_read_alloc(w);
      for (int th = 1; th <= 3; th += 2) {
        struct tsr_backend *be = NULL;
        CHECK_OK(tsr_backend_cpu_new(th, &be));
        if (!be) continue;
        tsr_backend_cpu_set_activations_q8(be, true);
        CHECK_OK(tsr_backend_compute(be, tg.g));
        tsr_backend_free(be);
        for (int c = 0; c < n; c++) {
          for (int r = 0; r < M; r++) {
            const float got = ((const float *)y->data)[c * M + r];
            double exact = 0, mag = 0;
            for (int i = 0; i < K; i++) {
              exact += wd[r * K + i] * coded[c * K + i];
              mag += fabs(wd[r * K + i] * xs[c * K + i]);
            }
            CHECK_MSG(fabs(got - exact) <= 1e-5 * mag, "%s batch %d col %d row %d: %.9g, coded "
                      "product %.9g", tsr_dtype_name(types[ti]), n, c, r, got, exact);
            if (c > 0) continue;
            if (bi == 0) alone[r] = got;
            else CHECK_MSG(memcmp(&got, &alone[r], sizeof got) == 0, "%s: row %d of column 0 "
                           "in a batch of %d: %.9g, alone %.9g", tsr_dtype_name(types[ti]), r, n,
                           got, alone[r]);
          }
        }
      }
      free(wf), free(wd);
      tsr_test_graph_free(&tg);
    }
  }
  free(xs), free(coded);
}

int main(void) {
  TSR_RUN(test_mat_mul_plain_weights_match_reference);
  TSR_RUN(test_mat_mul_strided_inputs_match_reference);
  TSR_RUN(test_mat_mul_block_weights_match_dequantized_reference);
  TSR_RUN(test_mat_mul_f32_batch_equals_its_columns);
  TSR_RUN(test_dot_blocks_sum_every_output_alike);
  TSR_RUN(test_mat_mul_transposed_weights_match_reference);
  TSR_RUN(test_mat_mul_check_rejects_unsupported_weight_types);
  TSR_RUN(test_builders_reject_mismatched_shapes);
  TSR_RUN(test_mat_mul_id_matches_per_expert_reference);
  TSR_RUN(test_get_rows_matches_table_and_zeroes_bad_indices);
  TSR_RUN(test_get_rows_check_rejects_undequantizable_table);
  TSR_RUN(test_planner_reuses_memory_and_keeps_outputs);
  TSR_RUN(test_mat_mul_q8_activations_agree_across_batches);
  return TSR_TEST_EXIT();
}
