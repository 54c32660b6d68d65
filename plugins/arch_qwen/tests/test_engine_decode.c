/*
** The engine over arch_qwen with a KV cache: a whole golden sequence in one
** call reproduces the reference logits; prefill then token-by-token decode
** reproduces that call's logits; a full context is refused with the cache
** unchanged; removing positions and evaluating them again gives the same
** logits; the LM head computes only the rows that are read. usage: test_engine_decode MODEL.gguf GOLDEN.gguf (a fixture
** converted at f32; run_engine_decode.sh converts it).
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

#define N_PREFILL 100

static const char *g_model;
static const int32_t *g_ids;
static const float *g_golden; /* [n_vocab, g_n] */
static int32_t g_n, g_vocab;
static float *g_whole;        /* (a)'s logits, the reference for the decode tests */

/* An engine on the built-in default profile, the fixture as model, and sets. */
static struct tsr_engine *engine(const char *const *sets, int n_sets) {
  struct tsr_engine_options opt = {.sets = sets, .n_sets = n_sets, .model_path = g_model,
                                   .n_threads = 2};
  struct tsr_engine *e = NULL;
  CHECK_OK(tsr_engine_new(&opt, &e));
  if (e) CHECK(tsr_engine_n_vocab(e) == g_vocab);
  return e;
}

static const char *const k_f32_kv[] = {"kv.k=f32", "kv.v=f32", "ubatch=64"};

static void test_whole_sequence_in_one_call_matches_golden(void) {
  struct tsr_engine *e = engine(k_f32_kv, 3); /* 160 tokens: three ubatches */
  if (!e) return;
  float *last = malloc((size_t)g_vocab * sizeof *last);
  CHECK_OK(tsr_engine_eval(e, 0, g_ids, g_n, last, g_whole));
  double worst = 0;
  for (int32_t p = 0; p < g_n; p++) {
    double r = tsr_test_row_rel(g_whole + (size_t)p * g_vocab, g_golden + (size_t)p * g_vocab, g_vocab);
    if (!(r <= worst)) worst = r;
  }
  printf("  (a) whole sequence vs golden: max rel %.3e over %d positions\n", worst, g_n);
  CHECK_MSG(worst <= 1e-4, "max rel %g", worst);
  CHECK(!memcmp(last, g_whole + (size_t)(g_n - 1) * g_vocab, (size_t)g_vocab * sizeof *last));
  CHECK(tsr_engine_seq_len(e, 0) == g_n);
  free(last);
  tsr_engine_free(e);
}

/* Prefill N_PREFILL tokens, decode the rest one at a time; the logits of
** every decoded position against (a). Returns the engine for more. */
static struct tsr_engine *prefill_decode(const char *const *sets, int n_sets, double *max_rel,
                                         int *agree, float *rows) {
  struct tsr_engine *e = engine(sets, n_sets);
  if (!e) return NULL;
  float *out = malloc((size_t)g_vocab * sizeof *out);
  CHECK_OK(tsr_engine_eval(e, 0, g_ids, N_PREFILL, out, NULL));
  *max_rel = tsr_test_row_rel(out, g_whole + (size_t)(N_PREFILL - 1) * g_vocab, g_vocab);
  *agree = 0;
  for (int32_t p = N_PREFILL; p < g_n; p++) {
    tsr_status st = tsr_engine_eval(e, 0, g_ids + p, 1, out, NULL);
    CHECK_MSG(st == TSR_OK, "decode at %d: %s", p, tsr_error_message());
    if (st != TSR_OK) break;
    const float *ref = g_whole + (size_t)p * g_vocab;
    double r = tsr_test_row_rel(out, ref, g_vocab);
    if (!(r <= *max_rel)) *max_rel = r;
    *agree += tsr_test_argmax(out, g_vocab) == tsr_test_argmax(ref, g_vocab);
    if (rows) memcpy(rows + (size_t)(p - N_PREFILL) * g_vocab, out, (size_t)g_vocab * sizeof *out);
  }
  CHECK(tsr_engine_seq_len(e, 0) == g_n);
  free(out);
  return e;
}

static void test_decode_token_by_token_matches_one_call(void) {
  double rel;
  int agree;
  const int n_dec = g_n - N_PREFILL;
  float *rows = malloc((size_t)n_dec * g_vocab * sizeof *rows);
  struct tsr_engine *e = prefill_decode(k_f32_kv, 3, &rel, &agree, rows);
  if (!e) return;
  printf("  (b) f32 KV: prefill %d + decode %d vs one call: max rel %.3e, argmax %d/%d\n",
         N_PREFILL, n_dec, rel, agree, n_dec);
  CHECK_MSG(rel <= 1e-4, "max rel %g", rel);
  CHECK(agree == n_dec);

  /* (d) drop the decoded tail and run it again in one call: the same logits. A model with
  ** recurrent layers cannot drop part of a sequence: refused, nothing changes, and the
  ** whole sequence is dropped and run again instead. */
  float *again = malloc((size_t)g_n * g_vocab * sizeof *again);
  tsr_status st = tsr_engine_seq_rm(e, 0, N_PREFILL, -1);
  int32_t from = N_PREFILL;
  if (st == TSR_ERR_UNSUPPORTED) {
    CHECK(tsr_engine_seq_len(e, 0) == g_n);
    CHECK_OK(tsr_engine_seq_rm(e, 0, 0, -1));
    from = 0;
  }
  CHECK(st == TSR_OK || st == TSR_ERR_UNSUPPORTED);
  CHECK(tsr_engine_seq_len(e, 0) == from);
  CHECK_OK(tsr_engine_eval(e, 0, g_ids + from, g_n - from, NULL, again));
  double worst = 0;
  for (int32_t p = N_PREFILL; p < g_n; p++) {
    double r = tsr_test_row_rel(again + (size_t)(p - from) * g_vocab,
                       rows + (size_t)(p - N_PREFILL) * g_vocab, g_vocab);
    if (!(r <= worst)) worst = r;
  }
  printf("  (d) seq_rm [%d, end) and eval again vs decode: max rel %.3e\n", from, worst);
  CHECK_MSG(worst <= 1e-4, "max rel %g", worst);
  CHECK(tsr_engine_seq_len(e, 0) == g_n);
  free(again);
  free(rows);
  tsr_engine_free(e);
}

static void test_decode_with_f16_kv_keeps_argmax(void) {
  static const char *const sets[] = {"ubatch=64"}; /* the default profile's f16 KV */
  double rel;
  int agree;
  struct tsr_engine *e = prefill_decode(sets, 1, &rel, &agree, NULL);
  if (!e) return;
  printf("  (b) f16 KV: decode vs one call with f32 KV: max rel %.3e, argmax %d/%d\n", rel, agree,
         g_n - N_PREFILL);
  CHECK(agree == g_n - N_PREFILL);
  CHECK_MSG(rel <= 2e-2, "max rel %g", rel);
  tsr_engine_free(e);
}

static void test_full_context_is_refused_and_cache_unchanged(void) {
  static const char *const sets[] = {"kv.k=f32", "kv.v=f32", "context=32"};
  struct tsr_engine *e = engine(sets, 3);
  if (!e) return;
  float *out = malloc((size_t)g_vocab * sizeof *out), *ref = malloc((size_t)g_vocab * sizeof *ref);
  /* 40 tokens into an empty 32-cell context */
  CHECK(tsr_engine_eval(e, 0, g_ids, 40, out, NULL) == TSR_ERR_NOMEM);
  CHECK(strstr(tsr_error_message(), "32") != NULL);
  CHECK(tsr_engine_seq_len(e, 0) == 0);
  /* 10 held, 30 more do not fit; 10 still held and the next token still right */
  CHECK_OK(tsr_engine_eval(e, 0, g_ids, 10, out, NULL));
  CHECK(tsr_engine_eval(e, 0, g_ids + 10, 30, out, NULL) == TSR_ERR_NOMEM);
  CHECK(tsr_engine_seq_len(e, 0) == 10);
  CHECK_OK(tsr_engine_eval(e, 0, g_ids + 10, 1, out, NULL));
  double r = tsr_test_row_rel(out, g_whole + (size_t)10 * g_vocab, g_vocab);
  CHECK_MSG(r <= 1e-4, "position 10 after the refusal: max rel %g", r);
  /* the rest of the context still fits exactly */
  CHECK_OK(tsr_engine_eval(e, 0, g_ids + 11, 21, out, NULL));
  CHECK(tsr_engine_seq_len(e, 0) == 32);
  CHECK(tsr_engine_eval(e, 0, g_ids + 32, 1, ref, NULL) == TSR_ERR_NOMEM);
  CHECK(tsr_engine_seq_len(e, 0) == 32);
  free(out);
  free(ref);
  tsr_engine_free(e);
}

/* A fill of positions only (bench's --depth-fill positions): the sequence grows by the
** positions, nothing is remembered for prompt reuse, the next token sees finite values,
** a fill past the context is refused with the cache unchanged, and removing the filled
** positions gives back the computed decode exactly. */
static void test_positions_fill_holds_positions_only(void) {
  static const char *const sets[] = {"kv.k=f32", "kv.v=f32", "context=64", "ubatch=16"};
  struct tsr_engine *e = engine(sets, 4);
  if (!e) return;
  const struct tsr_setup *su = tsr_engine_setup(e);
  bool linear = false;
  for (int32_t i = 0; i < su->n_layers; i++) linear |= su->layers[i].kind == TSR_LAYER_LINEAR;
  float *out = malloc((size_t)g_vocab * sizeof *out);
  CHECK_OK(tsr_engine_eval(e, 0, g_ids, 10, out, NULL));
  if (linear) { /* recurrent state only a computed fill gives */
    CHECK(tsr_engine_fill_positions(e, 0, 40) == TSR_ERR_UNSUPPORTED);
    CHECK(strstr(tsr_error_message(), "recurrent") != NULL);
    CHECK(tsr_engine_seq_len(e, 0) == 10);
    free(out);
    tsr_engine_free(e);
    return;
  }
  CHECK_OK(tsr_engine_fill_positions(e, 0, 40)); /* three ubatches' worth */
  CHECK(tsr_engine_seq_len(e, 0) == 50);
  CHECK(tsr_engine_common_prefix(e, 0, g_ids, 10) == 10); /* the computed ids stay */
  CHECK_OK(tsr_engine_eval(e, 0, g_ids + 10, 1, out, NULL));
  int finite = 1;
  for (int32_t i = 0; i < g_vocab; i++) finite &= isfinite(out[i]) != 0;
  CHECK(finite);
  CHECK(tsr_engine_seq_len(e, 0) == 51);
  CHECK(tsr_engine_fill_positions(e, 0, 14) == TSR_ERR_NOMEM);
  CHECK(tsr_engine_seq_len(e, 0) == 51);
  CHECK(tsr_engine_fill_positions(e, 1, 4) == TSR_ERR_INVALID_ARG); /* one sequence */
  CHECK_OK(tsr_engine_seq_rm(e, 0, 10, -1));
  CHECK_OK(tsr_engine_eval(e, 0, g_ids + 10, 1, out, NULL));
  const double r = tsr_test_row_rel(out, g_whole + (size_t)10 * g_vocab, g_vocab);
  CHECK_MSG(r <= 1e-4, "position 10 after the filled positions were removed: max rel %g", r);
  free(out);
  tsr_engine_free(e);
}

/* The LM head runs only for the tokens whose logits are read (tsr_arch_forward.output_rows):
** a prefill that reads the last token computes one row a ubatch, and a batch reading every
** third token gets each of those rows, in order, equal to (a)'s. */
static void test_logits_are_computed_for_read_rows_only(void) {
  struct tsr_engine *e = engine(k_f32_kv, 3);
  if (!e) return;
  const int32_t n = N_PREFILL; /* two ubatches of 64 */
  float *rows = malloc((size_t)n * g_vocab * sizeof *rows);
  int64_t before = tsr_engine_logits_rows(e);
  CHECK_OK(tsr_engine_eval(e, 0, g_ids, n, rows, NULL));
  CHECK_MSG(tsr_engine_logits_rows(e) - before == 2, "%lld rows for a 2-ubatch prefill",
            (long long)(tsr_engine_logits_rows(e) - before));
  double last = tsr_test_row_rel(rows, g_whole + (size_t)(n - 1) * g_vocab, g_vocab);
  CHECK_MSG(last <= 1e-6, "last row: rel %g", last);
  CHECK_OK(tsr_engine_seq_rm(e, 0, -1, -1));
  int32_t seq[N_PREFILL], n_want = 0;
  bool want[N_PREFILL];
  for (int32_t i = 0; i < n; i++) seq[i] = 0, want[i] = i % 3 == 1, n_want += want[i];
  struct tsr_engine_batch b = {.n = n, .tokens = g_ids, .seq = seq, .logits = want};
  before = tsr_engine_logits_rows(e);
  CHECK_OK(tsr_engine_eval_batch(e, &b, rows));
  CHECK(tsr_engine_logits_rows(e) - before == n_want);
  double worst = 0;
  for (int32_t i = 0, k = 0; i < n; i++) {
    if (!want[i]) continue;
    double r = tsr_test_row_rel(rows + (size_t)k++ * g_vocab, g_whole + (size_t)i * g_vocab, g_vocab);
    if (!(r <= worst)) worst = r;
  }
  printf("  (f) logits of the read rows only: %d of %d, max rel %.3e vs (a)\n", n_want, n, worst);
  CHECK_MSG(worst <= 1e-6, "max rel %g", worst);
  free(rows);
  tsr_engine_free(e);
}

/* One sequence's next tokens as batch entries: ids[p0..p0+n) to seq. */
static int32_t add_tokens(int32_t *tok, int32_t *seq, bool *want, int32_t at, int32_t s,
                          int32_t p0, int32_t n) {
  for (int32_t i = 0; i < n; i++)
    tok[at + i] = g_ids[p0 + i], seq[at + i] = s, want[at + i] = true;
  return at + n;
}

/* Sequences 0 and 1 hold prefixes of the golden sequence; one batch decodes
** a token of each and prefills sequence 2; then steps of one token per
** sequence. Every row matches (a) at its position: the sequences see only
** their own cells, and a model with linear layers runs them one by one. */
static void test_several_sequences_in_one_batch_match_each_alone(void) {
  static const char *const sets[] = {"kv.k=f32", "kv.v=f32", "ubatch=64", "server.parallel=4"};
  struct tsr_engine *e = engine(sets, 4);
  if (!e) return;
  const int32_t len0 = 60, len1 = 40, len2 = 30, steps = 8;
  CHECK_OK(tsr_engine_eval(e, 0, g_ids, len0, NULL, NULL));
  CHECK_OK(tsr_engine_eval(e, 1, g_ids, len1, NULL, NULL));
  int32_t tok[64], seq[64], pos[64];
  bool want[64];
  int32_t n = add_tokens(tok, seq, want, 0, 0, len0, 1);
  n = add_tokens(tok, seq, want, n, 1, len1, 1);
  n = add_tokens(tok, seq, want, n, 2, 0, len2);
  pos[0] = len0, pos[1] = len1;
  for (int32_t i = 0; i < len2; i++) pos[2 + i] = i;
  float *rows = malloc((size_t)64 * g_vocab * sizeof *rows);
  double worst = 0;
  for (int32_t step = 0; step <= steps; step++) {
    struct tsr_engine_batch b = {.n = n, .tokens = tok, .seq = seq, .logits = want};
    tsr_status st = tsr_engine_eval_batch(e, &b, rows);
    CHECK_MSG(st == TSR_OK, "step %d: %s", step, tsr_error_message());
    if (st != TSR_OK) break;
    for (int32_t i = 0; i < n; i++) {
      double r = tsr_test_row_rel(rows + (size_t)i * g_vocab, g_whole + (size_t)pos[i] * g_vocab,
                                  g_vocab);
      if (!(r <= worst)) worst = r;
    }
    /* next: one token per sequence at its next position */
    n = 0;
    for (int32_t s = 0; s < 3; s++) {
      pos[n] = tsr_engine_seq_len(e, s);
      n = add_tokens(tok, seq, want, n, s, pos[n], 1);
    }
  }
  printf("  (e) 3 sequences in shared batches, %d steps: max rel %.3e vs one call\n", steps,
         worst);
  CHECK_MSG(worst <= 1e-4, "max rel %g", worst);
  CHECK(tsr_engine_seq_len(e, 0) == len0 + 1 + steps);
  CHECK(tsr_engine_seq_len(e, 1) == len1 + 1 + steps);
  CHECK(tsr_engine_seq_len(e, 2) == len2 + steps);
  /* a token naming a sequence past server.parallel is refused, nothing changes */
  int32_t bad_seq[2] = {0, 4};
  struct tsr_engine_batch bad = {.n = 2, .tokens = tok, .seq = bad_seq};
  CHECK(tsr_engine_eval_batch(e, &bad, rows) == TSR_ERR_INVALID_ARG);
  CHECK(strstr(tsr_error_message(), "sequence 4") != NULL);
  CHECK(tsr_engine_seq_len(e, 0) == len0 + 1 + steps);
  free(rows);
  tsr_engine_free(e);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s MODEL.gguf GOLDEN.gguf\n", argv[0]);
    return 2;
  }
  g_model = argv[1];
  struct tsr_gguf *gold = NULL;
  struct tsr_test_golden gs;
  if (!tsr_test_golden_seq0(argv[2], N_PREFILL + 1, &gold, &gs)) return 2;
  g_ids = gs.ids, g_n = gs.n, g_golden = gs.logits, g_vocab = gs.vocab;
  g_whole = calloc((size_t)g_n * g_vocab, sizeof *g_whole);
  printf("%s: %d tokens, vocabulary %d\n", g_model, g_n, g_vocab);
  TSR_RUN(test_whole_sequence_in_one_call_matches_golden);
  TSR_RUN(test_decode_token_by_token_matches_one_call);
  TSR_RUN(test_decode_with_f16_kv_keeps_argmax);
  TSR_RUN(test_full_context_is_refused_and_cache_unchanged);
  TSR_RUN(test_several_sequences_in_one_batch_match_each_alone);
  TSR_RUN(test_logits_are_computed_for_read_rows_only);
  TSR_RUN(test_positions_fill_holds_positions_only);
  free(g_whole);
  tsr_gguf_close(gold);
  return TSR_TEST_EXIT();
}
