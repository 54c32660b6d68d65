/*
** sparse_v through the engine on the reference fixtures: qwen3 (full attention only,
** head dim 128) and gemma4 (iSWA: sliding layers of head dim 256, full layers of 512).
** The golden sequence's first PREFILL tokens are one prefill, the rest decode a token at
** a time (decode parameters act on decode steps only).
**   - the auto-policy acts on the full layers of gemma4 with a quantized V, and says so
**     per group of layers; not on its sliding layers, not with f16 V, not on qwen3;
**     layers: all makes it act on qwen3;
**   - threshold 0, and guards that cover every key, give the dense logits bit for bit,
**     through flash and dca (the guards case having weighed every V row);
**   - with a threshold and small guards, rows are skipped and counted with their mass,
**     and the logits stay close (argmax mostly unchanged);
**   - dca over a context of one chunk equals flash bit for bit, skipping included;
** and on cuda (--backend cuda; tests/gpu/run.sh check RUN sparse):
**   - guards covering every key equal cuda's dense logits bit for bit;
**   - skipping weighs the same rows as the cpu, skips some, and lands within the cpu's
**     skipping distance of the cpu's result (plus the devices' dense difference).
** usage: test_sparse_v [--backend cuda] OUT_DIR QWEN.gguf GOLDEN QWEN_GEMMA.gguf GOLDEN
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

enum { PREFILL = 16 };

static const char *g_out, *g_backend = "cpu";

struct model {
  const char *path;
  struct tsr_gguf *gold;
  struct tsr_test_golden gs;
} g_qwen, g_gemma;

struct result {
  float *logits; /* the decoded tokens' rows */
  size_t n;
  struct tsr_decode_counters c;
  char full[320], sliding[320]; /* the composition's decode policies line per kind */
};

/* A decode counter over the layer kinds (the engine counts "full.v_rows_read", ...) */
static uint64_t kinds(const struct tsr_plugin *p, const char *counter) {
  char full[64], sliding[64];
  snprintf(full, sizeof full, "full.%s", counter);
  snprintf(sliding, sizeof sliding, "sliding.%s", counter);
  return tsr_plugin_engaged(p, full) + tsr_plugin_engaged(p, sliding);
}

static const char *const FLASH = "flash", *const DCA = "{full: dca, sliding: flash}";
static bool g_rotated; /* --rotated-codecs: kv_turbo and kv_tcq are built and loaded */

/* Runs m with KV kv on backend through attention att; settings: sparse_v's settings map
** ("" for its defaults), NULL: without the plugin. dca_chunk: attn_dca's chunk_size. */
static bool run(const struct model *m, const char *backend, const char *kv, const char *att,
                int dca_chunk, const char *settings, struct result *r) {
  memset(r, 0, sizeof *r);
  static char path[1024];
  static int serial;
  snprintf(path, sizeof path, "%s/sv_%d.yaml", g_out, serial++);
  FILE *f = fopen(path, "w");
  if (!f) return false;
  fprintf(f, "model: %s\nbackend: %s\ncontext: 256\nubatch: %d\nkv: {k: %s, v: %s}\n"
          "attention: %s\nplugins:\n  - arch_qwen\n  - arch_gemma4\n"
          "  - name: attn_dca\n    settings: {chunk_size: %d, local_size: 4}\n",
          m->path, backend, PREFILL, kv, kv, att, dca_chunk);
  if (g_rotated) fprintf(f, "  - kv_turbo\n  - kv_tcq\n");
  if (settings) fprintf(f, "  - name: sparse_v\n    settings: {%s}\ndecode_policies: [sparse_v]\n",
                        settings);
  fclose(f);
  struct tsr_engine_options opt = {.profile_path = path, .n_threads = 2};
  struct tsr_engine *e = NULL;
  tsr_status st = tsr_engine_new(&opt, &e);
  CHECK_MSG(st == TSR_OK, "%s, kv %s, %s, sparse_v {%s}: %s", m->path, kv, att,
            settings ? settings : "-", tsr_error_message());
  if (st != TSR_OK) return false;
  const int32_t v = m->gs.vocab, steps = m->gs.n - PREFILL;
  r->n = (size_t)steps * (size_t)v;
  r->logits = malloc(sizeof(float) * r->n);
  float *last = malloc(sizeof(float) * (size_t)v);
  st = tsr_engine_eval(e, 0, m->gs.ids, PREFILL, last, NULL);
  for (int32_t i = 0; i < steps && st == TSR_OK; i++)
    st = tsr_engine_eval(e, 0, m->gs.ids + PREFILL + i, 1, r->logits + (size_t)i * v, NULL);
  CHECK_MSG(st == TSR_OK, "%s: %s", m->path, tsr_error_message());
  const struct tsr_setup *s = tsr_engine_setup(e);
  const struct tsr_plugin *p = tsr_plugin_host_find_plugin(s->host, "sparse_v");
  if (p) {
    r->c.v_rows_read = kinds(p, "v_rows_read");
    r->c.v_rows_skipped = kinds(p, "v_rows_skipped");
    r->c.query_rows = kinds(p, "query_rows");
    r->c.mass_dropped_e9 = kinds(p, "mass_dropped_e9");
  }
  for (int i = 0; i < s->composition.n_groups; i++) {
    const struct tsr_composition_group *g = &s->composition.groups[i];
    char *to = g->kind == TSR_LAYER_SLIDING ? r->sliding : r->full;
    if (!g->boundary) snprintf(to, sizeof r->full, "%s", g->policies);
  }
  free(last);
  tsr_engine_free(e);
  if (st != TSR_OK) free(r->logits), r->logits = NULL;
  return st == TSR_OK;
}

static void result_free(struct result *r) { free(r->logits), r->logits = NULL; }

static double rms(const struct result *a, const struct result *b) {
  double s = 0;
  for (size_t i = 0; i < a->n; i++) {
    const double d = (double)a->logits[i] - b->logits[i];
    s += d * d;
  }
  return sqrt(s / (double)a->n);
}

static bool same(const struct result *a, const struct result *b) {
  return a->n == b->n && !memcmp(a->logits, b->logits, a->n * sizeof(float));
}

static int argmax_agree(const struct model *m, const struct result *a, const struct result *b) {
  int agree = 0;
  for (int32_t i = 0; i < m->gs.n - PREFILL; i++)
    agree += tsr_test_argmax(a->logits + (size_t)i * m->gs.vocab, m->gs.vocab) ==
             tsr_test_argmax(b->logits + (size_t)i * m->gs.vocab, m->gs.vocab);
  return agree;
}

static void test_auto_policy_acts_where_the_rule_says(void) {
  struct result r;
  if (run(&g_gemma, g_backend, "q8_0", FLASH, 16, "", &r)) {
    printf("  gemma4 q8_0: full: %s\n               sliding: %s\n", r.full, r.sliding);
    CHECK(strstr(r.full, "sparse_v: V rows under 0.05 skipped, sink 64, recent 256") &&
          strstr(r.full, "auto: full-attention layer of an iSWA model, quantized V"));
    CHECK(strstr(r.sliding, "sparse_v: off (auto: sliding-window layer)"));
    CHECK(r.c.v_rows_read > 0 && r.c.query_rows > 0);
  }
  result_free(&r);
  if (run(&g_gemma, g_backend, "f16", FLASH, 16, "", &r)) {
    CHECK_MSG(strstr(r.full, "sparse_v: off (auto: V is not quantized)"), "%s", r.full);
    CHECK(r.c.v_rows_read == 0);
  }
  result_free(&r);
  if (run(&g_qwen, g_backend, "q8_0", FLASH, 16, "", &r)) {
    printf("  qwen3 q8_0: full: %s\n", r.full);
    CHECK(strstr(r.full, "sparse_v: off (auto: the model is not iSWA"));
    CHECK(r.c.v_rows_read == 0);
  }
  result_free(&r);
  if (run(&g_qwen, g_backend, "q8_0", FLASH, 16, "layers: all, threshold: 0", &r))
    CHECK_MSG(strstr(r.full, "sparse_v: off (threshold and budget 0)"), "%s", r.full);
  result_free(&r);
  if (run(&g_qwen, g_backend, "q8_0", DCA, 16, "layers: all", &r)) {
    CHECK_MSG(strstr(r.full, "V rows under 0.05 skipped") && strstr(r.full, "(layers: all)"),
              "%s", r.full);
    CHECK(r.c.v_rows_read > 0);
  }
  result_free(&r);
}

static void test_threshold_zero_and_covering_guards_are_dense(void) {
  const struct model *models[2] = {&g_qwen, &g_gemma};
  for (int mi = 0; mi < 2; mi++)
    for (int a = 0; a < 2; a++) {
      const char *att = a ? DCA : FLASH;
      struct result dense, zero, guarded;
      if (run(models[mi], g_backend, "q8_0", att, 16, NULL, &dense) &&
          run(models[mi], g_backend, "q8_0", att, 16, "layers: all, threshold: 0", &zero) &&
          run(models[mi], g_backend, "q8_0", att, 16,
              "layers: all, threshold: 0.4, sink: 0, recent: 100000", &guarded)) {
        CHECK_MSG(same(&zero, &dense), "%s %s: threshold 0 moved logits by %.3e",
                  models[mi]->path, att, rms(&zero, &dense));
        CHECK_MSG(same(&guarded, &dense), "%s %s: guards over every key moved logits by %.3e",
                  models[mi]->path, att, rms(&guarded, &dense));
        CHECK(zero.c.v_rows_read == 0);
        CHECK(guarded.c.v_rows_read > 0 && guarded.c.v_rows_skipped == 0 &&
              guarded.c.mass_dropped_e9 == 0);
      }
      result_free(&dense), result_free(&zero), result_free(&guarded);
    }
}

/* Skipping through flash and dca (chunks of 16: three bands act) on both models */
static void test_skipping_is_counted_and_stays_close(void) {
  const struct model *models[2] = {&g_qwen, &g_gemma};
  for (int mi = 0; mi < 2; mi++)
    for (int a = 0; a < 2; a++) {
      const struct model *m = models[mi];
      const char *att = a ? DCA : FLASH;
      struct result dense, skip;
      if (run(m, g_backend, "q8_0", att, 16, NULL, &dense) &&
          run(m, g_backend, "q8_0", att, 16, "layers: all, threshold: 0.2, sink: 1, recent: 4",
              &skip)) {
        const double mean_mass =
            (double)skip.c.mass_dropped_e9 / TSR_DECODE_MASS_UNIT / (double)skip.c.query_rows;
        const int agree = argmax_agree(m, &skip, &dense), rows = m->gs.n - PREFILL;
        printf("  %s %s: %llu of %llu V rows skipped, mean mass dropped %.4f a row, rms %.3e, "
               "argmax %d of %d\n", m->path, att, (unsigned long long)skip.c.v_rows_skipped,
               (unsigned long long)skip.c.v_rows_read, mean_mass, rms(&skip, &dense), agree, rows);
        CHECK(skip.c.v_rows_skipped > 0 && skip.c.v_rows_skipped < skip.c.v_rows_read);
        CHECK(skip.c.mass_dropped_e9 > 0 && mean_mass < 0.5);
        CHECK(!same(&skip, &dense) && rms(&skip, &dense) < 1.0);
        CHECK(agree >= rows * 3 / 4);
      }
      result_free(&dense), result_free(&skip);
    }
}

/* V in the rotated tiers (kv_turbo's, kv_tcq's; cpu): the policy acts on their rows as on
** q8_0's: threshold 0 is dense, a threshold skips, counted, and keeps the top token. */
static void test_rotated_v_codecs(void) {
  static const char *const codecs[] = {"turbo3", "turbo3_tcq", "turbo2_tcq"};
  const struct model *models[2] = {&g_qwen, &g_gemma};
  for (int mi = 0; mi < 2; mi++)
    for (size_t ci = 0; ci < sizeof codecs / sizeof codecs[0]; ci++) {
      const struct model *m = models[mi];
      struct result dense, zero, skip;
      if (run(m, "cpu", codecs[ci], FLASH, 16, NULL, &dense) &&
          run(m, "cpu", codecs[ci], FLASH, 16, "layers: all, threshold: 0", &zero) &&
          run(m, "cpu", codecs[ci], FLASH, 16, "layers: all, threshold: 0.2, sink: 1, recent: 4",
              &skip)) {
        const int agree = argmax_agree(m, &skip, &dense), rows = m->gs.n - PREFILL;
        printf("  %s %s: %llu of %llu V rows skipped, rms %.3e, argmax %d of %d\n", m->path,
               codecs[ci], (unsigned long long)skip.c.v_rows_skipped,
               (unsigned long long)skip.c.v_rows_read, rms(&skip, &dense), agree, rows);
        CHECK_MSG(same(&zero, &dense), "%s %s: threshold 0 moved logits by %.3e", m->path,
                  codecs[ci], rms(&zero, &dense));
        CHECK(skip.c.v_rows_skipped > 0 && skip.c.v_rows_skipped < skip.c.v_rows_read);
        /* close: the top token kept (the rms grows with the tier's own V error) */
        CHECK(!same(&skip, &dense));
        CHECK(agree >= rows * 3 / 4);
      }
      result_free(&dense), result_free(&zero), result_free(&skip);
    }
}

/* A mass budget (cpu): the auto-policy applies it alone on a model of full attention only;
** no row drops more than the budget (the counters' sum over rows bounds it); refused on
** cuda before anything is allocated. */
static void test_budget_bounds_the_mass_and_runs_on_the_cpu_only(void) {
  struct result dense, b;
  if (run(&g_qwen, "cpu", "q8_0", FLASH, 16, "budget: 0.05", &b))
    CHECK_MSG(strstr(b.full, "V rows skipped within a mass budget of 0.05") &&
                  strstr(b.full, "auto: the model is not iSWA: the mass budget alone"),
              "%s", b.full);
  result_free(&b);
  for (int a = 0; a < 2; a++) { /* gemma4's attention is concentrated enough to skip */
    const char *att = a ? DCA : FLASH;
    if (run(&g_gemma, "cpu", "q8_0", att, 16, NULL, &dense) &&
        run(&g_gemma, "cpu", "q8_0", att, 16, "layers: all, budget: 0.05, sink: 1, recent: 4",
            &b)) {
      const double mass = (double)b.c.mass_dropped_e9 / TSR_DECODE_MASS_UNIT;
      printf("  gemma4 %s, budget 0.05: %llu of %llu V rows skipped, mass %.4g over %llu rows, "
             "rms %.3e\n", att, (unsigned long long)b.c.v_rows_skipped,
             (unsigned long long)b.c.v_rows_read, mass, (unsigned long long)b.c.query_rows,
             rms(&b, &dense));
      CHECK(b.c.v_rows_read > 0 && b.c.v_rows_skipped > 0);
      CHECK_MSG(mass <= 0.05 * (double)b.c.query_rows, "mass %.6g over %llu rows", mass,
                (unsigned long long)b.c.query_rows);
      CHECK(rms(&b, &dense) < 1.0);
    }
    result_free(&dense), result_free(&b);
  }
  /* cuda: refused at profile check, naming the policy and the backend (no device needed) */
  static char path[1024];
  snprintf(path, sizeof path, "%s/sv_budget_cuda.yaml", g_out);
  FILE *f = fopen(path, "w");
  if (!f) return;
  fprintf(f, "model: %s\nbackend: cuda\nkv: {k: q8_0, v: q8_0}\nplugins:\n  - arch_qwen\n"
          "  - name: sparse_v\n    settings: {budget: 0.01}\ndecode_policies: [sparse_v]\n",
          g_qwen.path);
  fclose(f);
  struct tsr_engine_options opt = {.profile_path = path, .n_threads = 2};
  struct tsr_engine *e = NULL;
  const tsr_status st = tsr_engine_new(&opt, &e);
  CHECK_MSG(st == TSR_ERR_UNSUPPORTED && strstr(tsr_error_message(), "mass budget") &&
                strstr(tsr_error_message(), "backend cuda") &&
                strstr(tsr_error_message(), "sparse_v"),
            "status %d: %s", st, tsr_error_message());
  tsr_engine_free(e);
}

/* Settings out of range or unknown are refused when the profile loads, naming the setting */
static void test_bad_settings_are_refused_by_name(void) {
  static const char *const bad[][2] = {{"threshold: 0.7", "threshold"},
                                       {"budget: -0.1", "budget"},
                                       {"threshold: nan", "threshold"},
                                       {"layers: most", "layers"},
                                       {"sink: -1", "sink"},
                                       {"recent: 99999999999", "recent"},
                                       {"skip: 0.1", "skip"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/sv_bad_%zu.yaml", g_out, i);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "model: %s\nplugins:\n  - arch_qwen\n  - name: sparse_v\n    settings: {%s}\n"
            "decode_policies: [sparse_v]\n", g_qwen.path, bad[i][0]);
    fclose(f);
    struct tsr_engine_options opt = {.profile_path = path, .n_threads = 2};
    struct tsr_engine *e = NULL;
    const tsr_status st = tsr_engine_new(&opt, &e);
    CHECK_MSG(st != TSR_OK && strstr(tsr_error_message(), bad[i][1]), "{%s}: status %d, '%s'",
              bad[i][0], st, tsr_error_message());
    tsr_engine_free(e);
  }
}

/* dca over one chunk (chunk_size past the context) is flash: the same skips, the same bits */
static void test_dca_of_one_chunk_equals_flash_with_skipping(void) {
  const char *sv = "layers: all, threshold: 0.2, sink: 1, recent: 4";
  struct result flash, dca;
  if (run(&g_qwen, "cpu", "q8_0", FLASH, 16, sv, &flash) &&
      run(&g_qwen, "cpu", "q8_0", DCA, 1024, sv, &dca)) {
    CHECK_MSG(same(&flash, &dca), "rms %.3e", rms(&flash, &dca));
    CHECK(!memcmp(&flash.c, &dca.c, sizeof flash.c) && flash.c.v_rows_skipped > 0);
  }
  result_free(&flash), result_free(&dca);
}

/* cuda against the cpu: the same rows weighed; the skips differ in order (each warp keeps
** its own running max), so the distance allowed is the cpu's own skipping distance plus
** the devices' dense difference. */
static void test_cuda_skips_like_the_cpu(void) {
  const struct model *models[2] = {&g_qwen, &g_gemma};
  const char *sv = "layers: all, threshold: 0.2, sink: 1, recent: 4";
  for (int mi = 0; mi < 2; mi++)
    for (int a = 0; a < 2; a++) {
      const struct model *m = models[mi];
      const char *att = a ? DCA : FLASH;
      struct result cd, cs, gd, gs;
      if (run(m, "cpu", "q8_0", att, 16, NULL, &cd) && run(m, "cpu", "q8_0", att, 16, sv, &cs) &&
          run(m, "cuda", "q8_0", att, 16, NULL, &gd) && run(m, "cuda", "q8_0", att, 16, sv, &gs)) {
        const double dev = rms(&gd, &cd), skip = rms(&cs, &cd), cross = rms(&gs, &cs);
        printf("  %s %s: cuda %llu of %llu rows skipped (cpu %llu of %llu); rms cuda-cpu dense "
               "%.3e, cpu skip-dense %.3e, cuda-cpu skipping %.3e\n", m->path, att,
               (unsigned long long)gs.c.v_rows_skipped, (unsigned long long)gs.c.v_rows_read,
               (unsigned long long)cs.c.v_rows_skipped, (unsigned long long)cs.c.v_rows_read,
               dev, skip, cross);
        CHECK(gs.c.v_rows_read == cs.c.v_rows_read && gs.c.query_rows == cs.c.query_rows);
        CHECK(gs.c.v_rows_skipped > 0);
        CHECK_MSG(cross <= 2.0 * skip + 2.0 * dev, "cuda skipping %.3e from the cpu's", cross);
      }
      result_free(&cd), result_free(&cs), result_free(&gd), result_free(&gs);
    }
}

static bool load(struct model *m, const char *path, const char *golden) {
  m->path = path;
  return tsr_test_golden_seq0(golden, PREFILL + 16, &m->gold, &m->gs);
}

int main(int argc, char **argv) {
  int a = 1;
  for (;;)
    if (a + 1 < argc && !strcmp(argv[a], "--backend")) g_backend = argv[a + 1], a += 2;
    else if (a < argc && !strcmp(argv[a], "--rotated-codecs")) g_rotated = true, a++;
    else break;
  if (argc - a != 5) {
    fprintf(stderr, "usage: %s [--backend cuda] [--rotated-codecs] OUT_DIR QWEN.gguf GOLDEN "
            "GEMMA.gguf GOLDEN\n", argv[0]);
    return 2;
  }
  g_out = argv[a];
  if (!load(&g_qwen, argv[a + 1], argv[a + 2]) || !load(&g_gemma, argv[a + 3], argv[a + 4]))
    return 2;
  TSR_RUN(test_auto_policy_acts_where_the_rule_says);
  TSR_RUN(test_threshold_zero_and_covering_guards_are_dense);
  TSR_RUN(test_bad_settings_are_refused_by_name);
  if (!strcmp(g_backend, "cpu")) {
    TSR_RUN(test_skipping_is_counted_and_stays_close);
    TSR_RUN(test_dca_of_one_chunk_equals_flash_with_skipping);
    TSR_RUN(test_budget_bounds_the_mass_and_runs_on_the_cpu_only);
    if (g_rotated) TSR_RUN(test_rotated_v_codecs);
    else printf("kv_turbo or kv_tcq is not in this build: V in rotated tiers not tested\n");
  } else {
    TSR_RUN(test_cuda_skips_like_the_cpu);
  }
  tsr_gguf_close(g_qwen.gold), tsr_gguf_close(g_gemma.gold);
  return TSR_TEST_EXIT();
}
