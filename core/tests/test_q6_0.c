/*
** q6_0, tessera's own KV codec (layout in core/kv/KV_CODECS.md): its dtype id
** stays out of GGUF's range and out of files, hand-built blocks decode to the
** documented values, the reference quantizer writes the documented bytes,
** its error sits between q8_0's and q5_0's, an all-zero block stays zero,
** set_rows writes the reference bytes into a q6_0 cache, and the KV cache
** plans q6_0 buffers at exactly 26 bytes per 32 values.
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "graph/dtype.h"
#include "common/error.h"
#include "model/gguf.h"
#include "harness.h"
#include "kv/kv_cache.h"
#include "op_test_util.h"

#define QK 32
#define BLOCK 26

/* Packs 32 six-bit codes as KV_CODECS.md states it, written independently of
** core/graph/quant.c: d, ql (low nibbles: j low, j+16 high), qh (2 bits of j,
** j+8, j+16, j+24 in bit pairs 0-1, 2-3, 4-5, 6-7). */
static void pack_by_hand(uint16_t d, const int *q, uint8_t *blk) {
  blk[0] = (uint8_t)(d & 0xff), blk[1] = (uint8_t)(d >> 8);
  for (int j = 0; j < 16; j++) blk[2 + j] = (uint8_t)(q[j] % 16 + 16 * (q[j + 16] % 16));
  for (int j = 0; j < 8; j++)
    blk[18 + j] = (uint8_t)(q[j] / 16 + 4 * (q[j + 8] / 16) + 16 * (q[j + 16] / 16) +
                            64 * (q[j + 24] / 16));
}

static void test_q6_0_has_a_tessera_only_id_and_26_byte_blocks(void) {
  CHECK(TSR_Q6_0 >= TSR_DTYPE_COUNT); /* can never be a GGUF type id */
  const struct tsr_dtype_traits *tr = tsr_dtype_traits(TSR_Q6_0);
  CHECK(tr != NULL);
  if (!tr) return;
  CHECK(strcmp(tr->name, "q6_0") == 0);
  CHECK(tr->block_size == QK && tr->type_size == BLOCK && tr->is_quantized);
  CHECK(tr->to_f32 == tsr_dequantize_row_q6_0 && tr->from_f32 == tsr_quantize_row_q6_0_ref);
  CHECK(tsr_dtype_from_name("q6_0") == TSR_Q6_0);
  CHECK(tsr_dtype_from_name("Q6_0") == TSR_Q6_0);
  CHECK(strcmp(tsr_dtype_name(TSR_Q6_0), "q6_0") == 0);
  CHECK(tsr_dtype_row_size(TSR_Q6_0, 128) == 4 * BLOCK);
  CHECK(tsr_dtype_row_size(TSR_Q6_0, 48) == 0); /* not whole blocks */
  CHECK(tsr_dtype_traits(TSR_DTYPE_OWN_BASE - 1) == NULL);
  CHECK(tsr_dtype_traits(TSR_DTYPE_OWN_END) == NULL);
  CHECK(tsr_dtype_traits(TSR_DTYPE_COUNT) == NULL);
}

/* A one-tensor GGUF v3 file in memory: 32 values of type `type` at offset 64. */
static size_t tiny_gguf(uint32_t type, uint8_t *buf) {
  memset(buf, 0, 192);
  uint8_t *p = buf;
  memcpy(p, "GGUF", 4), p += 4;
  const uint32_t version = 3, n_dims = 1;
  const uint64_t n_tensors = 1, n_kv = 0, name_len = 1, ne0 = 32, offset = 0;
  memcpy(p, &version, 4), p += 4;
  memcpy(p, &n_tensors, 8), p += 8;
  memcpy(p, &n_kv, 8), p += 8;
  memcpy(p, &name_len, 8), p += 8;
  *p++ = 't';
  memcpy(p, &n_dims, 4), p += 4;
  memcpy(p, &ne0, 8), p += 8;
  memcpy(p, &type, 4), p += 4;
  memcpy(p, &offset, 8);
  return 192; /* header 57 bytes, padded to 64, then up to 128 bytes of data */
}

static void test_gguf_reader_refuses_the_q6_0_id_in_a_file(void) {
  uint8_t buf[192];
  struct tsr_gguf *g = NULL;
  /* the same bytes with f32 are a valid file, so the refusal is the type's */
  CHECK_OK(tsr_gguf_open_memory(buf, tiny_gguf(TSR_F32, buf), "f32.gguf", &g));
  tsr_gguf_close(g);
  g = NULL;
  CHECK(tsr_gguf_open_memory(buf, tiny_gguf(TSR_Q6_0, buf), "q6_0.gguf", &g) == TSR_ERR_FORMAT);
  CHECK(g == NULL);
  CHECK_MSG(strstr(tsr_error_message(), "unknown tensor type id 1000"), "%s",
            tsr_error_message());
}

static void test_hand_built_block_decodes_to_documented_values(void) {
  int q[QK];
  for (int j = 0; j < QK; j++) q[j] = 2 * j + (j & 1); /* 0..63, every bit pattern position */
  q[31] = 63;
  uint8_t blk[BLOCK];
  pack_by_hand(0x3800 /* 0.5 */, q, blk);
  float y[QK];
  tsr_dequantize_row_q6_0(blk, y, QK);
  for (int j = 0; j < QK; j++) CHECK_MSG(y[j] == (float)(q[j] - 32) * 0.5f, "element %d", j);
  /* two blocks in a row: the second at byte 26, its own scale (-2) */
  uint8_t two[2 * BLOCK];
  memcpy(two, blk, BLOCK);
  int q2[QK];
  for (int j = 0; j < QK; j++) q2[j] = 63 - q[j];
  pack_by_hand(0xc000 /* -2 */, q2, two + BLOCK);
  float y2[2 * QK];
  tsr_dequantize_row_q6_0(two, y2, 2 * QK);
  CHECK(memcmp(y2, y, sizeof y) == 0);
  for (int j = 0; j < QK; j++) CHECK(y2[QK + j] == (float)(q2[j] - 32) * -2.0f);
}

static void test_quantizer_writes_documented_bytes(void) {
  /* (j - 16) / 4: the largest magnitude is -4 at j = 0, so d = -4 / -32 = 0.125 and q = 2j */
  float x[QK];
  for (int j = 0; j < QK; j++) x[j] = (float)(j - 16) * 0.25f;
  uint8_t blk[BLOCK], want[BLOCK];
  tsr_quantize_row_q6_0_ref(x, blk, QK);
  CHECK(blk[0] == 0x00 && blk[1] == 0x30); /* f16 0.125 */
  CHECK(blk[2 + 1] == 0x22 && blk[2 + 7] == 0xee && blk[2 + 8] == 0x00);
  for (int j = 0; j < 8; j++) CHECK(blk[18 + j] == 0xe4); /* high bits 0, 1, 2, 3 */
  int q[QK];
  for (int j = 0; j < QK; j++) q[j] = 2 * j;
  pack_by_hand(0x3000, q, want);
  CHECK(memcmp(blk, want, BLOCK) == 0);
  float y[QK];
  tsr_dequantize_row_q6_0(blk, y, QK);
  CHECK(memcmp(x, y, sizeof x) == 0); /* every value is a level: exact */

  /* a positive extreme takes a negative scale and maps exactly to q = 0 */
  for (int j = 0; j < QK; j++) x[j] = 0.01f * (float)(j % 7) - 0.03f;
  x[5] = 2.0f;
  tsr_quantize_row_q6_0_ref(x, blk, QK);
  CHECK(tsr_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8)) == -0.0625f);
  tsr_dequantize_row_q6_0(blk, y, QK);
  CHECK(y[5] == 2.0f);
}

static void test_all_zero_block_stays_zero(void) {
  float x[2 * QK] = {0}, y[2 * QK];
  uint8_t blk[2 * BLOCK];
  memset(blk, 0x5a, sizeof blk);
  tsr_quantize_row_q6_0_ref(x, blk, 2 * QK);
  for (int b = 0; b < 2; b++) {
    const uint8_t *p = blk + b * BLOCK;
    CHECK(p[0] == 0 && p[1] == 0);
    for (int j = 0; j < 16; j++) CHECK(p[2 + j] == 0x00); /* q = 32: low nibble 0 */
    for (int j = 0; j < 8; j++) CHECK(p[18 + j] == 0xaa); /* high bits 2 in every pair */
  }
  memset(y, 0xff, sizeof y);
  tsr_dequantize_row_q6_0(blk, y, 2 * QK);
  for (int j = 0; j < 2 * QK; j++) CHECK(y[j] == 0.0f && !signbit(y[j]));
}

static double rel_rmse(enum tsr_dtype t, const float *x, int64_t n, float *y, void *buf) {
  CHECK_OK(tsr_dtype_from_f32(t, x, buf, n));
  CHECK_OK(tsr_dtype_to_f32(t, buf, y, n));
  double se = 0, sx = 0;
  for (int64_t i = 0; i < n; i++) {
    se += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
    sx += (double)x[i] * x[i];
  }
  return sqrt(se / sx);
}

/* N(0,1) in 65536 values measures q8_0 .0054, q6_0 .021, q5_0 .043; the bound
** on q6_0 sits about 15% above, as test_dtype.c's bounds do. Each value is
** within |d| of the original (half a step, plus the f16 rounding of d, plus the
** one clamped level opposite the extreme, which is a whole step off). */
static void test_round_trip_error_between_q8_0_and_q5_0(void) {
  tsr_test_seed(61);
  const int64_t n = 65536;
  float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
  void *buf = malloc((size_t)n * 2);
  for (int64_t i = 0; i < n; i++) x[i] = tsr_test_normal() * (1 + (float)(i / 4096));
  double e8 = rel_rmse(TSR_Q8_0, x, n, y, buf), e5 = rel_rmse(TSR_Q5_0, x, n, y, buf);
  double e6 = rel_rmse(TSR_Q6_0, x, n, y, buf);
  printf("  rel rmse: q8_0 %.4f  q6_0 %.4f  q5_0 %.4f\n", e8, e6, e5);
  CHECK(e8 < e6 && e6 < e5);
  CHECK_MSG(e6 <= 0.025, "q6_0 rel rmse %g", e6);
  CHECK_MSG(e6 <= 0.6 * e5, "one more bit should nearly halve the error: %g vs %g", e6, e5);
  int bad = 0;
  for (int64_t b = 0; b < n / QK; b++) {
    const uint8_t *p = (const uint8_t *)buf + b * BLOCK;
    const float d = fabsf(tsr_f16_to_f32((uint16_t)(p[0] | p[1] << 8)));
    for (int j = 0; j < QK; j++) bad += !(fabsf(x[b * QK + j] - y[b * QK + j]) <= 1.05f * d);
  }
  CHECK_MSG(bad == 0, "%d values off by more than a step", bad);
  free(x), free(y), free(buf);
}

/* set_rows into a q6_0 cache [128, 12 cells, 2 heads] writes the reference
** quantizer's bytes at the indexed cells and leaves the others alone. */
static void test_set_rows_into_q6_0_cache_matches_reference_bytes(void) {
  tsr_test_seed(62);
  enum { K = 128, R = 12, N = 5, H = 2 };
  const size_t rs = 4 * BLOCK, bytes = rs * R * H;
  uint8_t *cache = malloc(bytes), *init = malloc(bytes), *want = malloc(bytes);
  for (size_t i = 0; i < bytes; i++) init[i] = (uint8_t)(tsr_test_next() & 0x3f);
  struct tsr_test_graph tg;
  tsr_test_graph_init(&tg, 8);
  struct tsr_tensor *c = tsr_new_external(tg.g, TSR_Q6_0, 3, (int64_t[]){K, R, H}, cache);
  struct tsr_tensor *src = tsr_new_tensor_3d(tg.g, TSR_F32, K, N, H);
  struct tsr_tensor *idx = tsr_new_tensor_1d(tg.g, TSR_I32, N);
  struct tsr_tensor *y = tsr_set_rows(tg.g, c, src, idx);
  CHECK(y != NULL);
  CHECK_OK(tsr_test_graph_alloc(&tg));
  if (!y || !tg.arena) goto out;
  tsr_test_fill_normal(src, 2.0f);
  const int32_t cells[N] = {7, 0, 11, 3, 8};
  for (int i = 0; i < N; i++) tsr_test_set(idx, i, 0, 0, 0, cells[i]);
  memcpy(want, init, bytes);
  float row[K];
  for (int h = 0; h < H; h++)
    for (int i = 0; i < N; i++) {
      for (int j = 0; j < K; j++) row[j] = (float)tsr_test_get(src, j, i, h, 0);
      tsr_quantize_row_q6_0_ref(row, want + ((size_t)h * R + cells[i]) * rs, K);
    }
  for (int threads = 1; threads <= 3; threads += 2) {
    memcpy(cache, init, bytes);
    CHECK_OK(tsr_test_graph_run(&tg, threads));
    CHECK_MSG(memcmp(cache, want, bytes) == 0, "%d threads", threads);
  }
out:
  tsr_test_graph_free(&tg);
  free(cache), free(init), free(want);
}

static void enc(void *ctx, const float *src, void *dst, int64_t n) {
  tsr_dtype_traits((int)(intptr_t)ctx)->from_f32(src, dst, n);
}

static struct tsr_kv_codec_v1 codec_of(enum tsr_dtype dt) {
  const struct tsr_dtype_traits *tr = tsr_dtype_traits((int)dt);
  return (struct tsr_kv_codec_v1){.struct_size = sizeof(struct tsr_kv_codec_v1),
                                  .name = tr->name, .dtype = (int32_t)dt,
                                  .block_size = tr->block_size, .block_bytes = tr->type_size,
                                  .backends = "cpu", .ctx = (void *)(intptr_t)dt,
                                  .encode_rows = enc};
}

/* One full layer, 2 KV heads of 128, 64 cells: a q6_0 buffer is 64 * 2 * 4
** blocks of 26 bytes, against f16's 64 * 2 * 128 * 2; everything else equal. */
static void test_kv_cache_plans_q6_0_at_26_bytes_per_block(void) {
  struct tsr_arch_layer layer = {.kind = TSR_LAYER_FULL, .n_head = 4, .n_head_kv = 2,
                                 .head_dim_k = 128, .head_dim_v = 128};
  struct tsr_kv_codec_v1 q6 = codec_of(TSR_Q6_0), f16 = codec_of(TSR_F16);
  struct tsr_kv_layer_codecs cq = {.k = &q6, .v = &q6}, cf = {.k = &f16, .v = &f16};
  struct tsr_kv_cache_params p = {.n_ctx = 64, .n_seq = 1, .n_ubatch = 8};
  struct tsr_kv_plan plan_q, plan_f;
  CHECK_OK(tsr_kv_cache_plan_bytes(&layer, 1, &cq, &p, &plan_q));
  CHECK_OK(tsr_kv_cache_plan_bytes(&layer, 1, &cf, &p, &plan_f));
  CHECK(plan_f.bytes - plan_q.bytes == 2 * (64 * 2 * 128 * 2 - 64 * 2 * 4 * BLOCK));
  struct tsr_kv_cache *c = NULL;
  CHECK_OK(tsr_kv_cache_new(&layer, 1, &cq, &p, &c));
  if (c) CHECK(tsr_kv_cache_bytes(c) == plan_q.bytes);
  tsr_kv_cache_free(c);
  /* 80 is not whole q6_0 blocks: refused, naming the codec */
  layer.head_dim_v = 80;
  CHECK(tsr_kv_cache_plan_bytes(&layer, 1, &cq, &p, &plan_q) != TSR_OK);
  CHECK_MSG(strstr(tsr_error_message(), "q6_0"), "%s", tsr_error_message());
}

int main(void) {
  TSR_RUN(test_q6_0_has_a_tessera_only_id_and_26_byte_blocks);
  TSR_RUN(test_gguf_reader_refuses_the_q6_0_id_in_a_file);
  TSR_RUN(test_hand_built_block_decodes_to_documented_values);
  TSR_RUN(test_quantizer_writes_documented_bytes);
  TSR_RUN(test_all_zero_block_stays_zero);
  TSR_RUN(test_round_trip_error_between_q8_0_and_q5_0);
  TSR_RUN(test_set_rows_into_q6_0_cache_matches_reference_bytes);
  TSR_RUN(test_kv_cache_plans_q6_0_at_26_bytes_per_block);
  return TSR_TEST_EXIT();
}
