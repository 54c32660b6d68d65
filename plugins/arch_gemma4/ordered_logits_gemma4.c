/*
** The gemma4 assistant's ordered-embedding head (plugin op
** "arch_gemma4.ordered_logits", CPU kernel), as transformers'
** Gemma4AssistantMaskedEmbedder computes it: the vocabulary is laid out in
** C clusters of V/C tokens (masked_embd_ordering, cluster after cluster);
** the top_k clusters by centroid logit keep their tokens' logits, and every
** other token gets the smallest kept logit minus 1.
**
** Sources: logits f32 [V, N] (the full head, E . x), centroid logits f32
** [C, N], ordering i32 [V]. Params: top_k. Output f32 [V, N]. The kept
** logits are the full head's: the same dot products transformers gathers.
*/
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gemma4.h"

#define GGUF_TYPE_F32 0
#define GGUF_TYPE_I32 26
#define MAX_CENTROIDS 65536

/* The k largest of x[0..n) into idx, largest first, ties to the lower index. */
static void top_k(const float *x, int64_t n, int64_t k, int32_t *idx) {
  for (int64_t j = 0; j < k; j++) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++) {
      bool taken = false;
      for (int64_t q = 0; q < j && !taken; q++) taken = idx[q] == i;
      if (!taken && (best < 0 || x[i] > x[best])) best = i;
    }
    idx[j] = (int32_t)best;
  }
}

static void ordered_kernel(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                           const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  (void)ctx, (void)n_src;
  const struct tsr_tensor_info *full = &src[0], *cent = &src[1], *ord = &src[2];
  const int64_t V = full->ne[0], N = full->ne[1], C = cent->ne[0], per = V / C;
  const int64_t k = params[0];
  const int32_t *ordering = ord->data;
  int32_t idx[64];
  for (int64_t t = ith; t < N; t += nth) {
    const float *f = (const float *)((const char *)full->data + t * full->nb[1]);
    const float *c = (const float *)((const char *)cent->data + t * cent->nb[1]);
    float *y = (float *)((char *)dst->data + t * dst->nb[1]);
    top_k(c, C, k, idx);
    float lo = FLT_MAX;
    for (int64_t j = 0; j < k; j++)
      for (int64_t i = 0; i < per; i++) {
        const float v = f[ordering[idx[j] * per + i]];
        if (v < lo) lo = v;
      }
    for (int64_t i = 0; i < V; i++) y[i] = lo - 1.0f;
    for (int64_t j = 0; j < k; j++)
      for (int64_t i = 0; i < per; i++) {
        const int32_t tok = ordering[idx[j] * per + i];
        y[tok] = f[tok];
      }
  }
}

tsr_status gemma4_ordered_register(const struct tsr_host *host, struct tsr_plugin *self,
                                   int32_t *op_id) {
  if (*op_id >= 0) return TSR_OK; /* a second host in one process keeps the first id */
  int32_t id;
  tsr_status st = host->kernel->register_op(self, "ordered_logits", &id);
  if (st == TSR_OK) st = host->kernel->register_kernel(self, id, "cpu", ordered_kernel, NULL);
  if (st == TSR_OK) st = gemma4_register_cuda(host, self, id, "gemma4_ordered_logits_cuda");
  if (st == TSR_OK) *op_id = id;
  return st;
}

struct tsr_tensor *gemma4_ordered_logits(const struct tsr_host *host, struct tsr_graph *g,
                                         int32_t op_id, struct tsr_tensor *full,
                                         struct tsr_tensor *centroid_logits,
                                         struct tsr_tensor *ordering, int32_t top_k_clusters) {
  if (!full || !centroid_logits || !ordering) return NULL;
  struct tsr_tensor_info fi, ci, oi;
  host->graph->tensor_info(full, &fi);
  host->graph->tensor_info(centroid_logits, &ci);
  host->graph->tensor_info(ordering, &oi);
  if (fi.dtype != GGUF_TYPE_F32 || ci.dtype != GGUF_TYPE_F32 || oi.dtype != GGUF_TYPE_I32 ||
      oi.ne[0] != fi.ne[0] || ci.ne[1] != fi.ne[1] || ci.ne[0] <= 0 ||
      ci.ne[0] > MAX_CENTROIDS || fi.ne[0] % ci.ne[0] || top_k_clusters <= 0 ||
      top_k_clusters > ci.ne[0] || top_k_clusters > 64 || oi.nb[0] != sizeof(int32_t)) {
    host->graph->fail(g, TSR_ERR_FORMAT, "arch_gemma4 ordered logits: %lld logits, %lld "
                      "centroids, an ordering of %lld and top-k %d do not make whole clusters",
                      (long long)fi.ne[0], (long long)ci.ne[0], (long long)oi.ne[0],
                      top_k_clusters);
    return NULL;
  }
  if (op_id < 0) {
    host->graph->fail(g, TSR_ERR_INTERNAL, "arch_gemma4: the ordered_logits op is not registered");
    return NULL;
  }
  struct tsr_tensor *src[3] = {full, centroid_logits, ordering};
  return host->graph->custom_op(g, op_id, 2, fi.ne, src, 3, &top_k_clusters, 1);
}
