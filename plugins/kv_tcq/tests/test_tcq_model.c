/*
** kv_tcq through the engine on the reference fixtures (qwen3: head dim 128; gemma4: 256
** sliding, 512 full), through flash and through attn_dca (a chunk small enough that its
** three bands act). The golden sequence runs in ubatches of 16, so every position past
** the first ubatch reads K/V back from the cache. Distances are RMS logit differences
** from f32 KV on the CPU:
**   - turbo3_tcq is closer than turbo2_tcq, neither equals f16 KV, and the rotation ran;
**   - with kv_turbo built (--with-turbo): each trellis tier is no farther than kv_turbo's
**     scalar tier of the same rate;
**   - every pair of a tcq tier with a scalar tier, a turbo tier or the other tcq tier is
**     no farther than the worse of its two symmetric settings (with 25% for noise);
**   - decode (one token at a time) equals prefill (ubatches of 16): bit for bit where f16
**     KV's do; else within half the tier's distance;
**   - the f64 audit encoder lands within 5% of the f32 one's distance; dump_blocks writes
**     whole records of the layers' K and V blocks;
** and on cuda (--backend cuda; tests/gpu/run.sh check RUN tcq):
**   - cuda = cpu: each tier within half its own distance from f32 of the cpu's result
**     (plus f16 KV's).
**   - (--books DIR, the source's codebooks/) the books loaded by the codebooks setting give
**     the compiled-in books' logits bit for bit, and a changed book changes them;
** usage: test_tcq_model [--backend cuda] [--with-turbo] [--books DIR] OUT_DIR MODEL.gguf
**        GOLDEN.gguf [MODEL GOLDEN]...
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
static const char *g_tcq_settings = ""; /* kv_tcq's settings map, "" for none */
static bool g_with_turbo;                /* --with-turbo: kv_turbo is built, compare its tiers */
static const char *g_books;              /* --books DIR: the source's codebooks */
static bool g_refusal; /* the engine is expected to refuse the profile: run says so quietly */
static struct tsr_test_golden g_gs;
static size_t g_n;
static const char *const g_attentions[2] = {"flash", "{full: dca, sliding: flash}"};

struct result {
  float *logits;
  uint64_t rotated, unrotated, dumped;
};

static bool run(const char *backend, const char *k, const char *v, const char *attention,
                int ubatch, struct result *r) {
  memset(r, 0, sizeof *r);
  static char path[1024];
  static int serial;
  snprintf(path, sizeof path, "%s/tcq_%d.yaml", g_out, serial++);
  FILE *f = fopen(path, "w");
  if (!f) return false;
  fprintf(f, "model: %s\nbackend: %s\ncontext: 256\nbatch: 256\nubatch: %d\n"
          "kv: {k: %s, v: %s%s}\nattention: %s\nplugins:\n  - arch_qwen\n  - arch_gemma4\n"
          "  - name: attn_dca\n    settings: {chunk_size: 16, local_size: 4}\n"
          "  - name: kv_tcq\n    settings: {%s}\n%s",
          g_model, backend, ubatch, k, v, g_kv_more, attention, g_tcq_settings,
          g_with_turbo ? "  - kv_turbo\n" : "");
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
  const struct tsr_plugin *p = tsr_plugin_host_find_plugin(tsr_engine_setup(e)->host, "kv_tcq");
  if (p) {
    r->rotated = tsr_plugin_engaged(p, "rows_rotated");
    r->unrotated = tsr_plugin_engaged(p, "outputs_unrotated");
    r->dumped = tsr_plugin_engaged(p, "blocks_dumped");
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

static const char *const g_tiers[] = {"turbo2_tcq", "turbo3_tcq"};
static const char *const g_scalar_twins[] = {"turbo2", "turbo3"};

/* pairs a deployment mixes: the 2.75-bit mixes, a scalar K with a tcq V, a tcq K with f16
** V, and (with kv_turbo) turbo beside tcq */
static const char *const g_pairs[][2] = {{"turbo3_tcq", "turbo2_tcq"}, {"turbo2_tcq", "turbo3_tcq"},
                                         {"q8_0", "turbo2_tcq"},       {"turbo3_tcq", "f16"},
                                         {"turbo4", "turbo2_tcq"},     {"turbo3_tcq", "turbo3"}};

struct distances {
  double f16, q8, tier[2], twin[2];
};

static double symmetric(const char *codec, const struct distances *d) {
  for (int t = 0; t < 2; t++)
    if (!strcmp(codec, g_tiers[t])) return d->tier[t];
  if (!strcmp(codec, "f16")) return d->f16;
  if (!strcmp(codec, "q8_0")) return d->q8;
  return -1;
}

static void test_tiers_and_pairs(void) {
  for (int a = 0; a < 2; a++) {
    const char *att = g_attentions[a];
    struct result f32, f16, q8, tier[2], twin[2];
    memset(twin, 0, sizeof twin);
    if (!run("cpu", "f32", "f32", att, 16, &f32)) continue;
    bool ok = run(g_backend, "f16", "f16", att, 16, &f16) &&
              run(g_backend, "q8_0", "q8_0", att, 16, &q8);
    struct distances d = {0};
    for (int t = 0; t < 2 && ok; t++) {
      ok = run(g_backend, g_tiers[t], g_tiers[t], att, 16, &tier[t]);
      if (ok && g_with_turbo) ok = run(g_backend, g_scalar_twins[t], g_scalar_twins[t], att, 16,
                                       &twin[t]);
      if (!ok) break;
      d.tier[t] = rms(tier[t].logits, f32.logits);
      d.twin[t] = g_with_turbo ? rms(twin[t].logits, f32.logits) : 0;
      CHECK_MSG(tier[t].rotated > 0 && tier[t].unrotated > 0, "%s: the rotation never ran",
                g_tiers[t]);
      CHECK_MSG(rms(tier[t].logits, f16.logits) > 0, "%s equals f16 KV bit for bit", g_tiers[t]);
    }
    if (!ok) continue;
    d.f16 = rms(f16.logits, f32.logits), d.q8 = rms(q8.logits, f32.logits);
    printf("  %s, %s, %s: rms logit distance from f32 KV: f16 %.3e q8_0 %.3e | turbo3_tcq %.3e "
           "turbo2_tcq %.3e", g_model, g_backend, att, d.f16, d.q8, d.tier[1], d.tier[0]);
    if (g_with_turbo) printf(" | turbo3 %.3e turbo2 %.3e", d.twin[1], d.twin[0]);
    printf("\n");
    CHECK_MSG(d.tier[0] > d.tier[1], "turbo2_tcq %.3e not farther than turbo3_tcq %.3e",
              d.tier[0], d.tier[1]);
    for (int t = 0; t < 2 && g_with_turbo; t++)
      CHECK_MSG(d.tier[t] <= d.twin[t], "%s %.3e, farther than %s %.3e", g_tiers[t], d.tier[t],
                g_scalar_twins[t], d.twin[t]);
    for (size_t p = 0; p < sizeof g_pairs / sizeof g_pairs[0]; p++) {
      const double dk = symmetric(g_pairs[p][0], &d), dv = symmetric(g_pairs[p][1], &d);
      const bool turbo_pair = dk < 0 || dv < 0; /* a kv_turbo tier: its twin's distance */
      if (turbo_pair && !g_with_turbo) continue;
      const double dk2 = dk >= 0 ? dk : !strcmp(g_pairs[p][0], "turbo3") ? d.twin[1] : -1;
      const double dv2 = dv >= 0 ? dv : !strcmp(g_pairs[p][1], "turbo3") ? d.twin[1] : -1;
      struct result r;
      if (!run(g_backend, g_pairs[p][0], g_pairs[p][1], att, 16, &r)) continue;
      const double dp = rms(r.logits, f32.logits);
      /* turbo4 (no symmetric run here): no farther than the tcq side alone */
      const double worse = fmax(dk2, dv2);
      printf("    K %s / V %s: %.3e (symmetric %.3e / %.3e)\n", g_pairs[p][0], g_pairs[p][1], dp,
             dk2, dv2);
      CHECK_MSG(dp <= 1.25 * worse, "K %s / V %s: %.3e, worse than both symmetric settings "
                "(%.3e, %.3e)", g_pairs[p][0], g_pairs[p][1], dp, dk2, dv2);
      free(r.logits);
    }
    if (strcmp(g_backend, "cpu")) { /* cuda against the cpu, tier by tier */
      for (int t = 0; t < 2; t++) {
        struct result c;
        if (!run("cpu", g_tiers[t], g_tiers[t], att, 16, &c)) continue;
        const double dc = rms(tier[t].logits, c.logits), dcpu = rms(c.logits, f32.logits);
        printf("    %s: cuda - cpu %.3e (cpu from f32 %.3e)\n", g_tiers[t], dc, dcpu);
        CHECK_MSG(dc <= 0.5 * dcpu + 2 * d.f16, "%s: cuda is %.3e from the cpu, whose own "
                  "distance from f32 is %.3e", g_tiers[t], dc, dcpu);
        free(c.logits);
      }
    }
    free(f32.logits), free(f16.logits), free(q8.logits);
    for (int t = 0; t < 2; t++) free(tier[t].logits), free(twin[t].logits);
  }
}

/* One token at a time (decode: on cuda the read kernel in register where the head dims
** allow) against ubatches of 16 (prefill: lifted); see kv_turbo's test for why the two
** paths may differ by whole quantization steps where f16 KV's runs already differ. */
static void test_decode_equals_prefill(void) {
  struct result f32, f1, f16, t1, t16;
  if (!run("cpu", "f32", "f32", "flash", 16, &f32)) return;
  if (!run(g_backend, "f16", "f16", "flash", 1, &f1) ||
      !run(g_backend, "f16", "f16", "flash", 16, &f16)) {
    free(f32.logits), free(f1.logits);
    return;
  }
  const double df = rms(f1.logits, f16.logits);
  for (int t = 0; t < 2; t++) {
    if (!run(g_backend, g_tiers[t], g_tiers[t], "flash", 1, &t1)) continue;
    if (run(g_backend, g_tiers[t], g_tiers[t], "flash", 16, &t16)) {
      const double dt = rms(t1.logits, t16.logits), own = rms(t16.logits, f32.logits);
      printf("  %s, %s, %s: decode - prefill %.3e (f16 KV %.3e; %s from f32 %.3e)\n", g_model,
             g_backend, g_tiers[t], dt, df, g_tiers[t], own);
      if (df == 0)
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

/* The cpu-only settings: the f64 audit encoder lands where the f32 one does, and
** dump_blocks writes whole records (int32 layer, int32 side, 64 f32) of K and V blocks. */
static void test_audit_and_dump(void) {
  if (strcmp(g_backend, "cpu")) return; /* cpu-only settings */
  struct result f32, t32, t64, dumped;
  char settings[1200], file[1024];
  if (!run("cpu", "f32", "f32", "flash", 16, &f32)) return;
  bool ok = run("cpu", "turbo3_tcq", "turbo3_tcq", "flash", 16, &t32);
  g_tcq_settings = "viterbi: f64";
  ok = run("cpu", "turbo3_tcq", "turbo3_tcq", "flash", 16, &t64) && ok;
  snprintf(file, sizeof file, "%s/%s.blocks", g_out, strstr(g_model, "qwen3") ? "qwen3" : "gemma4");
  snprintf(settings, sizeof settings, "dump_blocks: %s", file);
  g_tcq_settings = settings;
  ok = run("cpu", "turbo2_tcq", "turbo3_tcq", "flash", 16, &dumped) && ok;
  g_tcq_settings = "";
  if (!ok) return;
  const double d32 = rms(t32.logits, f32.logits), d64 = rms(t64.logits, f32.logits);
  FILE *f = fopen(file, "rb");
  long bytes = -1;
  int32_t head[2] = {-1, -1};
  bool sides[2] = {false, false}, sane = f != NULL;
  if (f) {
    fseek(f, 0, SEEK_END);
    bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    float u[64];
    while (fread(head, sizeof head, 1, f) == 1 && fread(u, sizeof u, 1, f) == 1) {
      sane &= head[0] >= 0 && head[0] < 64 && (head[1] == 0 || head[1] == 1);
      if (head[1] == 0 || head[1] == 1) sides[head[1]] = true;
      double n = 0;
      for (int i = 0; i < 64; i++) n += (double)u[i] * u[i];
      sane &= fabs(n - 64) < 1e-3 * 64; /* u = 8 y / |y| */
    }
    fclose(f);
  }
  printf("  %s: turbo3_tcq f32 encoder %.3e from f32 KV, f64 audit %.3e; dump %ld bytes, %llu "
         "blocks counted\n", g_model, d32, d64, bytes, (unsigned long long)dumped.dumped);
  CHECK_MSG(fabs(d64 - d32) <= 0.05 * d32, "f64 audit %.3e against f32 %.3e", d64, d32);
  CHECK_MSG(bytes > 0 && bytes % 264 == 0 && (uint64_t)(bytes / 264) == dumped.dumped,
            "dump of %ld bytes, %llu blocks counted", bytes, (unsigned long long)dumped.dumped);
  CHECK_MSG(sane && sides[0] && sides[1], "dump records: a bad layer, side or scale, or a side "
            "missing (K %d, V %d)", sides[0], sides[1]);
  free(f32.logits), free(t32.logits), free(t64.logits), free(dumped.logits);
}

/* codebooks: the source's books loaded from files give the compiled-in books' logits bit
** for bit; the same books with turbo3_tcq's values halved give others. */
static void test_loaded_codebooks(void) {
  if (strcmp(g_backend, "cpu") || !g_books) return; /* the setting is the cpu's */
  char dir[1100], half[1100], cmd[8192], settings[1200];
  snprintf(dir, sizeof dir, "%s/books", g_out);
  snprintf(half, sizeof half, "%s/books_half", g_out);
  snprintf(cmd, sizeof cmd,
           "mkdir -p '%s' '%s' && cp '%s'/turbo2_tcq.txt '%s'/turbo3_tcq.txt '%s' && "
           "cp '%s'/turbo2_tcq.txt '%s' && awk 'h { printf \"%%.17g\\n\", $1 / 2; next } { print } "
           "/^kv_tcq-codebook/ { h = 1 }' '%s'/turbo3_tcq.txt > '%s'/turbo3_tcq.txt", dir, half,
           g_books, g_books, dir, dir, half, dir, half);
  CHECK_MSG(system(cmd) == 0, "could not copy the codebooks: %s", cmd);
  struct result built, loaded, halved;
  bool ok = run("cpu", "turbo3_tcq", "turbo2_tcq", "flash", 16, &built);
  snprintf(settings, sizeof settings, "codebooks: %s", dir);
  g_tcq_settings = settings;
  ok = run("cpu", "turbo3_tcq", "turbo2_tcq", "flash", 16, &loaded) && ok;
  snprintf(settings, sizeof settings, "codebooks: %s", half);
  ok = run("cpu", "turbo3_tcq", "turbo2_tcq", "flash", 16, &halved) && ok;
  g_tcq_settings = "";
  if (!ok) return;
  printf("  %s: loaded books %.3e from the compiled-in, halved turbo3_tcq book %.3e\n", g_model,
         rms(loaded.logits, built.logits), rms(halved.logits, built.logits));
  CHECK(rms(loaded.logits, built.logits) == 0);
  CHECK(rms(halved.logits, built.logits) > 0);
  free(built.logits), free(loaded.logits), free(halved.logits);
}

int main(int argc, char **argv) {
  for (;;) {
    if (argc > 2 && !strcmp(argv[1], "--backend")) g_backend = argv[2], argc -= 2, argv += 2;
    else if (argc > 2 && !strcmp(argv[1], "--books")) g_books = argv[2], argc -= 2, argv += 2;
    else if (argc > 1 && !strcmp(argv[1], "--with-turbo")) g_with_turbo = true, argc--, argv++;
    else break;
  }
  if (argc < 4 || (argc - 2) % 2) {
    fprintf(stderr, "usage: %s [--backend cuda] [--with-turbo] [--books DIR] OUT_DIR MODEL.gguf "
            "GOLDEN.gguf [MODEL GOLDEN]...\n", argv[0]);
    return 2;
  }
  g_out = argv[1];
  if (!g_with_turbo) printf("kv_turbo is not in this build: its tiers are not compared\n");
  for (int i = 2; i + 1 < argc; i += 2) {
    struct tsr_gguf *gold;
    g_model = argv[i];
    if (!tsr_test_golden_seq0(argv[i + 1], 32, &gold, &g_gs)) return 2;
    g_n = (size_t)g_gs.n * (size_t)g_gs.vocab;
    printf("model %s\n", g_model);
    TSR_RUN(test_tiers_and_pairs);
    TSR_RUN(test_decode_equals_prefill);
    TSR_RUN(test_audit_and_dump);
    TSR_RUN(test_loaded_codebooks);
    tsr_gguf_close(gold);
  }
  return TSR_TEST_EXIT();
}
