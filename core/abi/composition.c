#include "abi/composition.h"

#include <string.h>

#include "graph/dtype.h"
#include "common/error.h"
#include "kv/kv_cache.h"

const char *tsr_layer_kind_name(enum tsr_layer_kind kind) {
  switch (kind) {
  case TSR_LAYER_FULL: return "full";
  case TSR_LAYER_SLIDING: return "sliding";
  case TSR_LAYER_LINEAR: return "linear";
  case TSR_LAYER_KIND_COUNT: break;
  }
  return "invalid";
}

int tsr_layer_kind_from_name(const char *name) {
  for (int k = 0; k < TSR_LAYER_KIND_COUNT; k++)
    if (!strcmp(name, tsr_layer_kind_name((enum tsr_layer_kind)k))) return k;
  return -1;
}

const char *tsr_read_path_name(enum tsr_read_path path) {
  switch (path) {
  case TSR_READ_NONE: return "none";
  case TSR_READ_NATIVE: return "native";
  case TSR_READ_LIFT: return "lift to f16";
  case TSR_READ_IN_REGISTER: return "in-register";
  }
  return "invalid";
}

static void owner_label(const struct tsr_plugin *p, char *buf, size_t n) {
  snprintf(buf, n, "%s %s", tsr_plugin_name(p), tsr_plugin_version(p));
}

/* Appends layer index i to a compressed list "0-4,6,8-9". */
static void list_add(char *list, size_t cap, int *run_start, int *run_end, int i) {
  if (*run_start >= 0 && i == *run_end + 1) {
    *run_end = i;
    return;
  }
  size_t used = strlen(list);
  if (*run_start >= 0 && used < cap) {
    if (*run_end > *run_start)
      snprintf(list + used, cap - used, "%s%d-%d", used ? "," : "", *run_start, *run_end);
    else
      snprintf(list + used, cap - used, "%s%d", used ? "," : "", *run_start);
  }
  *run_start = *run_end = i;
}

/* The codec must exist and run on the backend: before any attention is asked. */
static tsr_status check_codec_runs(const struct tsr_plugin_host *h,
                                   const struct tsr_layer_desc *d, const char *side,
                                   const char *name) {
  const struct tsr_plugin *owner;
  const struct tsr_kv_codec_v1 *c = tsr_plugin_host_kv_codec(h, name, &owner);
  if (!c) {
    char known[512];
    tsr_plugin_host_list_names(h, TSR_IFACE_KV_CODEC, known, sizeof known);
    return tsr_error_set(TSR_ERR_INVALID_ARG, "layer %d (%s): %s codec '%s' is not registered by "
                         "any loaded plugin (registered: %s)", d->layer,
                         tsr_layer_kind_name(d->kind), side, name, known);
  }
  char label[96];
  owner_label(owner, label, sizeof label);
  if (!strstr(c->backends, d->backend))
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "layer %d (%s): %s codec %s (%s) has no %s encoder "
                         "(it runs on: %s)", d->layer, tsr_layer_kind_name(d->kind), side, name,
                         label, d->backend, c->backends);
  return TSR_OK;
}

/* The attention reads the codec by some path. A lift is a cast to f16, which
** every codec has where it runs (check_codec_runs): the cpu's through its
** reference decoder, a device's through its kernels; the profile may forbid it
** (kv.lift: false), so that no layer pays a copy of its cache per step unseen. */
static tsr_status check_codec(const struct tsr_plugin_host *h, const struct tsr_layer_desc *d,
                              const char *side, const char *name, enum tsr_read_path path,
                              const char *attn_label, const struct tsr_composition_request *r) {
  const bool f16_read = path == TSR_READ_LIFT || path == TSR_READ_IN_REGISTER;
  if (path != TSR_READ_NONE && (path != TSR_READ_LIFT || !r->refuse_lift) &&
      !(f16_read && r->exact_f32))
    return TSR_OK;
  const struct tsr_plugin *owner;
  tsr_plugin_host_kv_codec(h, name, &owner);
  char label[96];
  owner_label(owner, label, sizeof label);
  if (f16_read && r->exact_f32)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "layer %d (%s): attention %s reads %s codec %s (%s) "
                         "on %s %s, and backend.precision f32 takes only the types the core's "
                         "f32 attention kernel reads itself", d->layer,
                         tsr_layer_kind_name(d->kind), attn_label, side, name, label, d->backend,
                         path == TSR_READ_LIFT ? "by lifting it to f16" : "in register (the "
                         "codec's own kernel)");
  if (path == TSR_READ_LIFT)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "layer %d (%s): attention %s reads %s codec %s (%s) "
                         "on %s only by lifting it to f16 (neither has an in-register read of "
                         "it there), and the profile forbids lifting (kv.lift: false)", d->layer,
                         tsr_layer_kind_name(d->kind), attn_label, side, name, label, d->backend);
  return tsr_error_set(TSR_ERR_UNSUPPORTED, "layer %d (%s): attention %s cannot read %s codec "
                       "%s (%s) on %s", d->layer, tsr_layer_kind_name(d->kind), attn_label, side,
                       name, label, d->backend);
}

/* The codecs' hooks against the attention: each codec stores the layer's head
** dims (d's dims become the storage dims the kernels see), a codec that widens
** them has the hook that narrows them back, and an attention that positions q
** itself applies a K codec's query transform. */
static tsr_status codec_hooks(const struct tsr_plugin_host *h, struct tsr_layer_desc *d,
                              const struct tsr_attention_v1 *attn, const char *attn_label) {
  const char *names[2] = {d->k_codec, d->v_codec};
  int32_t *dims[2] = {&d->head_dim_k, &d->head_dim_v};
  for (int i = 0; i < 2; i++) {
    const struct tsr_plugin *owner;
    const struct tsr_kv_codec_v1 *c = tsr_plugin_host_kv_codec(h, names[i], &owner);
    if (!c) continue; /* check_codec_runs refused a missing codec already */
    char label[96];
    owner_label(owner, label, sizeof label);
    const int32_t head_dim = *dims[i], stored = tsr_kv_codec_storage_dim(c, head_dim);
    if (!stored)
      return tsr_error_set(TSR_ERR_UNSUPPORTED, "layer %d (%s): %s codec %s (%s) cannot store "
                           "head dim %d", d->layer, tsr_layer_kind_name(d->kind), i ? "V" : "K",
                           names[i], label, head_dim);
    const bool back = i ? c->finish_out != NULL : c->prepare_q != NULL;
    if (stored != head_dim && (!back || !c->prepare_rows))
      return tsr_error_set(TSR_ERR_UNSUPPORTED, "layer %d (%s): %s codec %s (%s) stores head dim "
                           "%d at %d but has no prepare_rows and %s hooks to match", d->layer,
                           tsr_layer_kind_name(d->kind), i ? "V" : "K", names[i], label, head_dim,
                           stored, i ? "finish_out" : "prepare_q");
    if (!i && c->prepare_q && attn->rotates && !attn->applies_prepare_q)
      return tsr_error_set(TSR_ERR_UNSUPPORTED, "layer %d (%s): attention %s positions queries "
                           "itself and does not apply K codec %s (%s)'s query transform "
                           "(prepare_q); pick another K codec or attention", d->layer,
                           tsr_layer_kind_name(d->kind), attn_label, names[i], label);
    *dims[i] = stored;
  }
  return TSR_OK;
}

/* How a codec is read, for the printout: its read path, and for a codec
** another plugin registered, that plugin, the dtype it is stored in and its
** hooks. */
static void codec_how(const struct tsr_plugin_host *h, const char *name, enum tsr_read_path path,
                      const char *backend, char *out, size_t cap) {
  const struct tsr_plugin *owner = NULL;
  const struct tsr_kv_codec_v1 *c = tsr_plugin_host_kv_codec(h, name, &owner);
  if (!c || !owner || !strcmp(tsr_plugin_name(owner), "core")) {
    snprintf(out, cap, "%s", tsr_read_path_name(path));
    return;
  }
  const struct tsr_dtype_traits *tr = tsr_dtype_traits(c->dtype);
  int n = tsr_dtype_is_codec(c->dtype)
              ? snprintf(out, cap, "%s %s; %s%s, its own layout", tsr_plugin_name(owner),
                         tsr_plugin_version(owner), tsr_read_path_name(path),
                         path != TSR_READ_IN_REGISTER ? ""
                         : strcmp(backend, "cpu")    ? " by its read kernel"
                                                     : " through its decoder")
              : snprintf(out, cap, "%s %s; %s as %s", tsr_plugin_name(owner),
                         tsr_plugin_version(owner), tsr_read_path_name(path), tr ? tr->name : "?");
  const char *hooks[3] = {c->prepare_rows ? "prepare_rows" : NULL,
                          c->prepare_q ? "prepare_q" : NULL,
                          c->finish_out ? "finish_out" : NULL};
  const char *sep = "; hooks ";
  for (int i = 0; i < 3 && n > 0 && (size_t)n < cap; i++)
    if (hooks[i]) {
      n += snprintf(out + n, cap - (size_t)n, "%s%s", sep, hooks[i]);
      sep = ", ";
    }
}

/* The implementation called name, and its label "name (plugin version)". */
static tsr_status find_attention(const struct tsr_plugin_host *h, const char *name,
                                 const struct tsr_attention_v1 **out, char *label, size_t n) {
  const struct tsr_plugin *owner = NULL;
  *out = tsr_plugin_host_attention(h, name, &owner);
  if (!*out) {
    char known[512];
    tsr_plugin_host_list_names(h, TSR_IFACE_ATTENTION, known, sizeof known);
    return tsr_error_set(TSR_ERR_INVALID_ARG, "attention '%s' is not provided by any loaded plugin "
                         "(available: %s)", name, known);
  }
  char own[96];
  owner_label(owner, own, sizeof own);
  snprintf(label, n, "%s (%s)", (*out)->name, own);
  return TSR_OK;
}

/* Whether layer i is among the first or last n layers that keep K/V. */
static bool boundary_layer(const struct tsr_arch_layer *layers, int n_layers, int i, int n) {
  if (n <= 0 || layers[i].kind == TSR_LAYER_LINEAR || layers[i].kv_shared_from) return false;
  int before = 0, after = 0;
  for (int j = 0; j < n_layers; j++) {
    if (j == i || layers[j].kind == TSR_LAYER_LINEAR || layers[j].kv_shared_from) continue;
    if (j < i) before++;
    else after++;
  }
  return before < n || after < n;
}

void tsr_compose_layer_codecs(const struct tsr_composition_request *r, int i, const char **k,
                              const char **v, bool *boundary) {
  const struct tsr_arch_layer *l = &r->layers[i];
  const int32_t from = l->kv_shared_from;
  if (from > 0 && from - 1 < r->n_layers && from - 1 != i) l = &r->layers[i = from - 1];
  *k = *v = NULL;
  if (boundary) *boundary = false;
  if (l->kind == TSR_LAYER_LINEAR) return;
  *k = r->k_codec[l->kind] ? r->k_codec[l->kind] : "f16";
  *v = r->v_codec[l->kind] ? r->v_codec[l->kind] : "f16";
  if (!boundary_layer(r->layers, r->n_layers, i, r->boundary_layers)) return;
  if (r->boundary_k) *k = r->boundary_k;
  if (r->boundary_v) *v = r->boundary_v;
  if (boundary) *boundary = true;
}

void tsr_compose_layer_desc(const struct tsr_composition_request *r, int i,
                            struct tsr_layer_desc *d) {
  const struct tsr_arch_layer *l = &r->layers[i];
  *d = (struct tsr_layer_desc){
      .struct_size = sizeof *d, .layer = i, .kind = l->kind, .n_head = l->n_head,
      .n_head_kv = l->n_head_kv, .head_dim_k = l->head_dim_k, .head_dim_v = l->head_dim_v,
      .window = l->window, .backend = r->backend};
  tsr_compose_layer_codecs(r, i, &d->k_codec, &d->v_codec, NULL);
  for (int j = 0; j < r->n_layers; j++)
    if (r->layers[j].kind >= 0 && r->layers[j].kind < TSR_LAYER_KIND_COUNT)
      d->model_kinds |= 1u << r->layers[j].kind;
}

tsr_status tsr_compose_decode_params(const struct tsr_plugin_host *h,
                                     const struct tsr_composition_request *r, int i,
                                     struct tsr_decode_params *p,
                                     const struct tsr_decode_policy_v1 **policy,
                                     const struct tsr_plugin **owner) {
  struct tsr_decode_counters *const counters = p->counters;
  *p = (struct tsr_decode_params){.struct_size = sizeof *p, .counters = counters};
  *policy = NULL, *owner = NULL;
  if (r->layers[i].kind == TSR_LAYER_LINEAR) return TSR_OK;
  struct tsr_layer_desc d;
  tsr_compose_layer_desc(r, i, &d);
  for (int k = 0; k < r->n_policies; k++) {
    const struct tsr_plugin *o = NULL;
    const struct tsr_decode_policy_v1 *pol = tsr_plugin_host_decode_policy(h, r->policies[k], &o);
    if (!pol || !pol->params) continue;
    struct tsr_decode_params q = {.struct_size = sizeof q, .counters = counters};
    tsr_status st = pol->params(pol->ctx, &d, &q);
    if (st != TSR_OK) {
      tsr_error_prefix("layer %d: decode policy %s", i, pol->name);
      return st;
    }
    if (!(q.v_skip_threshold > 0.0f) && !(q.v_skip_budget > 0.0f)) continue;
    if (*policy)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "layer %d: decode policies %s and %s both set "
                           "its V-skip threshold", i, (*policy)->name, pol->name);
    if (!(q.v_skip_threshold >= 0.0f && q.v_skip_threshold < 1.0f) ||
        !(q.v_skip_budget >= 0.0f && q.v_skip_budget < 1.0f) || q.sink < 0 || q.recent < 0)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "layer %d: decode policy %s asks a V-skip "
                           "threshold %g and budget %g (each in [0, 1)) with guards %d, %d "
                           "(>= 0)", i, pol->name, (double)q.v_skip_threshold,
                           (double)q.v_skip_budget, q.sink, q.recent);
    q.counters = counters;
    *p = q;
    *policy = pol, *owner = o;
  }
  return TSR_OK;
}

/* What the request's decode policies do on layer i, as the composition prints it:
** "sparse_v: V rows under 0.05 skipped, sink 4, recent 64 (why)", "sparse_v: off (why)". */
static void policies_text(const struct tsr_plugin_host *h, const struct tsr_composition_request *r,
                          int i, const struct tsr_decode_params *p,
                          const struct tsr_decode_policy_v1 *acting, char *out, size_t n) {
  if (!r->n_policies) {
    snprintf(out, n, "none");
    return;
  }
  struct tsr_layer_desc d;
  tsr_compose_layer_desc(r, i, &d);
  size_t used = 0;
  for (int k = 0; k < r->n_policies && used + 1 < n; k++) {
    const struct tsr_plugin *o;
    const struct tsr_decode_policy_v1 *pol = tsr_plugin_host_decode_policy(h, r->policies[k], &o);
    if (!pol) continue;
    char why[160] = "";
    if (pol->describe) pol->describe(pol->ctx, &d, why, sizeof why);
    why[sizeof why - 1] = '\0';
    int w;
    char rule[96];
    if (p->v_skip_threshold > 0.0f && p->v_skip_budget > 0.0f)
      snprintf(rule, sizeof rule, "V rows under %g and within a mass budget of %g skipped",
               (double)p->v_skip_threshold, (double)p->v_skip_budget);
    else if (p->v_skip_budget > 0.0f)
      snprintf(rule, sizeof rule, "V rows skipped within a mass budget of %g",
               (double)p->v_skip_budget);
    else
      snprintf(rule, sizeof rule, "V rows under %g skipped", (double)p->v_skip_threshold);
    if (pol == acting)
      w = snprintf(out + used, n - used, "%s%s: %s, sink %d, recent %d%s%s%s", k ? "; " : "",
                   pol->name, rule, p->sink, p->recent, *why ? " (" : "", why, *why ? ")" : "");
    else
      w = snprintf(out + used, n - used, "%s%s: off%s%s%s", k ? "; " : "", pol->name,
                   *why ? " (" : "", why, *why ? ")" : "");
    used = w < 0 ? used : used + (size_t)w < n ? used + (size_t)w : n - 1;
  }
}

/* The index of the group of kind with these codecs (tsr_compose's key: kind, boundary,
** codecs as the group stores them; NULL codecs for recurrent layers), or c->n_groups when
** none is yet. */
static int group_index(const struct tsr_composition *c, enum tsr_layer_kind kind, bool boundary,
                       const char *k, const char *v) {
  const size_t n = sizeof c->groups[0].k_codec - 1;
  int gi = 0;
  for (; gi < c->n_groups; gi++) {
    const struct tsr_composition_group *g = &c->groups[gi];
    if (g->kind == kind && g->boundary == boundary &&
        (!k || (!strncmp(g->k_codec, k, n) && !strncmp(g->v_codec, v, n))))
      break;
  }
  return gi;
}

tsr_status tsr_compose(const struct tsr_plugin_host *h, const struct tsr_composition_request *r,
                       struct tsr_composition *out) {
  memset(out, 0, sizeof *out);
  snprintf(out->backend, sizeof out->backend, "%s", r->backend);
  /* each layer kind's implementation: its own entry, else the request's one */
  const struct tsr_attention_v1 *attn_of[TSR_LAYER_KIND_COUNT];
  char label_of[TSR_LAYER_KIND_COUNT][128], owner[96];
  tsr_status fst = find_attention(h, r->attention, &attn_of[0], out->attention,
                                  sizeof out->attention);
  if (fst != TSR_OK) return fst;
  for (int k = 0; k < TSR_LAYER_KIND_COUNT; k++) {
    const char *name = r->attention_kind[k] ? r->attention_kind[k] : r->attention;
    if ((fst = find_attention(h, name, &attn_of[k], label_of[k], sizeof label_of[k])) != TSR_OK)
      return fst;
  }

  if (r->n_policies > TSR_COMPOSE_MAX_POLICIES)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%d decode policies (at most %d)", r->n_policies,
                         TSR_COMPOSE_MAX_POLICIES);
  size_t used = 0;
  for (int i = 0; i < r->n_policies; i++) {
    const struct tsr_plugin *p_owner;
    if (!tsr_plugin_host_decode_policy(h, r->policies[i], &p_owner)) {
      char known[512];
      tsr_plugin_host_list_names(h, TSR_IFACE_DECODE_POLICY, known, sizeof known);
      return tsr_error_set(TSR_ERR_INVALID_ARG, "decode policy '%s' is not provided by any loaded "
                           "plugin (available: %s)", r->policies[i], known);
    }
    owner_label(p_owner, owner, sizeof owner);
    used += (size_t)snprintf(out->policies + used, sizeof out->policies - used, "%s%s (%s)",
                             i ? ", " : "", r->policies[i], owner);
    if (used >= sizeof out->policies) used = sizeof out->policies - 1;
  }
  if (!r->n_policies) snprintf(out->policies, sizeof out->policies, "none");

  snprintf(out->speculator, sizeof out->speculator, "none");
  if (r->speculator) {
    const struct tsr_plugin *s_owner;
    const struct tsr_speculator_v1 *spec = tsr_plugin_host_speculator(h, r->speculator, &s_owner);
    if (!spec) {
      char known[512];
      tsr_plugin_host_list_names(h, TSR_IFACE_SPECULATOR, known, sizeof known);
      return tsr_error_set(TSR_ERR_INVALID_ARG, "speculator '%s' is not provided by any loaded "
                           "plugin (available: %s)", r->speculator, known);
    }
    owner_label(s_owner, owner, sizeof owner);
    if (spec->negotiate) {
      tsr_status st = spec->negotiate(spec->ctx, tsr_plugin_host_services(), r->model);
      if (st != TSR_OK) {
        tsr_error_prefix("speculator %s (%s) cannot run on this model", spec->name, owner);
        return st;
      }
    }
    if (!spec->draft)
      return tsr_error_set(TSR_ERR_UNSUPPORTED, "speculator %s (%s) cannot draft (it has no "
                           "draft hook)", spec->name, owner);
    snprintf(out->speculator, sizeof out->speculator, "%s (%s)", spec->name, owner);
  }

  int run_start[TSR_COMPOSITION_MAX_GROUPS], run_end[TSR_COMPOSITION_MAX_GROUPS];
  for (int k = 0; k < TSR_COMPOSITION_MAX_GROUPS; k++) run_start[k] = run_end[k] = -1;
  if (r->boundary_layers > 0) {
    int keep = 0;
    for (int i = 0; i < r->n_layers; i++)
      keep += r->layers[i].kind != TSR_LAYER_LINEAR && !r->layers[i].kv_shared_from;
    if (2 * r->boundary_layers >= keep)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "kv.boundary.layers %d: the model has %d layers "
                           "that keep K/V, so the first and last %d are all of them and kv.k / "
                           "kv.v would reach none (set those instead)", r->boundary_layers, keep,
                           r->boundary_layers);
  }

  for (int i = 0; i < r->n_layers; i++) {
    const struct tsr_arch_layer *l = &r->layers[i];
    if (l->kind < 0 || l->kind >= TSR_LAYER_KIND_COUNT)
      return tsr_error_set(TSR_ERR_INTERNAL, "layer %d has invalid kind %d", i, (int)l->kind);
    const char *kc, *vc;
    bool boundary;
    tsr_compose_layer_codecs(r, i, &kc, &vc, &boundary);
    int gi = group_index(out, l->kind, boundary, kc, vc);
    if (gi == TSR_COMPOSITION_MAX_GROUPS)
      return tsr_error_set(TSR_ERR_INTERNAL, "layer %d: more than %d groups of layers", i,
                           TSR_COMPOSITION_MAX_GROUPS);
    struct tsr_composition_group *g = &out->groups[gi];
    if (gi == out->n_groups) {
      out->n_groups++;
      g->kind = l->kind;
      g->boundary = boundary;
      g->first = *l;
      g->uniform_heads = true;
      if (kc) {
        snprintf(g->k_codec, sizeof g->k_codec, "%s", kc);
        snprintf(g->v_codec, sizeof g->v_codec, "%s", vc);
      }
    }
    g->n_layers++;
    list_add(g->layer_list, sizeof g->layer_list, &run_start[gi], &run_end[gi], i);
    if (l->n_head != g->first.n_head || l->n_head_kv != g->first.n_head_kv ||
        l->head_dim_k != g->first.head_dim_k || l->head_dim_v != g->first.head_dim_v ||
        l->window != g->first.window)
      g->uniform_heads = false;
    if (l->kind == TSR_LAYER_LINEAR) continue; /* recurrent state: no KV, no attention */

    const struct tsr_attention_v1 *attn = attn_of[l->kind];
    const char *attn_label = label_of[l->kind];
    struct tsr_layer_desc d;
    tsr_compose_layer_desc(r, i, &d);
    tsr_status st = check_codec_runs(h, &d, "K", kc);
    if (st == TSR_OK) st = check_codec_runs(h, &d, "V", vc);
    if (st == TSR_OK) st = codec_hooks(h, &d, attn, attn_label);
    if (st != TSR_OK) return st;
    enum tsr_read_path kp = TSR_READ_NONE, vp = TSR_READ_NONE;
    st = attn->negotiate(attn->ctx, &d, &kp, &vp);
    if (st != TSR_OK) {
      tsr_error_prefix("layer %d (%s, K %s, V %s): attention %s refused", i,
                       tsr_layer_kind_name(l->kind), kc, vc, attn_label);
      return st;
    }
    if ((st = check_codec(h, &d, "K", kc, kp, attn_label, r)) != TSR_OK) return st;
    if ((st = check_codec(h, &d, "V", vc, vp, attn_label, r)) != TSR_OK) return st;
    if (g->n_layers == 1) {
      g->k_path = kp;
      g->v_path = vp;
      codec_how(h, kc, kp, r->backend, g->k_how, sizeof g->k_how);
      codec_how(h, vc, vp, r->backend, g->v_how, sizeof g->v_how);
      snprintf(g->attention, sizeof g->attention, "%s", attn_label);
    } else if (kp != g->k_path || vp != g->v_path) {
      return tsr_error_set(TSR_ERR_INTERNAL, "layer %d (%s): attention %s chose read paths "
                           "%s/%s, other %s layers got %s/%s", i, tsr_layer_kind_name(l->kind),
                           attn_label, tsr_read_path_name(kp), tsr_read_path_name(vp),
                           tsr_layer_kind_name(l->kind), tsr_read_path_name(g->k_path),
                           tsr_read_path_name(g->v_path));
    }
    /* a policy acts through the attention's kernels: they must honour it where it acts */
    struct tsr_decode_params dp = {.struct_size = sizeof dp};
    const struct tsr_decode_policy_v1 *pol;
    const struct tsr_plugin *pol_owner;
    if ((st = tsr_compose_decode_params(h, r, i, &dp, &pol, &pol_owner)) != TSR_OK) return st;
    if (pol && dp.v_skip_budget > 0.0f && strcmp(r->backend, "cpu"))
      return tsr_error_set(TSR_ERR_UNSUPPORTED, "layer %d (%s): decode policy %s asks a mass "
                           "budget, whose two passes over the keys run on the cpu only, not on "
                           "backend %s (use a threshold there)", i, tsr_layer_kind_name(l->kind),
                           pol->name, r->backend);
    if (pol && r->decode_on_tiles)
      return tsr_error_set(TSR_ERR_UNSUPPORTED, "layer %d (%s): decode policy %s acts through "
                           "cuda's GQA decode kernel, which %s", i, tsr_layer_kind_name(l->kind),
                           pol->name, r->exact_f32 ? "runs on f16 tensor cores, and "
                           "backend.precision f32 computes in f32 only"
                           : "backend.attention.decode turns off (set it to gqa or gqa_staged)");
    if (pol) {
      bool (*honours)(void *, const struct tsr_layer_desc *) = attn->honours_decode;
      if (!honours || !honours(attn->ctx, &d))
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "layer %d (%s, K %s, V %s): decode policy %s "
                             "cannot act: attention %s does not act on decode parameters here "
                             "on backend %s", i, tsr_layer_kind_name(l->kind), kc, vc, pol->name,
                             attn_label, r->backend);
      if (dp.v_skip_budget > 0.0f && !attn->v_skip_budget)
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "layer %d (%s): decode policy %s asks a mass "
                             "budget; attention %s skips by threshold only",
                             i, tsr_layer_kind_name(l->kind), pol->name, attn_label);
      if (pol->negotiate && (st = pol->negotiate(pol->ctx, &d, attn)) != TSR_OK) {
        tsr_error_prefix("layer %d (%s): decode policy %s cannot act with attention %s",
                         i, tsr_layer_kind_name(l->kind), pol->name, attn_label);
        return st;
      }
    }
    if (g->n_layers == 1) {
      g->policy_params = dp;
      policies_text(h, r, i, &dp, pol, g->policies, sizeof g->policies);
    } else if (dp.v_skip_threshold != g->policy_params.v_skip_threshold ||
               dp.v_skip_budget != g->policy_params.v_skip_budget ||
               dp.sink != g->policy_params.sink || dp.recent != g->policy_params.recent) {
      g->policies_vary = true;
    }
  }
  for (int gi = 0; gi < out->n_groups; gi++) /* flush the last run */
    list_add(out->groups[gi].layer_list, sizeof out->groups[gi].layer_list, &run_start[gi],
             &run_end[gi], -2);
  return TSR_OK;
}

const struct tsr_composition_group *tsr_composition_group_of(const struct tsr_composition *c,
                                                             const struct tsr_composition_request *r,
                                                             int i) {
  if (i < 0 || i >= r->n_layers) return NULL;
  const char *k, *v;
  bool boundary;
  tsr_compose_layer_codecs(r, i, &k, &v, &boundary);
  const int gi = group_index(c, r->layers[i].kind, boundary, k, v);
  return gi < c->n_groups ? &c->groups[gi] : NULL;
}

void tsr_composition_print(const struct tsr_composition *c, FILE *f) {
  fprintf(f, "composition (backend %s):\n", c->backend);
  for (int i = 0; i < c->n_groups; i++) {
    const struct tsr_composition_group *g = &c->groups[i];
    fprintf(f, "  %-7s layers %s (%d)%s", tsr_layer_kind_name(g->kind), g->layer_list,
            g->n_layers, g->boundary ? ", kv.boundary" : "");
    if (g->uniform_heads && g->kind != TSR_LAYER_LINEAR)
      fprintf(f, ", heads %d/%d kv, head dim %d/%d", g->first.n_head, g->first.n_head_kv,
              g->first.head_dim_k, g->first.head_dim_v);
    if (g->kind == TSR_LAYER_SLIDING && g->uniform_heads) fprintf(f, ", window %d", g->first.window);
    fputc('\n', f);
    if (g->kind == TSR_LAYER_LINEAR) {
      fprintf(f, "          recurrent state, no KV cache, no attention implementation\n");
      continue;
    }
    fprintf(f, "          attention %s\n", g->attention);
    fprintf(f, "          K %s (%s), V %s (%s)\n", g->k_codec, g->k_how, g->v_codec, g->v_how);
    fprintf(f, "          decode policies: %s%s\n", g->policies,
            g->policies_vary ? "; other layers of the group differ" : "");
  }
  fprintf(f, "  speculator: %s\n", c->speculator);
}
