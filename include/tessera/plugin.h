/*
** tessera plugin ABI.
**
** A plugin is a shared object exporting one symbol, TSR_PLUGIN_ENTRY_SYMBOL,
** a function returning a static descriptor (struct tsr_plugin_descriptor).
** The host opens it with dlopen(RTLD_NOW | RTLD_LOCAL), never dlcloses it
** while any of it is in use, and refuses it when
**   - its ABI major differs from the host's, or
**   - its ABI minor is newer than the host's (it may use slots the host
**     does not have),
** naming both versions. Then the host calls init() with a services table
** (struct tsr_host): the plugin registers what it provides through that
** table and never touches the host's internals, so it builds out of tree
** against this header alone (pkg-config: tessera-plugin).
**
** Growth rules (SQLite's and Vulkan's): every struct here starts with or
** carries a struct_size; later minors only append fields at the end, each
** group marked with the minor that added it ("ABI 1.1"), and a reader checks
** struct_size before touching an appended field. Nothing is ever removed or
** reordered within a major.
**
** Interfaces (each versioned on its own):
**   arch           1: hyperparameters and layer plan from GGUF, graph per ubatch
**   attention      1: attention over one layer's KV; negotiates codec reads
**   kv_codec       2: a KV-cache storage format: encode rows, decode (lift),
**                  graph hooks around attention, its own block layout
**   decode_policy  2: parameters that reach the attention kernel on decode
**                  steps (e.g. V skipping), counters back
**   speculator     2: drafts tokens; the host verifies them in one batch
** docs/PLUGINS.md is the author's guide to each.
** Built-in pieces (the `flash` attention, the scalar KV codecs) register
** through the same calls: the core is the first plugin author.
*/
#ifndef TESSERA_PLUGIN_H
#define TESSERA_PLUGIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tessera/tessera.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TSR_PLUGIN_ABI_MAJOR 1
#define TSR_PLUGIN_ABI_MINOR 1
#define TSR_PLUGIN_ENTRY_SYMBOL "tsr_plugin_entry"

#if defined(__GNUC__)
#define TSR_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define TSR_PLUGIN_EXPORT
#endif

/* Interface names. */
#define TSR_IFACE_ARCH "arch"
#define TSR_IFACE_ATTENTION "attention"
#define TSR_IFACE_KV_CODEC "kv_codec"
#define TSR_IFACE_DECODE_POLICY "decode_policy"
#define TSR_IFACE_SPECULATOR "speculator"

/* Opaque to plugins. */
struct tsr_plugin; /* the host's handle for one loaded plugin */
struct tsr_graph;
struct tsr_tensor;

/* ---- descriptor ---------------------------------------------------------- */

struct tsr_plugin_iface {
  const char *name;  /* one of TSR_IFACE_* */
  uint32_t version;  /* interface version */
};

enum tsr_setting_type {
  TSR_SETTING_INT = 0,
  TSR_SETTING_FLOAT = 1,
  TSR_SETTING_BOOL = 2,
  TSR_SETTING_STRING = 3,
  TSR_SETTING_ENUM = 4, /* a string from `choices` */
};

/* A setting the plugin accepts from the profile (plugins[].settings). The
** host validates the profile against these before init (type, range,
** choices) and reports FILE:LINE:COL of a bad value. */
struct tsr_plugin_setting {
  const char *key;
  enum tsr_setting_type type;
  double min, max;           /* INT and FLOAT; min > max means unbounded */
  const char *default_value; /* as the profile would write it */
  const char *choices;       /* ENUM: "a|b|c" */
  const char *description;
};

struct tsr_host;
struct tsr_attn_rope;

struct tsr_plugin_descriptor {
  uint32_t abi_major;  /* TSR_PLUGIN_ABI_MAJOR the plugin was built with */
  uint32_t abi_minor;
  uint32_t struct_size; /* sizeof(struct tsr_plugin_descriptor) at build */
  const char *name;     /* matches the folder and plugin.ini name */
  const char *version;  /* the plugin's own version, "1.2.0" */
  const char *description;
  const struct tsr_plugin_iface *provides;
  uint32_t n_provides;
  const struct tsr_plugin_iface *requires;
  uint32_t n_requires;
  const struct tsr_plugin_setting *settings;
  uint32_t n_settings;
  /* Registers the plugin's capabilities. A failure rolls back everything
  ** it registered; the message set through host->set_error is reported. */
  tsr_status (*init)(const struct tsr_host *host, struct tsr_plugin *self);
  /* Frees what init made (state from host->get_state). May be NULL. */
  void (*destroy)(const struct tsr_host *host, struct tsr_plugin *self);
};

typedef const struct tsr_plugin_descriptor *(*tsr_plugin_entry_fn)(void);

/* ---- shared vocabulary ------------------------------------------------- */

enum tsr_layer_kind {
  TSR_LAYER_FULL = 0,    /* global attention over the whole context */
  TSR_LAYER_SLIDING = 1, /* sliding-window attention */
  TSR_LAYER_LINEAR = 2,  /* linear / recurrent (no KV; state slots) */
  TSR_LAYER_KIND_COUNT = 3,
};

/* How an attention implementation reads a KV codec. */
enum tsr_read_path {
  TSR_READ_NONE = 0,        /* cannot read it */
  TSR_READ_NATIVE = 1,      /* the codec is a float type the kernel reads as is */
  TSR_READ_LIFT = 2,        /* decoded to f16 before the kernel */
  TSR_READ_IN_REGISTER = 3, /* decoded inside the kernel */
};

/* What the host knows about one attention layer when it negotiates. */
struct tsr_layer_desc {
  uint32_t struct_size;
  int32_t layer;             /* index in the model */
  enum tsr_layer_kind kind;
  int32_t n_head, n_head_kv;
  int32_t head_dim_k, head_dim_v; /* as the kernel sees them: the codecs' storage dims */
  int32_t window;            /* SLIDING: window in tokens; else 0 */
  const char *k_codec, *v_codec;
  const char *backend;       /* "cpu", "cuda" */
};

/* Element type and layout of a tensor, as a plugin's kernel or builder sees
** it. dtype ids are GGUF type ids, or ids the host assigned to registered
** codecs. */
struct tsr_tensor_info {
  uint32_t struct_size;
  int32_t dtype;
  int32_t n_dims;
  int64_t ne[4];
  size_t nb[4];
  void *data; /* NULL until the graph is planned and bound */
  const char *name;
};

/* ---- decode policies' parameters (ABI 1.1) --------------------------------- */

/* What an attention kernel did under a layer's decode parameters; the kernel adds
** to it (atomically: threads share it), the host reports it to the policy. */
struct tsr_decode_counters {
  uint64_t v_rows_read;    /* V rows of visible keys a decode step weighed */
  uint64_t v_rows_skipped; /* of them, skipped for a weight below the threshold */
};

/* What the decode policies of one layer ask of its attention on a decode step (one
** token of one sequence). The host fills one per layer from the policies' params
** hooks and hands it to an attention that honours them (tsr_attention_v1.
** honours_decode) in tsr_attn_call.decode. */
struct tsr_decode_params {
  uint32_t struct_size;
  /* > 0: a V row is skipped when every query head reading it weighs it below this
  ** against the running max, exp(s - m_run): conservative, the final weight can
  ** only be smaller. The running max and sum stay exact. 0: every row is read. */
  float v_skip_threshold;
  int32_t sink;   /* keys at positions below sink are never skipped */
  int32_t recent; /* nor keys within recent positions of the query */
  struct tsr_decode_counters *counters; /* the layer's (host memory) */
};

/* ---- attention, version 1 ---------------------------------------------- */

/* The inputs of one layer's attention, for build(). Shapes as the core's
** flash op: q f32 [D, Nq, Hq]; k, v [D, Nkv, Hkv] in their codec's dtype
** (or already lifted to f16 when negotiation chose LIFT); mask, positions
** may be NULL. */
struct tsr_attn_call {
  uint32_t struct_size;
  const struct tsr_layer_desc *layer;
  struct tsr_tensor *q, *k, *v, *mask, *q_pos, *kv_pos;
  float scale, softcap;
  bool causal;
  int32_t window;
  /* Appended: the layer's RoPE (struct tsr_attn_rope), or NULL when it has
  ** none. For an implementation that rotates (tsr_attention_v1.rotates) q
  ** arrives unrotated and k holds what its prepare_k stored; for any other,
  ** both are already rotated at their positions. */
  const struct tsr_attn_rope *rope;
  /* ABI 1.1. For an implementation that rotates: the K codec's query
  ** transform (tsr_kv_codec_v1.prepare_q), which it applies to every q it
  ** positions, before reading keys: q = call->prepare_q(call, g, q) (f32,
  ** head dim first, any layout; the result is contiguous with head dim
  ** head_dim_k of the layer desc). NULL: the K codec has none, or the host
  ** applied it already (an implementation that does not rotate gets q
  ** transformed). */
  struct tsr_tensor *(*prepare_q)(const struct tsr_attn_call *call, struct tsr_graph *g,
                                  struct tsr_tensor *q);
  const void *prepare_q_ctx; /* the host's */
  /* ABI 1.1: the layer's decode parameters on a decode step, for an attention that
  ** honours them; NULL otherwise */
  const struct tsr_decode_params *decode;
};

/* How an arch rotates one attention layer's q and k by position, so that an
** implementation that places keys itself (e.g. Dual Chunk Attention rotates
** keys at p mod C and queries at three positions) rotates them exactly as the
** arch would, only at positions of its choosing. The core's rope: angle
** theta_i = pos * freq_scale * freq_base^(-2i/n_rot) / freq_factors[i] on the
** pairs (i, i + n_rot/2) (neox) or (2i, 2i+1); dims from n_rot on pass
** through (partial rotary). Filled by the arch on its stack for one build
** or shift call. */
struct tsr_attn_rope {
  uint32_t struct_size;
  int32_t n_rot;
  int32_t neox;
  float freq_base, freq_scale;
  struct tsr_tensor *freq_factors; /* f32 [n_rot/2] in the graph being built, or NULL */
  /* The arch's own rotation when it is not the core's rope with the fields
  ** above (e.g. angles rounded in f32 as the reference implementation does):
  ** appends x (f32 [D, H, N]) rotated at pos (i32 [N]). NULL: the core's. */
  struct tsr_tensor *(*rotate)(const struct tsr_attn_rope *rope, const struct tsr_host *host,
                               struct tsr_graph *g, struct tsr_tensor *x, struct tsr_tensor *pos);
  void *rotate_ctx;
  /* What the model file says about positions, for implementations that
  ** extend the context; 0 where it says nothing. */
  int32_t n_ctx_train;         /* the context length it was trained at */
  int32_t dca_chunk_size;      /* its dual_chunk_attention_config (Qwen2.5-1M) */
  int32_t dca_local_size;
  int32_t dca_original_length; /* original_max_position_embeddings there */
};

struct tsr_attention_v1 {
  uint32_t struct_size;
  const char *name; /* the name profiles use: attention: NAME */
  void *ctx;
  /* Negotiation: how this implementation reads the layer's K and V codecs
  ** on its backend. Return TSR_ERR_UNSUPPORTED with a message (host
  ** set_error) saying what is missing when it cannot. */
  tsr_status (*negotiate)(void *ctx, const struct tsr_layer_desc *layer,
                          enum tsr_read_path *k_path, enum tsr_read_path *v_path);
  /* Appends this layer's attention to g; returns the f32 [Dv, Hq, Nq]
  ** output, or NULL with the graph's error set. */
  struct tsr_tensor *(*build)(void *ctx, const struct tsr_host *host, struct tsr_graph *g,
                              const struct tsr_attn_call *call);
  bool v_skip; /* honours decode_policy V skipping */
  /* Appended. rotates: this implementation positions q and k itself from
  ** call->rope. The arch then hands it q before RoPE (host->attn_rope returns
  ** q as it is) and the cache stores prepare_k's keys rather than keys
  ** rotated at their positions. */
  bool rotates;
  /* the keys to store for k (f32 [D, Hkv, N], before RoPE) at positions pos
  ** (i32 [N]), f32 [D, Hkv, N]; NULL with the graph's error set */
  struct tsr_tensor *(*prepare_k)(void *ctx, const struct tsr_host *host, struct tsr_graph *g,
                                  const struct tsr_attn_rope *rope, struct tsr_tensor *k,
                                  struct tsr_tensor *pos);
  /* context shift: k (f32 [D, Hkv, n]) as prepare_k stored it at positions
  ** pos (i32 [n]; NULL when the host cannot say) moves to pos + delta: the
  ** keys prepare_k would store there, or NULL with the graph's error set when
  ** that cannot be made exact */
  struct tsr_tensor *(*shift_k)(void *ctx, const struct tsr_host *host, struct tsr_graph *g,
                                const struct tsr_attn_rope *rope, struct tsr_tensor *k,
                                struct tsr_tensor *pos, int32_t delta);
  /* ABI 1.1. An implementation that rotates applies tsr_attn_call.prepare_q
  ** to the queries it positions; without this the host refuses a K codec
  ** with a query transform under it, naming both. */
  bool applies_prepare_q;
  /* ABI 1.1. Whether its kernels for this layer (its backend, its codecs) act on
  ** tsr_attn_call.decode; NULL or false: the host refuses a decode policy on the
  ** layer, naming both. */
  bool (*honours_decode)(void *ctx, const struct tsr_layer_desc *layer);
};

/* ---- kv_codec, version 2 ----------------------------------------------- */

/* One device backend's kernels for a codec of its own block layout (ABI 1.1):
** entry points (tsr_plugin_kernel_fn) in a shared object of the plugin's, as
** register_kernel_lib takes them (file beside the plugin's .so). The backend
** calls them where its own set_rows and cast would run, with device addresses,
** ctx, and host->device_call() as for a plugin op; they enqueue launches only
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
** sum of p_j R v_j is R o, so finish_out applies R^T.
** Version 2 is version 1 with the hooks appended (ABI 1.1). */
struct tsr_kv_codec_v1 {
  uint32_t struct_size;
  const char *name;      /* "q8_0", "turbo3" */
  /* the type id its rows are stored in (GGUF or tessera's), or (ABI 1.1)
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
  /* Appended. CPU: decode n values (whole blocks) to f32, as an attention
  ** kernel reads them in register; NULL: the codec decodes to f16 only. */
  void (*decode_f32)(void *ctx, const void *src, float *dst, int64_t n);
  /* ABI 1.1: graph hooks, each NULL for none. Every hook appends ops to g and
  ** returns their f32 result, or NULL with the graph's error set; its input is
  ** contiguous f32 with the head dim first. */
  /* The head dim rows of head_dim values are stored (and q and the output
  ** are seen by attention) at: >= head_dim, a multiple of block_size; 0 when
  ** the codec cannot store that head dim. NULL: head_dim. */
  int32_t (*storage_dim)(void *ctx, int32_t head_dim);
  /* rows f32 [head_dim, n, heads] -> f32 [storage_dim, n, heads], stored then */
  struct tsr_tensor *(*prepare_rows)(void *ctx, const struct tsr_host *host, struct tsr_graph *g,
                                     struct tsr_tensor *rows);
  /* as K codec: queries f32 [head_dim, a, b] (positioned) -> f32 [storage_dim, a, b] */
  struct tsr_tensor *(*prepare_q)(void *ctx, const struct tsr_host *host, struct tsr_graph *g,
                                  struct tsr_tensor *q);
  /* as V codec: attention output f32 [storage_dim, a, b] -> f32 [head_dim, a, b] */
  struct tsr_tensor *(*finish_out)(void *ctx, const struct tsr_host *host, struct tsr_graph *g,
                                   struct tsr_tensor *out, int32_t head_dim);
  /* ABI 1.1, a codec of its own layout: its kernels on each device backend its
  ** `backends` names (the cpu uses encode_rows and decode_f32). Attention reads
  ** it there by lifting (TSR_READ_LIFT): the host casts the layer's K or V to
  ** f16 before the attention call. */
  const struct tsr_kv_codec_kernels *kernels;
  uint32_t n_kernels;
};

/* tsr_kv_codec_v1.dtype of a codec with its own block layout (ABI 1.1). */
#define TSR_KV_CODEC_OWN_DTYPE (-1)

/* A codec's hooks, NULL where the codec has none or was built before them. */
#define TSR_KV_CODEC_HOOK(c, field)                                                               \
  ((c) && (c)->struct_size >= offsetof(struct tsr_kv_codec_v1, field) + sizeof (c)->field        \
       ? (c)->field                                                                               \
       : NULL)

/* ---- arch, version 1 ----------------------------------------------------- */

/* One layer of the model as the arch sees it. An array element, so its
** layout is fixed for ABI major 1 (no appended fields). */
struct tsr_arch_layer {
  enum tsr_layer_kind kind;
  int32_t n_head, n_head_kv, head_dim_k, head_dim_v, window;
  int64_t state_bytes; /* LINEAR: recurrent state per sequence; else 0 */
  /* 0: the layer owns its K/V; j+1: it reads layer j's (KV sharing, e.g.
  ** Gemma 4 E2B); -1: it reads the paired target model's (drafters). A layer
  ** that reads another's K/V has no cache of its own. */
  int32_t kv_shared_from;
};

struct tsr_gguf; /* the host's validated GGUF reader, read through host calls */

struct tsr_convert; /* the host's context for one `tessera convert` run */
struct tsr_kv_cache; /* the host's KV cache */

/* One forward pass over a batch of tokens, all positions attending causally
** to the batch itself (whole-sequence prefill), or with a KV cache to every
** earlier position of their sequence. The host fills the inputs; the arch
** appends ops and sets the outputs. */
struct tsr_arch_forward {
  uint32_t struct_size;
  struct tsr_graph *g;
  const struct tsr_gguf *model;   /* weights are bound through host->weight */
  int32_t n_tokens;
  struct tsr_tensor *tokens;      /* i32 [n_tokens], filled by the host */
  struct tsr_tensor *positions;   /* i32 [n_tokens], filled by the host */
  const struct tsr_attention_v1 *attention; /* the negotiated implementation */
  const struct tsr_arch_layer *layers;      /* describe()'s plan */
  int32_t n_layers;
  /* outputs */
  struct tsr_tensor *logits;      /* f32 [n_vocab, n_tokens] (n_out: output_rows) */
  struct tsr_tensor **hidden;     /* when not NULL: n_layers slots for the f32
                                  ** [n_embd, n_tokens] residual after each layer */
  struct tsr_tensor *embed;       /* optional: the scaled input embedding */
  /* With a KV cache (kv NULL: whole-sequence prefill over the batch alone):
  ** the batch holds the next positions of sequence seq (-1: of several
  ** sequences, never for a model with linear layers), and attention reads
  ** every earlier position of its sequence through the cache
  ** (host->kv_attend); linear layers carry their state (host->kv_state).
  ** Host-filled inputs: */
  struct tsr_kv_cache *kv;
  int32_t seq;
  struct tsr_tensor *kv_cells[2]; /* i32 [n_tokens]: the batch's cells per pool (full, sliding) */
  struct tsr_tensor *kv_pos[2];   /* i32 [cells]: each cell's position, -1 when empty
                                  ** or (one sequence) held by another sequence */
  struct tsr_tensor *kv_mask[2];  /* seq -1: f32 [cells, n_tokens], which cells each
                                  ** token's sequence holds (0 or -inf); else NULL */
  /* Appended: the implementation each layer kind negotiated (profile
  ** `attention: {full: .., sliding: ..}`); a NULL entry means `attention`.
  ** Archs reach them through host->attn_rope and host->attn_build. */
  const struct tsr_attention_v1 *attention_kind[TSR_LAYER_KIND_COUNT];
  /* Appended. Set by build: the final-normed hidden state the LM head reads,
  ** f32 [n_embd, n_tokens] (what a NextN / MTP head takes). For build_nextn,
  ** filled by the host: that hidden state of the trunk at each entry's
  ** position, f32 [n_embd, n_tokens]. */
  struct tsr_tensor *hidden_final;
  struct tsr_tensor *nextn_hidden;
  /* Appended, for a drafter (layers with kv_shared_from -1, e.g.
  ** gemma4-assistant), filled by the host: the paired target model (its
  ** token embedding), and per pool (0 full, 1 sliding) the K/V of the target
  ** layer the drafter's layers of that kind read, [D, n_kv, Hkv] as
  ** attention takes them, with each key's position (i32 [n_kv]).
  ** nextn_hidden holds the target's hidden state; build sets hidden_final
  ** to the state the next draft step takes. */
  const struct tsr_gguf *target;
  struct tsr_tensor *target_k[2], *target_v[2], *target_kv_pos[2];
  /* Appended, filled by the host when it reads the logits of only some tokens
  ** (a prefill reads the last): i32 [n_out], their indices in the batch. The
  ** arch may then take those rows of the last residual before the LM head
  ** (tsr_arch_output_rows), so logits (and hidden_final) are [.., n_out] in
  ** this order; an arch that ignores it returns every token's row. */
  struct tsr_tensor *output_rows;
  /* ABI 1.1, filled by the host: each layer's decode parameters (n_layers
  ** entries; NULL where none), which host->attn_build hands to the layer's
  ** attention on a decode step. */
  const struct tsr_decode_params *const *decode;
};

/* One context shift (host->kv_shift_k / kv_shift_store): every cell of one
** sequence whose position moves by `delta` (the same for all of them) must
** have its stored keys rotated by delta, because K is cached after RoPE. The
** host fills it; the arch reads g, model, layers and delta and hands the
** struct back to the two host calls. The fields after `delta` are the host's. */
struct tsr_kv_shift {
  uint32_t struct_size;
  struct tsr_graph *g;
  const struct tsr_gguf *model;
  const struct tsr_arch_layer *layers;
  int32_t n_layers;
  int32_t seq;
  int32_t delta;                /* position change of every moved cell (-n_discard) */
  /* host-private */
  struct tsr_kv_cache *kv;
  int32_t n_cells[2];           /* moved cells per pool (full, sliding) */
  const int32_t *cells[2];      /* the moved cells, repeated once per kv head ([n, heads]) */
  const int32_t *delta_pos[2];  /* n_cells[pool] copies of delta */
  int32_t max_heads;            /* the most kv heads of any layer: cells[] holds that many */
  /* appended: each moved cell's position before the shift (n_cells[pool]
  ** of them; NULL: not given), and the attention each layer kind uses (NULL
  ** entries: one that does not rotate keys itself) */
  const int32_t *pos[2];
  const struct tsr_attention_v1 *attention_kind[TSR_LAYER_KIND_COUNT];
};

struct tsr_arch_v1 {
  uint32_t struct_size;
  const char *names; /* comma-separated general.architecture values: "qwen3,qwen3moe" */
  void *ctx;
  /* Reads hyperparameters and fills one entry per layer (layers has room
  ** for n_layers_max). Errors name the key or tensor. */
  tsr_status (*describe)(void *ctx, const struct tsr_host *host, const struct tsr_gguf *model,
                         struct tsr_arch_layer *layers, int32_t n_layers_max,
                         int32_t *n_layers);
  /* Conversion from a Hugging Face checkpoint (tessera convert), or NULL.
  ** hf_types: comma-separated config.json "model_type" values it converts
  ** ("qwen3,qwen3_moe"). convert() writes llama.cpp's architecture string,
  ** keys, tensor names and layouts through the host's hf_* / out_* calls,
  ** so files interchange with llama.cpp both ways. */
  const char *hf_types;
  tsr_status (*convert)(void *ctx, const struct tsr_host *host, struct tsr_convert *cv);
  /* Appends the forward pass of one batch of tokens to fw->g (see struct
  ** tsr_arch_forward), or NULL when the arch cannot run models yet. */
  tsr_status (*build)(void *ctx, const struct tsr_host *host, struct tsr_arch_forward *fw);
  /* Appended (read only within the plugin's struct_size). NULL: the arch
  ** cannot shift a context and the host refuses to. Appends to sh->g, for
  ** every attention layer that owns K, the re-rotation of its moved cells'
  ** keys by sh->delta with that layer's RoPE parameters: k = host->kv_shift_k(..) (f32), rope(k, delta_pos), then
  ** host->kv_shift_store(..) (back in the cache's codec). RoPE is a rotation,
  ** so rotating a key stored at p by delta gives the key at p + delta. An
  ** arch whose layers do not rotate by position alone (e.g. per-layer state)
  ** returns TSR_ERR_UNSUPPORTED with a message. */
  tsr_status (*shift_keys)(void *ctx, const struct tsr_host *host, struct tsr_kv_shift *sh);
  /* Appended. The built-in chat template ("chatml", "gemma", "gemma4") a model of
  ** general.architecture `arch` is trained with, used when its GGUF carries no
  ** tokenizer.chat_template; NULL (or a NULL hook): none known. */
  const char *(*chat_template)(void *ctx, const char *arch);
  /* Appended. The NextN / MTP head a speculator drafts with (Qwen3.5
  ** nextn_predict_layers), or NULL: none. Appends to fw->g one pass of the
  ** head over fw->n_tokens entries: entry i holds token tokens[i], the
  ** trunk's hidden_final at position positions[i] (fw->nextn_hidden) and
  ** predicts the token after tokens[i]; attention runs over the entries
  ** (fw->kv NULL) or through the cache's NextN layer. Sets fw->logits. A
  ** model without a NextN block is TSR_ERR_UNSUPPORTED naming the key. */
  tsr_status (*build_nextn)(void *ctx, const struct tsr_host *host, struct tsr_arch_forward *fw);
  /* ABI 1.1. Checks that the file is one consistent model, after describe()
  ** and before anything is built: each hyperparameter against the tensor
  ** shapes it implies (host->check_weight), every tensor a layer needs
  ** present and each optional one in every layer of its kind or in none
  ** (host->check_layer_weights), float hyperparameters in range
  ** (host->gguf_f32_positive). Errors name the key or tensor, what was
  ** expected and what was found. NULL: only the host's own checks (every
  ** float under "<arch>." finite; tensors no graph reads are warned of). */
  tsr_status (*validate)(void *ctx, const struct tsr_host *host, const struct tsr_gguf *model,
                         const struct tsr_arch_layer *layers, int32_t n_layers);
};

/* ---- decode_policy, version 1 ------------------------------------------ */

struct tsr_decode_policy_v1 {
  uint32_t struct_size;
  const char *name;
  void *ctx;
  /* Whether the policy can act on this layer with this attention
  ** implementation (e.g. needs v_skip). */
  tsr_status (*negotiate)(void *ctx, const struct tsr_layer_desc *layer,
                          const struct tsr_attention_v1 *attention);
  /* ABI 1.1: its parameters for the layer (p arrives zeroed but for struct_size
  ** and counters; leaving it so keeps the policy off the layer). Two policies
  ** setting the same parameter of a layer are refused. */
  tsr_status (*params)(void *ctx, const struct tsr_layer_desc *layer,
                       struct tsr_decode_params *p);
};

/* ---- speculator, version 1 --------------------------------------------- */

/* One draft the host asks of a speculator (ABI 1.1). */
struct tsr_spec_request {
  uint32_t struct_size;
  int32_t seq;
  /* the sequence so far; the last token is the one about to be evaluated */
  const int32_t *tokens;
  int32_t n_tokens;
  /* the target's final hidden row (what its LM head read) at the last position it
  ** evaluated, n_embd floats; NULL when the arch exports none */
  const float *hidden;
  int32_t n_embd;
  int32_t max_draft;   /* propose at most this many tokens */
  int32_t *draft;      /* out: the proposed tokens, following tokens[n_tokens - 1] */
};

struct tsr_speculator_v1 {
  uint32_t struct_size;
  const char *name;
  void *ctx;
  /* Whether it can speculate for this model (e.g. needs a NextN head). */
  tsr_status (*negotiate)(void *ctx, const struct tsr_host *host, const struct tsr_gguf *model);
  /* ABI 1.1 (speculator version 2). Proposes up to r->max_draft tokens (*n_draft,
  ** 0 when it has none). The host evaluates the last token and the proposals in one
  ** batch and keeps the longest prefix the target's own sampling agrees with, then
  ** its token at the first disagreement: the drafter is taken as certain of each
  ** proposal, which makes this exact speculative sampling for a deterministic
  ** drafter and greedy verification at temperature 0. The cache is rolled back
  ** past what was kept. */
  tsr_status (*draft)(void *ctx, const struct tsr_host *host, struct tsr_spec_request *r,
                      int32_t *n_draft);
  /* How many of its last proposals the target kept, so a drafter with state of
  ** its own can advance or roll it back; may be NULL. */
  void (*accepted)(void *ctx, int32_t seq, int32_t n_accepted);
};

/* ---- host services ----------------------------------------------------- */

enum tsr_log_level { TSR_LOG_DEBUG = 0, TSR_LOG_INFO = 1, TSR_LOG_WARN = 2, TSR_LOG_ERROR = 3 };

/* What a kernel registered for a device backend ("cuda") gets from
** host->device_call() while the backend calls it (appended in ABI 1.0's
** growth; check host->struct_size before reading device_call). */
struct tsr_device_call {
  uint32_t struct_size;
  const char *backend; /* "cuda" */
  int32_t device;      /* the device ordinal: cudaSetDevice(device) before launching */
  void *stream;        /* the cudaStream_t to enqueue on; the kernel never synchronizes it */
  int32_t status;      /* the kernel sets a tsr_status here (and host->set_error) when a
                       ** launch fails; the backend then fails the node with that message */
  /* Appended later (check struct_size): how a CUDA graph holds this call, which only a
  ** kernel declared replayable (host->declare_replayable) sees as other than EAGER:
  **   TSR_DEVICE_CALL_CAPTURE  the launches are being captured: enqueue them as usual
  **                            but do no host-side bookkeeping (host->engaged counts);
  **   TSR_DEVICE_CALL_REPLAY   the captured launches are being replayed: enqueue
  **                            nothing, do only the bookkeeping of a call.
  ** The backend makes one bookkeeping call per node and compute (a replay after a
  ** successful capture too; a capture that fails runs its nodes eagerly), so counters
  ** read the same with graphs on or off. Eight bytes: a 4-byte field would lie in the
  ** padding after status, which the struct_size of a backend built before it counts. */
  int64_t graph;
  /* Appended later (check struct_size; tsr_device_call_attn reads them): the backend's
  ** choices for the attention kernels a plugin may launch itself
  ** (tessera/cuda_attn_tile.cuh), as the backend's own attention takes them: the
  ** profile's backend.attention.pipeline (0, 1), .decode (0 tile, 1 gqa, 2 gqa_staged;
  ** TSR_ATTN_GQA_DECODE_DEFAULT), .split_keys (0: default). */
  int32_t attn_pipelined, attn_gqa_decode, attn_split_keys, attn_reserved;
};

/* Decode attention's default kernel: the GQA decode kernel, staged where its rows allow
** (backend.attention.decode gqa_staged; tessera/cuda_attn_gqa.cuh). */
enum { TSR_ATTN_GQA_DECODE_DEFAULT = 2 };

enum { TSR_DEVICE_CALL_EAGER = 0, TSR_DEVICE_CALL_CAPTURE = 1, TSR_DEVICE_CALL_REPLAY = 2 };

/* How a CUDA graph holds a device call (struct tsr_device_call.graph); EAGER for a
** call from a backend built before the field. */
static inline int64_t tsr_device_call_graph(const struct tsr_device_call *call) {
  if (!call || call->struct_size < offsetof(struct tsr_device_call, graph) + sizeof call->graph)
    return TSR_DEVICE_CALL_EAGER;
  return call->graph;
}

/* The backend's attention choices of a call (struct tsr_device_call.attn_*); the defaults
** for a call from a backend built before the fields. */
static inline void tsr_device_call_attn(const struct tsr_device_call *call, int32_t *pipelined,
                                        int32_t *gqa_decode, int32_t *split_keys) {
  *pipelined = *split_keys = 0;
  *gqa_decode = TSR_ATTN_GQA_DECODE_DEFAULT;
  if (!call || call->struct_size < offsetof(struct tsr_device_call, attn_reserved) +
                                       sizeof call->attn_reserved)
    return;
  *pipelined = call->attn_pipelined, *gqa_decode = call->attn_gqa_decode;
  *split_keys = call->attn_split_keys;
}

/* A kernel of a plugin-defined op for one backend. */
typedef void (*tsr_plugin_kernel_fn)(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                                     const struct tsr_tensor_info *src, int n_src,
                                     const int32_t *params);

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

#endif /* TESSERA_PLUGIN_H */
