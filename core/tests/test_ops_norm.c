/* CPU kernels rms_norm, l2_norm, softmax and rope against double references. */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "layout_test_util.h"

static double *alloc_like(const struct tsr_tensor *t) {
  return malloc((size_t)tsr_tensor_nelements(t) * sizeof(double));
}

/* ---- rms_norm, l2_norm -------------------------------------------------- */

enum weight_kind { W_NONE, W_ROW, W_PER_ROW, W_STRIDED };

static void check_rms_norm(const int64_t ne[4], enum layout l, enum weight_kind wk, float eps) {
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *a = input(g, ne, l), *w = NULL;
  switch (wk) {
  case W_NONE: break;
  case W_ROW: w = tsr_new_tensor_1d(g, TSR_F32, ne[0]); break;
  case W_PER_ROW: w = tsr_new_tensor_2d(g, TSR_F32, ne[0], ne[1]); break; /* over dims 2,3 */
  case W_STRIDED: { /* every other float of a longer vector */
    struct tsr_tensor *b = tsr_new_tensor_1d(g, TSR_F32, 2 * ne[0]);
    w = b ? tsr_view(g, b, 1, ne, (size_t[]){2 * sizeof(float)}, sizeof(float)) : NULL;
    break;
  }
  }
  struct tsr_tensor *y = tsr_rms_norm(g, a, w, eps);
  tsr_graph_mark_output(y);
  void *arena = NULL;
  CHECK_MSG(y != NULL, "build: %s", tsr_error_message());
  if (y && alloc_graph(g, &arena)) {
    tsr_test_fill_normal(a, 2.0f);
    if (w) tsr_test_fill_uniform(w, -2.0f, 2.0f);
    if (run_threads(g, y)) {
      double *want = alloc_like(y);
      for (int64_t r = 0; r < tsr_tensor_nrows(y); r++) {
        int64_t i1 = r % ne[1], i2 = r / ne[1] % ne[2], i3 = r / ne[1] / ne[2];
        double ss = 0;
        for (int64_t i0 = 0; i0 < ne[0]; i0++) ss += pow(tsr_test_get(a, i0, i1, i2, i3), 2);
        double s = 1.0 / sqrt(ss / (double)ne[0] + eps);
        for (int64_t i0 = 0; i0 < ne[0]; i0++) {
          double wv = w ? tsr_test_get(w, i0, i1 % w->ne[1], 0, 0) : 1.0;
          want[r * ne[0] + i0] = tsr_test_get(a, i0, i1, i2, i3) * s * wv;
        }
      }
      char what[96];
      snprintf(what, sizeof what, "rms_norm ne0 %lld %s weight kind %d eps %g",
               (long long)ne[0], layout_name(l), (int)wk, eps);
      expect_close(y, want, 1e-5, 1e-5, what);
      free(want);
    }
  }
  free(arena);
  tsr_graph_free(g);
}

static const int64_t k_shapes[][4] = {{64, 3, 2, 1}, {33, 1, 1, 1}, {1000, 2, 1, 2}, {5, 4, 3, 2}};
#define N_SHAPES (int)(sizeof k_shapes / sizeof k_shapes[0])

static void rms_norm_matches_reference_with_and_without_weight(void) {
  for (int s = 0; s < N_SHAPES; s++)
    for (int l = 0; l < LAYOUT_COUNT; l++)
      for (int wk = W_NONE; wk <= W_STRIDED; wk++) check_rms_norm(k_shapes[s], l, wk, 1e-6f);
  /* a large eps shows it is added to the mean, not the sum */
  check_rms_norm(k_shapes[0], LAYOUT_CONTIG, W_NONE, 0.5f);
}

static void l2_norm_matches_reference(void) {
  for (int s = 0; s < N_SHAPES; s++)
    for (int l = 0; l < LAYOUT_COUNT; l++) {
      struct tsr_graph *g = tsr_graph_new(16);
      struct tsr_tensor *a = input(g, k_shapes[s], l);
      struct tsr_tensor *y = tsr_l2_norm(g, a, 1e-6f);
      tsr_graph_mark_output(y);
      void *arena = NULL;
      if (y && alloc_graph(g, &arena)) {
        tsr_test_fill_normal(a, 3.0f);
        if (run_threads(g, y)) {
          double *want = alloc_like(y);
          const int64_t ne0 = y->ne[0];
          for (int64_t r = 0; r < tsr_tensor_nrows(y); r++) {
            int64_t i1 = r % y->ne[1], i2 = r / y->ne[1] % y->ne[2], i3 = r / y->ne[1] / y->ne[2];
            double ss = 0;
            for (int64_t i0 = 0; i0 < ne0; i0++) ss += pow(tsr_test_get(a, i0, i1, i2, i3), 2);
            for (int64_t i0 = 0; i0 < ne0; i0++)
              want[r * ne0 + i0] = tsr_test_get(a, i0, i1, i2, i3) / sqrt(ss + 1e-6);
          }
          expect_close(y, want, 1e-6, 1e-5, layout_name(l));
          free(want);
        }
      }
      free(arena);
      tsr_graph_free(g);
    }
}

/* eps sits inside the root, as in Hugging Face's l2norm (x * rsqrt(sum x^2 +
** eps)): a row of norm 1e-4 with eps 1e-6 scales by 1/sqrt(1e-8 + 1e-6),
** where x / max(||x||, eps) would give a unit vector. A zero row stays zero. */
static void l2_norm_puts_eps_inside_the_root(void) {
  struct tsr_graph *g = tsr_graph_new(8);
  struct tsr_tensor *a = tsr_new_tensor_2d(g, TSR_F32, 4, 2);
  struct tsr_tensor *y = tsr_l2_norm(g, a, 1e-6f);
  tsr_graph_mark_output(y);
  void *arena = NULL;
  if (y && alloc_graph(g, &arena)) {
    const float x[8] = {1e-4f, 0, 0, 0, 0, 0, 0, 0};
    memcpy(a->data, x, sizeof x);
    CHECK_OK(tsr_backend_compute(g_be[1], g));
    const float *o = y->data;
    CHECK_CLOSE(o[0], 1e-4 / sqrt(1e-8 + 1e-6), 1e-7, 1e-5);
    for (int i = 1; i < 8; i++) CHECK(o[i] == 0.0f);
  }
  free(arena);
  tsr_graph_free(g);
}

/* ---- softmax ------------------------------------------------------------ */

static void ref_softmax_row(const double *v, int64_t n, double *out) {
  double max = -INFINITY, sum = 0;
  for (int64_t j = 0; j < n; j++) max = v[j] > max ? v[j] : max;
  for (int64_t j = 0; j < n; j++) {
    out[j] = max == -INFINITY ? 0.0 : exp(v[j] - max);
    sum += out[j];
  }
  for (int64_t j = 0; j < n && sum > 0; j++) out[j] /= sum;
}

/* mask_ne2/3 = 0: no mask. Masked entries are -inf with probability 1/5. */
static void check_softmax(const int64_t ne[4], enum layout l, enum tsr_dtype mdt, int64_t mne2,
                          int64_t mne3, enum layout ml, float scale) {
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *a = input(g, ne, l), *m = NULL;
  if (mne2) m = input_dt(g, mdt, (int64_t[]){ne[0], ne[1], mne2, mne3}, ml);
  struct tsr_tensor *y = tsr_softmax(g, a, m, scale);
  tsr_graph_mark_output(y);
  void *arena = NULL;
  CHECK_MSG(y != NULL, "build: %s", tsr_error_message());
  if (y && alloc_graph(g, &arena)) {
    tsr_test_fill_normal(a, 3.0f);
    if (m) {
      FOR_EACH(m) {
        double v = tsr_test_uniform(0, 1) < 0.2f ? -INFINITY : tsr_test_uniform(-2, 2);
        tsr_test_set(m, i0, i1, i2, i3, v);
      }
    }
    if (run_threads(g, y)) {
      double *want = alloc_like(y), *v = malloc((size_t)ne[0] * sizeof *v);
      for (int64_t r = 0; r < tsr_tensor_nrows(y); r++) {
        int64_t i1 = r % ne[1], i2 = r / ne[1] % ne[2], i3 = r / ne[1] / ne[2];
        for (int64_t i0 = 0; i0 < ne[0]; i0++) {
          v[i0] = tsr_test_get(a, i0, i1, i2, i3) * scale;
          if (m) v[i0] += tsr_test_get(m, i0, i1, i2 % mne2, i3 % mne3);
        }
        ref_softmax_row(v, ne[0], want + r * ne[0]);
      }
      char what[128];
      snprintf(what, sizeof what, "softmax ne0 %lld %s, mask %s [.,.,%lld,%lld] %s",
               (long long)ne[0], layout_name(l), m ? tsr_dtype_name(mdt) : "none",
               (long long)mne2, (long long)mne3, layout_name(ml));
      expect_close(y, want, 1e-6, 1e-5, what);
      free(want);
      free(v);
    }
  }
  free(arena);
  tsr_graph_free(g);
}

static void softmax_matches_reference_with_scale_and_mask(void) {
  const int64_t ne[4] = {37, 5, 4, 2};
  for (int l = 0; l < LAYOUT_COUNT; l++) {
    check_softmax(ne, l, TSR_F32, 0, 0, 0, 0.7f);
    check_softmax(k_shapes[1], l, TSR_F32, 0, 0, 0, 1.0f); /* a single row */
    check_softmax(k_shapes[2], l, TSR_F32, 1, 1, 0, 0.1f);
    for (int mdt = 0; mdt < 2; mdt++) {
      enum tsr_dtype dt = mdt ? TSR_F16 : TSR_F32;
      check_softmax(ne, l, dt, 1, 1, LAYOUT_CONTIG, 0.7f);  /* one mask for every head */
      check_softmax(ne, l, dt, 2, 1, LAYOUT_PADDED, 0.7f);  /* repeats over dim 2 */
      check_softmax(ne, l, dt, 4, 2, LAYOUT_PERMUTED, 1.3f); /* one per (dim 2, dim 3) */
    }
  }
}

static void softmax_fully_masked_row_is_zero_not_nan(void) {
  struct tsr_graph *g = tsr_graph_new(8);
  struct tsr_tensor *a = tsr_new_tensor_3d(g, TSR_F32, 6, 3, 2);
  struct tsr_tensor *m = tsr_new_tensor_2d(g, TSR_F16, 6, 3);
  struct tsr_tensor *y = tsr_softmax(g, a, m, 1.0f);
  tsr_graph_mark_output(y);
  void *arena = NULL;
  if (y && alloc_graph(g, &arena)) {
    tsr_test_fill_normal(a, 1.0f);
    FOR_EACH(m) tsr_test_set(m, i0, i1, 0, 0, i1 == 1 || (i1 == 2 && i0 > 0) ? -INFINITY : 0.0);
    tsr_test_set(a, 3, 0, 1, 0, -INFINITY); /* an input -inf counts as masked too */
    CHECK_OK(tsr_backend_compute(g_be[1], g));
    for (int64_t i2 = 0; i2 < 2; i2++) {
      double sum0 = 0;
      for (int64_t i0 = 0; i0 < 6; i0++) {
        double v0 = tsr_test_get(y, i0, 0, i2, 0), v1 = tsr_test_get(y, i0, 1, i2, 0);
        double v2 = tsr_test_get(y, i0, 2, i2, 0);
        CHECK(isfinite(v0) && v1 == 0.0 && v2 == (i0 == 0 ? 1.0 : 0.0));
        sum0 += v0;
      }
      CHECK_CLOSE(sum0, 1.0, 1e-6, 0);
    }
    CHECK(tsr_test_get(y, 3, 0, 1, 0) == 0.0);
  }
  free(arena);
  tsr_graph_free(g);
}

static void softmax_of_large_logits_does_not_overflow(void) {
  struct tsr_graph *g = tsr_graph_new(8);
  struct tsr_tensor *a = tsr_new_tensor_2d(g, TSR_F32, 50, 3);
  struct tsr_tensor *y = tsr_softmax(g, a, NULL, 1.0f);
  tsr_graph_mark_output(y);
  void *arena = NULL;
  if (y && alloc_graph(g, &arena)) {
    FOR_EACH(a) {
      /* row 0 near +1e4, row 1 near -1e4, row 2 spanning both */
      double base = i1 == 0 ? 1e4 : i1 == 1 ? -1e4 : (i0 % 2 ? 1e4 : -1e4);
      tsr_test_set(a, i0, i1, i2, i3, base + 4.0 * tsr_test_normal());
    }
    if (run_threads(g, y)) {
      double *want = alloc_like(y), v[50];
      for (int64_t r = 0; r < 3; r++) {
        for (int64_t j = 0; j < 50; j++) v[j] = tsr_test_get(a, j, r, 0, 0);
        ref_softmax_row(v, 50, want + r * 50);
      }
      expect_close(y, want, 1e-6, 1e-5, "logits near 1e4");
      free(want);
    }
  }
  free(arena);
  tsr_graph_free(g);
}

/* ---- rope --------------------------------------------------------------- */

struct rope_case {
  int64_t d, h, n;
  int n_rot;
  enum tsr_rope_mode mode;
  float base, scale;
  bool ff;
  int32_t pos_lo, pos_hi; /* positions uniform in [lo, hi) */
};

/* Rotation of element i0 of x[0..d) by the double-precision definition. */
static double ref_rope(const struct tsr_tensor *a, int64_t i1, int64_t i2, int64_t i0, double pos,
                       const struct rope_case *rc, const struct tsr_tensor *ff) {
  const int64_t half = rc->n_rot / 2;
  if (i0 >= rc->n_rot) return tsr_test_get(a, i0, i1, i2, 0);
  int64_t pair, j0, j1;
  if (rc->mode == TSR_ROPE_NEOX) pair = i0 % half, j0 = pair, j1 = pair + half;
  else pair = i0 / 2, j0 = 2 * pair, j1 = 2 * pair + 1;
  double theta = pos * rc->scale / pow(rc->base, 2.0 * (double)pair / rc->n_rot);
  if (ff) theta /= tsr_test_get(ff, pair, 0, 0, 0);
  double x0 = tsr_test_get(a, j0, i1, i2, 0), x1 = tsr_test_get(a, j1, i1, i2, 0);
  return i0 == j0 ? x0 * cos(theta) - x1 * sin(theta) : x0 * sin(theta) + x1 * cos(theta);
}

/* Builds and runs one rope case; returns the output as doubles (free it),
** or NULL after a failed check. atol bounds |got - reference|. */
static double *check_rope(const struct rope_case *rc, enum layout l, double atol,
                          const char *what) {
  struct tsr_graph *g = tsr_graph_new(16);
  const int64_t ne[4] = {rc->d, rc->h, rc->n, 1};
  struct tsr_tensor *a = input(g, ne, l);
  struct tsr_tensor *pos = tsr_new_tensor_1d(g, TSR_I32, rc->n);
  struct tsr_tensor *ff = rc->ff ? tsr_new_tensor_1d(g, TSR_F32, rc->n_rot / 2) : NULL;
  struct tsr_rope_params p = {rc->n_rot, rc->mode, rc->base, rc->scale};
  struct tsr_tensor *y = tsr_rope(g, a, pos, ff, &p);
  tsr_graph_mark_output(y);
  void *arena = NULL;
  double *got = NULL;
  CHECK_MSG(y != NULL, "build: %s", tsr_error_message());
  if (y && alloc_graph(g, &arena)) {
    tsr_test_fill_normal(a, 1.0f);
    tsr_test_fill_uniform(pos, (float)rc->pos_lo, (float)rc->pos_hi);
    if (rc->n > 1) tsr_test_set(pos, 0, 0, 0, 0, rc->pos_hi - 1); /* the largest position */
    if (ff) tsr_test_fill_uniform(ff, 1.0f, 40.0f);
    if (run_threads(g, y)) {
      double *want = alloc_like(y), *w = want;
      FOR_EACH(y) *w++ = ref_rope(a, i1, i2, i0, tsr_test_get(pos, i2, 0, 0, 0), rc, ff);
      char msg[160];
      snprintf(msg, sizeof msg, "%s, %s, %s", what, rc->mode == TSR_ROPE_NEOX ? "neox" : "normal",
               layout_name(l));
      expect_close(y, want, atol, 0, msg);
      free(want);
      /* dims past n_rot are the input's bits */
      bool same = true;
      FOR_EACH(y) {
        if (i0 < rc->n_rot) continue;
        same = same && memcmp(tsr_test_addr(y, i0, i1, i2, i3), tsr_test_addr(a, i0, i1, i2, i3),
                              sizeof(float)) == 0;
      }
      CHECK_MSG(same, "%s: pass-through dims changed", msg);
      got = tsr_test_read_alloc(y);
    }
  }
  free(arena);
  tsr_graph_free(g);
  return got;
}

static void rope_normal_and_neox_each_match_reference_and_differ(void) {
  for (int l = 0; l < LAYOUT_COUNT; l++) {
    struct rope_case rc = {16, 3, 5, 16, TSR_ROPE_NORMAL, 10000.0f, 1.0f, false, 0, 5000};
    tsr_test_seed(77);
    double *normal = check_rope(&rc, l, 1e-5, "full rotary");
    rc.mode = TSR_ROPE_NEOX;
    tsr_test_seed(77); /* same inputs */
    double *neox = check_rope(&rc, l, 1e-5, "full rotary");
    if (normal && neox) {
      double d = tsr_test_max_abs_diff(normal, neox, 16 * 3 * 5);
      CHECK_MSG(d > 0.1, "normal and neox pairing agree to %g", d);
    }
    free(normal);
    free(neox);
    /* freq_scale, odd head and token counts, and a single row */
    struct rope_case rs = {12, 7, 3, 12, TSR_ROPE_NEOX, 500000.0f, 0.25f, false, -3, 70000};
    free(check_rope(&rs, l, 1e-5, "freq_scale 0.25"));
    rs.mode = TSR_ROPE_NORMAL;
    free(check_rope(&rs, l, 1e-5, "freq_scale 0.25"));
    struct rope_case r1 = {8, 1, 1, 8, TSR_ROPE_NEOX, 10000.0f, 1.0f, false, 9, 10};
    free(check_rope(&r1, l, 1e-5, "one row"));
  }
}

static void rope_partial_rotary_leaves_tail_bitwise_unchanged(void) {
  /* check_rope compares the tail bit for bit; this runs it on partial cases */
  for (int l = 0; l < LAYOUT_COUNT; l++)
    for (int mode = 0; mode < 2; mode++) {
      struct rope_case rc = {20, 3, 4, 8, mode, 10000.0f, 1.0f, false, 0, 3000};
      free(check_rope(&rc, l, 1e-5, "n_rot 8 of 20"));
      struct rope_case r2 = {64, 2, 3, 2, mode, 10000.0f, 1.0f, false, 0, 3000};
      free(check_rope(&r2, l, 1e-5, "n_rot 2 of 64"));
    }
}

static void rope_freq_factors_divide_each_pair_angle(void) {
  for (int l = 0; l < LAYOUT_COUNT; l++)
    for (int mode = 0; mode < 2; mode++) {
      struct rope_case rc = {24, 3, 4, 16, mode, 500000.0f, 1.0f, true, 0, 100000};
      free(check_rope(&rc, l, 1e-5, "freq factors"));
    }
}

/* At position 1e6 an f32 angle is off by up to 0.03 rad; the kernel's double
** angle must agree with the double reference to f32 rounding of cos/sin. */
static void rope_at_position_one_million_stays_accurate(void) {
  for (int mode = 0; mode < 2; mode++) {
    struct rope_case rc = {128, 2, 4, 128, mode, 1000000.0f, 1.0f, false, 990000, 1000001};
    free(check_rope(&rc, LAYOUT_CONTIG, 1e-5, "positions near 1e6"));
    struct rope_case r2 = {256, 1, 3, 128, mode, 10000000.0f, 1.0f, true, 1000000, 1048577};
    free(check_rope(&r2, LAYOUT_PERMUTED, 1e-5, "positions near 2^20, partial, ff"));
  }
}

static void rope_at_position_zero_is_identity(void) {
  struct rope_case rc = {32, 4, 1, 32, TSR_ROPE_NEOX, 10000.0f, 1.0f, false, 0, 1};
  struct tsr_graph *g = tsr_graph_new(8);
  struct tsr_tensor *a = tsr_new_tensor_3d(g, TSR_F32, rc.d, rc.h, rc.n);
  struct tsr_tensor *pos = tsr_new_tensor_1d(g, TSR_I32, 1);
  struct tsr_rope_params p = {rc.n_rot, rc.mode, rc.base, rc.scale};
  struct tsr_tensor *y = tsr_rope(g, a, pos, NULL, &p);
  tsr_graph_mark_output(y);
  void *arena = NULL;
  if (y && alloc_graph(g, &arena)) {
    tsr_test_fill_normal(a, 1.0f);
    tsr_test_set(pos, 0, 0, 0, 0, 0);
    CHECK_OK(tsr_backend_compute(g_be[0], g));
    CHECK(memcmp(a->data, y->data, tsr_tensor_nbytes(y)) == 0);
  }
  free(arena);
  tsr_graph_free(g);
}

/* ---- builder rejections ------------------------------------------------- */

static void expect_rejected(struct tsr_graph *g, struct tsr_tensor *t, const char *needle) {
  CHECK(t == NULL);
  CHECK(tsr_graph_status(g) != TSR_OK);
  CHECK_MSG(strstr(tsr_error_message(), needle) != NULL, "message '%s' lacks '%s'",
            tsr_error_message(), needle);
  tsr_graph_free(g);
}

static void builder_rejects_bad_rope_softmax_and_norm_shapes(void) {
  struct tsr_rope_params p = {7, TSR_ROPE_NORMAL, 10000.0f, 1.0f};
  struct tsr_graph *g = tsr_graph_new(8);
  struct tsr_tensor *a = tsr_new_tensor_3d(g, TSR_F32, 16, 2, 3);
  struct tsr_tensor *pos = tsr_new_tensor_1d(g, TSR_I32, 3);
  tsr_error_clear();
  expect_rejected(g, tsr_rope(g, a, pos, NULL, &p), "n_rot 7");

  p.n_rot = 18; /* more than ne0 */
  g = tsr_graph_new(8);
  a = tsr_new_tensor_3d(g, TSR_F32, 16, 2, 3);
  pos = tsr_new_tensor_1d(g, TSR_I32, 3);
  expect_rejected(g, tsr_rope(g, a, pos, NULL, &p), "n_rot 18");

  p.n_rot = 16; /* one position short */
  g = tsr_graph_new(8);
  a = tsr_new_tensor_3d(g, TSR_F32, 16, 2, 3);
  pos = tsr_new_tensor_1d(g, TSR_I32, 2);
  expect_rejected(g, tsr_rope(g, a, pos, NULL, &p), "positions");

  g = tsr_graph_new(8); /* too few frequency factors */
  a = tsr_new_tensor_3d(g, TSR_F32, 16, 2, 3);
  pos = tsr_new_tensor_1d(g, TSR_I32, 3);
  struct tsr_tensor *ff = tsr_new_tensor_1d(g, TSR_F32, 4);
  expect_rejected(g, tsr_rope(g, a, pos, ff, &p), "frequency factors");

  g = tsr_graph_new(8);
  a = tsr_new_tensor_3d(g, TSR_F32, 16, 2, 3);
  struct tsr_tensor *m = tsr_new_tensor_2d(g, TSR_F32, 16, 3);
  expect_rejected(g, tsr_softmax(g, a, m, 1.0f), "mask");

  g = tsr_graph_new(8);
  a = tsr_new_tensor_3d(g, TSR_F32, 16, 2, 3);
  struct tsr_tensor *w = tsr_new_tensor_1d(g, TSR_F32, 8);
  expect_rejected(g, tsr_rms_norm(g, a, w, 1e-6f), "weight");
}

int main(void) {
  tsr_test_seed(4321);
  if (tsr_backend_cpu_new(1, &g_be[0]) != TSR_OK || tsr_backend_cpu_new(3, &g_be[1]) != TSR_OK) {
    fprintf(stderr, "cannot start the cpu backend: %s\n", tsr_error_message());
    return 1;
  }
  TSR_RUN(rms_norm_matches_reference_with_and_without_weight);
  TSR_RUN(l2_norm_matches_reference);
  TSR_RUN(l2_norm_puts_eps_inside_the_root);
  TSR_RUN(softmax_matches_reference_with_scale_and_mask);
  TSR_RUN(softmax_fully_masked_row_is_zero_not_nan);
  TSR_RUN(softmax_of_large_logits_does_not_overflow);
  TSR_RUN(rope_normal_and_neox_each_match_reference_and_differ);
  TSR_RUN(rope_partial_rotary_leaves_tail_bitwise_unchanged);
  TSR_RUN(rope_freq_factors_divide_each_pair_angle);
  TSR_RUN(rope_at_position_one_million_stays_accurate);
  TSR_RUN(rope_at_position_zero_is_identity);
  TSR_RUN(builder_rejects_bad_rope_softmax_and_norm_shapes);
  tsr_backend_free(g_be[0]);
  tsr_backend_free(g_be[1]);
  return TSR_TEST_EXIT();
}
