/*
** `tessera gen-model`: a GGUF with random weights in a real architecture's
** exact tensor names and shapes (llama.cpp naming), for parity tests and
** benchmarks where trained weights are not needed. Matrices are N(0, std)
** with std = 1/sqrt(row length) (the fan-in: activations keep their scale
** through the depth), quantized with the reference quantizer of their type;
** norms, router and expert scales and Gemma's layer scalars are 1; rope_freqs
** is what the real model has. The file is written streaming (gguf.h): a
** 20 GB model never sits in memory. The tokenizer is byte-level BPE over the
** 256 bytes with no merges, so any text round-trips (gen_model_plan.c).
**
** Shapes (--like, case-insensitive), from each model's Hugging Face
** config.json as quoted in public code (the files are not all fetchable from
** here; every number below was found in at least two independent copies):
**   qwen3-8b         Qwen/Qwen3-8B config.json (a verbatim copy in a public test,
**                    QWEN3_8B_CONFIG_JSON): hidden 4096, 36 layers, 32 heads / 8 kv,
**                    head_dim 128, intermediate 12288, vocab 151936, max_position
**                    40960, rope_theta 1e6, rms_norm_eps 1e-6, tie_word_embeddings false.
**   qwen3-30b-a3b    Qwen/Qwen3-30B-A3B config.json (vLLM/tooling test copies): hidden
**                    2048, 48 layers, 32 heads / 4 kv, head_dim 128, intermediate 6144
**                    (unused: decoder_sparse_step 1, mlp_only_layers []), 128 experts,
**                    top-8, moe_intermediate 768, norm_topk_prob true, vocab 151936,
**                    max_position 40960, rope_theta 1e6, untied.
**   gemma-4-26b-a4b  google/gemma-4-26B-A4B(-it) text_config (copies in public tests;
**                    the model card: 30 layers, 1024 window, 128 experts top-8 plus
**                    the dense "shared" MLP, 262K vocab): hidden 2816, 30 layers, 16
**                    heads, 8 kv (sliding) / 2 global kv, head_dim 256 / global 512,
**                    attention_k_eq_v true, intermediate 2112, moe_intermediate 704,
**                    vocab 262144, sliding_window 1024, 5 sliding : 1 full,
**                    max_position 262144, rope 1e4 sliding / 1e6 proportional with
**                    partial_rotary_factor 0.25 on full layers, final_logit_softcapping
**                    30, rms_norm_eps 1e-6, tied.
**   gemma-4-31b      google/gemma-4-31B text_config (same sources; the HF repo lists a
**                    176-line config.json): hidden 5376, 60 layers, 32 heads, 16 kv /
**                    4 global kv, head_dim 256 / 512, k_eq_v, intermediate 21504, no
**                    MoE, vocab 262144, window 1024, 5:1, max_position 262144, rope and
**                    softcap as the 26B, tied.
** Not in the configs and chosen here: the norm, router-scale, per-expert-scale
** and layer_scalar values (1; the trained ones are learned) and the tokenizer
** (byte-level, not Gemma's or Qwen's 150K/262K vocabularies: --vocab keeps the
** real row count of token_embd, filled with unused tokens).
*/
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "cli.h"
#include "common/error.h"
#include "gen_model.h"

/* qwen3 presets keep std 0.02 and their one-stream generator: the build's
** default model stays the near-flat model, byte for byte, that tests were
** written against (tests/cli/test_quality_tools.py, tests/serve read its text). */
static const struct gen_shape g_presets[] = {
    /* head dim 32: every KV codec's block fits */
    {.name = "tiny", .arch = "qwen3", .n_layer = 2, .n_embd = 64, .n_ff = 128, .n_head = 4,
     .n_head_kv = 2, .head_dim = 32, .n_vocab = 256 + 3, .n_ctx = 512, .rope_base = 1e6f,
     .eps = 1e-6f, .std = 0.02f, .one_stream = true},
    {.name = "0.6b", .arch = "qwen3", .n_layer = 28, .n_embd = 1024, .n_ff = 3072, .n_head = 16,
     .n_head_kv = 8, .head_dim = 128, .n_vocab = 151936, .n_ctx = 40960, .rope_base = 1e6f,
     .eps = 1e-6f, .std = 0.02f, .one_stream = true},
};

static const struct gen_shape g_like[] = {
    {.name = "qwen3-8b", .arch = "qwen3", .n_layer = 36, .n_embd = 4096, .n_ff = 12288,
     .n_head = 32, .n_head_kv = 8, .head_dim = 128, .n_vocab = 151936, .n_ctx = 40960,
     .rope_base = 1e6f, .eps = 1e-6f},
    {.name = "qwen3-30b-a3b", .arch = "qwen3moe", .n_layer = 48, .n_embd = 2048, .n_ff = 6144,
     .n_head = 32, .n_head_kv = 4, .head_dim = 128, .n_vocab = 151936, .n_ctx = 40960,
     .rope_base = 1e6f, .eps = 1e-6f, .n_expert = 128, .n_expert_used = 8, .n_ff_exp = 768},
    {.name = "gemma-4-26b-a4b", .arch = "gemma4", .n_layer = 30, .n_embd = 2816, .n_ff = 2112,
     .n_head = 16, .n_head_kv = 8, .head_dim = 256, .n_vocab = 262144, .n_ctx = 262144,
     .tied = true, .rope_base = 1e6f, .eps = 1e-6f, .n_expert = 128, .n_expert_used = 8,
     .n_ff_exp = 704, .n_head_kv_full = 2, .head_dim_full = 512, .window = 1024,
     .swa_period = 6, .k_eq_v = true, .rope_base_swa = 1e4f, .softcap = 30.0f,
     .rotary_full = 0.25f},
    {.name = "gemma-4-31b", .arch = "gemma4", .n_layer = 60, .n_embd = 5376, .n_ff = 21504,
     .n_head = 32, .n_head_kv = 16, .head_dim = 256, .n_vocab = 262144, .n_ctx = 262144,
     .tied = true, .rope_base = 1e6f, .eps = 1e-6f, .n_head_kv_full = 4, .head_dim_full = 512,
     .window = 1024, .swa_period = 6, .k_eq_v = true, .rope_base_swa = 1e4f, .softcap = 30.0f,
     .rotary_full = 0.25f},
};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static void gen_model_usage(FILE *f) {
  fprintf(f,
      "usage: tessera gen-model [--arch qwen3|qwen3moe|gemma4] [--like NAME | --preset tiny|0.6b]\n"
      "                         [--type TYPE] [--layers N] [--vocab N] [--experts N]\n"
      "                         [--seed N] [--threads N] [--plan] [--shape-only]\n"
      "                         [--random-codes] -o FILE.gguf\n"
      "Writes random weights in an architecture's exact GGUF layout (llama.cpp names),\n"
      "streaming: memory stays at a few MB whatever the file's size.\n"
      "  --like NAME   a real model's shape: qwen3-8b, qwen3-30b-a3b (qwen3moe),\n"
      "                gemma-4-26b-a4b, gemma-4-31b (gemma4); sets --arch\n"
      "  --preset      qwen3 only: tiny (the default) or 0.6b\n"
      "  --type        q4_K_M (llama.cpp's mix), or one type for every matrix: f32, f16, bf16,\n"
      "                q8_0, q4_0, q4_K, q6_K, ...; norms and scales stay f32. Default f16.\n"
      "  --layers N, --vocab N, --experts N   a smaller cut of the shape (tests)\n"
      "  --plan        print every tensor's type and shape and the file size; write nothing\n"
      "  --shape-only  matrices all zero, left as holes: a file of the full size that takes\n"
      "                no disk, for describe and memory plans (its outputs mean nothing)\n"
      "  --random-codes  q4_0, q8_0, q4_K and q6_K matrices get random codes and block scales\n"
      "                (values of the same std and mean 0) instead of quantized normals: for\n"
      "                benchmark models, several times faster for q4_K_M; the mix's other\n"
      "                types (fallbacks for rows that are not whole k-blocks) are quantized\n"
      "  --threads N   quantizing threads (default: every core); --seed N (default 1)\n"
      "The output may also be given as the last argument instead of -o.\n");
}

static const struct gen_shape *find_shape(const struct gen_shape *tab, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (!strcasecmp(tab[i].name, name)) return &tab[i];
  return NULL;
}

static int parse_type(const char *v, struct gen_type *t) {
  t->name = v;
  if (!strcasecmp(v, "q4_K_M")) {
    t->mix = GEN_Q4_K_M;
    return 1;
  }
  int dt = tsr_dtype_from_name(v);
  const struct tsr_dtype_traits *tr = dt >= 0 ? tsr_dtype_traits(dt) : NULL;
  if (!tr || !tr->from_f32 || dt == TSR_I32 || dt >= TSR_DTYPE_COUNT) {
    fprintf(stderr, "gen-model: --type '%s' is not a weight type tessera can quantize to "
            "(q4_K_M, f32, f16, bf16, q8_0, q4_0, q4_K, q6_K, ...)\n", v);
    return 0;
  }
  t->mix = GEN_PLAIN;
  t->plain = (enum tsr_dtype)dt;
  return 1;
}

static void print_plan(const struct gen_plan *p, uint64_t file_size) {
  uint64_t by_type[TSR_DTYPE_COUNT] = {0};
  for (int i = 0; i < p->n; i++) {
    const struct gen_tensor *t = &p->t[i];
    char shape[96];
    int k = snprintf(shape, sizeof shape, "%lld", (long long)t->ne[0]);
    for (uint32_t d = 1; d < t->n_dims; d++)
      k += snprintf(shape + k, sizeof shape - (size_t)k, " x %lld", (long long)t->ne[d]);
    printf("%-36s %-5s %-24s %12.3f MiB\n", t->name, tsr_dtype_name(t->dtype), shape,
           t->bytes / 1048576.0);
    if ((int)t->dtype < TSR_DTYPE_COUNT) by_type[t->dtype] += t->bytes;
  }
  for (int d = 0; d < TSR_DTYPE_COUNT; d++)
    if (by_type[d]) printf("total %-5s %12.3f GiB\n", tsr_dtype_name((enum tsr_dtype)d),
                           by_type[d] / 1073741824.0);
  printf("file size %llu bytes (%.3f GiB), %d tensors\n", (unsigned long long)file_size,
         file_size / 1073741824.0, p->n);
}

/* Refuses up front a file the target's filesystem cannot hold (a 20 GB write
** that fails at 95% wastes the GPU machine's time). */
static tsr_status check_space(const char *out, uint64_t need) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", out);
  char *slash = strrchr(dir, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == dir) dir[1] = 0;
  else *slash = 0;
  struct statvfs vfs;
  if (statvfs(dir, &vfs) != 0) return TSR_OK; /* the write itself will say what is wrong */
  uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
  if (avail < need)
    return tsr_error_set(TSR_ERR_IO, "%s: needs %.2f GiB and %s has %.2f GiB free", out,
                         need / 1073741824.0, dir, avail / 1073741824.0);
  return TSR_OK;
}

struct opts {
  const char *arch, *like, *preset, *out;
  struct gen_type type;
  long seed, layers, vocab, experts, threads;
  bool plan, shape_only, random_codes;
};

static int parse_long(const char *opt, const char *v, long lo, long hi, long *out) {
  int64_t x;
  if (!tsr_cli_parse_i64(v, lo, hi, &x)) {
    fprintf(stderr, "gen-model: %s '%s' must be an integer in [%ld, %ld]\n", opt, v, lo, hi);
    return 0;
  }
  *out = (long)x;
  return 1;
}

/* 1: parsed; 0: exit with *code */
static int parse_opts(int argc, char **argv, struct opts *o, int *code) {
  *code = TSR_EXIT_USAGE;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (tsr_cli_is_help(a)) {
      gen_model_usage(stdout);
      *code = TSR_EXIT_OK;
      return 0;
    }
    if (!strcmp(a, "--plan")) { o->plan = true; continue; }
    if (!strcmp(a, "--shape-only")) { o->shape_only = true; continue; }
    if (!strcmp(a, "--random-codes")) { o->random_codes = true; continue; }
    if (a[0] != '-' && i == argc - 1 && !o->out) { o->out = a; continue; }
    if (i + 1 >= argc) {
      fprintf(stderr, "gen-model: option %s needs a value\n", a);
      return 0;
    }
    const char *v = argv[++i];
    int ok = 1;
    if (!strcmp(a, "--arch")) o->arch = v;
    else if (!strcmp(a, "-o") || !strcmp(a, "--output")) o->out = v;
    else if (!strcmp(a, "--preset")) o->preset = v;
    else if (!strcmp(a, "--like")) o->like = v;
    else if (!strcmp(a, "--type")) ok = parse_type(v, &o->type);
    else if (!strcmp(a, "--seed")) ok = parse_long(a, v, 0, 1L << 30, &o->seed);
    else if (!strcmp(a, "--layers")) ok = parse_long(a, v, 1, 512, &o->layers);
    else if (!strcmp(a, "--vocab")) ok = parse_long(a, v, 259, 1 << 20, &o->vocab);
    else if (!strcmp(a, "--experts")) ok = parse_long(a, v, 1, 1024, &o->experts);
    else if (!strcmp(a, "--threads")) ok = parse_long(a, v, 1, 1024, &o->threads);
    else {
      fprintf(stderr, "gen-model: unknown option '%s'\n", a);
      gen_model_usage(stderr);
      return 0;
    }
    if (!ok) return 0;
  }
  return 1;
}

/* The shape the options name, with the cut applied; 0 after a message. */
static int resolve_shape(const struct opts *o, struct gen_shape *s) {
  const struct gen_shape *base;
  if (o->like) {
    if (o->preset) {
      fprintf(stderr, "gen-model: --like and --preset exclude each other\n");
      return 0;
    }
    if (!(base = find_shape(g_like, N_OF(g_like), o->like))) {
      fprintf(stderr, "gen-model: --like '%s' is not a known shape (known: qwen3-8b, "
              "qwen3-30b-a3b, gemma-4-26b-a4b, gemma-4-31b)\n", o->like);
      return 0;
    }
    if (o->arch && strcmp(o->arch, base->arch)) {
      fprintf(stderr, "gen-model: %s is a %s model, not --arch %s\n", base->name, base->arch,
              o->arch);
      return 0;
    }
  } else {
    if (!o->arch) {
      fprintf(stderr, "gen-model: --arch or --like is required\n");
      gen_model_usage(stderr);
      return 0;
    }
    if (strcmp(o->arch, "qwen3")) {
      fprintf(stderr, "gen-model: --arch '%s' %s\n", o->arch,
              strcmp(o->arch, "qwen3moe") && strcmp(o->arch, "gemma4")
                  ? "is not known to this version (known: qwen3, qwen3moe, gemma4)"
                  : "needs --like NAME (its shapes: qwen3-30b-a3b; gemma-4-26b-a4b, gemma-4-31b)");
      return 0;
    }
    if (!(base = find_shape(g_presets, N_OF(g_presets), o->preset ? o->preset : "tiny"))) {
      fprintf(stderr, "gen-model: --preset '%s' unknown for qwen3 (known: tiny, 0.6b)\n",
              o->preset);
      return 0;
    }
  }
  *s = *base;
  if (o->layers > 0) s->n_layer = (int32_t)o->layers;
  if (o->vocab > 0) s->n_vocab = (int32_t)o->vocab;
  if (o->experts > 0) {
    if (!s->n_expert) {
      fprintf(stderr, "gen-model: --experts: %s has no experts\n", s->name);
      return 0;
    }
    s->n_expert = (int32_t)o->experts;
    if (s->n_expert_used > s->n_expert) s->n_expert_used = s->n_expert;
  }
  return 1;
}

int tsr_cli_gen_model(int argc, char **argv) {
  struct opts o = {.seed = 1, .type = {GEN_PLAIN, TSR_F16, "f16"}};
  int code;
  struct gen_shape s;
  if (!parse_opts(argc, argv, &o, &code)) return code;
  if (!resolve_shape(&o, &s)) return TSR_EXIT_USAGE;
  if (!o.out && !o.plan) {
    fprintf(stderr, "gen-model: no output file (-o FILE.gguf)\n");
    gen_model_usage(stderr);
    return TSR_EXIT_USAGE;
  }
  long threads = o.threads > 0 ? o.threads : sysconf(_SC_NPROCESSORS_ONLN);

  struct gen_plan plan = {0};
  struct gen_ctx g = {0};
  struct tsr_gguf_writer *w = NULL;
  uint64_t file_size = 0;
  double t0 = gen_now();
  tsr_status st = gen_plan_tensors(&s, &plan);
  if (st == TSR_OK) st = gen_plan_types(&s, &o.type, &plan);
  if (st == TSR_OK)
    st = gen_ctx_init(&g, &plan, (uint64_t)o.seed, o.plan ? 1 : (int)(threads > 0 ? threads : 1),
                      s.one_stream);
  if (st == TSR_OK && o.random_codes) {
    int coded = 0;
    for (int i = 0; i < plan.n; i++)
      coded += plan.t[i].fill == GEN_NORMAL && gen_codes_supported(plan.t[i].dtype);
    if (!coded)
      st = tsr_error_set(TSR_ERR_INVALID_ARG, "--random-codes: no matrix of --type %s has "
                         "codes it writes (q4_0, q8_0, q4_K, q6_K, the q4_K_M mix)", o.type.name);
    g.random_codes = true;
  }
  if (st == TSR_OK) st = tsr_gguf_writer_new(&w);
  if (st == TSR_OK) st = gen_write_keys(w, &s, &o.type);
  if (st == TSR_OK) st = gen_add_tensors(w, &plan, &g, o.shape_only);
  if (st == TSR_OK) st = tsr_gguf_writer_file_size(w, &file_size);
  if (st == TSR_OK && o.plan) print_plan(&plan, file_size);
  /* what is really written: a shape-only file's matrices are holes */
  uint64_t holes = 0;
  for (int i = 0; o.shape_only && i < plan.n; i++)
    if (plan.t[i].fill == GEN_NORMAL) holes += plan.t[i].bytes;
  const uint64_t data_bytes = g.total;
  if (st == TSR_OK && !o.plan) st = check_space(o.out, file_size - holes);
  if (st == TSR_OK && !o.plan) st = tsr_gguf_writer_write(w, o.out);
  gen_ctx_free(&g);
  tsr_gguf_writer_free(w);
  int n_tensors = plan.n;
  gen_plan_free(&plan);
  if (st != TSR_OK) {
    fprintf(stderr, "gen-model: %s\n", tsr_error_message());
    return st == TSR_ERR_INVALID_ARG ? TSR_EXIT_USAGE : TSR_EXIT_RUNTIME;
  }
  if (o.plan) return TSR_EXIT_OK;
  double el = gen_now() - t0;
  printf("wrote %s: %s (%s shape), %d layers, embd %d, vocab %d, %s, %d tensors, %.1f MiB%s, "
         "%.1f s (%.0f MB/s, %ld threads)\n",
         o.out, s.arch, s.name, s.n_layer, s.n_embd, s.n_vocab, o.type.name, n_tensors,
         file_size / 1048576.0, o.shape_only ? " (shape only: matrices are holes)" : "", el,
         el > 0 ? data_bytes / el / 1e6 : 0.0, threads);
  return TSR_EXIT_OK;
}
