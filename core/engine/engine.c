/*
** The engine (engine.h): a tsr_setup, the KV cache it planned, the backend
** the profile names (cpu, or cuda opened from libtessera-cuda.so), and one
** forward graph per ubatch.
**
** A device backend (cuda) keeps its own copy of the model's tensor data and
** of every KV cache buffer (tsr_backend_keep), and that copy is the one that
** counts: the engine pushes every host write into those buffers (the
** recurrent state seq_rm zeroes) with tsr_backend_sync_to_device. Other
** external tensors of a graph (the context shift's cell lists) are uploaded
** with each compute. Before anything runs, a one-token forward graph is
** checked against the backend, so a model using an op the backend has no
** kernel for (a plugin op on cuda) fails at load naming it.
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
** copied out. A ubatch of one sequence hides the other sequences' cells in
** kv_pos; a ubatch of several gets each pool's sequence mask
** (tsr_kv_cache_fill_mask) as well, which attention adds to the causal and
** window rules it applies from the positions. A model with linear layers
** runs each sequence of a batch as its own pass (one state slot each).
**
** Rollback. A full context is found before anything runs (the full pool's
** free cells are counted), so the call fails with the cache untouched. Any
** later failure removes the positions this call added (seq_rm). A model with
** linear layers cannot drop part of a sequence (its recurrent state holds
** it): there such a failure leaves the sequence as it was only when it was
** empty before the call, and otherwise says that the state moved on.
**
** Token ids. Per sequence the engine remembers the ids at positions 0..known
** (eval appends, seq_rm and context shift cut), which is all prompt-prefix
** reuse needs: tsr_engine_common_prefix compares a new prompt with them.
**
** Context shift. The moved cells are found first (both pools); the arch's
** shift_keys appends, per owning layer, get_rows of those cells' K, a RoPE
** by -n_discard and set_rows back in the K codec; the graph runs; only then
** do the cells' positions change (seq_rm of the dropped span, seq_add of
** the rest), so every refusal leaves the cache as it was. A failure while
** the graph runs leaves keys half rotated: the sequence is dropped whole.
*/
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

#include "graph/backend.h"
#include "common/error.h"
#include "graph/graph.h"
#include "kv/kv_cache.h"
#include "abi/plugin_manifest.h"
#include "engine/sampler.h"
#include "engine/spec_verify.h"
#include "api/embed.h"

struct tsr_engine {
  struct tsr_setup *setup;
  struct tsr_kv_cache *kv;
  struct tsr_backend *backend;
  bool device; /* the backend keeps device copies of external memory */
  const struct tsr_attention_v1 *attention;
  int32_t n_vocab, n_ubatch;
  bool has_linear;
  int64_t logits_rows; /* rows the LM head computed, every ubatch so far (bench's FLOPs) */
  void *arena;        /* kept across steps: a fresh one per step is page faults */
  size_t arena_bytes;
  int32_t n_seq;
  struct seq_ids {    /* the token ids at positions 0..n of one sequence */
    int32_t *ids;
    int32_t n, cap;
  } *seq_ids;
  /* the decode policies' parameters per layer (plugin.h), NULL where a layer has
  ** none; what of its counters was reported, and the policy plugin they are reported
  ** to. The counters the attention adds to are one array (decode_counters, kept on a
  ** device backend: its kernels add to the device copy). */
  struct layer_decode {
    struct tsr_decode_params params;
    struct tsr_decode_counters reported;
    struct tsr_plugin *owner;
  } *decode;
  struct tsr_decode_counters *decode_counters;
  const struct tsr_decode_params **decode_of; /* [n_layers] */
  /* the profile's speculator and its plugin, or NULL; the target's final hidden
  ** rows of the last compute's read tokens (only with a speculator: they are what a
  ** NextN or assistant drafter reads) and the row the next draft starts from */
  const struct tsr_speculator_v1 *spec;
  struct tsr_plugin *spec_owner;
  struct tsr_spec_scratch spec_scratch;
  int32_t checkpoints; /* > 0 while a speculation step's verify batch runs (linear layers) */
  float *spec_dist; /* the drafter's distributions: spec_dist_rows rows of n_vocab */
  int32_t spec_dist_rows;
  float *hidden;
  int32_t n_embd, hidden_rows;
  /* [n_seq][n_embd]: each sequence's final hidden row of its last kept token (what a
  ** draft for it starts from); seq_hidden_ok says which are set */
  float *seq_hidden;
  bool *seq_hidden_ok;
  /* the speculator reads every kept token's hidden row (tsr_speculator_v1.rows);
  ** while a verify batch runs its rows wait for the verdict */
  bool spec_rows, verifying;
  const struct tsr_gguf *drafter_kept; /* the drafter whose weights a device keeps */
  struct tsr_engine_spec_stats spec_stats;
  struct tsr_embed *embed; /* what the embedding API keeps per engine (api/embed.h) */
};

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

tsr_status tsr_engine_load_setup(const struct tsr_engine_options *opt, struct tsr_setup **out) {
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
    const char *k, *v;
    tsr_compose_layer_codecs(&s->request, i, &k, &v, NULL);
    codecs[i].k = tsr_plugin_host_kv_codec(s->host, k, NULL);
    codecs[i].v = tsr_plugin_host_kv_codec(s->host, v, NULL);
    if (!codecs[i].k || !codecs[i].v)
      st = tsr_error_set(TSR_ERR_INTERNAL, "layer %d: codec %s vanished after negotiation", i,
                         codecs[i].k ? v : k);
    /* what the layer's attention negotiated to lift to f16 before reading */
    const struct tsr_composition_group *cg = tsr_composition_group_of(&s->composition,
                                                                      &s->request, i);
    if (cg) {
      codecs[i].k_lift = cg->k_path == TSR_READ_LIFT;
      codecs[i].v_lift = cg->v_path == TSR_READ_LIFT;
    }
  }
  /* the memory plan (setup.c) used these same params, so it is what this allocates */
  struct tsr_kv_cache_params params;
  tsr_setup_kv_params(s, &params);
  if (st == TSR_OK) st = tsr_kv_cache_new(s->layers, s->n_layers, codecs, &params, &e->kv);
  if (st != TSR_OK) tsr_error_prefix("%s: KV cache", p->path);
  free(codecs);
  return st;
}

/* Each layer's decode parameters from the profile's decode policies (the composition's
** rule, tsr_compose_decode_params). */
static tsr_status setup_decode(struct tsr_engine *e) {
  const struct tsr_setup *s = e->setup;
  if (!s->profile->n_decode_policies) return TSR_OK;
  const size_t n = s->n_layers > 0 ? (size_t)s->n_layers : 1;
  if (!(e->decode = calloc(n, sizeof *e->decode)) ||
      !(e->decode_of = calloc(n, sizeof *e->decode_of)) ||
      !(e->decode_counters = calloc(n, sizeof *e->decode_counters)))
    return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  tsr_status kst = tsr_backend_keep(e->backend, e->decode_counters, n * sizeof *e->decode_counters);
  if (kst != TSR_OK) return kst;
  for (int32_t i = 0; i < s->n_layers; i++) {
    struct layer_decode *d = &e->decode[i];
    const struct tsr_decode_policy_v1 *pol;
    const struct tsr_plugin *owner;
    d->params.counters = &e->decode_counters[i];
    tsr_status st = tsr_compose_decode_params(s->host, &s->request, i, &d->params, &pol, &owner);
    if (st != TSR_OK) return st;
    if (!pol) continue;
    d->owner = (struct tsr_plugin *)owner;
    e->decode_of[i] = &d->params;
  }
  return TSR_OK;
}

/* What the layers' attention did under their decode parameters since the last
** report, counted as each owning policy's engagement. */
static tsr_status report_decode(struct tsr_engine *e) {
  if (!e->decode) return TSR_OK;
  const int32_t n = e->setup->n_layers;
  tsr_status st = tsr_backend_sync_to_host(e->backend, e->decode_counters,
                                           (size_t)(n > 0 ? n : 1) * sizeof *e->decode_counters);
  if (st != TSR_OK) return st;
  const struct tsr_host *h = tsr_plugin_host_services();
  for (int32_t i = 0; i < n; i++) {
    struct layer_decode *d = &e->decode[i];
    if (!d->owner) continue;
    const struct tsr_decode_counters *c = &e->decode_counters[i];
    struct tsr_decode_counters *r = &d->reported;
    /* per layer kind: "full.v_rows_read", ... (tsr_plugin_host_print_decode_counters) */
    const char *kind = tsr_layer_kind_name(e->setup->layers[i].kind);
    const struct {
      const char *name;
      uint64_t now, before;
    } add[] = {{"v_rows_read", c->v_rows_read, r->v_rows_read},
               {"v_rows_skipped", c->v_rows_skipped, r->v_rows_skipped},
               {"query_rows", c->query_rows, r->query_rows},
               {"mass_dropped_e9", c->mass_dropped_e9, r->mass_dropped_e9}};
    for (size_t k = 0; k < sizeof add / sizeof add[0]; k++) {
      char name[48];
      snprintf(name, sizeof name, "%s.%s", kind, add[k].name);
      if (add[k].now != add[k].before) h->engaged(d->owner, name, add[k].now - add[k].before);
    }
    *r = *c;
  }
  return TSR_OK;
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
  tsr_setup_attention_kinds(s, fw.attention_kind);
  tsr_status st = s->arch->build(s->arch->ctx, tsr_plugin_host_services(), &fw);
  if (st == TSR_OK) st = tsr_graph_status(g);
  if (st == TSR_OK && (!fw.logits || fw.logits->ne[0] <= 0 || fw.logits->ne[0] > INT32_MAX))
    st = tsr_error_set(TSR_ERR_INTERNAL, "the arch built no logits of a usable shape");
  if (st == TSR_OK) e->n_vocab = (int32_t)fw.logits->ne[0];
  /* the width of the hidden rows a NextN head or drafter takes (0: the arch exports none) */
  if (st == TSR_OK && fw.hidden_final && fw.hidden_final->ne[0] <= INT32_MAX)
    e->n_embd = (int32_t)fw.hidden_final->ne[0];
  /* every op this model's forward pass uses must have a kernel on the backend */
  if (st == TSR_OK && (st = tsr_backend_check_graph(e->backend, g)) != TSR_OK)
    tsr_error_prefix("%s: backend %s cannot run %s (arch plugin %s, attention %s)",
                     tsr_profile_where(s->profile, "backend"), tsr_backend_name(e->backend),
                     s->model_path, tsr_plugin_name(s->arch_owner), s->profile->attention);
  tsr_graph_free(g);
  return st;
}

static tsr_status open_backend(struct tsr_engine *e, const struct tsr_engine_options *opt) {
  const struct tsr_profile *p = e->setup->profile;
  tsr_status st;
  if (!strcmp(p->backend, "cuda")) {
    st = tsr_backend_cuda_open(&p->cuda, &e->backend);
    if (st != TSR_OK) tsr_error_prefix("%s", tsr_profile_where(p, "backend"));
  } else {
    st = tsr_backend_cpu_new(opt->n_threads > 0 ? opt->n_threads : p->threads, &e->backend);
    if (st == TSR_OK) tsr_backend_cpu_set_activations_q8(e->backend, !p->cpu_activations_f32);
  }
  e->device = st == TSR_OK && tsr_backend_has_device_copies(e->backend);
  return st;
}

static tsr_status keep_buffer(void *ctx, void *p, size_t bytes) {
  return tsr_backend_keep(ctx, p, bytes);
}

/* A model's tensor data, one span of its mapping, kept on the device. */
static tsr_status keep_model(struct tsr_engine *e, const struct tsr_gguf *model) {
  const char *lo = NULL, *hi = NULL;
  for (int64_t i = 0; i < tsr_gguf_n_tensors(model); i++) {
    const struct tsr_gguf_tensor *t = tsr_gguf_tensor_at(model, i);
    const char *d = t->data;
    if (!d || !t->nbytes) continue;
    if (!lo || d < lo) lo = d;
    if (!hi || d + t->nbytes > hi) hi = d + t->nbytes;
  }
  return lo ? tsr_backend_keep(e->backend, lo, (size_t)(hi - lo)) : TSR_OK;
}

/* The model's tensor data and every KV cache buffer. */
static tsr_status keep_on_device(struct tsr_engine *e) {
  tsr_status st = keep_model(e, e->setup->model);
  if (st == TSR_OK) st = tsr_kv_cache_each_buffer(e->kv, keep_buffer, e->backend);
  return st;
}

/* The cache zeroes the recurrent state of a sequence it empties (seq_rm of
** seq, or of all when seq < 0): the device copy must hear of it. */
static void push_zeroed_state(struct tsr_engine *e, int32_t seq) {
  if (!e->device || !e->has_linear) return;
  for (int32_t s = 0; s < e->n_seq; s++) {
    if ((seq >= 0 && s != seq) || tsr_kv_cache_seq_pos_max(e->kv, s) >= 0) continue;
    for (int32_t l = 0; l < e->setup->n_layers; l++) {
      float *state = tsr_kv_cache_state(e->kv, l, s);
      if (state)
        tsr_backend_sync_to_device(e->backend, state, (size_t)e->setup->layers[l].state_bytes);
    }
  }
}

/* seq_rm, and the device hears of the state it zeroed. */
static tsr_status kv_seq_rm(struct tsr_engine *e, int32_t seq, int32_t p0, int32_t p1) {
  tsr_status st = tsr_kv_cache_seq_rm(e->kv, seq, p0, p1);
  if (st == TSR_OK) push_zeroed_state(e, seq);
  return st;
}

tsr_status tsr_engine_new(const struct tsr_engine_options *opt, struct tsr_engine **out) {
  *out = NULL;
  struct tsr_engine *e = calloc(1, sizeof *e);
  if (!e) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  tsr_status st = tsr_engine_load_setup(opt, &e->setup);
  const struct tsr_profile *p = e->setup ? e->setup->profile : NULL;
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
    e->n_seq = p->server.parallel > 0 ? (int32_t)p->server.parallel : 1;
    if (!(e->seq_ids = calloc((size_t)e->n_seq, sizeof *e->seq_ids)))
      st = tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  }
  if (st == TSR_OK && p->has_speculator) {
    const struct tsr_plugin *owner = NULL;
    e->spec = tsr_plugin_host_speculator(e->setup->host, p->speculator.name, &owner);
    e->spec_owner = (struct tsr_plugin *)owner;
    if (!e->spec)
      st = tsr_error_set(TSR_ERR_INTERNAL, "speculator %s vanished after negotiation",
                         p->speculator.name);
    else
      e->spec_rows = e->spec->rows != NULL;
  }
  if (st == TSR_OK) st = open_backend(e, opt);
  if (st == TSR_OK) st = setup_decode(e); /* its counters kept on the backend */
  if (st == TSR_OK) st = new_kv_cache(e);
  if (st == TSR_OK && e->device) st = keep_on_device(e);
  if (st == TSR_OK) st = read_n_vocab(e);
  if (st == TSR_OK && e->spec && e->n_embd > 0 &&
      (!(e->seq_hidden = calloc((size_t)e->n_seq * (size_t)e->n_embd, sizeof(float))) ||
       !(e->seq_hidden_ok = calloc((size_t)e->n_seq, sizeof(bool)))))
    st = tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  if (st != TSR_OK) {
    tsr_engine_free(e);
    return st;
  }
  *out = e;
  return TSR_OK;
}

void tsr_engine_free(struct tsr_engine *e) {
  if (!e) return;
  tsr_embed_free(e->embed);
  /* first: a device backend holds copies of the cache and of the model mapping */
  if (e->backend) tsr_backend_free(e->backend);
  tsr_kv_cache_free(e->kv);
  tsr_setup_free(e->setup);
  free(e->arena);
  for (int32_t i = 0; e->seq_ids && i < e->n_seq; i++) free(e->seq_ids[i].ids);
  free(e->seq_ids);
  free(e->decode_counters); /* its device copy went with the backend */
  free(e->decode);
  free(e->decode_of);
  free(e->hidden);
  free(e->seq_hidden);
  free(e->seq_hidden_ok);
  tsr_spec_scratch_free(&e->spec_scratch);
  free(e->spec_dist);
  free(e);
}

const struct tsr_setup *tsr_engine_setup(const struct tsr_engine *e) { return e->setup; }
int32_t tsr_engine_n_vocab(const struct tsr_engine *e) { return e->n_vocab; }
int32_t tsr_engine_n_ctx(const struct tsr_engine *e) {
  return (int32_t)e->setup->profile->context;
}
int32_t tsr_engine_n_seq(const struct tsr_engine *e) { return e->n_seq; }
int32_t tsr_engine_n_ubatch(const struct tsr_engine *e) { return e->n_ubatch; }
struct tsr_embed **tsr_engine_embed(struct tsr_engine *e) { return &e->embed; }
int64_t tsr_engine_logits_rows(const struct tsr_engine *e) { return e->logits_rows; }
struct tsr_backend *tsr_engine_backend(const struct tsr_engine *e) { return e->backend; }

int32_t tsr_engine_seq_len(const struct tsr_engine *e, int32_t seq) {
  return tsr_kv_cache_seq_pos_max(e->kv, seq) + 1;
}

void tsr_engine_seq_lens(const struct tsr_engine *e, int32_t *lens) {
  tsr_kv_cache_seq_pos_max_all(e->kv, lens);
  for (int32_t s = 0; s < e->n_seq; s++) lens[s]++;
}

/* Forgets the remembered ids from position p on (seq < 0: every sequence). */
static void ids_cut(struct tsr_engine *e, int32_t seq, int32_t p) {
  if (p < 0) p = 0;
  for (int32_t s = 0; s < e->n_seq; s++)
    if ((seq < 0 || s == seq) && e->seq_ids[s].n > p) e->seq_ids[s].n = p;
}

/* Remembers tokens at positions p0.. of seq when they extend what is known. */
static void ids_add(struct tsr_engine *e, int32_t seq, int32_t p0, const int32_t *t, int32_t n) {
  struct seq_ids *q = &e->seq_ids[seq];
  if (p0 != q->n) return; /* a gap (middle removal): positions and ids no longer pair */
  if (q->n + n > q->cap) {
    int32_t cap = q->cap ? q->cap : 256;
    while (cap < q->n + n) cap *= 2;
    int32_t *grown = realloc(q->ids, (size_t)cap * sizeof *grown);
    if (!grown) return; /* forgetting ids only costs a later re-evaluation */
    q->ids = grown;
    q->cap = cap;
  }
  memcpy(q->ids + q->n, t, (size_t)n * sizeof *t);
  q->n += n;
}

static tsr_status seq_check(const struct tsr_engine *e, const char *what, int32_t seq) {
  if (seq >= 0 && seq < e->n_seq) return TSR_OK;
  return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: sequence %d (the cache holds %d: 0..%d)", what,
                       seq, e->n_seq, e->n_seq - 1);
}

tsr_status tsr_engine_seq_cp(struct tsr_engine *e, int32_t src, int32_t dst) {
  tsr_status st = seq_check(e, "seq_cp", src);
  if (st == TSR_OK) st = seq_check(e, "seq_cp", dst);
  if (st != TSR_OK || src == dst) return st;
  if ((st = kv_seq_rm(e, dst, -1, -1)) != TSR_OK) return st;
  ids_cut(e, dst, 0);
  /* the cache copies recurrent state on the host: on a device the device copy is the one
  ** that counts, so src's comes down first and dst's goes up after */
  const bool device_state = e->device && e->has_linear;
  for (int32_t l = 0; device_state && st == TSR_OK && l < e->setup->n_layers; l++) {
    float *state = tsr_kv_cache_state(e->kv, l, src);
    if (state)
      st = tsr_backend_sync_to_host(e->backend, state, (size_t)e->setup->layers[l].state_bytes);
  }
  if (st == TSR_OK) st = tsr_kv_cache_seq_cp(e->kv, src, dst, -1, -1);
  for (int32_t l = 0; device_state && st == TSR_OK && l < e->setup->n_layers; l++) {
    float *state = tsr_kv_cache_state(e->kv, l, dst);
    if (state)
      st = tsr_backend_sync_to_device(e->backend, state, (size_t)e->setup->layers[l].state_bytes);
  }
  if (st != TSR_OK) return st;
  if (e->seq_ids[src].n) ids_add(e, dst, 0, e->seq_ids[src].ids, e->seq_ids[src].n);
  return TSR_OK;
}

tsr_status tsr_engine_seq_keep(struct tsr_engine *e, int32_t seq) {
  tsr_status st = seq_check(e, "seq_keep", seq);
  if (st != TSR_OK) return st;
  tsr_kv_cache_seq_keep(e->kv, seq);
  push_zeroed_state(e, -1);
  for (int32_t s = 0; s < e->n_seq; s++)
    if (s != seq) e->seq_ids[s].n = 0;
  return TSR_OK;
}

tsr_status tsr_engine_seq_rm(struct tsr_engine *e, int32_t seq, int32_t p0, int32_t p1) {
  tsr_status st = kv_seq_rm(e, seq, p0, p1);
  if (st == TSR_OK) ids_cut(e, seq, p0);
  return st;
}

int32_t tsr_engine_common_prefix(const struct tsr_engine *e, int32_t seq, const int32_t *tokens,
                                 int32_t n) {
  if (seq < 0 || seq >= e->n_seq || !tokens || n <= 0) return 0;
  const struct seq_ids *q = &e->seq_ids[seq];
  int32_t held = tsr_engine_seq_len(e, seq), k = 0;
  while (k < n && k < q->n && k < held && q->ids[k] == tokens[k]) k++;
  /* resuming below what the sliding ring still holds would attend to
  ** released keys: then nothing can be reused */
  if (k < held && k < tsr_kv_cache_seq_resume_min(e->kv, seq)) return 0;
  return k;
}

/* The final hidden rows of the tokens whose logits were read (rows of them, as the
** logits'), for the speculator's next draft. */
static tsr_status keep_hidden(struct tsr_engine *e, const struct tsr_tensor *h, int64_t rows) {
  e->hidden_rows = 0;
  if (!h || h->dtype != TSR_F32 || h->ne[1] != rows || h->nb[0] != sizeof(float) || !h->data)
    return TSR_OK; /* an arch that exports none: drafters that need it refuse */
  const size_t row = (size_t)h->ne[0] * sizeof(float);
  float *grown = realloc(e->hidden, row * (size_t)rows);
  if (!grown) return tsr_error_set(TSR_ERR_NOMEM, "out of memory for %lld hidden rows",
                                   (long long)rows);
  e->hidden = grown;
  for (int64_t r = 0; r < rows; r++)
    memcpy((char *)e->hidden + row * (size_t)r, (const char *)h->data + (size_t)r * h->nb[1], row);
  e->n_embd = (int32_t)h->ne[0];
  e->hidden_rows = (int32_t)rows;
  return TSR_OK;
}

/* Sequence seq's last kept token has hidden row `row` of the last compute. */
static void set_seq_hidden(struct tsr_engine *e, int32_t seq, int32_t row) {
  if (!e->seq_hidden || row < 0 || row >= e->hidden_rows) return;
  const size_t w = (size_t)e->n_embd;
  memcpy(e->seq_hidden + (size_t)seq * w, e->hidden + (size_t)row * w, w * sizeof(float));
  e->seq_hidden_ok[seq] = true;
}

/* After a ubatch of n tokens (rows[i]: token i's logits were read): each sequence's last
** token with a hidden row. The rows are every token's, or the read tokens' in order (the
** last token's when none was read). */
static void note_seq_hidden(struct tsr_engine *e, int32_t seq, const int32_t *seqs, int32_t n,
                            float *const *rows) {
  int32_t n_read = 0;
  for (int32_t i = 0; i < n; i++) n_read += rows[i] != NULL;
  const bool every = e->hidden_rows == n;
  if (!every && e->hidden_rows != (n_read ? n_read : 1)) return;
  for (int32_t i = 0, r = 0; i < n; i++) {
    const bool has = every || rows[i] || (!n_read && i == n - 1);
    if (has) set_seq_hidden(e, seq >= 0 ? seq : seqs[i], every ? i : r++);
  }
}

/* Hands the speculator n tokens it keeps with keep_hidden's rows row0.. of them. */
static tsr_status spec_rows(struct tsr_engine *e, const int32_t *tokens, const int32_t *pos,
                            const int32_t *seqs, int32_t n, int32_t row0) {
  if (e->hidden_rows < row0 + n)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "speculator %s reads the final hidden row of "
                         "every token, and arch plugin %s gave %d of %d", e->spec->name,
                         tsr_plugin_name(e->setup->arch_owner), e->hidden_rows, row0 + n);
  const struct tsr_spec_rows r = {
      .struct_size = sizeof r, .target = (struct tsr_spec_target *)e, .n = n,
      .n_embd = e->n_embd, .tokens = tokens, .pos = pos, .seq = seqs,
      .hidden = e->hidden + (size_t)row0 * (size_t)e->n_embd};
  tsr_status st = e->spec->rows(e->spec->ctx, tsr_plugin_host_services(), &r);
  if (st != TSR_OK) tsr_error_prefix("speculator %s", e->spec->name);
  return st;
}

/* Grows the kept compute arena to bytes. */
static tsr_status arena_reserve(struct tsr_engine *e, size_t bytes) {
  if (bytes <= e->arena_bytes) return TSR_OK;
  void *grown = NULL;
  if (posix_memalign(&grown, TSR_ARENA_ALIGN, bytes))
    return tsr_error_set(TSR_ERR_NOMEM, "cannot allocate a %zu-byte compute arena", bytes);
  free(e->arena);
  e->arena = grown;
  e->arena_bytes = bytes;
  return TSR_OK;
}

/* Plans g into the engine's kept arena (grown as needed) and binds it there. */
static tsr_status plan_and_bind(struct tsr_engine *e, struct tsr_graph *g) {
  struct tsr_graph_plan plan;
  tsr_status st = tsr_graph_plan(g, &plan);
  if (st == TSR_OK) st = arena_reserve(e, plan.arena_bytes);
  if (st == TSR_OK) st = tsr_graph_bind_arena(g, e->arena);
  return st;
}

/* One ubatch of n tokens whose cells prepare picked: build, plan, fill, run.
** seq is the sequence of every token, or -1 when they belong to several
** (seqs[] per token; attention then gets each pool's sequence mask). The
** logits of token i go to rows[i] when it is not NULL. */
static tsr_status run_ubatch(struct tsr_engine *e, int32_t seq, const int32_t *tokens,
                             const int32_t *pos, const int32_t *seqs, int32_t n,
                             const struct tsr_kv_slots *slots, float *const *rows) {
  const struct tsr_setup *s = e->setup;
  struct tsr_graph *g = tsr_graph_new(96 * (s->n_layers + 4) + 4096);
  if (!g) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  /* the tokens whose logits are read: the LM head runs for those rows only (at least
  ** one, which a ubatch nobody reads from still computes: the last) */
  int32_t n_out = 0;
  for (int32_t i = 0; i < n; i++) n_out += rows[i] != NULL;
  struct tsr_arch_forward fw = {
      .struct_size = sizeof fw, .g = g, .model = s->model, .n_tokens = n,
      .tokens = tsr_new_tensor_1d(g, TSR_I32, n), .positions = tsr_new_tensor_1d(g, TSR_I32, n),
      .attention = e->attention, .layers = s->layers, .n_layers = s->n_layers,
      .kv = e->kv, .seq = seq,
      .output_rows = n_out < n ? tsr_new_tensor_1d(g, TSR_I32, n_out ? n_out : 1) : NULL,
      .decode = e->decode_of, .checkpoints = e->checkpoints,
      .hidden_every_row = e->spec_rows};
  for (int pl = 0; pl < TSR_KV_POOL_COUNT; pl++) {
    if (!slots->cells[pl]) continue;
    const int32_t cells = tsr_kv_cache_span(e->kv, pl); /* attention reads these only */
    fw.kv_cells[pl] = tsr_new_tensor_1d(g, TSR_I32, n);
    fw.kv_pos[pl] = tsr_new_tensor_1d(g, TSR_I32, cells);
    if (seq < 0) fw.kv_mask[pl] = tsr_new_tensor(g, TSR_F32, 2, (int64_t[]){cells, n});
  }
  tsr_setup_attention_kinds(s, fw.attention_kind);
  tsr_status st = s->arch->build(s->arch->ctx, tsr_plugin_host_services(), &fw);
  if (tsr_graph_status(g) != TSR_OK) st = tsr_graph_status(g); /* the first builder error */
  if (st != TSR_OK) tsr_error_prefix("building the forward pass of %d tokens", n);
  /* rows of the logits: every token's, or (an arch that took output_rows) the read ones' */
  const int64_t n_rows = fw.output_rows ? fw.output_rows->ne[0] : n;
  const bool selected = fw.logits && fw.output_rows && fw.logits->ne[1] == n_rows && n_rows != n;
  if (st == TSR_OK) {
    /* the ABI's shape: f32 [n_vocab, n_tokens or n_out], rows of n_vocab floats */
    if (!fw.logits || fw.logits->dtype != TSR_F32 || fw.logits->ne[0] != e->n_vocab ||
        (fw.logits->ne[1] != n && !selected) || fw.logits->ne[2] != 1 ||
        fw.logits->ne[3] != 1 || fw.logits->nb[0] != sizeof(float))
      st = tsr_error_set(TSR_ERR_INTERNAL, "arch plugin %s returned logits that are not f32 "
                         "[%d, %d] (or [%d, %lld], the output rows)",
                         tsr_plugin_name(s->arch_owner), e->n_vocab, n, e->n_vocab,
                         (long long)n_rows);
    if (st == TSR_OK) tsr_graph_mark_output(fw.logits);
    if (st == TSR_OK && e->spec && fw.hidden_final) tsr_graph_mark_output(fw.hidden_final);
    if (st == TSR_OK) st = plan_and_bind(e, g);
  }
  if (st == TSR_OK) {
    memcpy(fw.tokens->data, tokens, (size_t)n * sizeof *tokens);
    memcpy(fw.positions->data, pos, (size_t)n * sizeof *pos);
    if (fw.output_rows) {
      int32_t *out = fw.output_rows->data, k = 0;
      for (int32_t i = 0; i < n; i++)
        if (rows[i]) out[k++] = i;
      if (!k) out[0] = n - 1;
    }
    for (int pl = 0; pl < TSR_KV_POOL_COUNT; pl++) {
      if (!fw.kv_cells[pl]) continue;
      memcpy(fw.kv_cells[pl]->data, slots->cells[pl], (size_t)n * sizeof(int32_t));
      const int32_t span = (int32_t)fw.kv_pos[pl]->ne[0];
      tsr_kv_cache_fill_kv_pos(e->kv, pl, seq, span, fw.kv_pos[pl]->data);
      /* the mask says only which cells a token's sequence holds: flash still
      ** applies causality and the window from the positions */
      if (fw.kv_mask[pl] && fw.kv_mask[pl]->data)
        tsr_kv_cache_fill_mask(e->kv, pl, pos, seqs, n, false, 0, span, fw.kv_mask[pl]->data);
    }
    st = tsr_backend_compute(e->backend, g);
    /* decode parameters reach attention on one sequence's one-token steps only
    ** (tsr_attn_call.decode): other computes leave the counters as they were */
    if (st == TSR_OK && n == 1 && seq >= 0) st = report_decode(e);
  }
  if (st == TSR_OK && e->spec)
    st = keep_hidden(e, fw.hidden_final, e->spec_rows ? n : fw.logits->ne[1]);
  if (st == TSR_OK && e->spec) note_seq_hidden(e, seq, seqs, n, rows);
  if (st == TSR_OK) {
    e->logits_rows += fw.logits->ne[1];
    const size_t row = (size_t)e->n_vocab * sizeof(float);
    for (int32_t i = 0, k = 0; i < n; i++) {
      if (!rows[i]) continue;
      const int32_t r = selected ? k++ : i;
      memcpy(rows[i], (const char *)fw.logits->data + (size_t)r * fw.logits->nb[1], row);
    }
  }
  tsr_graph_free(g);
  /* after the logits are out: the speculator's own passes reuse the arena */
  if (st == TSR_OK && e->spec_rows && !e->verifying) st = spec_rows(e, tokens, pos, seqs, n, 0);
  return st;
}

/* The batch's tokens idx[0..n) in ubatches: positions from pos[], logits to rows[]. */
static tsr_status eval_tokens(struct tsr_engine *e, const struct tsr_engine_batch *b,
                              const int32_t *idx, int32_t n, const int32_t *pos,
                              float *const *rows, bool *prepared) {
  const int32_t nu = e->n_ubatch;
  int32_t *buf = malloc((size_t)nu * 3 * sizeof *buf);
  float **ub_rows = malloc((size_t)nu * sizeof *ub_rows);
  tsr_status st = buf && ub_rows ? TSR_OK : tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  int32_t *tok = buf, *p = buf + nu, *sq = buf + 2 * nu;
  for (int32_t i0 = 0; i0 < n && st == TSR_OK; i0 += nu) {
    const int32_t nb = n - i0 < nu ? n - i0 : nu;
    bool one_seq = true;
    for (int32_t j = 0; j < nb; j++) {
      const int32_t t = idx[i0 + j];
      tok[j] = b->tokens[t], p[j] = pos[t], sq[j] = b->seq[t], ub_rows[j] = rows[t];
      one_seq = one_seq && sq[j] == sq[0];
    }
    struct tsr_kv_slots slots;
    st = tsr_kv_cache_prepare(e->kv, p, sq, nb, &slots);
    if (st != TSR_OK) break;
    *prepared = true;
    st = run_ubatch(e, one_seq ? sq[0] : -1, tok, p, sq, nb, &slots, ub_rows);
  }
  free(buf);
  free(ub_rows);
  return st;
}

/* After a failed batch: each sequence it touched goes back to p0[seq] (its
** length before), or is dropped whole when its tail cannot be cut. */
static tsr_status roll_back(struct tsr_engine *e, tsr_status st, const int32_t *p0,
                            const bool *touched) {
  char msg[1024], why[512] = "";
  snprintf(msg, sizeof msg, "%s", tsr_error_message());
  int32_t dropped = -1;
  for (int32_t s = 0; s < e->n_seq; s++) {
    if (!touched[s]) continue;
    /* an empty sequence is dropped whole, which also zeroes any recurrent state */
    if (kv_seq_rm(e, s, p0[s] > 0 ? p0[s] : -1, -1) == TSR_OK) {
      ids_cut(e, s, p0[s]);
      continue;
    }
    /* the tail cannot be cut (recurrent state, or ring keys released by this
    ** call's earlier ubatches): drop the sequence whole rather than leave
    ** cells whose contents were never written */
    if (dropped < 0) snprintf(why, sizeof why, "%s", tsr_error_message());
    dropped = s;
    kv_seq_rm(e, s, -1, -1);
    ids_cut(e, s, 0);
  }
  if (dropped < 0) return tsr_error_set(st, "%s", msg);
  return tsr_error_set(st, "%s (sequence %d was dropped whole: %s)", msg, dropped, why);
}

tsr_status tsr_engine_eval_batch(struct tsr_engine *e, const struct tsr_engine_batch *b,
                                 float *logits) {
  const struct tsr_profile *p = e->setup->profile;
  if (!b || b->n <= 0 || !b->tokens || !b->seq)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "eval: an empty batch");
  for (int32_t i = 0; i < b->n; i++) {
    if (b->seq[i] < 0 || b->seq[i] >= e->n_seq)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "eval: token %d names sequence %d (of %d)", i,
                           b->seq[i], e->n_seq);
    if (b->tokens[i] < 0 || b->tokens[i] >= e->n_vocab)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "eval: token %d at %d is outside the vocabulary "
                           "of %d", b->tokens[i], i, e->n_vocab);
  }
  const int32_t n_free = tsr_kv_cache_n_free(e->kv, TSR_KV_POOL_FULL);
  if (b->n > n_free)
    return tsr_error_set(TSR_ERR_NOMEM, "context full: %d tokens need %d cells, %d of n_ctx "
                         "%lld are free", b->n, b->n, n_free, (long long)p->context);
  const size_t n = (size_t)b->n, ns = (size_t)e->n_seq;
  int32_t *p0 = calloc(ns * 2 + n * 2, sizeof *p0);
  bool *touched = calloc(ns, sizeof *touched);
  float **rows = calloc(n, sizeof *rows);
  if (!p0 || !touched || !rows) {
    free(p0), free(touched), free(rows);
    return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  }
  int32_t *next = p0 + ns, *pos = next + ns, *idx = pos + n;
  tsr_engine_seq_lens(e, p0);
  memcpy(next, p0, ns * sizeof *next);
  int32_t n_rows = 0, n_touched = 0;
  for (int32_t i = 0; i < b->n; i++) {
    const int32_t s = b->seq[i];
    n_touched += !touched[s];
    touched[s] = true;
    pos[i] = next[s]++;
    bool last_of_seq = true;
    for (int32_t j = i + 1; j < b->n && last_of_seq; j++) last_of_seq = b->seq[j] != s;
    if (logits && (b->logits ? b->logits[i] : last_of_seq)) rows[i] = logits + (size_t)n_rows++ * e->n_vocab;
  }
  tsr_status st = TSR_OK;
  bool prepared = false;
  if (e->has_linear && n_touched > 1) {
    /* recurrent state is one slot per sequence read whole by each layer: a
    ** model with linear layers runs each sequence's tokens as their own pass */
    for (int32_t s = 0; s < e->n_seq && st == TSR_OK; s++) {
      int32_t m = 0;
      for (int32_t i = 0; i < b->n; i++)
        if (b->seq[i] == s) idx[m++] = i;
      if (m) st = eval_tokens(e, b, idx, m, pos, rows, &prepared);
    }
  } else {
    for (int32_t i = 0; i < b->n; i++) idx[i] = i;
    st = eval_tokens(e, b, idx, b->n, pos, rows, &prepared);
  }
  if (st == TSR_OK) {
    for (int32_t s = 0; s < e->n_seq; s++) {
      if (!touched[s]) continue;
      int32_t m = 0;
      for (int32_t i = 0; i < b->n; i++)
        if (b->seq[i] == s) idx[m++] = b->tokens[i];
      ids_add(e, s, p0[s], idx, m);
    }
  } else if (prepared) {
    st = roll_back(e, st, p0, touched);
  }
  free(p0), free(touched), free(rows);
  return st;
}

tsr_status tsr_engine_fill_positions(struct tsr_engine *e, int32_t seq, int32_t n) {
  if (seq < 0 || seq >= e->n_seq)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "fill: sequence %d is not one of the %d the "
                         "profile holds", seq, e->n_seq);
  if (n <= 0) return tsr_error_set(TSR_ERR_INVALID_ARG, "fill: %d positions (at least 1)", n);
  if (e->has_linear)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "a fill of positions only: %s has recurrent "
                         "layers, whose state only a computed fill gives", e->setup->model_path);
  const int32_t n_free = tsr_kv_cache_n_free(e->kv, TSR_KV_POOL_FULL);
  if (n > n_free)
    return tsr_error_set(TSR_ERR_NOMEM, "context full: a fill of %d positions, %d of n_ctx %lld "
                         "cells free", n, n_free, (long long)e->setup->profile->context);
  const int32_t nu = e->n_ubatch, p0 = tsr_engine_seq_len(e, seq);
  int32_t *buf = malloc((size_t)nu * 2 * sizeof *buf);
  if (!buf) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  int32_t *pos = buf, *seqs = buf + nu, next = p0, added = 0;
  tsr_status st = TSR_OK;
  for (int32_t i0 = 0; i0 < n && st == TSR_OK; i0 += nu) {
    const int32_t nb = n - i0 < nu ? n - i0 : nu;
    for (int32_t j = 0; j < nb; j++) pos[j] = next++, seqs[j] = seq;
    struct tsr_kv_slots slots;
    st = tsr_kv_cache_prepare(e->kv, pos, seqs, nb, &slots);
    /* the cpu reads these rows itself: written, as a store would (a device backend reads
    ** its own copy, whose cells keep what they held) */
    if (st == TSR_OK && !e->device) tsr_kv_cache_zero_rows(e->kv, &slots);
    if (st == TSR_OK) added += nb;
  }
  free(buf);
  if (st != TSR_OK && added) { /* a later ubatch refused: the earlier ones go again */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", tsr_error_message());
    kv_seq_rm(e, seq, p0 > 0 ? p0 : -1, -1);
    st = tsr_error_set(st, "%s", msg);
  }
  return st;
}

tsr_status tsr_engine_eval(struct tsr_engine *e, int32_t seq, const int32_t *tokens, int32_t n,
                           float *logits_last, float *logits_all) {
  if (seq < 0 || seq >= e->n_seq || n <= 0 || !tokens)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "eval: sequence %d (of %d), %d tokens", seq,
                         e->n_seq, n);
  int32_t *seqs = malloc((size_t)n * sizeof *seqs);
  bool *want = logits_all ? malloc((size_t)n * sizeof *want) : NULL;
  if (!seqs || (logits_all && !want)) {
    free(seqs), free(want);
    return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  }
  for (int32_t i = 0; i < n; i++) seqs[i] = seq;
  if (want)
    for (int32_t i = 0; i < n; i++) want[i] = true;
  struct tsr_engine_batch b = {.n = n, .tokens = tokens, .seq = seqs, .logits = want};
  tsr_status st = tsr_engine_eval_batch(e, &b, logits_all ? logits_all : logits_last);
  if (st == TSR_OK && logits_all && logits_last)
    memcpy(logits_last, logits_all + (size_t)(n - 1) * e->n_vocab,
           (size_t)e->n_vocab * sizeof *logits_last);
  free(seqs), free(want);
  return st;
}

/* ---- speculative decoding --------------------------------------------------- */

/* Sequence seq back to positions below p0 after a verify batch: each linear layer's
** state slot gets checkpoint row `row` by a copy on the backend (where a device keeps
** the cache, nothing crosses to the host), then the later cells are removed. */
static tsr_status rollback(struct tsr_engine *e, int32_t seq, int32_t p0, int32_t row) {
  const struct tsr_setup *s = e->setup;
  struct tsr_graph *g = tsr_graph_new(4 * s->n_layers + 16);
  if (!g) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  for (int32_t l = 0; l < s->n_layers; l++) {
    float *rows = tsr_kv_cache_checkpoints(e->kv, l);
    if (!rows) continue;
    const int64_t n = s->layers[l].state_bytes / (int64_t)sizeof(float);
    struct tsr_tensor *from = tsr_new_external(g, TSR_F32, 1, &n, rows + (size_t)row * (size_t)n);
    struct tsr_tensor *to = tsr_new_external(g, TSR_F32, 1, &n, tsr_kv_cache_state(e->kv, l, seq));
    struct tsr_tensor *copy = tsr_cpy(g, from, to);
    if (copy) tsr_graph_mark_output(copy);
  }
  tsr_status st = tsr_graph_status(g);
  if (st == TSR_OK) st = plan_and_bind(e, g);
  if (st == TSR_OK) st = tsr_backend_compute(e->backend, g);
  tsr_graph_free(g);
  if (st == TSR_OK) st = tsr_kv_cache_seq_rm_restored(e->kv, seq, p0);
  if (st == TSR_OK) ids_cut(e, seq, p0);
  if (st != TSR_OK)
    tsr_error_prefix("speculation: rolling sequence %d back to position %d", seq, p0);
  return st;
}

/* One sequence of a speculative step: what it holds, its draft, its verdict. */
struct spec_seq {
  int32_t seq, held, max_draft, n_draft, kept, row0; /* row0: its first row in the batch */
  int32_t *ctx;   /* the sequence, next, then the drafts (batch = ctx + held) */
  float *dist;    /* the drafter's distributions, max_draft rows of n_vocab */
  bool dist_given;
  struct tsr_sampler *sampler;
};

static tsr_status spec_check(struct tsr_engine *e, int32_t seq, int32_t max_draft) {
  if (seq < 0 || seq >= e->n_seq || max_draft < 0 || max_draft + 1 > e->n_ubatch)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "speculate: sequence %d (of %d), %d drafts (the "
                         "draft and its token fit one ubatch of %d)", seq, e->n_seq, max_draft,
                         e->n_ubatch);
  if (e->has_linear && max_draft + 1 > tsr_kv_cache_n_checkpoints(e->kv))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "speculate: %d drafts, and the linear layers keep "
                         "checkpoints for %d tokens a step", max_draft,
                         tsr_kv_cache_n_checkpoints(e->kv));
  const int32_t held = tsr_engine_seq_len(e, seq);
  if (e->seq_ids[seq].n != held)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "speculate: sequence %d holds %d positions but "
                         "%d known tokens (filled by positions?)", seq, held, e->seq_ids[seq].n);
  return TSR_OK;
}

/* The speculator's draft for q (its ctx and dist allocated by the caller). */
static tsr_status spec_draft(struct tsr_engine *e, struct spec_seq *q, int32_t next) {
  const struct seq_ids *ids = &e->seq_ids[q->seq];
  memcpy(q->ctx, ids->ids, (size_t)ids->n * sizeof *q->ctx);
  q->ctx[ids->n] = next;
  int32_t *batch = q->ctx + ids->n;
  const struct tsr_sampler_params *sp = tsr_sampler_params_of(q->sampler);
  struct tsr_spec_request r = {
      .struct_size = sizeof r, .seq = q->seq, .tokens = q->ctx, .n_tokens = ids->n + 1,
      .hidden = e->seq_hidden_ok && e->seq_hidden_ok[q->seq]
                    ? e->seq_hidden + (size_t)q->seq * (size_t)e->n_embd : NULL,
      .n_embd = e->n_embd, .max_draft = q->max_draft, .draft = batch + 1,
      .temperature = sp->temperature, .top_p = sp->top_p, .min_p = sp->min_p,
      .top_k = sp->top_k, .draft_dist = q->dist, .n_vocab = e->n_vocab,
      .target = (struct tsr_spec_target *)e};
  q->n_draft = 0;
  tsr_status st = e->spec->draft(e->spec->ctx, tsr_plugin_host_services(), &r, &q->n_draft);
  if (st == TSR_OK && (q->n_draft < 0 || q->n_draft > q->max_draft))
    st = tsr_error_set(TSR_ERR_INTERNAL, "speculator %s drafted %d tokens of at most %d",
                       e->spec->name, q->n_draft, q->max_draft);
  for (int32_t i = 0; st == TSR_OK && i < q->n_draft; i++)
    if (batch[1 + i] < 0 || batch[1 + i] >= e->n_vocab)
      st = tsr_error_set(TSR_ERR_INTERNAL, "speculator %s drafted token %d, outside the "
                         "vocabulary of %d", e->spec->name, batch[1 + i], e->n_vocab);
  q->dist_given = st == TSR_OK && r.dist_given;
  if (q->dist_given &&
      (st = tsr_spec_check_dists(q->dist, e->n_vocab, batch + 1, q->n_draft)) != TSR_OK)
    tsr_error_prefix("speculator %s", e->spec->name);
  return st;
}

/* q's verdict from its rows of the verify batch (logits, and the engine's hidden rows
** from row0 on): out gets the kept drafts and the target's token; the cells of the rest
** go, the speculator hears what stays. */
static tsr_status spec_finish(struct tsr_engine *e, struct spec_seq *q, const float *logits,
                              int32_t *out, int32_t *n_out) {
  int32_t *batch = q->ctx + q->held;
  tsr_status st = tsr_spec_verify(q->sampler, &e->spec_scratch, logits, batch + 1, q->n_draft,
                                  q->dist_given ? q->dist : NULL, out, n_out, &q->kept);
  const int32_t seq = q->seq, kept = q->kept;
  /* forget the cells of the drafts after the kept ones (and their recurrent state) */
  if (st == TSR_OK && kept < q->n_draft)
    st = e->has_linear ? rollback(e, seq, q->held + 1 + kept, kept)
                       : tsr_engine_seq_rm(e, seq, q->held + 1 + kept, -1);
  if (st == TSR_OK && e->spec_rows) { /* next and the kept drafts stay */
    int32_t pos[TSR_SPEC_MAX_DRAFT + 1], seqs[TSR_SPEC_MAX_DRAFT + 1];
    for (int32_t i = 0; i <= kept; i++) pos[i] = q->held + i, seqs[i] = seq;
    st = spec_rows(e, batch, pos, seqs, kept + 1, q->row0);
  }
  if (st == TSR_OK) {
    set_seq_hidden(e, seq, q->row0 + kept);
    if (e->spec->accepted) e->spec->accepted(e->spec->ctx, seq, kept);
    const struct tsr_host *h = tsr_plugin_host_services();
    if (q->n_draft) h->engaged(e->spec_owner, "tokens_drafted", (uint64_t)q->n_draft);
    if (kept) h->engaged(e->spec_owner, "tokens_accepted", (uint64_t)kept);
    struct tsr_engine_spec_stats *ss = &e->spec_stats;
    ss->steps++, ss->drafted += q->n_draft, ss->accepted += kept;
    for (int32_t i = 0; i < q->n_draft && i < TSR_ENGINE_SPEC_POSITIONS; i++)
      ss->drafted_at[i]++, ss->kept_at[i] += i < kept;
  }
  return st;
}

tsr_status tsr_engine_speculate_multi(struct tsr_engine *e, int32_t n, const int32_t *seqs,
                                      const int32_t *next, struct tsr_sampler *const *samplers,
                                      const int32_t *max_draft, int32_t *out, int32_t *n_out) {
  if (!e->spec)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "speculate: the profile names no speculator");
  if (n < 1 || n > e->n_seq)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "speculate: %d sequences (of %d)", n, e->n_seq);
  /* recurrent state rolls back from checkpoints one sequence's batch keeps: a step each */
  if (e->has_linear && n > 1) {
    tsr_status st = TSR_OK;
    for (int32_t i = 0; i < n && st == TSR_OK; i++)
      st = tsr_engine_speculate_multi(e, 1, seqs + i, next + i, samplers + i, max_draft + i,
                                      out + (size_t)i * (TSR_SPEC_MAX_DRAFT + 1), n_out + i);
    return st;
  }
  /* a batch that would not fit a ubatch: every sequence's draft cut to its share */
  int32_t rows = 0, cap = TSR_SPEC_MAX_DRAFT;
  for (int32_t i = 0; i < n; i++) rows += (max_draft[i] > 0 ? max_draft[i] : 0) + 1;
  if (rows > e->n_ubatch) cap = e->n_ubatch / n - 1;
  if (cap < 0)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "speculate: %d sequences, and a verify batch is "
                         "one ubatch of %d", n, e->n_ubatch);
  int32_t want_draft[TSR_KV_MAX_SEQ];
  rows = 0;
  for (int32_t i = 0; i < n; i++) {
    n_out[i] = 0;
    want_draft[i] = max_draft[i] < cap ? max_draft[i] : cap;
    tsr_status st = spec_check(e, seqs[i], want_draft[i]);
    for (int32_t j = 0; st == TSR_OK && j < i; j++)
      if (seqs[j] == seqs[i])
        st = tsr_error_set(TSR_ERR_INVALID_ARG, "speculate: sequence %d twice", seqs[i]);
    if (st == TSR_OK && !samplers[i])
      st = tsr_error_set(TSR_ERR_INVALID_ARG, "speculate: sequence %d without a sampler", seqs[i]);
    if (st != TSR_OK) return st;
    rows += want_draft[i] + 1;
  }
  max_draft = want_draft;
  if (!e->spec_scratch.ids && tsr_spec_scratch_init(&e->spec_scratch, e->n_vocab) != TSR_OK)
    return TSR_ERR_NOMEM;
  if (e->spec_dist_rows < rows) {
    float *d = realloc(e->spec_dist, (size_t)rows * (size_t)e->n_vocab * sizeof *d);
    if (!d) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
    e->spec_dist = d, e->spec_dist_rows = rows;
  }
  size_t ctx_len = 0;
  for (int32_t i = 0; i < n; i++) ctx_len += (size_t)e->seq_ids[seqs[i]].n + 1 + max_draft[i];
  struct spec_seq *q = calloc((size_t)n, sizeof *q);
  int32_t *ctx = malloc(ctx_len * sizeof *ctx), *tok = malloc((size_t)rows * 2 * sizeof *tok);
  float *logits = malloc((size_t)rows * (size_t)e->n_vocab * sizeof *logits);
  tsr_status st = q && ctx && tok && logits ? TSR_OK
                                            : tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  /* every sequence's draft, then one batch of each one's next token and drafts */
  const double t0 = tsr_op_times_now();
  int32_t n_rows = 0;
  for (int32_t i = 0, *c = ctx, d = 0; i < n && st == TSR_OK; i++) {
    q[i] = (struct spec_seq){.seq = seqs[i], .held = e->seq_ids[seqs[i]].n,
                             .max_draft = max_draft[i], .ctx = c, .sampler = samplers[i],
                             .dist = e->spec_dist + (size_t)d * (size_t)e->n_vocab};
    c += q[i].held + 1 + max_draft[i], d += max_draft[i];
    st = spec_draft(e, &q[i], next[i]);
    q[i].row0 = n_rows;
    for (int32_t j = 0; st == TSR_OK && j <= q[i].n_draft; j++, n_rows++)
      tok[n_rows] = q[i].ctx[q[i].held + j], tok[rows + n_rows] = seqs[i];
  }
  const double t1 = tsr_op_times_now();
  /* every row's logits read; linear layers (one sequence) keep their state after each token */
  bool *want = st == TSR_OK ? malloc((size_t)n_rows * sizeof *want) : NULL;
  if (st == TSR_OK && !want) st = tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  for (int32_t i = 0; want && i < n_rows; i++) want[i] = true;
  e->checkpoints = tsr_kv_cache_n_checkpoints(e->kv);
  e->verifying = true;
  if (st == TSR_OK) {
    const struct tsr_engine_batch b = {.n = n_rows, .tokens = tok, .seq = tok + rows,
                                       .logits = want};
    st = tsr_engine_eval_batch(e, &b, logits);
  }
  e->checkpoints = 0;
  e->verifying = false;
  int32_t done = 0;
  for (; done < n && st == TSR_OK; done++)
    st = spec_finish(e, &q[done], logits + (size_t)q[done].row0 * (size_t)e->n_vocab,
                     out + (size_t)done * (TSR_SPEC_MAX_DRAFT + 1), &n_out[done]);
  /* a verdict that failed leaves the sequences after it as they were before the batch
  ** (their recurrent state, where there is one, cannot go back: that error says so) */
  for (int32_t i = done; st != TSR_OK && !e->has_linear && i < n && q && q[i].ctx; i++)
    if (tsr_engine_seq_len(e, q[i].seq) > q[i].held) tsr_engine_seq_rm(e, q[i].seq, q[i].held, -1);
  if (st == TSR_OK)
    e->spec_stats.draft_seconds += t1 - t0, e->spec_stats.verify_seconds += tsr_op_times_now() - t1;
  free(want), free(q), free(ctx), free(tok), free(logits);
  return st;
}

tsr_status tsr_engine_speculate(struct tsr_engine *e, int32_t seq, int32_t next,
                                struct tsr_sampler *sampler, int32_t max_draft, int32_t *out,
                                int32_t *n_out) {
  int32_t buf[TSR_SPEC_MAX_DRAFT + 1];
  *n_out = 0;
  if (max_draft < 0 || max_draft > TSR_SPEC_MAX_DRAFT)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "speculate: %d drafts (at most %d)", max_draft,
                         TSR_SPEC_MAX_DRAFT);
  tsr_status st = tsr_engine_speculate_multi(e, 1, &seq, &next, &sampler, &max_draft, buf, n_out);
  if (st == TSR_OK) memcpy(out, buf, (size_t)*n_out * sizeof *out);
  return st;
}

_Static_assert(TSR_ENGINE_SPEC_POSITIONS == TSR_SPEC_MAX_DRAFT, "a position per draft token");

void tsr_engine_spec_stats(const struct tsr_engine *e, struct tsr_engine_spec_stats *out) {
  *out = e->spec_stats;
}

/* A head's or drafter's pass built: its logits and hidden state must be one row, f32, of the
** target's vocabulary and width; they are marked as outputs and the graph planned. */
static tsr_status one_row_out(struct tsr_engine *e, struct tsr_arch_forward *fw, const char *who) {
  const struct tsr_tensor *l = fw->logits, *h = fw->hidden_final;
  if (!l || l->dtype != TSR_F32 || l->ne[0] != e->n_vocab || l->ne[1] != 1 || !h ||
      h->dtype != TSR_F32 || h->ne[0] != e->n_embd || h->ne[1] != 1)
    return tsr_error_set(TSR_ERR_INTERNAL, "%s gave logits or a hidden state that are not f32 "
                         "[%d, 1] / [%d, 1] (the target's vocabulary and width)", who,
                         e->n_vocab, e->n_embd);
  tsr_graph_mark_output(fw->logits);
  tsr_graph_mark_output(fw->hidden_final);
  return plan_and_bind(e, fw->g);
}

/* One ubatch of NextN entries (tsr_engine_nextn): cells[i] is entry i's cell in the full
** pool, prepared or held. */
static tsr_status nextn_ubatch(struct tsr_engine *e, int32_t seq, const int32_t *tokens,
                               const int32_t *pos, const float *hidden, int32_t n,
                               const int32_t *cells, float *logits, float *hidden_out) {
  const struct tsr_setup *s = e->setup;
  struct tsr_graph *g = tsr_graph_new(64 * 8 + 4096);
  if (!g) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  const int32_t span = tsr_kv_cache_span(e->kv, TSR_KV_POOL_FULL);
  struct tsr_arch_forward fw = {
      .struct_size = sizeof fw, .g = g, .model = s->model, .n_tokens = n,
      .tokens = tsr_new_tensor_1d(g, TSR_I32, n), .positions = tsr_new_tensor_1d(g, TSR_I32, n),
      .attention = e->attention, .layers = s->layers, .n_layers = s->n_layers,
      .kv = e->kv, .seq = seq,
      .nextn_hidden = tsr_new_tensor_2d(g, TSR_F32, e->n_embd, n),
      .output_rows = tsr_new_tensor_1d(g, TSR_I32, 1)};
  fw.kv_cells[TSR_KV_POOL_FULL] = tsr_new_tensor_1d(g, TSR_I32, n);
  fw.kv_pos[TSR_KV_POOL_FULL] = tsr_new_tensor_1d(g, TSR_I32, span);
  tsr_setup_attention_kinds(s, fw.attention_kind);
  tsr_status st = s->arch->build_nextn(s->arch->ctx, tsr_plugin_host_services(), &fw);
  if (tsr_graph_status(g) != TSR_OK) st = tsr_graph_status(g);
  if (st == TSR_OK) st = one_row_out(e, &fw, "the NextN head");
  if (st == TSR_OK) {
    memcpy(fw.tokens->data, tokens, (size_t)n * sizeof *tokens);
    memcpy(fw.positions->data, pos, (size_t)n * sizeof *pos);
    memcpy(fw.nextn_hidden->data, hidden, (size_t)n * (size_t)e->n_embd * sizeof(float));
    *(int32_t *)fw.output_rows->data = n - 1;
    memcpy(fw.kv_cells[TSR_KV_POOL_FULL]->data, cells, (size_t)n * sizeof *cells);
    tsr_kv_cache_fill_kv_pos(e->kv, TSR_KV_POOL_FULL, seq, span,
                             fw.kv_pos[TSR_KV_POOL_FULL]->data);
    st = tsr_backend_compute(e->backend, g);
  }
  if (st == TSR_OK && logits)
    memcpy(logits, fw.logits->data, (size_t)e->n_vocab * sizeof *logits);
  if (st == TSR_OK && hidden_out)
    memcpy(hidden_out, fw.hidden_final->data, (size_t)e->n_embd * sizeof *hidden_out);
  tsr_graph_free(g);
  if (st != TSR_OK) tsr_error_prefix("the NextN head over %d entries of sequence %d", n, seq);
  return st;
}

tsr_status tsr_engine_nextn(struct tsr_engine *e, int32_t seq, const int32_t *tokens,
                            const int32_t *pos, const float *hidden, int32_t n, float *logits,
                            float *hidden_out) {
  const struct tsr_setup *s = e->setup;
  if (!s->arch->build_nextn)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: arch plugin %s has no NextN head",
                         s->model_path, tsr_plugin_name(s->arch_owner));
  if (seq < 0 || seq >= e->n_seq || n <= 0 || !tokens || !pos || !hidden)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "NextN: sequence %d (of %d), %d entries", seq,
                         e->n_seq, n);
  if (!e->n_embd)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "NextN: arch plugin %s exports no final hidden "
                         "state", tsr_plugin_name(s->arch_owner));
  const int32_t held = tsr_engine_seq_len(e, seq);
  for (int32_t i = 0; i < n; i++) {
    if (tokens[i] < 0 || tokens[i] >= e->n_vocab)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "NextN: entry %d's token %d is outside the "
                           "vocabulary of %d", i, tokens[i], e->n_vocab);
    const int32_t chain_next = i && pos[i - 1] >= held ? pos[i - 1] + 1 : held;
    if (pos[i] < 0 || (i && pos[i] <= pos[i - 1]) || (pos[i] >= held && pos[i] != chain_next))
      return tsr_error_set(TSR_ERR_INVALID_ARG, "NextN: entry %d's position %d (sequence %d "
                           "holds %d): positions increase, and those past the held ones follow "
                           "them without a gap", i, pos[i], seq, held);
  }
  /* the cells of held positions: the used cells scanned from the top down (a sequence's
  ** latest positions, which these usually are, mostly sit in the latest cells) until every
  ** one is found, each looked up among the entries' increasing positions */
  int32_t *cells = malloc((size_t)n * sizeof *cells);
  if (!cells) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  int32_t n_held = 0, found = 0;
  while (n_held < n && pos[n_held] < held) cells[n_held++] = -1;
  for (int32_t c = tsr_kv_cache_span(e->kv, TSR_KV_POOL_FULL) - 1; c >= 0 && found < n_held;
       c--) {
    const int32_t p = tsr_kv_cache_cell_pos(e->kv, TSR_KV_POOL_FULL, c);
    if (p < pos[0] || p > pos[n_held - 1] ||
        !(tsr_kv_cache_cell_seqs(e->kv, TSR_KV_POOL_FULL, c) >> seq & 1))
      continue;
    int32_t lo = 0, hi = n_held - 1;
    while (lo < hi) {
      const int32_t mid = (lo + hi) / 2;
      if (pos[mid] < p) lo = mid + 1;
      else hi = mid;
    }
    if (pos[lo] == p && cells[lo] < 0) cells[lo] = c, found++;
  }
  tsr_status st = TSR_OK;
  for (int32_t i = 0; i < n_held && st == TSR_OK; i++)
    if (cells[i] < 0)
      st = tsr_error_set(TSR_ERR_INTERNAL, "NextN: sequence %d holds %d positions but no cell "
                         "of position %d", seq, held, pos[i]);
  /* the chain past them: cells prepared now and released at the end */
  const int32_t n_fresh = n - n_held;
  if (st == TSR_OK && n_fresh > 0) {
    int32_t *seqs = malloc((size_t)n_fresh * sizeof *seqs);
    struct tsr_kv_slots slots;
    if (!seqs) st = tsr_error_set(TSR_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; seqs && i < n_fresh; i++) seqs[i] = seq;
    if (st == TSR_OK && n_fresh > e->n_ubatch)
      st = tsr_error_set(TSR_ERR_INVALID_ARG, "NextN: %d entries past the held positions, more "
                         "than a ubatch of %d", n_fresh, e->n_ubatch);
    if (st == TSR_OK) st = tsr_kv_cache_prepare(e->kv, pos + n_held, seqs, n_fresh, &slots);
    if (st == TSR_OK)
      memcpy(cells + n_held, slots.cells[TSR_KV_POOL_FULL], (size_t)n_fresh * sizeof *cells);
    free(seqs);
    if (st != TSR_OK) {
      free(cells);
      return st;
    }
  }
  const int32_t nu = e->n_ubatch;
  for (int32_t i0 = 0; i0 < n && st == TSR_OK; i0 += nu) {
    const int32_t nb = n - i0 < nu ? n - i0 : nu;
    const bool last = i0 + nb == n;
    st = nextn_ubatch(e, seq, tokens + i0, pos + i0, hidden + (size_t)i0 * (size_t)e->n_embd, nb,
                      cells + i0, last ? logits : NULL, last ? hidden_out : NULL);
  }
  if (n_fresh > 0) { /* the chain's cells go, whatever happened */
    tsr_status rm = tsr_kv_cache_seq_rm_restored(e->kv, seq, held);
    if (st == TSR_OK) st = rm;
  }
  free(cells);
  return st;
}

/* The last layer of kind that owns its K/V in the cache, or -1. */
static int32_t last_owning_layer(const struct tsr_engine *e, enum tsr_layer_kind kind) {
  for (int32_t l = e->setup->n_layers - 1; l >= 0; l--)
    if (e->setup->layers[l].kind == kind && !e->setup->layers[l].kv_shared_from &&
        tsr_kv_cache_layer_pool(e->kv, l) >= 0)
      return l;
  return -1;
}

/* The target K/V a drafter's layers of each kind read: the whole pool of the last layer
** of that kind owning its K/V, in its codec (lifted where attention reads it so), with
** the cells' positions (filled at compute). That layer is named too (target_kv,
** target_layer): a codec read through query and output transforms transforms the
** drafter's as that layer's. */
static tsr_status drafter_sources(struct tsr_engine *e, const struct tsr_setup *d,
                                  struct tsr_arch_forward *fw) {
  for (int32_t il = 0; il < d->n_layers; il++) {
    const enum tsr_layer_kind kind = d->layers[il].kind;
    const int pool = kind == TSR_LAYER_SLIDING;
    const int32_t src = last_owning_layer(e, kind);
    if (d->layers[il].kv_shared_from >= 0)
      return tsr_error_set(TSR_ERR_UNSUPPORTED, "drafter %s: layer %d has K/V of its own, and a "
                           "drafter's layers read the target's", d->model_path, il);
    if ((kind != TSR_LAYER_FULL && !pool) || src < 0)
      return tsr_error_set(TSR_ERR_UNSUPPORTED, "drafter %s: layer %d reads the target's %s "
                           "K/V, and %s has no such layer owning K/V", d->model_path, il,
                           pool ? "sliding" : kind == TSR_LAYER_FULL ? "full" : "(linear)",
                           e->setup->model_path);
    if (fw->target_k[pool]) continue;
    fw->target_kv = e->kv;
    fw->target_layer[pool] = src;
    const int32_t span = tsr_kv_cache_span(e->kv, (enum tsr_kv_pool)pool);
    struct tsr_tensor *k, *v;
    tsr_kv_cache_layer_views(fw->g, e->kv, src, &k, &v);
    if (!k || !v) return tsr_graph_status(fw->g);
    k = tsr_view(fw->g, k, 3, (int64_t[]){k->ne[0], span, k->ne[2]}, k->nb, 0);
    v = tsr_view(fw->g, v, 3, (int64_t[]){v->ne[0], span, v->ne[2]}, v->nb, 0);
    bool k_lift, v_lift;
    tsr_kv_cache_layer_lifts(e->kv, src, &k_lift, &v_lift);
    fw->target_k[pool] = k_lift ? tsr_cast(fw->g, k, TSR_F16) : k;
    fw->target_v[pool] = v_lift ? tsr_cast(fw->g, v, TSR_F16) : v;
    fw->target_kv_pos[pool] = tsr_new_tensor_1d(fw->g, TSR_I32, span);
  }
  return tsr_graph_status(fw->g);
}

tsr_status tsr_engine_drafter_step(struct tsr_engine *e, const struct tsr_setup *d, int32_t seq,
                                   int32_t token, int32_t pos, const float *hidden,
                                   float *logits, float *hidden_out) {
  if (seq < 0 || seq >= e->n_seq || token < 0 || token >= e->n_vocab || pos < 0 || !hidden)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "drafter step: sequence %d (of %d), token %d (of "
                         "%d), position %d", seq, e->n_seq, token, e->n_vocab, pos);
  if (!e->n_embd)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "drafter step: arch plugin %s exports no final "
                         "hidden state", tsr_plugin_name(e->setup->arch_owner));
  struct tsr_graph *g = tsr_graph_new(96 * (d->n_layers + 4) + 4096);
  if (!g) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  /* each layer kind attends as the target's does: that attention placed the keys */
  struct tsr_arch_forward fw = {
      .struct_size = sizeof fw, .g = g, .model = d->model, .n_tokens = 1,
      .tokens = tsr_new_tensor_1d(g, TSR_I32, 1), .positions = tsr_new_tensor_1d(g, TSR_I32, 1),
      .attention = e->attention, .layers = d->layers, .n_layers = d->n_layers, .seq = seq,
      .target = e->setup->model, .nextn_hidden = tsr_new_tensor_2d(g, TSR_F32, e->n_embd, 1)};
  tsr_setup_attention_kinds(e->setup, fw.attention_kind);
  tsr_status st = drafter_sources(e, d, &fw);
  if (st == TSR_OK) st = d->arch->build(d->arch->ctx, tsr_plugin_host_services(), &fw);
  if (tsr_graph_status(g) != TSR_OK) st = tsr_graph_status(g);
  if (st == TSR_OK) st = one_row_out(e, &fw, "the drafter");
  if (st == TSR_OK && e->device && e->drafter_kept != d->model) {
    st = keep_model(e, d->model);
    if (st == TSR_OK) e->drafter_kept = d->model;
  }
  if (st == TSR_OK) {
    *(int32_t *)fw.tokens->data = token;
    *(int32_t *)fw.positions->data = pos;
    memcpy(fw.nextn_hidden->data, hidden, (size_t)e->n_embd * sizeof(float));
    for (int pl = 0; pl < TSR_KV_POOL_COUNT; pl++)
      if (fw.target_kv_pos[pl])
        tsr_kv_cache_fill_kv_pos(e->kv, pl, seq, (int32_t)fw.target_kv_pos[pl]->ne[0],
                                 fw.target_kv_pos[pl]->data);
    st = tsr_backend_compute(e->backend, g);
  }
  if (st == TSR_OK && logits) memcpy(logits, fw.logits->data, (size_t)e->n_vocab * sizeof *logits);
  if (st == TSR_OK && hidden_out)
    memcpy(hidden_out, fw.hidden_final->data, (size_t)e->n_embd * sizeof *hidden_out);
  tsr_graph_free(g);
  if (st != TSR_OK) tsr_error_prefix("drafter %s, sequence %d", d->model_path, seq);
  return st;
}

/* ---- context shift ----------------------------------------------------------- */

/* Why the model cannot shift seq by n_discard after n_keep, or TSR_OK. */
static tsr_status shift_refusal(struct tsr_engine *e, int32_t seq, int32_t n_keep,
                                int32_t n_discard, int32_t len) {
  const struct tsr_setup *s = e->setup;
  int32_t window = 0;
  for (int32_t i = 0; i < s->n_layers; i++) {
    if (s->layers[i].kind == TSR_LAYER_LINEAR)
      return tsr_error_set(TSR_ERR_UNSUPPORTED, "context shift: %s: layer %d is linear "
                           "(recurrent): its state holds the dropped tokens and cannot forget "
                           "them", s->model_path, i);
    if (s->layers[i].kind == TSR_LAYER_SLIDING && s->layers[i].window > window)
      window = s->layers[i].window;
  }
  if (!s->arch->shift_keys)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "context shift: arch plugin %s cannot re-rotate "
                         "the cached keys of %s (it has no shift_keys)",
                         tsr_plugin_name(s->arch_owner), s->arch_name ? s->arch_name : "?");
  if (!window) return TSR_OK;
  /* the next query after the shift sees new positions from len - n_discard - window + 1 on:
  ** each must still be on the sliding ring, which releases cells for good */
  const int32_t ring = tsr_kv_cache_n_cells(e->kv, TSR_KV_POOL_SLIDING);
  bool *on_ring = calloc((size_t)len, sizeof *on_ring);
  if (!on_ring) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  for (int32_t i = 0; i < ring; i++) {
    int32_t p = tsr_kv_cache_cell_pos(e->kv, TSR_KV_POOL_SLIDING, i);
    if (p >= 0 && p < len && (tsr_kv_cache_cell_seqs(e->kv, TSR_KV_POOL_SLIDING, i) >> seq & 1))
      on_ring[p] = true;
  }
  int32_t missing = -1;
  for (int32_t q = len - n_discard - window + 1; q < len - n_discard && missing < 0; q++) {
    if (q < 0) continue;
    int32_t orig = q < n_keep ? q : q + n_discard;
    if (!on_ring[orig]) missing = orig;
  }
  free(on_ring);
  if (missing >= 0)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "context shift: %s: the sliding layers' ring (%d "
                         "cells, window %d) has released position %d, which the shifted "
                         "sequence would see again", s->model_path, ring, window, missing);
  return TSR_OK;
}

/* The cells of seq at positions >= from, per pool: sh->cells repeated per kv head, and
** sh->delta_pos. Cells shared with another sequence are refused. buf is freed by the
** caller. */
static tsr_status moved_cells(struct tsr_engine *e, int32_t seq, int32_t from,
                              struct tsr_kv_shift *sh, int32_t **buf) {
  int32_t heads = 1, total = 0;
  for (int32_t i = 0; i < e->setup->n_layers; i++)
    if (e->setup->layers[i].n_head_kv > heads) heads = e->setup->layers[i].n_head_kv;
  sh->max_heads = heads;
  for (int pl = 0; pl < TSR_KV_POOL_COUNT; pl++) total += tsr_kv_cache_n_cells(e->kv, pl);
  int32_t *b = *buf = malloc(((size_t)heads + 2) * (size_t)(total > 0 ? total : 1) * sizeof *b);
  if (!b) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  for (int pl = 0; pl < TSR_KV_POOL_COUNT; pl++) {
    const int32_t cells = tsr_kv_cache_n_cells(e->kv, pl);
    int32_t n = 0;
    for (int32_t i = 0; i < cells; i++) {
      uint64_t m = tsr_kv_cache_cell_seqs(e->kv, pl, i);
      if (!(m >> seq & 1) || tsr_kv_cache_cell_pos(e->kv, pl, i) < from) continue;
      if (m != 1ull << seq)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "context shift: position %d of sequence %d is "
                             "shared with another sequence", tsr_kv_cache_cell_pos(e->kv, pl, i),
                             seq);
      b[n++] = i;
    }
    for (int32_t h = 1; h < heads; h++) memcpy(b + (size_t)h * n, b, (size_t)n * sizeof *b);
    int32_t *dp = b + (size_t)heads * n, *old = dp + n;
    for (int32_t i = 0; i < n; i++) {
      dp[i] = sh->delta;
      old[i] = tsr_kv_cache_cell_pos(e->kv, pl, b[i]); /* for shift_k: keys the attention rotated */
    }
    sh->n_cells[pl] = n;
    sh->cells[pl] = b;
    sh->delta_pos[pl] = dp;
    sh->pos[pl] = old;
    b = old + n;
  }
  return TSR_OK;
}

tsr_status tsr_engine_context_shift(struct tsr_engine *e, int32_t seq, int32_t n_keep,
                                    int32_t n_discard) {
  if (seq < 0 || seq >= e->n_seq)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "context shift: sequence %d (of %d)", seq,
                         e->n_seq);
  const int32_t len = tsr_engine_seq_len(e, seq);
  if (n_keep < 0 || n_discard < 1 || (int64_t)n_keep + n_discard > len)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "context shift: keeping %d and dropping %d of the "
                         "%d positions of sequence %d", n_keep, n_discard, len, seq);
  tsr_status st = shift_refusal(e, seq, n_keep, n_discard, len);
  if (st != TSR_OK) return st;
  const struct tsr_setup *s = e->setup;
  struct tsr_kv_shift sh = {.struct_size = sizeof sh, .model = s->model, .layers = s->layers,
                            .n_layers = s->n_layers, .seq = seq, .delta = -n_discard,
                            .kv = e->kv};
  tsr_setup_attention_kinds(s, sh.attention_kind);
  int32_t *buf = NULL;
  st = moved_cells(e, seq, n_keep + n_discard, &sh, &buf);
  struct tsr_graph *g = NULL;
  if (st == TSR_OK && !(g = sh.g = tsr_graph_new(16 * (s->n_layers + 4) + 64)))
    st = tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  if (st == TSR_OK) st = s->arch->shift_keys(s->arch->ctx, tsr_plugin_host_services(), &sh);
  if (g && tsr_graph_status(g) != TSR_OK) st = tsr_graph_status(g);
  if (st != TSR_OK) tsr_error_prefix("context shift of sequence %d", seq);
  if (st == TSR_OK) st = plan_and_bind(e, g);
  bool ran = false;
  if (st == TSR_OK) {
    ran = true;
    st = tsr_backend_compute(e->backend, g);
  }
  tsr_graph_free(g);
  free(buf);
  if (st != TSR_OK && ran) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", tsr_error_message());
    kv_seq_rm(e, seq, -1, -1); /* half-rotated keys must not be read */
    ids_cut(e, seq, 0);
    return tsr_error_set(st, "%s (sequence %d was dropped)", msg, seq);
  }
  if (st != TSR_OK) return st;
  /* the keys are rotated: now the positions follow (neither call can refuse here: no linear
  ** layers, no shared cells, and the dropped span leaves room below the moved one) */
  st = kv_seq_rm(e, seq, n_keep, n_keep + n_discard);
  if (st == TSR_OK) st = tsr_kv_cache_seq_add(e->kv, seq, n_keep + n_discard, -1, -n_discard);
  if (st != TSR_OK) return st;
  struct seq_ids *q = &e->seq_ids[seq];
  if (q->n >= n_keep + n_discard) {
    memmove(q->ids + n_keep, q->ids + n_keep + n_discard,
            (size_t)(q->n - n_keep - n_discard) * sizeof *q->ids);
    q->n -= n_discard;
  } else if (q->n > n_keep) {
    q->n = n_keep;
  }
  return TSR_OK;
}
