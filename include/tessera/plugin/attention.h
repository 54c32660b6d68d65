/*
** tessera plugin ABI: the attention interface.
*/
#ifndef TESSERA_PLUGIN_ATTENTION_H
#define TESSERA_PLUGIN_ATTENTION_H

#include "tessera/plugin/abi.h"
#include "tessera/plugin/decode_policy.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- attention, version 1 ---------------------------------------------- */

struct tsr_attn_rope;

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
  /* The layer's RoPE (struct tsr_attn_rope), or NULL when it has
  ** none. For an implementation that rotates (tsr_attention_v1.rotates) q
  ** arrives unrotated and k holds what its prepare_k stored; for any other,
  ** both are already rotated at their positions. */
  const struct tsr_attn_rope *rope;
  /* For an implementation that rotates: the K codec's query
  ** transform (tsr_kv_codec_v1.prepare_q), which it applies to every q it
  ** positions, before reading keys: q = call->prepare_q(call, g, q) (f32,
  ** head dim first, any layout; the result is contiguous with head dim
  ** head_dim_k of the layer desc). NULL: the K codec has none, or the host
  ** applied it already (an implementation that does not rotate gets q
  ** transformed). */
  struct tsr_tensor *(*prepare_q)(const struct tsr_attn_call *call, struct tsr_graph *g,
                                  struct tsr_tensor *q);
  const void *prepare_q_ctx; /* the host's */
  /* The layer's decode parameters on a decode step, for an attention that
  ** honours them; NULL otherwise */
  const struct tsr_decode_params *decode;
};

/* How an arch rotates one attention layer's q and k by position, so that an
** implementation that places keys itself (rotates keys, and queries, at
** positions other than their own) rotates them exactly as the arch would,
** only at positions of its choosing. The core's rope: angle
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
  int32_t n_ctx_train; /* the context length it was trained at */
  /* The model file the layer is read from, and the prefix of its keys
  ** (general.architecture: "qwen2" for qwen2.context_length), so that an
  ** implementation reads keys of its own there (host->gguf) without the arch
  ** knowing them. Both NULL where the arch names none; valid for the call. */
  const struct tsr_gguf *model;
  const char *arch;
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
  /* rotates: this implementation positions q and k itself from
  ** call->rope. The arch then hands it q before RoPE (host->arch->attn_rope returns
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
  /* An implementation that rotates applies tsr_attn_call.prepare_q
  ** to the queries it positions; without this the host refuses a K codec
  ** with a query transform under it, naming both. */
  bool applies_prepare_q;
  /* Whether its kernels for this layer (its backend, its codecs) act on
  ** tsr_attn_call.decode; NULL or false: the host refuses a decode policy on the
  ** layer, naming both. */
  bool (*honours_decode)(void *ctx, const struct tsr_layer_desc *layer);
  /* ABI 2.2 */
  /* Its kernels also act on tsr_decode_params.v_skip_budget where they honour decode
  ** parameters (two passes over the keys); false: the host refuses a budget on it. */
  bool v_skip_budget;
};

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_PLUGIN_ATTENTION_H */
