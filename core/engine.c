/*
** The engine (engine.h): a tsr_setup, the KV cache it planned, a CPU
** backend, and one forward graph per ubatch.
**
** Profile. With profile_path NULL the engine loads a minimal built-in
** profile from memory (`model: default`, plugins arch_qwen and arch_gemma4
** when the latter is on the plugin search path): conf/default.yaml is not
** installed anywhere. model_path is appended to the overrides as
** `model=PATH`, so messages name it as a --set and relative paths resolve
** against the working directory.
**
** Per ubatch: tsr_kv_cache_prepare picks the cells; the graph gets the
** tokens, positions, each used pool's cells (i32 [n]) and kv_pos (i32
** [cells]) as inputs; the arch appends its forward pass with fw.kv set; the
** graph is planned into the engine's arena (grown when a plan needs more),
** filled and run, and the logits are
** copied out. kv_pos comes from tsr_kv_cache_fill_kv_pos, which ignores which
** sequence holds a cell: right for one sequence. Several sequences need the
** per-sequence masks (tsr_kv_cache_fill_mask) handed to attention, which
** comes with the server.
**
** Rollback. A full context is found before anything runs (the full pool's
** free cells are counted), so the call fails with the cache untouched. Any
** later failure removes the positions this call added (seq_rm). A model with
** linear layers cannot drop part of a sequence (its recurrent state holds
** it): there such a failure leaves the sequence as it was only when it was
** empty before the call, and otherwise says that the state moved on.
*/
#include "engine.h"

#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "error.h"
#include "graph.h"
#include "kv_cache.h"
#include "plugin_manifest.h"

struct tsr_engine {
  struct tsr_setup *setup;
  struct tsr_kv_cache *kv;
  struct tsr_backend *backend;
  const struct tsr_attention_v1 *attention;
  int32_t n_vocab, n_ubatch;
  bool has_linear;
  void *arena;        /* kept across steps: a fresh one per step is page faults */
  size_t arena_bytes;
};

static enum tsr_profile_layer_kind profile_kind(enum tsr_layer_kind k) {
  return k == TSR_LAYER_SLIDING ? TSR_PROFILE_LAYER_SLIDING
         : k == TSR_LAYER_LINEAR ? TSR_PROFILE_LAYER_LINEAR
                                 : TSR_PROFILE_LAYER_FULL;
}

/* Whether plugin `name` has a manifest on the default search path. */
static bool plugin_available(const char *name) {
  struct tsr_plugin_host *h = NULL;
  struct tsr_manifest *list = NULL;
  int n = 0;
  bool found = false;
  if (tsr_plugin_host_new(&h) == TSR_OK && tsr_plugin_host_scan(h, &list, &n, NULL, NULL) == TSR_OK)
    for (int i = 0; i < n && !found; i++) found = !strcmp(list[i].name, name);
  free(list);
  tsr_plugin_host_free(h);
  return found;
}

static tsr_status load_setup(const struct tsr_engine_options *opt, struct tsr_setup **out) {
  *out = NULL;
  int n_sets = opt->n_sets > 0 ? opt->n_sets : 0;
  const char **sets = calloc((size_t)n_sets + 1, sizeof *sets);
  char *model_set = NULL;
  if (!sets) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  for (int i = 0; i < n_sets; i++) sets[i] = opt->sets[i];
  if (opt->model_path) {
    size_t len = strlen(opt->model_path) + 8;
    if (!(model_set = malloc(len))) {
      free(sets);
      return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
    }
    snprintf(model_set, len, "model=%s", opt->model_path);
    sets[n_sets++] = model_set;
  }
  tsr_status st;
  if (opt->profile_path) {
    st = tsr_setup_from_profile(opt->profile_path, sets, n_sets, out);
  } else {
    /* the built-in default profile: the default model, every arch plugin built */
    char text[256];
    snprintf(text, sizeof text, "model: default\nplugins:\n  - arch_qwen\n%s",
             plugin_available("arch_gemma4") ? "  - arch_gemma4\n" : "");
    st = tsr_setup_from_profile_text("(built-in default profile)", text, sets, n_sets, out);
  }
  free(model_set);
  free(sets);
  return st;
}

static tsr_status new_kv_cache(struct tsr_engine *e) {
  const struct tsr_setup *s = e->setup;
  const struct tsr_profile *p = s->profile;
  struct tsr_kv_layer_codecs *codecs =
      calloc(s->n_layers > 0 ? (size_t)s->n_layers : 1, sizeof *codecs);
  if (!codecs) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  tsr_status st = TSR_OK;
  for (int i = 0; i < s->n_layers && st == TSR_OK; i++) {
    const struct tsr_arch_layer *l = &s->layers[i];
    if (l->kind == TSR_LAYER_LINEAR) e->has_linear = true;
    if (l->kind == TSR_LAYER_LINEAR || l->kv_shared_from) continue; /* owns no K/V */
    const char *k = tsr_profile_k_codec(p, profile_kind(l->kind));
    const char *v = tsr_profile_v_codec(p, profile_kind(l->kind));
    codecs[i].k = tsr_plugin_host_kv_codec(s->host, k, NULL);
    codecs[i].v = tsr_plugin_host_kv_codec(s->host, v, NULL);
    if (!codecs[i].k || !codecs[i].v)
      st = tsr_error_set(TSR_ERR_INTERNAL, "layer %d: codec %s vanished after negotiation", i,
                         codecs[i].k ? v : k);
  }
  /* the memory plan (setup.c) used these same params, so it is what this allocates */
  struct tsr_kv_cache_params params = {
      .n_ctx = (int32_t)p->context,
      .n_seq = p->server.parallel > 0 ? (int32_t)p->server.parallel : 1,
      .n_ubatch = e->n_ubatch,
  };
  if (st == TSR_OK) st = tsr_kv_cache_new(s->layers, s->n_layers, codecs, &params, &e->kv);
  if (st != TSR_OK) tsr_error_prefix("%s: KV cache", p->path);
  free(codecs);
  return st;
}

/* n_vocab from the logits of a one-token graph that is built, never run. */
static tsr_status read_n_vocab(struct tsr_engine *e) {
  const struct tsr_setup *s = e->setup;
  struct tsr_graph *g = tsr_graph_new(64 * (s->n_layers + 4) + 4096);
  if (!g) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  struct tsr_arch_forward fw = {
      .struct_size = sizeof fw, .g = g, .model = s->model, .n_tokens = 1,
      .tokens = tsr_new_tensor_1d(g, TSR_I32, 1), .positions = tsr_new_tensor_1d(g, TSR_I32, 1),
      .attention = e->attention, .layers = s->layers, .n_layers = s->n_layers};
  tsr_status st = s->arch->build(s->arch->ctx, tsr_plugin_host_services(), &fw);
  if (st == TSR_OK) st = tsr_graph_status(g);
  if (st == TSR_OK && (!fw.logits || fw.logits->ne[0] <= 0 || fw.logits->ne[0] > INT32_MAX))
    st = tsr_error_set(TSR_ERR_INTERNAL, "the arch built no logits of a usable shape");
  if (st == TSR_OK) e->n_vocab = (int32_t)fw.logits->ne[0];
  tsr_graph_free(g);
  return st;
}

tsr_status tsr_engine_new(const struct tsr_engine_options *opt, struct tsr_engine **out) {
  *out = NULL;
  struct tsr_engine *e = calloc(1, sizeof *e);
  if (!e) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  tsr_status st = load_setup(opt, &e->setup);
  const struct tsr_profile *p = e->setup ? e->setup->profile : NULL;
  if (st == TSR_OK && strcmp(p->backend, "cpu"))
    st = tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: backend %s: the CUDA backend is not built yet "
                       "(use backend: cpu)", tsr_profile_where(p, "backend"), p->backend);
  if (st == TSR_OK && !e->setup->arch->build)
    st = tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: arch plugin %s builds no forward graphs in this "
                       "version", e->setup->model_path, tsr_plugin_name(e->setup->arch_owner));
  if (st == TSR_OK) {
    e->attention = tsr_plugin_host_attention(e->setup->host, p->attention, NULL);
    if (!e->attention)
      st = tsr_error_set(TSR_ERR_INTERNAL, "attention %s vanished after negotiation",
                         p->attention);
  }
  if (st == TSR_OK) {
    e->n_ubatch = (int32_t)(p->ubatch < p->context ? p->ubatch : p->context);
    st = new_kv_cache(e);
  }
  if (st == TSR_OK) st = read_n_vocab(e);
  if (st == TSR_OK)
    st = tsr_backend_cpu_new(opt->n_threads > 0 ? opt->n_threads : p->threads, &e->backend);
  if (st != TSR_OK) {
    tsr_engine_free(e);
    return st;
  }
  *out = e;
  return TSR_OK;
}

void tsr_engine_free(struct tsr_engine *e) {
  if (!e) return;
  tsr_backend_free(e->backend);
  tsr_kv_cache_free(e->kv);
  tsr_setup_free(e->setup);
  free(e->arena);
  free(e);
}

const struct tsr_setup *tsr_engine_setup(const struct tsr_engine *e) { return e->setup; }
int32_t tsr_engine_n_vocab(const struct tsr_engine *e) { return e->n_vocab; }

int32_t tsr_engine_seq_len(const struct tsr_engine *e, int32_t seq) {
  return tsr_kv_cache_seq_pos_max(e->kv, seq) + 1;
}

tsr_status tsr_engine_seq_rm(struct tsr_engine *e, int32_t seq, int32_t p0, int32_t p1) {
  return tsr_kv_cache_seq_rm(e->kv, seq, p0, p1);
}

/* One ubatch of n tokens whose cells prepare picked: build, plan, fill, run.
** Writes n rows of logits to out (n x n_vocab), or only the last to last. */
static tsr_status run_ubatch(struct tsr_engine *e, int32_t seq, const int32_t *tokens,
                             const int32_t *pos, int32_t n, const struct tsr_kv_slots *slots,
                             float *out, float *last) {
  const struct tsr_setup *s = e->setup;
  struct tsr_graph *g = tsr_graph_new(96 * (s->n_layers + 4) + 4096);
  if (!g) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  struct tsr_arch_forward fw = {
      .struct_size = sizeof fw, .g = g, .model = s->model, .n_tokens = n,
      .tokens = tsr_new_tensor_1d(g, TSR_I32, n), .positions = tsr_new_tensor_1d(g, TSR_I32, n),
      .attention = e->attention, .layers = s->layers, .n_layers = s->n_layers,
      .kv = e->kv, .seq = seq};
  for (int pl = 0; pl < TSR_KV_POOL_COUNT; pl++) {
    if (!slots->cells[pl]) continue;
    fw.kv_cells[pl] = tsr_new_tensor_1d(g, TSR_I32, n);
    fw.kv_pos[pl] = tsr_new_tensor_1d(g, TSR_I32, tsr_kv_cache_n_cells(e->kv, pl));
  }
  tsr_status st = s->arch->build(s->arch->ctx, tsr_plugin_host_services(), &fw);
  if (tsr_graph_status(g) != TSR_OK) st = tsr_graph_status(g); /* the first builder error */
  if (st != TSR_OK) tsr_error_prefix("building the forward pass of %d tokens", n);
  struct tsr_graph_plan plan;
  if (st == TSR_OK) {
    tsr_graph_mark_output(fw.logits);
    st = tsr_graph_plan(g, &plan);
  }
  if (st == TSR_OK && plan.arena_bytes > e->arena_bytes) {
    void *grown = NULL;
    if (posix_memalign(&grown, TSR_ARENA_ALIGN, plan.arena_bytes)) {
      st = tsr_error_set(TSR_ERR_NOMEM, "cannot allocate a %zu-byte compute arena",
                         plan.arena_bytes);
    } else {
      free(e->arena);
      e->arena = grown;
      e->arena_bytes = plan.arena_bytes;
    }
  }
  if (st == TSR_OK) st = tsr_graph_bind_arena(g, e->arena);
  if (st == TSR_OK) {
    memcpy(fw.tokens->data, tokens, (size_t)n * sizeof *tokens);
    memcpy(fw.positions->data, pos, (size_t)n * sizeof *pos);
    for (int pl = 0; pl < TSR_KV_POOL_COUNT; pl++) {
      if (!fw.kv_cells[pl]) continue;
      memcpy(fw.kv_cells[pl]->data, slots->cells[pl], (size_t)n * sizeof(int32_t));
      tsr_kv_cache_fill_kv_pos(e->kv, pl, fw.kv_pos[pl]->data);
    }
    st = tsr_backend_compute(e->backend, g);
  }
  if (st == TSR_OK) {
    const size_t row = (size_t)e->n_vocab * sizeof(float);
    for (int32_t i = out ? 0 : n - 1; i < n; i++) {
      const char *src = (const char *)fw.logits->data + (size_t)i * fw.logits->nb[1];
      if (out) memcpy(out + (size_t)i * e->n_vocab, src, row);
      if (i == n - 1 && last) memcpy(last, src, row);
    }
  }
  tsr_graph_free(g);
  return st;
}

static int32_t free_full_cells(const struct tsr_kv_cache *c) {
  int32_t n = 0, cells = tsr_kv_cache_n_cells(c, TSR_KV_POOL_FULL);
  for (int32_t i = 0; i < cells; i++) n += tsr_kv_cache_cell_pos(c, TSR_KV_POOL_FULL, i) < 0;
  return n;
}

tsr_status tsr_engine_eval(struct tsr_engine *e, int32_t seq, const int32_t *tokens, int32_t n,
                           float *logits_last, float *logits_all) {
  const struct tsr_profile *p = e->setup->profile;
  const int32_t n_seq = p->server.parallel > 0 ? (int32_t)p->server.parallel : 1;
  if (seq < 0 || seq >= n_seq || n <= 0 || !tokens)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "eval: sequence %d (of %d), %d tokens", seq, n_seq,
                         n);
  for (int32_t i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= e->n_vocab)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "eval: token %d at %d is outside the vocabulary "
                           "of %d", tokens[i], i, e->n_vocab);
  const int32_t p0 = tsr_engine_seq_len(e, seq), n_free = free_full_cells(e->kv);
  if (n > n_free)
    return tsr_error_set(TSR_ERR_NOMEM, "context full: %d tokens at position %d need %d cells, "
                         "%d of n_ctx %lld are free", n, p0, n, n_free, (long long)p->context);
  int32_t *pos = malloc((size_t)e->n_ubatch * 2 * sizeof *pos);
  if (!pos) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  int32_t *seqs = pos + e->n_ubatch;
  tsr_status st = TSR_OK;
  bool prepared = false;
  for (int32_t i0 = 0; i0 < n && st == TSR_OK; i0 += e->n_ubatch) {
    const int32_t nb = n - i0 < e->n_ubatch ? n - i0 : e->n_ubatch;
    for (int32_t j = 0; j < nb; j++) pos[j] = p0 + i0 + j, seqs[j] = seq;
    struct tsr_kv_slots slots;
    st = tsr_kv_cache_prepare(e->kv, pos, seqs, nb, &slots);
    if (st != TSR_OK) break;
    prepared = true;
    st = run_ubatch(e, seq, tokens + i0, pos, nb, &slots,
                    logits_all ? logits_all + (size_t)i0 * e->n_vocab : NULL,
                    i0 + nb == n ? logits_last : NULL);
  }
  free(pos);
  if (st != TSR_OK && prepared) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", tsr_error_message());
    /* the sequence was empty: dropping it whole also zeroes any recurrent state */
    tsr_status rb = tsr_kv_cache_seq_rm(e->kv, seq, p0 > 0 ? p0 : -1, -1);
    if (rb != TSR_OK)
      return tsr_error_set(st, "%s (and sequence %d keeps positions from %d: %s)", msg, seq, p0,
                           tsr_error_message());
    tsr_error_set(st, "%s", msg);
  }
  return st;
}
