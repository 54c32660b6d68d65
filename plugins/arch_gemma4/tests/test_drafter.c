/*
** The gemma4 assistant drafter against transformers' assisted generation
** (tests/reference/fixtures/gemma4_assistant/golden.gguf): each draft step
** takes a token, the target's hidden state (step 0) or the previous step's
** projected state, and the target's last sliding and full K/V, and must give
** the reference's logits (ordered-embedding head included), argmax and
** projected state. The target's own forward pass is checked elsewhere; here
** its K/V and hidden state come from the golden file.
** usage: test_drafter DRAFTER.gguf TARGET.gguf GOLDEN.gguf (converted at f32)
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/backend.h"
#include "common/error.h"
#include "model/gguf.h"
#include "graph/graph.h"
#include "abi/setup.h"
#include "tests/arch_pass_util.h"
#include "tests/harness.h"
#include "tests/logits_test_util.h"

static struct tsr_gguf *g_gold, *g_target;
static const char *g_drafter;

static const struct tsr_gguf_tensor *golden(const char *name) {
  const struct tsr_gguf_tensor *t = tsr_gguf_find_tensor(g_gold, name);
  CHECK_MSG(t != NULL, "golden tensor %s missing", name);
  return t;
}

/* A golden f32 tensor as a graph input of the same shape. */
static struct tsr_tensor *input_like(struct tsr_graph *g, const struct tsr_gguf_tensor *t) {
  return tsr_new_tensor(g, t->dtype, (int)t->n_dims, t->ne);
}

/* One draft step; writes its logits (n_vocab) and projected state (H_t). */
static tsr_status step(struct tsr_setup *s, int32_t token, int32_t pos, const float *h_in,
                       float *logits, float *projected, int64_t *n_vocab) {
  struct tsr_graph *g = tsr_graph_new(8192);
  const struct tsr_gguf_tensor *sk = golden("draft.kv.sliding.k"), *sv = golden("draft.kv.sliding.v");
  const struct tsr_gguf_tensor *fk = golden("draft.kv.full.k"), *fv = golden("draft.kv.full.v");
  const struct tsr_gguf_tensor *th = golden("draft.target_hidden");
  if (!sk || !sv || !fk || !fv || !th) return TSR_ERR_FORMAT;
  const int64_t n_kv = sk->ne[1], H_t = th->ne[0];
  struct tsr_arch_forward fw = {
      .struct_size = sizeof fw, .g = g, .model = s->model, .n_tokens = 1,
      .tokens = tsr_new_tensor_1d(g, TSR_I32, 1), .positions = tsr_new_tensor_1d(g, TSR_I32, 1),
      .attention = tsr_plugin_host_attention(s->host, "flash", NULL), .layers = s->layers,
      .n_layers = s->n_layers, .target = g_target};
  tsr_setup_attention_kinds(s, fw.attention_kind);
  fw.nextn_hidden = tsr_new_tensor(g, TSR_F32, 2, (int64_t[]){H_t, 1});
  fw.target_k[0] = input_like(g, fk), fw.target_v[0] = input_like(g, fv);
  fw.target_k[1] = input_like(g, sk), fw.target_v[1] = input_like(g, sv);
  fw.target_kv_pos[0] = tsr_new_tensor_1d(g, TSR_I32, fk->ne[1]);
  fw.target_kv_pos[1] = tsr_new_tensor_1d(g, TSR_I32, n_kv);
  tsr_status st = s->arch->build(s->arch->ctx, tsr_plugin_host_services(), &fw);
  if (st == TSR_OK) st = tsr_graph_status(g);
  void *arena = NULL;
  struct tsr_backend *be = NULL;
  if (st == TSR_OK && !fw.hidden_final)
    st = tsr_error_set(TSR_ERR_INTERNAL, "the drafter set no hidden_final");
  if (st == TSR_OK) st = tsr_test_alloc_outputs(g, &fw, &arena);
  if (st == TSR_OK) {
    *(int32_t *)fw.tokens->data = token;
    *(int32_t *)fw.positions->data = pos;
    memcpy(fw.nextn_hidden->data, h_in, (size_t)H_t * sizeof(float));
    memcpy(fw.target_k[0]->data, fk->data, fk->nbytes);
    memcpy(fw.target_v[0]->data, fv->data, fv->nbytes);
    memcpy(fw.target_k[1]->data, sk->data, sk->nbytes);
    memcpy(fw.target_v[1]->data, sv->data, sv->nbytes);
    for (int64_t i = 0; i < fk->ne[1]; i++) ((int32_t *)fw.target_kv_pos[0]->data)[i] = (int32_t)i;
    for (int64_t i = 0; i < n_kv; i++) ((int32_t *)fw.target_kv_pos[1]->data)[i] = (int32_t)i;
    st = tsr_backend_cpu_new(2, &be);
  }
  if (st == TSR_OK) st = tsr_backend_compute(be, g);
  if (st == TSR_OK) {
    *n_vocab = fw.logits->ne[0];
    memcpy(logits, fw.logits->data, (size_t)*n_vocab * sizeof(float));
    memcpy(projected, fw.hidden_final->data, (size_t)H_t * sizeof(float));
  }
  tsr_backend_free(be);
  free(arena);
  tsr_graph_free(g);
  return st;
}

static void test_draft_steps_match_assisted_generation(void) {
  char text[1200];
  snprintf(text, sizeof text, "model: %s\nplugins:\n  - arch_gemma4\n", g_drafter);
  struct tsr_setup *s = NULL;
  tsr_status st = tsr_setup_from_profile_text("(drafter test)", text, NULL, 0, &s);
  CHECK_MSG(st == TSR_OK, "setup: %s", tsr_error_message());
  const struct tsr_gguf_tensor *inputs = golden("draft.input_ids"), *tokens = golden("draft.tokens");
  const struct tsr_gguf_tensor *th = golden("draft.target_hidden");
  uint32_t pos = 0, steps = 0;
  CHECK_OK(tsr_gguf_get_u32(g_gold, "golden.draft.position", &pos));
  CHECK_OK(tsr_gguf_get_u32(g_gold, "golden.draft.n_steps", &steps));
  if (st != TSR_OK || !inputs || !tokens || !th || !steps) {
    tsr_setup_free(s);
    return;
  }
  const int64_t H_t = th->ne[0];
  float *h = malloc(sizeof(float) * H_t), *proj = malloc(sizeof(float) * H_t);
  float *logits = malloc(sizeof(float) * 1 << 20);
  /* step 0 takes the target's hidden state at the last prefix position */
  memcpy(h, (const float *)th->data + (size_t)(th->ne[1] - 1) * H_t, sizeof(float) * H_t);
  for (uint32_t j = 0; j < steps; j++) {
    int64_t V = 0;
    const int32_t tok = ((const int32_t *)inputs->data)[j];
    CHECK_OK(step(s, tok, (int32_t)pos, h, logits, proj, &V));
    char name[64];
    snprintf(name, sizeof name, "draft.%u.logits", j);
    const struct tsr_gguf_tensor *want = golden(name);
    snprintf(name, sizeof name, "draft.%u.projected", j);
    const struct tsr_gguf_tensor *want_h = golden(name);
    if (!want || !want_h || want->ne[0] != V) break;
    const double rl = tsr_test_row_rel(logits, want->data, V);
    const double rh = tsr_test_row_rel(proj, want_h->data, H_t);
    const int32_t arg = tsr_test_argmax(logits, V), want_arg = ((const int32_t *)tokens->data)[j];
    printf("  step %u: token %d -> %d (reference %d), logits max rel %.2e, projected %.2e\n", j,
           tok, arg, want_arg, rl, rh);
    CHECK_MSG(rl <= 1e-4 && rh <= 1e-4, "step %u: logits %g, projected %g", j, rl, rh);
    CHECK(arg == want_arg);
    memcpy(h, proj, sizeof(float) * H_t); /* the chain goes on from our own state */
  }
  free(h), free(proj), free(logits);
  tsr_setup_free(s);
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s DRAFTER.gguf TARGET.gguf GOLDEN.gguf\n", argv[0]);
    return 2;
  }
  g_drafter = argv[1];
  if (tsr_gguf_open(argv[2], &g_target) != TSR_OK || tsr_gguf_open(argv[3], &g_gold) != TSR_OK) {
    fprintf(stderr, "%s\n", tsr_error_message());
    return 2;
  }
  TSR_RUN(test_draft_steps_match_assisted_generation);
  tsr_gguf_close(g_gold);
  tsr_gguf_close(g_target);
  return TSR_TEST_EXIT();
}
