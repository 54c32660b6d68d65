/*
** kv_turbo through the engine on the reference fixtures (qwen3: head dim 128;
** gemma4: 256 sliding, 512 full), through flash and through attn_dca (a chunk
** small enough that its three bands act). The golden sequence runs in ubatches
** of 16, so every position past the first ubatch reads K/V back from the cache.
** Distances are RMS logit differences from f32 KV on the CPU:
**   - the tiers rank by bits: turbo2 > turbo3 > turbo4 > turbo8, and turbo8 is as
**     close as q8_0 give or take a factor of 2;
**   - every pair of a turbo tier with a scalar tier or another tier is no farther
**     than the worse of its two symmetric settings (with 25% for noise);
**   - the rotation ran (the plugin's counters) and a turbo cache is not f16's;
**   - kv.boundary layers at f16 bring turbo2 closer to f16, and take those layers' rows out
**     of the rotation;
**   - decode (one token at a time) equals prefill (ubatches of 16): bit for bit where f16
**     KV's do; else (cuda: in register against lifted) within half the tier's distance;
** and on cuda (--backend cuda; tests/gpu/run.sh check RUN turbo):
**   - cuda = cpu: each tier within half its own distance from f32 of the cpu's result
**     (plus f16 KV's): a quantizer amplifies the devices' rounding differences.
** usage: test_turbo_model [--backend cuda] OUT_DIR MODEL.gguf GOLDEN.gguf [MODEL GOLDEN]...
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/plugin_host.h"
#include "abi/setup.h"
#include "common/error.h"
#include "engine/engine.h"
#include "model/gguf.h"
#include "tests/harness.h"
#include "tests/logits_test_util.h"

static const char *g_out, *g_backend = "cpu", *g_model;
static const char *g_kv_more = ""; /* more keys of the profile's kv map: ", boundary: {...}" */
static const char *g_turbo_settings = ""; /* kv_turbo's settings map, "" for none */
static bool g_refusal; /* the engine is expected to refuse the profile: run says so quietly */
static struct tsr_test_golden g_gs;
static size_t g_n;
static const char *const g_attentions[2] = {"flash", "{full: dca, sliding: flash}"};

struct result {
  float *logits;
  uint64_t rotated, unrotated, scaled_layers;
};

static bool run(const char *backend, const char *k, const char *v, const char *attention,
                int ubatch, struct result *r) {
  memset(r, 0, sizeof *r);
  static char path[1024];
  static int serial;
  snprintf(path, sizeof path, "%s/turbo_%d.yaml", g_out, serial++);
  FILE *f = fopen(path, "w");
  if (!f) return false;
  fprintf(f, "model: %s\nbackend: %s\ncontext: 256\nbatch: 256\nubatch: %d\n"
          "kv: {k: %s, v: %s%s}\nattention: %s\nplugins:\n  - arch_qwen\n  - arch_gemma4\n"
          "  - name: attn_dca\n    settings: {chunk_size: 16, local_size: 4}\n"
          "  - name: kv_turbo\n    settings: {%s}\n",
          g_model, backend, ubatch, k, v, g_kv_more, attention, g_turbo_settings);
  fclose(f);
  struct tsr_engine_options opt = {.profile_path = path, .n_threads = 2};
  struct tsr_engine *e = NULL;
  tsr_status st = tsr_engine_new(&opt, &e);
  if (st != TSR_OK && g_refusal) return false;
  CHECK_MSG(st == TSR_OK, "%s, kv %s/%s, %s: %s", g_model, k, v, attention, tsr_error_message());
  if (st != TSR_OK) return false;
  r->logits = malloc(sizeof(float) * g_n);
  st = tsr_engine_eval(e, 0, g_gs.ids, g_gs.n, NULL, r->logits);
  CHECK_MSG(st == TSR_OK, "%s, kv %s/%s: %s", g_model, k, v, tsr_error_message());
  const struct tsr_plugin *p = tsr_plugin_host_find_plugin(tsr_engine_setup(e)->host, "kv_turbo");
  if (p) {
    r->rotated = tsr_plugin_engaged(p, "rows_rotated");
    r->unrotated = tsr_plugin_engaged(p, "outputs_unrotated");
    r->scaled_layers = tsr_plugin_engaged(p, "innerq_layers_scaled");
  }
  tsr_engine_free(e);
  if (st != TSR_OK) free(r->logits), r->logits = NULL;
  return st == TSR_OK;
}

static double rms(const float *a, const float *b) {
  double s = 0;
  for (size_t i = 0; i < g_n; i++) s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
  return sqrt(s / (double)g_n);
}

static const char *const g_tiers[] = {"turbo2", "turbo3", "turbo4", "turbo8"};

/* the pairs a deployment mixes: a scalar K with a turbo V, a stronger K than V, and the
** reverse */
static const char *const g_pairs[][2] = {{"q8_0", "turbo3"}, {"q8_0", "turbo2"},
                                         {"turbo4", "turbo2"}, {"turbo3", "f16"},
                                         {"turbo2", "turbo4"}, {"turbo8", "q4_0"}};

static double symmetric(const char *codec, const double *tier_d, double f16_d, double q8_d,
                        double q4_d) {
  for (int t = 0; t < 4; t++)
    if (!strcmp(codec, g_tiers[t])) return tier_d[t];
  return !strcmp(codec, "f16") ? f16_d : !strcmp(codec, "q8_0") ? q8_d : q4_d;
}

static void test_tiers_rank_by_bits_and_pairs_compose(void) {
  for (int a = 0; a < 2; a++) {
    const char *att = g_attentions[a];
    struct result f32, f16, q8, q4, tier[4];
    if (!run("cpu", "f32", "f32", att, 16, &f32)) continue;
    bool ok = run(g_backend, "f16", "f16", att, 16, &f16) &&
              run(g_backend, "q8_0", "q8_0", att, 16, &q8) &&
              run(g_backend, "q4_0", "q4_0", att, 16, &q4);
    double d[4] = {0};
    for (int t = 0; t < 4 && ok; t++) {
      ok = run(g_backend, g_tiers[t], g_tiers[t], att, 16, &tier[t]);
      if (!ok) break;
      d[t] = rms(tier[t].logits, f32.logits);
      CHECK_MSG(tier[t].rotated > 0 && tier[t].unrotated > 0, "%s: the rotation never ran",
                g_tiers[t]);
      CHECK_MSG(rms(tier[t].logits, f16.logits) > 0, "%s equals f16 KV bit for bit", g_tiers[t]);
    }
    if (!ok) continue;
    const double d16 = rms(f16.logits, f32.logits), d8 = rms(q8.logits, f32.logits);
    const double d4 = rms(q4.logits, f32.logits);
    printf("  %s, %s, %s: rms logit distance from f32 KV: f16 %.3e q8_0 %.3e q4_0 %.3e | "
           "turbo8 %.3e turbo4 %.3e turbo3 %.3e turbo2 %.3e\n", g_model, g_backend, att, d16, d8,
           d4, d[3], d[2], d[1], d[0]);
    CHECK_MSG(d[0] > d[1] && d[1] > d[2] && d[2] > d[3], "tiers out of order: %.3e %.3e %.3e %.3e",
              d[0], d[1], d[2], d[3]);
    CHECK_MSG(d[3] <= 2 * d8 + d16, "turbo8 %.3e against q8_0 %.3e", d[3], d8);
    for (size_t p = 0; p < sizeof g_pairs / sizeof g_pairs[0]; p++) {
      struct result r;
      if (!run(g_backend, g_pairs[p][0], g_pairs[p][1], att, 16, &r)) continue;
      const double dp = rms(r.logits, f32.logits);
      const double dk = symmetric(g_pairs[p][0], d, d16, d8, d4);
      const double dv = symmetric(g_pairs[p][1], d, d16, d8, d4);
      const double worse = dk > dv ? dk : dv;
      printf("    K %s / V %s: %.3e (symmetric %.3e / %.3e)\n", g_pairs[p][0], g_pairs[p][1], dp,
             dk, dv);
      CHECK_MSG(dp <= 1.25 * worse, "K %s / V %s: %.3e, worse than both symmetric settings "
                "(%.3e, %.3e)", g_pairs[p][0], g_pairs[p][1], dp, dk, dv);
      free(r.logits);
    }
    if (strcmp(g_backend, "cpu")) { /* cuda against the cpu, tier by tier */
      for (int t = 0; t < 4; t++) {
        struct result c;
        if (!run("cpu", g_tiers[t], g_tiers[t], att, 16, &c)) continue;
        const double dc = rms(tier[t].logits, c.logits), dcpu = rms(c.logits, f32.logits);
        printf("    %s: cuda - cpu %.3e (cpu from f32 %.3e)\n", g_tiers[t], dc, dcpu);
        CHECK_MSG(dc <= 0.5 * dcpu + 2 * d16, "%s: cuda is %.3e from the cpu, whose own "
                  "distance from f32 is %.3e", g_tiers[t], dc, dcpu);
        free(c.logits);
      }
    }
    free(f32.logits), free(f16.logits), free(q8.logits), free(q4.logits);
    for (int t = 0; t < 4; t++) free(tier[t].logits);
  }
}

/* One token at a time (decode: on cuda the GQA kernel reading the blocks in register where
** the head dims allow) against ubatches of 16 (prefill: lifted). Where f16 KV's two runs
** are equal bit for bit (qwen3 on the cpu) so are the tiers'. Elsewhere (cuda's two
** attention kernels, gemma4's batched products) they round differently, and a quantizer
** turns such a difference in the rows it
** encodes into whole steps wherever a value sits near a boundary, layer after layer: the
** paths' equivalence on identical cache contents is test_turbo_codec's; here the two
** paths stay within half the tier's own distance from f32 KV. */
static void test_decode_equals_prefill(void) {
  struct result f32, f1, f16, t1, t16;
  if (!run("cpu", "f32", "f32", "flash", 16, &f32)) return;
  if (!run(g_backend, "f16", "f16", "flash", 1, &f1) ||
      !run(g_backend, "f16", "f16", "flash", 16, &f16)) {
    free(f32.logits), free(f1.logits);
    return;
  }
  const double df = rms(f1.logits, f16.logits);
  for (int t = 0; t < 4; t++) {
    if (!run(g_backend, g_tiers[t], g_tiers[t], "flash", 1, &t1)) continue;
    if (run(g_backend, g_tiers[t], g_tiers[t], "flash", 16, &t16)) {
      const double dt = rms(t1.logits, t16.logits), own = rms(t16.logits, f32.logits);
      printf("  %s, %s, %s: decode - prefill %.3e (f16 KV %.3e; %s from f32 %.3e)\n", g_model,
             g_backend, g_tiers[t], dt, df, g_tiers[t], own);
      if (df == 0) /* the same kernels either way: the same cache, bit for bit */
        CHECK_MSG(dt == 0, "%s: decode and prefill differ by %.3e where f16's do not",
                  g_tiers[t], dt);
      else
        CHECK_MSG(dt <= 0.5 * own, "%s: decode and prefill %.3e apart, %.3e from f32",
                  g_tiers[t], dt, own);
      free(t16.logits);
    }
    free(t1.logits);
  }
  free(f32.logits), free(f1.logits), free(f16.logits);
}

/* kv.boundary: turbo2 K/V with the first and last layer at f16 K/V lies between the two,
** and the rotation ran on the other layers only (qwen3's layers are alike: exactly half of
** its 4 layers' rows are rotated). */
static void test_boundary_layers(void) {
  for (int a = 0; a < 2; a++) {
    const char *att = g_attentions[a];
    struct result f32, f16, all, edge;
    if (!run("cpu", "f32", "f32", att, 16, &f32)) continue;
    bool ok = run(g_backend, "f16", "f16", att, 16, &f16) &&
              run(g_backend, "turbo2", "turbo2", att, 16, &all);
    g_kv_more = ", boundary: {layers: 1, k: f16, v: f16}";
    ok = ok && run(g_backend, "turbo2", "turbo2", att, 16, &edge);
    g_kv_more = "";
    if (ok) {
      const double d16 = rms(f16.logits, f32.logits), dall = rms(all.logits, f32.logits);
      const double dedge = rms(edge.logits, f32.logits);
      printf("  %s, %s, %s: turbo2 %.3e, with f16 boundary layers %.3e, f16 %.3e; rows "
             "rotated %llu of %llu\n", g_model, g_backend, att, dall, dedge, d16,
             (unsigned long long)edge.rotated, (unsigned long long)all.rotated);
      CHECK_MSG(d16 < dedge && dedge < dall, "f16 boundary layers: %.3e, not between f16 %.3e "
                "and turbo2 %.3e", dedge, d16, dall);
      CHECK_MSG(edge.rotated > 0 && edge.rotated < all.rotated, "rows rotated: %llu with the "
                "boundary, %llu without", (unsigned long long)edge.rotated,
                (unsigned long long)all.rotated);
      if (strstr(g_model, "qwen3"))
        CHECK_MSG(2 * edge.rotated == all.rotated, "qwen3: %llu rows rotated with 2 of 4 layers "
                  "at f16, %llu with none", (unsigned long long)edge.rotated,
                  (unsigned long long)all.rotated);
      free(edge.logits);
    }
    free(f32.logits), free(f16.logits), free(all.logits);
  }
}

/* The layers a file of kv_turbo's InnerQ records ("layer L ..." lines); -1 unreadable. */
static int innerq_layers(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[65536];
  int n = 0;
  while (fgets(line, sizeof line, f)) n += !strncmp(line, "layer ", 6);
  fclose(f);
  return n;
}

/* InnerQ: a calibration run (cpu) writes every K layer's channel RMS; scaling by them
** changes what turbo3 K stores yet keeps q.k (turbo8 K scaled stays as close to f32 as
** turbo8 K unscaled); a file of other head dims, or both settings, is refused. */
static void test_innerq(void) {
  char file[1024], settings[2100];
  snprintf(file, sizeof file, "%s/%s.innerq", g_out, strstr(g_model, "qwen3") ? "qwen3" : "gemma4");
  remove(file);
  struct result cal;
  snprintf(settings, sizeof settings, "innerq_calibrate: %s", file);
  g_turbo_settings = settings;
  const bool calibrated = run("cpu", "turbo3", "f16", "flash", 16, &cal);
  g_turbo_settings = "";
  const int layers = innerq_layers(file);
  CHECK_MSG(calibrated && layers >= 4, "%s: the calibration recorded %d layers", g_model, layers);
  if (calibrated) free(cal.logits);
  snprintf(settings, sizeof settings, "innerq_scales: %s, innerq_range: 8", file);
  for (int a = 0; a < 2 && calibrated; a++) {
    const char *att = g_attentions[a];
    struct result f32, t3, t8, s3, s8;
    if (!run("cpu", "f32", "f32", att, 16, &f32)) continue;
    bool got = run(g_backend, "turbo3", "f16", att, 16, &t3) &&
               run(g_backend, "turbo8", "f16", att, 16, &t8);
    g_turbo_settings = settings;
    got = got && run(g_backend, "turbo3", "f16", att, 16, &s3) &&
          run(g_backend, "turbo8", "f16", att, 16, &s8);
    g_turbo_settings = "";
    if (!got) continue;
    const double d3 = rms(t3.logits, f32.logits), ds3 = rms(s3.logits, f32.logits);
    const double d8 = rms(t8.logits, f32.logits), ds8 = rms(s8.logits, f32.logits);
    printf("  %s, %s, %s: turbo3 K %.3e, scaled %.3e; turbo8 K %.3e, scaled %.3e; %llu layers "
           "scaled\n", g_model, g_backend, att, d3, ds3, d8, ds8,
           (unsigned long long)s3.scaled_layers);
    CHECK_MSG((int)s3.scaled_layers == layers, "%llu layers scaled of the file's %d",
              (unsigned long long)s3.scaled_layers, layers);
    CHECK_MSG(rms(s3.logits, t3.logits) > 0, "scaled turbo3 K equals unscaled bit for bit");
    CHECK_MSG(ds8 <= 2 * d8, "scaled turbo8 K %.3e from f32, unscaled %.3e: the queries are not "
              "scaled inversely", ds8, d8);
    CHECK_MSG(ds3 <= 2 * d3, "scaled turbo3 K %.3e from f32, unscaled %.3e", ds3, d3);
    free(f32.logits), free(t3.logits), free(t8.logits), free(s3.logits), free(s8.logits);
  }
  /* refusals: both settings; a file of another head dim */
  struct result r;
  snprintf(settings, sizeof settings, "innerq_scales: %s, innerq_calibrate: %s.2", file, file);
  g_turbo_settings = settings;
  g_refusal = true;
  CHECK(!run("cpu", "turbo3", "f16", "flash", 16, &r));
  CHECK(strstr(tsr_error_message(), "innerq_calibrate and innerq_scales both set") != NULL);
  FILE *f = fopen(file, "w");
  if (f) fputs("kv_turbo-innerq 1\nlayer 0 dim 2 rows 1\n1 1\n", f), fclose(f);
  snprintf(settings, sizeof settings, "innerq_scales: %s", file);
  CHECK(!run("cpu", "turbo3", "f16", "flash", 16, &r));
  CHECK_MSG(strstr(tsr_error_message(), "layer 0 has head dim 2 in the file"), "%s",
            tsr_error_message());
  g_refusal = false;
  g_turbo_settings = "";
}

int main(int argc, char **argv) {
  if (argc > 2 && !strcmp(argv[1], "--backend")) g_backend = argv[2], argc -= 2, argv += 2;
  if (argc < 4 || (argc - 2) % 2) {
    fprintf(stderr, "usage: %s [--backend cuda] OUT_DIR MODEL.gguf GOLDEN.gguf [MODEL GOLDEN]...\n",
            argv[0]);
    return 2;
  }
  g_out = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    struct tsr_gguf *gold;
    g_model = argv[i];
    if (!tsr_test_golden_seq0(argv[i + 1], 32, &gold, &g_gs)) return 2;
    g_n = (size_t)g_gs.n * (size_t)g_gs.vocab;
    printf("model %s\n", g_model);
    TSR_RUN(test_tiers_rank_by_bits_and_pairs_compose);
    TSR_RUN(test_decode_equals_prefill);
    TSR_RUN(test_boundary_layers);
    TSR_RUN(test_innerq);
    tsr_gguf_close(gold);
  }
  return TSR_TEST_EXIT();
}
