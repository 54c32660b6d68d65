/* One whole-sequence pass of an arch's trunk or NextN head on the CPU, without a KV cache:
** the reference the cached paths are compared with. */
#ifndef TSR_ARCH_PASS_UTIL_H
#define TSR_ARCH_PASS_UTIL_H

#include <stdlib.h>
#include <string.h>

#include "abi/setup.h"
#include "graph/backend.h"
#include "graph/graph.h"

/* Marks a built pass's logits (and hidden_final, when set) as outputs and allocates g in a
** fresh arena (*arena, freed by the caller). */
static inline tsr_status tsr_test_alloc_outputs(struct tsr_graph *g,
                                                const struct tsr_arch_forward *fw, void **arena) {
  struct tsr_graph_plan plan;
  tsr_graph_mark_output(fw->logits);
  if (fw->hidden_final) tsr_graph_mark_output(fw->hidden_final);
  return tsr_graph_alloc(g, &plan, arena);
}

/* Builds (nextn: the head over entries whose hidden rows are hidden_in, n_embd wide;
** else the trunk) over n tokens attending to each other only, runs it on 2 CPU threads,
** and copies every row's logits and, where not NULL, final hidden row out. */
static inline tsr_status tsr_test_arch_pass(const struct tsr_setup *s, bool nextn, int32_t n,
                                            const int32_t *tokens, const int32_t *pos,
                                            const float *hidden_in, int64_t n_embd,
                                            float *logits, float *hidden) {
  struct tsr_graph *g = tsr_graph_new(8192);
  if (!g) return TSR_ERR_NOMEM;
  struct tsr_arch_forward fw = {
      .struct_size = sizeof fw, .g = g, .model = s->model, .n_tokens = n,
      .tokens = tsr_new_tensor_1d(g, TSR_I32, n), .positions = tsr_new_tensor_1d(g, TSR_I32, n),
      .attention = tsr_plugin_host_attention(s->host, "flash", NULL), .layers = s->layers,
      .n_layers = s->n_layers};
  tsr_setup_attention_kinds(s, fw.attention_kind);
  if (nextn) fw.nextn_hidden = tsr_new_tensor(g, TSR_F32, 2, (int64_t[]){n_embd, n});
  tsr_status st = nextn ? s->arch->build_nextn(s->arch->ctx, tsr_plugin_host_services(), &fw)
                        : s->arch->build(s->arch->ctx, tsr_plugin_host_services(), &fw);
  if (st == TSR_OK) st = tsr_graph_status(g);
  void *arena = NULL;
  struct tsr_backend *be = NULL;
  if (st == TSR_OK) st = tsr_test_alloc_outputs(g, &fw, &arena);
  if (st == TSR_OK) {
    memcpy(fw.tokens->data, tokens, (size_t)n * sizeof *tokens);
    memcpy(fw.positions->data, pos, (size_t)n * sizeof *pos);
    if (nextn) memcpy(fw.nextn_hidden->data, hidden_in, (size_t)(n * n_embd) * sizeof(float));
    st = tsr_backend_cpu_new(2, &be);
  }
  if (st == TSR_OK) st = tsr_backend_compute(be, g);
  if (st == TSR_OK) {
    memcpy(logits, fw.logits->data, (size_t)(n * fw.logits->ne[0]) * sizeof(float));
    if (hidden && fw.hidden_final)
      memcpy(hidden, fw.hidden_final->data, (size_t)(n * n_embd) * sizeof(float));
  }
  tsr_backend_free(be);
  free(arena);
  tsr_graph_free(g);
  return st;
}

#endif
