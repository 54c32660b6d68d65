/*
** `tessera gen-model`: a GGUF with random weights in a real architecture's
** exact tensor names and shapes (llama.cpp naming), for parity tests and
** benchmarks where trained weights are not needed. Norm weights are 1,
** everything else is N(0, std) quantized with the reference quantizer of the
** chosen type. The tokenizer is byte-level BPE over the 256 bytes with no
** merges, so any text round-trips.
*/
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dtype.h"
#include "error.h"
#include "gguf.h"

struct shape {
  const char *preset;
  int n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab, n_ctx;
};

/* qwen3 presets: "tiny" for tests and the default job, "0.6b" as shipped. */
static const struct shape g_presets[] = {
    {"tiny", 2, 64, 128, 4, 2, 32, 256 + 3, 512}, /* head dim 32: every KV codec's block fits */
    {"0.6b", 28, 1024, 3072, 16, 8, 128, 151936, 40960},
};

struct gen {
  struct tsr_gguf_writer *w;
  void **buffers; /* tensor data kept alive until the file is written */
  int n_buffers, cap_buffers;
  uint64_t rng;
  float std;
  size_t bytes;
};

static float next_normal(struct gen *g) {
  /* Box-Muller over xorshift64*: deterministic for a seed on every machine */
  double u[2];
  for (int i = 0; i < 2; i++) {
    g->rng ^= g->rng >> 12, g->rng ^= g->rng << 25, g->rng ^= g->rng >> 27;
    u[i] = ((g->rng * 0x2545f4914f6cdd1dull >> 11) + 0.5) / 9007199254740992.0;
  }
  return (float)(sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]));
}

static tsr_status keep(struct gen *g, void *p) {
  if (g->n_buffers == g->cap_buffers) {
    int cap = g->cap_buffers ? g->cap_buffers * 2 : 64;
    void **nb = realloc(g->buffers, (size_t)cap * sizeof *nb);
    if (!nb) return tsr_error_set(TSR_ERR_NOMEM, "gen-model: out of memory");
    g->buffers = nb;
    g->cap_buffers = cap;
  }
  g->buffers[g->n_buffers++] = p;
  return TSR_OK;
}

/* A [ne0, ne1] tensor: ones (norms) or random normals in dtype dt. */
static tsr_status add_tensor(struct gen *g, const char *name, enum tsr_dtype dt, int64_t ne0,
                             int64_t ne1, int ones) {
  if (ne0 % tsr_dtype_block_size(dt))
    return tsr_error_set(TSR_ERR_INVALID_ARG,
                         "gen-model: tensor %s has rows of %lld, not a multiple of %s's block "
                         "size %lld; pick another --type",
                         name, (long long)ne0, tsr_dtype_name(dt),
                         (long long)tsr_dtype_block_size(dt));
  size_t row_bytes = tsr_dtype_row_size(dt, ne0);
  void *data = malloc(row_bytes * (size_t)ne1);
  float *row = malloc((size_t)ne0 * sizeof *row);
  tsr_status st = (data && row) ? TSR_OK : tsr_error_set(TSR_ERR_NOMEM, "gen-model: out of memory");
  for (int64_t r = 0; st == TSR_OK && r < ne1; r++) {
    for (int64_t i = 0; i < ne0; i++) row[i] = ones ? 1.0f : g->std * next_normal(g);
    st = tsr_dtype_from_f32(dt, row, (char *)data + (size_t)r * row_bytes, ne0);
  }
  free(row);
  if (st == TSR_OK) st = keep(g, data);
  else free(data);
  if (st != TSR_OK) return st;
  int64_t ne[2] = {ne0, ne1};
  g->bytes += row_bytes * (size_t)ne1;
  return tsr_gguf_writer_add_tensor(g->w, name, dt, ne1 == 1 ? 1 : 2, ne, data);
}

/* GPT-2's printable stand-ins for the 256 byte values. */
static int byte_to_codepoint(int b) {
  if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
  int n = 0;
  for (int c = 0; c < b; c++)
    if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255))) n++;
  return 256 + n;
}

static tsr_status add_tokenizer(struct gen *g, int n_vocab) {
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
  if (st == TSR_OK) st = tsr_gguf_writer_add_str(g->w, "tokenizer.ggml.model", "gpt2");
  if (st == TSR_OK) st = tsr_gguf_writer_add_str(g->w, "tokenizer.ggml.pre", "qwen2");
  if (st == TSR_OK)
    st = tsr_gguf_writer_add_arr_str(g->w, "tokenizer.ggml.tokens", (const char *const *)tokens,
                                     (uint64_t)n_vocab);
  if (st == TSR_OK)
    st = tsr_gguf_writer_add_arr(g->w, "tokenizer.ggml.token_type", TSR_GGUF_I32, types,
                                 (uint64_t)n_vocab);
  if (st == TSR_OK)
    st = tsr_gguf_writer_add_arr_str(g->w, "tokenizer.ggml.merges", NULL, 0);
  if (st == TSR_OK) st = tsr_gguf_writer_add_u32(g->w, "tokenizer.ggml.eos_token_id", 256);
  if (st == TSR_OK) st = tsr_gguf_writer_add_u32(g->w, "tokenizer.ggml.padding_token_id", 256);
  if (st == TSR_OK) st = tsr_gguf_writer_add_bool(g->w, "tokenizer.ggml.add_bos_token", 0);
  for (int i = 0; tokens && i < n_vocab; i++) free(tokens[i]);
  free(tokens);
  free(types);
  return st;
}

static tsr_status gen_qwen3(struct gen *g, const struct shape *s, enum tsr_dtype wt) {
  struct tsr_gguf_writer *w = g->w;
  tsr_status st = TSR_OK;
#define TRY(x) do { if (st == TSR_OK) st = (x); } while (0)
  TRY(tsr_gguf_writer_add_str(w, "general.architecture", "qwen3"));
  TRY(tsr_gguf_writer_add_str(w, "general.name", "tessera random qwen3"));
  TRY(tsr_gguf_writer_add_u32(w, "general.file_type", wt == TSR_F32 ? 0u : 1u));
  TRY(tsr_gguf_writer_add_u32(w, "qwen3.block_count", (uint32_t)s->n_layer));
  TRY(tsr_gguf_writer_add_u32(w, "qwen3.context_length", (uint32_t)s->n_ctx));
  TRY(tsr_gguf_writer_add_u32(w, "qwen3.embedding_length", (uint32_t)s->n_embd));
  TRY(tsr_gguf_writer_add_u32(w, "qwen3.feed_forward_length", (uint32_t)s->n_ff));
  TRY(tsr_gguf_writer_add_u32(w, "qwen3.attention.head_count", (uint32_t)s->n_head));
  TRY(tsr_gguf_writer_add_u32(w, "qwen3.attention.head_count_kv", (uint32_t)s->n_head_kv));
  TRY(tsr_gguf_writer_add_u32(w, "qwen3.attention.key_length", (uint32_t)s->head_dim));
  TRY(tsr_gguf_writer_add_u32(w, "qwen3.attention.value_length", (uint32_t)s->head_dim));
  TRY(tsr_gguf_writer_add_f32(w, "qwen3.rope.freq_base", 1000000.0f));
  TRY(tsr_gguf_writer_add_f32(w, "qwen3.attention.layer_norm_rms_epsilon", 1e-6f));
  TRY(add_tokenizer(g, s->n_vocab));

  const int64_t e = s->n_embd, q = (int64_t)s->n_head * s->head_dim,
                kv = (int64_t)s->n_head_kv * s->head_dim;
  TRY(add_tensor(g, "token_embd.weight", wt, e, s->n_vocab, 0));
  for (int l = 0; l < s->n_layer && st == TSR_OK; l++) {
    char n[64];
#define T(suffix, dt, a, b, ones) \
  (snprintf(n, sizeof n, "blk.%d." suffix, l), add_tensor(g, n, dt, a, b, ones))
    TRY(T("attn_norm.weight", TSR_F32, e, 1, 1));
    TRY(T("attn_q.weight", wt, e, q, 0));
    TRY(T("attn_k.weight", wt, e, kv, 0));
    TRY(T("attn_v.weight", wt, e, kv, 0));
    TRY(T("attn_q_norm.weight", TSR_F32, s->head_dim, 1, 1));
    TRY(T("attn_k_norm.weight", TSR_F32, s->head_dim, 1, 1));
    TRY(T("attn_output.weight", wt, q, e, 0));
    TRY(T("ffn_norm.weight", TSR_F32, e, 1, 1));
    TRY(T("ffn_gate.weight", wt, e, s->n_ff, 0));
    TRY(T("ffn_up.weight", wt, e, s->n_ff, 0));
    TRY(T("ffn_down.weight", wt, s->n_ff, e, 0));
#undef T
  }
  TRY(add_tensor(g, "output_norm.weight", TSR_F32, e, 1, 1));
  TRY(add_tensor(g, "output.weight", wt, e, s->n_vocab, 0));
#undef TRY
  return st;
}

static void gen_model_usage(FILE *f) {
  fprintf(f,
          "usage: tessera gen-model --arch qwen3 [--preset tiny|0.6b] [--type f16] [--seed N]\n"
          "                         [--layers N] [--vocab N] -o FILE.gguf\n"
          "Writes random weights in the architecture's exact GGUF layout (llama.cpp names).\n"
          "--type: weight dtype of the matrices (f32, f16, bf16, q8_0, q4_0, q4_K, q6_K, ...);\n"
          "        norms stay f32. Default preset tiny, type f16, seed 1.\n");
}

static int parse_int(const char *opt, const char *v, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || *end || x < lo || x > hi) {
    fprintf(stderr, "gen-model: %s '%s' must be an integer in [%ld, %ld]\n", opt, v, lo, hi);
    return 0;
  }
  *out = x;
  return 1;
}

int tsr_cli_gen_model(int argc, char **argv) {
  const char *arch = NULL, *out = NULL, *preset = "tiny", *type = "f16";
  long seed = 1, layers = -1, vocab = -1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (tsr_cli_is_help(a)) {
      gen_model_usage(stdout);
      return TSR_EXIT_OK;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "gen-model: option %s needs a value\n", a);
      return TSR_EXIT_USAGE;
    }
    const char *v = argv[++i];
    if (!strcmp(a, "--arch")) arch = v;
    else if (!strcmp(a, "-o") || !strcmp(a, "--output")) out = v;
    else if (!strcmp(a, "--preset")) preset = v;
    else if (!strcmp(a, "--type")) type = v;
    else if (!strcmp(a, "--seed")) { if (!parse_int(a, v, 0, 1L << 30, &seed)) return TSR_EXIT_USAGE; }
    else if (!strcmp(a, "--layers")) { if (!parse_int(a, v, 1, 1024, &layers)) return TSR_EXIT_USAGE; }
    else if (!strcmp(a, "--vocab")) { if (!parse_int(a, v, 259, 1 << 20, &vocab)) return TSR_EXIT_USAGE; }
    else {
      fprintf(stderr, "gen-model: unknown option '%s'\n", a);
      gen_model_usage(stderr);
      return TSR_EXIT_USAGE;
    }
  }
  if (!arch || !out) {
    fprintf(stderr, "gen-model: --arch and -o are required\n");
    gen_model_usage(stderr);
    return TSR_EXIT_USAGE;
  }
  if (strcmp(arch, "qwen3")) {
    fprintf(stderr, "gen-model: --arch '%s' is not known to this version (known: qwen3)\n", arch);
    return TSR_EXIT_USAGE;
  }
  const struct shape *base = NULL;
  for (size_t i = 0; i < sizeof g_presets / sizeof g_presets[0]; i++)
    if (!strcmp(g_presets[i].preset, preset)) base = &g_presets[i];
  if (!base) {
    fprintf(stderr, "gen-model: --preset '%s' unknown for qwen3 (known: tiny, 0.6b)\n", preset);
    return TSR_EXIT_USAGE;
  }
  int dt = tsr_dtype_from_name(type);
  const struct tsr_dtype_traits *tr = dt >= 0 ? tsr_dtype_traits(dt) : NULL;
  if (!tr || !tr->from_f32 || dt == TSR_I32) {
    fprintf(stderr, "gen-model: --type '%s' is not a weight type tessera can quantize to\n", type);
    return TSR_EXIT_USAGE;
  }
  struct shape s = *base;
  if (layers > 0) s.n_layer = (int)layers;
  if (vocab > 0) s.n_vocab = (int)vocab;

  struct gen g = {.rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)seed, .std = 0.02f};
  tsr_status st = tsr_gguf_writer_new(&g.w);
  if (st == TSR_OK) st = gen_qwen3(&g, &s, (enum tsr_dtype)dt);
  if (st == TSR_OK) st = tsr_gguf_writer_write(g.w, out);
  for (int i = 0; i < g.n_buffers; i++) free(g.buffers[i]);
  free(g.buffers);
  tsr_gguf_writer_free(g.w);
  if (st != TSR_OK) {
    fprintf(stderr, "gen-model: %s\n", tsr_error_message());
    return st == TSR_ERR_INVALID_ARG ? TSR_EXIT_USAGE : TSR_EXIT_RUNTIME;
  }
  printf("wrote %s: qwen3 preset %s, %d layers, embd %d, vocab %d, %s weights, %.1f MiB of tensors\n",
         out, s.preset, s.n_layer, s.n_embd, s.n_vocab, tsr_dtype_name((enum tsr_dtype)dt),
         (double)g.bytes / (1024.0 * 1024.0));
  return TSR_EXIT_OK;
}
