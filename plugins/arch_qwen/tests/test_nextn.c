/*
** The Qwen3.5 NextN / MTP head (tsr_arch_v1.build_nextn) against
** tests/reference/make_mtp_golden.py's reference on a fixture converted at
** f32: the trunk's final-normed hidden state (fw.hidden_final) and the head's
** logits over golden sequence 0. A model without the head says so by name.
** usage: test_nextn MODEL.gguf GOLDEN.gguf MTP_GOLDEN.gguf TRUNK_ONLY.gguf
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/backend.h"
#include "common/error.h"
#include "model/gguf.h"
#include "graph/graph.h"
#include "abi/setup.h"
#include "tests/harness.h"
#include "tests/arch_pass_util.h"
#include "tests/logits_test_util.h"

static const char *g_model, *g_trunk_only;
static const struct tsr_gguf_tensor *g_seq, *g_ids, *g_pos, *g_hidden, *g_logits;

static struct tsr_setup *open_model(const char *path) {
  char text[1200];
  snprintf(text, sizeof text, "model: %s\nplugins:\n  - arch_qwen\n", path);
  struct tsr_setup *s = NULL;
  tsr_status st = tsr_setup_from_profile_text("(nextn test)", text, NULL, 0, &s);
  CHECK_MSG(st == TSR_OK, "setup: %s", tsr_error_message());
  if (st != TSR_OK) tsr_setup_free(s);
  return st == TSR_OK ? s : NULL;
}

/* Builds (nextn: the head, else the trunk) over n entries, runs it, copies out. */
static tsr_status run(struct tsr_setup *s, bool nextn, int32_t n, const int32_t *tokens,
                      const int32_t *pos, const float *hidden_in, float *logits, float *hidden) {
  return tsr_test_arch_pass(s, nextn, n, tokens, pos, hidden_in, g_hidden->ne[0], logits, hidden);
}

static double worst_rel(const float *a, const float *b, int32_t rows, int64_t width) {
  double worst = 0;
  for (int32_t r = 0; r < rows; r++) {
    double x = tsr_test_row_rel(a + (size_t)r * width, b + (size_t)r * width, width);
    if (!(x <= worst)) worst = x;
  }
  return worst;
}

/* The trunk's final-normed hidden state, then the head fed with it. */
static void test_nextn_head_matches_the_reference(void) {
  struct tsr_setup *s = open_model(g_model);
  if (!s) return;
  CHECK(s->arch->build_nextn != NULL);
  const int32_t n = (int32_t)g_ids->ne[0], V = (int32_t)g_logits->ne[0];
  const int64_t E = g_hidden->ne[0];
  CHECK(g_seq->ne[0] == n + 1 && !memcmp((const int32_t *)g_seq->data + 1, g_ids->data, (size_t)n * 4));
  int32_t *pos = malloc(sizeof(int32_t) * (n + 1));
  float *tl = malloc(sizeof(float) * (size_t)(n + 1) * V);
  float *th = malloc(sizeof(float) * (size_t)(n + 1) * E), *hl = malloc(sizeof(float) * n * V);
  for (int32_t i = 0; i <= n; i++) pos[i] = i;
  CHECK_OK(run(s, false, n + 1, g_seq->data, pos, NULL, tl, th));
  const double rh = worst_rel(th, g_hidden->data, n, E);
  printf("  trunk hidden_final vs reference: max rel %.3e over %d positions\n", rh, n);
  CHECK_MSG(rh <= 1e-4, "max rel %g", rh);
  /* the head takes tessera's own trunk state, as a speculator would */
  CHECK_OK(run(s, true, n, g_ids->data, g_pos->data, th, hl, NULL));
  const double rl = worst_rel(hl, g_logits->data, n, V);
  int agree = 0;
  for (int32_t i = 0; i < n; i++)
    agree += tsr_test_argmax(hl + (size_t)i * V, V) ==
             tsr_test_argmax((const float *)g_logits->data + (size_t)i * V, V);
  printf("  NextN logits vs reference: max rel %.3e, argmax %d/%d\n", rl, agree, n);
  CHECK_MSG(rl <= 1e-4, "max rel %g", rl);
  CHECK(agree == n);
  free(pos), free(tl), free(th), free(hl);
  tsr_setup_free(s);
}

/* A trunk-only model (qwen3) has no head: refused by name, nothing built. */
static void test_model_without_a_head_is_refused(void) {
  struct tsr_setup *s = open_model(g_trunk_only);
  if (!s) return;
  float dummy[1];
  int32_t tok = 0, p = 0;
  tsr_status st = s->arch->build_nextn ? run(s, true, 1, &tok, &p, dummy, dummy, NULL)
                                       : TSR_ERR_UNSUPPORTED;
  CHECK(st == TSR_ERR_UNSUPPORTED);
  CHECK_MSG(strstr(tsr_error_message(), "NextN") != NULL, "got: %s", tsr_error_message());
  tsr_setup_free(s);
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s MODEL.gguf GOLDEN.gguf MTP_GOLDEN.gguf TRUNK_ONLY.gguf\n", argv[0]);
    return 2;
  }
  g_model = argv[1], g_trunk_only = argv[4];
  struct tsr_gguf *gold = NULL, *mtp = NULL;
  if (tsr_gguf_open(argv[2], &gold) != TSR_OK || tsr_gguf_open(argv[3], &mtp) != TSR_OK) {
    fprintf(stderr, "%s\n", tsr_error_message());
    return 2;
  }
  g_seq = tsr_gguf_find_tensor(gold, "seq.0.ids");
  g_ids = tsr_gguf_find_tensor(mtp, "mtp.ids");
  g_pos = tsr_gguf_find_tensor(mtp, "mtp.positions");
  g_hidden = tsr_gguf_find_tensor(mtp, "mtp.hidden_in");
  g_logits = tsr_gguf_find_tensor(mtp, "mtp.logits");
  if (!g_seq || !g_ids || !g_pos || !g_hidden || !g_logits) {
    fprintf(stderr, "%s / %s: the golden tensors are missing\n", argv[2], argv[3]);
    return 2;
  }
  TSR_RUN(test_nextn_head_matches_the_reference);
  TSR_RUN(test_model_without_a_head_is_refused);
  tsr_gguf_close(mtp);
  tsr_gguf_close(gold);
  return TSR_TEST_EXIT();
}
