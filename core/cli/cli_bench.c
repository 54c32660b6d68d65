/*
** `tessera bench`: prefill (ppN: N tokens in one call) and decode (tgN: N
** one-token steps) tokens/s on top of a context that already holds d tokens,
** each test repeated with the median reported, in a table like llama-bench's
** (and --json). Tokens are random ids (seeded): speed does not depend on text.
**
** Before the tests it measures the ceilings the rates are judged against, with
** the backend's probe: cuda, cudaMemcpy device to device and a cuBLAS bf16 GEMM;
** cpu, a streaming read and its cores' multiply-add peak in the products' arithmetic (the
** 8-bit integer dot with activations q8, else f32; core/cpu/cpu_probe.c). Each test then prints
**   tg: the bytes a decode step must read (every weight once, experts scaled by
**       the share a token uses, tables read one row per token left out; the KV
**       of the cells it attends to; recurrent state read and written) times
**       steps per second, as a fraction of the copy rate;
**   pp: FLOPs (2 per active weight, 2 (Dk + Dv) per head per key attended;
**       the LM head's 2 per weight only for the rows of logits it computed, which
**       the engine counts: one a prefill, not one a token) times tokens per
**       second, as a fraction of the GEMM rate.
** Between repetitions the tested tokens are removed from the cache again (or,
** where a model cannot resume mid-sequence, the depth is prefilled anew); a deeper
** depth continues the fill of the one before it.
** --op-times also splits each test's time per token: outside the backend's
** computes (graph building, sampling, cache bookkeeping), inside them but
** outside the nodes (uploads, downloads), and per kind of node
** (core/graph/op_times.h; on cuda a node's time includes the GPU waiting for its
** launch).
** On a backend that replays decode steps as CUDA graphs, each tg test also says how
** many of its timed steps replayed (a step that did not ran node by node) and how
** many captures they took (--json: graph_replays, graph_captures).
** --speculate adds, after each tg test, the same decode through the profile's speculator
** (tgN spec): greedy, from the text of --prompt-file (which then fills every depth), the
** median tokens/s, the speedup over the plain tgN, and what the steps did: drafted and kept
** tokens, tokens a step, and the shares of the time spent drafting and verifying.
** The depth fills are counted and timed too (--json: depth_fills; the longest one's rate
** is a long-context run's prefill figure; --depth-fill positions fills without compute,
** said in the output and the JSON's depth_fill). Then what each plugin counted over the
** whole run (fills included), and last the memory the run held at its peak: on a device
** backend its own allocations and the device's memory in use, on the cpu the peak
** resident set of the process.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "graph/backend.h"
#include "bench_eta.h"
#include "cli.h"
#include "cli_quality.h"
#include "common/error.h"
#include "kv/kv_cache.h"
#include "abi/plugin_host.h"
#include "abi/setup.h"
#include "engine/sampler.h"
#include "model/tokenizer.h"

#define MAX_LIST 16

struct int_list {
  int64_t v[MAX_LIST];
  int n;
};

struct bench_args {
  struct tsr_cli_engine_args eng;
  const char *json;
  struct int_list pp, tg, depth;
  int64_t reps, warmup;
  bool op_times;
  int64_t progress; /* --progress: tokens a call of a long prefill; 0: one call */
  bool fill_positions; /* --depth-fill positions: depths filled without compute */
  bool speculate;      /* --speculate: each tg test again through the profile's speculator */
  const char *prompt_file;
  int64_t parallel; /* --parallel: sequences decoded (and prefilled) together; 0: not given */
  char ctx_set[40], par_set[40];
};

/* What one token costs the model, from the GGUF and the memory plan. */
struct cost {
  double weight_bytes, weight_params;   /* read / multiplied once per token */
  double head_params;                   /* the LM head's share of weight_params */
  double kv_bytes_per_cell[TSR_LAYER_KIND_COUNT];
  uint64_t kv_cells[TSR_LAYER_KIND_COUNT];
  double state_bytes;                   /* recurrent state of one sequence */
  double attn_flops_per_key;            /* full layers: 2 (Dk + Dv) per head */
  double swa_flops_per_key;             /* sliding layers, keys up to the window */
  int32_t window;
};

struct result {
  char test[48];
  int64_t n_tokens, depth, n_seq; /* n_tokens a sequence, n_seq sequences together */
  double median_ts, sd_ts, achieved, ceiling;
  bool is_pp;
  double wall_s;              /* the timed repetitions together */
  bool graphs;                /* the backend counts CUDA graphs: the two below are set */
  uint64_t captures, replays; /* during the timed repetitions */
  struct tsr_op_times *times; /* with --op-times: their nodes, else NULL */
  bool spec;                  /* a tgN spec test: the steps below, over the timed runs */
  struct tsr_engine_spec_stats steps;
  double plain_ts;            /* the plain tgN's median, for the speedup */
};

static void bench_usage(FILE *f) {
  fprintf(f,
          "usage: tessera bench (-m MODEL.gguf | --profile P) [--set key=value]...\n"
          "                     [-p N[,N...]] [-n N[,N...]] [-d N[,N...]] [-r REPS]\n"
          "                     [--warmup N] [--json OUT] [--threads N] [--op-times]\n"
          "                     [--progress TOKENS] [--depth-fill compute|positions]\n"
          "                     [--speculate --prompt-file TEXT] [--parallel N]\n"
          "Prefill (ppN: N tokens in one call, default 512) and decode (tgN: N one-token\n"
          "steps, default 128) tokens/s on top of a context already holding each depth -d\n"
          "(default 0), REPS times each (default 5) after N warm-ups (default 1; 0 for a\n"
          "run too long to repeat, e.g. a 1M-token prefill): the median and the\n"
          "standard deviation, as a table like llama-bench's. First it measures the\n"
          "backend's memory rate and compute peak (cuda: cudaMemcpy and cuBLAS bf16; cpu:\n"
          "a streaming read and the cores' FMA peak) and prints, per test, the bytes/s\n"
          "(tg) or FLOP/s (pp) the model's size and shape imply, as a fraction of those\n"
          "ceilings.\n"
          "-p 0 or -n 0 skips that kind of test. The profile's context is set to the\n"
          "largest depth plus the largest test. --op-times splits each test's time per\n"
          "token: outside the backend's computes, inside them outside the nodes, and per\n"
          "kind of node (op, weight or KV types; cuda: timed with events on the stream).\n"
          "--progress TOKENS evaluates a prefill or depth fill longer than TOKENS in calls\n"
          "of TOKENS tokens with a line on stderr after each (tokens done, rate, minutes\n"
          "left), for runs such as a 1M-token prefill: the same tokens and computes, plus\n"
          "the LM head of one token per call.\n"
          "--depth-fill positions fills each depth without computing it (then one untimed\n"
          "step, taken off again, so a device holds the model and cache before the tests):\n"
          "the cells take their positions and zero bytes (on a device, what they held), so\n"
          "a decode at 1M tokens is timed without the fill's 25 minutes. cuda's tensor-core\n"
          "attention reads every key whatever the values; the cpu's skips the V rows whose\n"
          "weights underflow, which over zeros none do, so there it reads more than after a\n"
          "computed fill. The output says so and the JSON records it (depth_fill).\n"
          "Refused for models with recurrent layers.\n"
          "--speculate runs each tg test again through the profile's speculator (tgN\n"
          "spec): greedy decoding continuing the text of --prompt-file, whose tokens then\n"
          "fill every depth (a depth of 0 starts after its first token): the median\n"
          "tokens/s, the speedup over tgN, drafted and kept tokens, tokens a step and the\n"
          "shares of the time spent drafting and verifying.\n"
          "--parallel N (1-64) runs every test on N sequences together, each at the depth\n"
          "(the first filled, the others sharing its cells): ppP xN evaluates N prompts of P\n"
          "tokens in one batch, tgT xN T steps of one token for each sequence; t/s counts\n"
          "the tokens of all of them, and a step's bytes are the weights once and each\n"
          "sequence's KV and state. The profile's server.parallel becomes N and its context\n"
          "the largest depth plus N times the largest test (--progress splits the depth\n"
          "fills only).\n");
}

static int usage_error(const char *what, const char *arg) {
  fprintf(stderr, "tessera bench: %s%s\n(tessera bench --help for usage)\n", what, arg);
  return TSR_EXIT_USAGE;
}

/* "N[,N...]": each in [lo, hi]; a lone 0 (when zero_ok) is the empty list. */
static bool parse_list(const char *s, int64_t lo, int64_t hi, bool zero_ok, struct int_list *l) {
  l->n = 0;
  if (zero_ok && !strcmp(s, "0")) return true;
  char buf[256];
  if (strlen(s) >= sizeof buf) return false;
  strcpy(buf, s);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
    if (l->n == MAX_LIST || !tsr_cli_parse_i64(t, lo, hi, &l->v[l->n++])) return false;
  return l->n > 0;
}

static int64_t list_max(const struct int_list *l) {
  int64_t m = 0;
  for (int i = 0; i < l->n; i++) m = l->v[i] > m ? l->v[i] : m;
  return m;
}

static int parse_args(int argc, char **argv, struct bench_args *a) {
  a->pp = (struct int_list){{512}, 1};
  a->tg = (struct int_list){{128}, 1};
  a->depth = (struct int_list){{0}, 1};
  a->reps = 5;
  a->warmup = 1;
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (tsr_cli_is_help(f)) {
      bench_usage(stdout);
      return TSR_EXIT_OK;
    }
    if (f[0] != '-') return usage_error("unexpected argument ", f);
    if (!strcmp(f, "--op-times") || !strcmp(f, "--speculate")) {
      *(f[2] == 'o' ? &a->op_times : &a->speculate) = true;
      continue;
    }
    if (i + 1 >= argc) return usage_error("a value is missing after ", f);
    const char *v = argv[++i];
    const int common = tsr_cli_engine_flag(&a->eng, f, v);
    if (common < 0) return usage_error("not a valid value for ", f);
    if (common) continue;
    bool ok = true;
    if (!strcmp(f, "-p")) ok = parse_list(v, 1, 1 << 20, true, &a->pp);
    else if (!strcmp(f, "-n")) ok = parse_list(v, 1, 1 << 20, true, &a->tg);
    else if (!strcmp(f, "-d")) ok = parse_list(v, 0, 1 << 24, false, &a->depth);
    else if (!strcmp(f, "-r")) ok = tsr_cli_parse_i64(v, 1, 1000, &a->reps);
    else if (!strcmp(f, "--warmup")) ok = tsr_cli_parse_i64(v, 0, 100, &a->warmup);
    else if (!strcmp(f, "--json")) a->json = v;
    else if (!strcmp(f, "--prompt-file")) a->prompt_file = v;
    else if (!strcmp(f, "--progress")) ok = tsr_cli_parse_i64(v, 1, 1 << 24, &a->progress);
    else if (!strcmp(f, "--parallel")) ok = tsr_cli_parse_i64(v, 1, 64, &a->parallel);
    else if (!strcmp(f, "--depth-fill")) {
      ok = !strcmp(v, "compute") || !strcmp(v, "positions");
      a->fill_positions = !strcmp(v, "positions");
    }
    else return usage_error("unknown option ", f);
    if (!ok) return usage_error("not a valid value for ", f);
  }
  if (!a->eng.model && !a->eng.profile)
    return usage_error("give -m MODEL.gguf or --profile P", "");
  if (!a->pp.n && !a->tg.n) return usage_error("-p 0 and -n 0 leave nothing to measure", "");
  if (a->speculate != (a->prompt_file != NULL))
    return usage_error("--speculate and --prompt-file go together: speculation continues a "
                       "text, and the text is for it", "");
  if (a->speculate && !a->tg.n) return usage_error("--speculate with -n 0 has nothing to run", "");
  if (a->speculate && a->fill_positions)
    return usage_error("--speculate continues a computed text: not with --depth-fill positions",
                       "");
  if (a->speculate && a->parallel > 1)
    return usage_error("--speculate drafts for one sequence: not with --parallel above 1", "");
  int64_t test = list_max(&a->pp) > list_max(&a->tg) ? list_max(&a->pp) : list_max(&a->tg);
  if (a->speculate) test += TSR_SPEC_MAX_DRAFT + 1; /* the last step's verify batch */
  const int64_t n_seq = a->parallel > 0 ? a->parallel : 1;
  snprintf(a->ctx_set, sizeof a->ctx_set, "context=%lld",
           (long long)(list_max(&a->depth) + n_seq * test));
  tsr_cli_engine_preset(&a->eng, a->ctx_set);
  if (a->parallel) {
    snprintf(a->par_set, sizeof a->par_set, "server.parallel=%lld", (long long)a->parallel);
    tsr_cli_engine_preset(&a->eng, a->par_set);
  }
  return -1;
}

/* ---- what a token costs ---------------------------------------------------- */

/* Tables read one row per token (get_rows), not streamed whole by a step. */
static bool row_table(const struct tsr_gguf *m, const char *name) {
  if (!strcmp(name, "per_layer_token_embd.weight")) return true;
  /* tied embeddings are also the output head, read whole */
  return !strcmp(name, "token_embd.weight") && tsr_gguf_find_tensor(m, "output.weight");
}

static void cost_of(const struct tsr_setup *s, struct cost *c) {
  memset(c, 0, sizeof *c);
  const struct tsr_gguf *m = s->model;
  uint32_t n_expert = 0, n_used = 0;
  char key[160];
  snprintf(key, sizeof key, "%s.expert_count", s->arch_name);
  if (tsr_gguf_get_u32(m, key, &n_expert) != TSR_OK) n_expert = 0;
  snprintf(key, sizeof key, "%s.expert_used_count", s->arch_name);
  if (tsr_gguf_get_u32(m, key, &n_used) != TSR_OK) n_used = 0;
  for (int64_t i = 0; i < tsr_gguf_n_tensors(m); i++) {
    const struct tsr_gguf_tensor *t = tsr_gguf_tensor_at(m, i);
    if (t->n_dims < 2 || row_table(m, t->name)) continue; /* vectors: negligible */
    double share = 1.0;
    if (strstr(t->name, "_exps") && n_expert > 0 && n_used > 0) share = (double)n_used / n_expert;
    c->weight_bytes += share * (double)t->nbytes;
    c->weight_params += share * (double)t->n_elements;
    /* the head: output.weight, or the embedding tied to it */
    if (!strcmp(t->name, "output.weight") || !strcmp(t->name, "token_embd.weight"))
      c->head_params = (double)t->n_elements;
  }
  const struct tsr_memory_plan *p = &s->memory;
  for (int k = 0; k < TSR_LAYER_KIND_COUNT; k++) {
    c->kv_cells[k] = p->kv_cells[k];
    if (k != TSR_LAYER_LINEAR && p->kv_cells[k])
      c->kv_bytes_per_cell[k] = (double)p->kv[k] / (double)p->kv_cells[k];
  }
  if (p->kv_cells[TSR_LAYER_LINEAR])
    c->state_bytes = (double)p->kv[TSR_LAYER_LINEAR] / (double)p->kv_cells[TSR_LAYER_LINEAR];
  for (int32_t l = 0; l < s->n_layers; l++) {
    const struct tsr_arch_layer *L = &s->layers[l];
    const double per_key = 2.0 * L->n_head * (double)(L->head_dim_k + L->head_dim_v);
    if (L->kind == TSR_LAYER_FULL) c->attn_flops_per_key += per_key;
    else if (L->kind == TSR_LAYER_SLIDING) c->swa_flops_per_key += per_key, c->window = L->window;
  }
}

/* Keys a token at position pos attends to in a sliding layer. */
static double swa_keys(const struct cost *c, double pos) {
  return c->window > 0 && pos + 1 > c->window ? c->window : pos + 1;
}

/* Bytes a decode step at position pos reads. */
/* Bytes a decode step of n_seq sequences at position pos reads: the weights once, each
** sequence's KV and recurrent state (read and written). */
static double step_bytes(const struct cost *c, double pos, double n_seq) {
  double b = 2.0 * c->state_bytes;
  b += c->kv_bytes_per_cell[TSR_LAYER_FULL] * (pos + 1);
  b += c->kv_bytes_per_cell[TSR_LAYER_SLIDING] * swa_keys(c, pos);
  return c->weight_bytes + n_seq * b;
}

/* FLOPs of a token at position pos (prefill) when the LM head computed head_rows rows for
** every token (one per token: all of them; 1 / n for an n-token prefill reading the last). */
static double token_flops(const struct cost *c, double pos, double head_rows) {
  return 2.0 * (c->weight_params - c->head_params) + 2.0 * c->head_params * head_rows +
         c->attn_flops_per_key * (pos + 1) + c->swa_flops_per_key * swa_keys(c, pos);
}

/* ---- ceilings ------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The backend's ceilings (cuda: the vendor's copy and GEMM; cpu: a streaming read and its
** cores' multiply-add peak). */
static tsr_status ceilings(struct tsr_backend *be, struct tsr_backend_ceilings *c) {
  memset(c, 0, sizeof *c);
  const tsr_status st = tsr_backend_probe(be, c);
  if (st == TSR_ERR_UNSUPPORTED)
    return tsr_error_set(st, "bench: backend %s measures no ceilings", tsr_backend_name(be));
  return st;
}

/* ---- the tests ------------------------------------------------------------ */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static void random_tokens(int32_t *t, int64_t n, int32_t n_vocab) {
  for (int64_t i = 0; i < n; i++) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    t[i] = (int32_t)(g_rng % (uint64_t)n_vocab);
  }
}

/* --prompt-file's tokens, which fill the depths when given */
static struct tsr_qtext g_text;

/* Tokens from..from+n of a depth's context: the text's, else random ids. */
static void context_tokens(int32_t *t, int64_t from, int64_t n, int32_t n_vocab) {
  if (g_text.ids) memcpy(t, g_text.ids + from, (size_t)n * sizeof *t);
  else random_tokens(t, n, n_vocab);
}

/* n tokens onto sequence 0: one call, or (progress > 0 and n longer) calls of progress
** tokens, each followed by a line on stderr saying how far the `what` has come. */
static tsr_status prefill(struct tsr_engine *e, const int32_t *tok, int64_t n, float *logits,
                          int64_t progress, const char *what) {
  if (progress <= 0 || n <= progress) return tsr_engine_eval(e, 0, tok, (int32_t)n, logits, NULL);
  const double t0 = tsr_now_s();
  double s_before = 0;
  for (int64_t done = 0; done < n;) {
    const int64_t k = n - done < progress ? n - done : progress;
    const tsr_status st = tsr_engine_eval(e, 0, tok + done, (int32_t)k, logits, NULL);
    if (st != TSR_OK) return st;
    done += k;
    const double s = tsr_now_s() - t0;
    fprintf(stderr, "tessera bench: %s: %lld of %lld tokens, %.0f t/s, %.1f min so far, "
            "about %.1f min left\n", what, (long long)done, (long long)n, (double)done / s,
            s / 60.0, bench_fill_seconds_left(n, done, k, s, s - s_before) / 60.0);
    s_before = s;
  }
  return TSR_OK;
}

/* The depth fills of a run (fills are not timed tests, but a 1M-token fill is the figure of a
** long-context run): how many, their tokens and seconds, and the longest. */
static struct {
  bool positions; /* --depth-fill positions: tsr_engine_fill_positions, nothing computed */
  int n;
  int64_t tokens, longest_from, longest_tokens;
  double seconds, longest_seconds;
} g_fills;

static tsr_status depth_fill(struct tsr_engine *e, const int32_t *tok, int64_t from, int64_t n,
                             float *logits, int64_t progress) {
  const double t0 = tsr_now_s();
  tsr_status st = g_fills.positions ? tsr_engine_fill_positions(e, 0, (int32_t)n)
                                    : prefill(e, tok, n, logits, progress, "depth fill");
  /* a computed fill's graphs bring the model and cache to a device; after a fill of
  ** positions the first timed step would: one step untimed, taken off again */
  if (st == TSR_OK && g_fills.positions) {
    st = tsr_engine_eval(e, 0, tok, 1, logits, NULL);
    if (st == TSR_OK) st = tsr_engine_seq_rm(e, 0, (int32_t)(from + n), -1);
  }
  const double s = tsr_now_s() - t0;
  if (st != TSR_OK) return st;
  g_fills.n++, g_fills.tokens += n, g_fills.seconds += s;
  if (n > g_fills.longest_tokens)
    g_fills.longest_from = from, g_fills.longest_tokens = n, g_fills.longest_seconds = s;
  return st;
}

/* Sequence 0 holding exactly `depth` random tokens: the tested tail cut off, a
** shorter sequence filled on to the depth (so depths in rising order fill once), or
** (a tail the model cannot remove: a sliding ring past its slack, recurrent state)
** everything prefilled anew. */
static tsr_status reset_to(struct tsr_engine *e, int64_t depth, int32_t *tok, float *logits,
                           int64_t progress) {
  const int64_t len = tsr_engine_seq_len(e, 0);
  if (len == depth) return TSR_OK;
  if (len > depth && tsr_engine_seq_rm(e, 0, (int32_t)depth, -1) == TSR_OK) return TSR_OK;
  if (len < depth) {
    context_tokens(tok, len, depth - len, tsr_engine_n_vocab(e));
    return depth_fill(e, tok, len, depth - len, logits, progress);
  }
  tsr_status st = tsr_engine_seq_rm(e, 0, 0, -1);
  if (st != TSR_OK || depth == 0) return st;
  context_tokens(tok, 0, depth, tsr_engine_n_vocab(e));
  return depth_fill(e, tok, 0, depth, logits, progress);
}

/* Sequences 0 .. n_seq-1 each holding exactly `depth` tokens: sequence 0 as reset_to leaves
** it, the others copies of it (sharing its cells). */
static tsr_status reset_seqs(struct tsr_engine *e, int64_t depth, int64_t n_seq, int32_t *tok,
                             float *logits, int64_t progress) {
  tsr_status st = TSR_OK;
  for (int32_t i = 1; st == TSR_OK && i < n_seq; i++) st = tsr_engine_seq_rm(e, i, 0, -1);
  if (st == TSR_OK) st = reset_to(e, depth, tok, logits, progress);
  for (int32_t i = 1; st == TSR_OK && depth > 0 && i < n_seq; i++) st = tsr_engine_seq_cp(e, 0, i);
  return st;
}

/* Seconds of greedy decoding continuing the context (which holds the text up to the test's
** start) through speculative steps until n tokens came: the first from the text's next
** token, evaluated untimed. */
static tsr_status run_speculative(struct tsr_engine *e, int64_t n, float *logits, double *s) {
  const int64_t at = tsr_engine_seq_len(e, 0);
  tsr_status st = tsr_engine_eval(e, 0, g_text.ids + at, 1, logits, NULL);
  struct tsr_sampler *smp = NULL;
  const struct tsr_sampler_params greedy = {.temperature = 0, .top_p = 1};
  const int32_t v = tsr_engine_n_vocab(e);
  if (st == TSR_OK) st = tsr_sampler_new(&greedy, v, &smp);
  int32_t next = 0, out[TSR_SPEC_MAX_DRAFT + 1], got = 0;
  if (st == TSR_OK) st = tsr_sampler_sample(smp, logits, &next);
  const double t0 = tsr_now_s();
  for (int64_t done = 0; st == TSR_OK && done < n; done += got) {
    st = tsr_engine_speculate(e, 0, next, smp, TSR_SPEC_MAX_DRAFT, out, &got);
    if (st == TSR_OK) next = out[got - 1];
  }
  *s = tsr_now_s() - t0;
  tsr_sampler_free(smp);
  return st;
}

/* Seconds of one run of a test: pp evaluates n tokens in one call, tg n steps; with n_seq
** sequences, pp their n_seq prompts in one batch and tg n batches of a token for each. seq
** holds n_seq * n ids; logits a row for each sequence. */
static tsr_status run_once(struct tsr_engine *e, bool pp, int64_t n, int64_t n_seq, int32_t *tok,
                           int32_t *seq, float *logits, int64_t progress, double *s) {
  random_tokens(tok, n * n_seq, tsr_engine_n_vocab(e));
  for (int64_t i = 0; n_seq > 1 && i < n * n_seq; i++) seq[i] = (int32_t)(pp ? i / n : i % n_seq);
  const double t0 = tsr_now_s();
  tsr_status st = TSR_OK;
  if (n_seq > 1) {
    const int64_t per_call = pp ? n * n_seq : n_seq;
    for (int64_t i = 0; st == TSR_OK && i < n * n_seq; i += per_call) {
      const struct tsr_engine_batch b = {.n = (int32_t)per_call, .tokens = tok + i, .seq = seq + i};
      st = tsr_engine_eval_batch(e, &b, logits);
    }
  } else if (pp) {
    st = prefill(e, tok, n, logits, progress, "prefill");
  } else {
    for (int64_t i = 0; st == TSR_OK && i < n; i++)
      st = tsr_engine_eval(e, 0, tok + i, 1, logits, NULL);
  }
  *s = tsr_now_s() - t0;
  return st;
}

/* r->times, when not NULL, gathers the nodes of the timed repetitions. */
static tsr_status run_test(struct tsr_engine *e, const struct cost *c,
                           const struct tsr_backend_ceilings *ceil, bool pp, bool spec, int64_t n,
                           int64_t depth, int64_t n_seq, int64_t reps, int64_t warmup,
                           int64_t progress, int32_t *tok, int32_t *seq, float *logits,
                           struct result *r) {
  double *ts = malloc(sizeof(double) * (size_t)reps), sum = 0, sum2 = 0;
  if (!ts) return tsr_error_set(TSR_ERR_NOMEM, "bench: %lld repetitions", (long long)reps);
  struct tsr_backend *be = tsr_engine_backend(e);
  tsr_status st = TSR_OK;
  r->wall_s = 0;
  int64_t head_rows = 0; /* rows of logits the timed repetitions computed */
  /* a speculative test starts one token in (a depth 0's first token) */
  const int64_t start = spec ? (depth > 0 ? depth - 1 : 0) : depth;
  struct tsr_engine_spec_stats s0, s1;
  r->spec = spec;
  memset(&r->steps, 0, sizeof r->steps);
  for (int64_t i = -warmup; st == TSR_OK && i < reps; i++) { /* i < 0: the warm-ups */
    double s = 0;
    st = reset_seqs(e, start, n_seq, tok, logits, progress);
    if (st == TSR_OK && r->times && i >= 0) st = tsr_backend_time_nodes(be, r->times);
    const int64_t rows0 = tsr_engine_logits_rows(e);
    uint64_t cap0 = 0, rep0 = 0, cap1 = 0, rep1 = 0;
    r->graphs = tsr_backend_graph_counts(be, &cap0, &rep0);
    tsr_engine_spec_stats(e, &s0);
    if (st == TSR_OK)
      st = spec ? run_speculative(e, n, logits, &s)
                : run_once(e, pp, n, n_seq, tok, seq, logits, progress, &s);
    tsr_engine_spec_stats(e, &s1);
    if (r->graphs && i >= 0 && tsr_backend_graph_counts(be, &cap1, &rep1))
      r->captures += cap1 - cap0, r->replays += rep1 - rep0;
    if (r->times && i >= 0) tsr_backend_time_nodes(be, NULL);
    if (st == TSR_OK && i >= 0 && spec) {
      r->steps.steps += s1.steps - s0.steps, r->steps.drafted += s1.drafted - s0.drafted;
      r->steps.accepted += s1.accepted - s0.accepted;
      r->steps.draft_seconds += s1.draft_seconds - s0.draft_seconds;
      r->steps.verify_seconds += s1.verify_seconds - s0.verify_seconds;
      for (int k = 0; k < TSR_ENGINE_SPEC_POSITIONS; k++)
        r->steps.drafted_at[k] += s1.drafted_at[k] - s0.drafted_at[k],
            r->steps.kept_at[k] += s1.kept_at[k] - s0.kept_at[k];
    }
    if (st == TSR_OK && i >= 0) {
      /* a speculative run stops after the step that reached n: count what it made */
      ts[i] = (spec ? (double)(tsr_engine_seq_len(e, 0) - start - 1) : (double)(n * n_seq)) / s;
      sum += ts[i], sum2 += ts[i] * ts[i];
      r->wall_s += s;
      head_rows += tsr_engine_logits_rows(e) - rows0;
    }
  }
  if (st == TSR_OK) {
    qsort(ts, (size_t)reps, sizeof *ts, cmp_double);
    r->is_pp = pp, r->n_tokens = n, r->depth = depth, r->n_seq = n_seq;
    r->median_ts = reps % 2 ? ts[reps / 2] : 0.5 * (ts[reps / 2 - 1] + ts[reps / 2]);
    const double mean = sum / (double)reps;
    r->sd_ts = reps > 1 ? sqrt(fmax(0.0, (sum2 - reps * mean * mean) / (double)(reps - 1))) : 0;
    snprintf(r->test, sizeof r->test, "%s%lld%s", pp ? "pp" : "tg", (long long)n,
             spec ? " spec" : "");
    if (n_seq > 1) snprintf(r->test + strlen(r->test), sizeof r->test - strlen(r->test), " x%lld",
                            (long long)n_seq);
    if (depth) snprintf(r->test + strlen(r->test), sizeof r->test - strlen(r->test), " @ d%lld",
                        (long long)depth);
    /* per token, averaged over the positions the test covers (a speculative test reads the
    ** weights once a step, not a token: its rate is not judged against the ceiling) */
    const double mid = (double)depth + 0.5 * (double)(n - 1);
    r->achieved = pp   ? token_flops(c, mid, (double)head_rows / (double)(reps * n * n_seq)) *
                             r->median_ts
                  : spec ? 0
                         : step_bytes(c, mid, (double)n_seq) * r->median_ts / (double)n_seq;
    r->ceiling = pp ? ceil->gemm_flops : ceil->copy_bytes_per_s;
  }
  free(ts);
  return st;
}

/* ---- output --------------------------------------------------------------- */

static void print_table(const struct tsr_setup *s, const char *backend, const struct cost *c,
                        const struct result *r, int n, int64_t reps) {
  const char *name = strrchr(s->model_path, '/');
  name = name ? name + 1 : s->model_path;
  printf("| %-28s | %10s | %8s | %-7s | %-16s | %20s | %-26s |\n", "model", "size", "params",
         "backend", "test", "t/s", "achieved (of ceiling)");
  printf("| %.28s | %.10s | %.8s | %.7s | %.16s | %.20s | %.26s |\n",
         "----------------------------", "----------", "--------", "-------", "----------------",
         "--------------------", "--------------------------");
  for (int i = 0; i < n; i++) {
    char ach[64];
    if (r[i].spec)
      snprintf(ach, sizeof ach, "%.2fx plain, %.1f%% kept", r[i].median_ts / r[i].plain_ts,
               r[i].steps.drafted ? 100.0 * r[i].steps.accepted / r[i].steps.drafted : 0.0);
    else if (r[i].is_pp)
      snprintf(ach, sizeof ach, "%.2f TFLOP/s (%.1f%%)", r[i].achieved / 1e12,
               100.0 * r[i].achieved / r[i].ceiling);
    else
      snprintf(ach, sizeof ach, "%.1f GB/s (%.1f%%)", r[i].achieved / 1e9,
               100.0 * r[i].achieved / r[i].ceiling);
    char ts[48];
    snprintf(ts, sizeof ts, "%.2f +/- %.2f", r[i].median_ts, r[i].sd_ts);
    printf("| %-28.28s | %6.2f MiB | %6.2f M | %-7s | %-16s | %20s | %-26s |\n", name,
           tsr_gguf_file_size(s->model) / 1048576.0, c->weight_params / 1e6, backend, r[i].test,
           ts, ach);
  }
  /* what the speculative steps did, over the timed runs */
  for (int i = 0; i < n; i++) {
    const struct tsr_engine_spec_stats *t = &r[i].steps;
    if (!r[i].spec || !t->steps) continue;
    const double busy = t->draft_seconds + t->verify_seconds;
    printf("speculation, %s: %.2fx the plain tg's %.2f t/s; %lld steps drafted %lld tokens and "
           "kept %lld (%.1f%%), %.2f tokens a step; drafting %.1f%% and verifying %.1f%% of "
           "the steps' time\n", r[i].test, r[i].median_ts / r[i].plain_ts, r[i].plain_ts,
           (long long)t->steps, (long long)t->drafted, (long long)t->accepted,
           t->drafted ? 100.0 * t->accepted / t->drafted : 0.0,
           (double)(t->accepted + t->steps) / t->steps, 100.0 * t->draft_seconds / busy,
           100.0 * t->verify_seconds / busy);
    printf("  kept by draft position:");
    for (int k = 0; k < TSR_ENGINE_SPEC_POSITIONS && t->drafted_at[k]; k++)
      printf(" %d: %.2f (%lld)", k + 1, (double)t->kept_at[k] / t->drafted_at[k],
             (long long)t->drafted_at[k]);
    printf("\n");
  }
  /* whether decode steps replayed: a step that did not ran node by node */
  for (int i = 0; i < n; i++)
    if (r[i].graphs && !r[i].is_pp)
      printf("graphs, %s: %llu of %lld steps replayed, %llu captured\n", r[i].test,
             (unsigned long long)r[i].replays, (long long)(r[i].n_tokens * reps),
             (unsigned long long)r[i].captures);
}

/* Per token of the timed repetitions: where the time went. */
static void print_op_times(const struct result *r, int64_t reps) {
  const struct tsr_op_times *t = r->times;
  const double per = 1e3 / ((double)(r->n_tokens * r->n_seq) * (double)reps); /* ms a token */
  printf("\nop times, %s (%lld runs; ms per token): %.3f wall = %.3f outside computes + "
         "%.3f in computes outside nodes + %.3f in nodes\n", r->test, (long long)reps,
         r->wall_s * per, (r->wall_s - t->compute_seconds) * per,
         (t->compute_seconds - t->node_seconds) * per, t->node_seconds * per);
  printf("  %-40s %12s %10s %8s\n", "node kind", "calls/token", "ms/token", "of wall");
  for (int k = 0; k < t->n_kinds; k++)
    printf("  %-40s %12.2f %10.4f %7.1f%%\n", t->kind[k].name,
           (double)t->kind[k].calls / ((double)(r->n_tokens * r->n_seq) * (double)reps),
           t->kind[k].seconds * per, 100.0 * t->kind[k].seconds / r->wall_s);
}

static cJSON *op_times_json(const struct result *r, int64_t reps) {
  const struct tsr_op_times *t = r->times;
  const double tokens = (double)(r->n_tokens * r->n_seq) * (double)reps;
  cJSON *o = cJSON_CreateObject(), *kinds = cJSON_CreateArray();
  cJSON_AddNumberToObject(o, "wall_seconds_per_token", r->wall_s / tokens);
  cJSON_AddNumberToObject(o, "compute_seconds_per_token", t->compute_seconds / tokens);
  cJSON_AddNumberToObject(o, "node_seconds_per_token", t->node_seconds / tokens);
  cJSON_AddNumberToObject(o, "computes_per_token", (double)t->computes / tokens);
  for (int k = 0; k < t->n_kinds; k++) {
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "kind", t->kind[k].name);
    cJSON_AddNumberToObject(x, "calls_per_token", (double)t->kind[k].calls / tokens);
    cJSON_AddNumberToObject(x, "seconds_per_token", t->kind[k].seconds / tokens);
    cJSON_AddItemToArray(kinds, x);
  }
  cJSON_AddItemToObject(o, "kinds", kinds);
  return o;
}

/* The run's memory at its peak: the device backend's, else the process's resident set. */
struct memory_use {
  bool device;
  struct tsr_backend_memory m;
  double host_peak_bytes;
};

static void memory_use(struct tsr_backend *be, struct memory_use *u) {
  memset(u, 0, sizeof *u);
  u->device = tsr_backend_memory(be, &u->m) == TSR_OK;
  struct rusage ru;
  if (!getrusage(RUSAGE_SELF, &ru)) u->host_peak_bytes = 1024.0 * (double)ru.ru_maxrss;
}

static void print_memory(const struct memory_use *u) {
  const double gib = 1024.0 * 1024.0 * 1024.0;
  if (u->device)
    printf("\ndevice memory at its peak: %.2f GiB held by the backend (weights, caches, arena, "
           "scratch; %.2f GiB now), %.2f of %.2f GiB in use on the device (every process; "
           "sampled after computes that allocated)\n", u->m.held_peak_bytes / gib, u->m.held_bytes / gib,
           u->m.device_used_peak_bytes / gib, u->m.device_total_bytes / gib);
  printf("%shost memory at its peak: %.1f MiB resident\n", u->device ? "" : "\n",
         u->host_peak_bytes / 1048576.0);
}

static bool write_json(const char *path, const struct tsr_setup *s, const char *backend,
                       const struct tsr_backend_ceilings *ceil, const struct cost *c,
                       const struct result *r, int n, int64_t reps, int64_t warmup,
                       const struct memory_use *u) {
  cJSON *o = cJSON_CreateObject(), *tests = cJSON_CreateArray();
  cJSON_AddStringToObject(o, "model", s->model_path);
  cJSON_AddStringToObject(o, "backend", backend);
  cJSON_AddNumberToObject(o, "model_bytes", (double)tsr_gguf_file_size(s->model));
  cJSON_AddNumberToObject(o, "active_weight_bytes_per_token", c->weight_bytes);
  cJSON_AddNumberToObject(o, "active_params", c->weight_params);
  cJSON_AddNumberToObject(o, "repetitions", (double)reps);
  cJSON_AddNumberToObject(o, "warmups", (double)warmup);
  cJSON *mem = cJSON_AddObjectToObject(o, "memory");
  cJSON_AddNumberToObject(mem, "host_peak_resident_bytes", u->host_peak_bytes);
  if (u->device) {
    cJSON_AddNumberToObject(mem, "backend_held_peak_bytes", (double)u->m.held_peak_bytes);
    cJSON_AddNumberToObject(mem, "backend_held_bytes", (double)u->m.held_bytes);
    cJSON_AddNumberToObject(mem, "device_used_peak_bytes", (double)u->m.device_used_peak_bytes);
    cJSON_AddNumberToObject(mem, "device_total_bytes", (double)u->m.device_total_bytes);
  }
  cJSON_AddNumberToObject(o, "copy_bytes_per_second", ceil->copy_bytes_per_s);
  cJSON_AddStringToObject(o, "copy_measured_with", ceil->copy_how);
  cJSON_AddNumberToObject(o, "gemm_flops", ceil->gemm_flops);
  cJSON_AddStringToObject(o, "gemm_measured_with", ceil->gemm_how);
  for (int i = 0; i < n; i++) {
    cJSON *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "test", r[i].test);
    cJSON_AddStringToObject(t, "kind", r[i].is_pp ? "pp" : r[i].spec ? "tg_spec" : "tg");
    cJSON_AddNumberToObject(t, "tokens", (double)r[i].n_tokens);
    cJSON_AddNumberToObject(t, "depth", (double)r[i].depth);
    cJSON_AddNumberToObject(t, "sequences", (double)r[i].n_seq);
    cJSON_AddNumberToObject(t, "tokens_per_second_median", r[i].median_ts);
    cJSON_AddNumberToObject(t, "tokens_per_second_stddev", r[i].sd_ts);
    cJSON_AddNumberToObject(t, r[i].is_pp ? "flops_per_second" : "bytes_per_second",
                            r[i].achieved);
    cJSON_AddNumberToObject(t, "fraction_of_ceiling", r[i].achieved / r[i].ceiling);
    if (r[i].graphs) {
      cJSON_AddNumberToObject(t, "graph_captures", (double)r[i].captures);
      cJSON_AddNumberToObject(t, "graph_replays", (double)r[i].replays);
    }
    if (r[i].times) cJSON_AddItemToObject(t, "op_times", op_times_json(&r[i], reps));
    if (r[i].spec) {
      const struct tsr_engine_spec_stats *x = &r[i].steps;
      cJSON *sp = cJSON_AddObjectToObject(t, "speculation");
      cJSON_AddNumberToObject(sp, "speedup_over_plain_tg", r[i].median_ts / r[i].plain_ts);
      cJSON_AddNumberToObject(sp, "steps", (double)x->steps);
      cJSON_AddNumberToObject(sp, "drafted", (double)x->drafted);
      cJSON_AddNumberToObject(sp, "accepted", (double)x->accepted);
      cJSON_AddNumberToObject(sp, "tokens_per_step",
                              x->steps ? (double)(x->accepted + x->steps) / x->steps : 0);
      cJSON_AddNumberToObject(sp, "draft_seconds", x->draft_seconds);
      cJSON_AddNumberToObject(sp, "verify_seconds", x->verify_seconds);
      cJSON *at = cJSON_AddArrayToObject(sp, "kept_by_position");
      for (int k = 0; k < TSR_ENGINE_SPEC_POSITIONS && x->drafted_at[k]; k++) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddNumberToObject(p, "drafted", (double)x->drafted_at[k]);
        cJSON_AddNumberToObject(p, "kept", (double)x->kept_at[k]);
        cJSON_AddItemToArray(at, p);
      }
    }
    cJSON_AddItemToArray(tests, t);
  }
  cJSON_AddItemToObject(o, "tests", tests);
  cJSON_AddStringToObject(o, "depth_fill", g_fills.positions ? "positions" : "compute");
  cJSON *fills = g_fills.n ? cJSON_AddObjectToObject(o, "depth_fills") : NULL;
  if (fills) {
    cJSON_AddNumberToObject(fills, "count", g_fills.n);
    cJSON_AddNumberToObject(fills, "tokens", (double)g_fills.tokens);
    cJSON_AddNumberToObject(fills, "seconds", g_fills.seconds);
  }
  if (fills && !g_fills.positions) { /* a computed fill's rate is a prefill figure */
    cJSON *l = cJSON_AddObjectToObject(fills, "longest");
    cJSON_AddNumberToObject(l, "from_depth", (double)g_fills.longest_from);
    cJSON_AddNumberToObject(l, "tokens", (double)g_fills.longest_tokens);
    cJSON_AddNumberToObject(l, "seconds", g_fills.longest_seconds);
    cJSON_AddNumberToObject(l, "tokens_per_second", g_fills.longest_tokens / g_fills.longest_seconds);
  }
  char *text = cJSON_Print(o);
  cJSON_Delete(o);
  FILE *f = text ? fopen(path, "w") : NULL;
  bool ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
  if (f && fclose(f)) ok = false;
  free(text);
  return ok;
}

/* --prompt-file's tokens into g_text, for a profile that names a speculator; the text must
** cover the largest depth. */
static tsr_status load_prompt(const struct tsr_setup *s, const struct bench_args *a) {
  if (!s->profile->has_speculator)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "--speculate: the profile names no speculator "
                         "(speculator: {name: ...})");
  struct tsr_tokenizer *tok = NULL;
  tsr_status st = tsr_tokenizer_load(s->model, &tok);
  /* a prompt: its special-token names are tokens, as tessera run's are */
  if (st == TSR_OK) st = tsr_qtext_load(a->prompt_file, tok, true, &g_text);
  tsr_tokenizer_free(tok);
  const int64_t need = list_max(&a->depth) > 1 ? list_max(&a->depth) : 1;
  if (st == TSR_OK && (int64_t)g_text.n_ids < need)
    st = tsr_error_set(TSR_ERR_INVALID_ARG, "--prompt-file %s: %zu tokens, and the depths need "
                       "%lld", a->prompt_file, g_text.n_ids, (long long)need);
  return st;
}

int tsr_cli_bench(int argc, char **argv) {
  struct bench_args a = {0};
  int code = parse_args(argc, argv, &a);
  if (code >= 0) return code;
  g_fills.positions = a.fill_positions;
  struct tsr_engine_options eo = {.profile_path = a.eng.profile, .sets = a.eng.sets,
                                  .n_sets = a.eng.n_sets, .model_path = a.eng.model,
                                  .n_threads = a.eng.threads};
  struct tsr_engine *e = NULL;
  tsr_status st = tsr_engine_new(&eo, &e);
  if (st != TSR_OK) {
    fprintf(stderr, "tessera bench: %s\n", tsr_error_message());
    tsr_engine_free(e);
    return st == TSR_ERR_NOMEM ? TSR_EXIT_RUNTIME : TSR_EXIT_USAGE;
  }
  const struct tsr_setup *s = tsr_engine_setup(e);
  struct tsr_backend *be = tsr_engine_backend(e);
  const char *backend = tsr_backend_name(be);
  struct cost c;
  cost_of(s, &c);
  if (a.speculate && load_prompt(s, &a) != TSR_OK) {
    fprintf(stderr, "tessera bench: %s\n", tsr_error_message());
    tsr_qtext_free(&g_text);
    tsr_engine_free(e);
    return TSR_EXIT_USAGE;
  }
  struct tsr_backend_ceilings ceil;
  st = ceilings(be, &ceil);
  if (st == TSR_OK) {
    printf("ceiling copy: %.1f GB/s (%s)\n", ceil.copy_bytes_per_s / 1e9, ceil.copy_how);
    printf("ceiling gemm: %.2f TFLOP/s (%s)\n", ceil.gemm_flops / 1e12, ceil.gemm_how);
    printf("per token: %.2f MiB of weights read, %.2f M active parameters\n\n",
           c.weight_bytes / 1048576.0, c.weight_params / 1e6);
  }
  const int64_t most = list_max(&a.depth) + (list_max(&a.pp) > list_max(&a.tg) ? list_max(&a.pp)
                                                                               : list_max(&a.tg));
  const int64_t n_seq = a.parallel ? a.parallel : 1;
  if (st == TSR_OK && tsr_engine_n_seq(e) < n_seq) /* a later --set server.parallel */
    st = tsr_error_set(TSR_ERR_INVALID_ARG, "--parallel %lld: the profile's server.parallel is %d",
                       (long long)n_seq, (int)tsr_engine_n_seq(e));
  const int64_t n_tok = (most > 0 ? most : 1) * n_seq;
  int32_t *tok = malloc(sizeof(int32_t) * (size_t)n_tok);
  int32_t *seq = malloc(sizeof(int32_t) * (size_t)n_tok);
  float *logits = malloc(sizeof(float) * (size_t)tsr_engine_n_vocab(e) * (size_t)n_seq);
  struct result r[2 * MAX_LIST * MAX_LIST] = {0};
  const int n_tests = a.depth.n * (a.pp.n + a.tg.n * (a.speculate ? 2 : 1));
  int n_r = 0;
  if (st == TSR_OK && (!tok || !seq || !logits))
    st = tsr_error_set(TSR_ERR_NOMEM, "bench: token buffers");
  for (int i = 0; st == TSR_OK && a.op_times && i < n_tests; i++)
    if (!(r[i].times = calloc(1, sizeof *r[i].times)))
      st = tsr_error_set(TSR_ERR_NOMEM, "bench: op times");
  /* a backend that cannot time its nodes is refused before any test runs */
  if (st == TSR_OK && a.op_times && (st = tsr_backend_time_nodes(be, r[0].times)) == TSR_OK)
    st = tsr_backend_time_nodes(be, NULL);
  for (int d = 0; st == TSR_OK && d < a.depth.n; d++) {
    for (int i = 0; st == TSR_OK && i < a.pp.n; i++)
      st = run_test(e, &c, &ceil, true, false, a.pp.v[i], a.depth.v[d], n_seq, a.reps, a.warmup,
                    a.progress, tok, seq, logits, &r[n_r++]);
    for (int i = 0; st == TSR_OK && i < a.tg.n; i++) {
      st = run_test(e, &c, &ceil, false, false, a.tg.v[i], a.depth.v[d], n_seq, a.reps,
                    a.warmup, a.progress, tok, seq, logits, &r[n_r++]);
      if (st != TSR_OK || !a.speculate) continue;
      r[n_r].plain_ts = r[n_r - 1].median_ts;
      st = run_test(e, &c, &ceil, false, true, a.tg.v[i], a.depth.v[d], 1, a.reps, a.warmup,
                    a.progress, tok, seq, logits, &r[n_r++]);
    }
  }
  if (st == TSR_OK) {
    print_table(s, backend, &c, r, n_r, a.reps);
    for (int i = 0; i < n_r; i++)
      if (r[i].times) tsr_op_times_sort(r[i].times), print_op_times(&r[i], a.reps);
    if (g_fills.n && g_fills.positions)
      printf("\ndepth fills: %d, %lld positions, filled without compute (--depth-fill "
             "positions): the cache at depth holds zeros (on a device, what its cells held), "
             "not a computed context; the tests read a cache of that size, every V row of it "
             "where an attention would skip rows whose weights underflow (the cpu's)\n",
             g_fills.n, (long long)g_fills.tokens);
    else if (g_fills.n)
      printf("\ndepth fills: %d, %lld tokens in %.1f s; the longest %lld -> %lld tokens in %.1f s, "
             "%.0f t/s\n", g_fills.n, (long long)g_fills.tokens, g_fills.seconds,
             (long long)g_fills.longest_from,
             (long long)(g_fills.longest_from + g_fills.longest_tokens), g_fills.longest_seconds,
             g_fills.longest_tokens / g_fills.longest_seconds);
    /* what each plugin did (a profile's attention that never engaged says so) */
    printf("\nplugins over the whole run (fills included):\n");
    tsr_plugin_host_print_engagement(s->host, stdout);
    tsr_plugin_host_print_decode_counters(s->host, stdout);
    struct memory_use mem;
    memory_use(be, &mem);
    print_memory(&mem);
    if (a.json && !write_json(a.json, s, backend, &ceil, &c, r, n_r, a.reps, a.warmup, &mem)) {
      fprintf(stderr, "tessera bench: cannot write %s\n", a.json);
      code = TSR_EXIT_RUNTIME;
    }
  } else {
    fprintf(stderr, "tessera bench: %s\n", tsr_error_message());
    code = TSR_EXIT_RUNTIME;
  }
  for (int i = 0; i < n_tests; i++) free(r[i].times);
  free(tok);
  free(seq);
  free(logits);
  tsr_qtext_free(&g_text);
  tsr_engine_free(e);
  return code == -1 ? TSR_EXIT_OK : code;
}
