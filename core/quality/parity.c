#include "quality/parity.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "graph/backend.h"
#include "common/error.h"
#include "model/gguf.h"
#include "model/model_check.h"
#include "abi/plugin_host.h"
#include "abi/setup.h"

void tsr_parity_compare_row(const float *a, const float *b, int64_t n, struct tsr_parity_stats *s,
                            double *kl_sum) {
  double max_abs = 0, scale = 0, ma = -INFINITY, mb = -INFINITY;
  int64_t arg_a = 0, arg_b = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (!(d <= max_abs)) max_abs = d; /* NaN propagates as a failure */
    if (fabs(b[i]) > scale) scale = fabs(b[i]);
    if (a[i] > ma) ma = a[i], arg_a = i;
    if (b[i] > mb) mb = b[i], arg_b = i;
  }
  /* KL(P_golden || P_ours) from log-softmaxes, in double */
  double za = 0, zb = 0;
  for (int64_t i = 0; i < n; i++) za += exp(a[i] - ma), zb += exp(b[i] - mb);
  double lza = log(za), lzb = log(zb), kl = 0;
  for (int64_t i = 0; i < n; i++) {
    double lpb = b[i] - mb - lzb, lpa = a[i] - ma - lza;
    kl += exp(lpb) * (lpb - lpa);
  }
  if (kl < 0) kl = 0; /* rounding */
  double rel = scale > 0 ? max_abs / scale : max_abs;
  if (!(max_abs <= s->max_abs)) s->max_abs = max_abs;
  if (!(rel <= s->max_rel)) s->max_rel = rel;
  if (!(kl <= s->max_kl)) s->max_kl = kl;
  s->argmax_agreement += arg_a == arg_b; /* a count until finish_stats */
  *kl_sum += kl;
  s->n_positions++;
}

void tsr_parity_compare_top(const float *a, int64_t n, const int32_t *top_ids,
                            const float *top_logits, int64_t k, float golden_lse,
                            struct tsr_parity_stats *s, double *kl_sum) {
  double ma = -INFINITY;
  int64_t arg_a = 0;
  for (int64_t i = 0; i < n; i++)
    if (a[i] > ma) ma = a[i], arg_a = i;
  double za = 0;
  for (int64_t i = 0; i < n; i++) za += exp(a[i] - ma);
  double lse_a = ma + log(za);
  /* KL over the golden top set plus one bucket for the rest of the vocabulary */
  double max_abs = 0, scale = 0, kl = 0, p_top = 0, q_top = 0;
  for (int64_t j = 0; j < k; j++) {
    int32_t id = top_ids[j];
    double ours = (id >= 0 && id < n) ? a[id] : NAN;
    double d = fabs(ours - top_logits[j]);
    if (!(d <= max_abs)) max_abs = d;
    if (fabs(top_logits[j]) > scale) scale = fabs(top_logits[j]);
    double lp = top_logits[j] - golden_lse, lq = ours - lse_a;
    kl += exp(lp) * (lp - lq);
    p_top += exp(lp);
    q_top += exp(lq);
  }
  double p_rest = 1.0 - p_top, q_rest = 1.0 - q_top;
  if (p_rest > 1e-12 && q_rest > 1e-12) kl += p_rest * log(p_rest / q_rest);
  if (kl < 0) kl = 0; /* rounding */
  double rel = scale > 0 ? max_abs / scale : max_abs;
  if (!(max_abs <= s->max_abs)) s->max_abs = max_abs;
  if (!(rel <= s->max_rel)) s->max_rel = rel;
  if (!(kl <= s->max_kl)) s->max_kl = kl;
  s->argmax_agreement += arg_a == top_ids[0];
  *kl_sum += kl;
  s->n_positions++;
}

static void finish_stats(struct tsr_parity_stats *s, double kl_sum) {
  if (!s->n_positions) return;
  s->argmax_agreement /= (double)s->n_positions;
  s->mean_kl = kl_sum / (double)s->n_positions;
}

static void compare_hidden(const float *a, const float *b, int64_t n, struct tsr_parity_layer *l) {
  double max_abs = 0, scale = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (!(d <= max_abs)) max_abs = d;
    if (fabs(b[i]) > scale) scale = fabs(b[i]);
  }
  l->max_abs = max_abs;
  l->max_rel = scale > 0 ? max_abs / scale : max_abs;
}

/* A golden tensor of the expected type and element count. */
static tsr_status golden_tensor(const struct tsr_gguf *gold, const char *name, enum tsr_dtype dt,
                                int64_t n, const void **data) {
  const struct tsr_gguf_tensor *t = tsr_gguf_find_tensor(gold, name);
  if (!t) return tsr_error_set(TSR_ERR_FORMAT, "%s: no tensor '%s'", tsr_gguf_path(gold), name);
  if (t->dtype != dt || (n >= 0 && t->n_elements != n))
    return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor '%s' is %s with %lld values, expected %s "
                         "with %lld", tsr_gguf_path(gold), name, tsr_dtype_name(t->dtype),
                         (long long)t->n_elements, tsr_dtype_name(dt), (long long)n);
  *data = t->data;
  return TSR_OK;
}

struct model_ctx {
  struct tsr_plugin_host *host;
  struct tsr_gguf *model;
  const struct tsr_arch_v1 *arch;
  const struct tsr_attention_v1 *attention;
  struct tsr_arch_layer layers[TSR_MAX_LAYERS];
  int32_t n_layers;
  struct tsr_backend *backend;
};

static tsr_status open_model(const char *path, const struct tsr_parity_options *opt,
                             struct model_ctx *m, char *arch_out, size_t arch_cap) {
  tsr_status st = tsr_plugin_host_new(&m->host);
  if (st == TSR_OK && opt->plugin_dir) st = tsr_plugin_host_add_search_dir(m->host, opt->plugin_dir);
  if (st == TSR_OK) st = tsr_plugin_host_load_providers(m->host, TSR_IFACE_ARCH);
  if (st == TSR_OK) st = tsr_gguf_open(path, &m->model);
  const char *arch = NULL;
  if (st == TSR_OK) st = tsr_gguf_get_str(m->model, "general.architecture", &arch);
  if (st != TSR_OK) return st;
  snprintf(arch_out, arch_cap, "%s", arch);
  const struct tsr_plugin *owner = NULL;
  m->arch = tsr_plugin_host_arch(m->host, arch, &owner);
  if (!m->arch)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: no plugin on the search path provides arch "
                         "'%s'", path, arch);
  if (!m->arch->build)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: arch plugin %s %s cannot run '%s' models in "
                         "this version (it builds no graphs)", path, tsr_plugin_name(owner),
                         tsr_plugin_version(owner), arch);
  const char *attn = opt->attention ? opt->attention : "flash";
  m->attention = tsr_plugin_host_attention(m->host, attn, NULL);
  if (!m->attention) { /* a plugin's attention: load the attention providers on the path */
    st = tsr_plugin_host_load_providers(m->host, TSR_IFACE_ATTENTION);
    if (st != TSR_OK) return st;
    m->attention = tsr_plugin_host_attention(m->host, attn, NULL);
  }
  if (!m->attention)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "attention '%s' is not provided by any loaded plugin",
                         attn);
  st = m->arch->describe(m->arch->ctx, tsr_plugin_host_services(), m->model, m->layers,
                         TSR_MAX_LAYERS, &m->n_layers);
  if (st == TSR_OK && (st = tsr_model_validate(m->arch, m->model, m->layers, m->n_layers)))
    tsr_error_prefix("%s: %s", path, tsr_plugin_name(owner));
  if (st == TSR_OK) st = tsr_backend_cpu_new(opt->n_threads, &m->backend);
  return st;
}

static void close_model(struct model_ctx *m) {
  tsr_backend_free(m->backend);
  tsr_gguf_close(m->model);
  tsr_plugin_host_free(m->host);
}

/* Golden logits come in full ([vocab, n]) or, for large vocabularies, as
** the top-k ids and logits per position plus the log-sum-exp of the row. */
static tsr_status compare_logits(const struct tsr_gguf *gold, int seq,
                                 const struct tsr_arch_forward *fw, int64_t n,
                                 struct tsr_parity_report *r, double *total_kl) {
  char name[96];
  const int64_t vocab = fw->logits->ne[0];
  struct tsr_parity_stats *s = &r->seqs[seq];
  double kl_sum = 0;
  snprintf(name, sizeof name, "seq.%d.logits", seq);
  if (tsr_gguf_find_tensor(gold, name)) {
    const float *golden;
    tsr_status st = golden_tensor(gold, name, TSR_F32, vocab * n, (const void **)&golden);
    for (int64_t p = 0; st == TSR_OK && p < n; p++) {
      const float *ours = (const float *)((const char *)fw->logits->data + p * fw->logits->nb[1]);
      tsr_parity_compare_row(ours, golden + p * vocab, vocab, s, &kl_sum);
      tsr_parity_compare_row(ours, golden + p * vocab, vocab, &r->total, total_kl);
    }
    finish_stats(s, kl_sum);
    return st;
  }
  snprintf(name, sizeof name, "seq.%d.top_ids", seq);
  const struct tsr_gguf_tensor *t = tsr_gguf_find_tensor(gold, name);
  if (!t || t->n_dims != 2 || t->ne[1] != n)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: sequence %d has neither seq.%d.logits nor "
                         "seq.%d.top_ids [k, %lld]", tsr_gguf_path(gold), seq, seq, seq,
                         (long long)n);
  const int64_t k = t->ne[0];
  const int32_t *top_ids;
  const float *top_logits, *lse;
  tsr_status st = golden_tensor(gold, name, TSR_I32, k * n, (const void **)&top_ids);
  snprintf(name, sizeof name, "seq.%d.top_logits", seq);
  if (st == TSR_OK) st = golden_tensor(gold, name, TSR_F32, k * n, (const void **)&top_logits);
  snprintf(name, sizeof name, "seq.%d.lse", seq);
  if (st == TSR_OK) st = golden_tensor(gold, name, TSR_F32, n, (const void **)&lse);
  for (int64_t p = 0; st == TSR_OK && p < n; p++) {
    const float *ours = (const float *)((const char *)fw->logits->data + p * fw->logits->nb[1]);
    tsr_parity_compare_top(ours, vocab, top_ids + p * k, top_logits + p * k, k, lse[p], s, &kl_sum);
    tsr_parity_compare_top(ours, vocab, top_ids + p * k, top_logits + p * k, k, lse[p], &r->total,
                           total_kl);
  }
  finish_stats(s, kl_sum);
  return st;
}

/* Runs one sequence and compares it; hidden states too when asked. */
static tsr_status run_sequence(struct model_ctx *m, const struct tsr_gguf *gold, int seq,
                               bool with_hidden, struct tsr_parity_report *r, double *total_kl) {
  char name[96];
  snprintf(name, sizeof name, "seq.%d.ids", seq);
  const struct tsr_gguf_tensor *ids_t = tsr_gguf_find_tensor(gold, name);
  if (!ids_t) return tsr_error_set(TSR_ERR_FORMAT, "%s: no tensor '%s'", tsr_gguf_path(gold), name);
  const int32_t *ids;
  tsr_status st = golden_tensor(gold, name, TSR_I32, -1, (const void **)&ids);
  if (st != TSR_OK) return st;
  const int64_t n = ids_t->n_elements;

  struct tsr_graph *g = tsr_graph_new(64 * (m->n_layers + 4) + 4096);
  if (!g) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  struct tsr_tensor *hidden[TSR_MAX_LAYERS] = {0};
  struct tsr_arch_forward fw = {
      .struct_size = sizeof fw, .g = g, .model = m->model, .n_tokens = (int32_t)n,
      .tokens = tsr_new_tensor_1d(g, TSR_I32, n), .positions = tsr_new_tensor_1d(g, TSR_I32, n),
      .attention = m->attention, .layers = m->layers, .n_layers = m->n_layers,
      .hidden = with_hidden ? hidden : NULL};
  st = m->arch->build(m->arch->ctx, tsr_plugin_host_services(), &fw);
  if (st == TSR_OK) st = tsr_graph_status(g);
  if (st != TSR_OK) {
    tsr_error_prefix("building the forward pass");
    tsr_graph_free(g);
    return st;
  }
  tsr_graph_mark_output(fw.logits);
  for (int l = 0; with_hidden && l < m->n_layers; l++) tsr_graph_mark_output(hidden[l]);
  if (fw.embed) tsr_graph_mark_output(fw.embed);
  struct tsr_graph_plan plan;
  void *arena = NULL;
  st = tsr_graph_alloc(g, &plan, &arena);
  if (st == TSR_OK) {
    memcpy(fw.tokens->data, ids, (size_t)n * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) ((int32_t *)fw.positions->data)[i] = (int32_t)i;
    st = tsr_backend_compute(m->backend, g);
  }
  if (st == TSR_OK) st = compare_logits(gold, seq, &fw, n, r, total_kl);
  for (int l = 0; st == TSR_OK && with_hidden && l < m->n_layers; l++) {
    const float *gh;
    snprintf(name, sizeof name, "seq.%d.hidden.%d", seq, l);
    if (!tsr_gguf_find_tensor(gold, name)) break;
    const int64_t embd = hidden[l]->ne[0];
    st = golden_tensor(gold, name, TSR_F32, embd * n, (const void **)&gh);
    if (st == TSR_OK) compare_hidden((const float *)hidden[l]->data, gh, embd * n, &r->layers[l]);
    r->n_layers = l + 1;
  }
  /* stacked layout: [embd, positions, L+2]: embedding, each layer, final norm */
  snprintf(name, sizeof name, "seq.%d.hidden", seq);
  const struct tsr_gguf_tensor *stack = with_hidden ? tsr_gguf_find_tensor(gold, name) : NULL;
  if (st == TSR_OK && stack && stack->n_dims == 3 && stack->dtype == TSR_F32 && fw.embed &&
      stack->ne[0] == fw.embed->ne[0] && stack->ne[1] <= n && stack->ne[2] >= m->n_layers + 1) {
    const int64_t embd = stack->ne[0], np = stack->ne[1];
    const float *gh = stack->data;
    compare_hidden((const float *)fw.embed->data, gh, embd * np, &r->embed);
    r->has_embed = true;
    for (int l = 0; l < m->n_layers; l++)
      compare_hidden((const float *)hidden[l]->data, gh + (size_t)(l + 1) * embd * np, embd * np,
                     &r->layers[l]);
    r->n_layers = m->n_layers;
  }
  snprintf(name, sizeof name, "seq.%d.embed", seq);
  if (st == TSR_OK && with_hidden && fw.embed && tsr_gguf_find_tensor(gold, name)) {
    const float *ge;
    st = golden_tensor(gold, name, TSR_F32, fw.embed->ne[0] * n, (const void **)&ge);
    if (st == TSR_OK) {
      compare_hidden((const float *)fw.embed->data, ge, fw.embed->ne[0] * n, &r->embed);
      r->has_embed = true;
    }
  }
  free(arena);
  tsr_graph_free(g);
  return st;
}

tsr_status tsr_parity_run(const char *model_path, const char *golden_path,
                          const struct tsr_parity_options *opt, struct tsr_parity_report *out) {
  memset(out, 0, sizeof *out);
  struct model_ctx m = {0};
  struct tsr_gguf *gold = NULL;
  tsr_status st = open_model(model_path, opt, &m, out->arch, sizeof out->arch);
  if (st == TSR_OK) st = tsr_gguf_open(golden_path, &gold);
  uint32_t n_seqs = 0;
  if (st == TSR_OK) st = tsr_gguf_get_u32(gold, "golden.n_sequences", &n_seqs);
  if (st == TSR_OK && (n_seqs == 0 || n_seqs > TSR_PARITY_MAX_SEQS))
    st = tsr_error_set(TSR_ERR_FORMAT, "%s: golden.n_sequences = %u (1..%d)", golden_path, n_seqs,
                       TSR_PARITY_MAX_SEQS);
  if (st == TSR_OK && m.n_layers > TSR_PARITY_MAX_LAYERS)
    st = tsr_error_set(TSR_ERR_UNSUPPORTED, "%d layers (at most %d)", m.n_layers,
                       TSR_PARITY_MAX_LAYERS);
  double total_kl = 0;
  for (uint32_t i = 0; st == TSR_OK && i < n_seqs; i++) {
    st = run_sequence(&m, gold, (int)i, i == 0, out, &total_kl);
    out->n_seqs = (int)i + 1;
  }
  finish_stats(&out->total, total_kl);
  if (st == TSR_OK) {
    tsr_plugin_host_print_engagement(m.host, stderr);
    st = tsr_plugin_host_require_engaged(m.host, opt->require_engaged, opt->n_require_engaged);
  }
  tsr_gguf_close(gold);
  close_model(&m);
  return st;
}

void tsr_parity_print(const struct tsr_parity_report *r, FILE *f) {
  fprintf(f, "parity (%s):\n  %-5s %6s %12s %12s %9s %12s %12s\n", r->arch, "seq", "tokens",
          "max abs", "max rel", "argmax", "mean KL", "max KL");
  for (int i = 0; i <= r->n_seqs; i++) {
    const struct tsr_parity_stats *s = i < r->n_seqs ? &r->seqs[i] : &r->total;
    char label[16];
    snprintf(label, sizeof label, i < r->n_seqs ? "%d" : "all", i);
    fprintf(f, "  %-5s %6lld %12.3e %12.3e %8.2f%% %12.3e %12.3e\n", label,
            (long long)s->n_positions, s->max_abs, s->max_rel, 100.0 * s->argmax_agreement,
            s->mean_kl, s->max_kl);
  }
  if (r->has_embed || r->n_layers) fprintf(f, "hidden states, sequence 0:\n");
  if (r->has_embed)
    fprintf(f, "  embed      max abs %.3e  max rel %.3e\n", r->embed.max_abs, r->embed.max_rel);
  for (int l = 0; l < r->n_layers; l++)
    fprintf(f, "  layer %-4d max abs %.3e  max rel %.3e\n", l, r->layers[l].max_abs,
            r->layers[l].max_rel);
}
