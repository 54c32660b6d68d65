/*
** Context shift and prompt-prefix reuse in the engine over arch_qwen.
** Shift: a full 64-cell context shifted by 16 must give the next token the
** logits of a cache that simply lost those positions without any shift (the
** query then sits 16 positions further on, so every query-key distance is
** the same: exact in exact arithmetic) — f32 KV within 1e-4, q8_0 KV by
** argmax. With a kept prefix (n_keep 4) the prefix-to-rest distances change,
** so no unshifted cache matches; against one built from scratch from the kept
** tokens only the agreement is reported, not bounded: layers above the first
** computed the kept tokens' K/V having seen the dropped ones. A model with
** linear layers refuses and keeps its cache. Prefix reuse: common_prefix
** follows eval, seq_rm and shift.
** usage: test_engine_shift MODEL.gguf GOLDEN.gguf (run_engine_decode.sh converts at f32)
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "common/error.h"
#include "model/gguf.h"
#include "tests/harness.h"
#include "tests/logits_test_util.h"

enum { CTX = 64, KEEP = 4, DISCARD = 16 };

static const char *g_model;
static const int32_t *g_ids;
static int32_t g_n, g_vocab;
static bool g_linear; /* the model has recurrent layers: shift must be refused */

static struct tsr_engine *engine(const char *kv) {
  char k[32], v[32];
  snprintf(k, sizeof k, "kv.k=%s", kv);
  snprintf(v, sizeof v, "kv.v=%s", kv);
  const char *sets[] = {k, v, "context=64", "ubatch=32"};
  struct tsr_engine_options opt = {.sets = sets, .n_sets = 4, .model_path = g_model,
                                   .n_threads = 2};
  struct tsr_engine *e = NULL;
  CHECK_OK(tsr_engine_new(&opt, &e));
  return e;
}

/* Fills the context with the first CTX golden tokens, shifts (keep, discard) and evaluates
** token CTX: its logits in out. */
static bool shifted(const char *kv, int32_t keep, float *out) {
  struct tsr_engine *e = engine(kv);
  if (!e) return false;
  CHECK_OK(tsr_engine_eval(e, 0, g_ids, CTX, out, NULL));
  tsr_status st = tsr_engine_context_shift(e, 0, keep, DISCARD);
  CHECK_MSG(st == TSR_OK, "shift: %s", tsr_error_message());
  CHECK(tsr_engine_seq_len(e, 0) == CTX - DISCARD);
  if (st == TSR_OK) CHECK_OK(st = tsr_engine_eval(e, 0, g_ids + CTX, 1, out, NULL));
  CHECK(tsr_engine_seq_len(e, 0) == CTX - DISCARD + 1);
  tsr_engine_free(e);
  return st == TSR_OK;
}

/* The reference without any shift: the same CTX tokens, [keep, keep + DISCARD) removed,
** then token CTX at position CTX. With keep 0 every query-key distance equals the
** shifted cache's. */
static bool unshifted(const char *kv, int32_t keep, float *out) {
  struct tsr_engine *e = engine(kv);
  if (!e) return false;
  CHECK_OK(tsr_engine_eval(e, 0, g_ids, CTX, out, NULL));
  CHECK_OK(tsr_engine_seq_rm(e, 0, keep, keep + DISCARD));
  CHECK(tsr_engine_seq_len(e, 0) == CTX);
  tsr_status st = tsr_engine_eval(e, 0, g_ids + CTX, 1, out, NULL);
  CHECK_MSG(st == TSR_OK, "eval: %s", tsr_error_message());
  tsr_engine_free(e);
  return st == TSR_OK;
}

static void test_shift_without_prefix_equals_dropping_positions(void) {
  if (g_linear) return;
  float *a = malloc((size_t)g_vocab * sizeof *a), *b = malloc((size_t)g_vocab * sizeof *b);
  if (shifted("f32", 0, a) && unshifted("f32", 0, b)) {
    double r = tsr_test_row_rel(a, b, g_vocab);
    printf("  f32 KV: shift(keep 0, discard %d) vs dropped without shift: max rel %.3e, "
           "argmax %s\n", DISCARD, r, tsr_test_argmax(a, g_vocab) == tsr_test_argmax(b, g_vocab) ? "equal" : "differs");
    CHECK_MSG(r <= 1e-4, "max rel %g", r);
    CHECK(tsr_test_argmax(a, g_vocab) == tsr_test_argmax(b, g_vocab));
  }
  if (shifted("q8_0", 0, a) && unshifted("f32", 0, b)) {
    double r = tsr_test_row_rel(a, b, g_vocab);
    printf("  q8_0 KV: shift vs f32 dropped without shift: max rel %.3e, argmax %s\n", r,
           tsr_test_argmax(a, g_vocab) == tsr_test_argmax(b, g_vocab) ? "equal" : "differs");
    CHECK(tsr_test_argmax(a, g_vocab) == tsr_test_argmax(b, g_vocab));
    CHECK_MSG(r <= 5e-2, "max rel %g", r);
  }
  free(a);
  free(b);
}

/* Without a shift a kept prefix cannot keep its distances; from-scratch is the best
** independent reference there: the kept tokens only, at their new positions. */
static void test_shift_with_kept_prefix_against_from_scratch(void) {
  if (g_linear) return;
  float *a = malloc((size_t)g_vocab * sizeof *a), *b = malloc((size_t)g_vocab * sizeof *b);
  int32_t kept[CTX - DISCARD + 1];
  memcpy(kept, g_ids, KEEP * sizeof *kept);
  memcpy(kept + KEEP, g_ids + KEEP + DISCARD, (CTX - KEEP - DISCARD + 1) * sizeof *kept);
  struct tsr_engine *e = engine("f32");
  if (e && shifted("f32", KEEP, a)) {
    CHECK_OK(tsr_engine_eval(e, 0, kept, CTX - DISCARD + 1, b, NULL));
    double r = tsr_test_row_rel(a, b, g_vocab);
    printf("  f32 KV: shift(keep %d, discard %d) vs from scratch (tokens 0..%d, %d..%d at "
           "0..%d): max rel %.3e, argmax %s (reported)\n", KEEP, DISCARD, KEEP - 1,
           KEEP + DISCARD, CTX, CTX - DISCARD, r,
           tsr_test_argmax(a, g_vocab) == tsr_test_argmax(b, g_vocab) ? "equal" : "differs");
    CHECK(isfinite(r));
  }
  tsr_engine_free(e);
  free(a);
  free(b);
}

static void test_shift_is_refused_for_recurrent_layers_and_keeps_the_cache(void) {
  if (!g_linear) return;
  struct tsr_engine *e = engine("f32");
  if (!e) return;
  float *a = malloc((size_t)g_vocab * sizeof *a), *b = malloc((size_t)g_vocab * sizeof *b);
  CHECK_OK(tsr_engine_eval(e, 0, g_ids, 32, a, NULL));
  CHECK(tsr_engine_context_shift(e, 0, KEEP, DISCARD) == TSR_ERR_UNSUPPORTED);
  printf("  refused: %s\n", tsr_error_message());
  CHECK(strstr(tsr_error_message(), "linear") != NULL);
  CHECK(tsr_engine_seq_len(e, 0) == 32);
  CHECK_OK(tsr_engine_eval(e, 0, g_ids + 32, 1, a, NULL));
  struct tsr_engine *ref = engine("f32");
  if (ref) {
    CHECK_OK(tsr_engine_eval(ref, 0, g_ids, 33, b, NULL));
    CHECK(tsr_test_row_rel(a, b, g_vocab) <= 1e-4);
  }
  tsr_engine_free(ref);
  tsr_engine_free(e);
  free(a);
  free(b);
}

static void test_common_prefix_follows_eval_seq_rm_and_shift(void) {
  struct tsr_engine *e = engine("f32");
  if (!e) return;
  float *out = malloc((size_t)g_vocab * sizeof *out);
  int32_t t[12];
  memcpy(t, g_ids, sizeof t);
  CHECK(tsr_engine_common_prefix(e, 0, t, 12) == 0);
  CHECK_OK(tsr_engine_eval(e, 0, t, 6, out, NULL));
  CHECK_OK(tsr_engine_eval(e, 0, t + 6, 4, out, NULL));
  CHECK(tsr_engine_common_prefix(e, 0, t, 12) == 10);
  CHECK(tsr_engine_common_prefix(e, 0, t, 7) == 7);
  t[5] = (t[5] + 1) % g_vocab;
  CHECK(tsr_engine_common_prefix(e, 0, t, 12) == 5);
  t[5] = g_ids[5];
  if (!g_linear) {
    CHECK_OK(tsr_engine_context_shift(e, 0, 2, 3)); /* holds ids 0, 1, 5..9 */
    int32_t s[8] = {g_ids[0], g_ids[1], g_ids[5], g_ids[6], g_ids[7], g_ids[8], g_ids[9], 0};
    CHECK(tsr_engine_common_prefix(e, 0, s, 8) == 7);
    CHECK(tsr_engine_common_prefix(e, 0, t, 12) == 2);
    CHECK_OK(tsr_engine_seq_rm(e, 0, 4, -1));
    CHECK(tsr_engine_common_prefix(e, 0, s, 8) == 4);
  } else {
    CHECK_OK(tsr_engine_seq_rm(e, 0, -1, -1));
    CHECK(tsr_engine_common_prefix(e, 0, t, 12) == 0);
  }
  free(out);
  tsr_engine_free(e);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s MODEL.gguf GOLDEN.gguf\n", argv[0]);
    return 2;
  }
  g_model = argv[1];
  struct tsr_gguf *gold = NULL, *model = NULL;
  struct tsr_test_golden gs;
  if (!tsr_test_golden_seq0(argv[2], CTX + 1, &gold, &gs)) return 2;
  if (tsr_gguf_open(argv[1], &model) != TSR_OK) {
    fprintf(stderr, "%s\n", tsr_error_message());
    return 2;
  }
  const char *arch = "";
  tsr_gguf_get_str(model, "general.architecture", &arch);
  g_linear = !strncmp(arch, "qwen35", 6) || !strcmp(arch, "qwen3next");
  g_ids = gs.ids, g_n = gs.n, g_vocab = gs.vocab;
  printf("%s (%s): %d tokens, vocabulary %d\n", g_model, arch, g_n, g_vocab);
  TSR_RUN(test_shift_without_prefix_equals_dropping_positions);
  TSR_RUN(test_shift_with_kept_prefix_against_from_scratch);
  TSR_RUN(test_shift_is_refused_for_recurrent_layers_and_keeps_the_cache);
  TSR_RUN(test_common_prefix_follows_eval_seq_rm_and_shift);
  tsr_gguf_close(model);
  tsr_gguf_close(gold);
  return TSR_TEST_EXIT();
}
