/*
** Compute graph: builders append ops in execution order; the planner gives
** every intermediate an offset in one arena by liveness, so the peak is
** known before anything runs; a backend executes the planned graph.
**
** Shape conventions (ggml-compatible, ne[0] innermost):
**   mat_mul(w[K,M,...], x[K,N,...]) -> [M,N,...]  (w broadcast over dims 2,3)
**   attention q[D,Nq,Hq], k[D,Nkv,Hkv], v[Dv,Nkv,Hkv] -> [Dv,Hq,Nq]
** Builders validate shapes and dtypes; on a mismatch they record the first
** error in the graph (tsr_graph_status) and return NULL, so a model builder
** can chain calls and check once.
*/
#ifndef TSR_GRAPH_H
#define TSR_GRAPH_H

#include "graph/tensor.h"

struct tsr_graph;

struct tsr_graph *tsr_graph_new(int max_tensors);
void tsr_graph_free(struct tsr_graph *g);
/* First builder error (TSR_OK if none); the message is in tsr_error_message. */
tsr_status tsr_graph_status(const struct tsr_graph *g);
int tsr_graph_n_tensors(const struct tsr_graph *g);
/* Unique per graph made in this process (a freed graph's address is reused;
** its serial is not), for callers that remember which graph they wrote to. */
uint64_t tsr_graph_serial(const struct tsr_graph *g);
struct tsr_tensor *tsr_graph_tensor(struct tsr_graph *g, int i);
struct tsr_tensor *tsr_graph_find(struct tsr_graph *g, const char *name);

/* ---- leaves ------------------------------------------------------------- */
/* A leaf whose memory the planner assigns; it lives for the whole graph and
** the caller fills it after tsr_graph_bind_arena (it is flagged INPUT). */
struct tsr_tensor *tsr_new_tensor(struct tsr_graph *g, enum tsr_dtype dt,
                                  int n_dims, const int64_t *ne);
struct tsr_tensor *tsr_new_tensor_1d(struct tsr_graph *g, enum tsr_dtype dt, int64_t ne0);
struct tsr_tensor *tsr_new_tensor_2d(struct tsr_graph *g, enum tsr_dtype dt,
                                     int64_t ne0, int64_t ne1);
struct tsr_tensor *tsr_new_tensor_3d(struct tsr_graph *g, enum tsr_dtype dt,
                                     int64_t ne0, int64_t ne1, int64_t ne2);
struct tsr_tensor *tsr_new_tensor_4d(struct tsr_graph *g, enum tsr_dtype dt, int64_t ne0,
                                     int64_t ne1, int64_t ne2, int64_t ne3);
/* A leaf over memory the caller owns (weights, KV cache). */
struct tsr_tensor *tsr_new_external(struct tsr_graph *g, enum tsr_dtype dt, int n_dims,
                                    const int64_t *ne, void *data);
void tsr_tensor_set_name(struct tsr_tensor *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- views (no copy) ---------------------------------------------------- */
struct tsr_tensor *tsr_view(struct tsr_graph *g, struct tsr_tensor *a, int n_dims,
                            const int64_t *ne, const size_t *nb, size_t offset);
struct tsr_tensor *tsr_reshape(struct tsr_graph *g, struct tsr_tensor *a, int n_dims,
                               const int64_t *ne); /* a must be contiguous */
/* axes[i] = where source dim i goes. */
struct tsr_tensor *tsr_permute(struct tsr_graph *g, struct tsr_tensor *a, int ax0,
                               int ax1, int ax2, int ax3);
struct tsr_tensor *tsr_transpose(struct tsr_graph *g, struct tsr_tensor *a); /* dims 0,1 */

/* ---- ops ---------------------------------------------------------------- */
/* rows idx[i] of a: a[K,R,B], idx i32[N,B] -> f32 [K,N,B] */
struct tsr_tensor *tsr_get_rows(struct tsr_graph *g, struct tsr_tensor *a,
                                struct tsr_tensor *idx);
struct tsr_tensor *tsr_mat_mul(struct tsr_graph *g, struct tsr_tensor *w,
                               struct tsr_tensor *x);
/* experts w[K,M,E]; x[K,U or 1,T]; ids i32[U,T] -> [M,U,T] */
struct tsr_tensor *tsr_mat_mul_id(struct tsr_graph *g, struct tsr_tensor *w,
                                  struct tsr_tensor *x, struct tsr_tensor *ids);
/* b is broadcast over a (each of b's dims divides a's) */
struct tsr_tensor *tsr_add(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *b);
struct tsr_tensor *tsr_mul(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *b);
struct tsr_tensor *tsr_scale(struct tsr_graph *g, struct tsr_tensor *a, float s);
/* x / rms(x) over dim 0, times weight w[ne0] when w is not NULL */
struct tsr_tensor *tsr_rms_norm(struct tsr_graph *g, struct tsr_tensor *a,
                                struct tsr_tensor *w, float eps);
/* x / sqrt(sum(x^2) + eps) over dim 0, as transformers' l2norm */
struct tsr_tensor *tsr_l2_norm(struct tsr_graph *g, struct tsr_tensor *a, float eps);

struct tsr_rope_params {
  int n_rot;          /* rotated dims (<= ne0, even); the rest pass through */
  enum tsr_rope_mode mode;
  float freq_base;    /* theta_i = pos * freq_scale * base^(-2i/n_rot) / ff[i] */
  float freq_scale;
};
/* a[D,H,N], pos i32[N], freq_factors f32[n_rot/2] or NULL */
struct tsr_tensor *tsr_rope(struct tsr_graph *g, struct tsr_tensor *a,
                            struct tsr_tensor *pos, struct tsr_tensor *freq_factors,
                            const struct tsr_rope_params *p);
/* softmax(a*scale + mask) over dim 0; mask f32/f16 [ne0, ne1] broadcast over dims 2,3 */
struct tsr_tensor *tsr_softmax(struct tsr_graph *g, struct tsr_tensor *a,
                               struct tsr_tensor *mask, float scale);
struct tsr_tensor *tsr_unary(struct tsr_graph *g, struct tsr_tensor *a, enum tsr_unary_op op);
/* op(gate) * up; with up == NULL, a's dim 0 holds [gate | up] halves
** (swapped: [up | gate]) */
struct tsr_tensor *tsr_glu(struct tsr_graph *g, struct tsr_tensor *gate,
                           struct tsr_tensor *up, enum tsr_glu_op op, bool swapped);
/* cap * tanh(a / cap) */
struct tsr_tensor *tsr_softcap(struct tsr_graph *g, struct tsr_tensor *a, float cap);
struct tsr_tensor *tsr_concat(struct tsr_graph *g, struct tsr_tensor *a,
                              struct tsr_tensor *b, int dim);
/* a converted to dtype dt, contiguous */
struct tsr_tensor *tsr_cast(struct tsr_graph *g, struct tsr_tensor *a, enum tsr_dtype dt);
/* contiguous copy of a (same dtype) */
struct tsr_tensor *tsr_cont(struct tsr_graph *g, struct tsr_tensor *a);
/* copy a into dst (same element count; casts); returns a view of dst */
struct tsr_tensor *tsr_cpy(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *dst);
/* dst[:, idx[i], ...] = src[:, i, ...]; dst[K,R,B], src f32[K,N,B], idx i32[N]
** (or i32[N,B]); dst's dtype may be any with a quantizer. Returns a view of dst. */
struct tsr_tensor *tsr_set_rows(struct tsr_graph *g, struct tsr_tensor *dst,
                                struct tsr_tensor *src, struct tsr_tensor *idx);
/* indices of the k largest along dim 0, largest first: i32 [k, ...] */
struct tsr_tensor *tsr_top_k(struct tsr_graph *g, struct tsr_tensor *a, int k);
/* index of the largest along dim 0 (first on ties): i32 [ne1, ne2, ne3] */
struct tsr_tensor *tsr_argmax(struct tsr_graph *g, struct tsr_tensor *a);

struct tsr_attn_params {
  float scale;     /* applied to q.k */
  float softcap;   /* 0 = none; else logits = softcap * tanh(logits / softcap) */
  bool causal;     /* needs positions */
  int32_t window;  /* >0: key visible iff q_pos - k_pos < window (needs positions) */
  /* decode policies' parameters (plugin.h), or NULL; the cpu kernel honours them */
  const struct tsr_decode_params *decode;
};
/* flash_attn's op params past scale (0), softcap (1), causal (2), window (3): the
** decode parameters (0 threshold and budget: none). With either, src[TSR_FA_SRC_COUNTERS] is
** the layer's struct tsr_decode_counters (an external i32 [8]) the kernel adds to. */
enum { TSR_FA_P_SKIP = 4, TSR_FA_P_SINK = 5, TSR_FA_P_RECENT = 6, TSR_FA_P_BUDGET = 7 };
enum { TSR_FA_SRC_COUNTERS = 6 };
/* p's counters as an external i32 [8] over their memory (a source kernels add to). */
struct tsr_tensor *tsr_decode_counters(struct tsr_graph *g, const struct tsr_decode_params *p);

/* Built-in attention `flash`: q f32[D,Nq,Hq]; k [D,Nkv,Hkv] and v [Dv,Nkv,Hkv]
** (Hq a multiple of Hkv), each of its own dtype: f32, f16, bf16 or any block
** type with a dequantizer (q8_0, q4_0, k-quants...), whose head dim must then
** be a multiple of the block size; block rows are decoded a tile at a time,
** never the whole cache. mask f32/f16 [Nkv,Nq] additive or NULL; q_pos i32[Nq] and
** kv_pos i32[Nkv] or NULL; a negative kv_pos marks an empty cache cell, never
** attended. Out f32 [Dv,Hq,Nq]. A fully masked row gives zeros, never NaN. */
struct tsr_tensor *tsr_flash_attn(struct tsr_graph *g, struct tsr_tensor *q,
                                  struct tsr_tensor *k, struct tsr_tensor *v,
                                  struct tsr_tensor *mask, struct tsr_tensor *q_pos,
                                  struct tsr_tensor *kv_pos,
                                  const struct tsr_attn_params *p);

/* A node of a plugin-registered op (core/abi/op_registry.h): f32 output of shape
** ne, up to TSR_MAX_SRC sources, up to TSR_MAX_OP_PARAMS-2 int params. */
struct tsr_tensor *tsr_custom_op(struct tsr_graph *g, int32_t op_id, int n_dims, const int64_t *ne,
                                 struct tsr_tensor *const *src, int n_src, const int32_t *params,
                                 int n_params);

/* Records err as the graph's first error (for builders outside graph.c). */
void tsr_graph_fail(struct tsr_graph *g, tsr_status st, const char *message);

/* Marks t to be kept alive to the end of the graph (read by the caller). */
void tsr_graph_mark_output(struct tsr_tensor *t);

/* ---- planning ----------------------------------------------------------- */
struct tsr_graph_plan {
  size_t arena_bytes;     /* peak bytes of all planned tensors, aligned */
  size_t naive_bytes;     /* what giving every tensor its own memory would take */
  int n_nodes;            /* tensors with compute ops */
};
#define TSR_ARENA_ALIGN 64
/* Assigns arena offsets by liveness: a tensor's bytes are reused once its
** last reader has run. Inputs and outputs live for the whole graph. */
tsr_status tsr_graph_plan(struct tsr_graph *g, struct tsr_graph_plan *plan);
/* After planning: points every planned tensor into arena (arena_bytes long). */
tsr_status tsr_graph_bind_arena(struct tsr_graph *g, void *arena);
/* Byte offset assigned to a planned tensor, or (size_t)-1 if none. */
size_t tsr_graph_offset_of(const struct tsr_graph *g, const struct tsr_tensor *t);

#endif
