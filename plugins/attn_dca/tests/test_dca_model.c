/*
** attn_dca inside whole models (fixtures converted at f32 by run_dca_model.sh):
**   - qwen3 (full RoPE) and qwen3.5 (partial rotary, hybrid) through the
**     engine and its KV cache: a context within one chunk gives logits bit for
**     bit equal to flash's; with a chunk of 16 (10 chunks over 160 tokens) the
**     logits leave flash's (DCA really acts), token-by-token decode gives what
**     one prefill gave, and the plugin counts the layers and tokens it served;
**   - a context shift is exact for whole chunks or refused with a message,
**     never a plain RoPE rotation of DCA keys;
**   - gemma4 (iSWA: full layers DCA, sliding layers flash, shared KV on E2B)
**     through the forward pass: within one chunk bit for bit flash;
**   - the cuda kernels of attn_dca, arch_gemma4 and arch_qwen are declared
**     replayable, so a cuda decode step holding them is captured as a CUDA graph.
** usage: test_dca_model OUT_DIR QWEN3.gguf QWEN35.gguf GEMMA4.gguf GEMMA4_E2B.gguf
*/
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/backend.h"
#include "engine/engine.h"
#include "common/error.h"
#include "graph/graph.h"
#include "abi/op_registry.h"
#include "tests/harness.h"
#include "tests/logits_test_util.h"

enum { N = 160, PREFILL = 100 };

static const char *g_out;
static int32_t g_ids[N];

/* A profile for model with attention (a name, or a {full: .., sliding: ..} map). */
static const char *profile(const char *name, const char *model, const char *attention, int cs,
                           int ls) {
  static char path[1024];
  snprintf(path, sizeof path, "%s/%s.yaml", g_out, name);
  FILE *f = fopen(path, "w");
  if (!f) return NULL;
  fprintf(f, "model: %s\ncontext: 256\nbatch: 256\nubatch: 64\nkv: {k: f32, v: f32}\n"
          "attention: %s\nplugins:\n  - arch_qwen\n  - arch_gemma4\n  - name: attn_dca\n"
          "    settings: {chunk_size: %d, local_size: %d}\n", model, attention, cs, ls);
  fclose(f);
  return path;
}

static struct tsr_engine *engine(const char *profile_path) {
  struct tsr_engine_options opt = {.profile_path = profile_path, .n_threads = 2};
  struct tsr_engine *e = NULL;
  tsr_status st = tsr_engine_new(&opt, &e);
  CHECK_MSG(st == TSR_OK, "engine: %s", tsr_error_message());
  return e;
}

/* The logits of every position of ids in one call: [N][vocab]. */
static float *whole(struct tsr_engine *e, const int32_t *ids) {
  const int32_t v = tsr_engine_n_vocab(e);
  float *rows = malloc(sizeof(float) * v * N), *last = malloc(sizeof(float) * v);
  CHECK_OK(tsr_engine_eval(e, 0, ids, N, last, rows));
  free(last);
  return rows;
}

static uint64_t served(struct tsr_engine *e) {
  const struct tsr_plugin *p = tsr_plugin_host_find_plugin(tsr_engine_setup(e)->host, "attn_dca");
  return p ? tsr_plugin_engaged_total(p) : 0;
}

static void qwen(const char *label, const char *model, bool can_shift) {
  printf("  %s:\n", label);
  struct tsr_engine *ef = engine(profile("flash", model, "flash", 4096, 512));
  struct tsr_engine *e1 = engine(profile("dca_one_chunk", model, "dca", 4096, 512));
  struct tsr_engine *e10 = engine(profile("dca_10_chunks", model, "dca", 24, 8));
  if (!ef || !e1 || !e10) goto done;
  const int32_t v = tsr_engine_n_vocab(ef);
  int32_t ids[N];
  for (int i = 0; i < N; i++) ids[i] = g_ids[i] % v;
  float *rf = whole(ef, ids), *r1 = whole(e1, ids), *r10 = whole(e10, ids);
  /* (a) within one chunk: flash's logits bit for bit */
  CHECK_MSG(!memcmp(rf, r1, sizeof(float) * v * N), "one chunk differs from flash");
  printf("    one chunk (C 3584 >= 160): logits bit-identical to flash: %s\n",
         memcmp(rf, r1, sizeof(float) * v * N) ? "no" : "yes");
  /* ten chunks of 16: DCA acts past the first chunk, not before it */
  double first = 0, past = 0;
  for (int p = 0; p < N; p++) {
    const double r = tsr_test_row_rel(r10 + (size_t)p * v, rf + (size_t)p * v, v);
    if (p < 16) first = r > first ? r : first;
    else past = r > past ? r : past;
  }
  printf("    10 chunks vs flash: max rel %.2e in the first chunk, %.2e past it\n", first, past);
  CHECK(first == 0.0 && past > 1e-4);
  /* (c) prefill then decode one token at a time, against the whole call */
  tsr_engine_seq_rm(e10, 0, -1, -1);
  float *out = malloc(sizeof(float) * v);
  CHECK_OK(tsr_engine_eval(e10, 0, ids, PREFILL, out, NULL));
  double worst = tsr_test_row_rel(out, r10 + (size_t)(PREFILL - 1) * v, v);
  int agree = 0;
  for (int p = PREFILL; p < N; p++) {
    CHECK_OK(tsr_engine_eval(e10, 0, ids + p, 1, out, NULL));
    const double r = tsr_test_row_rel(out, r10 + (size_t)p * v, v);
    worst = r > worst ? r : worst;
    agree += tsr_test_argmax(out, v) == tsr_test_argmax(r10 + (size_t)p * v, v);
  }
  printf("    decode after a prefill of %d vs one call: max rel %.2e, argmax %d/%d\n", PREFILL,
         worst, agree, N - PREFILL);
  CHECK(worst < 1e-4 && agree == N - PREFILL);
  /* engagement: every layer call counted, tokens past the first chunk too */
  printf("    attn_dca counted %llu (flash engine: %llu)\n", (unsigned long long)served(e10),
         (unsigned long long)served(ef));
  CHECK(served(e10) > 0 && served(ef) == 0);
  /* (4) a shift by whole chunks keeps every key where it is; this engine either
  ** does it exactly or refuses, leaving the sequence as it was */
  const int32_t len = tsr_engine_seq_len(e10, 0);
  tsr_status st = can_shift ? tsr_engine_context_shift(e10, 0, 0, 32) : TSR_OK;
  if (!can_shift) {
    /* linear layers cannot shift at all: the engine says so before DCA is asked */
  } else if (st == TSR_OK) {
    /* exact: two whole chunks keep every key's p mod C and every band, so the
    ** next token sees what a cache that merely lost those 32 positions sees */
    CHECK(tsr_engine_seq_len(e10, 0) == len - 32);
    struct tsr_engine *ref = engine(profile("dca_10_chunks", model, "dca", 24, 8));
    float *a = malloc(sizeof(float) * v), *b = malloc(sizeof(float) * v);
    const int32_t next = ids[N - 1];
    CHECK_OK(tsr_engine_eval(e10, 0, &next, 1, a, NULL));
    if (ref) {
      CHECK_OK(tsr_engine_eval(ref, 0, ids, N, NULL, NULL));
      CHECK_OK(tsr_engine_seq_rm(ref, 0, 0, 32));
      CHECK_OK(tsr_engine_eval(ref, 0, &next, 1, b, NULL));
      const double r = tsr_test_row_rel(a, b, v);
      printf("    shift by 2 chunks: next token vs a cache that dropped them: max rel %.2e\n",
             r);
      CHECK_MSG(r < 1e-6, "max rel %g", r);
    }
    tsr_engine_free(ref);
    free(a), free(b);
  } else {
    printf("    shift by 2 chunks: refused (%s)\n", tsr_error_message());
    CHECK(strstr(tsr_error_message(), "refused") != NULL);
    CHECK(tsr_engine_seq_len(e10, 0) == len);
  }
  free(out), free(rf), free(r1), free(r10);
done:
  tsr_engine_free(ef), tsr_engine_free(e1), tsr_engine_free(e10);
}

/* Gemma: the forward pass over a whole sequence, attention per layer kind. */
static float *gemma_logits(const char *profile_path, int64_t *n_vocab) {
  struct tsr_setup *s = NULL;
  tsr_status st = tsr_setup_from_profile(profile_path, NULL, 0, &s);
  CHECK_MSG(st == TSR_OK, "setup: %s", tsr_error_message());
  float *rows = NULL;
  enum { M = 48 };
  struct tsr_graph *g = st == TSR_OK ? tsr_graph_new(8192) : NULL;
  if (g) {
    struct tsr_arch_forward fw = {
        .struct_size = sizeof fw, .g = g, .model = s->model, .n_tokens = M,
        .tokens = tsr_new_tensor_1d(g, TSR_I32, M), .positions = tsr_new_tensor_1d(g, TSR_I32, M),
        .attention = tsr_plugin_host_attention(s->host, s->profile->attention, NULL),
        .layers = s->layers, .n_layers = s->n_layers};
    tsr_setup_attention_kinds(s, fw.attention_kind);
    CHECK_OK(s->arch->build(s->arch->ctx, tsr_plugin_host_services(), &fw));
    struct tsr_graph_plan plan;
    void *arena = NULL;
    struct tsr_backend *be = NULL;
    if (fw.logits && tsr_graph_status(g) == TSR_OK) {
      tsr_graph_mark_output(fw.logits);
      CHECK_OK(tsr_graph_alloc(g, &plan, &arena));
      *n_vocab = fw.logits->ne[0];
      for (int i = 0; i < M; i++) {
        ((int32_t *)fw.tokens->data)[i] = g_ids[i] % (int32_t)*n_vocab;
        ((int32_t *)fw.positions->data)[i] = i;
      }
      CHECK_OK(tsr_backend_cpu_new(2, &be));
      CHECK_OK(tsr_backend_compute(be, g));
      rows = malloc(sizeof(float) * *n_vocab * M);
      memcpy(rows, fw.logits->data, sizeof(float) * *n_vocab * M);
    }
    tsr_backend_free(be);
    free(arena);
    tsr_graph_free(g);
  }
  tsr_setup_free(s);
  return rows;
}

static void gemma(const char *label, const char *model) {
  int64_t v = 0;
  float *rf = gemma_logits(profile("g_flash", model, "flash", 4096, 512), &v);
  float *r1 = gemma_logits(profile("g_dca1", model, "{full: dca, sliding: flash}", 4096, 512), &v);
  float *r3 = gemma_logits(profile("g_dca3", model, "{full: dca, sliding: flash}", 20, 4), &v);
  if (rf && r1 && r3) {
    const bool same = !memcmp(rf, r1, sizeof(float) * v * 48);
    double past = 0;
    for (int p = 16; p < 48; p++) {
      const double r = tsr_test_row_rel(r3 + (size_t)p * v, rf + (size_t)p * v, v);
      past = r > past ? r : past;
    }
    bool finite = true;
    for (int64_t i = 0; i < v * 48; i++) finite &= isfinite(r3[i]) != 0;
    printf("  %s: one chunk bit-identical to flash: %s; 3 chunks of 16: finite %s, max rel vs "
           "flash past the first chunk %.2e\n", label, same ? "yes" : "no",
           finite ? "yes" : "no", past);
    CHECK(same && finite && past > 1e-5);
  }
  free(rf), free(r1), free(r3);
}

static const char *g_models[4];

static void test_qwen3(void) { qwen("qwen3 (full rotary)", g_models[0], true); }
static void test_qwen35(void) { qwen("qwen3.5 (partial rotary, hybrid)", g_models[1], false); }
static void test_gemma4_dense(void) { gemma("gemma4 dense (iSWA)", g_models[2]); }
static void test_gemma4_e2b(void) { gemma("gemma4 E2B (iSWA, shared KV)", g_models[3]); }

/* after the engines above: both plugins have registered their ops */
static void test_cuda_kernels_are_replayable(void) {
  static const char *const ops[] = {"attn_dca.positions", "attn_dca.attention",
                                    "arch_gemma4.rope_f32", "arch_gemma4.ordered_logits",
                                    "arch_qwen.conv1d", "arch_qwen.delta_rule"};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    const int32_t id = tsr_op_registry_find(ops[i]);
    CHECK_MSG(id >= 0 && tsr_op_registry_replayable(id, "cuda") &&
              !tsr_op_registry_replayable(id, "cpu"), "%s (id %d)", ops[i], id);
  }
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: %s OUT_DIR QWEN3 QWEN35 GEMMA4 GEMMA4_E2B\n", argv[0]);
    return 2;
  }
  g_out = argv[1];
  for (int i = 0; i < 4; i++) g_models[i] = argv[2 + i];
  tsr_test_seed(21);
  for (int i = 0; i < N; i++) g_ids[i] = (int32_t)(tsr_test_next() % 100000);
  TSR_RUN(test_qwen3);
  TSR_RUN(test_qwen35);
  TSR_RUN(test_gemma4_dense);
  TSR_RUN(test_gemma4_e2b);
  TSR_RUN(test_cuda_kernels_are_replayable);
  return TSR_TEST_EXIT();
}
