/*
** spec_mtp's nextn and assistant engines and the host services they stand on
** (host->spec->nextn, host->spec->drafter_step). nextn, on the Qwen3.5 fixture:
**   - the head's own cache: after a prompt the engine evaluated in ubatches (every
**     kept token completing the head's entry before it), a draft's logits through
**     the cache equal the head over the whole sequence without one, and so do a
**     chain's past the held positions; the chain's cells are gone afterwards and
**     the trunk's next logits are those of an engine that never ran the head;
**   - greedy speculation gives exactly the plain greedy tokens, with the random head
**     and with an "echo" head (a copy of the model whose head passes the trunk's
**     hidden row through to the LM head, so it drafts the last token again): that
**     one's drafts are kept whole on some steps and cut on others, so the head's
**     cache advances by partly kept verify batches too; also with q8_0 K/V and with
**     the full layers and the head through attn_dca in chunks of 32.
** assistant, on the Gemma 4 E2B fixture and its assistant:
**   - after the target evaluated the golden prefix, drafter steps through the
**     target's cache give transformers' assisted-generation logits and tokens;
**   - the same with the target's K/V in turbo8, the drafter's query and output through
**     the codec's transforms of the layer it reads (first step, within the codec's error);
**   - greedy speculation gives exactly the plain greedy tokens, with f16, q8_0 and turbo4
**     K/V and through attn_dca (the drafter reading the cache as DCA laid it out).
** All models converted at f32.
** usage: test_spec_mtp_heads [--backend cuda] OUT_DIR QWEN35.gguf E2B.gguf ASSISTANT.gguf
**        ASSISTANT_GOLDEN.gguf
*/
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "abi/setup.h"
#include "common/error.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/gguf.h"
#include "tests/arch_pass_util.h"
#include "tests/harness.h"
#include "tests/logits_test_util.h"

enum { PROMPT = 21, GEN = 80, MAX_DRAFT = 4, CHAIN = 3 };
_Static_assert(MAX_DRAFT == 4, "greedy_case prints kept[0..4]");

static const char *g_out, *g_model, *g_echo, *g_target, *g_assistant, *g_backend = "cpu";
static struct tsr_gguf *g_gold;

/* An engine over model (kv: the K and V codec, "dca", or NULL); with
** speculate, spec_mtp's engine `speculate` with a fixed draft length (assistant: g_assistant
** drafts). */
static struct tsr_engine *engine(const char *model, const char *speculate, const char *kv) {
  static char path[1024];
  static int serial;
  snprintf(path, sizeof path, "%s/nextn_%d.yaml", g_out, serial++);
  FILE *f = fopen(path, "w");
  if (!f) return NULL;
  fprintf(f, "model: %s\nbackend: %s\ncontext: 256\nubatch: 8\n", model, g_backend);
  /* kv "dca": f16 K/V, full layers (the head's too) through attn_dca in chunks of 32 */
  const bool dca = kv && !strcmp(kv, "dca");
  if (kv && !dca) fprintf(f, "kv: {k: %s, v: %s}\n", kv, kv);
  fprintf(f, "plugins:\n  - arch_qwen\n  - arch_gemma4\n%s%s",
          kv && !strncmp(kv, "turbo", 5) ? "  - kv_turbo\n" : "",
          dca ? "  - name: attn_dca\n    settings: {chunk_size: 32, local_size: 8}\n" : "");

  if (speculate)
    fprintf(f, "  - name: spec_mtp\n    settings: {engine: %s, n_max: %d, adaptive: false, "
            "p_min: 0%s%s}\nspeculator: {name: spec_mtp}\n", speculate, MAX_DRAFT,
            strcmp(speculate, "assistant") ? "" : ", model: ",
            strcmp(speculate, "assistant") ? "" : g_assistant);
  if (dca) fprintf(f, "attention: {full: dca}\n");
  fclose(f);
  struct tsr_engine_options opt = {.profile_path = path, .n_threads = 2};
  struct tsr_engine *e = NULL;
  tsr_status st = tsr_engine_new(&opt, &e);
  CHECK_MSG(st == TSR_OK, "engine over %s: %s", model, tsr_error_message());
  return st == TSR_OK ? e : NULL;
}

static void make_prompt(int32_t n_vocab, uint32_t seed, int32_t *ids) {
  uint32_t x = seed;
  for (int i = 0; i < PROMPT; i++)
    ids[i] = (int32_t)((x = x * 1103515245u + 12345u) >> 8) % n_vocab;
}

/* The head over the whole sequence without a cache against the engine's cached head:
** the draft entry at the last evaluated position, then a chain past it. */
static void test_head_cache_equals_whole_sequence(void) {
  const bool cpu = !strcmp(g_backend, "cpu");
  /* f32 K/V on the cpu: the head's cache is then the whole-sequence pass's to the last bits */
  struct tsr_engine *e = engine(g_model, "nextn", cpu ? "f32" : NULL);
  struct tsr_engine *plain = engine(g_model, NULL, cpu ? "f32" : NULL);
  const double tol = cpu ? 1e-5 : 5e-4;
  if (!e || !plain) goto done;
  const struct tsr_setup *s = tsr_engine_setup(e);
  const int32_t V = tsr_engine_n_vocab(e), N = PROMPT + 1 + CHAIN;
  int32_t tok[PROMPT + 1 + CHAIN], pos[PROMPT + 1 + CHAIN];
  make_prompt(V, 12345, tok);
  uint32_t width = 0;
  CHECK_OK(tsr_gguf_get_u32(s->model, "qwen35.embedding_length", &width));
  const int64_t E = width;
  if (!E) goto done;
  float *logits = malloc(sizeof(float) * (size_t)N * V), *h = calloc((size_t)N * E, sizeof *h);
  float *hl = malloc(sizeof(float) * (size_t)N * V), *got = malloc(sizeof(float) * V);
  float *got_h = malloc(sizeof(float) * (size_t)E), *want = malloc(sizeof(float) * V);
  for (int32_t i = 0; i < N; i++) pos[i] = i;
  /* the engine's prompt, in ubatches of 8: the head's entries 0..PROMPT-2 */
  CHECK_OK(tsr_engine_eval(e, 0, tok, PROMPT, want, NULL));
  CHECK_OK(tsr_engine_eval(plain, 0, tok, PROMPT, got, NULL));
  CHECK(!memcmp(want, got, sizeof(float) * V)); /* the head leaves the trunk alone */
  tok[PROMPT] = (int32_t)tsr_test_argmax(want, V);
  /* the trunk's hidden rows of the prompt, whole */
  CHECK_OK(tsr_test_arch_pass(s, false, PROMPT, tok, pos, NULL, E, logits, h));
  /* the draft entry: token PROMPT with the row of PROMPT-1, a held position */
  const int32_t last = PROMPT - 1;
  CHECK_OK(tsr_engine_nextn(e, 0, tok + PROMPT, &last, h + (size_t)last * E, 1, got, got_h));
  CHECK_OK(tsr_test_arch_pass(s, true, PROMPT, tok + 1, pos, h, E, hl, NULL));
  double rel = tsr_test_row_rel(got, hl + (size_t)last * V, V);
  printf("  draft entry at %d: cached head vs whole sequence, max rel %.2e\n", last, rel);
  CHECK_MSG(rel <= tol, "max rel %g", rel);
  /* the chain: each draft with the head's own output row, past the held positions */
  for (int32_t k = 0; k < CHAIN; k++) {
    tok[PROMPT + 1 + k] = (int32_t)tsr_test_argmax(got, V);
    memcpy(h + (size_t)(PROMPT + k) * E, got_h, sizeof(float) * (size_t)E);
    CHECK_OK(tsr_engine_nextn(e, 0, tok + PROMPT + 1, pos + PROMPT, h + (size_t)PROMPT * E, k + 1,
                              got, got_h));
    CHECK_OK(tsr_test_arch_pass(s, true, PROMPT + 1 + k, tok + 1, pos, h, E, hl, NULL));
    rel = tsr_test_row_rel(got, hl + (size_t)(PROMPT + k) * V, V);
    printf("  chain of %d past the held positions: max rel %.2e\n", k + 1, rel);
    CHECK_MSG(rel <= tol, "max rel %g", rel);
  }
  /* the chain's cells are gone: the trunk goes on as if the head never ran */
  CHECK(tsr_engine_seq_len(e, 0) == PROMPT);
  CHECK_OK(tsr_engine_eval(e, 0, tok + PROMPT, 1, got, NULL));
  CHECK_OK(tsr_engine_eval(plain, 0, tok + PROMPT, 1, want, NULL));
  CHECK(!memcmp(want, got, sizeof(float) * V));
  /* entries must follow the held positions without a gap */
  const int32_t gap = PROMPT + 3;
  CHECK(tsr_engine_nextn(e, 0, tok, &gap, h, 1, NULL, NULL) == TSR_ERR_INVALID_ARG);
  CHECK_MSG(strstr(tsr_error_message(), "without a gap") != NULL, "%s", tsr_error_message());
  free(logits), free(h), free(hl), free(got), free(got_h), free(want);
done:
  tsr_engine_free(e);
  tsr_engine_free(plain);
}

/* GEN greedy tokens after a prompt drawn from seed: plainly, or through speculative steps,
** counting in kept[k] the steps that kept k drafts. */
static bool generate(struct tsr_engine *e, bool speculate, uint32_t seed, int32_t *out,
                     int kept[MAX_DRAFT + 1]) {
  const int32_t v = tsr_engine_n_vocab(e);
  float *logits = malloc(sizeof(float) * (size_t)v);
  struct tsr_sampler *smp = NULL;
  const struct tsr_sampler_params greedy = {.temperature = 0, .top_p = 1};
  int32_t prompt[PROMPT], n = 0, step[MAX_DRAFT + 1], got;
  make_prompt(v, seed, prompt);
  tsr_status st = tsr_engine_seq_rm(e, 0, -1, -1);
  if (st == TSR_OK) st = tsr_sampler_new(&greedy, v, &smp);
  if (st == TSR_OK) st = tsr_engine_eval(e, 0, prompt, PROMPT, logits, NULL);
  if (st == TSR_OK) out[n++] = (int32_t)tsr_test_argmax(logits, v);
  while (st == TSR_OK && n < GEN) {
    if (!speculate) {
      st = tsr_engine_eval(e, 0, &out[n - 1], 1, logits, NULL);
      if (st == TSR_OK) out[n++] = (int32_t)tsr_test_argmax(logits, v);
      continue;
    }
    st = tsr_engine_speculate(e, 0, out[n - 1], smp, MAX_DRAFT, step, &got);
    if (st != TSR_OK) break;
    kept[got - 1]++;
    for (int32_t i = 0; i < got && n < GEN; i++) out[n++] = step[i];
  }
  tsr_sampler_free(smp);
  free(logits);
  CHECK_MSG(st == TSR_OK, "%s", tsr_error_message());
  return st == TSR_OK;
}

/* Greedy speculation against plain greedy decoding over several prompts; with
** expect_partial, some steps must keep part of a draft (the head's cache then
** advances by a verify batch cut short). */
static void greedy_case(const char *model, const char *engine_name, const char *kv,
                        bool expect_partial) {
  struct tsr_engine *e = engine(model, engine_name, kv), *plain = engine(model, NULL, kv);
  int kept[MAX_DRAFT + 1] = {0};
  for (uint32_t seed = 1; e && plain && seed <= 4; seed++) {
    int32_t a[GEN], b[GEN];
    if (!generate(plain, false, seed, a, kept) || !generate(e, true, seed, b, kept)) break;
    int first = -1;
    for (int i = 0; i < GEN && first < 0; i++)
      if (a[i] != b[i]) first = i;
    CHECK_MSG(first < 0, "%s, prompt %u: speculation changed token %d", model, seed, first);
  }
  int partial = 0;
  for (int k = 1; k < MAX_DRAFT; k++) partial += kept[k];
  const char *name = strrchr(model, '/') ? strrchr(model, '/') + 1 : model;
  printf("  %s%s%s: steps keeping 0..%d drafts: %d %d %d %d %d\n", name,
         kv ? " K/V " : "", kv ? kv : "", MAX_DRAFT, kept[0], kept[1], kept[2], kept[3], kept[4]);
  if (expect_partial) CHECK(partial > 0 && kept[MAX_DRAFT] > 0);
  tsr_engine_free(e);
  tsr_engine_free(plain);
}

static void test_nextn_greedy_speculation_is_plain_greedy(void) {
  greedy_case(g_model, "nextn", NULL, false);
  greedy_case(g_echo, "nextn", NULL, true);
  greedy_case(g_echo, "nextn", "q8_0", true);
  greedy_case(g_echo, "nextn", "dca", true);
}

/* The golden's prefix evaluated by the target with its K/V in kv, then the drafter's steps
** through its cache against transformers' (f32 K/V). With tol, the first step's logits (and
** with chain every step's) within tol and the reference's argmax; with proj_tol instead,
** the first step's projected state within proj_tol. */
static void drafter_golden_case(const char *kv, double tol, bool chain, double proj_tol) {
  struct tsr_engine *e = engine(g_target, NULL, kv);
  const struct tsr_gguf_tensor *prefix = tsr_gguf_find_tensor(g_gold, "draft.prefix_ids");
  const struct tsr_gguf_tensor *inputs = tsr_gguf_find_tensor(g_gold, "draft.input_ids");
  const struct tsr_gguf_tensor *tokens = tsr_gguf_find_tensor(g_gold, "draft.tokens");
  const struct tsr_gguf_tensor *th = tsr_gguf_find_tensor(g_gold, "draft.target_hidden");
  uint32_t pos = 0, steps = 0;
  CHECK_OK(tsr_gguf_get_u32(g_gold, "golden.draft.position", &pos));
  CHECK_OK(tsr_gguf_get_u32(g_gold, "golden.draft.n_steps", &steps));
  struct tsr_setup *d = NULL;
  const struct tsr_engine_options opt = {.model_path = g_assistant};
  CHECK_OK(tsr_engine_load_setup(&opt, &d));
  if (!e || !d || !prefix || !inputs || !tokens || !th || !steps || prefix->ne[0] != pos) {
    CHECK_MSG(false, "the golden draft tensors, the target or the drafter are missing");
    goto done;
  }
  const int32_t V = tsr_engine_n_vocab(e);
  const int64_t E = th->ne[0];
  float *logits = malloc(sizeof(float) * (size_t)V), *h = malloc(sizeof(float) * (size_t)E);
  float *next = malloc(sizeof(float) * (size_t)E);
  CHECK_OK(tsr_engine_eval(e, 0, prefix->data, (int32_t)pos, logits, NULL));
  memcpy(h, (const float *)th->data + (size_t)(th->ne[1] - 1) * E, sizeof(float) * (size_t)E);
  for (uint32_t j = 0; j < steps; j++) {
    const int32_t tok = ((const int32_t *)inputs->data)[j];
    CHECK_OK(tsr_engine_drafter_step(e, d, 0, tok, (int32_t)pos, h, logits, next));
    char name[64];
    snprintf(name, sizeof name, "draft.%u.logits", j);
    const struct tsr_gguf_tensor *want = tsr_gguf_find_tensor(g_gold, name);
    if (!want || want->ne[0] != V) break;
    snprintf(name, sizeof name, "draft.%u.projected", j);
    const struct tsr_gguf_tensor *want_h = tsr_gguf_find_tensor(g_gold, name);
    if (!want_h || want_h->ne[0] != E) break;
    const double rel = tsr_test_row_rel(logits, want->data, V);
    const double rel_h = tsr_test_row_rel(next, want_h->data, E);
    const int32_t arg = (int32_t)tsr_test_argmax(logits, V);
    printf("  K/V %s, step %u: token %d -> %d (reference %d), logits max rel %.2e, projected "
           "%.2e\n", kv, j, tok, arg, ((const int32_t *)tokens->data)[j], rel, rel_h);
    if (proj_tol > 0) {
      CHECK_MSG(rel_h <= proj_tol, "K/V %s: projected state max rel %g", kv, rel_h);
      break;
    }
    CHECK_MSG(rel <= tol, "K/V %s, step %u: max rel %g", kv, j, rel);
    CHECK(arg == ((const int32_t *)tokens->data)[j]);
    if (!chain) break;
    memcpy(h, next, sizeof(float) * (size_t)E);
  }
  CHECK(tsr_engine_seq_len(e, 0) == (int32_t)pos); /* the target holds what it held */
  free(logits), free(h), free(next);
done:
  tsr_setup_free(d);
  tsr_engine_free(e);
}

static void test_drafter_steps_match_assisted_generation(void) {
  const bool cpu = !strcmp(g_backend, "cpu");
  /* the target's own K/V (the reference's differ in the last bits), through a chain of
  ** steps on random weights that grows any difference tenfold a step: 2e-5 at the first,
  ** 7e-4 by the third on the cpu; on cuda (its own rounding: 9e-3 at the first step on
  ** an H100) the first step is bounded and the rest must agree in the token */
  drafter_golden_case("f32", cpu ? 2e-3 : 3e-2, cpu, 0);
  if (!cpu) drafter_golden_case("f32", 1.0, true, 0);
  /* rotated K/V (turbo8: 8-bit centroids of the rotated coordinates): the drafter's query
  ** goes into the target layer's rotated domain and its output comes back, as that layer's
  ** own do. These random weights magnify a cache's error: q8_0 K/V move the projected state
  ** by 0.14, turbo8 by 0.27, turbo8 read without the transforms by 1.46; the logits of the
  ** ordered head jump where the picked clusters change, so the state is what is bounded */
  drafter_golden_case("turbo8", 0, false, 0.5);
}

static void test_assistant_greedy_speculation_is_plain_greedy(void) {
  greedy_case(g_target, "assistant", NULL, false);
  greedy_case(g_target, "assistant", "q8_0", false);
  greedy_case(g_target, "assistant", "dca", false);
  greedy_case(g_target, "assistant", "turbo4", false);
}

/* Copies src to dst with tensor name's values replaced by fill(i) (f32). */
static bool patch(const char *dst, const struct tsr_gguf *g, const char *name,
                  float (*fill)(int64_t i, const int64_t *ne)) {
  const struct tsr_gguf_tensor *t = tsr_gguf_find_tensor(g, name);
  CHECK_MSG(t && t->dtype == TSR_F32, "%s: no f32 tensor %s", g_model, name);
  if (!t || t->dtype != TSR_F32) return false;
  float *v = malloc(t->nbytes);
  for (int64_t i = 0; i < t->n_elements; i++) v[i] = fill(i, t->ne);
  int fd = open(dst, O_WRONLY);
  bool ok = fd >= 0 && pwrite(fd, v, t->nbytes, (off_t)t->file_offset) == (ssize_t)t->nbytes;
  if (fd >= 0) close(fd);
  free(v);
  CHECK_MSG(ok, "writing %s into %s", name, dst);
  return ok;
}

static float zero(int64_t i, const int64_t *ne) { return (void)i, (void)ne, 0.0f; }
static float one(int64_t i, const int64_t *ne) { return (void)i, (void)ne, 1.0f; }
/* eh_proj [2E, E]: output j takes input E + j, the hidden row's coordinate j */
static float pass_hidden(int64_t i, const int64_t *ne) {
  return i % ne[0] == ne[0] / 2 + i / ne[0] ? 1.0f : 0.0f;
}

/* The echo head: attention and FFN outputs zero, eh_proj passes the normed hidden row
** through, the head's norms ones, so its logits are the trunk's (scaled): it drafts
** the token it was given. */
static bool make_echo(const char *dst) {
  char cmd[2100];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", g_model, dst);
  if (system(cmd) != 0) return false;
  struct tsr_gguf *g = NULL;
  if (tsr_gguf_open(g_model, &g) != TSR_OK) return false;
  uint32_t n_layer = 0;
  bool ok = tsr_gguf_get_u32(g, "qwen35.block_count", &n_layer) == TSR_OK;
  char name[96];
  const int il = (int)n_layer - 1;
  snprintf(name, sizeof name, "blk.%d.attn_output.weight", il);
  ok = ok && patch(dst, g, name, zero);
  snprintf(name, sizeof name, "blk.%d.ffn_down.weight", il);
  ok = ok && patch(dst, g, name, zero);
  snprintf(name, sizeof name, "blk.%d.nextn.eh_proj.weight", il);
  ok = ok && patch(dst, g, name, pass_hidden);
  snprintf(name, sizeof name, "blk.%d.nextn.hnorm.weight", il);
  ok = ok && patch(dst, g, name, one);
  snprintf(name, sizeof name, "blk.%d.nextn.shared_head_norm.weight", il);
  ok = ok && patch(dst, g, name, one);
  tsr_gguf_close(g);
  return ok;
}

int main(int argc, char **argv) {
  int a = 1;
  if (argc > 2 && !strcmp(argv[1], "--backend")) g_backend = argv[2], a = 3;
  if (argc - a != 5) {
    fprintf(stderr, "usage: %s [--backend cuda] OUT_DIR QWEN35.gguf E2B.gguf ASSISTANT.gguf "
            "ASSISTANT_GOLDEN.gguf\n", argv[0]);
    return 2;
  }
  g_out = argv[a], g_model = argv[a + 1], g_target = argv[a + 2], g_assistant = argv[a + 3];
  if (tsr_gguf_open(argv[a + 4], &g_gold) != TSR_OK) {
    fprintf(stderr, "%s\n", tsr_error_message());
    return 2;
  }
  static char echo[1100];
  snprintf(echo, sizeof echo, "%s/echo-head.gguf", g_out);
  g_echo = echo;
  if (!make_echo(echo)) {
    fprintf(stderr, "cannot write the echo-head model %s\n", echo);
    return 2;
  }
  TSR_RUN(test_head_cache_equals_whole_sequence);
  TSR_RUN(test_nextn_greedy_speculation_is_plain_greedy);
  TSR_RUN(test_drafter_steps_match_assisted_generation);
  TSR_RUN(test_assistant_greedy_speculation_is_plain_greedy);
  tsr_gguf_close(g_gold);
  return TSR_TEST_EXIT();
}
