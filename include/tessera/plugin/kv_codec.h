/*
** tessera plugin ABI: the kv_codec interface, a KV-cache storage format.
*/
#ifndef TESSERA_PLUGIN_KV_CODEC_H
#define TESSERA_PLUGIN_KV_CODEC_H

#include "tessera/plugin/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- kv_codec, version 1 ----------------------------------------------- */

/* One device backend's kernels for a codec of its own block layout:
** entry points (tsr_plugin_kernel_fn) in a shared object of the plugin's, as
** register_kernel_lib takes them (file beside the plugin's .so). The backend
** calls them where its own set_rows and cast would run, with device addresses,
** ctx, and host->kernel->device_call() as for a plugin op; they enqueue launches only
** (no host-side work, no synchronization), so a CUDA graph may capture them. */
struct tsr_kv_codec_kernels {
  const char *backend; /* "cuda" */
  const char *file;    /* "NAME_cuda.so" */
  /* writes rows into the cache, as set_rows: dst the cache in the codec's dtype
  ** [S, cells, H], src[0] the rows f32 [S, n, H] (a view: any strides), src[1]
  ** their cells i32 [n] (or [n, H]: a cell per head); each strided as its nb
  ** says */
  const char *encode;
  /* decodes to f16, as a cast: dst f16 [S, n, H] contiguous, src[0] rows in the
  ** codec's dtype (a view of the cache, strided as src->nb says) */
  const char *lift;
  void *ctx;
  /* Optional: attention read in register, where the core's flash op would run
  ** on this backend over a layer that reads () accepts: dst f32 [Dv, Hq, Nq],
  ** src q f32 [D, Nq, Hq], k [D, Nkv, Hkv], v [Dv, Nkv, Hkv] as stored (not
  ** lifted), mask f32/f16 [Nkv, Nq], q_pos i32 [Nq], kv_pos i32 [Nkv] (an
  ** absent source has data NULL), params scale and softcap (f32 bits), causal,
  ** window: the flash op's semantics (a negative kv_pos, a key past q_pos when
  ** causal or q_pos - kv_pos >= window hidden; a fully hidden row gives zeros).
  ** NULL: attention lifts this codec to f16 first. */
  const char *read;
  /* Whether read handles this layer: its K and V codecs as stored (names in
  ** layer->k_codec / v_codec; this codec on one side at least) and head dims.
  ** The host asks K's codec first: when K's codec has a read kernel, only that
  ** one is asked; otherwise V's. Required with read. */
  bool (*reads)(void *ctx, const struct tsr_layer_desc *layer);
};

/* State tensors a codec may keep per layer and side. */
#define TSR_KV_CODEC_MAX_STATE 4

/* Where one of a codec's graph hooks runs: the layer, the side the codec
** stores, and the codec's persistent state there. */
struct tsr_kv_codec_site {
  uint32_t struct_size;
  int32_t layer;    /* index in the model (a KV-shared layer: its own; state is its source's) */
  bool is_k;        /* the codec stores this layer's K (else V) */
  int32_t head_dim; /* the layer's head dim on this side, as the model has it */
  /* the state tensors (n_state of them, state_shape's dims, f32) as graph inputs;
  ** NULL past n_state */
  struct tsr_tensor *state[TSR_KV_CODEC_MAX_STATE];
};

/* A KV-cache storage format. Its rows are stored in dtype (a type the
** backends' kernels read, or its own block layout), optionally after graph
** hooks that change what attention sees: prepare_rows transforms the rows a
** layer stores (e.g. a rotation, zero padding to storage_dim), prepare_q the
** queries that score
** keys stored in it (as K codec), finish_out the attention output that
** summed values stored in it (as V codec). The host inserts the hooks around
** whatever attention the layer uses, so a codec composes with every attention
** implementation without either knowing the other:
**   k_stored = K.prepare_rows(k)      v_stored = V.prepare_rows(v)
**   out = V.finish_out(attention(K.prepare_q(q), k_stored, v_stored))
** A rotation R (orthogonal) needs all three: (Rq).(Rk) = q.k, and the output
** sum of p_j R v_j is R o, so finish_out applies R^T. */
struct tsr_kv_codec_v1 {
  uint32_t struct_size;
  const char *name;      /* "q8_0", "turbo3" */
  /* the type id its rows are stored in (GGUF or tessera's), or
  ** TSR_KV_CODEC_OWN_DTYPE: blocks of the codec's own layout, for which the
  ** host assigns an id (find_kv_codec reads it back). The CPU then writes and
  ** reads them through encode_rows and decode_f32, both required, and their
  ** ctx must live as long as the process (its dtype is the process's); a
  ** device backend through the codec's kernels (kernels, below). */
  int32_t dtype;
  int64_t block_size;    /* values per block */
  size_t block_bytes;    /* bytes per block */
  const char *backends;  /* comma-separated backends that can encode/lift it */
  void *ctx;
  /* CPU reference: encode n floats (n a multiple of block_size) / lift to f16. */
  void (*encode_rows)(void *ctx, const float *src, void *dst, int64_t n);
  void (*decode_f16)(void *ctx, const void *src, uint16_t *dst, int64_t n);
  /* CPU: decode n values (whole blocks) to f32, as an attention
  ** kernel reads them in register; NULL: the codec decodes to f16 only. */
  void (*decode_f32)(void *ctx, const void *src, float *dst, int64_t n);
  /* Graph hooks, each NULL for none. Every hook appends ops to g and
  ** returns their f32 result, or NULL with the graph's error set; its input is
  ** contiguous f32 with the head dim first. */
  /* The head dim rows of head_dim values are stored (and q and the output
  ** are seen by attention) at: >= head_dim, a multiple of block_size; 0 when
  ** the codec cannot store that head dim. NULL: head_dim. */
  int32_t (*storage_dim)(void *ctx, int32_t head_dim);
  /* rows f32 [head_dim, n, heads] -> f32 [storage_dim, n, heads], stored then */
  struct tsr_tensor *(*prepare_rows)(void *ctx, const struct tsr_host *host, struct tsr_graph *g,
                                     const struct tsr_kv_codec_site *site,
                                     struct tsr_tensor *rows);
  /* as K codec: queries f32 [head_dim, a, b] (positioned) -> f32 [storage_dim, a, b] */
  struct tsr_tensor *(*prepare_q)(void *ctx, const struct tsr_host *host, struct tsr_graph *g,
                                  const struct tsr_kv_codec_site *site, struct tsr_tensor *q);
  /* as V codec: attention output f32 [storage_dim, a, b] -> f32 [head_dim, a, b]
  ** (site->head_dim) */
  struct tsr_tensor *(*finish_out)(void *ctx, const struct tsr_host *host, struct tsr_graph *g,
                                   const struct tsr_kv_codec_site *site, struct tsr_tensor *out);
  /* A codec of its own layout: its kernels on each device backend its
  ** `backends` names (the cpu uses encode_rows and decode_f32). Attention reads
  ** it there in register through the codec's read kernel where one accepts the
  ** layer (TSR_READ_IN_REGISTER), else by lifting (TSR_READ_LIFT): the host casts
  ** the layer's K or V to f16 before the attention call, unless the profile
  ** forbids lifting (kv.lift: false). */
  const struct tsr_kv_codec_kernels *kernels;
  uint32_t n_kernels;
  /* Persistent state: n_state f32 tensors (at most TSR_KV_CODEC_MAX_STATE) the
  ** codec keeps per layer and side for as long as the cache lives (per-channel
  ** scales, codebooks). The KV cache allocates them beside the layer's rows,
  ** the memory plan counts them, state_init fills them once, and the hooks
  ** read them (tsr_kv_codec_site.state) on any backend. */
  int32_t n_state;
  /* state tensor i for a layer side of storage head dim head_dim and n_head_kv
  ** heads: its name ("channel_scale") and dims (ne[1] 1 for a vector, each
  ** 1..2^24); TSR_ERR_UNSUPPORTED through host set_error to refuse the layer */
  tsr_status (*state_shape)(void *ctx, int32_t head_dim, int32_t n_head_kv, bool is_k, int32_t i,
                            const char **name, int64_t ne[2]);
  /* its values: n = ne[0] * ne[1] floats into host memory, once, when the
  ** cache is made; NULL: zeros */
  tsr_status (*state_init)(void *ctx, int32_t layer, bool is_k, int32_t i, float *data, int64_t n);
};

/* tsr_kv_codec_v1.dtype of a codec with its own block layout. */
#define TSR_KV_CODEC_OWN_DTYPE (-1)

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_PLUGIN_KV_CODEC_H */
