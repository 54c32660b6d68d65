/*
** The CUDA backend's element decoders and block quantizers (cuda_quant.cuh),
** compiled for the host and run on the CPU against core/graph/quant.c: every
** readable type decodes to exactly the cpu's values, every writable block
** type encodes to exactly the cpu's bytes. The layouts are thus checked
** where CI runs (no GPU there); tests/gpu/gpu_op_parity checks the same
** through the kernels on a GPU.
*/
#include <string.h>

extern "C" {
#include "graph/dtype.h"
#include "harness.h"
}
#include "tessera/cuda_quant.cuh"

static const int k_read[] = {T_F32, T_F16, T_BF16, T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1, T_Q8_0,
                             T_Q6_0, T_Q2_K, T_Q3_K, T_Q4_K, T_Q5_K, T_Q6_K, T_Q8_K};
static const int k_write[] = {T_Q8_0, T_Q6_0, T_Q5_1, T_Q5_0, T_Q4_1, T_Q4_0};

enum { N = 1024 };

static void random_values(float *x, int n) {
  for (int i = 0; i < n; i++) x[i] = tsr_test_normal() * (i % 97 == 0 ? 8.0f : 1.0f);
  for (int i = 0; i < 32; i++) x[i] = 0.0f;          /* an all-zero block */
  for (int i = 32; i < 64; i++) x[i] = (float)(i % 5) - 2.0f; /* ties on the grid */
}

static void block_sizes_match_the_core(void) {
  for (int t : k_read) {
    CHECK(cu_block_size(t) == tsr_dtype_block_size((enum tsr_dtype)t));
    CHECK(cu_block_bytes(t) == (int)tsr_dtype_type_size((enum tsr_dtype)t));
  }
}

static void every_readable_type_decodes_like_the_cpu(void) {
  static float x[N], ref[N];
  static char buf[N * 4];
  for (int t : k_read) {
    random_values(x, N);
    CHECK_OK(tsr_dtype_from_f32((enum tsr_dtype)t, x, buf, N));
    CHECK_OK(tsr_dtype_to_f32((enum tsr_dtype)t, buf, ref, N));
    const int64_t nb0 = cu_block_size(t) == 1 ? cu_block_bytes(t) : 0;
    int bad = 0;
    for (int i = 0; i < N; i++) {
      const float v = dq_rt(t, buf, i, nb0);
      if (memcmp(&v, &ref[i], 4) != 0) bad++;
    }
    CHECK_MSG(bad == 0, "%s: %d of %d values differ", tsr_dtype_name((enum tsr_dtype)t), bad, N);
  }
}

/* The gemv's quarter-chunk decoder gives dq's values (themselves the cpu's, above) for
** every block type, every quarter, with and without q4_K's 4-byte loads. */
template <int T>
static void part8_matches(const char *row, int64_t n) {
  for (int wide = 0; wide < 2; wide++)
    for (int64_t c = 0; c < n / 32; c++)
      for (int p = 0; p < 4; p++) {
        float w[8];
        dq_part8<T>(reinterpret_cast<const uint8_t *>(row), c, p, w, wide);
        for (int e = 0; e < 8; e++) {
          const float want = dq<T>(reinterpret_cast<const uint8_t *>(row), 32 * c + 8 * p + e);
          CHECK_MSG(memcmp(&w[e], &want, 4) == 0, "type %d chunk %lld quarter %d weight %d: "
                    "%g, dq %g", T, (long long)c, p, e, w[e], want);
        }
      }
}

static void gemv_quarter_decoder_matches_dq(void) {
  static float x[N];
  static char buf[N * 4] __attribute__((aligned(16)));
  for (int t : k_read) {
    if (t == T_F32 || t == T_F16 || t == T_BF16) continue;
    random_values(x, N);
    CHECK_OK(tsr_dtype_from_f32((enum tsr_dtype)t, x, buf, N));
#define PART8(T) \
  case T: part8_matches<T>(buf, N); break;
    switch (t) {
      PART8(T_Q4_0) PART8(T_Q4_1) PART8(T_Q5_0) PART8(T_Q5_1) PART8(T_Q8_0) PART8(T_Q6_0)
      PART8(T_Q2_K) PART8(T_Q3_K) PART8(T_Q4_K) PART8(T_Q5_K) PART8(T_Q6_K) PART8(T_Q8_K)
    default: CHECK_MSG(false, "type %d has no case here", t);
    }
#undef PART8
  }
}

/* Values of the attention tiles' f16 decoder whose bits are not dq's value rounded to f16. */
template <int T>
static int quarter_h_mismatches(const char *buf, int n) {
  int bad = 0;
  for (int blk = 0; blk < n / 32; blk++) {
    const uint8_t *b = reinterpret_cast<const uint8_t *>(buf) + blk * cu_block_bytes(T);
    for (int p = 0; p < 4; p++) {
      const uint4 h = tsr_dq_quarter_h<T>(b, p);
      const uint32_t w[4] = {h.x, h.y, h.z, h.w};
      for (int i = 0; i < 8; i++)
        bad += (uint16_t)(w[i / 2] >> (16 * (i % 2))) !=
               __half_as_ushort(__float2half_rn(dq<T>(b, 8 * p + i)));
    }
  }
  return bad;
}

/* every value, codes at both ends (-128 and 127, nibbles 0 and 15) and scales of every
** magnitude (subnormal and large, negative) among them */
static void attention_f16_decoder_rounds_dq(void) {
  static float x[N];
  static char buf[N * 2];
  for (int t : {T_Q8_0, T_Q4_0}) {
    random_values(x, N);
    x[100] = -1e-6f, x[101] = 3e4f, x[102] = -3e4f;
    CHECK_OK(tsr_dtype_from_f32((enum tsr_dtype)t, x, buf, N));
    uint8_t *b5 = reinterpret_cast<uint8_t *>(buf) + 5 * cu_block_bytes(t);
    b5[2] = t == T_Q8_0 ? 0x80 : 0x0f, b5[3] = t == T_Q8_0 ? 0x7f : 0xf0;
    const int bad = t == T_Q8_0 ? quarter_h_mismatches<T_Q8_0>(buf, N)
                                : quarter_h_mismatches<T_Q4_0>(buf, N);
    CHECK_MSG(bad == 0, "%s: %d of %d values differ", tsr_dtype_name((enum tsr_dtype)t), bad, N);
  }
}

static void every_writable_block_type_encodes_the_cpus_bytes(void) {
  static float x[N];
  static uint8_t ours[N * 2], ref[N * 2];
  for (int t : k_write) {
    random_values(x, N);
    CHECK_OK(tsr_dtype_from_f32((enum tsr_dtype)t, x, ref, N));
    for (int b = 0; b < N / 32; b++) quant_block32(t, x + 32 * b, ours + b * cu_block_bytes(t));
    const size_t bytes = (size_t)(N / 32) * cu_block_bytes(t);
    CHECK_MSG(memcmp(ours, ref, bytes) == 0, "%s: blocks differ from core/graph/quant.c",
              tsr_dtype_name((enum tsr_dtype)t));
  }
}

static void half_and_bf16_round_like_the_cpu(void) {
  const float special[] = {0.0f, -0.0f, 65504.0f, 65520.0f, 1e-8f, 6.1e-5f, 1.0f + 1.0f / 2048,
                           1.0f + 3.0f / 2048, INFINITY, -INFINITY, 3.0e38f, 1.0f + 1.0f / 256};
  int bad = 0;
  for (int i = 0; i < 20000; i++) {
    const float f = i < 12 ? special[i] : tsr_test_normal() * powf(2.0f, (float)(i % 40 - 20));
    char h[2], b[2];
    st_plain(T_F16, h, f);
    st_plain(T_BF16, b, f);
    uint16_t hr = tsr_f32_to_f16(f), br = tsr_f32_to_bf16(f);
    if (memcmp(h, &hr, 2) || memcmp(b, &br, 2)) bad++;
  }
  CHECK_MSG(bad == 0, "%d values round differently", bad);
}

/* The block scales' f16 is integer rounding of its own (st_h, f_h16: a cvt
** there was miscompiled on the device), so it must be the cpu's bit for bit,
** NaN, infinities, overflow and subnormals included. */
static void block_scale_halves_are_the_cpus(void) {
  const float special[] = {0.0f, -0.0f, 65504.0f, 65519.0f, 65520.0f, 1e-8f, -3e-8f, 6.1e-5f,
                           5.96e-8f, 2.98e-8f, 8.9e-8f, 1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048,
                           INFINITY, -INFINITY, NAN, -NAN, 3.0e38f, 0.0098f, -0.01619f};
  const int n_special = (int)(sizeof special / sizeof *special);
  int bad = 0;
  for (int i = 0; i < 200000; i++) {
    float f = i < n_special ? special[i] : tsr_test_normal() * powf(2.0f, (float)(i % 60 - 30));
    if (i >= n_special && i % 7 == 0) { /* every bit pattern region, NaN payloads too */
      const uint32_t u = (uint32_t)tsr_test_next();
      memcpy(&f, &u, 4);
    }
    uint8_t h[2];
    st_h(h, f);
    const uint16_t ref = tsr_f32_to_f16(f);
    if (h[0] != (ref & 0xff) || h[1] != ref >> 8) bad++;
  }
  CHECK_MSG(bad == 0, "%d values round differently", bad);
}

/* The q8 path's x codes: within half a step of x, in [-127, 127], summed right;
** a NaN makes its block's scale NaN. */
static void x8_codes_round_x(void) {
  static float x[N];
  random_values(x, N);
  for (int c = 0; c < N / 32; c++) {
    const float *xb = x + 32 * c;
    int8_t q[32];
    int sum, want_sum = 0;
    const float d = x8_block(xb, q, &sum);
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
    CHECK_MSG(d == amax / 127.0f, "block %d: scale %g for max %g", c, d, amax);
    for (int j = 0; j < 32; j++) {
      want_sum += q[j];
      CHECK_MSG(q[j] >= -127 && fabsf((float)q[j] * d - xb[j]) <= 0.5f * d * (1 + 1e-6f),
                "block %d value %d: %g coded %d at step %g", c, j, xb[j], q[j], d);
    }
    CHECK(sum == want_sum);
  }
  float with_nan[32] = {1.0f, NAN, -3.0f};
  int8_t q[32];
  int sum;
  CHECK(isnan(x8_block(with_nan, q, &sum)));
  /* a block so small that 1 / scale overflows codes as zeros, not as x times infinity */
  float tiny[32];
  for (int j = 0; j < 32; j++) tiny[j] = (j - 16) * 1e-39f;
  const float d = x8_block(tiny, q, &sum);
  int zeros = 0;
  for (int j = 0; j < 32; j++) zeros += q[j] == 0;
  CHECK_MSG(d > 0.0f && zeros == 32 && sum == 0, "scale %g, %d zero codes, sum %d", d, zeros, sum);
}

/* Each supported chunk dotted in integers equals the dot of dq's weights (the
** cpu's, above) with the x codes times their scale, to f32 rounding; every chunk of
** a row, so chunks at every byte offset a row of blocks has. */
template <int T>
static void x8_dot_matches(const char *row, const float *x, int64_t n) {
  for (int64_t c = 0; c < n / 32; c++) {
    int8_t q[32] __attribute__((aligned(4)));
    int sum, words[8];
    const float d = x8_block(x + 32 * c, q, &sum);
    memcpy(words, q, sizeof words);
    struct x8_chunk w = {};
    x8_decode<T>(reinterpret_cast<const uint8_t *>(row), c, &w);
    const float got = x8_dot<T>(&w, words, d, sum);
    double want = 0, mag = 0;
    for (int e = 0; e < 32; e++) {
      const double we = dq<T>(reinterpret_cast<const uint8_t *>(row), 32 * c + e);
      want += we * ((double)d * q[e]);
      mag += (fabs(we) + 2 * fabs((double)w.m)) * fabs((double)d * q[e]);
    }
    CHECK_MSG(fabs(got - want) <= 1e-6 * mag, "type %d chunk %lld: %.9g, want %.9g (mag %g)", T,
              (long long)c, got, want, mag);
  }
}

static void x8_chunk_dots_match_dq(void) {
  static float w[N], x[N];
  static char buf[N * 4] __attribute__((aligned(16)));
  int n_types = 0;
  for (int t : k_read) {
    if (!x8_supported(t)) continue;
    random_values(w, N);
    random_values(x, N);
    for (int i = 0; i < N; i++) x[i] = x[(i * 7 + 3) % N] * 0.5f; /* not w's pattern */
    CHECK_OK(tsr_dtype_from_f32((enum tsr_dtype)t, w, buf, N));
    n_types++;
    switch (t) {
    case T_Q4_0: x8_dot_matches<T_Q4_0>(buf, x, N); break;
    case T_Q8_0: x8_dot_matches<T_Q8_0>(buf, x, N); break;
    case T_Q4_K: x8_dot_matches<T_Q4_K>(buf, x, N); break;
    case T_Q6_K: x8_dot_matches<T_Q6_K>(buf, x, N); break;
    default: CHECK_MSG(false, "type %d has no case here", t);
    }
  }
  CHECK(n_types == 4);
  /* the byte helpers against their definitions */
  CHECK(dot4_i8((int)0x80ff017fu, (int)0x7f02ff80u, 5) == 5 - 128 * 127 - 2 - 1 - 127 * 128);
  CHECK(sub4_u8(0x003f0810u, 0x20202020u) == (int)0xe01fe8f0u);
}

/* The kernels' index helper against / and %, powers of two and not. */
static void divmod_matches_division(void) {
  int bad = 0;
  for (int n = 1; n <= 600; n++)
    for (int i = 0; i < 40000; i += 1 + i / 1000) {
      int r;
      const int q = cu_divmod(i, n, &r);
      bad += q != i / n || r != i % n;
    }
  CHECK_MSG(bad == 0, "%d quotients or remainders differ", bad);
}

int main(void) {
  TSR_RUN(block_sizes_match_the_core);
  TSR_RUN(every_readable_type_decodes_like_the_cpu);
  TSR_RUN(gemv_quarter_decoder_matches_dq);
  TSR_RUN(attention_f16_decoder_rounds_dq);
  TSR_RUN(every_writable_block_type_encodes_the_cpus_bytes);
  TSR_RUN(half_and_bf16_round_like_the_cpu);
  TSR_RUN(block_scale_halves_are_the_cpus);
  TSR_RUN(x8_codes_round_x);
  TSR_RUN(x8_chunk_dots_match_dq);
  TSR_RUN(divmod_matches_division);
  return TSR_TEST_EXIT();
}
