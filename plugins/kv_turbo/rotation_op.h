/*
** The rotation as a plugin op, for the codecs that store rotated rows (kv_turbo, kv_tcq):
** the rows its cpu kernel rotates, the graph node, and the codec's storage dim.
*/
#ifndef KV_TURBO_ROTATION_OP_H
#define KV_TURBO_ROTATION_OP_H

#include <string.h>
#include <tessera/plugin.h>

#include "rotation.h"

/* The cpu kernel's share of the rows (ith of nth; contiguous rows in and out): how many
** it rotated. */
static inline uint64_t turbo_rotate_rows_cpu(int ith, int nth, const struct tsr_tensor_info *dst,
                                             const struct tsr_tensor_info *src, bool inverse) {
  const int64_t rows = dst->ne[1] * dst->ne[2] * dst->ne[3];
  uint64_t done = 0;
  for (int64_t r = ith; r < rows; r += nth, done++)
    turbo_rotate_row((const float *)src[0].data + r * src[0].ne[0], src[0].ne[0],
                     (float *)dst->data + r * dst->ne[0], dst->ne[0], inverse);
  return done;
}

/* x [dim, ...] rotated (or back) to [out_dim, ...] by op, whose kernels find the plugin's
** state in the params */
static inline struct tsr_tensor *turbo_rotate_node(const struct tsr_host *h, struct tsr_graph *g,
                                                   int32_t op, const void *state,
                                                   struct tsr_tensor *x, int64_t out_dim,
                                                   bool inverse) {
  struct tsr_tensor_info xi;
  h->graph->tensor_info(x, &xi);
  const int64_t ne[4] = {out_dim, xi.ne[1], xi.ne[2], xi.ne[3]};
  int32_t params[TURBO_P_COUNT] = {inverse, (int32_t)out_dim};
  memcpy(&params[TURBO_P_STATE], &state, sizeof state);
  return h->graph->custom_op(g, op, xi.n_dims > 3 ? xi.n_dims : 3, ne, &x, 1, params,
                             TURBO_P_COUNT);
}

/* tsr_kv_codec_v1.storage_dim: whole blocks of 64; 0 for a head dim no row can have */
static inline int32_t turbo_codec_storage_dim(void *ctx, int32_t head_dim) {
  (void)ctx;
  return head_dim > 0 && head_dim <= 4096 ? (int32_t)turbo_storage_dim(head_dim) : 0;
}

#endif
