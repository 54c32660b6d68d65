/*
** The core KV cache: exact bytes, codec blocks, writes through a real graph,
** the sliding ring, context exhaustion, sequences, masks, state slots and
** KV-shared layers.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "harness.h"
#include "kv/kv_cache.h"
#include "op_test_util.h"

/* ---- codecs straight from the dtype traits (as the built-in plugin does) -- */

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

static struct tsr_kv_codec_v1 C_F16, C_Q8_0, C_Q4_0;

static void codecs_init(void) {
  C_F16 = codec_of(TSR_F16);
  C_Q8_0 = codec_of(TSR_Q8_0);
  C_Q4_0 = codec_of(TSR_Q4_0);
}

static int32_t full_cells(const struct tsr_kv_cache *c) {
  return tsr_kv_cache_n_cells(c, TSR_KV_POOL_FULL);
}

static struct tsr_arch_layer full_layer(int hkv, int dk, int dv) {
  return (struct tsr_arch_layer){.kind = TSR_LAYER_FULL, .n_head = hkv * 2, .n_head_kv = hkv,
                                 .head_dim_k = dk, .head_dim_v = dv};
}

static struct tsr_arch_layer sliding_layer(int hkv, int dk, int dv, int window) {
  struct tsr_arch_layer l = full_layer(hkv, dk, dv);
  l.kind = TSR_LAYER_SLIDING;
  l.window = window;
  return l;
}

static struct tsr_arch_layer linear_layer(int64_t state_bytes) {
  return (struct tsr_arch_layer){.kind = TSR_LAYER_LINEAR, .state_bytes = state_bytes};
}

static uint64_t a64(uint64_t n) { return (n + 63) / 64 * 64; }

/* ---- bytes ------------------------------------------------------------------ */

static void test_plan_bytes_equal_allocated_bytes_for_mixed_layers_and_codecs(void) {
  struct tsr_arch_layer layers[6] = {
      full_layer(2, 64, 64), sliding_layer(4, 32, 64, 8), linear_layer(1000),
      full_layer(2, 64, 64), sliding_layer(2, 64, 32, 5), full_layer(2, 64, 64)};
  layers[3].kv_shared_from = 1; /* reads layer 0's */
  struct tsr_kv_layer_codecs codecs[6] = {
      {.k = &C_F16, .v = &C_Q4_0}, {.k = &C_Q8_0, .v = &C_F16}, {.k = NULL, .v = NULL}, {.k = NULL, .v = NULL},
      {.k = &C_Q4_0, .v = &C_Q8_0}, {.k = &C_Q8_0, .v = &C_Q8_0}};
  struct tsr_kv_cache_params p = {.n_ctx = 100, .n_seq = 3, .n_ubatch = 5};
  struct tsr_kv_plan plan;
  CHECK_OK(tsr_kv_cache_plan_bytes(layers, 6, codecs, &p, &plan));
  struct tsr_kv_cache *c = NULL;
  CHECK_OK(tsr_kv_cache_new(layers, 6, codecs, &p, &c));
  CHECK(c != NULL);
  CHECK(plan.bytes == tsr_kv_cache_bytes(c));
  /* the formula by hand: ring = min(100, 3 * (8 + 5)) = 39 cells */
  CHECK(plan.kind_cells[TSR_LAYER_SLIDING] == 39);
  CHECK(tsr_kv_cache_n_cells(c, TSR_KV_POOL_SLIDING) == 39);
  CHECK(plan.kind_cells[TSR_LAYER_FULL] == 100);
  uint64_t meta = a64(100 * 4) + a64(100 * 8) + a64(5 * 4) + a64(39 * 4) + a64(39 * 8) +
                  a64(5 * 4);
  uint64_t full = a64(64 * 2 * 100 * 2) + a64(64 / 32 * 18 * 100 * 2) /* L0 f16 / q4_0 */
                  + a64(64 / 32 * 34 * 100 * 2) * 2;                   /* L5 q8_0 / q8_0 */
  uint64_t sliding = a64(32 / 32 * 34 * 39 * 4) + a64(64 * 2 * 39 * 4)  /* L1 q8_0 / f16 */
                     + a64(64 / 32 * 18 * 39 * 2) + a64(32 / 32 * 34 * 39 * 2); /* L4 */
  uint64_t state = a64(1000 * 3);
  CHECK(plan.bytes == meta + full + sliding + state);
  CHECK(plan.kind_bytes[TSR_LAYER_LINEAR] == state);
  CHECK(plan.kind_bytes[TSR_LAYER_FULL] + plan.kind_bytes[TSR_LAYER_SLIDING] +
            plan.kind_bytes[TSR_LAYER_LINEAR] == plan.bytes);
  tsr_kv_cache_free(c);
}

/* Resident bytes of this process now (/proc/self/statm), 0 where unreadable. */
static uint64_t resident_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long long size = 0, pages = 0;
  const int got = f ? fscanf(f, "%llu %llu", &size, &pages) : 0;
  if (f) fclose(f);
  return got == 2 ? (uint64_t)pages * (uint64_t)sysconf(_SC_PAGESIZE) : 0;
}

struct buffer_list {
  void *p[8];
  size_t n[8];
  int count;
};

static tsr_status collect_buffer(void *ctx, void *p, size_t bytes) {
  struct buffer_list *l = ctx;
  if (l->count < 8) l->p[l->count] = p, l->n[l->count] = bytes, l->count++;
  return TSR_OK;
}

/* A cache planned for many cells costs the host what has been written: a device backend
** writes its own copy, and the 1M run's 8,932 MiB of host cache were pages never used. */
static void test_a_large_cache_is_resident_only_where_written(void) {
  struct tsr_arch_layer layers[1] = {full_layer(8, 128, 128)};
  struct tsr_kv_layer_codecs codecs[1] = {{.k = &C_F16, .v = &C_F16}};
  struct tsr_kv_cache_params p = {.n_ctx = 65536, .n_seq = 1, .n_ubatch = 512};
  const uint64_t before = resident_bytes();
  CHECK(before > 0);
  struct tsr_kv_cache *c = NULL;
  CHECK_OK(tsr_kv_cache_new(layers, 1, codecs, &p, &c));
  const uint64_t planned = tsr_kv_cache_bytes(c); /* 256 MiB of K and V */
  CHECK(planned >= 256u << 20);
  const uint64_t after = resident_bytes();
  CHECK_MSG(after < before + planned / 16, "%.1f MiB resident after a %.1f MiB cache",
            (after - before) / 1048576.0, planned / 1048576.0);
  struct buffer_list l = {{0}, {0}, 0};
  CHECK_OK(tsr_kv_cache_each_buffer(c, collect_buffer, &l));
  CHECK(l.count >= 2);
  int zero = 1;
  for (int i = 0; i < l.count; i++) { /* zeros, and writable */
    unsigned char *b = l.p[i];
    zero &= b[0] == 0 && b[l.n[i] - 1] == 0;
    b[0] = 1, b[l.n[i] - 1] = 2;
  }
  CHECK(zero);
  CHECK(resident_bytes() < before + planned / 16);
  tsr_kv_cache_free(c);
}

static void test_head_dim_not_whole_codec_blocks_is_refused_naming_layer_and_codec(void) {
  struct tsr_arch_layer layers[2] = {full_layer(1, 64, 64), full_layer(1, 48, 64)};
  struct tsr_kv_layer_codecs codecs[2] = {{.k = &C_F16, .v = &C_F16}, {.k = &C_Q8_0, .v = &C_F16}};
  struct tsr_kv_cache_params p = {.n_ctx = 16, .n_seq = 1, .n_ubatch = 4};
  struct tsr_kv_plan plan;
  CHECK(tsr_kv_cache_plan_bytes(layers, 2, codecs, &p, &plan) == TSR_ERR_UNSUPPORTED);
  CHECK(strstr(tsr_error_message(), "layer 1") != NULL);
  CHECK(strstr(tsr_error_message(), "q8_0") != NULL);
  struct tsr_kv_cache *c = NULL;
  CHECK(tsr_kv_cache_new(layers, 2, codecs, &p, &c) == TSR_ERR_UNSUPPORTED);
  CHECK(c == NULL);
}

/* A codec's state_shape is the plugin's word: dims out of range, a refusal, or more
** tensors than a codec may keep are refused at plan time naming the layer and codec;
** checkpoint rows past the ubatch are refused too. */
static tsr_status bad_shape(void *ctx, int32_t head_dim, int32_t n_head_kv, bool is_k, int32_t i,
                            const char **name, int64_t ne[2]) {
  (void)head_dim, (void)n_head_kv, (void)is_k, (void)i;
  *name = "huge";
  ne[0] = *(const int64_t *)ctx, ne[1] = 1;
  return ne[0] < 0 ? tsr_error_set(TSR_ERR_UNSUPPORTED, "not for this layer") : TSR_OK;
}

static void test_hostile_codec_state_and_checkpoints_are_refused(void) {
  struct tsr_arch_layer layers[2] = {full_layer(1, 64, 64), linear_layer(256)};
  struct tsr_kv_cache_params p = {.n_ctx = 16, .n_seq = 1, .n_ubatch = 4};
  struct tsr_kv_plan plan;
  const int64_t dims[3] = {0, (int64_t)1 << 40, -1};
  const char *want[3] = {"dims 0 x 1", "dims 1099511627776 x 1", "not for this layer"};
  for (int i = 0; i < 3; i++) {
    struct tsr_kv_codec_v1 codec = C_F16;
    codec.ctx = (void *)&dims[i], codec.n_state = 1, codec.state_shape = bad_shape;
    struct tsr_kv_layer_codecs codecs[2] = {{.k = &C_F16, .v = &codec}, {0}};
    CHECK(tsr_kv_cache_plan_bytes(layers, 1, codecs, &p, &plan) != TSR_OK);
    CHECK_MSG(strstr(tsr_error_message(), "layer 0: V codec f16") &&
                  strstr(tsr_error_message(), want[i]),
              "%s", tsr_error_message());
  }
  struct tsr_kv_codec_v1 many = C_F16;
  many.n_state = TSR_KV_CODEC_MAX_STATE + 1, many.state_shape = bad_shape;
  struct tsr_kv_layer_codecs codecs[2] = {{.k = &many, .v = &C_F16}, {0}};
  CHECK(tsr_kv_cache_plan_bytes(layers, 1, codecs, &p, &plan) == TSR_ERR_INVALID_ARG);
  CHECK(strstr(tsr_error_message(), "declares 5 state tensors") != NULL);
  codecs[0].k = &C_F16;
  p.n_checkpoints = p.n_ubatch + 1;
  CHECK(tsr_kv_cache_plan_bytes(layers, 2, codecs, &p, &plan) == TSR_ERR_INVALID_ARG);
  CHECK(strstr(tsr_error_message(), "checkpoint rows") != NULL);
  /* and the rows a speculation step keeps are planned as allocated */
  p.n_checkpoints = 3;
  struct tsr_kv_cache *c = NULL;
  CHECK_OK(tsr_kv_cache_plan_bytes(layers, 2, codecs, &p, &plan));
  CHECK_OK(tsr_kv_cache_new(layers, 2, codecs, &p, &c));
  if (c) {
    CHECK(tsr_kv_cache_bytes(c) == plan.bytes && tsr_kv_cache_n_checkpoints(c) == 3);
    CHECK(tsr_kv_cache_checkpoints(c, 1) != NULL && tsr_kv_cache_checkpoints(c, 0) == NULL);
  }
  tsr_kv_cache_free(c);
}

/* ---- writes through a graph ---------------------------------------------- */

/* Bytes of the reference encoding of n values in dt. */
static void encode_ref(enum tsr_dtype dt, const float *x, int64_t n, uint8_t *out) {
  CHECK_OK(tsr_dtype_from_f32(dt, x, out, n));
}

static void test_store_writes_every_ubatch_byte_exact_for_its_codec(void) {
  enum { D = 64, H = 2, NCTX = 16 };
  struct tsr_arch_layer layers[2] = {full_layer(H, D, D), full_layer(H, D, D)};
  struct tsr_kv_layer_codecs codecs[2] = {{.k = &C_Q8_0, .v = &C_Q4_0}, {.k = &C_F16, .v = &C_Q8_0}};
  struct tsr_kv_cache_params p = {.n_ctx = NCTX, .n_seq = 1, .n_ubatch = 4};
  struct tsr_kv_cache *c = NULL;
  CHECK_OK(tsr_kv_cache_new(layers, 2, codecs, &p, &c));
  if (!c) return;
  /* every written row, by position: [layer][k or v][pos][head][D] */
  static float rows[2][2][NCTX][H][D];
  int32_t cell_of[NCTX];
  const int sizes[3] = {4, 3, 4};
  int32_t next = 0;
  struct tsr_tensor *all[2][2] = {{NULL}};
  struct tsr_test_graph tg = {0};
  for (int ub = 0; ub < 3; ub++) {
    int n = sizes[ub];
    int32_t pos[4], seq[4] = {0};
    for (int i = 0; i < n; i++) pos[i] = next + i;
    struct tsr_kv_slots slots;
    CHECK_OK(tsr_kv_cache_prepare(c, pos, seq, n, &slots));
    if (ub) tsr_test_graph_free(&tg);
    tsr_test_graph_init(&tg, 256);
    struct tsr_tensor *idx = tsr_new_tensor_1d(tg.g, TSR_I32, n);
    struct tsr_tensor *in[2][2];
    for (int l = 0; l < 2; l++) {
      for (int kv = 0; kv < 2; kv++) {
        /* projections come out [D, H, n]; the cache takes them permuted to [D, n, H] */
        in[l][kv] = tsr_new_tensor_3d(tg.g, TSR_F32, D, H, n);
      }
      struct tsr_tensor *k = tsr_permute(tg.g, in[l][0], 0, 2, 1, 3);
      struct tsr_tensor *v = tsr_permute(tg.g, in[l][1], 0, 2, 1, 3);
      tsr_kv_cache_store(tg.g, c, l, k, v, idx, &all[l][0], &all[l][1]);
      tsr_graph_mark_output(all[l][0]);
      tsr_graph_mark_output(all[l][1]);
    }
    CHECK_OK(tsr_test_graph_alloc(&tg));
    if (tsr_graph_status(tg.g) != TSR_OK) break;
    for (int i = 0; i < n; i++) {
      tsr_test_set(idx, i, 0, 0, 0, slots.cells[TSR_KV_POOL_FULL][i]);
      cell_of[pos[i]] = slots.cells[TSR_KV_POOL_FULL][i];
    }
    for (int l = 0; l < 2; l++)
      for (int kv = 0; kv < 2; kv++)
        for (int i = 0; i < n; i++)
          for (int h = 0; h < H; h++) {
            float *r = rows[l][kv][pos[i]][h];
            for (int d = 0; d < D; d++) r[d] = tsr_test_normal();
            tsr_test_set_row(in[l][kv], h, i, 0, r);
          }
    CHECK_OK(tsr_test_graph_run(&tg, 2));
    next += n;
  }
  /* after three ubatches every position's rows are in its cell, exactly as encoded */
  CHECK(next == 11);
  int bad = 0;
  for (int l = 0; l < 2; l++)
    for (int kv = 0; kv < 2; kv++) {
      struct tsr_tensor *t = all[l][kv];
      CHECK(t != NULL && t->ne[0] == D && t->ne[1] == NCTX && t->ne[2] == H);
      if (!t) continue;
      size_t rb = tsr_dtype_row_size(t->dtype, D);
      for (int ps = 0; ps < next; ps++)
        for (int h = 0; h < H; h++) {
          uint8_t ref[D * 4];
          encode_ref(t->dtype, rows[l][kv][ps][h], D, ref);
          if (memcmp(tsr_test_addr(t, 0, cell_of[ps], h, 0), ref, rb)) bad++;
          float back[D];
          tsr_dtype_to_f32(t->dtype, ref, back, D);
          for (int d = 0; d < D; d++)
            if (tsr_test_get(t, d, cell_of[ps], h, 0) != back[d]) bad++;
        }
    }
  CHECK(bad == 0);
  tsr_test_graph_free(&tg);
  tsr_kv_cache_free(c);
}

/* ---- the sliding ring ------------------------------------------------------ */

/* Bitmask of the positions (< 64) the pool holds; -1 if one is out of range. */
static int64_t held(const struct tsr_kv_cache *c, enum tsr_kv_pool pool) {
  int64_t m = 0;
  for (int32_t i = 0; i < tsr_kv_cache_n_cells(c, pool); i++) {
    int32_t p = tsr_kv_cache_cell_pos(c, pool, i);
    if (p >= 64) return -1;
    if (p >= 0) m |= (int64_t)1 << p;
  }
  return m;
}

static int64_t span(int lo, int hi) { /* positions lo..hi */
  int64_t m = 0;
  for (int p = lo < 0 ? 0 : lo; p <= hi; p++) m |= (int64_t)1 << p;
  return m;
}

/* A sliding layer of window 4 and a full layer, f16, ubatches of 2: a ring of
** n_seq x 6 cells. */
static struct tsr_kv_cache *ring_cache(int32_t n_ctx, int32_t n_seq) {
  struct tsr_arch_layer layers[2] = {sliding_layer(1, 32, 32, 4), full_layer(1, 32, 32)};
  struct tsr_kv_layer_codecs codecs[2] = {{.k = &C_F16, .v = &C_F16}, {.k = &C_F16, .v = &C_F16}};
  struct tsr_kv_cache_params p = {.n_ctx = n_ctx, .n_seq = n_seq, .n_ubatch = 2};
  struct tsr_kv_cache *c = NULL;
  CHECK_OK(tsr_kv_cache_new(layers, 2, codecs, &p, &c));
  return c;
}

static void test_sliding_ring_keeps_the_window_and_its_slack_and_never_fills(void) {
  struct tsr_kv_cache *c = ring_cache(64, 1);
  if (!c) return;
  CHECK(tsr_kv_cache_n_cells(c, TSR_KV_POOL_SLIDING) == 6); /* window 4 + ubatch 2 */
  int fails = 0, wrong = 0;
  for (int32_t t = 0; t < 20; t++) {
    int32_t seq = 0;
    struct tsr_kv_slots s;
    if (tsr_kv_cache_prepare(c, &t, &seq, 1, &s) != TSR_OK) fails++;
    /* the query at t sees t-3..t; the ring keeps its 6 newest: t-5..t */
    if (held(c, TSR_KV_POOL_SLIDING) != span(t - 5, t)) wrong++;
  }
  CHECK(fails == 0);
  CHECK(wrong == 0);
  CHECK(held(c, TSR_KV_POOL_SLIDING) == span(14, 19));
  CHECK(held(c, TSR_KV_POOL_FULL) == span(0, 19)); /* the full pool keeps everything */
  /* two-token steps: the oldest two go, the first query of each step still sees its
  ** whole window */
  tsr_kv_cache_clear(c);
  for (int32_t t = 0; t < 20; t += 2) {
    int32_t pos[2] = {t, t + 1}, seq[2] = {0, 0};
    struct tsr_kv_slots s;
    if (tsr_kv_cache_prepare(c, pos, seq, 2, &s) != TSR_OK) fails++;
    if (held(c, TSR_KV_POOL_SLIDING) != span(t - 4, t + 1)) wrong++;
  }
  CHECK(fails == 0);
  CHECK(wrong == 0);
  tsr_kv_cache_free(c);
}

/* Positions (< 64) of sequence seq that the sliding pool holds, as a bitmask. */
static int64_t held_by(const struct tsr_kv_cache *c, int32_t seq) {
  int64_t m = 0;
  for (int32_t i = 0; i < tsr_kv_cache_n_cells(c, TSR_KV_POOL_SLIDING); i++) {
    const int32_t p = tsr_kv_cache_cell_pos(c, TSR_KV_POOL_SLIDING, i);
    if (p >= 0 && p < 64 && (tsr_kv_cache_cell_seqs(c, TSR_KV_POOL_SLIDING, i) >> seq & 1))
      m |= (int64_t)1 << p;
  }
  return m;
}

/* Each sequence keeps its last window + n_ubatch positions, and no more: one that
** runs ahead leaves another's share alone. */
static void test_ring_shares_are_kept_per_sequence(void) {
  struct tsr_kv_cache *c = ring_cache(128, 2);
  if (!c) return;
  CHECK(tsr_kv_cache_n_cells(c, TSR_KV_POOL_SLIDING) == 12);
  for (int32_t s = 0; s < 2; s++)
    for (int32_t t = 0; t < 30 - 10 * s; t++) {
      struct tsr_kv_slots sl;
      CHECK_OK(tsr_kv_cache_prepare(c, &t, &s, 1, &sl));
    }
  CHECK(held_by(c, 0) == span(24, 29));
  CHECK(held_by(c, 1) == span(14, 19));
  /* two tokens of sequence 0 at once: its oldest two go, sequence 1 keeps all six */
  int32_t pos[2] = {30, 31}, seq[2] = {0, 0};
  struct tsr_kv_slots sl;
  CHECK_OK(tsr_kv_cache_prepare(c, pos, seq, 2, &sl));
  CHECK(held_by(c, 0) == span(26, 31));
  CHECK(held_by(c, 1) == span(14, 19));
  /* a copied prefix: sequence 0 runs on and lets go of the shared cells past its share,
  ** which stay with sequence 1, and sequence 1 can still step */
  tsr_kv_cache_clear(c);
  for (int32_t t = 0; t < 20; t++) {
    int32_t s0 = 0;
    CHECK_OK(tsr_kv_cache_prepare(c, &t, &s0, 1, &sl));
  }
  CHECK_OK(tsr_kv_cache_seq_cp(c, 0, 1, -1, -1));
  for (int32_t t = 20; t < 40; t++) {
    int32_t s0 = 0;
    CHECK_OK(tsr_kv_cache_prepare(c, &t, &s0, 1, &sl));
  }
  CHECK(held_by(c, 0) == span(34, 39) && held_by(c, 1) == span(14, 19));
  int32_t t20 = 20, s1 = 1;
  CHECK_OK(tsr_kv_cache_prepare(c, &t20, &s1, 1, &sl));
  CHECK(held_by(c, 1) == span(15, 20));
  tsr_kv_cache_free(c);
}

/* A context shift moves what the ring released with the positions, and a sequence
** that seq_keep empties starts over. */
static void test_released_keys_follow_shifts_and_keeps(void) {
  struct tsr_kv_cache *c = ring_cache(128, 2);
  if (!c) return;
  struct tsr_kv_slots sl;
  for (int32_t s = 0; s < 2; s++)
    for (int32_t t = 0; t < 30; t++) CHECK_OK(tsr_kv_cache_prepare(c, &t, &s, 1, &sl));
  CHECK(tsr_kv_cache_seq_resume_min(c, 0) == 23 + 4); /* 24..29 held */
  /* drop positions 4..13 and move the rest down by 10, as a context shift does */
  CHECK_OK(tsr_kv_cache_seq_rm(c, 0, 4, 14));
  CHECK_OK(tsr_kv_cache_seq_add(c, 0, 14, -1, -10));
  CHECK(tsr_kv_cache_seq_resume_min(c, 0) == 13 + 4);
  CHECK_OK(tsr_kv_cache_seq_rm(c, 0, 17, -1)); /* 13..16 (once 23..26) are held */
  tsr_kv_cache_seq_keep(c, 0);
  CHECK(tsr_kv_cache_seq_resume_min(c, 1) == 0);
  tsr_kv_cache_free(c);
}

/* A tail removal that would resume below the keys the ring still holds is
** refused: a query there would attend to released keys, silently wrong. */
static void test_ring_refuses_to_resume_below_its_released_keys(void) {
  struct tsr_kv_cache *c = ring_cache(64, 1);
  if (!c) return;
  CHECK(tsr_kv_cache_seq_resume_min(c, 0) == 0);
  for (int32_t t = 0; t < 20; t++) {
    int32_t seq = 0;
    struct tsr_kv_slots s;
    CHECK_OK(tsr_kv_cache_prepare(c, &t, &seq, 1, &s));
  }
  /* positions 0..13 were released (the ring keeps 6); a query at p needs p-3..p */
  CHECK(tsr_kv_cache_seq_resume_min(c, 0) == 13 + 4);
  CHECK(tsr_kv_cache_seq_rm(c, 0, 16, -1) == TSR_ERR_UNSUPPORTED);
  CHECK(strstr(tsr_error_message(), "released") != NULL);
  CHECK(tsr_kv_cache_seq_pos_max(c, 0) == 19); /* refused: unchanged */
  CHECK_OK(tsr_kv_cache_seq_rm(c, 0, 17, -1)); /* 17 still has 14..16: the ring's slack */
  /* and the resumed steps reuse the freed cells before older positions */
  for (int32_t t = 17; t < 19; t++) {
    int32_t seq = 0;
    struct tsr_kv_slots s;
    CHECK_OK(tsr_kv_cache_prepare(c, &t, &seq, 1, &s));
  }
  CHECK(held(c, TSR_KV_POOL_SLIDING) == span(14, 18));
  CHECK_OK(tsr_kv_cache_seq_rm(c, 0, -1, -1)); /* the whole sequence is always fine */
  CHECK(tsr_kv_cache_seq_resume_min(c, 0) == 0);
  tsr_kv_cache_free(c);
}

/* ---- exhaustion -------------------------------------------------------------- */

static void test_full_pool_exhaustion_fails_and_leaves_the_cache_unchanged(void) {
  struct tsr_arch_layer layer = full_layer(1, 32, 32);
  struct tsr_kv_layer_codecs codecs = {.k = &C_F16, .v = &C_F16};
  struct tsr_kv_cache_params p = {.n_ctx = 8, .n_seq = 1, .n_ubatch = 4};
  struct tsr_kv_cache *c = NULL;
  CHECK_OK(tsr_kv_cache_new(&layer, 1, &codecs, &p, &c));
  if (!c) return;
  int32_t pos[4] = {0, 1, 2, 3}, seq[4] = {0};
  struct tsr_kv_slots s;
  CHECK_OK(tsr_kv_cache_prepare(c, pos, seq, 4, &s));
  int32_t pos2[3] = {4, 5, 6};
  CHECK_OK(tsr_kv_cache_prepare(c, pos2, seq, 3, &s));
  int32_t before[8];
  tsr_kv_cache_fill_kv_pos(c, TSR_KV_POOL_FULL, -1, full_cells(c), before);
  int32_t pos3[2] = {7, 8};
  CHECK(tsr_kv_cache_prepare(c, pos3, seq, 2, &s) == TSR_ERR_NOMEM);
  CHECK(strstr(tsr_error_message(), "context full") != NULL);
  CHECK(strstr(tsr_error_message(), "n_ctx 8") != NULL);
  int32_t after[8];
  tsr_kv_cache_fill_kv_pos(c, TSR_KV_POOL_FULL, -1, full_cells(c), after);
  CHECK(memcmp(before, after, sizeof before) == 0);
  CHECK(tsr_kv_cache_seq_pos_max(c, 0) == 6);
  CHECK_OK(tsr_kv_cache_prepare(c, pos3, seq, 1, &s)); /* one still fits */
  CHECK(tsr_kv_cache_seq_pos_max(c, 0) == 7);
  tsr_kv_cache_free(c);
}

/* ---- sequences ----------------------------------------------------------------- */

/* Cells visible in row j of a mask. */
static int64_t visible(const float *mask, int n_cells, int j) {
  int64_t m = 0;
  for (int i = 0; i < n_cells; i++)
    if (mask[(size_t)j * n_cells + i] == 0.0f) m |= (int64_t)1 << i;
    else if (!(isinf(mask[(size_t)j * n_cells + i]) && mask[(size_t)j * n_cells + i] < 0))
      return -1;
  return m;
}

/* Cells holding seq at positions [lo, hi]. */
static int64_t cells_of(const struct tsr_kv_cache *c, int seq, int lo, int hi) {
  int64_t m = 0;
  for (int i = 0; i < tsr_kv_cache_n_cells(c, TSR_KV_POOL_FULL); i++) {
    int32_t p = tsr_kv_cache_cell_pos(c, TSR_KV_POOL_FULL, i);
    if (p >= lo && p <= hi && (tsr_kv_cache_cell_seqs(c, TSR_KV_POOL_FULL, i) >> seq & 1))
      m |= (int64_t)1 << i;
  }
  return m;
}

static void test_two_sequences_are_isolated_shared_by_copy_and_removed_alone(void) {
  enum { N = 16 };
  struct tsr_arch_layer layer = full_layer(1, 32, 32);
  struct tsr_kv_layer_codecs codecs = {.k = &C_Q8_0, .v = &C_Q8_0};
  struct tsr_kv_cache_params p = {.n_ctx = N, .n_seq = 2, .n_ubatch = 8};
  struct tsr_kv_cache *c = NULL;
  CHECK_OK(tsr_kv_cache_new(&layer, 1, &codecs, &p, &c));
  if (!c) return;
  /* interleaved: seq 0 at 0..3, seq 1 at 0..2 */
  int32_t pos[7] = {0, 0, 1, 1, 2, 2, 3}, seq[7] = {0, 1, 0, 1, 0, 1, 0};
  struct tsr_kv_slots s;
  CHECK_OK(tsr_kv_cache_prepare(c, pos, seq, 7, &s));
  int64_t s0 = cells_of(c, 0, 0, 100), s1 = cells_of(c, 1, 0, 100);
  CHECK(__builtin_popcountll((uint64_t)s0) == 4 && __builtin_popcountll((uint64_t)s1) == 3);
  CHECK((s0 & s1) == 0);
  float mask[4 * N];
  int32_t qp[4] = {4, 3, 1, 4}, qs[4] = {0, 1, 0, 0};
  tsr_kv_cache_fill_mask(c, TSR_KV_POOL_FULL, qp, qs, 3, true, 0, full_cells(c), mask);
  CHECK(visible(mask, N, 0) == s0);
  CHECK(visible(mask, N, 1) == s1);
  CHECK(visible(mask, N, 2) == cells_of(c, 0, 0, 1)); /* causal */
  tsr_kv_cache_fill_mask(c, TSR_KV_POOL_FULL, qp + 3, qs + 3, 1, true, 2, full_cells(c), mask);
  CHECK(visible(mask, N, 0) == cells_of(c, 0, 3, 3)); /* window 2 at 4: only 3 */
  /* seq 1 forgets its own and shares seq 0's first two positions */
  CHECK_OK(tsr_kv_cache_seq_rm(c, 1, -1, -1));
  CHECK(tsr_kv_cache_seq_pos_max(c, 1) == -1);
  CHECK(cells_of(c, 1, 0, 100) == 0);
  CHECK_OK(tsr_kv_cache_seq_cp(c, 0, 1, 0, 2));
  int64_t shared = cells_of(c, 0, 0, 1);
  CHECK(cells_of(c, 1, 0, 100) == shared);
  CHECK(tsr_kv_cache_seq_pos_max(c, 1) == 1);
  int32_t all[2];
  tsr_kv_cache_seq_pos_max_all(c, all); /* one pass agrees with each shared cell's owners */
  CHECK(all[0] == tsr_kv_cache_seq_pos_max(c, 0) && all[0] == 3 && all[1] == 1);
  tsr_kv_cache_fill_mask(c, TSR_KV_POOL_FULL, qp, qs, 2, true, 0, full_cells(c), mask);
  CHECK(visible(mask, N, 0) == s0);     /* seq 0 still sees all of its own */
  CHECK(visible(mask, N, 1) == shared); /* seq 1 sees the shared cells */
  /* removing seq 0 frees only what seq 1 does not hold */
  CHECK_OK(tsr_kv_cache_seq_rm(c, 0, -1, -1));
  CHECK(tsr_kv_cache_seq_pos_max(c, 0) == -1);
  CHECK(tsr_kv_cache_seq_pos_max(c, 1) == 1);
  int32_t kv_pos[N];
  tsr_kv_cache_fill_kv_pos(c, TSR_KV_POOL_FULL, -1, full_cells(c), kv_pos);
  int live = 0;
  for (int i = 0; i < N; i++) live += kv_pos[i] >= 0;
  CHECK(live == 2);
  /* seq_keep drops the others; a tail removal frees just the tail */
  int32_t pos2[3] = {2, 3, 4}, seq2[3] = {1, 1, 1};
  CHECK_OK(tsr_kv_cache_prepare(c, pos2, seq2, 3, &s));
  CHECK_OK(tsr_kv_cache_seq_rm(c, 1, 3, -1));
  CHECK(tsr_kv_cache_seq_pos_max(c, 1) == 2);
  tsr_kv_cache_seq_keep(c, 0);
  CHECK(tsr_kv_cache_seq_pos_max(c, 1) == -1);
  CHECK(held(c, TSR_KV_POOL_FULL) == 0);
  tsr_kv_cache_free(c);
}

static void test_kv_pos_fill_gives_each_cell_its_position_and_minus_one_when_empty(void) {
  struct tsr_arch_layer layer = full_layer(1, 32, 32);
  struct tsr_kv_layer_codecs codecs = {.k = &C_F16, .v = &C_F16};
  struct tsr_kv_cache_params p = {.n_ctx = 6, .n_seq = 1, .n_ubatch = 4};
  struct tsr_kv_cache *c = NULL;
  CHECK_OK(tsr_kv_cache_new(&layer, 1, &codecs, &p, &c));
  if (!c) return;
  int32_t pos[3] = {10, 11, 12}, seq[3] = {0};
  struct tsr_kv_slots s;
  CHECK_OK(tsr_kv_cache_prepare(c, pos, seq, 3, &s));
  CHECK(s.n == 3 && s.cells[TSR_KV_POOL_FULL] != NULL && s.cells[TSR_KV_POOL_SLIDING] == NULL);
  int32_t kv_pos[6];
  tsr_kv_cache_fill_kv_pos(c, TSR_KV_POOL_FULL, -1, full_cells(c), kv_pos);
  int32_t want[6] = {-1, -1, -1, -1, -1, -1};
  for (int i = 0; i < 3; i++) want[s.cells[TSR_KV_POOL_FULL][i]] = pos[i];
  CHECK(memcmp(kv_pos, want, sizeof want) == 0);
  CHECK_OK(tsr_kv_cache_seq_rm(c, 0, 11, 12));
  want[s.cells[TSR_KV_POOL_FULL][1]] = -1;
  tsr_kv_cache_fill_kv_pos(c, TSR_KV_POOL_FULL, -1, full_cells(c), kv_pos);
  CHECK(memcmp(kv_pos, want, sizeof want) == 0);
  tsr_kv_cache_free(c);
}

static void test_seq_add_moves_positions_and_masks_follow(void) {
  enum { N = 16 };
  struct tsr_arch_layer layer = full_layer(1, 32, 32);
  struct tsr_kv_layer_codecs codecs = {.k = &C_F16, .v = &C_F16};
  struct tsr_kv_cache_params p = {.n_ctx = N, .n_seq = 2, .n_ubatch = 8};
  struct tsr_kv_cache *c = NULL;
  CHECK_OK(tsr_kv_cache_new(&layer, 1, &codecs, &p, &c));
  if (!c) return;
  int32_t pos[8] = {0, 1, 2, 3, 4, 5, 6, 7}, seq[8] = {0};
  struct tsr_kv_slots s;
  CHECK_OK(tsr_kv_cache_prepare(c, pos, seq, 8, &s));
  int32_t cell_of[8];
  memcpy(cell_of, s.cells[TSR_KV_POOL_FULL], sizeof cell_of);
  /* a context shift: keep 0..1, drop 2..4, move 5..7 down by 3 */
  CHECK_OK(tsr_kv_cache_seq_rm(c, 0, 2, 5));
  CHECK_OK(tsr_kv_cache_seq_add(c, 0, 5, -1, -3));
  CHECK(tsr_kv_cache_seq_pos_max(c, 0) == 4);
  for (int t = 0; t < 8; t++) {
    int32_t want = t < 2 ? t : t < 5 ? -1 : t - 3;
    CHECK_MSG(tsr_kv_cache_cell_pos(c, TSR_KV_POOL_FULL, cell_of[t]) == want, "token %d", t);
  }
  /* the causal mask follows: a query at 3 now sees the moved token 5 (at 2) and not 6 */
  float mask[N];
  int32_t qp = 3, qs = 0;
  tsr_kv_cache_fill_mask(c, TSR_KV_POOL_FULL, &qp, &qs, 1, true, 0, full_cells(c), mask);
  int64_t want_vis = (int64_t)1 << cell_of[0] | (int64_t)1 << cell_of[1] |
                     (int64_t)1 << cell_of[5] | (int64_t)1 << cell_of[6];
  CHECK(visible(mask, N, 0) == want_vis);
  /* and so does a window: 2 at query 5 sees positions 4 (token 7) and nothing else held */
  qp = 5;
  tsr_kv_cache_fill_mask(c, TSR_KV_POOL_FULL, &qp, &qs, 1, true, 2, full_cells(c), mask);
  CHECK(visible(mask, N, 0) == (int64_t)1 << cell_of[7]);
  /* moving onto positions seq still holds, below 0, or cells shared with another
  ** sequence is refused and changes nothing */
  int32_t before[N], after[N];
  tsr_kv_cache_fill_kv_pos(c, TSR_KV_POOL_FULL, -1, full_cells(c), before);
  CHECK(tsr_kv_cache_seq_add(c, 0, 2, -1, -1) == TSR_ERR_INVALID_ARG);
  CHECK(tsr_kv_cache_seq_add(c, 0, -1, -1, -1) == TSR_ERR_INVALID_ARG);
  CHECK_OK(tsr_kv_cache_seq_cp(c, 0, 1, 3, 5));
  CHECK(tsr_kv_cache_seq_add(c, 0, 2, -1, 10) == TSR_ERR_UNSUPPORTED);
  CHECK(strstr(tsr_error_message(), "shared") != NULL);
  tsr_kv_cache_fill_kv_pos(c, TSR_KV_POOL_FULL, -1, full_cells(c), after);
  CHECK(memcmp(before, after, sizeof before) == 0);
  /* a move up into free positions is fine */
  CHECK_OK(tsr_kv_cache_seq_rm(c, 1, -1, -1));
  CHECK_OK(tsr_kv_cache_seq_add(c, 0, 2, -1, 10));
  CHECK(tsr_kv_cache_seq_pos_max(c, 0) == 14);
  CHECK(tsr_kv_cache_cell_pos(c, TSR_KV_POOL_FULL, cell_of[1]) == 1);
  tsr_kv_cache_free(c);
}

/* ---- state slots ---------------------------------------------------------------- */

static void test_state_slots_are_per_sequence_zeroed_and_whole_only(void) {
  struct tsr_arch_layer layers[2] = {linear_layer(256), full_layer(1, 32, 32)};
  struct tsr_kv_layer_codecs codecs[2] = {{.k = NULL, .v = NULL}, {.k = &C_F16, .v = &C_F16}};
  struct tsr_kv_cache_params p = {.n_ctx = 16, .n_seq = 3, .n_ubatch = 4};
  struct tsr_kv_cache *c = NULL;
  CHECK_OK(tsr_kv_cache_new(layers, 2, codecs, &p, &c));
  if (!c) return;
  float *st[3];
  for (int s = 0; s < 3; s++) st[s] = tsr_kv_cache_state(c, 0, s);
  CHECK(st[0] && st[1] && st[2]);
  if (!st[0] || !st[1] || !st[2]) return;
  CHECK(st[1] - st[0] == 64 && st[2] - st[1] == 64); /* distinct, not overlapping */
  CHECK(tsr_kv_cache_state(c, 1, 0) == NULL && tsr_kv_cache_state(c, 0, 3) == NULL);
  int nonzero = 0;
  for (int s = 0; s < 3; s++)
    for (int i = 0; i < 64; i++) nonzero += st[s][i] != 0.0f;
  CHECK(nonzero == 0);
  for (int s = 0; s < 3; s++)
    for (int i = 0; i < 64; i++) st[s][i] = (float)(s + 1);
  int32_t pos[2] = {0, 1}, seq[2] = {1, 1};
  struct tsr_kv_slots sl;
  CHECK_OK(tsr_kv_cache_prepare(c, pos, seq, 2, &sl));
  /* part of a sequence cannot leave the state: refused, nothing changes */
  CHECK(tsr_kv_cache_seq_rm(c, 1, 1, -1) == TSR_ERR_UNSUPPORTED);
  CHECK(tsr_kv_cache_seq_pos_max(c, 1) == 1);
  CHECK(tsr_kv_cache_seq_cp(c, 1, 2, 0, 1) == TSR_ERR_UNSUPPORTED);
  /* a whole copy copies the state */
  CHECK_OK(tsr_kv_cache_seq_cp(c, 1, 2, -1, -1));
  CHECK(st[2][0] == 2.0f && st[2][63] == 2.0f);
  /* removing a whole sequence zeroes its state only */
  CHECK_OK(tsr_kv_cache_seq_rm(c, 1, -1, -1));
  int bad = 0;
  for (int i = 0; i < 64; i++) bad += st[1][i] != 0.0f || st[0][i] != 1.0f || st[2][i] != 2.0f;
  CHECK(bad == 0);
  tsr_kv_cache_clear(c);
  for (int i = 0; i < 64; i++) bad += st[0][i] != 0.0f || st[2][i] != 0.0f;
  CHECK(bad == 0);
  tsr_kv_cache_free(c);
}

/* ---- KV-shared layers ---------------------------------------------------------- */

/* The cache keeps its free-cell count, the first free cell, each sequence's largest
** position and the span of used cells as cells change, instead of a pass over every cell
** per step: after random prepares, removals, copies, shifts and keeps, all equal a recount
** over the cells (the span: the used cells' end rounded up to TSR_KV_SPAN_STEP), and a
** prepare takes exactly the lowest free cells. */
static void test_kept_counts_equal_a_recount_after_random_changes(void) {
  struct tsr_arch_layer layers[2] = {sliding_layer(1, 32, 32, 8), full_layer(1, 32, 32)};
  struct tsr_kv_layer_codecs codecs[2] = {{.k = &C_F16, .v = &C_F16}, {.k = &C_F16, .v = &C_F16}};
  struct tsr_kv_cache_params p = {.n_ctx = 600, .n_seq = 3, .n_ubatch = 16};
  struct tsr_kv_cache *c = NULL;
  CHECK_OK(tsr_kv_cache_new(layers, 2, codecs, &p, &c));
  if (!c) return;
  const int32_t cells = tsr_kv_cache_n_cells(c, TSR_KV_POOL_FULL);
  int bad_free = 0, bad_max = 0, bad_cells = 0, bad_span = 0, prepared = 0, spans_seen = 0;
  for (int step = 0; step < 3000; step++) {
    const int32_t s = (int32_t)(tsr_test_next() % 3), op = (int32_t)(tsr_test_next() % 10);
    int32_t lens[3];
    tsr_kv_cache_seq_pos_max_all(c, lens);
    if (op < 6) { /* the next 1..16 positions of s */
      int32_t n = 1 + (int32_t)(tsr_test_next() % 16), pos[16], seq[16], lowest[16], k = 0;
      for (int32_t i = 0; i < n; i++) pos[i] = lens[s] + 1 + i, seq[i] = s;
      for (int32_t i = 0; i < cells && k < n; i++)
        if (tsr_kv_cache_cell_pos(c, TSR_KV_POOL_FULL, i) < 0) lowest[k++] = i;
      struct tsr_kv_slots sl;
      if (tsr_kv_cache_prepare(c, pos, seq, n, &sl) == TSR_OK) {
        prepared++;
        for (int32_t i = 0; i < n; i++) bad_cells += sl.cells[TSR_KV_POOL_FULL][i] != lowest[i];
      }
    } else if (op < 8 && lens[s] >= 0) { /* a tail, or the whole sequence */
      const int32_t p0 = (int32_t)(tsr_test_next() % (uint64_t)(lens[s] + 1));
      (void)tsr_kv_cache_seq_rm(c, s, op == 6 ? p0 : -1, -1);
    } else if (op == 8) {
      const int32_t d = (s + 1) % 3;
      if (lens[d] < 0) (void)tsr_kv_cache_seq_cp(c, s, d, -1, -1);
      else (void)tsr_kv_cache_seq_add(c, d, -1, -1, 1);
    } else if (tsr_test_next() % 8 == 0) {
      tsr_kv_cache_seq_keep(c, s);
    }
    /* recount */
    int32_t free_cells = 0, want[3] = {-1, -1, -1}, got[3], end = 0;
    for (int32_t i = 0; i < cells; i++) {
      const int32_t pos = tsr_kv_cache_cell_pos(c, TSR_KV_POOL_FULL, i);
      const uint64_t m = tsr_kv_cache_cell_seqs(c, TSR_KV_POOL_FULL, i);
      free_cells += pos < 0;
      if (pos >= 0) end = i + 1;
      for (int q = 0; q < 3; q++)
        if ((m >> q & 1) && pos > want[q]) want[q] = pos;
    }
    bad_free += tsr_kv_cache_n_free(c, TSR_KV_POOL_FULL) != free_cells;
    int32_t span = (end + TSR_KV_SPAN_STEP - 1) / TSR_KV_SPAN_STEP * TSR_KV_SPAN_STEP;
    span = span < TSR_KV_SPAN_STEP ? TSR_KV_SPAN_STEP : span > cells ? cells : span;
    const int32_t kept = tsr_kv_cache_span(c, TSR_KV_POOL_FULL);
    bad_span += kept != span;
    spans_seen |= 1 << (kept / TSR_KV_SPAN_STEP);
    tsr_kv_cache_seq_pos_max_all(c, got);
    for (int q = 0; q < 3; q++) bad_max += got[q] != want[q] || tsr_kv_cache_seq_pos_max(c, q) != want[q];
  }
  CHECK_MSG(prepared > 500, "%d prepares", prepared);
  CHECK_MSG(spans_seen == 6, "spans seen (bit k: k steps) %#x", spans_seen); /* 256; 512, 600 */
  CHECK_MSG(!bad_free && !bad_max && !bad_cells && !bad_span,
            "%d free counts, %d maxima, %d cells, %d spans differ", bad_free, bad_max, bad_cells,
            bad_span);
  tsr_kv_cache_free(c);
}

static void test_shared_layer_allocates_nothing_and_aliases_its_source(void) {
  struct tsr_arch_layer layers[2] = {full_layer(2, 32, 32), full_layer(2, 32, 32)};
  layers[1].kv_shared_from = 1;
  struct tsr_kv_layer_codecs codecs[2] = {{.k = &C_Q8_0, .v = &C_F16}, {.k = NULL, .v = NULL}};
  struct tsr_kv_cache_params p = {.n_ctx = 8, .n_seq = 1, .n_ubatch = 2};
  struct tsr_kv_plan one, two;
  CHECK_OK(tsr_kv_cache_plan_bytes(layers, 1, codecs, &p, &one));
  CHECK_OK(tsr_kv_cache_plan_bytes(layers, 2, codecs, &p, &two));
  CHECK(one.bytes == two.bytes);
  struct tsr_kv_cache *c = NULL;
  CHECK_OK(tsr_kv_cache_new(layers, 2, codecs, &p, &c));
  if (!c) return;
  CHECK(tsr_kv_cache_bytes(c) == one.bytes);
  CHECK(tsr_kv_cache_layer_pool(c, 1) == TSR_KV_POOL_FULL);
  struct tsr_graph *g = tsr_graph_new(64);
  struct tsr_tensor *k = tsr_new_tensor_3d(g, TSR_F32, 32, 2, 2);
  struct tsr_tensor *v = tsr_new_tensor_3d(g, TSR_F32, 32, 2, 2);
  struct tsr_tensor *idx = tsr_new_tensor_1d(g, TSR_I32, 2);
  struct tsr_tensor *ka, *va, *kb, *vb;
  tsr_kv_cache_store(g, c, 0, k, v, idx, &ka, &va);
  tsr_kv_cache_layer_views(g, c, 1, &kb, &vb);
  CHECK(ka != NULL && ka == kb && va == vb);
  /* a shared layer cannot be written */
  struct tsr_tensor *kx, *vx;
  tsr_kv_cache_store(g, c, 1, k, v, idx, &kx, &vx);
  CHECK(kx == NULL && tsr_graph_status(g) == TSR_ERR_INVALID_ARG);
  void *k_data = ka ? ka->data : NULL, *v_data = va ? va->data : NULL;
  tsr_graph_free(g);
  /* in a graph without the source's write: plain views of the same bytes */
  g = tsr_graph_new(16);
  tsr_kv_cache_layer_views(g, c, 1, &kb, &vb);
  CHECK(kb && vb && k_data && kb->data == k_data && vb->data == v_data);
  CHECK(kb && kb->dtype == TSR_Q8_0 && kb->ne[1] == 8 && kb->ne[2] == 2);
  tsr_graph_free(g);
  tsr_kv_cache_free(c);
}

int main(void) {
  codecs_init();
  TSR_RUN(test_plan_bytes_equal_allocated_bytes_for_mixed_layers_and_codecs);
  TSR_RUN(test_hostile_codec_state_and_checkpoints_are_refused);
  TSR_RUN(test_a_large_cache_is_resident_only_where_written);
  TSR_RUN(test_head_dim_not_whole_codec_blocks_is_refused_naming_layer_and_codec);
  TSR_RUN(test_store_writes_every_ubatch_byte_exact_for_its_codec);
  TSR_RUN(test_sliding_ring_keeps_the_window_and_its_slack_and_never_fills);
  TSR_RUN(test_ring_refuses_to_resume_below_its_released_keys);
  TSR_RUN(test_ring_shares_are_kept_per_sequence);
  TSR_RUN(test_released_keys_follow_shifts_and_keeps);
  TSR_RUN(test_full_pool_exhaustion_fails_and_leaves_the_cache_unchanged);
  TSR_RUN(test_two_sequences_are_isolated_shared_by_copy_and_removed_alone);
  TSR_RUN(test_kv_pos_fill_gives_each_cell_its_position_and_minus_one_when_empty);
  TSR_RUN(test_seq_add_moves_positions_and_masks_follow);
  TSR_RUN(test_state_slots_are_per_sequence_zeroed_and_whole_only);
  TSR_RUN(test_shared_layer_allocates_nothing_and_aliases_its_source);
  TSR_RUN(test_kept_counts_equal_a_recount_after_random_changes);
  return TSR_TEST_EXIT();
}
