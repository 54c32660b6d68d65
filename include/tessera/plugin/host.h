/*
** tessera plugin ABI: the services table the host hands a plugin's init().
*/
#ifndef TESSERA_PLUGIN_HOST_H
#define TESSERA_PLUGIN_HOST_H

#include "tessera/plugin/abi.h"
#include "tessera/plugin/arch.h"
#include "tessera/plugin/attention.h"
#include "tessera/plugin/decode_policy.h"
#include "tessera/plugin/dtype.h"
#include "tessera/plugin/kernel.h"
#include "tessera/plugin/kv_codec.h"
#include "tessera/plugin/speculator.h"

#ifdef __cplusplus
extern "C" {
#endif

enum tsr_log_level { TSR_LOG_DEBUG = 0, TSR_LOG_INFO = 1, TSR_LOG_WARN = 2, TSR_LOG_ERROR = 3 };

struct tsr_host {
  uint32_t abi_major, abi_minor;
  uint32_t struct_size;

  /* logging and errors */
  void (*log)(struct tsr_plugin *self, enum tsr_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
      __attribute__((format(printf, 3, 4)))
#endif
      ;
  /* Sets the message the host reports and returns st. */
  tsr_status (*set_error)(tsr_status st, const char *fmt, ...)
#if defined(__GNUC__)
      __attribute__((format(printf, 2, 3)))
#endif
      ;

  /* plugin state */
  void (*set_state)(struct tsr_plugin *self, void *state);
  void *(*get_state)(const struct tsr_plugin *self);

  /* settings from the profile, validated against the descriptor, with the
  ** declared defaults applied; asking for an undeclared key is an error */
  tsr_status (*setting_i64)(const struct tsr_plugin *self, const char *key, int64_t *out);
  tsr_status (*setting_f64)(const struct tsr_plugin *self, const char *key, double *out);
  tsr_status (*setting_bool)(const struct tsr_plugin *self, const char *key, bool *out);
  tsr_status (*setting_str)(const struct tsr_plugin *self, const char *key, const char **out);

  /* registration: one call per capability; names must be unique per interface */
  tsr_status (*register_attention)(struct tsr_plugin *self, const struct tsr_attention_v1 *impl);
  tsr_status (*register_kv_codec)(struct tsr_plugin *self, const struct tsr_kv_codec_v1 *codec);
  tsr_status (*register_arch)(struct tsr_plugin *self, const struct tsr_arch_v1 *arch);
  tsr_status (*register_decode_policy)(struct tsr_plugin *self,
                                       const struct tsr_decode_policy_v1 *policy);
  tsr_status (*register_speculator)(struct tsr_plugin *self, const struct tsr_speculator_v1 *spec);

  /* counts what the plugin actually did ("attention_calls", "v_rows_skipped");
  ** --require-engaged NAME fails a run in which NAME counted nothing */
  void (*engaged)(struct tsr_plugin *self, const char *counter, uint64_t n);

  /* plugin-defined graph ops: a name gets an op id; each backend that should
  ** run it needs a kernel (a graph holding an op without a kernel for the
  ** active backend is refused at load, never run elsewhere) */
  tsr_status (*register_op)(struct tsr_plugin *self, const char *name, int32_t *op_id);
  tsr_status (*register_kernel)(struct tsr_plugin *self, int32_t op_id, const char *backend,
                                tsr_plugin_kernel_fn fn, void *ctx);
  /* appends a node of a registered op: f32 output of n_dims dims ne, up to 8
  ** sources, up to 12 int32 params handed to the kernel */
  struct tsr_tensor *(*custom_op)(struct tsr_graph *g, int32_t op_id, int32_t n_dims,
                                  const int64_t *ne, struct tsr_tensor *const *src, int32_t n_src,
                                  const int32_t *params, int32_t n_params);

  /* GGUF reading (for arch plugins): keys with type checks that name the key */
  tsr_status (*gguf_u32)(const struct tsr_gguf *model, const char *key, uint32_t *out);
  tsr_status (*gguf_f32)(const struct tsr_gguf *model, const char *key, float *out);
  tsr_status (*gguf_str)(const struct tsr_gguf *model, const char *key, const char **out);
  /* 1 if the key exists, else 0 */
  int (*gguf_has)(const struct tsr_gguf *model, const char *key);

  /* graph building (the core's builders; shapes as in the core's flash op) */
  void (*tensor_info)(const struct tsr_tensor *t, struct tsr_tensor_info *out);
  struct tsr_tensor *(*flash_attn)(struct tsr_graph *g, const struct tsr_attn_call *call);
  struct tsr_tensor *(*cast)(struct tsr_graph *g, struct tsr_tensor *a, int32_t dtype);
  struct tsr_tensor *(*scale)(struct tsr_graph *g, struct tsr_tensor *a, float s);
  struct tsr_tensor *(*mat_mul)(struct tsr_graph *g, struct tsr_tensor *w, struct tsr_tensor *x);
  struct tsr_tensor *(*add)(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *b);
  struct tsr_tensor *(*mul)(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *b);
  /* conversion (tessera convert): config.json read by dotted path
  ** ("text_config.num_hidden_layers"); a missing key or another type is an
  ** error naming the path. */
  int (*hf_has)(const struct tsr_convert *cv, const char *path);
  tsr_status (*hf_i64)(const struct tsr_convert *cv, const char *path, int64_t *out);
  tsr_status (*hf_f64)(const struct tsr_convert *cv, const char *path, double *out);
  tsr_status (*hf_bool)(const struct tsr_convert *cv, const char *path, bool *out);
  tsr_status (*hf_str)(const struct tsr_convert *cv, const char *path, const char **out);
  /* arrays in config.json: length, then elements by index */
  tsr_status (*hf_arr_len)(const struct tsr_convert *cv, const char *path, int64_t *n);
  tsr_status (*hf_arr_i64)(const struct tsr_convert *cv, const char *path, int64_t i,
                           int64_t *out);
  tsr_status (*hf_arr_f64)(const struct tsr_convert *cv, const char *path, int64_t i,
                           double *out);
  tsr_status (*hf_arr_str)(const struct tsr_convert *cv, const char *path, int64_t i,
                           const char **out);
  /* checkpoint tensors (one safetensors file or an indexed set of shards);
  ** shape in the checkpoint's own order (outermost first) */
  int64_t (*hf_n_tensors)(const struct tsr_convert *cv);
  const char *(*hf_tensor_name)(const struct tsr_convert *cv, int64_t i);
  int (*hf_tensor_has)(const struct tsr_convert *cv, const char *name);
  tsr_status (*hf_tensor_shape)(const struct tsr_convert *cv, const char *name, int32_t *n_dims,
                                int64_t shape[4]);
  /* the tensor's n values converted to f32, in the checkpoint's order */
  tsr_status (*hf_tensor_read)(struct tsr_convert *cv, const char *name, float *out, int64_t n);
  /* checkpoint tensors the output does not need (e.g. "model.visual."):
  ** every other tensor must be read, or the conversion fails naming it */
  void (*hf_skip_prefix)(struct tsr_convert *cv, const char *prefix);
  /* output metadata */
  tsr_status (*out_u32)(struct tsr_convert *cv, const char *key, uint32_t v);
  tsr_status (*out_i32)(struct tsr_convert *cv, const char *key, int32_t v);
  tsr_status (*out_f32)(struct tsr_convert *cv, const char *key, float v);
  tsr_status (*out_bool)(struct tsr_convert *cv, const char *key, bool v);
  tsr_status (*out_str)(struct tsr_convert *cv, const char *key, const char *v);
  tsr_status (*out_arr_i32)(struct tsr_convert *cv, const char *key, const int32_t *v, int64_t n);
  tsr_status (*out_arr_f32)(struct tsr_convert *cv, const char *key, const float *v, int64_t n);
  /* output tensor: ne in GGUF order (innermost first); the host copies the
  ** data and stores it in the --outtype when quantize is true and the row
  ** length allows, else in f32 (norms, biases, small vectors) */
  tsr_status (*out_tensor)(struct tsr_convert *cv, const char *name, bool quantize,
                           int32_t n_dims, const int64_t *ne, const float *data);
  /* tokenizer.json / tokenizer_config.json -> tokenizer.ggml.* with the
  ** given pre-tokenizer name ("qwen2", "qwen35", "gemma4", ...) */
  tsr_status (*convert_tokenizer)(struct tsr_convert *cv, const char *pre);
  /* graph building, continued: the core's builders (core/graph.h documents
  ** shapes; a failure returns NULL and records the graph's error) */
  /* a model weight by GGUF tensor name; NULL with an error naming it when absent */
  struct tsr_tensor *(*weight)(struct tsr_graph *g, const struct tsr_gguf *model, const char *name);
  int (*has_weight)(const struct tsr_gguf *model, const char *name);
  struct tsr_tensor *(*new_tensor)(struct tsr_graph *g, int32_t dtype, int32_t n_dims,
                                   const int64_t *ne);
  void (*set_name)(struct tsr_tensor *t, const char *name);
  void (*mark_output)(struct tsr_tensor *t);
  struct tsr_tensor *(*get_rows)(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *idx);
  struct tsr_tensor *(*mat_mul_id)(struct tsr_graph *g, struct tsr_tensor *w, struct tsr_tensor *x,
                                   struct tsr_tensor *ids);
  struct tsr_tensor *(*rms_norm)(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *w,
                                 float eps);
  struct tsr_tensor *(*l2_norm)(struct tsr_graph *g, struct tsr_tensor *a, float eps);
  struct tsr_tensor *(*rope)(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *pos,
                             struct tsr_tensor *freq_factors, int32_t n_rot, int32_t neox,
                             float freq_base, float freq_scale);
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
  tsr_status (*gguf_bool)(const struct tsr_gguf *model, const char *key, bool *out);
  tsr_status (*out_arr_bool)(struct tsr_convert *cv, const char *key, const bool *v, int64_t n);
  /* GGUF arrays (per-layer hyperparameters): length, then elements with the
  ** scalar getters' conversion rules; errors name the key */
  tsr_status (*gguf_arr_len)(const struct tsr_gguf *model, const char *key, int64_t *n);
  tsr_status (*gguf_arr_i64)(const struct tsr_gguf *model, const char *key, int64_t i,
                             int64_t *out);
  tsr_status (*gguf_arr_bool)(const struct tsr_gguf *model, const char *key, int64_t i,
                              bool *out);
  /* KV cache (fw->kv set): writes layer's new k and v (f32 [head_dim,
  ** n_tokens, n_head_kv], views allowed; ignored for a KV-shared layer) and
  ** points call->k, v, kv_pos and mask at the layer's whole pool: kv_pos
  ** hides the cells of other sequences, and when the batch holds several
  ** sequences the mask (f32 [cells, n_tokens], 0 or -inf) says which cells
  ** each token's sequence holds. The arch keeps q, q_pos, scale, causal and
  ** window. */
  tsr_status (*kv_attend)(struct tsr_arch_forward *fw, int32_t layer, struct tsr_tensor *k,
                          struct tsr_tensor *v, struct tsr_attn_call *call);
  /* a linear layer's recurrent state for fw->seq: n_floats f32 over the
  ** cache's slot (read it; cpy the new state into it) */
  struct tsr_tensor *(*kv_state)(struct tsr_arch_forward *fw, int32_t layer, int64_t n_floats);
  /* appended: context shift (struct tsr_kv_shift; check struct_size): the K of an owning
  ** attention layer's moved cells as f32 [head_dim_k, n_head_kv, n] (the
  ** layout rope takes, a view over get_rows of the cache), and delta_pos, an
  ** i32 [n] position tensor holding sh->delta n times. n can be 0 (the
  ** layer's pool moved nothing): then *k and *delta_pos are NULL and the
  ** result is TSR_OK. A layer that owns no K is an error. */
  tsr_status (*kv_shift_k)(struct tsr_kv_shift *sh, int32_t layer, struct tsr_tensor **k,
                           struct tsr_tensor **delta_pos);
  /* writes k (f32 [head_dim_k, n_head_kv, n], views allowed) back into the
  ** same cells of the layer's K, encoded in its codec */
  tsr_status (*kv_shift_store)(struct tsr_kv_shift *sh, int32_t layer, struct tsr_tensor *k);
  /* appended: attention that positions keys itself (struct tsr_attn_rope).
  ** An arch describes each attention layer's RoPE and lets the host rotate:
  **   q = attn_rope(fw, il, &rope, q, false); k = attn_rope(fw, il, &rope, k, true);
  **   ... call.rope = &rope; kv_attend(..); o = attn_build(fw, il, &call);
  ** x is q or k (f32 [D, H, N], before RoPE): rotated at fw->positions as
  ** rope says, or, when the layer kind's attention rotates itself, q as it is
  ** and k as that attention's prepare_k has it stored. */
  struct tsr_tensor *(*attn_rope)(struct tsr_arch_forward *fw, int32_t layer,
                                  const struct tsr_attn_rope *rope, struct tsr_tensor *x,
                                  bool is_k);
  /* the layer's attention, by the implementation its kind negotiated */
  struct tsr_tensor *(*attn_build)(struct tsr_arch_forward *fw, int32_t layer,
                                   const struct tsr_attn_call *call);
  /* x (f32 [D, H, N]) rotated at pos (i32 [N]) as rope says */
  struct tsr_tensor *(*rope_apply)(struct tsr_graph *g, const struct tsr_attn_rope *rope,
                                   struct tsr_tensor *x, struct tsr_tensor *pos);
  /* context shift of an owning layer's moved keys k (from kv_shift_k): k
  ** rotated by delta_pos as rope says, or re-positioned by the layer's
  ** attention when it rotates keys itself; hand the result to kv_shift_store.
  ** NULL with the graph's error set when the shift cannot be exact. */
  struct tsr_tensor *(*kv_shift_rope)(struct tsr_kv_shift *sh, int32_t layer,
                                      const struct tsr_attn_rope *rope, struct tsr_tensor *k,
                                      struct tsr_tensor *delta_pos);
  /* records st and the message as g's first error: a plugin builder's refusal
  ** reaches the user instead of a later "source is NULL" */
  void (*graph_fail)(struct tsr_graph *g, tsr_status st, const char *fmt, ...)
#if defined(__GNUC__)
      __attribute__((format(printf, 3, 4)))
#endif
      ;
  /* custom_op whose output is dtype (f32 or i32: positions, indices) */
  struct tsr_tensor *(*custom_op_typed)(struct tsr_graph *g, int32_t op_id, int32_t dtype,
                                        int32_t n_dims, const int64_t *ne,
                                        struct tsr_tensor *const *src, int32_t n_src,
                                        const int32_t *params, int32_t n_params);
  /* a registered codec of self's host, by name, or by dtype when name is
  ** NULL (what a kernel's K/V tensor holds); NULL when none. It lives as long
  ** as the host. */
  const struct tsr_kv_codec_v1 *(*find_kv_codec)(const struct tsr_plugin *self, const char *name,
                                                 int32_t dtype);
  /* the CPU vector primitives the core's kernels use (f32 accumulation), so
  ** a plugin's kernel rounds exactly as they do */
  float (*vec_dot_f32)(const float *x, const float *y, int64_t n);
  float (*vec_dot_f16_f32)(const uint16_t *x, const float *y, int64_t n);
  void (*vec_axpy_f32)(float *y, float a, const float *x, int64_t n);
  void (*vec_axpy_f16)(float *y, float a, const uint16_t *x, int64_t n);
  void (*vec_scale_f32)(float *y, float a, int64_t n);
  /* output tensor of int32 values (indices, orderings), stored as i32 */
  tsr_status (*out_tensor_i32)(struct tsr_convert *cv, const char *name, int32_t n_dims,
                               const int64_t *ne, const int32_t *data);
  /* appended: plugin ops on a device backend. A kernel for backend "cuda" is
  ** registered like a cpu one (register_kernel), or, so that the plugin's own
  ** .so links no CUDA, from a shared object of the plugin's built apart (its
  ** CUDA code, e.g. plugins/NAME/cuda/ built into NAME_cuda.so beside the
  ** plugin's .so): register_kernel_lib names the file (a relative name is
  ** looked for in the directory of the plugin's .so) and the exported symbol, a
  ** tsr_plugin_kernel_fn. The host opens the file (dlopen, RTLD_LOCAL) only
  ** when that backend first asks for the op's kernel, i.e. when a graph
  ** holding the op is checked against it at load: a cpu run never opens it,
  ** and a file that is missing, does not load or lacks the symbol makes the
  ** backend refuse the graph with a message naming the file and the op.
  ** How a device backend calls a kernel: once per node (ith 0, nth 1), on the
  ** thread that runs the graph, in graph order, with tensor infos whose data
  ** are DEVICE addresses (planned tensors, kept or staged external memory;
  ** views already offset) and the layout the cpu kernel sees. The kernel
  ** enqueues its work on device_call()->stream after
  ** cudaSetDevice(device_call()->device) and returns without waiting; it
  ** reports a failed launch through device_call()->status. It may write into
  ** its sources (a state carried in place) exactly as its cpu kernel does:
  ** the backend copies such external memory back when it is not kept.
  ** device_call() is NULL outside such a call (and on the cpu). */
  tsr_status (*register_kernel_lib)(struct tsr_plugin *self, int32_t op_id, const char *backend,
                                    const char *file, const char *symbol, void *ctx);
  struct tsr_device_call *(*device_call)(void);
  /* Declares the op's kernel for `backend` ("cuda") replayable: a device backend may
  ** capture its launches in a CUDA graph and replay them for later computes whose
  ** nodes have the same layouts, device addresses and params. The kernel promises
  ** that its launches depend on nothing else (no host-side state that changes between
  ** calls), that it enqueues only stream-ordered work on device_call()->stream (no
  ** synchronization, no host reads of device memory, no cudaMalloc), and that it
  ** honours device_call()->graph. Without this a graph holding the op runs node by
  ** node. The op must be this plugin's and have a kernel for backend. (Appended
  ** later: check host->struct_size.) */
  tsr_status (*declare_replayable)(struct tsr_plugin *self, int32_t op_id, const char *backend);
  /* A number no other graph of this process has (a freed graph's address is reused, its
  ** serial never): a builder that makes the same tensor for every layer (positions, say)
  ** keys a memo of it by this and builds it once a graph. (Appended later: check
  ** host->struct_size.) */
  uint64_t (*graph_serial)(const struct tsr_graph *g);
  /* ABI 1.1: checking a model file against its hyperparameters (an arch's
  ** validate()); each error names the key or tensor, what was expected and
  ** what was found. Check host->struct_size (tsr_host_has_model_checks). */
  /* a float key that must be finite and > 0 (epsilons, RoPE bases and
  ** scaling factors, softcaps): "qwen3.rope.freq_base is inf: must be a
  ** finite positive number" */
  tsr_status (*gguf_f32_positive)(const struct tsr_gguf *model, const char *key, float *out);
  /* a tensor's dims as stored (GGUF order, innermost first; 1 past n_dims);
  ** TSR_ERR_FORMAT naming it when absent */
  tsr_status (*weight_shape)(const struct tsr_gguf *model, const char *name, int32_t *n_dims,
                             int64_t ne[4]);
  /* the tensor present with dims ne[0..n_dims) (-1: any; 1 past n_dims).
  ** why (or NULL) holds n_dims entries, each NULL or what implies that dim
  ** ("qwen3.embedding_length"), so a mismatch reads "qwen3.embedding_length
  ** is 1024 but token_embd.weight has 896 columns (shape [896, 151936])" */
  tsr_status (*check_weight)(const struct tsr_gguf *model, const char *name, int32_t n_dims,
                             const int64_t *ne, const char *const *why);
  /* blk.L.SUFFIX in each of the n layers listed, or in none of them: the
  ** first listed decides, *present says which. A mix fails naming the first
  ** layer that differs: "blk.3.attn_q_norm.weight is missing (layers 0-2,
  ** 4-27 have it)" */
  tsr_status (*check_layer_weights)(const struct tsr_gguf *model, const char *suffix,
                                    const int32_t *layers, int32_t n, bool *present);
  /* later minors append here */
};

/* Whether the host has the model checks (ABI 1.1's gguf_f32_positive ..
** check_layer_weights); an arch's validate() has nothing to check with when not. */
static inline bool tsr_host_has_model_checks(const struct tsr_host *h) {
  return h->struct_size >=
         offsetof(struct tsr_host, check_layer_weights) + sizeof h->check_layer_weights;
}

/* host->declare_replayable where the host has it; an older host never captures plugin
** ops in CUDA graphs, so there is nothing to declare. */
static inline tsr_status tsr_declare_replayable(const struct tsr_host *h, struct tsr_plugin *self,
                                                int32_t op_id, const char *backend) {
  if (h->struct_size < offsetof(struct tsr_host, declare_replayable) + sizeof h->declare_replayable)
    return TSR_OK;
  return h->declare_replayable(self, op_id, backend);
}

/* The rows of x (a residual [n_embd, n_tokens]) whose logits the host reads
** (tsr_arch_forward.output_rows), or x when it reads every row: an arch calls it
** just before its final norm and LM head, which then work on those rows only. */
static inline struct tsr_tensor *tsr_arch_output_rows(const struct tsr_host *h,
                                                      struct tsr_arch_forward *fw,
                                                      struct tsr_tensor *x) {
  if (fw->struct_size <= offsetof(struct tsr_arch_forward, output_rows) || !fw->output_rows)
    return x;
  return h->get_rows(fw->g, x, fw->output_rows);
}

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_PLUGIN_HOST_H */
