/* The integer dots against 8-bit vectors (core/cpu/vec_q8.c): the quantizer and every
** type's kernel equal the portable reference bit for bit, a column alone or beside others,
** and each dot is within the error that quantizing the vector can make. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/vec.h"
#include "graph/dtype.h"
#include "harness.h"

static const enum tsr_dtype g_types[] = {TSR_Q8_0, TSR_Q4_0, TSR_Q4_1, TSR_Q5_0, TSR_Q5_1,
                                         TSR_Q2_K, TSR_Q3_K, TSR_Q4_K, TSR_Q5_K, TSR_Q6_K};
#define N_TYPES (sizeof g_types / sizeof g_types[0])

/* n values, block by block with scales from 1e-4 to 1e3 and a few exact zeros */
static void fill(float *x, int64_t n) {
  for (int64_t b = 0; b < n / 32; b++) {
    const float s = powf(10.0f, (float)(b % 8) - 4.0f) * (1.0f + 0.1f * (float)(b % 3));
    for (int i = 0; i < 32; i++) x[32 * b + i] = (b % 11 == 5) ? 0.0f : s * tsr_test_normal();
  }
}

static void test_quantizer_equals_reference(void) {
  enum { N = 32 * 64 };
  float x[N];
  struct tsr_q8_act a[N / 32], r[N / 32];
  tsr_test_seed(7);
  fill(x, N);
  x[3 * 32 + 4] = NAN, x[9 * 32] = INFINITY, x[10 * 32 + 31] = -INFINITY;
  x[12 * 32 + 1] = 3.0e38f, x[13 * 32 + 2] = 1e-38f; /* huge and subnormal-range scales */
  for (int i = 0; i < 32; i++) x[14 * 32 + i] = (i % 2 ? 1e-38f : -2e-39f); /* 127/amax overflows */
  tsr_vec_quantize_q8(x, N, a);
  tsr_vec_quantize_q8_ref(x, N, r);
  CHECK_MSG(memcmp(a, r, sizeof a) == 0, "the quantizer differs from its reference");
  for (int b = 0; b < N / 32; b++) {
    int32_t sum = 0;
    for (int i = 0; i < 32; i++) {
      sum += r[b].q[i];
      CHECK_MSG(r[b].q[i] != -128, "block %d holds -128", b);
    }
    CHECK_MSG(r[b].sumf == (float)sum, "block %d: sum %g, codes sum to %d", b, r[b].sumf, sum);
  }
  CHECK_MSG(isnan(r[3].d) && isnan(r[9].d) && isnan(r[10].d), "non-finite blocks: d NaN");
  CHECK_MSG(r[5].d == 0.0f && r[5].sumf == 0.0f, "an all-zero block is codes 0, d 0");
  for (int i = 0; i < 32; i++) CHECK_MSG(r[14].q[i] == 0, "a block of 1e-38 codes %d", r[14].q[i]);
  /* a finite block round-trips within half a step */
  for (int i = 0; i < 32; i++) {
    const float back = r[1].d * (float)r[1].q[i];
    CHECK_MSG(fabsf(back - x[32 + i]) <= 0.5001f * r[1].d, "value %d: %g back as %g", i,
              x[32 + i], back);
  }
}

static const char *const g_isa_names[TSR_Q8_ISA_COUNT] = {"reference", "avx2", "avx512-vnni"};

/* Every instruction set this machine has, every type: the result of one row and column equals
** the reference's bits wherever it stands among 1..3 rows and 1..8 columns (other rows and
** vectors beside it), and lies within the error quantizing the vector can make. */
static void test_kernels_equal_reference_and_bound(void) {
  static const int64_t lens[] = {256, 768, 4096};
  enum { MAX_ROWS = 7 };
  for (int isa = 0; isa < TSR_Q8_ISA_COUNT; isa++) {
    if (!tsr_vec_dot_q8_isa(TSR_Q8_0, (enum tsr_q8_isa)isa)) {
      printf("  %s: not on this machine, not checked\n", g_isa_names[isa]);
      continue;
    }
    printf("  %s: checked%s\n", g_isa_names[isa],
           isa == TSR_Q8_ISA_VNNI ? ", rows as stored and expanded" : "");
    CHECK_MSG(isa != TSR_Q8_ISA_VNNI ||
                  (tsr_vec_q8_expander(TSR_Q4_K) && tsr_vec_dot_q8x(TSR_Q4_K)),
              "vnni without the expanded rows' kernel");
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
      const int64_t n = lens[li];
      float *x = malloc((size_t)n * sizeof *x), *wf = malloc((size_t)n * sizeof *wf);
      float *wd = malloc((size_t)n * sizeof *wd);
      struct tsr_q8_act *a = malloc((size_t)(n / 32) * sizeof *a);
      struct tsr_q8_act *other = malloc((size_t)(n / 32) * sizeof *other);
      char *w = malloc((size_t)n * 2), *w_other = malloc((size_t)n * 2);
      tsr_test_seed(100 + (uint64_t)li);
      for (size_t t = 0; t < N_TYPES; t++) {
        const struct tsr_dtype_traits *tr = tsr_dtype_traits((int)g_types[t]);
        const tsr_vec_dot_q8_fn k = tsr_vec_dot_q8_isa((int)g_types[t], (enum tsr_q8_isa)isa);
        CHECK_MSG(k != NULL, "%s has no %s kernel", tr->name, g_isa_names[isa]);
        if (!k) continue;
        for (int trial = 0; trial < 4; trial++) {
          for (int64_t i = 0; i < n; i++) wf[i] = tsr_test_normal();
          tr->from_f32(wf, w_other, n);
          for (int64_t i = 0; i < n; i++) wf[i] = tsr_test_normal();
          fill(x, n);
          tsr_vec_quantize_q8(x, n, other);
          fill(x, n);
          tr->from_f32(wf, w, n);
          tr->to_f32(w, wd, n);
          tsr_vec_quantize_q8(x, n, a);
          const float ref = tsr_vec_dot_q8_ref((int)g_types[t], w, a, n);
          for (int nr = 1; nr <= MAX_ROWS; nr++)
            for (int nc = 1; nc <= TSR_Q8_COLS; nc++) {
              const int at_r = trial % nr, at_c = (trial + nr) % nc;
              const void *rows[MAX_ROWS];
              const struct tsr_q8_act *cols[TSR_Q8_COLS];
              for (int r = 0; r < nr; r++) rows[r] = r == at_r ? (void *)w : (void *)w_other;
              for (int c = 0; c < nc; c++) cols[c] = c == at_c ? a : other;
              float outs[MAX_ROWS * TSR_Q8_COLS];
              k(rows, nr, cols, nc, n, outs);
              const float got = outs[at_r * nc + at_c];
              CHECK_MSG(memcmp(&got, &ref, sizeof got) == 0,
                        "%s %s n=%lld, row %d of %d, column %d of %d: kernel %.9g, reference %.9g",
                        g_isa_names[isa], tr->name, (long long)n, at_r, nr, at_c, nc, got, ref);
              if (isa != TSR_Q8_ISA_VNNI) continue;
              /* the same rows expanded once (prefill's tiles) */
              struct tsr_q8_xblock *xw = malloc((size_t)(n / 32) * sizeof *xw);
              struct tsr_q8_xblock *xo = malloc((size_t)(n / 32) * sizeof *xo);
              tsr_vec_q8_expander((int)g_types[t])(w, n, xw);
              tsr_vec_q8_expander((int)g_types[t])(w_other, n, xo);
              for (int r = 0; r < nr; r++) rows[r] = r == at_r ? (void *)xw : (void *)xo;
              tsr_vec_dot_q8x((int)g_types[t])(rows, nr, cols, nc, n, outs);
              CHECK_MSG(memcmp(&outs[at_r * nc + at_c], &ref, sizeof ref) == 0,
                        "%s expanded n=%lld, row %d of %d, column %d of %d: %.9g, reference "
                        "%.9g", tr->name, (long long)n, at_r, nr, at_c, nc, outs[at_r * nc + at_c],
                        ref);
              free(xw), free(xo);
            }
          /* exact: the dequantized row times x; the vector's codes are off by at most half
          ** a step (d / 2) each, plus f32 rounding of the sums */
          double exact = 0, bound = 0, mag = 0;
          for (int64_t i = 0; i < n; i++) {
            exact += (double)wd[i] * x[i];
            bound += fabs((double)wd[i]) * 0.5 * a[i / 32].d;
            mag += fabs((double)wd[i] * x[i]);
          }
          bound = bound * 1.0001 + 1e-5 * mag;
          CHECK_MSG(fabs(ref - exact) <= bound, "%s n=%lld: %.9g, exact %.9g, bound %.3g",
                    tr->name, (long long)n, ref, exact, bound);
        }
      }
      free(x), free(wf), free(wd), free(a), free(other), free(w), free(w_other);
    }
  }
}

/* The extremes of every code meet the extremes of the vector's: the 16-bit pair sums of AVX2
** and the biased codes of VNNI stay exact (weights of one sign at full scale, a vector of
** +-127 codes of both signs) */
static void test_kernels_exact_at_extreme_codes(void) {
  enum { N = 256 };
  float x[N], wf[N];
  struct tsr_q8_act a[N / 32];
  unsigned char w[N * 2];
  for (int i = 0; i < N; i++) x[i] = (i / 4) % 2 ? -1.0f : 1.0f;
  tsr_vec_quantize_q8(x, N, a);
  for (int sign = -1; sign <= 1; sign += 2)
    for (size_t t = 0; t < N_TYPES; t++) {
      const struct tsr_dtype_traits *tr = tsr_dtype_traits((int)g_types[t]);
      for (int i = 0; i < N; i++) wf[i] = (float)sign * (i % 2 ? 1.0f : 0.999f);
      tr->from_f32(wf, w, N);
      const float ref = tsr_vec_dot_q8_ref((int)g_types[t], w, a, N);
      for (int isa = 1; isa < TSR_Q8_ISA_COUNT; isa++) {
        const tsr_vec_dot_q8_fn k = tsr_vec_dot_q8_isa((int)g_types[t], (enum tsr_q8_isa)isa);
        if (!k) continue;
        float got[2 * TSR_Q8_COLS];
        const struct tsr_q8_act *cols[TSR_Q8_COLS] = {a, a, a, a, a, a, a, a};
        k((const void *const[]){w, w}, 2, cols, TSR_Q8_COLS, N, got);
        for (int i = 0; i < 2 * TSR_Q8_COLS; i++)
          CHECK_MSG(memcmp(&got[i], &ref, sizeof ref) == 0,
                    "%s %s sign %d: %.9g, reference %.9g", g_isa_names[isa], tr->name, sign,
                    got[i], ref);
      }
    }
}

static void test_non_finite_vector_gives_nan(void) {
  enum { N = 256 };
  float x[N], wf[N];
  struct tsr_q8_act a[N / 32];
  unsigned char w[N * 2];
  tsr_test_seed(3);
  for (int i = 0; i < N; i++) x[i] = tsr_test_normal(), wf[i] = tsr_test_normal();
  x[77] = INFINITY;
  tsr_vec_quantize_q8(x, N, a);
  for (size_t t = 0; t < N_TYPES; t++) {
    tsr_dtype_traits((int)g_types[t])->from_f32(wf, w, N);
    float got;
    tsr_vec_dot_q8((int)g_types[t])((const void *const[]){w}, 1,
                                    (const struct tsr_q8_act *const[]){a}, 1, N, &got);
    CHECK_MSG(isnan(got), "%s: an infinity in the vector gave %g", tsr_dtype_name(g_types[t]),
              got);
  }
}

static void test_other_types_have_no_kernel(void) {
  CHECK(tsr_vec_dot_q8(TSR_F32) == NULL && tsr_vec_dot_q8(TSR_F16) == NULL);
  CHECK(tsr_vec_dot_q8(TSR_BF16) == NULL && tsr_vec_dot_q8(TSR_Q8_K) == NULL);
}

int main(void) {
  TSR_RUN(test_quantizer_equals_reference);
  TSR_RUN(test_kernels_equal_reference_and_bound);
  TSR_RUN(test_kernels_exact_at_extreme_codes);
  TSR_RUN(test_non_finite_vector_gives_nan);
  TSR_RUN(test_other_types_have_no_kernel);
  return TSR_TEST_EXIT();
}
