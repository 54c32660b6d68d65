/* Adapters behind the graph-building entries of the services table. */
#ifndef TSR_PLUGIN_GRAPH_API_H
#define TSR_PLUGIN_GRAPH_API_H

#include "tessera/plugin.h"

struct tsr_tensor *tsr_api_weight(struct tsr_graph *g, const struct tsr_gguf *model,
                                  const char *name);
int tsr_api_has_weight(const struct tsr_gguf *model, const char *name);
struct tsr_tensor *tsr_api_new_tensor(struct tsr_graph *g, int32_t dtype, int32_t n_dims,
                                      const int64_t *ne);
void tsr_api_set_name(struct tsr_tensor *t, const char *name);
struct tsr_tensor *tsr_api_rope(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *pos,
                                struct tsr_tensor *ff, int32_t n_rot, int32_t neox, float freq_base,
                                float freq_scale);
struct tsr_tensor *tsr_api_unary(struct tsr_graph *g, struct tsr_tensor *a, int32_t op);
struct tsr_tensor *tsr_api_glu(struct tsr_graph *g, struct tsr_tensor *gate, struct tsr_tensor *up,
                               int32_t op, bool swapped);
struct tsr_tensor *tsr_api_concat(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *b,
                                  int32_t dim);
struct tsr_tensor *tsr_api_reshape(struct tsr_graph *g, struct tsr_tensor *a, int32_t n_dims,
                                   const int64_t *ne);
struct tsr_tensor *tsr_api_view(struct tsr_graph *g, struct tsr_tensor *a, int32_t n_dims,
                                const int64_t *ne, const size_t *nb, size_t offset);
struct tsr_tensor *tsr_api_permute(struct tsr_graph *g, struct tsr_tensor *a, int32_t ax0,
                                   int32_t ax1, int32_t ax2, int32_t ax3);
struct tsr_tensor *tsr_api_top_k(struct tsr_graph *g, struct tsr_tensor *a, int32_t k);

tsr_status tsr_api_kv_attend(struct tsr_arch_forward *fw, int32_t layer, struct tsr_tensor *k,
                             struct tsr_tensor *v, struct tsr_attn_call *call);
struct tsr_tensor *tsr_api_kv_state(struct tsr_arch_forward *fw, int32_t layer, int64_t n_floats);
struct tsr_tensor *tsr_api_kv_checkpoints(struct tsr_arch_forward *fw, int32_t layer,
                                          int64_t n_floats);
tsr_status tsr_api_kv_shift_k(struct tsr_kv_shift *sh, int32_t layer, struct tsr_tensor **k,
                              struct tsr_tensor **delta_pos);
tsr_status tsr_api_kv_shift_store(struct tsr_kv_shift *sh, int32_t layer, struct tsr_tensor *k);

/* attention that positions keys itself (plugin.h, struct tsr_attn_rope) */
struct tsr_tensor *tsr_api_rope_apply(struct tsr_graph *g, const struct tsr_attn_rope *rope,
                                      struct tsr_tensor *x, struct tsr_tensor *pos);
struct tsr_tensor *tsr_api_attn_rope(struct tsr_arch_forward *fw, int32_t layer,
                                     const struct tsr_attn_rope *rope, struct tsr_tensor *x,
                                     bool is_k);
struct tsr_tensor *tsr_api_attn_build(struct tsr_arch_forward *fw, int32_t layer,
                                      const struct tsr_attn_call *call);
struct tsr_tensor *tsr_api_kv_shift_rope(struct tsr_kv_shift *sh, int32_t layer,
                                         const struct tsr_attn_rope *rope, struct tsr_tensor *k,
                                         struct tsr_tensor *delta_pos);
struct tsr_tensor *tsr_api_custom_op_typed(struct tsr_graph *g, int32_t op_id, int32_t dtype,
                                           int32_t n_dims, const int64_t *ne,
                                           struct tsr_tensor *const *src, int32_t n_src,
                                           const int32_t *params, int32_t n_params);

#endif
