/*
** `tessera gen-model` internals, shared by its three files:
**   cli_gen_model.c    options, the shape table (presets and --like names, with
**                      where each number comes from), the run;
**   gen_model_plan.c   every key and tensor of an architecture's GGUF, and the
**                      dtype each tensor gets (plain types, llama.cpp's q4_K_M mix);
**   gen_model_fill.c   the bytes: seeded per row, quantized on a thread pool,
**                      handed to the streaming GGUF writer one row block at a time.
*/
#ifndef TSR_CLI_GEN_MODEL_H
#define TSR_CLI_GEN_MODEL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "graph/dtype.h"
#include "model/gguf.h"

/* A model's shape as its config.json states it (names as in transformers). */
struct gen_shape {
  const char *name;   /* "qwen3-8b", or a qwen3 preset name */
  const char *arch;   /* GGUF architecture: qwen3, qwen3moe, gemma4 */
  int32_t n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab, n_ctx;
  bool tied;          /* no output.weight: the head is token_embd */
  float rope_base, eps;
  int32_t n_expert, n_expert_used, n_ff_exp; /* 0 when dense */
  /* gemma4: full layers' KV heads and head dim, the window, every period-th
  ** layer full (and the last), V = raw K on full layers, sliding rope base,
  ** logit softcap, the fraction of a full head that rotates */
  int32_t n_head_kv_full, head_dim_full, window, swa_period;
  bool k_eq_v;
  float rope_base_swa, softcap, rotary_full;
  float std;          /* > 0: every random weight's std; 0: 1/sqrt(row length) */
  bool one_stream;    /* the qwen3 presets: draw every value from one sequential
                      ** stream, as gen-model always did for them, so the build's
                      ** default model keeps its bytes (tests read its text) */
};

/* The weight type: one dtype for every matrix, or a llama.cpp mix. */
enum gen_mix { GEN_PLAIN, GEN_Q4_K_M };

struct gen_type {
  enum gen_mix mix;
  enum tsr_dtype plain; /* GEN_PLAIN */
  const char *name;     /* as given: "q4_K_M", "q8_0", ... */
};

enum gen_fill { GEN_NORMAL, GEN_CONST, GEN_ROPE_FREQS };

struct gen_ctx;

struct gen_tensor {
  char name[TSR_GGUF_MAX_NAME];
  enum tsr_dtype dtype;
  uint32_t n_dims;
  int64_t ne[TSR_GGUF_MAX_DIMS];
  enum gen_fill fill;
  float value;        /* GEN_CONST */
  float std;          /* GEN_NORMAL */
  int32_t n_rot_pairs; /* GEN_ROPE_FREQS: pairs that turn (factor 1); the rest 1e30 */
  uint64_t bytes;
  struct gen_ctx *g;  /* for the row producer */
};

struct gen_plan {
  struct gen_tensor *t;
  int n, cap;
};

/* The tensors of shape s in llama.cpp's names and shapes, fills and std set,
** dtypes not yet (gen_plan_types). */
tsr_status gen_plan_tensors(const struct gen_shape *s, struct gen_plan *p);
/* Each tensor's dtype under type t (the q4_K_M rule: gen_model_plan.c). */
tsr_status gen_plan_types(const struct gen_shape *s, const struct gen_type *t, struct gen_plan *p);
/* Architecture keys, general.*, the byte-level tokenizer. */
tsr_status gen_write_keys(struct tsr_gguf_writer *w, const struct gen_shape *s,
                          const struct gen_type *t);
void gen_plan_free(struct gen_plan *p);
/* llama.cpp's LLAMA_FTYPE for the type; -1 when it has none */
int gen_file_type(const struct gen_type *t);

/* The run's bytes (gen_model_fill.c). */
struct gen_ctx {
  uint64_t seed;
  int n_threads;
  struct tsr_threadpool *pool;
  float *scratch;          /* n_threads rows of max_row floats */
  int64_t max_row;
  uint64_t total, done;    /* bytes of tensor data, and written so far */
  bool progress;           /* print progress (stderr is a terminal) */
  bool one_stream;         /* gen_shape.one_stream: rows in order, one thread */
  bool random_codes;       /* block-typed matrices: random codes (gen_fill_codes) */
  uint64_t stream;         /* its generator state */
  double t_start, t_last;
};

tsr_status gen_ctx_init(struct gen_ctx *g, const struct gen_plan *p, uint64_t seed, int n_threads,
                        bool one_stream);
void gen_ctx_free(struct gen_ctx *g);
/* Adds every tensor of p to w: streamed (random rows) or, with zeros, all zero
** (a hole in the file: a shape-only model). */
tsr_status gen_add_tensors(struct tsr_gguf_writer *w, struct gen_plan *p, struct gen_ctx *g,
                           bool zeros);
double gen_now(void);
/* Whether gen_fill_codes writes dtype dt: q4_0, q8_0, q4_K, q6_K. */
bool gen_codes_supported(enum tsr_dtype dt);
/* Row `row` of matrix t (a gen_codes_supported dtype) as random codes: uniform quants and
** per-block scales drawn so the values have about t->std and mean 0 (--random-codes:
** benchmark weights without quantizing, several times faster for the k-quants). */
void gen_fill_codes(const struct gen_tensor *t, uint64_t seed, int64_t row, unsigned char *dst);

#endif
