#include "abi/setup.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "graph/graph.h"
#include "kv/kv_cache.h"
#include "model/model_check.h"

#ifndef TSR_BUILD_DEFAULT_MODEL
#define TSR_BUILD_DEFAULT_MODEL ""
#endif
#ifndef TSR_INSTALL_DEFAULT_MODEL
#define TSR_INSTALL_DEFAULT_MODEL ""
#endif

const char *tsr_default_model_path(void) {
  const char *env = getenv("TESSERA_DEFAULT_MODEL");
  if (env && *env) return env;
  /* beside the executable: a build tree copied to another machine */
  static char beside[1100];
  char dir[1024];
  if (tsr_exe_dir(dir, sizeof dir) == TSR_OK) {
    snprintf(beside, sizeof beside, "%s/default-model.gguf", dir);
    if (access(beside, R_OK) == 0) return beside;
  }
  if (*TSR_BUILD_DEFAULT_MODEL && access(TSR_BUILD_DEFAULT_MODEL, R_OK) == 0)
    return TSR_BUILD_DEFAULT_MODEL;
  if (*TSR_INSTALL_DEFAULT_MODEL && access(TSR_INSTALL_DEFAULT_MODEL, R_OK) == 0)
    return TSR_INSTALL_DEFAULT_MODEL;
  return NULL;
}

static tsr_status load_plugins(struct tsr_setup *s) {
  const struct tsr_profile *p = s->profile;
  for (size_t i = 0; i < p->n_plugins; i++) {
    const struct tsr_profile_plugin *pp = &p->plugins[i];
    size_t n = tsr_profile_settings_count(pp->settings);
    struct tsr_setting_value *vals = calloc(n ? n : 1, sizeof *vals);
    if (!vals) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
    tsr_status st = TSR_OK;
    for (size_t k = 0; k < n && st == TSR_OK; k++) {
      struct tsr_profile_setting ps;
      tsr_profile_settings_get(pp->settings, k, &ps);
      if (!ps.value)
        st = tsr_error_set(TSR_ERR_INVALID_ARG, "%s: plugin %s setting '%s' must be a single "
                           "value, not a map or list", ps.where, pp->name, ps.key);
      vals[k] = (struct tsr_setting_value){ps.key, ps.value, ps.where};
    }
    if (st == TSR_OK)
      st = tsr_plugin_host_load(s->host, pp->name, pp->resolved_path, vals, (int)n, NULL);
    free(vals);
    if (st != TSR_OK) {
      tsr_error_prefix("%s (plugins[%zu])", pp->node ? pp->node->where : p->path, i);
      return st;
    }
  }
  return tsr_plugin_host_check_requires(s->host);
}

static tsr_status open_model(struct tsr_setup *s) {
  const struct tsr_profile *p = s->profile;
  const char *path = p->model_path;
  if (!path) {
    path = tsr_default_model_path();
    if (!path)
      return tsr_error_set(TSR_ERR_IO, "%s: model 'default': no default model found (build the "
                           "project, or set TESSERA_DEFAULT_MODEL; looked for %s)",
                           tsr_profile_where(p, "model"), TSR_BUILD_DEFAULT_MODEL);
  }
  snprintf(s->model_path, sizeof s->model_path, "%s", path);
  tsr_status st = tsr_gguf_open(s->model_path, &s->model);
  if (st != TSR_OK) {
    tsr_error_prefix("%s: model", tsr_profile_where(p, "model"));
    return st;
  }
  st = tsr_gguf_get_str(s->model, "general.architecture", &s->arch_name);
  if (st != TSR_OK) return st;
  s->arch = tsr_plugin_host_arch(s->host, s->arch_name, &s->arch_owner);
  if (!s->arch) {
    char known[256];
    tsr_plugin_host_list_names(s->host, TSR_IFACE_ARCH, known, sizeof known);
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: architecture '%s' is provided by no loaded "
                         "plugin (archs available: %s); add its arch plugin to `plugins:` in %s",
                         s->model_path, s->arch_name, known, p->path);
  }
  st = s->arch->describe(s->arch->ctx, tsr_plugin_host_services(), s->model, s->layers,
                         TSR_MAX_LAYERS, &s->n_layers);
  if (st == TSR_OK) st = tsr_model_validate(s->arch, s->model, s->layers, s->n_layers);
  if (st != TSR_OK) tsr_error_prefix("%s: %s", s->model_path, tsr_plugin_name(s->arch_owner));
  return st;
}

static enum tsr_profile_layer_kind profile_kind(enum tsr_layer_kind k) {
  return k == TSR_LAYER_SLIDING ? TSR_PROFILE_LAYER_SLIDING
         : k == TSR_LAYER_LINEAR ? TSR_PROFILE_LAYER_LINEAR
                                 : TSR_PROFILE_LAYER_FULL;
}

static tsr_status negotiate(struct tsr_setup *s) {
  const struct tsr_profile *p = s->profile;
  struct tsr_composition_request *r = &s->request;
  *r = (struct tsr_composition_request){
      .backend = p->backend,
      .attention = p->attention,
      .boundary_layers = p->kv_boundary.layers,
      .boundary_k = p->kv_boundary.k,
      .boundary_v = p->kv_boundary.v,
      .refuse_lift = !strcmp(p->kv_lift, "false"),
      .decode_on_tiles = !strcmp(p->backend, "cuda") && p->cuda.attn_decode == TSR_CUDA_DECODE_TILE,
      .exact_f32 = !strcmp(p->backend, "cuda") && p->cuda.precision_f32,
      .policies = p->decode_policies,
      .n_policies = (int)p->n_decode_policies,
      .speculator = p->has_speculator ? p->speculator.name : NULL,
      .model = s->model,
      .layers = s->layers,
      .n_layers = s->n_layers,
  };
  for (int k = 0; k < TSR_LAYER_KIND_COUNT; k++) {
    r->attention_kind[k] = tsr_profile_attention(p, profile_kind((enum tsr_layer_kind)k));
    r->k_codec[k] = tsr_profile_k_codec(p, profile_kind((enum tsr_layer_kind)k));
    r->v_codec[k] = tsr_profile_v_codec(p, profile_kind((enum tsr_layer_kind)k));
  }
  tsr_status st = tsr_compose(s->host, r, &s->composition);
  if (st != TSR_OK) tsr_error_prefix("%s: impossible composition", p->path);
  return st;
}

/* The KV cache's bytes by the cache's own formula (kv_cache.h), so the plan
** is exactly what tsr_kv_cache_new allocates. */
static tsr_status plan_kv(const struct tsr_setup *s, struct tsr_memory_plan *m) {
  const struct tsr_profile *p = s->profile;
  struct tsr_kv_layer_codecs *codecs = calloc(s->n_layers > 0 ? (size_t)s->n_layers : 1,
                                              sizeof *codecs);
  if (!codecs) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  tsr_status st = TSR_OK;
  uint64_t lift_per_cell[TSR_LAYER_KIND_COUNT] = {0};
  for (int i = 0; i < s->n_layers && st == TSR_OK; i++) {
    const struct tsr_arch_layer *l = &s->layers[i];
    if (l->kind == TSR_LAYER_LINEAR || l->kv_shared_from) continue; /* owns no K/V */
    const char *names[2];
    tsr_compose_layer_codecs(&s->request, i, &names[0], &names[1], NULL);
    const struct tsr_kv_codec_v1 *c[2];
    for (int j = 0; j < 2 && st == TSR_OK; j++) {
      c[j] = tsr_plugin_host_kv_codec(s->host, names[j], NULL);
      if (!c[j])
        st = tsr_error_set(TSR_ERR_INTERNAL, "codec %s vanished after negotiation", names[j]);
    }
    if (st == TSR_OK) codecs[i] = (struct tsr_kv_layer_codecs){.k = c[0], .v = c[1]};
    /* on a device, attention reads a codec of its own layout lifted to f16 wherever no read
    ** kernel takes the layer, and a read kernel may lift for prefill (kv_turbo's does):
    ** the f16 copy of one layer's K and V, at most, lives beside the compute arena */
    uint64_t per_cell = 0;
    for (int j = 0; j < 2 && st == TSR_OK && strcmp(p->backend, "cpu"); j++)
      if (tsr_dtype_is_codec(c[j]->dtype))
        per_cell += (uint64_t)l->n_head_kv * 2 *
                    (uint64_t)tsr_kv_codec_storage_dim(c[j], j ? l->head_dim_v : l->head_dim_k);
    if (per_cell > lift_per_cell[l->kind]) lift_per_cell[l->kind] = per_cell;
  }
  if (p->context > INT32_MAX)
    st = tsr_error_set(TSR_ERR_INVALID_ARG, "%s: context %lld is more cells than a KV cache "
                       "indexes", tsr_profile_where(p, "context"), (long long)p->context);
  struct tsr_kv_cache_params params;
  tsr_setup_kv_params(s, &params);
  struct tsr_kv_plan kv;
  if (st == TSR_OK) st = tsr_kv_cache_plan_bytes(s->layers, s->n_layers, codecs, &params, &kv);
  free(codecs);
  if (st != TSR_OK) {
    tsr_error_prefix("%s: KV cache", p->path);
    return st;
  }
  for (int k = 0; k < TSR_LAYER_KIND_COUNT; k++) {
    m->kv[k] = kv.kind_bytes[k];
    m->kv_cells[k] = kv.kind_cells[k];
    const uint64_t lift = lift_per_cell[k] * kv.kind_cells[k];
    if (lift > m->lift) m->lift = lift;
  }
  return TSR_OK;
}

void tsr_setup_kv_params(const struct tsr_setup *s, struct tsr_kv_cache_params *out) {
  const struct tsr_profile *p = s->profile;
  *out = (struct tsr_kv_cache_params){
      .n_ctx = (int32_t)(p->context < INT32_MAX ? p->context : INT32_MAX),
      .n_seq = p->server.parallel > 0 ? (int32_t)p->server.parallel : 1,
      .n_ubatch = (int32_t)(p->ubatch < p->context ? p->ubatch : p->context),
  };
  bool linear = false;
  for (int32_t i = 0; i < s->n_layers; i++) linear |= s->layers[i].kind == TSR_LAYER_LINEAR;
  if (p->has_speculator && linear)
    out->n_checkpoints = out->n_ubatch < TSR_SPEC_MAX_DRAFT + 1 ? out->n_ubatch
                                                                 : TSR_SPEC_MAX_DRAFT + 1;
}

void tsr_setup_attention_kinds(const struct tsr_setup *s,
                               const struct tsr_attention_v1 *out[TSR_LAYER_KIND_COUNT]) {
  for (int k = 0; k < TSR_LAYER_KIND_COUNT; k++)
    out[k] = tsr_plugin_host_attention(
        s->host, tsr_profile_attention(s->profile, profile_kind((enum tsr_layer_kind)k)), NULL);
}

/* The tensors no graph of the model reads, in one line on stderr: those of
** the forward graph g, and, when the arch has a NextN head, of that head's
** graph too (its tensors are read only while a speculator drafts). A model
** without such a head just says so; that refusal is not this check's. */
static void warn_unused_tensors(const struct tsr_setup *s, const struct tsr_graph *g,
                                const struct tsr_tensor *hidden_final) {
  const int64_t n = tsr_gguf_n_tensors(s->model);
  bool *used = calloc(n > 0 ? (size_t)n : 1, sizeof *used);
  if (!used) return; /* a warning is not worth failing the load */
  tsr_model_note_used(s->model, g, used);
  const struct tsr_arch_v1 *a = s->arch;
  if (a->build_nextn && hidden_final) {
    struct tsr_graph *ng = tsr_graph_new(64 * 8 + 4096);
    if (ng) {
      struct tsr_arch_forward fw = {
          .struct_size = sizeof fw, .g = ng, .model = s->model, .n_tokens = 1,
          .tokens = tsr_new_tensor_1d(ng, TSR_I32, 1),
          .positions = tsr_new_tensor_1d(ng, TSR_I32, 1),
          .attention = tsr_plugin_host_attention(s->host, s->profile->attention, NULL),
          .layers = s->layers, .n_layers = s->n_layers,
          .nextn_hidden = tsr_new_tensor_2d(ng, TSR_F32, hidden_final->ne[0], 1)};
      tsr_setup_attention_kinds(s, fw.attention_kind);
      if (a->build_nextn(a->ctx, tsr_plugin_host_services(), &fw) == TSR_OK &&
          tsr_graph_status(ng) == TSR_OK)
        tsr_model_note_used(s->model, ng, used);
      tsr_graph_free(ng);
    }
    tsr_error_clear();
  }
  tsr_model_warn_unused(s->model, used, stderr);
  free(used);
}

/* The compute arena of one ubatch: build the arch's forward graph and let
** the planner place it; nothing is allocated or run. */
static tsr_status plan_compute(struct tsr_setup *s, struct tsr_memory_plan *m) {
  m->compute_known = false;
  if (!s->arch->build) return TSR_OK; /* the plan says so when printed */
  /* a drafter's layers read a target's K/V: its graphs exist only beside the target's */
  for (int32_t i = 0; i < s->n_layers; i++)
    if (s->layers[i].kv_shared_from < 0) {
      m->drafter = true;
      return TSR_OK;
    }
  const struct tsr_attention_v1 *attn = tsr_plugin_host_attention(s->host, s->profile->attention,
                                                                  NULL);
  int64_t n = s->profile->ubatch < s->profile->context ? s->profile->ubatch : s->profile->context;
  struct tsr_graph *g = tsr_graph_new(64 * (s->n_layers + 4) + 4096);
  if (!g) return tsr_error_set(TSR_ERR_NOMEM, "out of memory planning the compute graph");
  struct tsr_arch_forward fw = {
      .struct_size = sizeof fw, .g = g, .model = s->model, .n_tokens = (int32_t)n,
      .tokens = tsr_new_tensor_1d(g, TSR_I32, n), .positions = tsr_new_tensor_1d(g, TSR_I32, n),
      .attention = attn, .layers = s->layers, .n_layers = s->n_layers};
  tsr_setup_attention_kinds(s, fw.attention_kind);
  tsr_status st = s->arch->build(s->arch->ctx, tsr_plugin_host_services(), &fw);
  if (st == TSR_OK) st = tsr_graph_status(g);
  struct tsr_graph_plan plan;
  if (st == TSR_OK) {
    tsr_graph_mark_output(fw.logits);
    st = tsr_graph_plan(g, &plan);
  }
  if (st == TSR_OK) {
    m->compute = plan.arena_bytes;
    m->compute_tokens = (uint64_t)n;
    m->compute_known = true;
    warn_unused_tensors(s, g, fw.hidden_final);
  } else {
    tsr_error_prefix("planning the compute graph of %lld tokens", (long long)n);
  }
  tsr_graph_free(g);
  return st;
}

static tsr_status plan_memory(struct tsr_setup *s) {
  const struct tsr_profile *p = s->profile;
  struct tsr_memory_plan *m = &s->memory;
  memset(m, 0, sizeof *m);
  for (int64_t i = 0; i < tsr_gguf_n_tensors(s->model); i++)
    m->weights += tsr_gguf_tensor_at(s->model, i)->nbytes;
  tsr_status st = plan_kv(s, m);
  if (st != TSR_OK) return st;
  st = plan_compute(s, m);
  if (st != TSR_OK) return st;
  m->total = m->weights + m->compute + m->lift;
  for (int k = 0; k < TSR_LAYER_KIND_COUNT; k++) m->total += m->kv[k];
  m->limit = p->memory_limit;
  if (m->limit && m->total > m->limit)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: the plan needs %.2f GiB (weights %.2f GiB, KV "
                         "%.2f GiB, compute %.2f GiB) but memory_limit is %.2f GiB",
                         tsr_profile_where(p, "memory_limit"), m->total / 1073741824.0,
                         m->weights / 1073741824.0,
                         (m->total - m->weights - m->compute) / 1073741824.0,
                         m->compute / 1073741824.0, m->limit / 1073741824.0);
  return TSR_OK;
}

/* Every step after the profile is loaded (st: how loading went). */
static tsr_status finish_setup(struct tsr_setup *s, tsr_status st) {
  if (st == TSR_OK) st = tsr_plugin_host_new(&s->host);
  if (st == TSR_OK && s->profile->dir && *s->profile->dir)
    st = tsr_plugin_host_add_search_dir(s->host, s->profile->dir);
  if (st == TSR_OK) st = load_plugins(s);
  if (st == TSR_OK) st = open_model(s);
  if (st == TSR_OK) st = negotiate(s);
  if (st == TSR_OK) st = plan_memory(s);
  if (s->host) tsr_plugin_host_reset_engagement(s->host);
  return st;
}

tsr_status tsr_setup_from_profile(const char *profile_path, const char *const *sets, int n_sets,
                                  struct tsr_setup **out) {
  struct tsr_setup *s = calloc(1, sizeof *s);
  *out = s;
  if (!s) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  return finish_setup(s, tsr_profile_load(profile_path, sets, n_sets, &s->profile));
}

tsr_status tsr_setup_from_profile_text(const char *name, const char *text,
                                       const char *const *sets, int n_sets,
                                       struct tsr_setup **out) {
  struct tsr_setup *s = calloc(1, sizeof *s);
  *out = s;
  if (!s) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  return finish_setup(s, tsr_profile_load_mem(name, text, strlen(text), sets, n_sets, &s->profile));
}

void tsr_setup_free(struct tsr_setup *s) {
  if (!s) return;
  tsr_gguf_close(s->model);
  tsr_plugin_host_free(s->host);
  tsr_profile_free(s->profile);
  free(s);
}

static void print_bytes(FILE *f, const char *label, uint64_t bytes) {
  fprintf(f, "  %-22s %12.2f MiB\n", label, bytes / 1048576.0);
}

void tsr_setup_print(const struct tsr_setup *s, bool complete, FILE *f) {
  if (s->profile) {
    fprintf(f, "# resolved profile\n");
    tsr_profile_print(s->profile, f);
  }
  if (!complete) return;
  fprintf(f, "\nmodel: %s (%s, %d layers, arch plugin %s %s)\n", s->model_path, s->arch_name,
          s->n_layers, tsr_plugin_name(s->arch_owner), tsr_plugin_version(s->arch_owner));
  tsr_composition_print(&s->composition, f);
  tsr_memory_plan_print(&s->memory, f);
}

void tsr_memory_plan_print(const struct tsr_memory_plan *m, FILE *f) {
  fprintf(f, "memory plan:\n");
  print_bytes(f, "weights", m->weights);
  for (int k = 0; k < TSR_LAYER_KIND_COUNT; k++) {
    if (!m->kv_cells[k]) continue;
    char label[64];
    snprintf(label, sizeof label, "%s %s (%llu %s)", k == TSR_LAYER_LINEAR ? "state" : "KV",
             tsr_layer_kind_name((enum tsr_layer_kind)k), (unsigned long long)m->kv_cells[k],
             k == TSR_LAYER_LINEAR ? "seqs" : "cells");
    print_bytes(f, label, m->kv[k]);
  }
  if (m->compute_known) {
    char label[64];
    snprintf(label, sizeof label, "compute (%llu tokens)", (unsigned long long)m->compute_tokens);
    print_bytes(f, label, m->compute);
  }
  else fprintf(f, "  %-22s not planned: %s\n", "compute buffers",
               m->drafter ? "a drafter runs beside its target model"
                          : "the arch plugin builds no graphs in this version");
  if (m->lift) print_bytes(f, "K/V lifted to f16", m->lift);
  print_bytes(f, m->compute_known ? "total" : "total (without compute)", m->total);
  if (m->limit) print_bytes(f, "memory_limit", m->limit);
  else fprintf(f, "  %-22s none\n", "memory_limit");
}

tsr_status tsr_setup_chat_template(const struct tsr_setup *s, const char *override,
                                   const char *gguf_template, enum tsr_chat_template *out,
                                   const char **source) {
  static __thread char from_arch[96];
  if (override) {
    *source = "override";
    return tsr_chat_template_parse(override, out);
  }
  if (gguf_template && *gguf_template) {
    *source = "tokenizer.chat_template";
    return tsr_chat_template_detect(gguf_template, out);
  }
  const char *name =
      s->arch && s->arch->chat_template ? s->arch->chat_template(s->arch->ctx, s->arch_name) : NULL;
  if (!name)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s has no tokenizer.chat_template and arch plugin "
                         "%s knows no template for %s", s->model_path,
                         tsr_plugin_name(s->arch_owner), s->arch_name ? s->arch_name : "?");
  snprintf(from_arch, sizeof from_arch, "arch plugin %s", tsr_plugin_name(s->arch_owner));
  *source = from_arch;
  return tsr_chat_template_parse(name, out);
}
