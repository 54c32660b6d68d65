/*
** Dtypes: f16/bf16 conversion, the traits table, and the GGUF block types.
**
** Block layouts are pinned two ways: hand-built blocks whose values were worked out by hand
** from the layout (chosen so a swapped nibble, a wrong bit position or a wrong scale packing
** changes the result), and FNV-1a hashes of what ggml itself produces for a fixed input
** (ggml-org/ggml d99724f, compiled on x86-64 without FMA): the dequantization of random
** blocks, and the bytes its reference quantizers write for a fixed row.
*/
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "graph/dtype.h"
#include "common/error.h"
#include "harness.h"
#include "graph/quant_blocks.h"

typedef void (*dequant_fn)(const void *, float *, int64_t);
typedef void (*quant_fn)(const float *, void *, int64_t);

struct qtype {
  const char *name;
  enum tsr_dtype id;
  int block;
  size_t size;
  quant_fn quant;
  dequant_fn dequant;
};

#define QT(nm, ID, bs, sz) \
  {#nm, ID, bs, sz, tsr_quantize_row_##nm##_ref, tsr_dequantize_row_##nm}
static const struct qtype k_types[] = {
    QT(q4_0, TSR_Q4_0, 32, 18),   QT(q4_1, TSR_Q4_1, 32, 20),   QT(q5_0, TSR_Q5_0, 32, 22),
    QT(q5_1, TSR_Q5_1, 32, 24),   QT(q8_0, TSR_Q8_0, 32, 34),   QT(q2_K, TSR_Q2_K, 256, 84),
    QT(q3_K, TSR_Q3_K, 256, 110), QT(q4_K, TSR_Q4_K, 256, 144), QT(q5_K, TSR_Q5_K, 256, 176),
    QT(q6_K, TSR_Q6_K, 256, 210), QT(q8_K, TSR_Q8_K, 256, 292),
};
#define NTYPES ((int)(sizeof k_types / sizeof k_types[0]))

static uint16_t f32_bits16(float f) { return tsr_f32_to_f16(f); }
static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}
#define FNV_START 0xcbf29ce484222325ull

/* ======================================================================== f16 / bf16 ==== */

static void test_f16_round_trips_every_half_value(void) {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = tsr_f16_to_f32((uint16_t)h);
    uint16_t back = tsr_f32_to_f16(f);
    int is_nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu);
    if (is_nan) {
      /* NaNs stay NaNs of the same sign; quiet ones keep their payload too. */
      if (!isnan(f) || (back & 0x7c00u) != 0x7c00u || !(back & 0x3ffu) ||
          (back & 0x8000u) != (h & 0x8000u) || ((h & 0x200u) && back != h))
        bad++;
    } else if (back != h) {
      bad++;
    }
  }
  CHECK_MSG(bad == 0, "%d half values did not round-trip", bad);
}

/* The f16 row conversions (F16C where the machine has it) equal the scalar ones bit for bit:
** every half value, and 2^24 f32 values spread over every exponent with the edges (ties,
** subnormals, overflow, infinities, NaNs of both signs) */
static void test_f16_rows_equal_scalar_conversions(void) {
  const struct tsr_dtype_traits *tr = tsr_dtype_traits(TSR_F16);
  enum { N = 1 << 16 };
  uint16_t *h = malloc(N * sizeof *h), *back = malloc(N * sizeof *back);
  float *f = malloc(N * sizeof *f);
  int bad = 0;
  for (uint32_t i = 0; i < N; i++) h[i] = (uint16_t)i;
  tr->to_f32(h, f, N);
  for (uint32_t i = 0; i < N; i++) {
    const float want = tsr_f16_to_f32(h[i]);
    bad += memcmp(&f[i], &want, sizeof want) != 0;
  }
  for (uint32_t round = 0; round < 256; round++) {
    for (uint32_t i = 0; i < N; i++) {
      const uint32_t bits = (round << 24) | (i << 8) | (i * 2654435761u >> 24);
      memcpy(&f[i], &bits, sizeof bits);
    }
    tr->from_f32(f, back, N);
    for (uint32_t i = 0; i < N; i++) bad += back[i] != tsr_f32_to_f16(f[i]);
  }
  CHECK_MSG(bad == 0, "%d conversions differ from the scalar ones", bad);
  free(h), free(back), free(f);
}

static void test_f16_decodes_known_values(void) {
  CHECK(tsr_f16_to_f32(0x3c00) == 1.0f);
  CHECK(tsr_f16_to_f32(0xc000) == -2.0f);
  CHECK(tsr_f16_to_f32(0x7bff) == 65504.0f);
  CHECK(tsr_f16_to_f32(0x0400) == ldexpf(1, -14));          /* smallest normal */
  CHECK(tsr_f16_to_f32(0x0001) == ldexpf(1, -24));          /* smallest subnormal */
  CHECK(tsr_f16_to_f32(0x03ff) == ldexpf(1023, -24));       /* largest subnormal */
  CHECK(tsr_f16_to_f32(0x7c00) == INFINITY);
  CHECK(tsr_f16_to_f32(0xfc00) == -INFINITY);
  CHECK(isnan(tsr_f16_to_f32(0x7e00)));
  CHECK(f32_bits(tsr_f16_to_f32(0x8000)) == 0x80000000u); /* -0 keeps its sign */
}

static void test_f16_rounds_to_nearest_even(void) {
  float ulp1 = ldexpf(1, -10); /* spacing of halves in [1, 2) */
  CHECK(f32_bits16(1.0f + ulp1 / 2) == 0x3c00);                   /* tie, even is down */
  CHECK(f32_bits16(1.0f + 3 * ulp1 / 2) == 0x3c02);               /* tie, even is up */
  CHECK(f32_bits16(nextafterf(1.0f + ulp1 / 2, 2)) == 0x3c01);    /* just past the tie */
  CHECK(f32_bits16(nextafterf(1.0f + ulp1 / 2, 0)) == 0x3c00);
  CHECK(f32_bits16(-(1.0f + 3 * ulp1 / 2)) == 0xbc02);
  CHECK(f32_bits16(2.0f - ulp1 / 4) == 0x4000); /* rounding carries into the exponent */
  CHECK(f32_bits16(65504.0f) == 0x7bff);
  CHECK(f32_bits16(65519.0f) == 0x7bff);        /* below the tie with 65536 */
  CHECK(f32_bits16(65520.0f) == 0x7c00);        /* the tie rounds to even: infinity */
  CHECK(f32_bits16(1e10f) == 0x7c00);
  CHECK(f32_bits16(-1e10f) == 0xfc00);
}

static void test_f16_handles_subnormals_inf_nan(void) {
  float tiny = ldexpf(1, -24);
  CHECK(f32_bits16(tiny) == 0x0001);
  CHECK(f32_bits16(tiny / 2) == 0x0000);                 /* tie with 0: even */
  CHECK(f32_bits16(nextafterf(tiny / 2, 1)) == 0x0001);
  CHECK(f32_bits16(3 * tiny / 2) == 0x0002);             /* tie: even is up */
  CHECK(f32_bits16(5 * tiny / 2) == 0x0002);             /* tie: even is down */
  CHECK(f32_bits16(ldexpf(1, -14) - tiny / 2) == 0x0400); /* largest subnormal + half: normal */
  CHECK(f32_bits16(ldexpf(1, -30)) == 0x0000);
  CHECK(f32_bits16(-ldexpf(1, -30)) == 0x8000);
  CHECK(f32_bits16(FLT_MIN) == 0x0000);
  CHECK(f32_bits16(-0.0f) == 0x8000);
  CHECK(f32_bits16(INFINITY) == 0x7c00);
  CHECK(f32_bits16(-INFINITY) == 0xfc00);
  uint16_t n = f32_bits16(NAN);
  CHECK((n & 0x7c00) == 0x7c00 && (n & 0x3ff) != 0);
  /* A NaN whose payload lives only in the low mantissa bits must not become infinity. */
  uint16_t n2 = f32_bits16(bits_f32(0x7f800001u));
  CHECK((n2 & 0x7c00) == 0x7c00 && (n2 & 0x3ff) != 0);
}

/* Reference f32 -> f16 by exact arithmetic in double: the f16 grid spacing at x is
** 2^(max(e, -14) - 10); nearbyint rounds the scaled value to even. */
static uint16_t f16_reference(float f) {
  uint16_t sign = signbit(f) ? 0x8000 : 0;
  double a = fabs((double)f);
  if (a >= 65520.0) return sign | 0x7c00;
  int e;
  frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
  e -= 1;
  if (e < -14) e = -14;
  double q = nearbyint(ldexp(a, 10 - e)); /* exact: a power-of-two scaling */
  if (a == 0) return sign;
  /* q in [1024, 2048] for normals (2048 means the exponent carried), < 1024 subnormal */
  if (q < 1024) return (uint16_t)(sign | (uint16_t)q);
  int exp = e + 15;
  if (q == 2048) {
    q = 1024;
    exp++;
  }
  if (exp >= 31) return sign | 0x7c00;
  return (uint16_t)(sign | exp << 10 | ((uint16_t)q - 1024));
}

static void test_f16_matches_exact_rounding_on_random_floats(void) {
  tsr_test_seed(11);
  int bad = 0;
  for (int i = 0; i < 2000000; i++) {
    uint32_t u = (uint32_t)tsr_test_next();
    /* Concentrate on exponents near the f16 range, where rounding is interesting. */
    if (i & 1) u = (u & 0x807fffffu) | ((uint32_t)(96 + (u >> 23) % 48) << 23);
    float f = bits_f32(u);
    if (isnan(f)) continue;
    if (tsr_f32_to_f16(f) != f16_reference(f) && bad++ < 5)
      fprintf(stderr, "  f16(%a) = %04x, expected %04x\n", (double)f, tsr_f32_to_f16(f),
              f16_reference(f));
  }
  CHECK(bad == 0);
}

static void test_bf16_rounds_to_nearest_even(void) {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = tsr_bf16_to_f32((uint16_t)h);
    CHECK(f32_bits(f) == h << 16);
    int is_nan = (h & 0x7f80u) == 0x7f80u && (h & 0x7fu);
    uint16_t back = tsr_f32_to_bf16(f);
    if (is_nan ? !isnan(tsr_bf16_to_f32(back)) : back != h) bad++;
  }
  CHECK_MSG(bad == 0, "%d bf16 values did not round-trip", bad);
  CHECK(tsr_f32_to_bf16(bits_f32(0x3f808000u)) == 0x3f80); /* tie, even is down */
  CHECK(tsr_f32_to_bf16(bits_f32(0x3f818000u)) == 0x3f82); /* tie, even is up */
  CHECK(tsr_f32_to_bf16(bits_f32(0x3f808001u)) == 0x3f81);
  CHECK(tsr_f32_to_bf16(bits_f32(0x3f807fffu)) == 0x3f80);
  CHECK(tsr_f32_to_bf16(bits_f32(0x00018000u)) == 0x0002); /* subnormal tie, even is up */
  CHECK(tsr_f32_to_bf16(FLT_MAX) == 0x7f80);               /* rounds past the largest */
  CHECK(tsr_f32_to_bf16(INFINITY) == 0x7f80);
  CHECK(tsr_f32_to_bf16(-INFINITY) == 0xff80);
  CHECK(tsr_f32_to_bf16(-0.0f) == 0x8000);
  /* A NaN with only low payload bits would round to infinity without the quiet bit. */
  CHECK(isnan(tsr_bf16_to_f32(tsr_f32_to_bf16(bits_f32(0x7f800001u)))));
  CHECK(isnan(tsr_bf16_to_f32(tsr_f32_to_bf16(bits_f32(0xffffffffu)))));
}

/* ============================================================================ traits ==== */

static void test_traits_give_gguf_block_sizes(void) {
  for (int t = 0; t < NTYPES; t++) {
    const struct tsr_dtype_traits *tr = tsr_dtype_traits(k_types[t].id);
    CHECK_MSG(tr != NULL, "%s", k_types[t].name);
    if (!tr) continue;
    CHECK_MSG(strcmp(tr->name, k_types[t].name) == 0, "%s", k_types[t].name);
    CHECK_MSG(tr->block_size == k_types[t].block, "%s", k_types[t].name);
    CHECK_MSG(tr->type_size == k_types[t].size, "%s", k_types[t].name);
    CHECK_MSG(tr->is_quantized, "%s", k_types[t].name);
    CHECK_MSG(tr->to_f32 == k_types[t].dequant, "%s", k_types[t].name);
    CHECK_MSG(tr->from_f32 == k_types[t].quant, "%s", k_types[t].name);
    CHECK(tsr_dtype_row_size(k_types[t].id, k_types[t].block) == k_types[t].size);
  }
  CHECK(tsr_dtype_row_size(TSR_Q4_K, 256) == 144);
  CHECK(tsr_dtype_row_size(TSR_Q4_K, 4096) == 16 * 144);
  CHECK(tsr_dtype_row_size(TSR_Q6_K, 512) == 420);
  CHECK(tsr_dtype_row_size(TSR_Q8_0, 4096) == 128 * 34);
  CHECK(tsr_dtype_row_size(TSR_F16, 3) == 6);
  CHECK(tsr_dtype_row_size(TSR_BF16, 5) == 10);
  CHECK(tsr_dtype_row_size(TSR_F32, 7) == 28);
  CHECK(tsr_dtype_row_size(TSR_Q4_K, 100) == 0);  /* not a whole number of blocks */
  CHECK(tsr_dtype_row_size(TSR_Q4_0, 33) == 0);
  CHECK(tsr_dtype_row_size(TSR_F32, -1) == 0);
  CHECK(tsr_dtype_row_size(TSR_F32, INT64_MAX) == 0); /* overflow */
  CHECK(tsr_dtype_row_size(TSR_IQ4_XS, 256) == 136);  /* known by size though not computable */
  CHECK(tsr_dtype_traits(4) == NULL);                 /* removed ggml ids are not types */
  CHECK(tsr_dtype_traits(-1) == NULL);
  CHECK(tsr_dtype_traits(TSR_DTYPE_COUNT) == NULL);
  CHECK(!tsr_dtype_valid(5));
  CHECK(tsr_dtype_valid(TSR_Q8_K));
  CHECK(tsr_dtype_traits(TSR_IQ2_XXS)->to_f32 == NULL);
  CHECK(!tsr_dtype_traits(TSR_F32)->is_quantized);
  CHECK(tsr_dtype_block_size(TSR_Q5_K) == 256 && tsr_dtype_type_size(TSR_Q5_K) == 176);
}

static void test_dtype_names_parse_both_ways(void) {
  CHECK(tsr_dtype_from_name("q4_K") == TSR_Q4_K);
  CHECK(tsr_dtype_from_name("Q4_K") == TSR_Q4_K);
  CHECK(tsr_dtype_from_name("q8_0") == TSR_Q8_0);
  CHECK(tsr_dtype_from_name("f16") == TSR_F16);
  CHECK(tsr_dtype_from_name("BF16") == TSR_BF16);
  CHECK(tsr_dtype_from_name("f32") == TSR_F32);
  CHECK(tsr_dtype_from_name("q4_k_m") == -1);
  CHECK(tsr_dtype_from_name("") == -1);
  CHECK(tsr_dtype_from_name("nope") == -1);
  for (int t = 0; t < NTYPES; t++) {
    CHECK(tsr_dtype_from_name(k_types[t].name) == (int)k_types[t].id);
    CHECK(strcmp(tsr_dtype_name(k_types[t].id), k_types[t].name) == 0);
  }
  CHECK(strcmp(tsr_dtype_name((enum tsr_dtype)4), "invalid") == 0);
}

static void test_dtype_convert_checks_its_arguments(void) {
  float x[256] = {0}, y[256];
  _Alignas(16) uint8_t buf[292];
  CHECK(tsr_dtype_from_f32(TSR_Q4_K, x, buf, 100) == TSR_ERR_INVALID_ARG);
  CHECK(tsr_dtype_to_f32(TSR_Q8_0, buf, y, 31) == TSR_ERR_INVALID_ARG);
  CHECK(tsr_dtype_to_f32(TSR_IQ2_XXS, buf, y, 256) == TSR_ERR_UNSUPPORTED);
  CHECK(tsr_dtype_from_f32(TSR_Q8_1, x, buf, 32) == TSR_ERR_UNSUPPORTED);
  for (int i = 0; i < 256; i++) x[i] = (float)(i - 128) / 64;
  CHECK_OK(tsr_dtype_from_f32(TSR_Q8_K, x, buf, 256));
  CHECK_OK(tsr_dtype_to_f32(TSR_Q8_K, buf, y, 256));
  for (int i = 0; i < 256; i++) CHECK_CLOSE(y[i], x[i], 2.0 / 127, 0);
}

/* ============================================================== hand-built layouts ==== */

/* Elements j and j+16 share byte j: low nibble first. */
static void test_q4_0_layout(void) {
  struct tsr_block_q4_0 b = {.d = 0x3800}; /* 0.5 */
  for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | (15 - j) << 4);
  float y[32];
  tsr_dequantize_row_q4_0(&b, y, 32);
  for (int j = 0; j < 16; j++) {
    CHECK(y[j] == (j - 8) * 0.5f);
    CHECK(y[j + 16] == (7 - j) * 0.5f);
  }
  CHECK(y[0] == -4.0f && y[1] == -3.5f && y[16] == 3.5f && y[31] == -4.0f);
}

static void test_q4_1_layout(void) {
  struct tsr_block_q4_1 b = {.d = 0x3400, .m = 0xbc00}; /* 0.25, -1 */
  for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)((15 - j) | j << 4);
  float y[32];
  tsr_dequantize_row_q4_1(&b, y, 32);
  for (int j = 0; j < 16; j++) {
    CHECK(y[j] == (15 - j) * 0.25f - 1);
    CHECK(y[j + 16] == j * 0.25f - 1);
  }
  CHECK(y[0] == 2.75f && y[15] == -1.0f && y[16] == -1.0f && y[31] == 2.75f);
}

/* The fifth bit of element j is bit j of qh read as a little-endian u32. */
static void test_q5_0_layout(void) {
  struct tsr_block_q5_0 b = {.d = 0x3c00, .qh = {0x01, 0x80, 0x02, 0x40}}; /* bits 0,15,17,30 */
  for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | (15 - j) << 4);
  float y[32];
  tsr_dequantize_row_q5_0(&b, y, 32);
  CHECK(y[0] == 0.0f);   /* 0 | 16 */
  CHECK(y[1] == -15.0f); /* 1 */
  CHECK(y[14] == -2.0f);
  CHECK(y[15] == 15.0f); /* 15 | 16 */
  CHECK(y[16] == -1.0f); /* 15 */
  CHECK(y[17] == 14.0f); /* 14 | 16 */
  CHECK(y[30] == 1.0f);  /* 1 | 16 */
  CHECK(y[31] == -16.0f);
}

static void test_q5_1_layout(void) {
  struct tsr_block_q5_1 b = {.d = 0x3800, .m = 0x4000, .qh = {0xff, 0x00, 0x00, 0x80}};
  for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j << 4);
  float y[32];
  tsr_dequantize_row_q5_1(&b, y, 32);
  for (int j = 0; j < 8; j++) CHECK(y[j] == 10.0f);     /* 16 * 0.5 + 2 */
  for (int j = 8; j < 16; j++) CHECK(y[j] == 2.0f);
  for (int j = 0; j < 15; j++) CHECK(y[16 + j] == j * 0.5f + 2);
  CHECK(y[31] == 17.5f); /* 31 * 0.5 + 2 */
}

static void test_q8_0_layout(void) {
  struct tsr_block_q8_0 b = {.d = 0x3000}; /* 0.125 */
  for (int j = 0; j < 32; j++) b.qs[j] = (int8_t)(j * 8 - 128);
  float y[32];
  tsr_dequantize_row_q8_0(&b, y, 32);
  for (int j = 0; j < 32; j++) CHECK(y[j] == (float)(j - 16));
}

/* qs byte 32h+l holds elements 128h+l, +32, +64, +96 at bit pairs 0, 2, 4, 6; scales[s] is
** the 4-bit scale (low) and 4-bit min (high) of elements 16s..16s+15. */
static void test_q2_K_layout(void) {
  struct tsr_block_q2_K b;
  memset(&b, 0, sizeof b);
  b.d = 0x3c00;    /* 1 */
  b.dmin = 0x3800; /* 0.5 */
  for (int s = 0; s < 16; s++) b.scales[s] = (uint8_t)(((s + 1) & 15) | (15 - s) << 4);
  memset(b.qs, 0x1b, sizeof b.qs); /* codes 3, 2, 1, 0 at shifts 0, 2, 4, 6 */
  b.qs[33] = 0x40;                 /* element 128 + 96 + 1 = 225 gets code 1 */
  float y[256];
  tsr_dequantize_row_q2_K(&b, y, 256);
  CHECK(y[0] == -4.5f);   /* sub 0, shift 0: 1*3 - 0.5*15 */
  CHECK(y[31] == -1.0f);  /* sub 1, shift 0: 2*3 - 0.5*14 */
  CHECK(y[40] == -0.5f);  /* sub 2, shift 2: 3*2 - 0.5*13 */
  CHECK(y[127] == -4.0f); /* sub 7, shift 6: 8*0 - 0.5*8 */
  CHECK(y[200] == 11.5f); /* sub 12, shift 4: 13*1 - 0.5*3 */
  CHECK(y[225] == 14.5f); /* sub 14, qs[33] bits 6-7: 15*1 - 0.5*1 */
  CHECK(y[224] == -0.5f); /* sub 14, qs[32] bits 6-7: 15*0 - 0.5*1 */
  CHECK(y[193] == -1.5f); /* sub 12, qs[33] bits 4-5: 13*0 - 0.5*3 */
  CHECK(y[255] == 0.0f);  /* sub 15: scale 0, min 0 */
}

/* hmask[e%32] bit e/32 is the third bit (clear = subtract 4); see quant_k.c for scales. */
static void test_q3_K_layout(void) {
  struct tsr_block_q3_K b;
  memset(&b, 0, sizeof b);
  b.d = 0x3c00;
  b.scales[0] = 0x21;  /* scale 0 low nibble 1, scale 8 low nibble 2 */
  b.scales[4] = 0x5a;  /* scale 4 low nibble 10, scale 12 low nibble 5 */
  b.scales[8] = 0xe4;  /* top bits: scale 0 -> 0, scale 4 -> 1, scale 8 -> 2, scale 12 -> 3 */
  /* so scales are 1, 26, 34, 53 (minus 32: -31, -6, 2, 21) and every other scale is -32 */
  b.hmask[0] = 0x01;   /* element 0 */
  b.hmask[5] = 0x10;   /* element 4*32 + 5 = 133 */
  b.qs[0] = 0x03;      /* element 0: code 3 */
  b.qs[37] = 0x02;     /* element 128 + 5 = 133: code 2 */
  float y[256];
  tsr_dequantize_row_q3_K(&b, y, 256);
  CHECK(y[0] == -93.0f);  /* -31 * (3 - 0) */
  CHECK(y[1] == 124.0f);  /* -31 * (0 - 4) */
  CHECK(y[5] == 124.0f);
  CHECK(y[32] == 128.0f); /* sub 2: -32 * -4 */
  CHECK(y[64] == 24.0f);  /* sub 4: -6 * -4 */
  CHECK(y[128] == -8.0f); /* sub 8: 2 * -4 */
  CHECK(y[133] == 4.0f);  /* sub 8: 2 * (2 - 0) */
  CHECK(y[192] == -84.0f); /* sub 12: 21 * -4 */
}

/* Scales/mins of q4_K and q5_K: see quant_k.c; codes of sub-block 2c in the low nibbles of
** qs[32c..32c+31], of sub-block 2c+1 in the high nibbles. */
static void k4_scales(uint8_t s[12]) {
  memset(s, 0, 12);
  s[0] = 0xc1; /* sc0 = 1; top bits 3 -> sc4 */
  s[4] = 0x83; /* m0 = 3; top bits 2 -> m4 */
  s[1] = 0x07; /* sc1 = 7, m1 = 0 */
  s[8] = 0x5a; /* sc4 = 10 | 3<<4 = 58, m4 = 5 | 2<<4 = 37 */
  s[9] = 0x32; /* sc5 = 2, m5 = 3 */
}

static void test_q4_K_layout(void) {
  struct tsr_block_q4_K b;
  memset(&b, 0, sizeof b);
  b.d = 0x3c00;
  b.dmin = 0x3800;
  k4_scales(b.scales);
  b.qs[0] = 0x2f;  /* element 0 (sub 0): 15; element 32 (sub 1): 2 */
  b.qs[67] = 0x71; /* element 128 + 3 (sub 4): 1; element 160 + 3 (sub 5): 7 */
  float y[256];
  tsr_dequantize_row_q4_K(&b, y, 256);
  CHECK(y[0] == 13.5f);   /* 1*15 - 0.5*3 */
  CHECK(y[1] == -1.5f);
  CHECK(y[32] == 14.0f);  /* 7*2 - 0 */
  CHECK(y[131] == 39.5f); /* 58*1 - 0.5*37 */
  CHECK(y[130] == -18.5f);
  CHECK(y[163] == 12.5f); /* 2*7 - 0.5*3 */
  CHECK(y[255] == 0.0f);
}

/* q5_K's fifth bit of element e is bit e/32 of qh[e%32]. */
static void test_q5_K_layout(void) {
  struct tsr_block_q5_K b;
  memset(&b, 0, sizeof b);
  b.d = 0x3c00;
  b.dmin = 0x3800;
  k4_scales(b.scales);
  b.qs[0] = 0x2f;
  b.qs[67] = 0x71;
  b.qh[0] = 0x03; /* elements 0 and 32 */
  b.qh[3] = 0x10; /* element 4*32 + 3 = 131 */
  float y[256];
  tsr_dequantize_row_q5_K(&b, y, 256);
  CHECK(y[0] == 29.5f);    /* 1*31 - 1.5 */
  CHECK(y[1] == -1.5f);
  CHECK(y[32] == 126.0f);  /* 7*18 */
  CHECK(y[131] == 967.5f); /* 58*17 - 18.5 */
  CHECK(y[163] == 12.5f);  /* qh[3] bit 5 clear */
  CHECK(y[35] == 0.0f);    /* qh[3] bit 1 clear: 7*0 */
}

/* Element 128h + 32k + l: low nibble in ql[64h + 32(k&1) + l] (high nibble when k >= 2), top
** two bits at bits 2k of qh[32h + l]; code minus 32, times d * scales[e/16]. */
static void test_q6_K_layout(void) {
  struct tsr_block_q6_K b;
  memset(&b, 0, sizeof b);
  b.d = 0x3800; /* 0.5 */
  b.scales[0] = 1;
  b.scales[2] = -2;
  b.scales[4] = 3;
  b.scales[8] = 4;
  b.scales[15] = -1;
  b.ql[0] = 0x5a;   /* element 0 low 0xa, element 64 low 5 */
  b.ql[32] = 0x0c;  /* element 32 low 0xc, element 96 low 0 */
  b.qh[0] = 0x9e;   /* top bits: element 0 -> 2, 32 -> 3, 64 -> 1, 96 -> 2 */
  b.ql[65] = 0x37;  /* element 129 low 7, element 193 low 3 */
  b.ql[127] = 0xf0; /* element 255 low 0xf, element 223 low 0 */
  b.qh[63] = 0xc0;  /* element 255 top bits 3 */
  float y[256];
  tsr_dequantize_row_q6_K(&b, y, 256);
  CHECK(y[0] == 5.0f);     /* 0.5 * 1 * (42 - 32) */
  CHECK(y[32] == -28.0f);  /* 0.5 * -2 * (60 - 32) */
  CHECK(y[64] == -16.5f);  /* 0.5 * 3 * (21 - 32) */
  CHECK(y[96] == 0.0f);    /* scale 0 */
  CHECK(y[129] == -50.0f); /* 0.5 * 4 * (7 - 32) */
  CHECK(y[255] == -15.5f); /* 0.5 * -1 * (63 - 32) */
  CHECK(y[1] == -16.0f);   /* 0.5 * 1 * (0 - 32) */
}

static void test_q8_K_layout(void) {
  static struct tsr_block_q8_K b;
  b.d = 0.25f;
  for (int e = 0; e < 256; e++) b.qs[e] = (int8_t)(e - 128);
  float y[256];
  tsr_dequantize_row_q8_K(&b, y, 256);
  for (int e = 0; e < 256; e++) CHECK(y[e] == (e - 128) * 0.25f);
}

/* ========================================================== agreement with ggml ==== */

/* Offsets of the half-precision scale fields (q8_K: its float d), which random bytes must
** not turn into NaN or infinity. */
static void sane_scales(int t, uint8_t *blk) {
  static const struct { size_t off[2]; int n; } f[] = {
      {{offsetof(struct tsr_block_q4_0, d)}, 1},
      {{offsetof(struct tsr_block_q4_1, d), offsetof(struct tsr_block_q4_1, m)}, 2},
      {{offsetof(struct tsr_block_q5_0, d)}, 1},
      {{offsetof(struct tsr_block_q5_1, d), offsetof(struct tsr_block_q5_1, m)}, 2},
      {{offsetof(struct tsr_block_q8_0, d)}, 1},
      {{offsetof(struct tsr_block_q2_K, d), offsetof(struct tsr_block_q2_K, dmin)}, 2},
      {{offsetof(struct tsr_block_q3_K, d)}, 1},
      {{offsetof(struct tsr_block_q4_K, d), offsetof(struct tsr_block_q4_K, dmin)}, 2},
      {{offsetof(struct tsr_block_q5_K, d), offsetof(struct tsr_block_q5_K, dmin)}, 2},
      {{offsetof(struct tsr_block_q6_K, d)}, 1},
  };
  if (k_types[t].id == TSR_Q8_K) {
    float d = (float)(1 + tsr_test_next() % 64) / 256;
    memcpy(blk, &d, 4);
    return;
  }
  for (int k = 0; k < f[t].n; k++) {
    uint64_t r = tsr_test_next();
    uint16_t h = tsr_f32_to_f16((float)(1 + r % 64) / 256 * ((r >> 8) & 1 ? -1 : 1));
    memcpy(blk + f[t].off[k], &h, 2);
  }
}

/* FNV-1a of ggml's dequantization of 64 random blocks per type. */
static const uint64_t k_ggml_dequant_hash[] = {
    0x0593a4e41164a9fdull, /* q4_0 */
    0x8b09c02fa56b9b26ull, /* q4_1 */
    0x98422e6962057425ull, /* q5_0 */
    0x38d550f354c88e46ull, /* q5_1 */
    0x6e3d665c1d0a111eull, /* q8_0 */
    0xaacf29f101fc0097ull, /* q2_K */
    0x8c6443985d72ba38ull, /* q3_K */
    0x4c6ed1139b0c6c5dull, /* q4_K */
    0xf5a1c84eed0d1ca9ull, /* q5_K */
    0xb9e58a8d6b4acce2ull, /* q6_K */
    0x33910fc6620d29caull, /* q8_K */
};

static uint64_t random_blocks_dequant_hash(int t) {
  enum { NB = 64 };
  static _Alignas(16) uint8_t buf[NB * 292];
  static float y[NB * 256];
  const struct qtype *q = &k_types[t];
  tsr_test_seed(1000 + (uint64_t)t);
  for (size_t i = 0; i < NB * q->size; i++) buf[i] = (uint8_t)tsr_test_next();
  for (int i = 0; i < NB; i++) sane_scales(t, buf + i * q->size);
  q->dequant(buf, y, (int64_t)NB * q->block);
  return fnv1a(FNV_START, y, sizeof(float) * NB * (size_t)q->block);
}

static void test_dequantize_matches_ggml_on_random_blocks(void) {
  for (int t = 0; t < NTYPES; t++) {
    uint64_t h = random_blocks_dequant_hash(t);
    CHECK_MSG(h == k_ggml_dequant_hash[t], "%s: hash 0x%016llxull", k_types[t].name,
              (unsigned long long)h);
  }
}

/* A fixed row built from exact float operations only (integer conversions, powers of two,
** sums), so every IEEE platform makes the same floats whatever it fuses or which libm it has:
** sums of four uniforms (roughly Gaussian) scaled by 2^k per 16 values, and special blocks:
** an outlier, exact ties (two kinds), all positive, all negative, a constant run, mostly
** zeros, and one with a sign-flipped extreme. */
enum { GOLDEN_N = 16 * 256 };
static void golden_input(float *x) {
  tsr_test_seed(20250611);
  for (int i = 0; i < GOLDEN_N; i++) {
    float u = 0;
    for (int k = 0; k < 4; k++)
      u += ldexpf((float)((int32_t)(tsr_test_next() >> 40) - (1 << 23)), -23);
    x[i] = ldexpf(u, (i / 16) % 9 - 4);
  }
  x[3 * 256 + 77] = 100.0f;
  for (int i = 5 * 256; i < 6 * 256; i++) x[i] = (float)((int)(tsr_test_next() % 9) - 4) * 0.5f;
  for (int i = 6 * 256; i < 7 * 256; i++) /* q8 scale exactly 1: codes at exact halves */
    x[i] = i % 32 ? (float)((int)(tsr_test_next() % 254) - 127) + 0.5f : 127.0f;
  for (int i = 7 * 256; i < 8 * 256; i++) x[i] = fabsf(x[i]) + 0.25f;
  for (int i = 8 * 256; i < 9 * 256; i++) x[i] = -fabsf(x[i]) - 1.0f;
  for (int i = 9 * 256; i < 10 * 256; i++) x[i] = 0.75f;
  for (int i = 11 * 256; i < 12 * 256; i++) x[i] = i % 5 ? 0.0f : x[i];
  x[13 * 256 + 200] = -ldexpf(fabsf(x[13 * 256 + 200]), 3) - 3.0f;
}

/* FNV-1a of the bytes ggml's quantize_row_*_ref writes for golden_input. */
static const uint64_t k_ggml_quant_hash[] = {
    0xfbc7472d02eefb48ull, /* q4_0 */
    0x48f25339fa4391d8ull, /* q4_1 */
    0x30bdab078ae88cf4ull, /* q5_0 */
    0x37a6624ae38d06deull, /* q5_1 */
    0xa75a49d0b69bb72dull, /* q8_0 */
    0x6cfc877f514c9c72ull, /* q2_K */
    0xbeb500e520f74234ull, /* q3_K */
    0x8d75b4ba1b7021b5ull, /* q4_K */
    0x1407acca39c1e770ull, /* q5_K */
    0x63d564ecbefa5af9ull, /* q6_K */
    0xf3c8458bdff591a9ull, /* q8_K */
};

static uint64_t golden_quant_hash(int t) {
  static float x[GOLDEN_N];
  static _Alignas(16) uint8_t buf[GOLDEN_N / 256 * 292];
  const struct qtype *q = &k_types[t];
  golden_input(x);
  q->quant(x, buf, GOLDEN_N);
  return fnv1a(FNV_START, buf, (size_t)(GOLDEN_N / q->block) * q->size);
}

static void test_quantize_writes_the_bytes_ggml_writes(void) {
  for (int t = 0; t < NTYPES; t++) {
    uint64_t h = golden_quant_hash(t);
    CHECK_MSG(h == k_ggml_quant_hash[t], "%s: hash 0x%016llxull", k_types[t].name,
              (unsigned long long)h);
  }
}

/* ======================================================================= round trips ==== */

/* Relative RMSE of quantize -> dequantize: sqrt(sum (x-y)^2 / sum x^2). */
static double roundtrip_rel_rmse(const struct qtype *q, const float *x, int64_t n) {
  void *buf = malloc((size_t)(n / q->block) * q->size);
  float *y = malloc(sizeof(float) * (size_t)n);
  q->quant(x, buf, n);
  q->dequant(buf, y, n);
  double se = 0, sx = 0;
  for (int64_t i = 0; i < n; i++) {
    se += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
    sx += (double)x[i] * x[i];
  }
  free(buf);
  free(y);
  return sqrt(se / sx);
}

/* Upper bounds on relative RMSE for N(0,1) and U(-1,1) input, in k_types order. They sit
** about 15% above what these quantizers measure on 65536 values (normal: q8_0 .0054, q8_K
** .0071, q6_K .018, q5_1 .038, q5_0 .043, q5_K .037, q4_1 .079, q4_0 .086, q4_K .073, q3_K
** .153, q2_K .300). They catch gross mistakes (a misplaced bit, a lost scale); the subtle
** ones (a skipped search step, rounding ties the other way) are the ggml hashes' job. */
static const double k_bound_normal[] = {0.100, 0.092, 0.050, 0.044, 0.0062, 0.345,
                                        0.175, 0.084, 0.042, 0.021,  0.0082};
static const double k_bound_uniform[] = {0.075, 0.072, 0.037, 0.034, 0.0045, 0.275,
                                         0.145, 0.065, 0.032, 0.016,  0.0047};

static void test_roundtrip_error_within_bounds(void) {
  static const int64_t lengths[] = {256, 768, 4096, 65536};
  enum { NMAX = 65536 };
  static float xn[NMAX], xu[NMAX];
  tsr_test_seed(7);
  for (int i = 0; i < NMAX; i++) {
    xn[i] = tsr_test_normal();
    xu[i] = tsr_test_uniform(-1, 1);
  }
  for (int t = 0; t < NTYPES; t++) {
    const struct qtype *q = &k_types[t];
    for (size_t l = 0; l < sizeof lengths / sizeof lengths[0]; l++) {
      double en = roundtrip_rel_rmse(q, xn, lengths[l]);
      double eu = roundtrip_rel_rmse(q, xu, lengths[l]);
      /* short rows sample few blocks: allow them a little more */
      double slack = lengths[l] < 4096 ? 1.15 : 1.0;
      CHECK_MSG(en <= k_bound_normal[t] * slack, "%s n=%lld normal: %.5f > %.5f", q->name,
                (long long)lengths[l], en, k_bound_normal[t] * slack);
      CHECK_MSG(eu <= k_bound_uniform[t] * slack, "%s n=%lld uniform: %.5f > %.5f", q->name,
                (long long)lengths[l], eu, k_bound_uniform[t] * slack);
      if (getenv("TSR_TEST_VERBOSE"))
        printf("  %-5s n=%-6lld normal %.5f uniform %.5f\n", q->name, (long long)lengths[l],
               en, eu);
    }
  }
}

static int type_index(enum tsr_dtype id) {
  for (int t = 0; t < NTYPES; t++)
    if (k_types[t].id == id) return t;
  return -1;
}

static void test_more_bits_means_less_error(void) {
  static const enum tsr_dtype order[] = {TSR_Q8_0, TSR_Q6_K, TSR_Q5_K,
                                         TSR_Q4_K, TSR_Q3_K, TSR_Q2_K};
  enum { N = 16384 };
  static float x[N];
  for (int dist = 0; dist < 2; dist++) {
    tsr_test_seed(99 + (uint64_t)dist);
    for (int i = 0; i < N; i++) x[i] = dist ? tsr_test_uniform(-3, 1) : tsr_test_normal();
    double prev = 0;
    for (size_t k = 0; k < sizeof order / sizeof order[0]; k++) {
      double e = roundtrip_rel_rmse(&k_types[type_index(order[k])], x, N);
      CHECK_MSG(e > prev, "%s (%.5f) not worse than the type before it (%.5f)",
                tsr_dtype_name(order[k]), e, prev);
      prev = e;
    }
    /* the 32-blocks too: 5 bits beat 4, with or without a min */
    CHECK(roundtrip_rel_rmse(&k_types[type_index(TSR_Q5_0)], x, N) <
          roundtrip_rel_rmse(&k_types[type_index(TSR_Q4_0)], x, N));
    CHECK(roundtrip_rel_rmse(&k_types[type_index(TSR_Q5_1)], x, N) <
          roundtrip_rel_rmse(&k_types[type_index(TSR_Q4_1)], x, N));
  }
}

/* Per element, 8-bit types are off by at most half a step plus the rounding of d to f16. */
static void test_q8_error_is_half_a_step(void) {
  enum { N = 4096 };
  static float x[N], y[N];
  static _Alignas(16) uint8_t buf[N / 32 * 34 + N / 256 * 292];
  tsr_test_seed(5);
  for (int i = 0; i < N; i++) x[i] = tsr_test_normal() * (float)(1 + i / 512);
  tsr_quantize_row_q8_0_ref(x, buf, N);
  tsr_dequantize_row_q8_0(buf, y, N);
  for (int b = 0; b < N / 32; b++) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[32 * b + j]));
    for (int j = 0; j < 32; j++)
      CHECK_CLOSE(y[32 * b + j], x[32 * b + j], amax / 127 * (0.5 + 127.0 / 2048), 0);
  }
  tsr_quantize_row_q8_K_ref(x, buf, N);
  tsr_dequantize_row_q8_K(buf, y, N);
  const struct tsr_block_q8_K *kb = (const void *)buf;
  for (int b = 0; b < N / 256; b++) {
    float amax = 0;
    for (int j = 0; j < 256; j++) amax = fmaxf(amax, fabsf(x[256 * b + j]));
    for (int j = 0; j < 256; j++)
      CHECK_CLOSE(y[256 * b + j], x[256 * b + j], amax / 254 * 1.001, 0);
    for (int s = 0; s < 16; s++) { /* bsums are the sums the q8_K dot kernels rely on */
      int sum = 0;
      for (int l = 0; l < 16; l++) sum += kb[b].qs[16 * s + l];
      CHECK(kb[b].bsums[s] == sum);
    }
  }
}

/* =================================================================== edge cases ==== */

static int all_finite(const float *y, int n) {
  for (int i = 0; i < n; i++)
    if (!isfinite(y[i])) return 0;
  return 1;
}

static void test_zero_input_gives_zero_blocks(void) {
  enum { N = 512 };
  static float x[N], y[N];
  static _Alignas(16) uint8_t buf[N / 256 * 292 + 64];
  for (int t = 0; t < NTYPES; t++) {
    const struct qtype *q = &k_types[t];
    memset(x, 0, sizeof x);
    memset(buf, 0xa5, sizeof buf);
    q->quant(x, buf, N);
    for (int i = 0; i < N; i++) y[i] = NAN;
    q->dequant(buf, y, N);
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= y[i] == 0.0f;
    CHECK_MSG(ok, "%s: zeros do not come back as zeros", q->name);
    /* Denormal-sized input must not divide its way to inf or NaN either. */
    for (int i = 0; i < N; i++) x[i] = (i % 3 - 1) * 1e-30f;
    q->quant(x, buf, N);
    q->dequant(buf, y, N);
    CHECK_MSG(all_finite(y, N), "%s: tiny input gives non-finite output", q->name);
    for (int i = 0; i < N; i++) CHECK(fabsf(y[i]) <= 1e-29f);
  }
  static struct tsr_block_q8_K kb; /* q8_K's bsums are defined for zero blocks too */
  memset(&kb, 0x5a, sizeof kb);
  memset(x, 0, sizeof x);
  tsr_quantize_row_q8_K_ref(x, &kb, 256);
  for (int s = 0; s < 16; s++) CHECK(kb.bsums[s] == 0);
}

/* One value 3e4 times the rest: nothing turns non-finite, every block not holding it is
** quantized exactly as without it, and it comes back almost exactly: as the block's extreme
** it lands on a top code, so only the rounding of the scales to f16 (2^-11 each) is left. */
static void test_one_huge_value_stays_local(void) {
  enum { N = 1024, POS = 256 + 37 };
  const double rel = 1e-3;
  static float x[N], y[N];
  static _Alignas(16) uint8_t b1[N / 32 * 34 + 1200];
  static _Alignas(16) uint8_t b2[N / 32 * 34 + 1200];
  tsr_test_seed(31);
  for (int i = 0; i < N; i++) x[i] = tsr_test_normal();
  for (int t = 0; t < NTYPES; t++) {
    const struct qtype *q = &k_types[t];
    for (int sign = -1; sign <= 1; sign += 2) {
      float keep = x[POS];
      q->quant(x, b1, N);
      x[POS] = 3e4f * (float)sign;
      q->quant(x, b2, N);
      q->dequant(b2, y, N);
      CHECK_MSG(all_finite(y, N), "%s", q->name);
      CHECK_MSG(fabs(y[POS] - x[POS]) <= rel * 3e4, "%s: %g came back as %g", q->name,
                (double)x[POS], (double)y[POS]);
      if (getenv("TSR_TEST_VERBOSE"))
        printf("  %-5s huge %+g rel err %.5f\n", q->name, (double)x[POS],
               fabs(y[POS] - x[POS]) / 3e4);
      int blk = POS / q->block;
      size_t nb = (size_t)(N / q->block);
      for (size_t i = 0; i < nb; i++) {
        if ((int)i == blk) continue;
        CHECK_MSG(memcmp(b1 + i * q->size, b2 + i * q->size, q->size) == 0,
                  "%s: block %zu changed", q->name, i);
      }
      x[POS] = keep;
    }
  }
}

int main(void) {
  TSR_RUN(test_f16_round_trips_every_half_value);
  TSR_RUN(test_f16_rows_equal_scalar_conversions);
  TSR_RUN(test_f16_decodes_known_values);
  TSR_RUN(test_f16_rounds_to_nearest_even);
  TSR_RUN(test_f16_handles_subnormals_inf_nan);
  TSR_RUN(test_f16_matches_exact_rounding_on_random_floats);
  TSR_RUN(test_bf16_rounds_to_nearest_even);
  TSR_RUN(test_traits_give_gguf_block_sizes);
  TSR_RUN(test_dtype_names_parse_both_ways);
  TSR_RUN(test_dtype_convert_checks_its_arguments);
  TSR_RUN(test_q4_0_layout);
  TSR_RUN(test_q4_1_layout);
  TSR_RUN(test_q5_0_layout);
  TSR_RUN(test_q5_1_layout);
  TSR_RUN(test_q8_0_layout);
  TSR_RUN(test_q2_K_layout);
  TSR_RUN(test_q3_K_layout);
  TSR_RUN(test_q4_K_layout);
  TSR_RUN(test_q5_K_layout);
  TSR_RUN(test_q6_K_layout);
  TSR_RUN(test_q8_K_layout);
  TSR_RUN(test_dequantize_matches_ggml_on_random_blocks);
  TSR_RUN(test_quantize_writes_the_bytes_ggml_writes);
  TSR_RUN(test_roundtrip_error_within_bounds);
  TSR_RUN(test_more_bits_means_less_error);
  TSR_RUN(test_q8_error_is_half_a_step);
  TSR_RUN(test_zero_input_gives_zero_blocks);
  TSR_RUN(test_one_huge_value_stays_local);
  return TSR_TEST_EXIT();
}
