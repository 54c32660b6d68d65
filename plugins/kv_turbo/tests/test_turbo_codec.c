/*
** kv_turbo's CPU reference, through the plugin as the host loads it:
**   - the rate: per-coordinate MSE on Gaussian rows within 10% of the Lloyd-Max
**     value of each tier (turbo_centroids.h), measured end to end (rotation,
**     blocks, inverse rotation);
**   - encode -> decode against an independent double-precision reference
**     (every centroid scanned, the scale rounded to f16 once);
**   - the decoded block keeps the norm it was given (the corrected scale);
**   - every head dim the issue names (64, 80, 96, 128, 192, 256, 512) through the
**     storage dim: the padding is zeros and the inverse gives the row back;
**   - the rotation is orthogonal and its inverse undoes it;
**   - zero, tiny and huge-but-finite blocks decode finite (no NaN from 0 / 0);
**   - the f16 lift is the f32 decode rounded once;
**   - flash over turbo K/V (the cache as stored, queries rotated or not: the read
**     sees blocks): the backend under test against the cpu reading the f32 decode,
**     every tier pair, head dims 128/256/512 and 64, groups of 1 to 8 q heads, empty
**     cells; on cuda one query runs the GQA kernel in register and three queries the
**     lifted tile kernels, whose first row is the same query: in register = lift
**     within f16 rounding; a row whose keys are all hidden gives zeros.
** --backend cuda runs the last on the GPU (tests/gpu/run.sh check RUN turbo).
*/
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../turbo.h"
#include "../turbo_centroids.h"
#include "abi/plugin_host.h"
#include "graph/backend.h"
#include "graph/graph.h"
#include "tests/harness.h"
#include "tests/codec_test_util.h"

static struct tsr_plugin_host *g_host;
static struct tsr_backend *g_cpu, *g_be; /* g_be: the backend under test */

static float *hook(const struct tsr_kv_codec_v1 *c, const float *x, int64_t in_dim,
                   int64_t rows, bool inverse, int64_t out_dim) {
  return tsr_test_codec_hook(g_cpu, c, x, in_dim, rows, inverse, out_dim);
}

static const char *const g_names[] = {"turbo2", "turbo3", "turbo4", "turbo8"};
static const int g_bits[] = {2, 3, 4, 8};
static const float g_mse[] = {TURBO2_MSE, TURBO3_MSE, TURBO4_MSE, TURBO8_MSE};
static const float g_c2[] = {TURBO2_CENTROIDS}, g_c3[] = {TURBO3_CENTROIDS},
                   g_c4[] = {TURBO4_CENTROIDS}, g_c8[] = {TURBO8_CENTROIDS};
static const float *const g_cent[] = {g_c2, g_c3, g_c4, g_c8};

static const struct tsr_kv_codec_v1 *codec(int t) {
  return tsr_plugin_host_kv_codec(g_host, g_names[t], NULL);
}

static void test_mse_within_ten_percent_of_lloyd_max(void) {
  const int64_t D = 128, rows = 4096;
  float *x = malloc(sizeof(float) * D * rows);
  tsr_test_seed(11);
  for (int64_t i = 0; i < D * rows; i++) x[i] = tsr_test_normal();
  for (int t = 0; t < 4; t++) {
    const struct tsr_kv_codec_v1 *c = codec(t);
    float *y = hook(c, x, D, rows, false, D);
    float *yd = y ? tsr_test_codec_round_trip(c, y, D * rows) : NULL;
    float *xd = yd ? hook(c, yd, D, rows, true, D) : NULL;
    double err = 0, energy = 0;
    for (int64_t i = 0; xd && i < D * rows; i++)
      err += (double)(xd[i] - x[i]) * (xd[i] - x[i]), energy += (double)x[i] * x[i];
    const double mse = err / energy;
    printf("  %s: mse %.4e per coordinate, Lloyd-Max %.4e (ratio %.3f)\n", g_names[t], mse,
           (double)g_mse[t], mse / g_mse[t]);
    CHECK_MSG(xd && fabs(mse / g_mse[t] - 1.0) < 0.10, "%s: mse %.4e vs %.4e", g_names[t], mse,
              (double)g_mse[t]);
    free(y), free(yd), free(xd);
  }
  free(x);
}

/* The reference of one block in double: every centroid scanned for the nearest (ties
** low), s = |y| / |c| rounded to f16, then s c. */
static void reference_block(int t, const float *y, double *out) {
  double ss = 0;
  for (int i = 0; i < TURBO_BLOCK; i++) ss += (double)y[i] * y[i];
  const double norm = sqrt(ss);
  int idx[TURBO_BLOCK];
  double cc = 0;
  for (int i = 0; i < TURBO_BLOCK; i++) {
    const double u = norm > 0 ? y[i] * 8.0 / norm : 0;
    int best = 0;
    for (int k = 1; k < 1 << g_bits[t]; k++)
      if (fabs(u - g_cent[t][k]) < fabs(u - g_cent[t][best])) best = k;
    idx[i] = best, cc += (double)g_cent[t][best] * g_cent[t][best];
  }
  const double s = norm > 0 ? (double)(_Float16)(norm / sqrt(cc)) : 0;
  for (int i = 0; i < TURBO_BLOCK; i++) out[i] = s * g_cent[t][idx[i]];
}

static void test_round_trip_matches_double_reference(void) {
  const int64_t n = TURBO_BLOCK * 2000;
  float *y = malloc(sizeof(float) * n);
  double ref[TURBO_BLOCK];
  tsr_test_seed(12);
  for (int64_t i = 0; i < n; i++) /* blocks of many scales, some with outliers */
    y[i] = tsr_test_normal() * (i % 7 == 0 ? 40.0f : 1.0f) *
           powf(10.0f, (float)(i / TURBO_BLOCK % 9) - 4);
  for (int t = 0; t < 4; t++) {
    const struct tsr_kv_codec_v1 *c = codec(t);
    float *d = tsr_test_codec_round_trip(c, y, n);
    int64_t differ = 0;
    for (int64_t b = 0; b < n / TURBO_BLOCK; b++) {
      reference_block(t, y + b * TURBO_BLOCK, ref);
      for (int i = 0; i < TURBO_BLOCK; i++) {
        const double want = ref[i], got = d[b * TURBO_BLOCK + i];
        differ += fabs(got - want) > 1e-6 * fabs(want);
      }
    }
    printf("  %s: %lld of %lld values differ from the double reference\n", g_names[t],
           (long long)differ, (long long)n);
    /* a value within float rounding of a boundary may take the other centroid */
    CHECK_MSG(differ <= n / 20000, "%s: %lld values differ", g_names[t], (long long)differ);
    free(d);
  }
  free(y);
}

static void test_decoded_block_keeps_its_norm(void) {
  float y[TURBO_BLOCK], d[TURBO_BLOCK];
  tsr_test_seed(13);
  for (int t = 0; t < 4; t++) {
    const struct tsr_kv_codec_v1 *c = codec(t);
    uint8_t block[80];
    for (int rep = 0; rep < 50; rep++) {
      double n0 = 0, n1 = 0;
      for (int i = 0; i < TURBO_BLOCK; i++) y[i] = tsr_test_normal() * 3.0f, n0 += y[i] * y[i];
      c->encode_rows(c->ctx, y, block, TURBO_BLOCK);
      c->decode_f32(c->ctx, block, d, TURBO_BLOCK);
      for (int i = 0; i < TURBO_BLOCK; i++) n1 += (double)d[i] * d[i];
      /* exact but for the f16 rounding of the scale */
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
    const int64_t D = dims[di];
    float *x = malloc(sizeof(float) * D * rows);
    tsr_test_seed(14 + di);
    for (int64_t i = 0; i < D * rows; i++) x[i] = tsr_test_normal();
    for (int t = 0; t < 4; t++) {
      const struct tsr_kv_codec_v1 *c = codec(t);
      CHECK(c->storage_dim(c->ctx, (int32_t)D) == stored[di]);
      /* a head dim no row can have is refused (0), not rounded into a huge one */
      CHECK(c->storage_dim(c->ctx, 0) == 0 && c->storage_dim(c->ctx, -64) == 0 &&
            c->storage_dim(c->ctx, 4097) == 0 && c->storage_dim(c->ctx, INT32_MAX) == 0);
      float *y = hook(c, x, D, rows, false, D);
      if (!y) continue;
      const int64_t S = stored[di];
      /* rotation keeps norms; the padded part of the row is zeros going in */
      for (int64_t r = 0; r < rows; r++) {
        double a = 0, b = 0;
        for (int64_t i = 0; i < D; i++) a += (double)x[r * D + i] * x[r * D + i];
        for (int64_t i = 0; i < S; i++) b += (double)y[r * S + i] * y[r * S + i];
        CHECK_MSG(fabs(a - b) < 1e-4 * a, "head dim %lld: rotation changed a norm", (long long)D);
      }
      float *yd = tsr_test_codec_round_trip(c, y, S * rows);
      float *xd = hook(c, yd, S, rows, true, D);
      double err = 0, energy = 0;
      for (int64_t i = 0; xd && i < D * rows; i++)
        err += (double)(xd[i] - x[i]) * (xd[i] - x[i]), energy += (double)x[i] * x[i];
      /* padding spreads D values over S coordinates: no worse than the tier's rate */
      CHECK_MSG(xd && err / energy < 1.25 * g_mse[t], "head dim %lld, %s: mse %.4e", (long long)D,
                g_names[t], err / energy);
      free(y), free(yd), free(xd);
    }
    free(x);
  }
}

static void test_rotation_inverse_is_exact(void) {
  const int64_t D = 256, rows = 8;
  float *x = malloc(sizeof(float) * D * rows);
  tsr_test_seed(15);
  for (int64_t i = 0; i < D * rows; i++) x[i] = tsr_test_normal();
  const struct tsr_kv_codec_v1 *c = codec(1);
  float *y = hook(c, x, D, rows, false, D);
  float *z = y ? hook(c, y, D, rows, true, D) : NULL;
  double worst = 0, moved = 0;
  for (int64_t i = 0; z && i < D * rows; i++)
    worst = fmax(worst, fabs(z[i] - x[i])), moved = fmax(moved, fabs(y[i] - x[i]));
  CHECK_MSG(z && worst < 1e-5, "inverse(forward(x)) off by %g", worst);
  CHECK_MSG(moved > 0.1, "the rotation left rows where they were");
  free(x), free(y), free(z);
}

static void test_degenerate_blocks_decode_finite(void) {
  float y[TURBO_BLOCK], d[TURBO_BLOCK];
  uint8_t block[80];
  for (int t = 0; t < 4; t++) {
    const struct tsr_kv_codec_v1 *c = codec(t);
    const float scales[] = {0.0f, 1e-30f, 1e-8f, 6e4f};
    for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++) {
      for (int i = 0; i < TURBO_BLOCK; i++) y[i] = scales[k] * (i % 3 == 0 ? 1.0f : -0.5f);
      c->encode_rows(c->ctx, y, block, TURBO_BLOCK);
      c->decode_f32(c->ctx, block, d, TURBO_BLOCK);
      bool finite = true;
      for (int i = 0; i < TURBO_BLOCK; i++) finite &= isfinite(d[i]);
      CHECK_MSG(finite, "%s: a block of scale %g decoded to a non-finite value", g_names[t],
                (double)scales[k]);
      if (scales[k] == 0.0f)
        for (int i = 0; i < TURBO_BLOCK; i++) CHECK(d[i] == 0.0f);
    }
  }
}

static void test_f16_lift_is_f32_decode_rounded(void) {
  float y[TURBO_BLOCK * 4], d[TURBO_BLOCK * 4];
  uint16_t h[TURBO_BLOCK * 4];
  uint8_t blocks[4 * 80];
  tsr_test_seed(16);
  for (int i = 0; i < TURBO_BLOCK * 4; i++) y[i] = tsr_test_normal();
  for (int t = 0; t < 4; t++) {
    const struct tsr_kv_codec_v1 *c = codec(t);
    c->encode_rows(c->ctx, y, blocks, TURBO_BLOCK * 4);
    c->decode_f32(c->ctx, blocks, d, TURBO_BLOCK * 4);
    c->decode_f16(c->ctx, blocks, h, TURBO_BLOCK * 4);
    for (int i = 0; i < TURBO_BLOCK * 4; i++) {
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
                               {128, 4, 1, 64},  {64, 2, 4, 300},  {256, 8, 3, 517}};
  static const int pairs[][2] = {{0, 0}, {1, 1}, {2, 2}, {3, 3}, {2, 0}, {3, 1}, {0, 3}};
  double worst_reg = 0, worst_lift = 0, worst_same = 0;
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
      const struct tsr_kv_codec_v1 *kt = codec(pairs[pi][0]), *vt = codec(pairs[pi][1]);
      void *kb = malloc(kt->block_bytes * (size_t)(D / TURBO_BLOCK) * nkv * hkv);
      void *vb = malloc(vt->block_bytes * (size_t)(D / TURBO_BLOCK) * nkv * hkv);
      kt->encode_rows(kt->ctx, kx, kb, (int64_t)D * nkv * hkv);
      vt->encode_rows(vt->ctx, vx, vb, (int64_t)D * nkv * hkv);
      const size_t n = (size_t)D * hq;
      float *ref = malloc(sizeof(float) * n * nq), *one = malloc(sizeof(float) * n);
      float *three = malloc(sizeof(float) * n * nq);
      if (tsr_test_codec_flash(g_cpu, kt, vt, kb, vb, q, kvpos, D, D, nkv, hkv, hq, nq, ref) &&
          tsr_test_codec_flash(g_be, kt, vt, kb, vb, q0, kvpos, D, D, nkv, hkv, hq, 1, one) &&
          tsr_test_codec_flash(g_be, kt, vt, kb, vb, q, kvpos, D, D, nkv, hkv, hq, nq, three)) {
        float *ref0 = malloc(sizeof(float) * n), *three0 = malloc(sizeof(float) * n);
        memcpy(ref0, ref, sizeof(float) * n); /* out [Dv, hq, nq]: query 0 is the first n */
        memcpy(three0, three, sizeof(float) * n);
        const double e1 = tsr_test_rel_err(one, ref0, n), e3 = tsr_test_rel_err(three, ref, n * nq);
        const double same = tsr_test_rel_err(one, three0, n);
        worst_reg = fmax(worst_reg, e1), worst_lift = fmax(worst_lift, e3);
        worst_same = fmax(worst_same, same);
        /* the cpu reads the f32 decode; a device rounds q, the values and the weights to
        ** f16: about 1e-3 relative */
        CHECK_MSG(e1 < 4e-3 && e3 < 4e-3 && same < 4e-3,
                  "D %d, group %d, %d keys, K %s / V %s: one query %.2e, three %.2e from the "
                  "cpu, %.2e apart", D, hq / hkv, nkv, g_names[pairs[pi][0]],
                  g_names[pairs[pi][1]], e1, e3, same);
        free(ref0), free(three0);
      }
      free(kb), free(vb), free(ref), free(one), free(three);
    }
    free(kx), free(vx), free(q), free(q0), free(kvpos);
  }
  printf("  %s: worst relative error from the cpu: one query %.2e, three %.2e; one against "
         "three's first %.2e\n", tsr_backend_name(g_be), worst_reg, worst_lift, worst_same);
}

/* every key hidden (empty cells): zeros from both paths, never NaN */
static void test_rows_without_keys_give_zeros(void) {
  const int D = 256, hkv = 2, hq = 8, nkv = 40;
  float *x = calloc((size_t)D * nkv * hkv, sizeof(float)), q[256 * 3 * 8];
  int32_t kvpos[40];
  for (int j = 0; j < nkv; j++) kvpos[j] = -1;
  for (int i = 0; i < D * 3 * hq; i++) q[i] = 1.0f;
  const struct tsr_kv_codec_v1 *c = codec(1);
  void *b = malloc(c->block_bytes * (size_t)(D / TURBO_BLOCK) * nkv * hkv);
  memset(b, 0xff, c->block_bytes * (size_t)(D / TURBO_BLOCK) * nkv * hkv); /* NaN scales */
  float out[256 * 8 * 3];
  for (int nq = 1; nq <= 3; nq += 2)
    if (tsr_test_codec_flash(g_be, c, c, b, b, q, kvpos, D, D, nkv, hkv, hq, nq, out))
      for (int i = 0; i < D * hq * nq; i++) CHECK_MSG(out[i] == 0.0f, "%d queries: %g", nq, out[i]);
  free(x), free(b);
}

int main(int argc, char **argv) {
  const bool cuda = argc > 2 && !strcmp(argv[1], "--backend") && !strcmp(argv[2], "cuda");
  CHECK_OK(tsr_plugin_host_new(&g_host));
  tsr_status st = tsr_plugin_host_load(g_host, "kv_turbo", NULL, NULL, 0, NULL);
  if (st != TSR_OK || !codec(0) || !codec(3) || tsr_backend_cpu_new(2, &g_cpu) != TSR_OK ||
      (cuda ? tsr_backend_cuda_new(&g_be) : tsr_backend_cpu_new(2, &g_be)) != TSR_OK) {
    fprintf(stderr, "setup failed: %s\n", tsr_error_message());
    return 1;
  }
  TSR_RUN(test_mse_within_ten_percent_of_lloyd_max);
  TSR_RUN(test_round_trip_matches_double_reference);
  TSR_RUN(test_decoded_block_keeps_its_norm);
  TSR_RUN(test_every_head_dim_round_trips);
  TSR_RUN(test_rotation_inverse_is_exact);
  TSR_RUN(test_degenerate_blocks_decode_finite);
  TSR_RUN(test_f16_lift_is_f32_decode_rounded);
  TSR_RUN(test_read_paths_agree_with_the_cpu);
  TSR_RUN(test_rows_without_keys_give_zeros);
  tsr_backend_free(g_be);
  tsr_backend_free(g_cpu);
  tsr_plugin_host_free(g_host);
  return TSR_TEST_EXIT();
}
