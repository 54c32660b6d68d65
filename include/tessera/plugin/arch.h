/*
** tessera plugin ABI: the arch interface, a model architecture.
*/
#ifndef TESSERA_PLUGIN_ARCH_H
#define TESSERA_PLUGIN_ARCH_H

#include "tessera/plugin/abi.h"
#include "tessera/plugin/attention.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- arch, version 1 ----------------------------------------------------- */

/* One layer of the model as the arch sees it. An array element, so its
** layout is fixed for the whole of ABI major 2 (no appended fields). */
struct tsr_arch_layer {
  enum tsr_layer_kind kind;
  int32_t n_head, n_head_kv, head_dim_k, head_dim_v, window;
  int64_t state_bytes; /* LINEAR: recurrent state per sequence; else 0 */
  /* 0: the layer owns its K/V; j+1: it reads layer j's (KV sharing, e.g.
  ** Gemma 4 E2B); -1: it reads the paired target model's (drafters). A layer
  ** that reads another's K/V has no cache of its own. */
  int32_t kv_shared_from;
};


/* One forward pass over a batch of tokens, all positions attending causally
** to the batch itself (whole-sequence prefill), or with a KV cache to every
** earlier position of their sequence. The host fills the inputs; the arch
** appends ops and sets the outputs. */
struct tsr_arch_forward {
  uint32_t struct_size;
  struct tsr_graph *g;
  const struct tsr_gguf *model; /* weights are bound through host->graph->weight */
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
  ** (host->arch->kv_attend); linear layers carry their state (host->arch->kv_state).
  ** Host-filled inputs: */
  struct tsr_kv_cache *kv;
  int32_t seq;
  struct tsr_tensor *kv_cells[2]; /* i32 [n_tokens]: the batch's cells per pool (full, sliding) */
  struct tsr_tensor *kv_pos[2];   /* i32 [cells]: each cell's position, -1 when empty
                                  ** or (one sequence) held by another sequence */
  struct tsr_tensor *kv_mask[2];  /* seq -1: f32 [cells, n_tokens], which cells each
                                  ** token's sequence holds (0 or -inf); else NULL */
  /* The implementation each layer kind negotiated (profile
  ** `attention: {full: .., sliding: ..}`); a NULL entry means `attention`.
  ** Archs reach them through host->arch->attn_rope and host->arch->attn_build. */
  const struct tsr_attention_v1 *attention_kind[TSR_LAYER_KIND_COUNT];
  /* Set by build: the final-normed hidden state the LM head reads,
  ** f32 [n_embd, n_tokens] (what a NextN / MTP head takes). For build_nextn,
  ** filled by the host: that hidden state of the trunk at each entry's
  ** position, f32 [n_embd, n_tokens]. */
  struct tsr_tensor *hidden_final;
  struct tsr_tensor *nextn_hidden;
  /* For a drafter (layers with kv_shared_from -1, e.g.
  ** gemma4-assistant), filled by the host: the paired target model (its
  ** token embedding), and per pool (0 full, 1 sliding) the K/V of the target
  ** layer the drafter's layers of that kind read, [D, n_kv, Hkv] as
  ** attention takes them, with each key's position (i32 [n_kv]).
  ** nextn_hidden holds the target's hidden state; build sets hidden_final
  ** to the state the next draft step takes. */
  const struct tsr_gguf *target;
  struct tsr_tensor *target_k[2], *target_v[2], *target_kv_pos[2];
  /* Filled by the host when it reads the logits of only some tokens
  ** (a prefill reads the last): i32 [n_out], their indices in the batch. The
  ** arch may then take those rows of the last residual before the LM head
  ** (tsr_arch_output_rows), so logits (and hidden_final) are [.., n_out] in
  ** this order; an arch that ignores it returns every token's row. */
  struct tsr_tensor *output_rows;
  /* Filled by the host: each layer's decode parameters (n_layers
  ** entries; NULL where none), which host->arch->attn_build hands to the layer's
  ** attention on a decode step. */
  const struct tsr_decode_params *const *decode;
  /* Filled by the host: > 0 when this batch (one sequence) is a speculation
  ** verify step whose linear layers must keep their state after each token
  ** (host->arch->kv_checkpoints), so a rejected draft rolls back exactly. */
  int32_t checkpoints;
  /* ABI 2.4. Filled by the host: non-zero when hidden_final must hold every
  ** token's row [n_embd, n_tokens] even where output_rows selects the logits'
  ** rows (a speculator reads them all: tsr_speculator_v1.rows). A row-wise final
  ** norm taken before the selection gives the selected rows the same values. */
  int32_t hidden_every_row;
  /* ABI 2.5. Filled by the host for a drafter and read by host->arch->attn_build
  ** alone (an arch leaves them be): the target's cache and, per pool, the target
  ** layer target_k/v[pool] belong to, so that a codec whose rows attention reads
  ** only through its query and output transforms (prepare_q, finish_out)
  ** transforms the drafter's query and output as it does that layer's. */
  struct tsr_kv_cache *target_kv;
  int32_t target_layer[2];
};

/* One context shift (host->arch->kv_shift_k / kv_shift_store): every cell of one
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
  /* Each moved cell's position before the shift (n_cells[pool]
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
  /* Appends the forward pass of one batch of tokens to fw->g (see struct
  ** tsr_arch_forward), or NULL when the arch cannot run models yet. */
  tsr_status (*build)(void *ctx, const struct tsr_host *host, struct tsr_arch_forward *fw);
  /* NULL: the arch
  ** cannot shift a context and the host refuses to. Appends to sh->g, for
  ** every attention layer that owns K, the re-rotation of its moved cells'
  ** keys by sh->delta with that layer's RoPE parameters: k = host->arch->kv_shift_k(..)
  ** (f32), rope(k, delta_pos), then host->arch->kv_shift_store(..) (back in the
  ** cache's codec). RoPE is a rotation,
  ** so rotating a key stored at p by delta gives the key at p + delta. An
  ** arch whose layers do not rotate by position alone (e.g. per-layer state)
  ** returns TSR_ERR_UNSUPPORTED with a message. */
  tsr_status (*shift_keys)(void *ctx, const struct tsr_host *host, struct tsr_kv_shift *sh);
  /* The built-in chat template ("chatml", "gemma", "gemma4") a model of
  ** general.architecture `arch` is trained with, used when its GGUF carries no
  ** tokenizer.chat_template; NULL (or a NULL hook): none known. */
  const char *(*chat_template)(void *ctx, const char *arch);
  /* The NextN / MTP head a speculator drafts with (Qwen3.5
  ** nextn_predict_layers), or NULL: none. Appends to fw->g one pass of the
  ** head over fw->n_tokens entries: entry i holds token tokens[i], the
  ** trunk's hidden_final at position positions[i] (fw->nextn_hidden) and
  ** predicts the token after tokens[i]; attention runs over the entries
  ** (fw->kv NULL) or through the cache's NextN layer. Sets fw->logits and
  ** fw->hidden_final (the head's final-normed output, which a deeper draft step
  ** takes as its hidden state), both of the output_rows entries when the host
  ** gives them. A model without a NextN block is TSR_ERR_UNSUPPORTED naming the key. */
  tsr_status (*build_nextn)(void *ctx, const struct tsr_host *host, struct tsr_arch_forward *fw);
  /* Checks that the file is one consistent model, after describe()
  ** and before anything is built: each hyperparameter against the tensor
  ** shapes it implies (host->gguf->check_weight), every tensor a layer needs
  ** present and each optional one in every layer of its kind or in none
  ** (host->gguf->check_layer_weights), float hyperparameters in range
  ** (host->gguf->f32_positive). Errors name the key or tensor, what was
  ** expected and what was found. NULL: only the host's own checks (every
  ** float under "<arch>." finite; tensors no graph reads are warned of). */
  tsr_status (*validate)(void *ctx, const struct tsr_host *host, const struct tsr_gguf *model,
                         const struct tsr_arch_layer *layers, int32_t n_layers);
};

/* host->arch: what an arch's forward pass and context shift ask of the host's
** KV cache and of the negotiated attention. */
struct tsr_host_arch {
  uint32_t struct_size;
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
  /* A linear layer's checkpoints for this batch: f32 [n_floats, n_tokens] whose
  ** row t the layer's ops fill with its state after token t, laid out as its
  ** kv_state slot; NULL (no error) when the batch keeps none (fw->checkpoints 0). */
  struct tsr_tensor *(*kv_checkpoints)(struct tsr_arch_forward *fw, int32_t layer,
                                       int64_t n_floats);
  /* Attention that positions keys itself (struct tsr_attn_rope). An arch
  ** describes each attention layer's RoPE and lets the host rotate:
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
  /* Context shift (struct tsr_kv_shift): the K of an owning attention layer's
  ** moved cells as f32 [head_dim_k, n_head_kv, n] (the layout rope takes, a
  ** view over get_rows of the cache), and delta_pos, an i32 [n] position tensor
  ** holding sh->delta n times. n can be 0 (the layer's pool moved nothing):
  ** then *k and *delta_pos are NULL and the result is TSR_OK. A layer that owns
  ** no K is an error. */
  tsr_status (*kv_shift_k)(struct tsr_kv_shift *sh, int32_t layer, struct tsr_tensor **k,
                           struct tsr_tensor **delta_pos);
  /* k (from kv_shift_k) rotated by delta_pos as rope says, or re-positioned by
  ** the layer's attention when it rotates keys itself; hand the result to
  ** kv_shift_store. NULL with the graph's error set when the shift cannot be
  ** exact. */
  struct tsr_tensor *(*kv_shift_rope)(struct tsr_kv_shift *sh, int32_t layer,
                                      const struct tsr_attn_rope *rope, struct tsr_tensor *k,
                                      struct tsr_tensor *delta_pos);
  /* writes k (f32 [head_dim_k, n_head_kv, n], views allowed) back into the
  ** same cells of the layer's K, encoded in its codec */
  tsr_status (*kv_shift_store)(struct tsr_kv_shift *sh, int32_t layer, struct tsr_tensor *k);
};

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_PLUGIN_ARCH_H */
