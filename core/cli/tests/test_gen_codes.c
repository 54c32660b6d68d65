/*
** gen-model --random-codes (gen_fill_codes): each supported block type's random codes
** decode, through the core's own dequantizers, to values of about the tensor's std and
** mean 0, with block scales that differ; rows are a function of (seed, name, row).
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../gen_model.h"
#include "harness.h"

enum { K = 4096, ROWS = 32 };

static void codes_decode_to_the_requested_spread(void) {
  const enum tsr_dtype types[] = {TSR_Q4_0, TSR_Q8_0, TSR_Q4_K, TSR_Q6_K};
  static unsigned char row[K * 2];
  static float x[K];
  for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
    struct gen_tensor t = {.dtype = types[i], .n_dims = 2, .ne = {K, ROWS}, .fill = GEN_NORMAL,
                           .std = 0.02f};
    snprintf(t.name, sizeof t.name, "blk.0.ffn_up.weight");
    CHECK(gen_codes_supported(t.dtype));
    double sum = 0, sum2 = 0;
    int finite = 1;
    for (int r = 0; r < ROWS; r++) {
      gen_fill_codes(&t, 7, r, row);
      CHECK_OK(tsr_dtype_to_f32(t.dtype, row, x, K));
      for (int k = 0; k < K; k++) finite &= isfinite(x[k]), sum += x[k], sum2 += (double)x[k] * x[k];
    }
    const double n = (double)K * ROWS, mean = sum / n, sd = sqrt(sum2 / n - mean * mean);
    printf("  %-5s mean %+.2e sd %.4f (asked 0.0200)\n", tsr_dtype_name(t.dtype), mean, sd);
    CHECK(finite);
    CHECK_MSG(fabs(mean) < 0.1 * t.std, "%s: mean %g", tsr_dtype_name(t.dtype), mean);
    CHECK_MSG(fabs(sd / t.std - 1) < 0.1, "%s: sd %g", tsr_dtype_name(t.dtype), sd);
    /* block scales differ: the first two blocks' largest magnitudes are not all alike */
    const int bs = (int)tsr_dtype_block_size(t.dtype);
    float m[4] = {0};
    for (int b = 0; b < 4; b++)
      for (int k = 0; k < bs; k++) m[b] = fmaxf(m[b], fabsf(x[b * bs + k]));
    CHECK(!(m[0] == m[1] && m[1] == m[2] && m[2] == m[3]));
  }
}

static void rows_are_seeded_by_seed_name_and_row(void) {
  static unsigned char a[K], b[K];
  const size_t n = tsr_dtype_row_size(TSR_Q4_K, K);
  struct gen_tensor t = {.dtype = TSR_Q4_K, .n_dims = 2, .ne = {K, 4}, .fill = GEN_NORMAL,
                         .std = 0.02f};
  snprintf(t.name, sizeof t.name, "blk.1.attn_q.weight");
  gen_fill_codes(&t, 1, 3, a);
  gen_fill_codes(&t, 1, 3, b);
  CHECK(!memcmp(a, b, n));
  gen_fill_codes(&t, 1, 2, b);
  CHECK(memcmp(a, b, n));
  gen_fill_codes(&t, 2, 3, b);
  CHECK(memcmp(a, b, n));
  snprintf(t.name, sizeof t.name, "blk.1.attn_k.weight");
  gen_fill_codes(&t, 1, 3, b);
  CHECK(memcmp(a, b, n));
  CHECK(!gen_codes_supported(TSR_F16) && !gen_codes_supported(TSR_Q5_0));
}

int main(void) {
  TSR_RUN(codes_decode_to_the_requested_spread);
  TSR_RUN(rows_are_seeded_by_seed_name_and_row);
  return TSR_TEST_EXIT();
}
