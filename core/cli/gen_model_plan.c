/*
** What a generated model holds: the keys and tensors the arch plugins read
** (llama.cpp's names and shapes, as `tessera convert` writes them), and the
** dtype of each tensor.
**
** Types. A plain type (f32, f16, bf16, q8_0, q4_0, q4_K, ...) goes to every
** matrix; q4_K_M is llama.cpp's mix (src/llama-quant.cpp,
** llama_tensor_get_type_impl, as of 2025), applied to the names below:
**   - not quantized: 1-D tensors (norms, scales, rope_freqs) and the MoE
**     router ffn_gate_inp.weight stay f32, as llama.cpp's converter writes
**     them and its quantizer leaves them;
**   - output.weight, or token_embd.weight when the head is tied to it: q6_K
**     (q8_0 when a row is not a multiple of 256);
**   - attn_v.weight: q6_K when use_more_bits(i, n) over the attn_v tensors in
**     layer order (i-th of n; k_eq_v full layers have none), else q4_K;
**   - ffn_down* (the dense ffn_down and the experts' ffn_down_exps alike):
**     q6_K when use_more_bits(layer, n_layer), else q4_K;
**   - everything else q4_K (attn_q/k/output, ffn_gate/up, the experts'
**     gate/up, an untied token_embd);
**   where use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2,
**   then llama.cpp's fallback for rows that are not a multiple of 256:
**   q4_K -> q5_0, q6_K -> q8_0 (f16 if not even a multiple of 32). Gemma 4
**   26B-A4B's ffn_down (2112) and ffn_down_exps (704) take that fallback.
** A plain type refuses a tensor whose rows it cannot hold (no silent change).
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "gen_model.h"

/* ---- the tensor list ---------------------------------------------------- */

static tsr_status push(struct gen_plan *p, const char *name, uint32_t n_dims, const int64_t *ne,
                       enum gen_fill fill, float value) {
  if (p->n == p->cap) {
    int cap = p->cap ? 2 * p->cap : 256;
    struct gen_tensor *t = realloc(p->t, (size_t)cap * sizeof *t);
    if (!t) return tsr_error_set(TSR_ERR_NOMEM, "gen-model: out of memory");
    p->t = t;
    p->cap = cap;
  }
  struct gen_tensor *t = &p->t[p->n++];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->n_dims = n_dims;
  for (int d = 0; d < TSR_GGUF_MAX_DIMS; d++) t->ne[d] = d < (int)n_dims ? ne[d] : 1;
  t->fill = fill;
  t->value = value;
  return TSR_OK;
}

/* A random matrix {ne0, ne1[, ne2]}: rows of ne0 (the fan-in) elements. */
static tsr_status mat(struct gen_plan *p, const struct gen_shape *s, const char *name,
                      int64_t ne0, int64_t ne1, int64_t ne2) {
  int64_t ne[3] = {ne0, ne1, ne2};
  tsr_status st = push(p, name, ne2 > 1 ? 3 : 2, ne, GEN_NORMAL, 0);
  if (st == TSR_OK) p->t[p->n - 1].std = s->std > 0 ? s->std : 1.0f / sqrtf((float)ne0);
  return st;
}

/* A vector of one value: norm weights, scales. */
static tsr_status vec(struct gen_plan *p, const char *name, int64_t n, float value) {
  return push(p, name, 1, (int64_t[]){n}, GEN_CONST, value);
}

#define LNAME(buf, l, suffix) (snprintf(buf, sizeof buf, "blk.%d." suffix, l), buf)

/* Gemma 4's layer kinds: every swa_period-th layer is full, and the last one
** (transformers' layer_types default; a --layers cut keeps a full layer). */
static bool gemma4_slides(const struct gen_shape *s, int l) {
  return l != s->n_layer - 1 && l % s->swa_period != s->swa_period - 1;
}

#define TRY(x) do { if (st == TSR_OK) st = (x); } while (0)

static tsr_status plan_qwen3(const struct gen_shape *s, struct gen_plan *p) {
  const int64_t e = s->n_embd, q = (int64_t)s->n_head * s->head_dim,
                kv = (int64_t)s->n_head_kv * s->head_dim;
  char n[TSR_GGUF_MAX_NAME];
  tsr_status st = mat(p, s, "token_embd.weight", e, s->n_vocab, 1);
  for (int l = 0; l < s->n_layer && st == TSR_OK; l++) {
    TRY(vec(p, LNAME(n, l, "attn_norm.weight"), e, 1));
    TRY(mat(p, s, LNAME(n, l, "attn_q.weight"), e, q, 1));
    TRY(mat(p, s, LNAME(n, l, "attn_k.weight"), e, kv, 1));
    TRY(mat(p, s, LNAME(n, l, "attn_v.weight"), e, kv, 1));
    TRY(vec(p, LNAME(n, l, "attn_q_norm.weight"), s->head_dim, 1));
    TRY(vec(p, LNAME(n, l, "attn_k_norm.weight"), s->head_dim, 1));
    TRY(mat(p, s, LNAME(n, l, "attn_output.weight"), q, e, 1));
    TRY(vec(p, LNAME(n, l, "ffn_norm.weight"), e, 1));
    if (s->n_expert > 0) {
      /* experts stacked along ne[2]: {H, I, E} and {I, H, E}; the router {H, E} */
      TRY(mat(p, s, LNAME(n, l, "ffn_gate_inp.weight"), e, s->n_expert, 1));
      TRY(mat(p, s, LNAME(n, l, "ffn_gate_exps.weight"), e, s->n_ff_exp, s->n_expert));
      TRY(mat(p, s, LNAME(n, l, "ffn_up_exps.weight"), e, s->n_ff_exp, s->n_expert));
      TRY(mat(p, s, LNAME(n, l, "ffn_down_exps.weight"), s->n_ff_exp, e, s->n_expert));
    } else {
      TRY(mat(p, s, LNAME(n, l, "ffn_gate.weight"), e, s->n_ff, 1));
      TRY(mat(p, s, LNAME(n, l, "ffn_up.weight"), e, s->n_ff, 1));
      TRY(mat(p, s, LNAME(n, l, "ffn_down.weight"), s->n_ff, e, 1));
    }
  }
  TRY(vec(p, "output_norm.weight", e, 1));
  if (!s->tied) TRY(mat(p, s, "output.weight", e, s->n_vocab, 1));
  return st;
}

static tsr_status plan_gemma4(const struct gen_shape *s, struct gen_plan *p) {
  const int64_t H = s->n_embd, E = s->n_expert, I = s->n_ff_exp;
  char n[TSR_GGUF_MAX_NAME];
  /* per pair of a full head: 1 for the rotary_full share that turns, 1e30 (still) for the rest */
  tsr_status st = push(p, "rope_freqs.weight", 1, (int64_t[]){s->head_dim_full / 2},
                       GEN_ROPE_FREQS, 0);
  if (st == TSR_OK)
    p->t[p->n - 1].n_rot_pairs = (int32_t)lrintf((float)s->head_dim_full * s->rotary_full / 2);
  TRY(mat(p, s, "token_embd.weight", H, s->n_vocab, 1));
  for (int l = 0; l < s->n_layer && st == TSR_OK; l++) {
    const bool swa = gemma4_slides(s, l);
    const int64_t hd = swa ? s->head_dim : s->head_dim_full;
    const int64_t kv = (swa || !s->k_eq_v ? s->n_head_kv : s->n_head_kv_full) * hd;
    const int64_t q = (int64_t)s->n_head * hd;
    TRY(vec(p, LNAME(n, l, "attn_norm.weight"), H, 1));
    TRY(mat(p, s, LNAME(n, l, "attn_q.weight"), H, q, 1));
    TRY(vec(p, LNAME(n, l, "attn_q_norm.weight"), hd, 1));
    TRY(mat(p, s, LNAME(n, l, "attn_k.weight"), H, kv, 1));
    TRY(vec(p, LNAME(n, l, "attn_k_norm.weight"), hd, 1));
    /* k_eq_v: full layers have no v projection, V is the raw K */
    if (swa || !s->k_eq_v) TRY(mat(p, s, LNAME(n, l, "attn_v.weight"), H, kv, 1));
    TRY(mat(p, s, LNAME(n, l, "attn_output.weight"), q, H, 1));
    TRY(vec(p, LNAME(n, l, "post_attention_norm.weight"), H, 1));
    TRY(vec(p, LNAME(n, l, "ffn_norm.weight"), H, 1));
    TRY(mat(p, s, LNAME(n, l, "ffn_gate.weight"), H, s->n_ff, 1));
    TRY(mat(p, s, LNAME(n, l, "ffn_up.weight"), H, s->n_ff, 1));
    TRY(mat(p, s, LNAME(n, l, "ffn_down.weight"), s->n_ff, H, 1));
    TRY(vec(p, LNAME(n, l, "post_ffw_norm.weight"), H, 1));
    if (E > 0) {
      /* the routed experts beside the dense MLP, their norms, router and scales */
      TRY(vec(p, LNAME(n, l, "post_ffw_norm_1.weight"), H, 1));
      TRY(vec(p, LNAME(n, l, "pre_ffw_norm_2.weight"), H, 1));
      TRY(vec(p, LNAME(n, l, "post_ffw_norm_2.weight"), H, 1));
      TRY(mat(p, s, LNAME(n, l, "ffn_gate_inp.weight"), H, E, 1));
      TRY(vec(p, LNAME(n, l, "ffn_gate_inp.scale"), H, 1));
      TRY(vec(p, LNAME(n, l, "ffn_down_exps.scale"), E, 1));
      TRY(mat(p, s, LNAME(n, l, "ffn_gate_up_exps.weight"), H, 2 * I, E));
      TRY(mat(p, s, LNAME(n, l, "ffn_down_exps.weight"), I, H, E));
    }
    TRY(vec(p, LNAME(n, l, "layer_output_scale.weight"), 1, 1));
  }
  TRY(vec(p, "output_norm.weight", H, 1));
  if (!s->tied) TRY(mat(p, s, "output.weight", H, s->n_vocab, 1));
#undef TRY
  return st;
}

tsr_status gen_plan_tensors(const struct gen_shape *s, struct gen_plan *p) {
  if (!strcmp(s->arch, "gemma4")) return plan_gemma4(s, p);
  return plan_qwen3(s, p);
}

void gen_plan_free(struct gen_plan *p) {
  free(p->t);
  memset(p, 0, sizeof *p);
}

/* ---- dtypes --------------------------------------------------------------- */

static bool has(const char *name, const char *part) { return strstr(name, part) != NULL; }

/* llama.cpp's tensor_allows_quantization, for the names this generator writes */
static bool quantizable(const struct gen_tensor *t) {
  size_t len = strlen(t->name);
  return t->n_dims >= 2 && len >= 6 && !strcmp(t->name + len - 6, "weight") &&
         !has(t->name, "_norm.weight") && !has(t->name, "ffn_gate_inp.weight");
}

static bool use_more_bits(int i, int n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static int layer_of(const char *name) {
  int l = -1;
  return sscanf(name, "blk.%d.", &l) == 1 ? l : -1;
}

/* Rows of 256 for the K types; llama.cpp's tensor_type_fallback otherwise. */
static enum tsr_dtype fallback(enum tsr_dtype dt, int64_t ne0) {
  if (ne0 % tsr_dtype_block_size(dt) == 0) return dt;
  dt = dt == TSR_Q6_K ? TSR_Q8_0 : TSR_Q5_0;
  return ne0 % tsr_dtype_block_size(dt) == 0 ? dt : TSR_F16;
}

tsr_status gen_plan_types(const struct gen_shape *s, const struct gen_type *ty,
                          struct gen_plan *p) {
  int n_attn_v = 0, i_attn_v = 0;
  for (int i = 0; i < p->n; i++) n_attn_v += has(p->t[i].name, "attn_v.weight");
  for (int i = 0; i < p->n; i++) {
    struct gen_tensor *t = &p->t[i];
    enum tsr_dtype dt = TSR_F32;
    if (quantizable(t) && ty->mix == GEN_PLAIN) {
      dt = ty->plain;
      if (t->ne[0] % tsr_dtype_block_size(dt))
        return tsr_error_set(TSR_ERR_INVALID_ARG,
                             "gen-model: tensor %s has rows of %lld, not a multiple of %s's "
                             "block size %lld; pick another --type (q4_K_M falls back as "
                             "llama.cpp does)", t->name, (long long)t->ne[0],
                             tsr_dtype_name(dt), (long long)tsr_dtype_block_size(dt));
    } else if (quantizable(t)) { /* q4_K_M */
      const bool head = !strcmp(t->name, "output.weight") ||
                        (s->tied && !strcmp(t->name, "token_embd.weight"));
      dt = TSR_Q4_K;
      if (head) {
        dt = t->ne[0] % 256 ? TSR_Q8_0 : TSR_Q6_K;
      } else if (has(t->name, "attn_v.weight")) {
        if (use_more_bits(i_attn_v, n_attn_v)) dt = TSR_Q6_K;
        i_attn_v++;
      } else if (has(t->name, "ffn_down")) {
        if (use_more_bits(layer_of(t->name), s->n_layer)) dt = TSR_Q6_K;
      }
      dt = fallback(dt, t->ne[0]);
    }
    t->dtype = dt;
    t->bytes = tsr_dtype_row_size(dt, t->ne[0]) * (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
  }
  return TSR_OK;
}

int gen_file_type(const struct gen_type *t) {
  if (t->mix == GEN_Q4_K_M) return 15; /* LLAMA_FTYPE_MOSTLY_Q4_K_M */
  /* the K types' "_S" file types are the closest llama.cpp has to a plain K type */
  static const struct { enum tsr_dtype dt; int ftype; } map[] = {
      {TSR_F32, 0}, {TSR_F16, 1}, {TSR_Q4_0, 2}, {TSR_Q4_1, 3}, {TSR_Q8_0, 7},
      {TSR_Q5_0, 8}, {TSR_Q5_1, 9}, {TSR_Q2_K, 10}, {TSR_Q3_K, 11}, {TSR_Q4_K, 14},
      {TSR_Q5_K, 16}, {TSR_Q6_K, 18}, {TSR_BF16, 32},
  };
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
    if (map[i].dt == t->plain) return map[i].ftype;
  return -1;
}

/* ---- keys ----------------------------------------------------------------- */

/* GPT-2's printable stand-ins for the 256 byte values. */
static int byte_to_codepoint(int b) {
  if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
  int n = 0;
  for (int c = 0; c < b; c++)
    if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255))) n++;
  return 256 + n;
}

/* Byte-level BPE over the 256 bytes with no merges (any text round-trips),
** three ChatML specials, the rest of the vocabulary unused. */
static tsr_status add_tokenizer(struct tsr_gguf_writer *w, int n_vocab) {
  static const char *specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  char **tokens = calloc((size_t)n_vocab, sizeof *tokens);
  int32_t *types = calloc((size_t)n_vocab, sizeof *types);
  tsr_status st = (tokens && types) ? TSR_OK : tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  for (int i = 0; st == TSR_OK && i < n_vocab; i++) {
    char buf[32];
    if (i < 256) {
      int cp = byte_to_codepoint(i);
      if (cp < 0x80) buf[0] = (char)cp, buf[1] = 0;
      else buf[0] = (char)(0xc0 | (cp >> 6)), buf[1] = (char)(0x80 | (cp & 0x3f)), buf[2] = 0;
      types[i] = 1; /* normal */
    } else if (i - 256 < 3) {
      snprintf(buf, sizeof buf, "%s", specials[i - 256]);
      types[i] = 3; /* control */
    } else {
      snprintf(buf, sizeof buf, "<|unused_%d|>", i);
      types[i] = 5; /* unused */
    }
    tokens[i] = strdup(buf);
    if (!tokens[i]) st = tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  }
  if (st == TSR_OK) st = tsr_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
  if (st == TSR_OK) st = tsr_gguf_writer_add_str(w, "tokenizer.ggml.pre", "qwen2");
  if (st == TSR_OK)
    st = tsr_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tokens,
                                     (uint64_t)n_vocab);
  if (st == TSR_OK)
    st = tsr_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", TSR_GGUF_I32, types,
                                 (uint64_t)n_vocab);
  if (st == TSR_OK) st = tsr_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", NULL, 0);
  if (st == TSR_OK) st = tsr_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 256);
  if (st == TSR_OK) st = tsr_gguf_writer_add_u32(w, "tokenizer.ggml.padding_token_id", 256);
  if (st == TSR_OK) st = tsr_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", 0);
  for (int i = 0; tokens && i < n_vocab; i++) free(tokens[i]);
  free(tokens);
  free(types);
  return st;
}

struct keys {
  struct tsr_gguf_writer *w;
  const char *arch;
  tsr_status st;
};

static void put_u32(struct keys *k, const char *suffix, int64_t v) {
  char key[96];
  snprintf(key, sizeof key, "%s.%s", k->arch, suffix);
  if (k->st == TSR_OK) k->st = tsr_gguf_writer_add_u32(k->w, key, (uint32_t)v);
}

static void put_f32(struct keys *k, const char *suffix, float v) {
  char key[96];
  snprintf(key, sizeof key, "%s.%s", k->arch, suffix);
  if (k->st == TSR_OK) k->st = tsr_gguf_writer_add_f32(k->w, key, v);
}

static void put_arr(struct keys *k, const char *suffix, enum tsr_gguf_type type, const void *v,
                    int n) {
  char key[96];
  snprintf(key, sizeof key, "%s.%s", k->arch, suffix);
  if (k->st == TSR_OK) k->st = tsr_gguf_writer_add_arr(k->w, key, type, v, (uint64_t)n);
}

/* What tessera convert (and llama.cpp's converter) writes for Gemma 4. */
static void gemma4_keys(struct keys *k, const struct gen_shape *s) {
  int32_t kv[512];
  uint8_t swa[512];
  for (int l = 0; l < s->n_layer; l++) {
    swa[l] = gemma4_slides(s, l);
    kv[l] = swa[l] || !s->k_eq_v ? s->n_head_kv : s->n_head_kv_full;
  }
  put_f32(k, "rope.freq_base_swa", s->rope_base_swa);
  /* per layer when full layers have their own KV head count (k_eq_v) */
  if (s->k_eq_v) put_arr(k, "attention.head_count_kv", TSR_GGUF_I32, kv, s->n_layer);
  else put_u32(k, "attention.head_count_kv", s->n_head_kv);
  put_u32(k, "attention.key_length", s->head_dim_full);
  put_u32(k, "attention.value_length", s->head_dim_full);
  put_u32(k, "attention.key_length_swa", s->head_dim);
  put_u32(k, "attention.value_length_swa", s->head_dim);
  put_f32(k, "final_logit_softcapping", s->softcap);
  put_u32(k, "attention.sliding_window", s->window);
  put_arr(k, "attention.sliding_window_pattern", TSR_GGUF_BOOL, swa, s->n_layer);
  put_u32(k, "attention.shared_kv_layers", 0);
  put_u32(k, "embedding_length_per_layer_input", 0);
  /* full layers rotate "all" dims, rope_freqs stills the ones that do not turn */
  put_u32(k, "rope.dimension_count", s->head_dim_full);
  put_u32(k, "rope.dimension_count_swa", s->head_dim);
}

tsr_status gen_write_keys(struct tsr_gguf_writer *w, const struct gen_shape *s,
                          const struct gen_type *t) {
  struct keys k = {w, s->arch, TSR_OK};
  char name[128];
  snprintf(name, sizeof name, "tessera random %s (%s shape)", s->arch, s->name);
  k.st = tsr_gguf_writer_add_str(w, "general.architecture", s->arch);
  if (k.st == TSR_OK) k.st = tsr_gguf_writer_add_str(w, "general.name", name);
  int ftype = gen_file_type(t);
  if (k.st == TSR_OK && ftype >= 0) k.st = tsr_gguf_writer_add_u32(w, "general.file_type",
                                                                    (uint32_t)ftype);
  const bool quantized = t->mix != GEN_PLAIN || tsr_dtype_block_size(t->plain) > 1;
  if (k.st == TSR_OK && quantized)
    k.st = tsr_gguf_writer_add_u32(w, "general.quantization_version", 2);
  put_u32(&k, "block_count", s->n_layer);
  put_u32(&k, "context_length", s->n_ctx);
  put_u32(&k, "embedding_length", s->n_embd);
  put_u32(&k, "feed_forward_length", s->n_ff);
  put_u32(&k, "attention.head_count", s->n_head);
  put_f32(&k, "rope.freq_base", s->rope_base);
  put_f32(&k, "attention.layer_norm_rms_epsilon", s->eps);
  if (s->n_expert > 0) {
    put_u32(&k, "expert_count", s->n_expert);
    put_u32(&k, "expert_used_count", s->n_expert_used);
    put_u32(&k, "expert_feed_forward_length", s->n_ff_exp);
  }
  if (!strcmp(s->arch, "gemma4")) {
    gemma4_keys(&k, s);
  } else {
    put_u32(&k, "attention.head_count_kv", s->n_head_kv);
    put_u32(&k, "attention.key_length", s->head_dim);
    put_u32(&k, "attention.value_length", s->head_dim);
  }
  if (k.st == TSR_OK) k.st = add_tokenizer(w, s->n_vocab);
  return k.st;
}
