/*
** arch_qwen: the Qwen family's layer plan from GGUF hyperparameters.
**
** qwen2, qwen3, qwen3moe: every layer is full attention.
** qwen3next, qwen35, qwen35moe: Gated DeltaNet (linear) layers with a full
** gated-attention layer every full_attention_interval-th layer
** ([lin, lin, lin, full] for 4); a NextN/MTP block appended by the converter
** (nextn_predict_layers) is a full-attention layer with its own KV cache.
**
** describe() gives the host the layer plan (negotiation, memory plan);
** convert() (convert_qwen*.c) writes GGUFs from Hugging Face checkpoints;
** build() runs qwen2, qwen3 and qwen3moe (forward_qwen3.c) and qwen35 and
** qwen35moe (forward_qwen35.c, with the conv1d and delta_rule ops that init
** registers, ops_deltanet.c); shift_keys() re-rotates cached keys for a
** context shift (qwen2, qwen3, qwen3moe; the hybrids refuse).
*/
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert_qwen.h"
#include "forward_qwen.h"
#include "ops_deltanet.h"
#include "tessera/plugin.h"

#define MAX_KEY 96

static tsr_status get_u32(const struct tsr_host *host, const struct tsr_gguf *m, const char *arch,
                          const char *suffix, uint32_t *out) {
  char key[MAX_KEY];
  snprintf(key, sizeof key, "%s.%s", arch, suffix);
  return host->gguf->get_u32(m, key, out);
}

static int has_key(const struct tsr_host *host, const struct tsr_gguf *m, const char *arch,
                   const char *suffix) {
  char key[MAX_KEY];
  snprintf(key, sizeof key, "%s.%s", arch, suffix);
  return host->gguf->has_key(m, key);
}

static int is_hybrid(const char *arch) {
  return !strcmp(arch, "qwen3next") || !strcmp(arch, "qwen35") || !strcmp(arch, "qwen35moe");
}

/* Recurrent state of one Gated DeltaNet layer per sequence, f32: the last
** conv_kernel-1 inputs of every conv channel plus the Hv x dk x dv matrix. */
static tsr_status linear_state_bytes(const struct tsr_host *host, const struct tsr_gguf *m,
                                     const char *arch, int64_t *out) {
  uint32_t conv_kernel, dk, hk, hv, inner;
  tsr_status st = get_u32(host, m, arch, "ssm.conv_kernel", &conv_kernel);
  if (st == TSR_OK) st = get_u32(host, m, arch, "ssm.state_size", &dk);
  if (st == TSR_OK) st = get_u32(host, m, arch, "ssm.group_count", &hk);
  if (st == TSR_OK) st = get_u32(host, m, arch, "ssm.time_step_rank", &hv);
  if (st == TSR_OK) st = get_u32(host, m, arch, "ssm.inner_size", &inner);
  if (st != TSR_OK) return st;
  if (conv_kernel < 1 || !dk || !hk || !hv || inner % hv || hv % hk)
    return host->set_error(TSR_ERR_FORMAT, "%s: inconsistent ssm hyperparameters (conv_kernel %u, "
                           "state_size %u, group_count %u, time_step_rank %u, inner_size %u)",
                           arch, conv_kernel, dk, hk, hv, inner);
  int64_t dv = inner / hv;
  int64_t channels = 2 * (int64_t)hk * dk + (int64_t)hv * dv;
  *out = 4 * ((int64_t)(conv_kernel - 1) * channels + (int64_t)hv * dk * dv);
  return TSR_OK;
}

static tsr_status qwen_describe(void *ctx, const struct tsr_host *host, const struct tsr_gguf *m,
                                struct tsr_arch_layer *layers, int32_t n_max, int32_t *n_layers) {
  (void)ctx;
  const char *arch;
  tsr_status st = host->gguf->get_str(m, "general.architecture", &arch);
  if (st != TSR_OK) return st;
  uint32_t n_layer, n_head, n_head_kv, n_embd, head_k, head_v;
  st = get_u32(host, m, arch, "block_count", &n_layer);
  if (st == TSR_OK) st = get_u32(host, m, arch, "attention.head_count", &n_head);
  if (st == TSR_OK) st = get_u32(host, m, arch, "embedding_length", &n_embd);
  if (st != TSR_OK) return st;
  n_head_kv = n_head; /* absent in some qwen2 files: no GQA */
  if (has_key(host, m, arch, "attention.head_count_kv"))
    st = get_u32(host, m, arch, "attention.head_count_kv", &n_head_kv);
  /* head dims default to embd / heads, as in files that predate the keys */
  head_k = head_v = n_head ? n_embd / n_head : 0;
  if (st == TSR_OK && has_key(host, m, arch, "attention.key_length"))
    st = get_u32(host, m, arch, "attention.key_length", &head_k);
  if (st == TSR_OK && has_key(host, m, arch, "attention.value_length"))
    st = get_u32(host, m, arch, "attention.value_length", &head_v);
  if (st != TSR_OK) return st;
  if (!n_layer || !n_head || !n_head_kv || n_head % n_head_kv || !head_k || !head_v)
    return host->set_error(TSR_ERR_FORMAT, "%s: inconsistent attention hyperparameters "
                           "(block_count %u, head_count %u, head_count_kv %u, key_length %u, "
                           "value_length %u)", arch, n_layer, n_head, n_head_kv, head_k, head_v);
  if ((int64_t)n_layer > n_max)
    return host->set_error(TSR_ERR_UNSUPPORTED, "%s: %u layers, more than the %d supported",
                           arch, n_layer, n_max);

  uint32_t interval = 1;
  int64_t state = 0;
  if (is_hybrid(arch)) {
    st = get_u32(host, m, arch, "full_attention_interval", &interval);
    if (st == TSR_OK && !interval)
      st = host->set_error(TSR_ERR_FORMAT, "%s.full_attention_interval is 0", arch);
    if (st == TSR_OK) st = linear_state_bytes(host, m, arch, &state);
    if (st != TSR_OK) return st;
  }
  uint32_t n_nextn = 0;
  if (has_key(host, m, arch, "nextn_predict_layers") &&
      (st = get_u32(host, m, arch, "nextn_predict_layers", &n_nextn)) != TSR_OK)
    return st;
  if (n_nextn >= n_layer)
    return host->set_error(TSR_ERR_FORMAT, "%s: nextn_predict_layers %u leaves no trunk of %u "
                           "layers", arch, n_nextn, n_layer);
  for (uint32_t i = 0; i < n_layer; i++) {
    bool trunk = i < n_layer - n_nextn;
    bool full = !trunk || (i + 1) % interval == 0;
    layers[i] = (struct tsr_arch_layer){
        .kind = full ? TSR_LAYER_FULL : TSR_LAYER_LINEAR,
        .n_head = full ? (int32_t)n_head : 0,
        .n_head_kv = full ? (int32_t)n_head_kv : 0,
        .head_dim_k = full ? (int32_t)head_k : 0,
        .head_dim_v = full ? (int32_t)head_v : 0,
        .state_bytes = full ? 0 : state,
    };
  }
  *n_layers = (int32_t)n_layer;
  return TSR_OK;
}

/* Op ids live in the process-wide registry and the plugin is never
** unloaded, so a second host in the same process reuses them. */
static struct tsr_qwen_ops g_ops = {-1, -1};

/* One per host that loaded the plugin (several hosts may share the library
** in one process): its handle, for counting, and the op ids. */
struct qwen_instance {
  struct tsr_qwen_ops ops;
  struct tsr_plugin *self;
};

/* Counts the forward graphs it built, so --require-engaged arch_qwen can
** tell a run that really went through this plugin. */
static tsr_status qwen_build(void *ctx, const struct tsr_host *host, struct tsr_arch_forward *fw) {
  struct qwen_instance *inst = ctx;
  tsr_status st = tsr_qwen_build(&inst->ops, host, fw);
  if (st == TSR_OK) host->engaged(inst->self, "forward_graphs", 1);
  return st;
}

/* Only the hybrids carry a NextN block; other archs say so by name. */
static tsr_status qwen_build_nextn(void *ctx, const struct tsr_host *host,
                                   struct tsr_arch_forward *fw) {
  struct qwen_instance *inst = ctx;
  const char *arch;
  tsr_status st = host->gguf->get_str(fw->model, "general.architecture", &arch);
  if (st != TSR_OK) return st;
  if (strcmp(arch, "qwen35") && strcmp(arch, "qwen35moe"))
    return host->set_error(TSR_ERR_UNSUPPORTED, "arch_qwen: %s models have no NextN / MTP "
                           "head (qwen35 and qwen35moe may)", arch);
  st = tsr_qwen35_build_nextn(&inst->ops, host, fw);
  if (st == TSR_OK) host->engaged(inst->self, "nextn_graphs", 1);
  return st;
}

static const char *qwen_chat_template(void *ctx, const char *arch) {
  (void)ctx, (void)arch;
  return "chatml"; /* every Qwen generation speaks ChatML */
}

static const struct tsr_arch_v1 g_arch = {
    .struct_size = sizeof(struct tsr_arch_v1),
    .names = "qwen2,qwen3,qwen3moe,qwen3next,qwen35,qwen35moe",
    .ctx = NULL, /* each registration carries its own struct qwen_instance */
    .describe = qwen_describe,
    .build = qwen_build,
    .shift_keys = tsr_qwen_shift_keys, /* forward_qwen3.c */
    .chat_template = qwen_chat_template,
    .build_nextn = qwen_build_nextn,
    .validate = tsr_qwen_validate, /* validate_qwen.c */
};

/* Hugging Face checkpoints of every generation the arch runs (convert_qwen.c). */
static const struct tsr_convert_v1 g_convert = {
    .struct_size = sizeof(struct tsr_convert_v1),
    .hf_types = QWEN_HF_TYPES,
    .convert = qwen_convert,
};

/* The cuda kernel of op id: symbol in arch_qwen_cuda.so (cuda/), which the
** host opens only when a cuda run checks a graph holding the op. Each is a
** launch made from its node alone (a state written in place stays at its
** address), so it is declared replayable: a Qwen3.5 decode step is captured as a
** CUDA graph. */
static tsr_status register_cuda(const struct tsr_host *host, struct tsr_plugin *self, int32_t id,
                                const char *symbol) {
  tsr_status st = host->kernel->register_kernel_lib(self, id, "cuda", "arch_qwen_cuda.so", symbol,
                                                    (void *)host);
  return st == TSR_OK ? host->kernel->declare_replayable(self, id, "cuda") : st;
}

static tsr_status register_ops(const struct tsr_host *host, struct tsr_plugin *self) {
  tsr_status st = TSR_OK;
  if (g_ops.conv1d < 0) {
    int32_t id;
    st = host->kernel->register_op(self, "conv1d", &id);
    if (st == TSR_OK)
      st = host->kernel->register_kernel(self, id, "cpu", tsr_qwen_conv1d_cpu, NULL);
    if (st == TSR_OK) st = register_cuda(host, self, id, "qwen_conv1d_cuda");
    if (st == TSR_OK) g_ops.conv1d = id;
  }
  if (st == TSR_OK && g_ops.delta_rule < 0) {
    int32_t id;
    st = host->kernel->register_op(self, "delta_rule", &id);
    if (st == TSR_OK)
      st = host->kernel->register_kernel(self, id, "cpu", tsr_qwen_delta_rule_cpu, NULL);
    if (st == TSR_OK) st = register_cuda(host, self, id, "qwen_delta_rule_cuda");
    if (st == TSR_OK) g_ops.delta_rule = id;
  }
  return st;
}

static tsr_status qwen_init(const struct tsr_host *host, struct tsr_plugin *self) {
  tsr_status st = register_ops(host, self);
  if (st != TSR_OK) return st;
  struct qwen_instance *inst = calloc(1, sizeof *inst);
  if (!inst) return host->set_error(TSR_ERR_NOMEM, "arch_qwen: out of memory");
  inst->ops = g_ops;
  inst->self = self;
  host->set_state(self, inst);
  struct tsr_arch_v1 arch = g_arch; /* the host keeps its own copy */
  arch.ctx = inst;
  st = host->register_arch(self, &arch);
  return st == TSR_OK ? host->register_convert(self, &g_convert) : st;
}

static void qwen_destroy(const struct tsr_host *host, struct tsr_plugin *self) {
  free(host->get_state(self));
}

static const struct tsr_plugin_iface g_provides[] = {{TSR_IFACE_ARCH, 1}, {TSR_IFACE_CONVERT, 1}};

static const struct tsr_plugin_descriptor g_descriptor = {
    .abi_major = TSR_PLUGIN_ABI_MAJOR,
    .abi_minor = TSR_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(struct tsr_plugin_descriptor),
    .name = "arch_qwen",
    .version = "0.1.0",
    .description = "Qwen 2/3/3-MoE/3.5/Next: layer plans, HF conversion, qwen2/qwen3/qwen3moe/qwen35/qwen35moe forward passes",
    .provides = g_provides,
    .n_provides = 2,
    .init = qwen_init,
    .destroy = qwen_destroy,
};

TSR_PLUGIN_EXPORT const struct tsr_plugin_descriptor *tsr_plugin_entry(void) {
  return &g_descriptor;
}
