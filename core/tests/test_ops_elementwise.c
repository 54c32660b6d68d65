/* CPU kernels add, mul, scale, unary, glu and softcap against double references. */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "cpu/vec.h"
#include "layout_test_util.h"

/* ---- add, mul ----------------------------------------------------------- */

static void check_binary(bool mul, const int64_t ane[4], const int64_t bne[4], enum layout la,
                         enum layout lb) {
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *a = input(g, ane, la), *b = input(g, bne, lb);
  struct tsr_tensor *y = mul ? tsr_mul(g, a, b) : tsr_add(g, a, b);
  tsr_graph_mark_output(y);
  void *arena = NULL;
  CHECK_MSG(y != NULL, "build: %s", tsr_error_message());
  if (y && alloc_graph(g, &arena)) {
    tsr_test_fill_normal(a, 1.0f);
    tsr_test_fill_normal(b, 1.0f);
    if (run_threads(g, y)) {
      double *want = malloc((size_t)tsr_tensor_nelements(y) * sizeof *want), *w = want;
      FOR_EACH(y) {
        double x = tsr_test_get(a, i0, i1, i2, i3);
        double z = tsr_test_get(b, i0 % bne[0], i1 % bne[1], i2 % bne[2], i3 % bne[3]);
        *w++ = mul ? x * z : x + z;
      }
      char what[160];
      snprintf(what, sizeof what, "%s a[%lld,%lld,%lld,%lld] %s, b[%lld,%lld,%lld,%lld] %s",
               mul ? "mul" : "add", (long long)ane[0], (long long)ane[1], (long long)ane[2],
               (long long)ane[3], layout_name(la), (long long)bne[0], (long long)bne[1],
               (long long)bne[2], (long long)bne[3], layout_name(lb));
      expect_close(y, want, 1e-6, 1e-6, what);
      free(want);
    }
  }
  free(arena);
  tsr_graph_free(g);
}

static const int64_t k_bcast[][2][4] = {
    {{7, 5, 3, 2}, {7, 5, 3, 2}}, /* same shape */
    {{7, 5, 3, 2}, {7, 1, 1, 1}}, /* one row over all rows (bias, norm weight) */
    {{7, 5, 3, 2}, {1, 5, 1, 2}}, /* one value per row */
    {{7, 5, 3, 2}, {1, 1, 1, 1}}, /* a scalar */
    {{12, 5, 3, 2}, {4, 1, 3, 1}}, /* b's row repeats three times along a's */
    {{13, 1, 1, 1}, {13, 1, 1, 1}}, /* a single odd row */
    {{33, 4, 1, 1}, {33, 4, 1, 1}},
};

static void add_and_mul_broadcast_b_over_a(void) {
  for (size_t s = 0; s < sizeof k_bcast / sizeof k_bcast[0]; s++)
    for (int mul = 0; mul < 2; mul++) check_binary(mul, k_bcast[s][0], k_bcast[s][1], 0, 0);
}

static void add_and_mul_read_strided_views(void) {
  for (int la = 0; la < LAYOUT_COUNT; la++)
    for (int lb = 0; lb < LAYOUT_COUNT; lb++)
      for (int mul = 0; mul < 2; mul++) {
        check_binary(mul, k_bcast[0][0], k_bcast[0][1], la, lb);
        check_binary(mul, k_bcast[4][0], k_bcast[4][1], la, lb);
        check_binary(mul, k_bcast[2][0], k_bcast[2][1], la, lb);
      }
}

static void views_in_these_tests_are_not_contiguous(void) {
  /* otherwise the strided tests above would prove nothing */
  struct tsr_graph *g = tsr_graph_new(16);
  const int64_t ne[4] = {7, 5, 3, 2};
  for (int l = 1; l < LAYOUT_COUNT; l++) {
    struct tsr_tensor *t = input(g, ne, l);
    CHECK(t != NULL && !tsr_tensor_is_contiguous(t));
  }
  tsr_graph_free(g);
}

/* ---- scale, unary, softcap ---------------------------------------------- */

static double ref_unary(enum tsr_unary_op op, double x) {
  switch (op) {
  case TSR_UNARY_GELU:
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
  case TSR_UNARY_SILU: return x / (1.0 + exp(-x));
  case TSR_UNARY_SIGMOID: return 1.0 / (1.0 + exp(-x));
  case TSR_UNARY_SOFTPLUS: return log1p(exp(x));
  case TSR_UNARY_TANH: return tanh(x);
  case TSR_UNARY_RELU: return x > 0 ? x : 0;
  case TSR_UNARY_NEG: return -x;
  case TSR_UNARY_EXP: return exp(x);
  case TSR_UNARY_COUNT: break;
  }
  return NAN;
}

/* Extremes that break naive formulas (exp overflow, 0*inf); the rest normal. */
static const float k_extremes[] = {-100.0f, 80.0f, -30.0f, 30.0f, -20.5f, 20.5f, 0.0f, -1e-3f};

static void fill_with_extremes(struct tsr_tensor *t) {
  int k = 0;
  FOR_EACH(t) {
    float v = k < 8 ? k_extremes[k] : 4.0f * tsr_test_normal();
    tsr_test_set(t, i0, i1, i2, i3, v);
    k++;
  }
}

enum map_kind { MAP_SCALE, MAP_SOFTCAP, MAP_UNARY };

static void check_map(enum map_kind kind, int op, float param, const int64_t ne[4],
                      enum layout l) {
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *a = input(g, ne, l), *y = NULL;
  switch (kind) {
  case MAP_SCALE: y = tsr_scale(g, a, param); break;
  case MAP_SOFTCAP: y = tsr_softcap(g, a, param); break;
  case MAP_UNARY: y = tsr_unary(g, a, (enum tsr_unary_op)op); break;
  }
  tsr_graph_mark_output(y);
  void *arena = NULL;
  CHECK_MSG(y != NULL, "build: %s", tsr_error_message());
  if (y && alloc_graph(g, &arena)) {
    fill_with_extremes(a);
    if (run_threads(g, y)) {
      double *want = malloc((size_t)tsr_tensor_nelements(y) * sizeof *want), *w = want;
      FOR_EACH(y) {
        double x = tsr_test_get(a, i0, i1, i2, i3);
        switch (kind) {
        case MAP_SCALE: *w++ = x * param; break;
        case MAP_SOFTCAP: *w++ = param * tanh(x / param); break;
        case MAP_UNARY: *w++ = ref_unary((enum tsr_unary_op)op, x); break;
        }
      }
      char what[96];
      snprintf(what, sizeof what, "%s %s, %s",
               kind == MAP_UNARY ? tsr_unary_name(op) : kind == MAP_SCALE ? "scale" : "softcap",
               layout_name(l), ne[1] == 1 ? "one row" : "many rows");
      expect_close(y, want, 2e-6, 2e-6, what);
      free(want);
    }
  }
  free(arena);
  tsr_graph_free(g);
}

static const int64_t k_shape[4] = {19, 3, 2, 2}, k_row[4] = {37, 1, 1, 1};

static void unary_ops_match_double_reference_including_extremes(void) {
  for (int op = 0; op < TSR_UNARY_COUNT; op++)
    for (int l = 0; l < LAYOUT_COUNT; l++) {
      check_map(MAP_UNARY, op, 0, k_shape, l);
      check_map(MAP_UNARY, op, 0, k_row, l);
    }
}

static void scale_and_softcap_match_reference(void) {
  for (int l = 0; l < LAYOUT_COUNT; l++) {
    check_map(MAP_SCALE, 0, -0.37f, k_shape, l);
    check_map(MAP_SOFTCAP, 0, 30.0f, k_shape, l);
    check_map(MAP_SOFTCAP, 0, 2.5f, k_row, l); /* extremes saturate to +-cap */
  }
}

static void activations_stay_finite_at_extremes(void) {
  /* explicit spot values, so a NaN or an overflow shows by name */
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *a = tsr_new_tensor_1d(g, TSR_F32, 4);
  struct tsr_tensor *sg = tsr_unary(g, a, TSR_UNARY_SIGMOID);
  struct tsr_tensor *sp = tsr_unary(g, a, TSR_UNARY_SOFTPLUS);
  struct tsr_tensor *si = tsr_unary(g, a, TSR_UNARY_SILU);
  struct tsr_tensor *ge = tsr_unary(g, a, TSR_UNARY_GELU);
  tsr_graph_mark_output(sg), tsr_graph_mark_output(sp);
  tsr_graph_mark_output(si), tsr_graph_mark_output(ge);
  void *arena = NULL;
  if (ge && alloc_graph(g, &arena)) {
    const float x[4] = {-1000.0f, 1000.0f, -89.0f, 89.0f};
    memcpy(a->data, x, sizeof x);
    CHECK_OK(tsr_backend_compute(g_be[1], g));
    const float *s = sg->data, *p = sp->data, *l = si->data, *e = ge->data;
    CHECK(s[0] == 0.0f && s[1] == 1.0f && s[3] == 1.0f);
    CHECK(s[2] >= 0.0f && s[2] < 1e-37f);
    CHECK(p[0] == 0.0f && p[1] == 1000.0f && p[3] == 89.0f);
    CHECK(l[0] == 0.0f && l[1] == 1000.0f && l[3] == 89.0f);
    CHECK(e[0] == 0.0f && e[1] == 1000.0f);
    for (int i = 0; i < 4; i++) CHECK(isfinite(s[i]) && isfinite(p[i]) && isfinite(l[i]));
  }
  free(arena);
  tsr_graph_free(g);
}

/* The vector SiLU and GELU (where the machine has them) over a sweep of 200,001 values from
** -95 to 95, each within 4 ulp of the double-precision function (or below 1e-36 where that
** is), then the limits: infinities, NaN, and a row length that is not a multiple of 8 */
static void vector_activations_within_a_few_ulp(void) {
  enum { N = 200001 };
  float *y = malloc(N * sizeof *y), *g = malloc(N * sizeof *g);
  for (int i = 0; i < N; i++) y[i] = g[i] = -95.0f + 190.0f * (float)i / (float)(N - 1);
  if (!tsr_vec_silu_f32(y, N) || !tsr_vec_gelu_f32(g, N)) {
    printf("  no vector path on this machine: expf is used, checked by the other tests\n");
    free(y), free(g);
    return;
  }
  double worst_silu = 0, worst_gelu = 0;
  for (int i = 0; i < N; i++) {
    const float x = -95.0f + 190.0f * (float)i / (float)(N - 1);
    /* GELU in its sigmoid form (1 + tanh(u) cancels in double too for large negative x), from
    ** the argument as f32 rounds it (its rounding, up to 90 x 6e-8, is the formula's, not the
    ** exp's) */
    const float u2 = fmaf(x * x * x, 0.044715f, x) * (2.0f * 0.7978845608028654f);
    const double rs = ref_unary(TSR_UNARY_SILU, x), rg = x / (1.0 + exp(-(double)u2));
    const double es = fabs(y[i] - rs), eg = fabs(g[i] - rg);
    if (fabs(rs) > 1e-36) worst_silu = fmax(worst_silu, es / fabs(rs));
    else CHECK_MSG(es <= 1e-36, "silu(%g) = %g, exact %g", x, y[i], rs);
    if (fabs(rg) > 1e-36) worst_gelu = fmax(worst_gelu, eg / fabs(rg));
    else CHECK_MSG(eg <= 1e-36, "gelu(%g) = %g, exact %g", x, g[i], rg);
  }
  printf("  worst relative error: silu %.2e, gelu %.2e\n", worst_silu, worst_gelu);
  CHECK_MSG(worst_silu < 4.8e-7 && worst_gelu < 4.8e-7, "silu %g, gelu %g", worst_silu,
            worst_gelu);
  float lim[5] = {INFINITY, -INFINITY, NAN, 0.0f, -0.0f};
  tsr_vec_silu_f32(lim, 5);
  CHECK(lim[0] == INFINITY && isnan(lim[1]) && isnan(lim[2]) && lim[3] == 0.0f && lim[4] == 0.0f);
  free(y), free(g);
}

/* ---- glu ---------------------------------------------------------------- */

static double ref_glu(enum tsr_glu_op op, double gate, double up) {
  static const enum tsr_unary_op act[] = {TSR_UNARY_SILU, TSR_UNARY_GELU, TSR_UNARY_RELU};
  return ref_unary(act[op], gate) * up;
}

static void glu_separate_matches_reference(void) {
  for (int op = 0; op < TSR_GLU_COUNT; op++)
    for (int l = 0; l < LAYOUT_COUNT; l++) {
      struct tsr_graph *g = tsr_graph_new(16);
      struct tsr_tensor *gate = input(g, k_shape, l), *up = input(g, k_shape, (l + 1) % 4);
      struct tsr_tensor *y = tsr_glu(g, gate, up, op, false);
      tsr_graph_mark_output(y);
      void *arena = NULL;
      if (y && alloc_graph(g, &arena)) {
        fill_with_extremes(gate);
        tsr_test_fill_normal(up, 1.0f);
        if (run_threads(g, y)) {
          double *want = malloc((size_t)tsr_tensor_nelements(y) * sizeof *want), *w = want;
          FOR_EACH(y) {
            *w++ = ref_glu(op, tsr_test_get(gate, i0, i1, i2, i3),
                           tsr_test_get(up, i0, i1, i2, i3));
          }
          expect_close(y, want, 2e-6, 2e-6, layout_name(l));
          free(want);
        }
      }
      free(arena);
      tsr_graph_free(g);
    }
}

/* The fused form reads [gate | up] (swapped: [up | gate]) from one row; the
** same halves passed as two views must give identical bits. */
static void glu_fused_halves_match_separate_views(void) {
  const int64_t n = 21, rows = 5;
  for (int op = 0; op < TSR_GLU_COUNT; op++)
    for (int swapped = 0; swapped < 2; swapped++)
      for (int l = 0; l < 2; l++) {
        struct tsr_graph *g = tsr_graph_new(16);
        const int64_t ne[4] = {2 * n, rows, 1, 1};
        struct tsr_tensor *a = input(g, ne, l ? LAYOUT_TRANSPOSED : LAYOUT_CONTIG);
        struct tsr_tensor *fused = tsr_glu(g, a, NULL, op, swapped);
        const int64_t hne[2] = {n, rows};
        size_t off_gate = (size_t)(swapped ? n : 0), off_up = (size_t)(swapped ? 0 : n);
        struct tsr_tensor *gate = a ? tsr_view(g, a, 2, hne, a->nb, off_gate * a->nb[0]) : NULL;
        struct tsr_tensor *up = a ? tsr_view(g, a, 2, hne, a->nb, off_up * a->nb[0]) : NULL;
        struct tsr_tensor *split = tsr_glu(g, gate, up, op, false);
        tsr_graph_mark_output(fused), tsr_graph_mark_output(split);
        void *arena = NULL;
        CHECK_MSG(split != NULL, "build: %s", tsr_error_message());
        if (split && alloc_graph(g, &arena)) {
          CHECK(fused->ne[0] == n);
          fill_with_extremes(a);
          if (run_threads(g, fused)) {
            CHECK(memcmp(fused->data, split->data, (size_t)(n * rows) * sizeof(float)) == 0);
            double *want = malloc((size_t)(n * rows) * sizeof *want), *w = want;
            FOR_EACH(fused) *w++ = ref_glu(op, tsr_test_get(a, i0 + (int64_t)off_gate, i1, 0, 0),
                                           tsr_test_get(a, i0 + (int64_t)off_up, i1, 0, 0));
            expect_close(fused, want, 2e-6, 2e-6, swapped ? "fused swapped" : "fused");
            free(want);
          }
        }
        free(arena);
        tsr_graph_free(g);
      }
}

/* ---- builder rejections ------------------------------------------------- */

static void builder_rejects_bad_shapes_with_a_message(void) {
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *a = tsr_new_tensor_2d(g, TSR_F32, 7, 4);
  tsr_error_clear();
  CHECK(tsr_glu(g, a, NULL, TSR_GLU_SWIGLU, false) == NULL);
  CHECK(tsr_graph_status(g) != TSR_OK);
  CHECK_MSG(strstr(tsr_error_message(), "odd") != NULL, "message: %s", tsr_error_message());
  tsr_graph_free(g);

  g = tsr_graph_new(16);
  a = tsr_new_tensor_2d(g, TSR_F32, 6, 4);
  struct tsr_tensor *b = tsr_new_tensor_2d(g, TSR_F32, 4, 4);
  tsr_error_clear();
  CHECK(tsr_add(g, a, b) == NULL);
  CHECK(tsr_graph_status(g) != TSR_OK);
  CHECK_MSG(strstr(tsr_error_message(), "broadcast") != NULL, "message: %s",
            tsr_error_message());
  tsr_graph_free(g);

  g = tsr_graph_new(16);
  a = tsr_new_tensor_2d(g, TSR_F32, 6, 4);
  tsr_error_clear();
  CHECK(tsr_softcap(g, a, 0.0f) == NULL);
  CHECK_MSG(strstr(tsr_error_message(), "cap") != NULL, "message: %s", tsr_error_message());
  tsr_graph_free(g);

  g = tsr_graph_new(16);
  a = tsr_new_tensor_2d(g, TSR_F32, 6, 4);
  b = tsr_new_tensor_2d(g, TSR_F32, 6, 3);
  tsr_error_clear();
  CHECK(tsr_glu(g, a, b, TSR_GLU_GEGLU, false) == NULL);
  CHECK_MSG(strstr(tsr_error_message(), "differ") != NULL, "message: %s", tsr_error_message());
  tsr_graph_free(g);
}

int main(void) {
  tsr_test_seed(1234);
  if (tsr_backend_cpu_new(1, &g_be[0]) != TSR_OK || tsr_backend_cpu_new(3, &g_be[1]) != TSR_OK) {
    fprintf(stderr, "cannot start the cpu backend: %s\n", tsr_error_message());
    return 1;
  }
  TSR_RUN(views_in_these_tests_are_not_contiguous);
  TSR_RUN(add_and_mul_broadcast_b_over_a);
  TSR_RUN(add_and_mul_read_strided_views);
  TSR_RUN(unary_ops_match_double_reference_including_extremes);
  TSR_RUN(scale_and_softcap_match_reference);
  TSR_RUN(activations_stay_finite_at_extremes);
  TSR_RUN(vector_activations_within_a_few_ulp);
  TSR_RUN(glu_separate_matches_reference);
  TSR_RUN(glu_fused_halves_match_separate_views);
  TSR_RUN(builder_rejects_bad_shapes_with_a_message);
  tsr_backend_free(g_be[0]);
  tsr_backend_free(g_be[1]);
  return TSR_TEST_EXIT();
}
