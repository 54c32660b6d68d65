/*
** tessera plugin ABI: building graphs (host->graph). The core's builders, with
** which an arch's forward pass, an attention implementation or a codec's hooks
** append ops: shapes as core/graph/graph.h documents them, dims innermost first. A
** failure returns NULL and records the graph's error.
*/
#ifndef TESSERA_PLUGIN_GRAPH_H
#define TESSERA_PLUGIN_GRAPH_H

#include "tessera/plugin/abi.h"
#include "tessera/plugin/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

struct tsr_attn_call;
struct tsr_attn_rope;
struct tsr_decode_params;

struct tsr_host_graph {
  uint32_t struct_size;
  /* tensors and the graph */
  void (*tensor_info)(const struct tsr_tensor *t, struct tsr_tensor_info *out);
  /* a model weight by GGUF tensor name; NULL with an error naming it when absent */
  struct tsr_tensor *(*weight)(struct tsr_graph *g, const struct tsr_gguf *model, const char *name);
  struct tsr_tensor *(*new_tensor)(struct tsr_graph *g, int32_t dtype, int32_t n_dims,
                                   const int64_t *ne);
  void (*set_name)(struct tsr_tensor *t, const char *name);
  void (*mark_output)(struct tsr_tensor *t);
  /* records st and the message as g's first error: a plugin builder's refusal
  ** reaches the user instead of a later "source is NULL" */
  void (*fail)(struct tsr_graph *g, tsr_status st, const char *fmt, ...)
#if defined(__GNUC__)
      __attribute__((format(printf, 3, 4)))
#endif
      ;
  /* A number no other graph of this process has (a freed graph's address is reused, its
  ** serial never): a builder that makes the same tensor for every layer (positions, say)
  ** keys a memo of it by this and builds it once a graph. */
  uint64_t (*serial)(const struct tsr_graph *g);
  /* a node of a plugin op (host->kernel->register_op): f32 output of n_dims dims
  ** ne, up to 8 sources, up to 12 int32 params handed to the kernel */
  struct tsr_tensor *(*custom_op)(struct tsr_graph *g, int32_t op_id, int32_t n_dims,
                                  const int64_t *ne, struct tsr_tensor *const *src, int32_t n_src,
                                  const int32_t *params, int32_t n_params);
  /* custom_op whose output is dtype (f32 or i32: positions, indices) */
  struct tsr_tensor *(*custom_op_typed)(struct tsr_graph *g, int32_t op_id, int32_t dtype,
                                        int32_t n_dims, const int64_t *ne,
                                        struct tsr_tensor *const *src, int32_t n_src,
                                        const int32_t *params, int32_t n_params);
  /* arithmetic and layout */
  struct tsr_tensor *(*cast)(struct tsr_graph *g, struct tsr_tensor *a, int32_t dtype);
  struct tsr_tensor *(*scale)(struct tsr_graph *g, struct tsr_tensor *a, float s);
  struct tsr_tensor *(*mat_mul)(struct tsr_graph *g, struct tsr_tensor *w, struct tsr_tensor *x);
  struct tsr_tensor *(*mat_mul_id)(struct tsr_graph *g, struct tsr_tensor *w, struct tsr_tensor *x,
                                   struct tsr_tensor *ids);
  struct tsr_tensor *(*add)(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *b);
  struct tsr_tensor *(*mul)(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *b);
  struct tsr_tensor *(*get_rows)(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *idx);
  struct tsr_tensor *(*rms_norm)(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *w,
                                 float eps);
  struct tsr_tensor *(*l2_norm)(struct tsr_graph *g, struct tsr_tensor *a, float eps);
  struct tsr_tensor *(*softmax)(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *mask,
                                float scale);
  /* op: 0 gelu (tanh), 1 silu, 2 sigmoid, 3 softplus, 4 tanh, 5 relu, 6 neg, 7 exp */
  struct tsr_tensor *(*unary)(struct tsr_graph *g, struct tsr_tensor *a, int32_t op);
  /* op: 0 swiglu, 1 geglu, 2 reglu; up NULL: a holds [gate | up] */
  struct tsr_tensor *(*glu)(struct tsr_graph *g, struct tsr_tensor *gate, struct tsr_tensor *up,
                            int32_t op, bool swapped);
  struct tsr_tensor *(*softcap)(struct tsr_graph *g, struct tsr_tensor *a, float cap);
  struct tsr_tensor *(*concat)(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *b,
                               int32_t dim);
  struct tsr_tensor *(*cont)(struct tsr_graph *g, struct tsr_tensor *a);
  struct tsr_tensor *(*reshape)(struct tsr_graph *g, struct tsr_tensor *a, int32_t n_dims,
                                const int64_t *ne);
  struct tsr_tensor *(*view)(struct tsr_graph *g, struct tsr_tensor *a, int32_t n_dims,
                             const int64_t *ne, const size_t *nb, size_t offset);
  struct tsr_tensor *(*permute)(struct tsr_graph *g, struct tsr_tensor *a, int32_t ax0, int32_t ax1,
                                int32_t ax2, int32_t ax3);
  struct tsr_tensor *(*top_k)(struct tsr_graph *g, struct tsr_tensor *a, int32_t k);
  struct tsr_tensor *(*argmax)(struct tsr_graph *g, struct tsr_tensor *a);
  /* positions: the core's rope on a (f32 [D, H, N]) at pos (i32 [N]) */
  struct tsr_tensor *(*rope)(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *pos,
                             struct tsr_tensor *freq_factors, int32_t n_rot, int32_t neox,
                             float freq_base, float freq_scale);
  /* x (f32 [D, H, N]) rotated at pos (i32 [N]) as rope says (attention.h) */
  struct tsr_tensor *(*rope_apply)(struct tsr_graph *g, const struct tsr_attn_rope *rope,
                                   struct tsr_tensor *x, struct tsr_tensor *pos);
  /* the core's flash attention over call's q, k, v (attention.h) */
  struct tsr_tensor *(*flash_attn)(struct tsr_graph *g, const struct tsr_attn_call *call);
  /* ABI 2.2 */
  /* p's counters (struct tsr_decode_params) as a tensor an attention op takes as a
  ** source and its kernels add to (i32 [8]; on a device backend it lives on the device,
  ** where kernels reach it through the source's address); NULL with an error when p has
  ** none */
  struct tsr_tensor *(*decode_counters)(struct tsr_graph *g, const struct tsr_decode_params *p);
};

/* t [a, k, n] summed over its dim 1 into [a, n] (a mixture's k expert outputs of each
** token): halves of the slots added until one is left, ceil(log2 k) adds of strided views
** (and one more for each odd count on the way), where adding one slot at a time took k
** nodes. NULL with the graph's error when a builder fails. */
static inline struct tsr_tensor *tsr_graph_sum_slots(const struct tsr_host_graph *gr,
                                                     struct tsr_graph *g, struct tsr_tensor *t) {
  struct tsr_tensor_info info;
  gr->tensor_info(t, &info);
  const int64_t a = info.ne[0], n = info.ne[2], out_ne[2] = {a, n};
  struct tsr_tensor *cur = t, *carried = NULL;
  for (int64_t k = info.ne[1]; k > 1 && cur;) {
    gr->tensor_info(cur, &info);
    const int64_t h = k / 2, half_ne[3] = {a, h, n}, one_ne[3] = {a, 1, n};
    const size_t nb[3] = {info.nb[0], info.nb[1], info.nb[2]};
    struct tsr_tensor *lo = gr->view(g, cur, 3, half_ne, nb, 0);
    struct tsr_tensor *hi = gr->view(g, cur, 3, half_ne, nb, (size_t)h * nb[1]);
    if (k % 2) { /* the last slot waits for the end */
      struct tsr_tensor *last = gr->view(g, cur, 3, one_ne, nb, (size_t)(k - 1) * nb[1]);
      carried = carried ? gr->add(g, carried, last) : gr->cont(g, last);
    }
    cur = lo && hi ? gr->add(g, lo, hi) : NULL;
    k = h;
  }
  if (cur && carried) cur = gr->add(g, cur, carried);
  if (cur == t) cur = gr->cont(g, t);
  return cur ? gr->reshape(g, cur, 2, out_ne) : NULL;
}

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_PLUGIN_GRAPH_H */
