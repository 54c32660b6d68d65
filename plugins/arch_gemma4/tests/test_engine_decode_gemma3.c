/*
** The engine over arch_gemma4 with a KV cache on the real Gemma 3 270M
** (q4_k_m): prefill N_PREFILL tokens of the golden sequence 0, decode the
** rest one at a time, and check every decoded position (a) against one
** engine call over the whole sequence (max rel, f32 KV) and (b) its top-1
** against transformers' (the golden top_ids[0], every position), on the cpu's
** f32 activations. With f16 KV the decoded top-1 must still match the golden's;
** with q8 activations decode must equal one call exactly.
** usage: test_engine_decode_gemma3 MODEL.gguf GOLDEN.gguf
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

#define N_PREFILL 40

static const char *g_model;
static const int32_t *g_ids, *g_top; /* g_top: [k, n], top-1 first */
static int32_t g_n, g_k, g_vocab;
static float *g_whole; /* one call's logits, f32 KV */

/* activations: the cpu's f32 (the numerical reference, against transformers) or q8 */
static struct tsr_engine *engine(const char *kv, const char *activations) {
  char k[32], v[32], act[64];
  snprintf(k, sizeof k, "kv.k=%s", kv);
  snprintf(v, sizeof v, "kv.v=%s", kv);
  snprintf(act, sizeof act, "backend={name: cpu, activations: %s}", activations);
  const char *const sets[] = {k, v, "context=128", act};
  struct tsr_engine_options opt = {.sets = sets, .n_sets = 4, .model_path = g_model,
                                   .n_threads = 2};
  struct tsr_engine *e = NULL;
  CHECK_OK(tsr_engine_new(&opt, &e));
  if (e) CHECK(tsr_engine_n_vocab(e) == g_vocab);
  return e;
}

static void test_one_call_top1_matches_golden(void) {
  struct tsr_engine *e = engine("f32", "f32");
  if (!e) return;
  CHECK_OK(tsr_engine_eval(e, 0, g_ids, g_n, NULL, g_whole));
  int agree = 0;
  for (int32_t p = 0; p < g_n; p++)
    agree += tsr_test_argmax(g_whole + (size_t)p * g_vocab, g_vocab) == g_top[(size_t)p * g_k];
  printf("  one call, f32 KV: top-1 = golden at %d/%d positions\n", agree, g_n);
  CHECK(agree == g_n);
  tsr_engine_free(e);
}

/* Prefill, then decode; returns how many decoded top-1 match the golden's
** and the worst max rel against the one call. */
static void prefill_decode(const char *kv, const char *activations, const float *whole,
                           int *agree, double *max_rel) {
  *agree = 0;
  *max_rel = INFINITY;
  struct tsr_engine *e = engine(kv, activations);
  if (!e) return;
  float *out = malloc((size_t)g_vocab * sizeof *out);
  CHECK_OK(tsr_engine_eval(e, 0, g_ids, N_PREFILL, out, NULL));
  *max_rel = tsr_test_row_rel(out, whole + (size_t)(N_PREFILL - 1) * g_vocab, g_vocab);
  for (int32_t p = N_PREFILL; p < g_n; p++) {
    tsr_status st = tsr_engine_eval(e, 0, g_ids + p, 1, out, NULL);
    CHECK_MSG(st == TSR_OK, "decode at %d: %s", p, tsr_error_message());
    if (st != TSR_OK) {
      *max_rel = INFINITY;
      break;
    }
    double r = tsr_test_row_rel(out, whole + (size_t)p * g_vocab, g_vocab);
    if (!(r <= *max_rel)) *max_rel = r;
    *agree += tsr_test_argmax(out, g_vocab) == g_top[(size_t)p * g_k];
  }
  CHECK(tsr_engine_seq_len(e, 0) == g_n);
  free(out);
  tsr_engine_free(e);
}

static void test_decode_matches_one_call_and_golden_top1(void) {
  int agree;
  double rel;
  prefill_decode("f32", "f32", g_whole, &agree, &rel);
  printf("  f32 KV: prefill %d + decode %d: max rel vs one call %.3e, top-1 = golden %d/%d\n",
         N_PREFILL, g_n - N_PREFILL, rel, agree, g_n - N_PREFILL);
  CHECK_MSG(rel <= 1e-4, "max rel %g", rel);
  CHECK(agree == g_n - N_PREFILL);
}

static void test_decode_with_f16_kv_keeps_golden_top1(void) {
  int agree;
  double rel;
  prefill_decode("f16", "f32", g_whole, &agree, &rel);
  printf("  f16 KV: prefill %d + decode %d: max rel vs one call (f32 KV) %.3e, top-1 = golden "
         "%d/%d\n", N_PREFILL, g_n - N_PREFILL, rel, agree, g_n - N_PREFILL);
  CHECK(agree == g_n - N_PREFILL);
}

/* The cpu's default, activations coded to 8 bits: decode equals one call bit for bit (each
** column is coded alone, whatever the batch), and top-1 keeps the golden's at all but a
** few near-tied positions: which ones flip moves with any last-bit change upstream (63 of
** 64 with the softmax on expf, 60 with the vector exp), while over 1,530 held-out positions
** the same top stays at 97.4% and the KL to f32 activations at 2.29e-3 nats either way */
static void test_q8_activations_decode_equals_one_call(void) {
  struct tsr_engine *e = engine("f32", "q8");
  float *whole = malloc((size_t)g_n * g_vocab * sizeof *whole);
  if (!e || !whole) {
    tsr_engine_free(e);
    free(whole);
    return;
  }
  CHECK_OK(tsr_engine_eval(e, 0, g_ids, g_n, NULL, whole));
  tsr_engine_free(e);
  int agree = 0, decoded;
  for (int32_t p = 0; p < g_n; p++)
    agree += tsr_test_argmax(whole + (size_t)p * g_vocab, g_vocab) == g_top[(size_t)p * g_k];
  double rel;
  prefill_decode("f32", "q8", whole, &decoded, &rel);
  printf("  q8 activations: one call top-1 = golden %d/%d; prefill + decode: max rel vs one "
         "call %.3e\n", agree, g_n, rel);
  CHECK_MSG(rel == 0.0, "max rel %g", rel);
  CHECK_MSG(agree >= g_n - 5, "top-1 = golden at %d of %d", agree, g_n);
  free(whole);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s MODEL.gguf GOLDEN.gguf\n", argv[0]);
    return 2;
  }
  g_model = argv[1];
  struct tsr_gguf *gold = NULL;
  if (tsr_gguf_open(argv[2], &gold) != TSR_OK) {
    fprintf(stderr, "%s\n", tsr_error_message());
    return 2;
  }
  const struct tsr_gguf_tensor *ids = tsr_gguf_find_tensor(gold, "seq.0.ids");
  const struct tsr_gguf_tensor *top = tsr_gguf_find_tensor(gold, "seq.0.top_ids");
  const struct tsr_gguf_tensor *last = tsr_gguf_find_tensor(gold, "seq.0.last_logits");
  if (!ids || !top || !last || ids->dtype != TSR_I32 || top->dtype != TSR_I32 ||
      top->n_dims != 2 || top->ne[1] != ids->n_elements || ids->n_elements <= N_PREFILL + 1) {
    fprintf(stderr, "%s: want seq.0.ids (i32, > %d), seq.0.top_ids (i32 [k, n]) and "
            "seq.0.last_logits\n", argv[2], N_PREFILL + 1);
    return 2;
  }
  g_ids = ids->data;
  g_top = top->data;
  g_n = (int32_t)ids->n_elements;
  g_k = (int32_t)top->ne[0];
  g_vocab = (int32_t)last->n_elements;
  g_whole = calloc((size_t)g_n * g_vocab, sizeof *g_whole);
  printf("%s: %d tokens, vocabulary %d\n", g_model, g_n, g_vocab);
  TSR_RUN(test_one_call_top1_matches_golden);
  TSR_RUN(test_decode_matches_one_call_and_golden_top1);
  TSR_RUN(test_decode_with_f16_kv_keeps_golden_top1);
  TSR_RUN(test_q8_activations_decode_equals_one_call);
  free(g_whole);
  tsr_gguf_close(gold);
  return TSR_TEST_EXIT();
}
