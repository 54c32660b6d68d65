/*
** Whole-model parity on the GPU: a reference fixture's forward pass, built
** exactly as core/quality/parity.c builds it (arch plugin, built-in `flash`
** attention, every golden sequence in one ubatch, positions 0..n-1), run on
** the cpu backend and on the cuda backend; the cuda logits are compared with
** the golden ones (argmax agreement and mean KL, core/quality/parity.c's measures)
** and with the cpu's. The engine (KV cache, decode steps) is not involved:
** the engine still creates a cpu backend itself (core/cuda/README.md).
**
** usage: gpu_model_parity MODEL.gguf GOLDEN.gguf LABEL [--min-argmax A] [--max-kl K]
**                         [--max-vs-cpu R] [--self]
** --self runs the second side on a cpu backend with 8-bit activations instead of cuda: the
** tool's own check on a machine without a GPU (a quantized model's layers then differ).
** --max-vs-cpu R also bars the cuda logits' distance from the cpu's (max over positions of
** max |cuda - cpu| / max |cpu| of the row): the exact mode's bar (TESSERA_CUDA_PRECISION=f32
** in the environment), against the cpu backend's f32 path (8-bit activations off). Each
** layer's output, cuda against cpu by the same measure, is printed before the verdict line:
** where the two part, layer by layer.
** Prints one line, PASS / FAIL / REFUSED (the cuda backend refused an op
** before running, e.g. a plugin op with no cuda kernel; the message names it).
** Exit status: 0 pass, 1 fail, 2 refused.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/backend.h"
#include "common/error.h"
#include "model/gguf.h"
#include "quality/parity.h"
#include "abi/plugin_host.h"
#include "abi/setup.h"

struct model {
  struct tsr_plugin_host *host;
  struct tsr_gguf *model, *gold;
  const struct tsr_arch_v1 *arch;
  const struct tsr_attention_v1 *attention;
  struct tsr_arch_layer layers[TSR_MAX_LAYERS];
  int32_t n_layers;
};

static tsr_status open_model(const char *path, const char *golden, struct model *m) {
  tsr_status st = tsr_plugin_host_new(&m->host);
  if (st == TSR_OK) st = tsr_plugin_host_load_providers(m->host, TSR_IFACE_ARCH);
  if (st == TSR_OK) st = tsr_gguf_open(path, &m->model);
  if (st == TSR_OK) st = tsr_gguf_open(golden, &m->gold);
  const char *arch = NULL;
  if (st == TSR_OK) st = tsr_gguf_get_str(m->model, "general.architecture", &arch);
  if (st != TSR_OK) return st;
  m->arch = tsr_plugin_host_arch(m->host, arch, NULL);
  if (!m->arch || !m->arch->build)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "no arch plugin builds '%s' graphs", arch);
  m->attention = tsr_plugin_host_attention(m->host, "flash", NULL);
  if (!m->attention) return tsr_error_set(TSR_ERR_INTERNAL, "no built-in flash attention");
  return m->arch->describe(m->arch->ctx, tsr_plugin_host_services(), m->model, m->layers,
                           TSR_MAX_LAYERS, &m->n_layers);
}

/* max over the n rows (of width w) of max |b - a| / max |a| of the row; a NaN is infinite */
static double rows_max_rel(const float *a, const char *b, int64_t nb1, int64_t w, int64_t n) {
  double worst = 0;
  for (int64_t p = 0; p < n; p++) {
    const float *x = a + p * w, *y = (const float *)(b + p * nb1);
    double scale = 0, diff = 0;
    for (int64_t i = 0; i < w; i++) {
      scale = fmax(scale, fabs(x[i]));
      const double d = fabs((double)y[i] - x[i]);
      diff = d == d ? fmax(diff, d) : INFINITY;
    }
    worst = fmax(worst, diff / (scale > 0 ? scale : 1));
  }
  return worst;
}

/* Golden comparison of one position's logits (full rows, or top-k + lse). */
static void compare_golden(const struct tsr_gguf *gold, int seq, int64_t p, const float *ours,
                           int64_t vocab, struct tsr_parity_stats *s, double *kl) {
  char name[64];
  snprintf(name, sizeof name, "seq.%d.logits", seq);
  const struct tsr_gguf_tensor *full = tsr_gguf_find_tensor(gold, name);
  if (full) {
    tsr_parity_compare_row(ours, (const float *)full->data + p * vocab, vocab, s, kl);
    return;
  }
  snprintf(name, sizeof name, "seq.%d.top_ids", seq);
  const struct tsr_gguf_tensor *ids = tsr_gguf_find_tensor(gold, name);
  snprintf(name, sizeof name, "seq.%d.top_logits", seq);
  const struct tsr_gguf_tensor *lg = tsr_gguf_find_tensor(gold, name);
  snprintf(name, sizeof name, "seq.%d.lse", seq);
  const struct tsr_gguf_tensor *lse = tsr_gguf_find_tensor(gold, name);
  if (!ids || !lg || !lse) return;
  const int64_t k = ids->ne[0];
  tsr_parity_compare_top(ours, vocab, (const int32_t *)ids->data + p * k,
                         (const float *)lg->data + p * k, k, ((const float *)lse->data)[p], s, kl);
}

/* The span of the model's tensor data, kept on the device as the engine
** keeps it (uploaded once). */
static tsr_status keep_weights(struct tsr_backend *b, const struct tsr_gguf *model) {
  const char *lo = NULL, *hi = NULL;
  for (int64_t i = 0; i < tsr_gguf_n_tensors(model); i++) {
    const struct tsr_gguf_tensor *t = tsr_gguf_tensor_at(model, i);
    const char *p = t->data;
    if (!p || !t->nbytes) continue;
    if (!lo || p < lo) lo = p;
    if (!hi || p + t->nbytes > hi) hi = p + t->nbytes;
  }
  return lo ? tsr_backend_keep(b, lo, (size_t)(hi - lo)) : TSR_OK;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s MODEL.gguf GOLDEN.gguf LABEL [--min-argmax A] [--max-kl K] "
            "[--max-vs-cpu R] [--self]\n", argv[0]);
    return 1;
  }
  const char *label = argv[3];
  double min_argmax = 0.999, max_kl = 1e-3, max_vs_cpu = INFINITY;
  bool self = false;
  for (int i = 4; i < argc; i++) {
    if (!strcmp(argv[i], "--self")) self = true;
    else if (i + 1 < argc && !strcmp(argv[i], "--min-argmax")) min_argmax = atof(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--max-kl")) max_kl = atof(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--max-vs-cpu")) max_vs_cpu = atof(argv[++i]);
    else {
      fprintf(stderr, "gpu_model_parity: unknown or incomplete option '%s'\n", argv[i]);
      return 1;
    }
  }
  static struct model m;
  struct tsr_backend *cpu = NULL, *cuda = NULL;
  tsr_status st = open_model(argv[1], argv[2], &m);
  if (st == TSR_OK) st = tsr_backend_cpu_new(0, &cpu);
  if (st == TSR_OK) st = self ? tsr_backend_cpu_new(2, &cuda) : tsr_backend_cuda_new(&cuda);
  if (st == TSR_OK && self) tsr_backend_cpu_set_activations_q8(cuda, true);
  if (st == TSR_OK) st = keep_weights(cuda, m.model);
  uint32_t n_seqs = 0;
  if (st == TSR_OK) st = tsr_gguf_get_u32(m.gold, "golden.n_sequences", &n_seqs);
  struct tsr_parity_stats gs = {0}, cs = {0};
  double gkl = 0, ckl = 0, vs_cpu = 0, layer_vs_cpu[TSR_MAX_LAYERS] = {0};
  bool refused = false;
  for (uint32_t seq = 0; st == TSR_OK && seq < n_seqs; seq++) {
    char name[64];
    snprintf(name, sizeof name, "seq.%u.ids", seq);
    const struct tsr_gguf_tensor *ids = tsr_gguf_find_tensor(m.gold, name);
    if (!ids) {
      st = tsr_error_set(TSR_ERR_FORMAT, "golden has no %s", name);
      break;
    }
    const int64_t n = ids->n_elements;
    struct tsr_graph *g = tsr_graph_new(64 * (m.n_layers + 4) + 4096);
    struct tsr_tensor *hidden[TSR_MAX_LAYERS] = {0};
    struct tsr_arch_forward fw = {
        .struct_size = sizeof fw, .g = g, .model = m.model, .n_tokens = (int32_t)n,
        .tokens = tsr_new_tensor_1d(g, TSR_I32, n), .positions = tsr_new_tensor_1d(g, TSR_I32, n),
        .attention = m.attention, .layers = m.layers, .n_layers = m.n_layers, .hidden = hidden};
    st = m.arch->build(m.arch->ctx, tsr_plugin_host_services(), &fw);
    if (st == TSR_OK) st = tsr_graph_status(g);
    void *arena = NULL;
    struct tsr_graph_plan plan;
    if (st == TSR_OK) {
      tsr_graph_mark_output(fw.logits);
      for (int l = 0; l < m.n_layers; l++)
        if (hidden[l]) tsr_graph_mark_output(hidden[l]);
      st = tsr_graph_alloc(g, &plan, &arena);
    }
    if (st == TSR_OK) {
      st = tsr_backend_check_graph(cuda, g);
      refused = st != TSR_OK;
    }
    const int64_t vocab = st == TSR_OK ? fw.logits->ne[0] : 0;
    float *ref = st == TSR_OK ? malloc((size_t)(vocab * n) * sizeof *ref) : NULL;
    float *ref_hidden[TSR_MAX_LAYERS] = {0}; /* the cpu's layer outputs, packed rows */
    if (st == TSR_OK) {
      memcpy(fw.tokens->data, ids->data, (size_t)n * sizeof(int32_t));
      for (int64_t i = 0; i < n; i++) ((int32_t *)fw.positions->data)[i] = (int32_t)i;
      st = tsr_backend_compute(cpu, g);
    }
    for (int64_t p = 0; st == TSR_OK && p < n; p++) {
      const float *row = (const float *)((const char *)fw.logits->data + p * fw.logits->nb[1]);
      memcpy(ref + p * vocab, row, (size_t)vocab * sizeof *ref);
      compare_golden(m.gold, (int)seq, p, row, vocab, &cs, &ckl);
    }
    for (int l = 0; st == TSR_OK && l < m.n_layers; l++) {
      const struct tsr_tensor *h = hidden[l];
      if (!h || !(ref_hidden[l] = malloc((size_t)(h->ne[0] * n) * sizeof(float)))) continue;
      for (int64_t p = 0; p < n; p++)
        memcpy(ref_hidden[l] + p * h->ne[0], (const char *)h->data + p * h->nb[1],
               (size_t)h->ne[0] * sizeof(float));
    }
    if (st == TSR_OK) st = tsr_backend_compute(cuda, g);
    for (int64_t p = 0; st == TSR_OK && p < n; p++) {
      const float *row = (const float *)((const char *)fw.logits->data + p * fw.logits->nb[1]);
      compare_golden(m.gold, (int)seq, p, row, vocab, &gs, &gkl);
      double scale = 0, diff = 0;
      for (int64_t i = 0; i < vocab; i++) {
        scale = fmax(scale, fabs(ref[p * vocab + i]));
        double d = fabs((double)row[i] - ref[p * vocab + i]);
        diff = d == d ? fmax(diff, d) : INFINITY;
      }
      vs_cpu = fmax(vs_cpu, diff / (scale > 0 ? scale : 1));
    }
    for (int l = 0; l < m.n_layers; l++) {
      if (st == TSR_OK && ref_hidden[l])
        layer_vs_cpu[l] = fmax(layer_vs_cpu[l], rows_max_rel(ref_hidden[l], hidden[l]->data,
                                                             hidden[l]->nb[1], hidden[l]->ne[0], n));
      free(ref_hidden[l]);
    }
    free(ref);
    free(arena);
    tsr_graph_free(g);
  }
  if (st == TSR_OK)
    for (int l = 0; l < m.n_layers; l++)
      printf("  %s layer %-3d cuda vs cpu max rel %.2e\n", label, l, layer_vs_cpu[l]);
  if (st != TSR_OK) {
    printf("%s  model %-28s %s\n", refused ? "REFUSED" : "FAIL", label, tsr_error_message());
  } else {
    const double ga = gs.n_positions ? gs.argmax_agreement / gs.n_positions : 0;
    const double gk = gs.n_positions ? gkl / gs.n_positions : INFINITY;
    const double ca = cs.n_positions ? cs.argmax_agreement / cs.n_positions : 0;
    const double ck = cs.n_positions ? ckl / cs.n_positions : INFINITY;
    const bool ok = ga >= min_argmax && gk <= max_kl && vs_cpu <= max_vs_cpu;
    char vs_bar[48] = "";
    if (isfinite(max_vs_cpu)) snprintf(vs_bar, sizeof vs_bar, ", vs cpu <= %.0e", max_vs_cpu);
    printf("%s  model %-28s cuda: argmax %.2f%% mean KL %.2e | cpu: argmax %.2f%% mean KL %.2e | "
           "cuda vs cpu max rel %.2e (%lld positions; bar argmax >= %.1f%%, KL <= %.0e%s)\n",
           ok ? "PASS" : "FAIL", label, 100 * ga, gk, 100 * ca, ck, vs_cpu,
           (long long)gs.n_positions, 100 * min_argmax, max_kl, vs_bar);
    st = ok ? TSR_OK : TSR_ERR_INTERNAL;
  }
  if (cuda) tsr_backend_free(cuda); /* before the mapping it keeps a copy of */
  if (cpu) tsr_backend_free(cpu);
  if (m.gold) tsr_gguf_close(m.gold);
  if (m.model) tsr_gguf_close(m.model);
  if (m.host) tsr_plugin_host_free(m.host);
  return st == TSR_OK ? 0 : refused ? 2 : 1;
}
