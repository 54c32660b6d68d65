#include "graph/dtype.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "common/error.h"

/* ---- half precision ---------------------------------------------------- */

uint16_t tsr_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t exp = (x >> 23) & 0xffu;
  uint32_t man = x & 0x7fffffu;
  if (exp == 0xff) /* inf or nan; keep nan quiet and non-zero */
    return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0));
  int32_t e = (int32_t)exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return (uint16_t)sign;
    man |= 0x800000u;
    uint32_t shift = (uint32_t)(14 - e);
    uint32_t half = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = ((uint32_t)e << 10) | (man >> 13);
  uint32_t rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) half++; /* may carry into exp: correct */
  return (uint16_t)(sign | half);
}

float tsr_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (man == 0) {
      x = sign;
    } else { /* subnormal: normalise */
      int e = -1;
      do { man <<= 1; e++; } while (!(man & 0x400u));
      x = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) { /* a NaN comes out quiet, as the F16C conversion makes it */
    x = sign | 0x7f800000u | (man ? 0x400000u | (man << 13) : 0);
  } else {
    x = sign | ((exp - 15 + 127) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &x, 4);
  return f;
}

uint16_t tsr_f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet nan */
  return (uint16_t)((x + (0x7fffu + ((x >> 16) & 1u))) >> 16);
}

float tsr_bf16_to_f32(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

/* ---- plain-type converters --------------------------------------------- */

static void f32_to_f32(const void *src, float *dst, int64_t n) {
  memmove(dst, src, (size_t)n * sizeof(float));
}
/* Rows of f16 through F16C where the machine has it: the same IEEE conversions (round to
** nearest even, NaN kept quiet with its top payload bits) as the scalar ones, 8 at a time */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define F16C __attribute__((target("avx,f16c")))
static bool has_f16c(void) {
  static int cached = -1;
  if (cached < 0) { /* clang's __builtin_cpu_supports does not know "f16c": cpuid's bit */
    unsigned a, b, c, d;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
    cached = __builtin_cpu_supports("avx") && (c >> 29 & 1);
  }
  return cached;
}
F16C static int64_t f16_to_f32_f16c(const uint16_t *s, float *d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
  return i;
}
F16C static int64_t f16_from_f32_f16c(const float *s, uint16_t *d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
  return i;
}
#else
static bool has_f16c(void) { return false; }
static int64_t f16_to_f32_f16c(const uint16_t *s, float *d, int64_t n) { return 0; }
static int64_t f16_from_f32_f16c(const float *s, uint16_t *d, int64_t n) { return 0; }
#endif

static void f16_to_f32(const void *src, float *dst, int64_t n) {
  const uint16_t *s = src;
  int64_t i = has_f16c() ? f16_to_f32_f16c(s, dst, n) : 0;
  for (; i < n; i++) dst[i] = tsr_f16_to_f32(s[i]);
}
static void bf16_to_f32(const void *src, float *dst, int64_t n) {
  const uint16_t *s = src;
  for (int64_t i = 0; i < n; i++) dst[i] = tsr_bf16_to_f32(s[i]);
}
static void f32_from_f32(const float *src, void *dst, int64_t n) {
  memmove(dst, src, (size_t)n * sizeof(float));
}
static void f16_from_f32(const float *src, void *dst, int64_t n) {
  uint16_t *d = dst;
  int64_t i = has_f16c() ? f16_from_f32_f16c(src, d, n) : 0;
  for (; i < n; i++) d[i] = tsr_f32_to_f16(src[i]);
}
static void bf16_from_f32(const float *src, void *dst, int64_t n) {
  uint16_t *d = dst;
  for (int64_t i = 0; i < n; i++) d[i] = tsr_f32_to_bf16(src[i]);
}
static void i32_to_f32(const void *src, float *dst, int64_t n) {
  const int32_t *s = src;
  for (int64_t i = 0; i < n; i++) dst[i] = (float)s[i];
}
static void i32_from_f32(const float *src, void *dst, int64_t n) {
  int32_t *d = dst;
  for (int64_t i = 0; i < n; i++) d[i] = (int32_t)src[i];
}

/* ---- the table ---------------------------------------------------------- */

#define PLAIN(nm, sz, to, from) {nm, 1, sz, 0, to, from}
#define QUANT(nm, bs, sz, tn) \
  {#nm, bs, sz, 1, tsr_dequantize_row_##tn, tsr_quantize_row_##tn##_ref}
#define KNOWN(nm, bs, sz) {nm, bs, sz, 1, NULL, NULL} /* size only */

static const struct tsr_dtype_traits g_traits[TSR_DTYPE_COUNT] = {
    [TSR_F32] = PLAIN("f32", 4, f32_to_f32, f32_from_f32),
    [TSR_F16] = PLAIN("f16", 2, f16_to_f32, f16_from_f32),
    [TSR_BF16] = PLAIN("bf16", 2, bf16_to_f32, bf16_from_f32),
    [TSR_F64] = PLAIN("f64", 8, NULL, NULL),
    [TSR_I8] = PLAIN("i8", 1, NULL, NULL),
    [TSR_I16] = PLAIN("i16", 2, NULL, NULL),
    [TSR_I32] = PLAIN("i32", 4, i32_to_f32, i32_from_f32),
    [TSR_I64] = PLAIN("i64", 8, NULL, NULL),
    [TSR_Q4_0] = QUANT(q4_0, 32, 18, q4_0),
    [TSR_Q4_1] = QUANT(q4_1, 32, 20, q4_1),
    [TSR_Q5_0] = QUANT(q5_0, 32, 22, q5_0),
    [TSR_Q5_1] = QUANT(q5_1, 32, 24, q5_1),
    [TSR_Q8_0] = QUANT(q8_0, 32, 34, q8_0),
    [TSR_Q8_1] = KNOWN("q8_1", 32, 36),
    [TSR_Q2_K] = QUANT(q2_K, 256, 84, q2_K),
    [TSR_Q3_K] = QUANT(q3_K, 256, 110, q3_K),
    [TSR_Q4_K] = QUANT(q4_K, 256, 144, q4_K),
    [TSR_Q5_K] = QUANT(q5_K, 256, 176, q5_K),
    [TSR_Q6_K] = QUANT(q6_K, 256, 210, q6_K),
    [TSR_Q8_K] = QUANT(q8_K, 256, 292, q8_K),
    [TSR_IQ2_XXS] = KNOWN("iq2_xxs", 256, 66),
    [TSR_IQ2_XS] = KNOWN("iq2_xs", 256, 74),
    [TSR_IQ3_XXS] = KNOWN("iq3_xxs", 256, 98),
    [TSR_IQ1_S] = KNOWN("iq1_s", 256, 50),
    [TSR_IQ4_NL] = KNOWN("iq4_nl", 32, 18),
    [TSR_IQ3_S] = KNOWN("iq3_s", 256, 110),
    [TSR_IQ2_S] = KNOWN("iq2_s", 256, 82),
    [TSR_IQ4_XS] = KNOWN("iq4_xs", 256, 136),
    [TSR_IQ1_M] = KNOWN("iq1_m", 256, 56),
    [TSR_TQ1_0] = KNOWN("tq1_0", 256, 54),
    [TSR_TQ2_0] = KNOWN("tq2_0", 256, 66),
    [TSR_MXFP4] = KNOWN("mxfp4", 32, 17),
};

/* tessera-only ids, indexed from TSR_DTYPE_OWN_BASE: a second small table so
** the GGUF one stays indexed by the ids files carry. */
static const struct tsr_dtype_traits g_own_traits[TSR_DTYPE_OWN_END - TSR_DTYPE_OWN_BASE] = {
    [TSR_Q6_0 - TSR_DTYPE_OWN_BASE] = QUANT(q6_0, 32, 26, q6_0),
};
#define N_OWN (TSR_DTYPE_OWN_END - TSR_DTYPE_OWN_BASE)

/* ---- codec-registered dtypes ---------------------------------------------- */

/* Each slot's traits call the codec's functions through a trampoline of their
** own, since tsr_to_f32_fn carries no context. A slot is written whole before
** g_n_codecs publishes it, and never changes after. */
struct codec_slot {
  struct tsr_dtype_traits tr;
  char name[32], owner[64];
  tsr_codec_encode_fn encode;
  tsr_codec_decode_fn decode;
  void *ctx;
  _Atomic int32_t encode_op, lift_op, read_op; /* device kernels' plugin ops; -1: none */
};
static struct codec_slot g_codecs[TSR_DTYPE_CODEC_MAX];
static _Atomic int g_n_codecs;
static pthread_mutex_t g_codec_lock = PTHREAD_MUTEX_INITIALIZER;
static const struct tsr_dtype_traits *(*g_codec_source)(int);

#define TRAMPOLINES(i)                                                                            \
  static void codec_to_f32_##i(const void *src, float *dst, int64_t n) {                          \
    g_codecs[i].decode(g_codecs[i].ctx, src, dst, n);                                             \
  }                                                                                               \
  static void codec_from_f32_##i(const float *src, void *dst, int64_t n) {                        \
    g_codecs[i].encode(g_codecs[i].ctx, src, dst, n);                                             \
  }
#define EACH_SLOT(X) \
  X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) \
  X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23) X(24) X(25) X(26) X(27) X(28) X(29) X(30) X(31)
EACH_SLOT(TRAMPOLINES)
#define TO_F32(i) codec_to_f32_##i,
#define FROM_F32(i) codec_from_f32_##i,
static const tsr_to_f32_fn g_codec_to[TSR_DTYPE_CODEC_MAX] = {EACH_SLOT(TO_F32)};
static const tsr_from_f32_fn g_codec_from[TSR_DTYPE_CODEC_MAX] = {EACH_SLOT(FROM_F32)};

tsr_status tsr_dtype_register_codec(const char *owner, const char *name, int64_t block_size,
                                    size_t type_size, tsr_codec_encode_fn encode,
                                    tsr_codec_decode_fn decode, void *ctx, int *id) {
  if (!owner || !name || !*name || strlen(name) >= sizeof g_codecs[0].name ||
      strlen(owner) >= sizeof g_codecs[0].owner || block_size < 1 || block_size > 4096 ||
      type_size < 1 || type_size > 65536 || !encode || !decode)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "codec dtype '%s' of %s: a name under 32 bytes, "
                         "blocks of 1..4096 values in 1..65536 bytes, an encoder and a decoder "
                         "are needed", name ? name : "?", owner ? owner : "?");
  pthread_mutex_lock(&g_codec_lock);
  tsr_status st = TSR_OK;
  const int n = g_n_codecs;
  int at = -1;
  for (int i = 0; i < n && at < 0; i++)
    if (!strcmp(g_codecs[i].name, name) && !strcmp(g_codecs[i].owner, owner)) at = i;
  if (at >= 0) {
    if (g_codecs[at].tr.block_size != block_size || g_codecs[at].tr.type_size != type_size)
      st = tsr_error_set(TSR_ERR_INVALID_ARG, "codec dtype '%s' of %s was registered with blocks "
                         "of %lld values in %zu bytes, now %lld in %zu", name, owner,
                         (long long)g_codecs[at].tr.block_size, g_codecs[at].tr.type_size,
                         (long long)block_size, type_size);
  } else if (n == TSR_DTYPE_CODEC_MAX) {
    st = tsr_error_set(TSR_ERR_NOMEM, "more than %d codec dtypes in one process",
                       TSR_DTYPE_CODEC_MAX);
  } else {
    struct codec_slot *c = &g_codecs[n];
    snprintf(c->name, sizeof c->name, "%s", name);
    snprintf(c->owner, sizeof c->owner, "%s", owner);
    c->encode = encode, c->decode = decode, c->ctx = ctx;
    c->encode_op = c->lift_op = c->read_op = -1;
    c->tr = (struct tsr_dtype_traits){c->name, block_size, type_size, 1, g_codec_to[n],
                                      g_codec_from[n]};
    at = n;
    g_n_codecs = n + 1;
  }
  pthread_mutex_unlock(&g_codec_lock);
  if (st == TSR_OK) *id = TSR_DTYPE_CODEC_BASE + at;
  return st;
}

tsr_status tsr_dtype_codec_set_ops(int type_id, int32_t encode_op, int32_t lift_op,
                                   int32_t read_op) {
  const int i = type_id - TSR_DTYPE_CODEC_BASE;
  if (i < 0 || i >= g_n_codecs)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "dtype %d is no codec dtype", type_id);
  g_codecs[i].encode_op = encode_op;
  g_codecs[i].lift_op = lift_op;
  g_codecs[i].read_op = read_op;
  return TSR_OK;
}

int tsr_dtype_codec_ops(int type_id, int32_t *encode_op, int32_t *lift_op, int32_t *read_op) {
  const int i = type_id - TSR_DTYPE_CODEC_BASE;
  if (i < 0 || i >= g_n_codecs || g_codecs[i].encode_op < 0) return 0;
  *encode_op = g_codecs[i].encode_op;
  *lift_op = g_codecs[i].lift_op;
  *read_op = g_codecs[i].read_op;
  return 1;
}

void tsr_dtype_set_codec_source(const struct tsr_dtype_traits *(*traits)(int)) {
  g_codec_source = traits;
}

const struct tsr_dtype_traits *tsr_dtype_traits(int type_id) {
  const struct tsr_dtype_traits *tr = NULL;
  if (type_id >= 0 && type_id < TSR_DTYPE_COUNT)
    tr = &g_traits[type_id];
  else if (type_id >= TSR_DTYPE_OWN_BASE && type_id < TSR_DTYPE_OWN_END)
    tr = &g_own_traits[type_id - TSR_DTYPE_OWN_BASE];
  else if (type_id >= TSR_DTYPE_CODEC_BASE && type_id < TSR_DTYPE_CODEC_BASE + TSR_DTYPE_CODEC_MAX)
    return g_codec_source ? g_codec_source(type_id)
           : type_id - TSR_DTYPE_CODEC_BASE < g_n_codecs ? &g_codecs[type_id - TSR_DTYPE_CODEC_BASE].tr
                                                         : NULL;
  return tr && tr->name ? tr : NULL;
}

int tsr_dtype_valid(int type_id) { return tsr_dtype_traits(type_id) != NULL; }

const char *tsr_dtype_name(enum tsr_dtype t) {
  const struct tsr_dtype_traits *tr = tsr_dtype_traits((int)t);
  return tr ? tr->name : "invalid";
}

int tsr_dtype_from_name(const char *name) {
  for (int i = 0; i < TSR_DTYPE_COUNT; i++)
    if (g_traits[i].name && strcasecmp(g_traits[i].name, name) == 0) return i;
  for (int i = 0; i < N_OWN; i++)
    if (g_own_traits[i].name && strcasecmp(g_own_traits[i].name, name) == 0)
      return TSR_DTYPE_OWN_BASE + i;
  return -1;
}

int64_t tsr_dtype_block_size(enum tsr_dtype t) {
  const struct tsr_dtype_traits *tr = tsr_dtype_traits((int)t);
  return tr ? tr->block_size : 0;
}

size_t tsr_dtype_type_size(enum tsr_dtype t) {
  const struct tsr_dtype_traits *tr = tsr_dtype_traits((int)t);
  return tr ? tr->type_size : 0;
}

size_t tsr_dtype_row_size(enum tsr_dtype t, int64_t n) {
  const struct tsr_dtype_traits *tr = tsr_dtype_traits((int)t);
  if (!tr || n < 0 || n % tr->block_size) return 0;
  size_t bytes;
  if (!tsr_size_mul((size_t)(n / tr->block_size), tr->type_size, &bytes)) return 0;
  return bytes;
}

tsr_status tsr_dtype_to_f32(enum tsr_dtype t, const void *src, float *dst, int64_t n) {
  const struct tsr_dtype_traits *tr = tsr_dtype_traits((int)t);
  if (!tr || !tr->to_f32)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "no dequantizer for type %s",
                         tsr_dtype_name(t));
  if (n % tr->block_size)
    return tsr_error_set(TSR_ERR_INVALID_ARG,
                         "%lld elements is not a multiple of %s's block size %lld",
                         (long long)n, tr->name, (long long)tr->block_size);
  tr->to_f32(src, dst, n);
  return TSR_OK;
}

tsr_status tsr_dtype_from_f32(enum tsr_dtype t, const float *src, void *dst, int64_t n) {
  const struct tsr_dtype_traits *tr = tsr_dtype_traits((int)t);
  if (!tr || !tr->from_f32)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "no quantizer for type %s",
                         tsr_dtype_name(t));
  if (n % tr->block_size)
    return tsr_error_set(TSR_ERR_INVALID_ARG,
                         "%lld elements is not a multiple of %s's block size %lld",
                         (long long)n, tr->name, (long long)tr->block_size);
  tr->from_f32(src, dst, n);
  return TSR_OK;
}
