/*
** kv_tcq's CPU reference, through the plugin as the host loads it, and its Viterbi
** encoder on its own (this file compiles kv_tcq.c in, for its static functions):
**   - Viterbi = every path: on sequences short enough to try all of them (5 steps of
**     turbo3_tcq, 7 of turbo2_tcq), the f64 encoder finds the least-cost path and the
**     f32 one a path of the same cost within f32 rounding;
**   - the encoder (vectorized where the CPU allows) takes the steps the search written
**     plainly takes, ties included;
**   - the trellis earns its bits: end to end (rotation, blocks, inverse rotation) the
**     per-coordinate MSE on Gaussian rows is below the scalar Lloyd-Max quantizer's of
**     the same rate (kv_turbo's turbo2 / turbo3, measured the same way);
**   - the f32 path costs no more than 1e-4 above the f64 audit's, and the blocks decode to
**     f16(scale) times the codebook along the path the bits spell;
**   - the decoded block keeps its norm; every head dim (64 .. 512) through the storage
**     dim; zero, tiny and large blocks decode finite, a NaN row to NaN;
**   - the f16 lift is the f32 decode rounded once;
**   - flash over tcq K/V, and beside q8_0 and (--with-turbo) kv_turbo's tiers: the
**     backend under test against the cpu reading the f32 decode, one query (in register
**     on cuda) and three (lifted), and the one against the three's first (in register =
**     lift within f16 rounding);
**     a row whose keys are all hidden gives zeros;
** and with --backend cuda (tests/gpu/run.sh check RUN tcq):
**   - the CUDA encoder writes the CPU's bytes, bit for bit.
*/
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kv_tcq.c"
#include "../../kv_turbo/turbo_centroids.h"
#include "abi/plugin_host.h"
#include "graph/backend.h"
#include "graph/graph.h"
#include "tests/harness.h"
#include "tests/codec_test_util.h"

static struct tsr_plugin_host *g_host;
static struct tsr_backend *g_cpu, *g_be; /* g_be: the backend under test */
static bool g_with_turbo;                /* --with-turbo: kv_turbo is built, mix its tiers in */

static float *hook(const struct tsr_kv_codec_v1 *c, const float *x, int64_t in_dim,
                   int64_t rows, bool inverse, int64_t out_dim) {
  return tsr_test_codec_hook(g_cpu, c, x, in_dim, rows, inverse, out_dim);
}
static const float g_scalar_mse[TCQ_TIERS] = {TURBO2_MSE, TURBO3_MSE};

static const struct tsr_kv_codec_v1 *codec_named(const char *name) {
  return tsr_plugin_host_kv_codec(g_host, name, NULL);
}
static const struct tsr_kv_codec_v1 *codec(int t) { return codec_named(g_names[t]); }

/* The cost of the path of steps o (n of them) from state 0, in double. */
static double path_cost(const float *book, int k, const float *u, const uint8_t *o, int n) {
  double c = 0;
  for (int t = 0, s = 0; t < n; t++) {
    s = s >> k | o[t] << TCQ_LOW_BITS;
    c += ((double)u[t] - book[s]) * ((double)u[t] - book[s]);
  }
  return c;
}

static void test_viterbi_finds_the_least_cost_path_among_all(void) {
  for (int tier = 0; tier < TCQ_TIERS; tier++) {
    const int k = tcq_step_bits(tier), n = tier == 0 ? 7 : 5;
    const int64_t paths = (int64_t)1 << (k * n);
    tsr_test_seed(21 + tier);
    double worst_f32 = 0;
    for (int rep = 0; rep < 20; rep++) {
      float u[8];
      for (int t = 0; t < n; t++) u[t] = 1.3f * tsr_test_normal();
      double least = INFINITY;
      uint8_t o[8], best[8] = {0};
      for (int64_t p = 0; p < paths; p++) {
        for (int t = 0; t < n; t++) o[t] = (uint8_t)(p >> (k * t) & ((1 << k) - 1));
        const double c = path_cost(g_books[tier], k, u, o, n);
        if (c < least) least = c, memcpy(best, o, sizeof o);
      }
      uint8_t v64[8], v32[8];
      viterbi_f64(g_books[tier], k, u, n, v64);
      viterbi_f32(g_books[tier], k, u, n, v32);
      CHECK_MSG(!memcmp(v64, best, (size_t)n), "%s, %d steps: the f64 path is not the least-cost "
                "one (%.9g against %.9g)", g_names[tier], n,
                path_cost(g_books[tier], k, u, v64, n), least);
      const double c32 = path_cost(g_books[tier], k, u, v32, n);
      worst_f32 = fmax(worst_f32, c32 - least);
      CHECK_MSG(c32 - least <= 1e-5 * (1 + least), "%s: the f32 path costs %.9g, the least %.9g",
                g_names[tier], c32, least);
    }
    printf("  %s: 20 sequences of %d steps, %lld paths each: f64 = exhaustive; f32 at most "
           "%.2e above\n", g_names[tier], n, (long long)paths, worst_f32);
  }
}

/* The encoder (vectorized where the CPU allows) against the search written plainly, one
** state at a time in f32 with the same roundings: the same steps for every block, so the
** CUDA encoder, which matches the plain search, matches the plugin on every CPU. */
static void plain_viterbi(const float *book, int k, const float *u, uint8_t *steps) {
  const int n = tcq_states(k);
  float cost[512], next[512];
  uint8_t back[TCQ_BLOCK][512];
  for (int s = 0; s < n; s++) cost[s] = s ? INFINITY : 0.0f;
  for (int t = 0; t < TCQ_BLOCK; t++) {
    for (int s = 0; s < n; s++) {
      const int m = s & 63;
      float b = cost[m << k];
      int arg = 0;
      for (int p = 1; p < 1 << k; p++)
        if (cost[m << k | p] < b) b = cost[m << k | p], arg = p;
      volatile float d = u[t] - book[s], dd = d * d; /* two roundings, whatever the build */
      next[s] = b + dd, back[t][s] = (uint8_t)arg;
    }
    memcpy(cost, next, sizeof cost);
  }
  int s = 0;
  for (int i = 1; i < n; i++)
    if (cost[i] < cost[s]) s = i;
  for (int t = TCQ_BLOCK - 1; t >= 0; t--) {
    steps[t] = (uint8_t)(s >> TCQ_LOW_BITS);
    s = (s & 63) << k | back[t][s];
  }
}

static void test_encoder_equals_the_plain_search(void) {
  const int64_t blocks = 3000;
  float *y = malloc(sizeof(float) * TCQ_BLOCK * blocks);
  tsr_test_seed(17);
  for (int64_t i = 0; i < TCQ_BLOCK * blocks; i++) /* ties too: values on a coarse grid */
    y[i] = i / TCQ_BLOCK % 3 == 0 ? (float)(int)(2 * tsr_test_normal()) : tsr_test_normal();
  for (int t = 0; t < TCQ_TIERS; t++) {
    const struct tsr_kv_codec_v1 *c = codec(t);
    const int k = tcq_step_bits(t);
    uint8_t *bytes = calloc((size_t)blocks, c->block_bytes);
    c->encode_rows(c->ctx, y, bytes, TCQ_BLOCK * blocks);
    int64_t differ = 0;
    for (int64_t b = 0; b < blocks; b++) {
      float u[TCQ_BLOCK];
      uint8_t want[TCQ_BLOCK];
      if (!(block_normalize(y + b * TCQ_BLOCK, u) > 0)) continue;
      plain_viterbi(g_books[t], k, u, want);
      for (int i = 0; i < TCQ_BLOCK; i++)
        differ += want[i] != tcq_state(bytes + b * c->block_bytes, k, i) >> TCQ_LOW_BITS;
    }
    printf("  %s: %lld of %lld steps differ from the plain search\n", g_names[t],
           (long long)differ, (long long)(TCQ_BLOCK * blocks));
    CHECK_MSG(differ == 0, "%s: %lld steps differ", g_names[t], (long long)differ);
    free(bytes);
  }
  free(y);
}

static void test_mse_below_the_scalar_quantizer_of_the_same_rate(void) {
  const int64_t D = 128, rows = 2048;
  float *x = malloc(sizeof(float) * D * rows);
  tsr_test_seed(11);
  for (int64_t i = 0; i < D * rows; i++) x[i] = tsr_test_normal();
  for (int t = 0; t < TCQ_TIERS; t++) {
    const struct tsr_kv_codec_v1 *c = codec(t);
    float *y = hook(c, x, D, rows, false, D);
    float *yd = y ? tsr_test_codec_round_trip(c, y, D * rows) : NULL;
    float *xd = yd ? hook(c, yd, D, rows, true, D) : NULL;
    double err = 0, energy = 0;
    for (int64_t i = 0; xd && i < D * rows; i++)
      err += (double)(xd[i] - x[i]) * (xd[i] - x[i]), energy += (double)x[i] * x[i];
    const double mse = err / energy;
    printf("  %s: mse %.4e per coordinate, scalar Lloyd-Max at the same rate %.4e (%.1f%% "
           "lower)\n", g_names[t], mse, (double)g_scalar_mse[t], 100 * (1 - mse / g_scalar_mse[t]));
    /* a trellis of 2^(k+6) states gains well over 5% on a Gaussian source */
    CHECK_MSG(xd && mse < 0.95 * g_scalar_mse[t], "%s: mse %.4e, scalar %.4e", g_names[t], mse,
              (double)g_scalar_mse[t]);
    free(y), free(yd), free(xd);
  }
  free(x);
}

/* Each block: the f32 path within 1e-4 of the f64 audit's cost, and the decode equal to
** f16(|y| / |book[path]|) times book[path] for the path the bits spell. */
static void test_round_trip_against_the_f64_audit(void) {
  const int64_t n = TCQ_BLOCK * 1000;
  float *y = malloc(sizeof(float) * n), *d = malloc(sizeof(float) * n);
  tsr_test_seed(12);
  for (int64_t i = 0; i < n; i++) /* blocks of many scales, some with outliers */
    y[i] = tsr_test_normal() * (i % 7 == 0 ? 40.0f : 1.0f) *
           powf(10.0f, (float)(i / TCQ_BLOCK % 9) - 4);
  for (int t = 0; t < TCQ_TIERS; t++) {
    const struct tsr_kv_codec_v1 *c = codec(t);
    const int k = tcq_step_bits(t);
    uint8_t *blocks = calloc((size_t)(n / TCQ_BLOCK), c->block_bytes);
    c->encode_rows(c->ctx, y, blocks, n);
    c->decode_f32(c->ctx, blocks, d, n);
    double worst = 0;
    int64_t wrong = 0;
    for (int64_t b = 0; b < n / TCQ_BLOCK; b++) {
      const uint8_t *blk = blocks + b * c->block_bytes;
      float u[TCQ_BLOCK];
      const double norm = block_normalize(y + b * TCQ_BLOCK, u);
      uint8_t o32[TCQ_BLOCK], o64[TCQ_BLOCK];
      for (int i = 0; i < TCQ_BLOCK; i++) o32[i] = (uint8_t)(tcq_state(blk, k, i) >> TCQ_LOW_BITS);
      viterbi_f64(g_books[t], k, u, TCQ_BLOCK, o64);
      const double c32 = path_cost(g_books[t], k, u, o32, TCQ_BLOCK);
      const double c64 = path_cost(g_books[t], k, u, o64, TCQ_BLOCK);
      worst = fmax(worst, (c32 - c64) / c64);
      double cc = 0;
      for (int i = 0; i < TCQ_BLOCK; i++)
        cc += (double)g_books[t][tcq_state(blk, k, i)] * g_books[t][tcq_state(blk, k, i)];
      const float scale = (float)(_Float16)(norm / sqrt(cc));
      for (int i = 0; i < TCQ_BLOCK; i++)
        wrong += d[b * TCQ_BLOCK + i] != scale * g_books[t][tcq_state(blk, k, i)];
    }
    printf("  %s: f32 paths at most %.2e above the f64 audit's cost; %lld values off the "
           "path's decode\n", g_names[t], worst, (long long)wrong);
    CHECK_MSG(worst < 1e-4, "%s: an f32 path %.2e above the f64 one", g_names[t], worst);
    /* the scale differs from the reference's only where the two lane sums round apart */
    CHECK_MSG(wrong <= n / 1000, "%s: %lld values differ", g_names[t], (long long)wrong);
    free(blocks);
  }
  free(y), free(d);
}

static void test_decoded_block_keeps_its_norm(void) {
  float y[TCQ_BLOCK], d[TCQ_BLOCK];
  uint8_t block[32];
  tsr_test_seed(13);
  for (int t = 0; t < TCQ_TIERS; t++) {
    const struct tsr_kv_codec_v1 *c = codec(t);
    for (int rep = 0; rep < 50; rep++) {
      double n0 = 0, n1 = 0;
      for (int i = 0; i < TCQ_BLOCK; i++) y[i] = tsr_test_normal() * 3.0f, n0 += y[i] * y[i];
      c->encode_rows(c->ctx, y, block, TCQ_BLOCK);
      c->decode_f32(c->ctx, block, d, TCQ_BLOCK);
      for (int i = 0; i < TCQ_BLOCK; i++) n1 += (double)d[i] * d[i];
      CHECK_MSG(fabs(sqrt(n1 / n0) - 1.0) < 1.0 / 1024, "%s: norm %g became %g", g_names[t],
                sqrt(n0), sqrt(n1));
    }
  }
}

static void test_every_head_dim_round_trips(void) {
  static const int dims[] = {64, 80, 96, 128, 192, 256, 512};
  static const int stored[] = {64, 128, 128, 128, 192, 256, 512};
  const int64_t rows = 64;
  for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
    const int64_t D = dims[di], S = stored[di];
    float *x = malloc(sizeof(float) * D * rows);
    tsr_test_seed(14 + di);
    for (int64_t i = 0; i < D * rows; i++) x[i] = tsr_test_normal();
    for (int t = 0; t < TCQ_TIERS; t++) {
      const struct tsr_kv_codec_v1 *c = codec(t);
      CHECK(c->storage_dim(c->ctx, (int32_t)D) == stored[di]);
      CHECK(c->storage_dim(c->ctx, 0) == 0 && c->storage_dim(c->ctx, -64) == 0 &&
            c->storage_dim(c->ctx, 4097) == 0 && c->storage_dim(c->ctx, INT32_MAX) == 0);
      float *y = hook(c, x, D, rows, false, D);
      float *yd = y ? tsr_test_codec_round_trip(c, y, S * rows) : NULL;
      float *xd = yd ? hook(c, yd, S, rows, true, D) : NULL;
      double err = 0, energy = 0;
      for (int64_t i = 0; xd && i < D * rows; i++)
        err += (double)(xd[i] - x[i]) * (xd[i] - x[i]), energy += (double)x[i] * x[i];
      /* padding spreads D values over S coordinates: no worse than the scalar tier */
      CHECK_MSG(xd && err / energy < 1.1 * g_scalar_mse[t], "head dim %lld, %s: mse %.4e",
                (long long)D, g_names[t], err / energy);
      free(y), free(yd), free(xd);
    }
    free(x);
  }
}

static void test_degenerate_blocks(void) {
  float y[TCQ_BLOCK], d[TCQ_BLOCK];
  uint8_t block[32];
  for (int t = 0; t < TCQ_TIERS; t++) {
    const struct tsr_kv_codec_v1 *c = codec(t);
    const float scales[] = {0.0f, 1e-30f, 1e-8f, 6e4f, 1e30f};
    for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
      for (int i = 0; i < TCQ_BLOCK; i++) y[i] = scales[s] * (i % 3 == 0 ? 1.0f : -0.5f);
      c->encode_rows(c->ctx, y, block, TCQ_BLOCK);
      c->decode_f32(c->ctx, block, d, TCQ_BLOCK);
      bool finite = true;
      for (int i = 0; i < TCQ_BLOCK; i++) finite &= isfinite(d[i]);
      /* past f16's range the scale is inf: such a row is broken, not silently zero */
      if (scales[s] < 1e6f)
        CHECK_MSG(finite, "%s: a block of scale %g decoded to a non-finite value", g_names[t],
                  (double)scales[s]);
      if (scales[s] == 0.0f)
        for (int i = 0; i < TCQ_BLOCK; i++) CHECK(d[i] == 0.0f);
    }
    y[5] = NAN;
    c->encode_rows(c->ctx, y, block, TCQ_BLOCK);
    c->decode_f32(c->ctx, block, d, TCQ_BLOCK);
    CHECK_MSG(isnan(d[0]) && isnan(d[63]), "%s: a NaN row decoded to numbers", g_names[t]);
  }
}

static void test_f16_lift_is_f32_decode_rounded(void) {
  float y[TCQ_BLOCK * 4], d[TCQ_BLOCK * 4];
  uint16_t h[TCQ_BLOCK * 4];
  uint8_t blocks[4 * 32];
  tsr_test_seed(16);
  for (int i = 0; i < TCQ_BLOCK * 4; i++) y[i] = tsr_test_normal();
  for (int t = 0; t < TCQ_TIERS; t++) {
    const struct tsr_kv_codec_v1 *c = codec(t);
    c->encode_rows(c->ctx, y, blocks, TCQ_BLOCK * 4);
    c->decode_f32(c->ctx, blocks, d, TCQ_BLOCK * 4);
    c->decode_f16(c->ctx, blocks, h, TCQ_BLOCK * 4);
    for (int i = 0; i < TCQ_BLOCK * 4; i++) {
      const _Float16 want = (_Float16)d[i];
      uint16_t w;
      memcpy(&w, &want, 2);
      CHECK(h[i] == w);
    }
  }
}

static void test_read_paths_agree_with_the_cpu(void) {
  static const int geo[][4] = {/* D (= Dv), hkv, group, nkv */
                               {128, 2, 4, 700}, {256, 2, 8, 333}, {512, 1, 2, 1030},
                               {64, 2, 4, 300},  {256, 8, 3, 517}};
  static const char *const pairs[][2] = {
      {"turbo2_tcq", "turbo2_tcq"}, {"turbo3_tcq", "turbo3_tcq"}, {"turbo3_tcq", "turbo2_tcq"},
      {"turbo2_tcq", "turbo3_tcq"}, {"turbo3_tcq", "turbo3"},     {"turbo4", "turbo3_tcq"},
      {"q8_0", "turbo2_tcq"},       {"turbo3_tcq", "q8_0"}};
  double worst_one = 0, worst_three = 0, worst_same = 0;
  for (size_t gi = 0; gi < sizeof geo / sizeof geo[0]; gi++) {
    const int D = geo[gi][0], hkv = geo[gi][1], hq = hkv * geo[gi][2], nkv = geo[gi][3];
    const int nq = 3;
    tsr_test_seed(100 + gi);
    float *kx = malloc(sizeof(float) * D * nkv * hkv), *vx = malloc(sizeof(float) * D * nkv * hkv);
    float *q = malloc(sizeof(float) * D * nq * hq), *q0 = malloc(sizeof(float) * D * hq);
    for (int i = 0; i < D * nkv * hkv; i++) kx[i] = tsr_test_normal(), vx[i] = tsr_test_normal();
    for (int i = 0; i < D * nq * hq; i++) q[i] = 2.0f * tsr_test_normal();
    for (int h = 0; h < hq; h++) /* q [D, nq, hq]: query 0 of each head alone */
      memcpy(q0 + (size_t)h * D, q + (size_t)h * nq * D, sizeof(float) * D);
    int32_t *kvpos = malloc(sizeof(int32_t) * nkv);
    for (int j = 0; j < nkv; j++) kvpos[j] = j % 13 == 5 ? -1 : j; /* empty cells too */
    for (size_t pi = 0; pi < sizeof pairs / sizeof pairs[0]; pi++) {
      if (!g_with_turbo && (strstr(pairs[pi][0], "turbo") && !strstr(pairs[pi][0], "_tcq")))
        continue;
      if (!g_with_turbo && (strstr(pairs[pi][1], "turbo") && !strstr(pairs[pi][1], "_tcq")))
        continue;
      const struct tsr_kv_codec_v1 *kt = codec_named(pairs[pi][0]), *vt = codec_named(pairs[pi][1]);
      CHECK_MSG(kt && vt, "%s / %s: not registered", pairs[pi][0], pairs[pi][1]);
      if (!kt || !vt) continue;
      const size_t kbytes = kt->block_bytes * (size_t)(D / kt->block_size) * nkv * hkv;
      const size_t vbytes = vt->block_bytes * (size_t)(D / vt->block_size) * nkv * hkv;
      void *kb = malloc(kbytes), *vb = malloc(vbytes);
      kt->encode_rows(kt->ctx, kx, kb, (int64_t)D * nkv * hkv);
      vt->encode_rows(vt->ctx, vx, vb, (int64_t)D * nkv * hkv);
      const size_t n = (size_t)D * hq;
      float *ref = malloc(sizeof(float) * n * nq), *one = malloc(sizeof(float) * n);
      float *three = malloc(sizeof(float) * n * nq);
      /* a device reads a pair of kv_tcq's tiers in its kernel; beside another codec's tier
      ** or a scalar type, each side of a layout of its own is lifted to f16 first, as flash's
      ** negotiation plans it (the cpu reads every pair as stored) */
      const bool ours = strstr(pairs[pi][0], "_tcq") && strstr(pairs[pi][1], "_tcq");
      const bool lift_k = g_be != g_cpu && !ours && tsr_dtype_is_codec(kt->dtype);
      const bool lift_v = g_be != g_cpu && !ours && tsr_dtype_is_codec(vt->dtype);
      if (tsr_test_codec_flash(g_cpu, kt, vt, kb, vb, q, kvpos, D, D, nkv, hkv, hq, nq, ref) &&
          tsr_test_codec_flash_lifted(g_be, kt, vt, kb, vb, q0, kvpos, D, D, nkv, hkv, hq, 1,
                                      lift_k, lift_v, one) &&
          tsr_test_codec_flash_lifted(g_be, kt, vt, kb, vb, q, kvpos, D, D, nkv, hkv, hq, nq,
                                      lift_k, lift_v, three)) {
        /* out [Dv, hq, nq]: query 0 is the first n values */
        const double e1 = tsr_test_rel_err(one, ref, n), e3 = tsr_test_rel_err(three, ref, n * nq);
        const double same = tsr_test_rel_err(one, three, n);
        worst_one = fmax(worst_one, e1), worst_three = fmax(worst_three, e3);
        worst_same = fmax(worst_same, same);
        /* the cpu reads the f32 decode; a device rounds q, the values and the weights to
        ** f16: about 1e-3 relative */
        CHECK_MSG(e1 < 4e-3 && e3 < 4e-3 && same < 4e-3, "D %d, group %d, %d keys, K %s / V %s: "
                  "one query %.2e, three %.2e from the cpu, %.2e apart", D, hq / hkv, nkv,
                  pairs[pi][0], pairs[pi][1], e1, e3, same);
      }
      free(kb), free(vb), free(ref), free(one), free(three);
    }
    free(kx), free(vx), free(q), free(q0), free(kvpos);
  }
  printf("  %s: worst relative error from the cpu: one query %.2e, three %.2e; one against "
         "three's first %.2e\n", tsr_backend_name(g_be), worst_one, worst_three, worst_same);
}

/* every key hidden (empty cells): zeros from both paths, never NaN, whatever the bytes */
static void test_rows_without_keys_give_zeros(void) {
  const int D = 256, hkv = 2, hq = 8, nkv = 40;
  float q[256 * 3 * 8], out[256 * 8 * 3];
  int32_t kvpos[40];
  for (int j = 0; j < nkv; j++) kvpos[j] = -1;
  for (int i = 0; i < D * 3 * hq; i++) q[i] = 1.0f;
  for (int t = 0; t < TCQ_TIERS; t++) {
    const struct tsr_kv_codec_v1 *c = codec(t);
    const size_t bytes = c->block_bytes * (size_t)(D / TCQ_BLOCK) * nkv * hkv;
    void *b = malloc(bytes);
    memset(b, 0xff, bytes); /* NaN scales */
    for (int nq = 1; nq <= 3; nq += 2)
      if (tsr_test_codec_flash(g_be, c, c, b, b, q, kvpos, D, D, nkv, hkv, hq, nq, out))
        for (int i = 0; i < D * hq * nq; i++)
          CHECK_MSG(out[i] == 0.0f, "%s, %d queries: %g", g_names[t], nq, out[i]);
    free(b);
  }
}

/* rows f32 [D, n, h] written by set_rows into a cache of the codec's dtype on backend b */
static bool set_rows(struct tsr_backend *b, const struct tsr_kv_codec_v1 *c, const float *rows,
                     int D, int n, int h, void *cache) {
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *dst =
      tsr_new_external(g, (enum tsr_dtype)c->dtype, 3, (int64_t[]){D, n, h}, cache);
  struct tsr_tensor *src = tsr_new_external(g, TSR_F32, 3, (int64_t[]){D, n, h}, (void *)rows);
  int32_t *idx = malloc(sizeof(int32_t) * (size_t)n);
  for (int i = 0; i < n; i++) idx[i] = n - 1 - i; /* cells in reverse */
  struct tsr_tensor *it = tsr_new_external(g, TSR_I32, 1, (int64_t[]){n}, idx);
  struct tsr_tensor *o = tsr_set_rows(g, dst, src, it);
  void *arena;
  const tsr_status st = tsr_test_compute_node(b, g, o, &arena);
  if (st == TSR_OK && o->data != cache)
    memcpy(cache, o->data, c->block_bytes * (size_t)(D / TCQ_BLOCK) * n * h);
  CHECK_MSG(st == TSR_OK, "set_rows on %s: %s", tsr_backend_name(b), tsr_error_message());
  free(arena), free(idx);
  tsr_graph_free(g);
  return st == TSR_OK;
}

/* The backend's encoder writes the cpu reference's bytes (rotated-like rows of many
** scales, a zero row and a NaN row among them). */
static void test_encoder_matches_the_cpu_bit_for_bit(void) {
  const int D = 256, n = 300, h = 2;
  float *rows = malloc(sizeof(float) * D * n * h);
  tsr_test_seed(31);
  for (int i = 0; i < D * n * h; i++)
    rows[i] = tsr_test_normal() * powf(10.0f, (float)(i / TCQ_BLOCK % 7) - 3);
  for (int i = 0; i < D; i++) rows[5 * D + i] = 0.0f, rows[9 * D + i] = i == 3 ? NAN : 1.0f;
  for (int t = 0; t < TCQ_TIERS; t++) {
    const struct tsr_kv_codec_v1 *c = codec(t);
    const size_t bytes = c->block_bytes * (size_t)(D / TCQ_BLOCK) * n * h;
    uint8_t *want = calloc(bytes, 1), *got = calloc(bytes, 1);
    if (set_rows(g_cpu, c, rows, D, n, h, want) && set_rows(g_be, c, rows, D, n, h, got)) {
      size_t differ = 0;
      for (size_t i = 0; i < bytes; i++) differ += want[i] != got[i];
      printf("  %s on %s: %zu of %zu bytes differ from the cpu's\n", g_names[t],
             tsr_backend_name(g_be), differ, bytes);
      CHECK_MSG(differ == 0, "%s: %zu bytes differ", g_names[t], differ);
    }
    free(want), free(got);
  }
  free(rows);
}

int main(int argc, char **argv) {
  bool cuda = false;
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--with-turbo")) g_with_turbo = true;
    else if (!strcmp(argv[i], "--backend") && i + 1 < argc) cuda = !strcmp(argv[++i], "cuda");
  CHECK_OK(tsr_plugin_host_new(&g_host));
  tsr_status st = tsr_plugin_host_load(g_host, "kv_tcq", NULL, NULL, 0, NULL);
  if (st == TSR_OK && g_with_turbo)
    st = tsr_plugin_host_load(g_host, "kv_turbo", NULL, NULL, 0, NULL);
  if (st != TSR_OK || !codec(0) || !codec(1) || tsr_backend_cpu_new(2, &g_cpu) != TSR_OK ||
      (cuda ? tsr_backend_cuda_new(&g_be) : tsr_backend_cpu_new(2, &g_be)) != TSR_OK) {
    fprintf(stderr, "setup failed: %s\n", tsr_error_message());
    return 1;
  }
  if (!g_with_turbo) printf("kv_turbo is not in this build: pairs with its tiers left out\n");
  TSR_RUN(test_viterbi_finds_the_least_cost_path_among_all);
  TSR_RUN(test_encoder_equals_the_plain_search);
  TSR_RUN(test_mse_below_the_scalar_quantizer_of_the_same_rate);
  TSR_RUN(test_round_trip_against_the_f64_audit);
  TSR_RUN(test_decoded_block_keeps_its_norm);
  TSR_RUN(test_every_head_dim_round_trips);
  TSR_RUN(test_degenerate_blocks);
  TSR_RUN(test_f16_lift_is_f32_decode_rounded);
  TSR_RUN(test_read_paths_agree_with_the_cpu);
  TSR_RUN(test_rows_without_keys_give_zeros);
  TSR_RUN(test_encoder_matches_the_cpu_bit_for_bit);
  tsr_backend_free(g_be);
  tsr_backend_free(g_cpu);
  tsr_plugin_host_free(g_host);
  return TSR_TEST_EXIT();
}
