/*
** arch_qwen's converter, tensors: each checkpoint tensor to its llama.cpp
** name and layout, with the hybrids' value transforms (convert_qwen.c says
** which). An HF tensor [a, b] becomes ne {b, a} with the same values;
** shapes are checked against config.json, so a mismatch names the tensor.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert_qwen_internal.h"

/* A checkpoint tensor read as f32, shape outermost first. */
struct buf {
  int32_t nd;
  int64_t shape[4];
  int64_t n;
  float *d;
};

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

static bool has_tensor(const struct qc *q, const char *name) {
  return q->h->convert->hf_tensor_has(q->cv, name) != 0;
}

/* Reads a checkpoint tensor into dst after checking its shape (dims past
** nd are ignored). */
static tsr_status read_into(struct qc *q, const char *name, float *dst, int nd, int64_t s0,
                            int64_t s1, int64_t s2) {
  int32_t got_nd;
  int64_t shape[4];
  tsr_status st = q->h->convert->hf_tensor_shape(q->cv, name, &got_nd, shape);
  if (st != TSR_OK) return st;
  const int64_t want[3] = {s0, s1, s2};
  bool ok = got_nd == nd;
  int64_t n = 1;
  for (int d = 0; d < nd && ok; d++) {
    ok = shape[d] == want[d];
    n *= want[d];
  }
  if (!ok) {
    char got[96] = "", exp[96] = "";
    for (int d = 0; d < got_nd && d < 4; d++)
      snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
               (long long)shape[d]);
    for (int d = 0; d < nd; d++)
      snprintf(exp + strlen(exp), sizeof exp - strlen(exp), "%s%lld", d ? ", " : "",
               (long long)want[d]);
    return q->h->set_error(TSR_ERR_FORMAT, "tensor %s has shape [%s]; config.json implies [%s]",
                           name, got, exp);
  }
  return q->h->convert->hf_tensor_read(q->cv, name, dst, n);
}

static tsr_status load(struct qc *q, const char *name, struct buf *b, int nd, int64_t s0,
                       int64_t s1, int64_t s2) {
  const int64_t s[3] = {s0, s1, s2};
  memset(b, 0, sizeof *b);
  b->nd = nd;
  b->n = 1;
  for (int d = 0; d < nd; d++) {
    b->shape[d] = s[d];
    b->n *= s[d];
  }
  if (!(b->d = malloc((size_t)b->n * sizeof *b->d)))
    return q->h->set_error(TSR_ERR_NOMEM, "out of memory reading %s", name);
  tsr_status st = read_into(q, name, b->d, nd, s0, s1, s2);
  if (st != TSR_OK) {
    free(b->d);
    b->d = NULL;
  }
  return st;
}

/* llama.cpp's rule for what stays f32 whatever the outtype: vectors, norms,
** the routers, the conv kernel, and anything not named *.weight. */
static bool quantizable(const char *name, int nd) {
  return nd > 1 && !ends_with(name, "_norm.weight") && !strstr(name, ".ffn_gate_inp") &&
         !strstr(name, ".ssm_conv1d.") && ends_with(name, ".weight");
}

static tsr_status emit_ne(struct qc *q, const char *name, int nd, const int64_t *ne,
                          const float *data) {
  return q->h->convert->out_tensor(q->cv, name, quantizable(name, nd), nd, ne, data);
}

/* Emits b under name with the reversed (GGUF) shape and frees it. */
static tsr_status emit(struct qc *q, const char *name, struct buf *b) {
  int64_t ne[4];
  for (int d = 0; d < b->nd; d++) ne[d] = b->shape[b->nd - 1 - d];
  tsr_status st = emit_ne(q, name, b->nd, ne, b->d);
  free(b->d);
  b->d = NULL;
  return st;
}

enum { PLAIN = 0, PLUS_ONE = 1 };

/* One checkpoint tensor to one output tensor, the +1 folded in on request. */
static tsr_status pass(struct qc *q, const char *hf, const char *out, int how, int nd, int64_t s0,
                       int64_t s1, int64_t s2) {
  struct buf b;
  tsr_status st = load(q, hf, &b, nd, s0, s1, s2);
  if (st != TSR_OK) return st;
  if (how == PLUS_ONE)
    for (int64_t i = 0; i < b.n; i++) b.d[i] += 1.0f;
  return emit(q, out, &b);
}

/* HF stores a linear layer's V heads grouped by their key head: head g*r+i
** is value head i of key head g (r = Hv/Hk). llama.cpp's qwen35 files use
** tiled order, i*Hk+g, so that key heads repeat by plain tiling. Permutes the
** Hv*d units of `unit` floats at base accordingly. */
static tsr_status tile_heads(struct qc *q, float *base, int64_t unit, int64_t d) {
  int64_t hk = q->hk, r = q->hv / q->hk, n = q->hv * d * unit;
  if (r == 1) return TSR_OK;
  float *tmp = malloc((size_t)n * sizeof *tmp);
  if (!tmp) return q->h->set_error(TSR_ERR_NOMEM, "out of memory");
  memcpy(tmp, base, (size_t)n * sizeof *tmp);
  for (int64_t g = 0; g < hk; g++)
    for (int64_t i = 0; i < r; i++)
      memcpy(base + (i * hk + g) * d * unit, tmp + (g * r + i) * d * unit,
             (size_t)(d * unit) * sizeof *tmp);
  free(tmp);
  return TSR_OK;
}

/* Full (gated in the hybrids) attention. Biases as HF builds them: Qwen2
** always has q/k/v biases and none on o_proj; later Qwens have them all
** when attention_bias says so. */
static tsr_status attention(struct qc *q, int64_t blk, const char *hp) {
  char hn[NAME_LEN], gn[NAME_LEN];
  long long B = (long long)blk;
  int64_t H = q->n_embd, hd = q->head_dim;
  /* the hybrids' q_proj holds [q_h | gate_h] per head */
  int64_t nq = q->n_head * hd * (q->hybrid ? 2 : 1), nkv = q->n_head_kv * hd;
  bool qkv_bias = q->family == QWEN2 || q->attn_bias, o_bias = q->family != QWEN2 && q->attn_bias;
  static const char *const proj[] = {"q", "k", "v"};
  tsr_status st = TSR_OK;
  for (int i = 0; i < 3 && st == TSR_OK; i++) {
    int64_t rows = i ? nkv : nq;
    st = pass(q, qfmt(hn, "%sself_attn.%s_proj.weight", hp, proj[i]),
              qfmt(gn, "blk.%lld.attn_%s.weight", B, proj[i]), PLAIN, 2, rows, H, 0);
    if (st == TSR_OK && qkv_bias)
      st = pass(q, qfmt(hn, "%sself_attn.%s_proj.bias", hp, proj[i]),
                qfmt(gn, "blk.%lld.attn_%s.bias", B, proj[i]), PLAIN, 1, rows, 0, 0);
  }
  if (st == TSR_OK)
    st = pass(q, qfmt(hn, "%sself_attn.o_proj.weight", hp),
              qfmt(gn, "blk.%lld.attn_output.weight", B), PLAIN, 2, H, q->n_head * hd, 0);
  if (st == TSR_OK && o_bias)
    st = pass(q, qfmt(hn, "%sself_attn.o_proj.bias", hp),
              qfmt(gn, "blk.%lld.attn_output.bias", B), PLAIN, 1, H, 0, 0);
  if (q->family == QWEN2) return st;
  for (int i = 0; i < 2 && st == TSR_OK; i++)
    st = pass(q, qfmt(hn, "%sself_attn.%s_norm.weight", hp, proj[i]),
              qfmt(gn, "blk.%lld.attn_%s_norm.weight", B, proj[i]),
              q->hybrid ? PLUS_ONE : PLAIN, 1, hd, 0, 0);
  return st;
}

/* Reads a linear-attention tensor, tiles its V heads (from float `offset`
** on, units of `unit` floats, d units per head), applies how, and emits it
** with ne (NULL: the reversed HF shape). */
enum { AS_IS = 0, NEG_EXP = 1, PER_ROW = 2 };
static tsr_status linear_tensor(struct qc *q, const char *hf, const char *out, int nd, int64_t s0,
                                int64_t s1, int64_t s2, int64_t offset, int64_t unit, int64_t d,
                                int how, const int64_t *ne) {
  struct buf b;
  tsr_status st = load(q, hf, &b, nd, s0, s1, s2);
  if (st != TSR_OK) return st;
  if (how == PER_ROW) /* out_proj: the V heads are its input columns */
    for (int64_t r = 0; r < b.shape[0] && st == TSR_OK; r++)
      st = tile_heads(q, b.d + r * b.shape[1], unit, d);
  else
    st = tile_heads(q, b.d + offset, unit, d);
  if (how == NEG_EXP) /* in double, so the f32 result is the correctly rounded one */
    for (int64_t i = 0; i < b.n; i++) b.d[i] = (float)-exp((double)b.d[i]);
  if (st == TSR_OK && ne) st = emit_ne(q, out, 2, ne, b.d);
  if (st == TSR_OK && !ne) return emit(q, out, &b);
  free(b.d);
  return st;
}

/* A Gated DeltaNet layer (qwen35 family), V heads tiled. */
static tsr_status linear_attention(struct qc *q, int64_t blk, const char *hp) {
  char hn[NAME_LEN], gn[NAME_LEN];
  long long B = (long long)blk;
  int64_t H = q->n_embd, qk = 2 * q->hk * q->dk, vd = q->hv * q->dv, K = q->conv_k;
  /* in_proj_qkv rows: [q (Hk*dk) | k (Hk*dk) | v (Hv*dv)]; only v moves */
  tsr_status st = linear_tensor(q, qfmt(hn, "%slinear_attn.in_proj_qkv.weight", hp),
                                qfmt(gn, "blk.%lld.attn_qkv.weight", B), 2, qk + vd, H, 0, qk * H,
                                H, q->dv, AS_IS, NULL);
  if (st == TSR_OK)
    st = linear_tensor(q, qfmt(hn, "%slinear_attn.in_proj_z.weight", hp),
                       qfmt(gn, "blk.%lld.attn_gate.weight", B), 2, vd, H, 0, 0, H, q->dv, AS_IS,
                       NULL);
  if (st == TSR_OK)
    st = linear_tensor(q, qfmt(hn, "%slinear_attn.in_proj_b.weight", hp),
                       qfmt(gn, "blk.%lld.ssm_beta.weight", B), 2, q->hv, H, 0, 0, H, 1, AS_IS,
                       NULL);
  if (st == TSR_OK)
    st = linear_tensor(q, qfmt(hn, "%slinear_attn.in_proj_a.weight", hp),
                       qfmt(gn, "blk.%lld.ssm_alpha.weight", B), 2, q->hv, H, 0, 0, H, 1, AS_IS,
                       NULL);
  if (st == TSR_OK)
    st = linear_tensor(q, qfmt(hn, "%slinear_attn.A_log", hp), qfmt(gn, "blk.%lld.ssm_a", B), 1,
                       q->hv, 0, 0, 0, 1, 1, NEG_EXP, NULL);
  if (st == TSR_OK)
    st = linear_tensor(q, qfmt(hn, "%slinear_attn.dt_bias", hp),
                       qfmt(gn, "blk.%lld.ssm_dt.bias", B), 1, q->hv, 0, 0, 0, 1, 1, AS_IS, NULL);
  /* [C, 1, K] -> {K, C}; the V channels follow the q and k channels */
  const int64_t conv_ne[2] = {K, qk + vd};
  if (st == TSR_OK)
    st = linear_tensor(q, qfmt(hn, "%slinear_attn.conv1d.weight", hp),
                       qfmt(gn, "blk.%lld.ssm_conv1d.weight", B), 3, qk + vd, 1, K, qk * K, K,
                       q->dv, AS_IS, conv_ne);
  /* linear_attn.norm is a plain x̂·w in HF too: no +1 */
  if (st == TSR_OK)
    st = pass(q, qfmt(hn, "%slinear_attn.norm.weight", hp), qfmt(gn, "blk.%lld.ssm_norm.weight", B),
              PLAIN, 1, q->dv, 0, 0);
  if (st == TSR_OK)
    st = linear_tensor(q, qfmt(hn, "%slinear_attn.out_proj.weight", hp),
                       qfmt(gn, "blk.%lld.ssm_out.weight", B), 2, H, vd, 0, 0, 1, q->dv, PER_ROW,
                       NULL);
  return st;
}

static tsr_status dense_ffn(struct qc *q, int64_t blk, const char *hp, const char *hf_mlp,
                            const char *suffix, int64_t n_ff) {
  char hn[NAME_LEN], gn[NAME_LEN];
  int64_t H = q->n_embd;
  tsr_status st = pass(q, qfmt(hn, "%s%s.gate_proj.weight", hp, hf_mlp),
                       qfmt(gn, "blk.%lld.ffn_gate%s.weight", (long long)blk, suffix), PLAIN, 2,
                       n_ff, H, 0);
  if (st == TSR_OK)
    st = pass(q, qfmt(hn, "%s%s.up_proj.weight", hp, hf_mlp),
              qfmt(gn, "blk.%lld.ffn_up%s.weight", (long long)blk, suffix), PLAIN, 2, n_ff, H, 0);
  if (st == TSR_OK)
    st = pass(q, qfmt(hn, "%s%s.down_proj.weight", hp, hf_mlp),
              qfmt(gn, "blk.%lld.ffn_down%s.weight", (long long)blk, suffix), PLAIN, 2, H, n_ff,
              0);
  return st;
}

/* The rows of one HF tensor's dim 0 (the FFN width of a projection). */
static tsr_status rows_of(struct qc *q, const char *name, int64_t *rows) {
  int32_t nd;
  int64_t shape[4];
  tsr_status st = q->h->convert->hf_tensor_shape(q->cv, name, &nd, shape);
  if (st == TSR_OK) *rows = shape[0];
  return st;
}

/* Routed experts stacked into ffn_{gate,up,down}_exps: {H, I, E} and
** {I, H, E}. Checkpoints store them per expert or fused (gate_up_proj
** [E, 2I, H], the gate half first). */
static tsr_status experts(struct qc *q, int64_t blk, const char *hp) {
  char hn[NAME_LEN], gn[NAME_LEN];
  int64_t H = q->n_embd, E = q->n_expert, I;
  bool fused = has_tensor(q, qfmt(hn, "%smlp.experts.gate_up_proj", hp)) ||
               has_tensor(q, qfmt(hn, "%smlp.experts.gate_up_proj.weight", hp));
  tsr_status st;
  if (fused) {
    int32_t nd;
    int64_t shape[4];
    st = q->h->convert->hf_tensor_shape(q->cv, hn, &nd, shape);
    if (st != TSR_OK) return st;
    I = nd == 3 ? shape[1] / 2 : 0;
  } else if ((st = rows_of(q, qfmt(hn, "%smlp.experts.0.gate_proj.weight", hp), &I)) != TSR_OK) {
    return st;
  }
  if (I < 1) return q->h->set_error(TSR_ERR_FORMAT, "%s: no expert FFN width", hn);
  /* expert_feed_forward_length comes from the config: it must be the tensors' width */
  if (q->n_ff_exp >= 0 && I != q->n_ff_exp)
    return q->h->set_error(TSR_ERR_FORMAT, "tensor %s has an expert FFN width of %lld; "
                           "config.json's moe_intermediate_size is %lld", hn, (long long)I,
                           (long long)q->n_ff_exp);
  int64_t per = I * H;
  float *gate = malloc((size_t)(E * per) * sizeof *gate);
  float *up = malloc((size_t)(E * per) * sizeof *up);
  float *down = malloc((size_t)(E * per) * sizeof *down);
  st = gate && up && down ? TSR_OK : q->h->set_error(TSR_ERR_NOMEM, "out of memory (experts)");
  if (st == TSR_OK && fused) {
    struct buf gu;
    st = load(q, hn, &gu, 3, E, 2 * I, H);
    for (int64_t e = 0; e < E && st == TSR_OK; e++) {
      memcpy(gate + e * per, gu.d + e * 2 * per, (size_t)per * sizeof *gate);
      memcpy(up + e * per, gu.d + e * 2 * per + per, (size_t)per * sizeof *up);
    }
    free(gu.d);
    const char *dn = qfmt(hn, "%smlp.experts.down_proj", hp);
    if (st == TSR_OK && !has_tensor(q, dn)) dn = qfmt(hn, "%smlp.experts.down_proj.weight", hp);
    if (st == TSR_OK) st = read_into(q, dn, down, 3, E, H, I);
  }
  for (int64_t e = 0; e < E && st == TSR_OK && !fused; e++) {
    st = read_into(q, qfmt(hn, "%smlp.experts.%lld.gate_proj.weight", hp, (long long)e),
                   gate + e * per, 2, I, H, 0);
    if (st == TSR_OK)
      st = read_into(q, qfmt(hn, "%smlp.experts.%lld.up_proj.weight", hp, (long long)e),
                     up + e * per, 2, I, H, 0);
    if (st == TSR_OK)
      st = read_into(q, qfmt(hn, "%smlp.experts.%lld.down_proj.weight", hp, (long long)e),
                     down + e * per, 2, H, I, 0);
  }
  const int64_t ne_gu[3] = {H, I, E}, ne_d[3] = {I, H, E};
  if (st == TSR_OK)
    st = emit_ne(q, qfmt(gn, "blk.%lld.ffn_gate_exps.weight", (long long)blk), 3, ne_gu, gate);
  if (st == TSR_OK)
    st = emit_ne(q, qfmt(gn, "blk.%lld.ffn_up_exps.weight", (long long)blk), 3, ne_gu, up);
  if (st == TSR_OK)
    st = emit_ne(q, qfmt(gn, "blk.%lld.ffn_down_exps.weight", (long long)blk), 3, ne_d, down);
  free(gate);
  free(up);
  free(down);
  return st;
}

/* Router, routed experts, and the shared expert with its sigmoid gate where
** the checkpoint has one (qwen35moe). */
static tsr_status moe_ffn(struct qc *q, int64_t blk, const char *hp) {
  char hn[NAME_LEN], gn[NAME_LEN];
  int64_t H = q->n_embd;
  if (q->n_expert < 1)
    return q->h->set_error(TSR_ERR_FORMAT, "%smlp.gate.weight: a router, but config.json states "
                           "no expert count", hp);
  tsr_status st = pass(q, qfmt(hn, "%smlp.gate.weight", hp),
                       qfmt(gn, "blk.%lld.ffn_gate_inp.weight", (long long)blk), PLAIN, 2,
                       q->n_expert, H, 0);
  if (st == TSR_OK) st = experts(q, blk, hp);
  if (st != TSR_OK || !has_tensor(q, qfmt(hn, "%smlp.shared_expert.gate_proj.weight", hp)))
    return st;
  int64_t n_ff;
  st = rows_of(q, hn, &n_ff);
  if (st == TSR_OK && q->n_ff_shexp >= 0 && n_ff != q->n_ff_shexp)
    st = q->h->set_error(TSR_ERR_FORMAT, "tensor %s has %lld rows; config.json's "
                         "shared_expert_intermediate_size is %lld", hn, (long long)n_ff,
                         (long long)q->n_ff_shexp);
  if (st == TSR_OK) st = dense_ffn(q, blk, hp, "mlp.shared_expert", "_shexp", n_ff);
  if (st == TSR_OK)
    st = pass(q, qfmt(hn, "%smlp.shared_expert_gate.weight", hp),
              qfmt(gn, "blk.%lld.ffn_gate_inp_shexp.weight", (long long)blk), PLAIN, 2, 1, H, 0);
  return st;
}

/* One decoder block: hp is its HF prefix ("model.layers.3.", "mtp.layers.0."). */
static tsr_status block(struct qc *q, int64_t blk, const char *hp, bool linear) {
  char hn[NAME_LEN], gn[NAME_LEN];
  int norm = q->hybrid ? PLUS_ONE : PLAIN;
  /* older checkpoints carry RoPE's inverse frequencies; llama.cpp drops them */
  if (has_tensor(q, qfmt(hn, "%sself_attn.rotary_emb.inv_freq", hp)))
    q->h->convert->hf_skip_prefix(q->cv, hn);
  tsr_status st = pass(q, qfmt(hn, "%sinput_layernorm.weight", hp),
                       qfmt(gn, "blk.%lld.attn_norm.weight", (long long)blk), norm, 1, q->n_embd,
                       0, 0);
  if (st == TSR_OK) st = linear ? linear_attention(q, blk, hp) : attention(q, blk, hp);
  /* the pre-FFN norm: llama.cpp names it post_attention_norm in the hybrids */
  if (st == TSR_OK)
    st = pass(q, qfmt(hn, "%spost_attention_layernorm.weight", hp),
              qfmt(gn, "blk.%lld.%s.weight", (long long)blk,
                   q->hybrid ? "post_attention_norm" : "ffn_norm"),
              norm, 1, q->n_embd, 0, 0);
  if (st != TSR_OK) return st;
  if (has_tensor(q, qfmt(hn, "%smlp.gate.weight", hp))) return moe_ffn(q, blk, hp);
  /* with expert_count written, the runtime runs experts in every block */
  if (q->n_expert > 0)
    return q->h->set_error(TSR_ERR_UNSUPPORTED, "config.json gives %lld experts, but block "
                           "%lld has no router (no %s: a dense FFN); tessera runs experts in every "
                           "block or in none", (long long)q->n_expert, (long long)blk, hn);
  if (q->n_ff < 1)
    return q->h->set_error(TSR_ERR_FORMAT, "block %lld has a dense FFN but config.json has no "
                           "intermediate_size", (long long)blk);
  return dense_ffn(q, blk, hp, "mlp", "", q->n_ff);
}

/* The MTP head's own tensors, on the first MTP block (block n_layer):
** eh_proj joins [embedding, hidden] (2H -> H), with its three norms. */
static tsr_status mtp_head(struct qc *q) {
  char hn[NAME_LEN], gn[NAME_LEN];
  long long L = (long long)q->n_layer;
  int64_t H = q->n_embd;
  tsr_status st = pass(q, qfmt(hn, "%sfc.weight", q->mtp),
                       qfmt(gn, "blk.%lld.nextn.eh_proj.weight", L), PLAIN, 2, H, 2 * H, 0);
  static const char *const norms[][2] = {{"pre_fc_norm_embedding", "enorm"},
                                         {"pre_fc_norm_hidden", "hnorm"},
                                         {"norm", "shared_head_norm"}};
  for (int i = 0; i < 3 && st == TSR_OK; i++)
    st = pass(q, qfmt(hn, "%s%s.weight", q->mtp, norms[i][0]),
              qfmt(gn, "blk.%lld.nextn.%s.weight", L, norms[i][1]), PLUS_ONE, 1, H, 0, 0);
  return st;
}

tsr_status qwen_write_tensors(struct qc *q) {
  char hn[NAME_LEN];
  int64_t H = q->n_embd;
  int norm = q->hybrid ? PLUS_ONE : PLAIN;
  tsr_status st = pass(q, qfmt(hn, "%sembed_tokens.weight", q->tp), "token_embd.weight", PLAIN, 2,
                       q->n_vocab, H, 0);
  for (int64_t i = 0; i < q->n_layer && st == TSR_OK; i++)
    st = block(q, i, qfmt(hn, "%slayers.%lld.", q->tp, (long long)i), q->hybrid && q->linear[i]);
  for (int64_t j = 0; j < q->n_mtp && st == TSR_OK; j++)
    st = block(q, q->n_layer + j, qfmt(hn, "%slayers.%lld.", q->mtp, (long long)j), false);
  if (st == TSR_OK && q->n_mtp > 0) st = mtp_head(q);
  if (st == TSR_OK)
    st = pass(q, qfmt(hn, "%snorm.weight", q->tp), "output_norm.weight", norm, 1, H, 0, 0);
  /* tied embeddings: no lm_head and no output tensor */
  if (st == TSR_OK && has_tensor(q, "lm_head.weight"))
    st = pass(q, "lm_head.weight", "output.weight", PLAIN, 2, q->n_vocab, H, 0);
  return st;
}
