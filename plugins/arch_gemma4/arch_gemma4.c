/*
** arch_gemma4: Gemma 4 layer plans from GGUF, and `tessera convert` for
** Gemma 4 checkpoints (convert_gemma4.c).
**
** GGUF architectures: `gemma4` (dense, MoE, per-layer-input E2B/E4B) and
** `gemma4-assistant` (the MTP drafter, whose layers all read the target's
** K/V). Sliding and full layers come from the per-layer bool array
** attention.sliding_window_pattern (true = sliding), as llama.cpp writes it;
** full layers use key_length/value_length (512) and sliding layers the
** _swa variants (256); attention.head_count_kv is a scalar or a per-layer
** array (full layers of k_eq_v models have fewer KV heads).
**
** build() is the forward pass of `gemma4` models (forward_gemma4.c); the
** assistant drafter describes itself but does not run yet.
**
** `gemma3` (Gemma 4's predecessor) shares the plan: one head dim for both
** kinds (key_length/value_length) and, as llama.cpp's loader implies it,
** every 6th layer full when the GGUF has no sliding_window_pattern. Its
** forward pass is forward_gemma3.c.
*/
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemma4.h"

#define MAX_KEY 128


static const char *key_of(char *buf, const char *arch, const char *suffix) {
  snprintf(buf, MAX_KEY, "%s.%s", arch, suffix);
  return buf;
}

static tsr_status get_i32(const struct tsr_host *host, const struct tsr_gguf *m, const char *arch,
                          const char *suffix, int32_t *out) {
  char key[MAX_KEY];
  uint32_t v;
  tsr_status st = host->gguf->get_u32(m, key_of(key, arch, suffix), &v);
  if (st != TSR_OK) return st;
  if (v > (uint32_t)INT32_MAX)
    return host->set_error(TSR_ERR_FORMAT, "%s is %u, out of range", key, v);
  *out = (int32_t)v;
  return TSR_OK;
}

/* A per-layer array: n i32 values, or n bools. */
static tsr_status read_array(const struct tsr_host *host, const struct tsr_gguf *m,
                             const char *key, int32_t n, int32_t *i32_out, bool *bool_out) {
  int64_t len;
  tsr_status st = host->gguf->arr_len(m, key, &len);
  if (st != TSR_OK) return st;
  if (len != n)
    return host->set_error(TSR_ERR_FORMAT, "%s has %lld elements for %d layers", key,
                           (long long)len, n);
  for (int32_t l = 0; l < n && st == TSR_OK; l++) {
    if (bool_out) {
      st = host->gguf->arr_bool(m, key, l, &bool_out[l]);
    } else {
      int64_t v;
      st = host->gguf->arr_i64(m, key, l, &v);
      if (st == TSR_OK && (v < 0 || v > INT32_MAX))
        st = host->set_error(TSR_ERR_FORMAT, "%s[%d] is %lld, out of range", key, l, (long long)v);
      if (st == TSR_OK) i32_out[l] = (int32_t)v;
    }
  }
  return st;
}

/* head_count_kv: one value for every layer, or one per layer. */
static tsr_status read_head_count_kv(const struct tsr_host *host, const struct tsr_gguf *m,
                                     const char *arch, struct gemma4_hparams *hp) {
  char key[MAX_KEY];
  key_of(key, arch, "attention.head_count_kv");
  uint32_t v;
  if (host->gguf->has_key(m, key) && host->gguf->get_u32(m, key, &v) == TSR_OK) {
    for (int32_t l = 0; l < hp->n_layer; l++) hp->n_head_kv[l] = (int32_t)v;
    return TSR_OK;
  }
  if (!host->gguf->has_key(m, key))
    return host->gguf->get_u32(m, key, &v); /* names the missing key */
  return read_array(host, m, key, hp->n_layer, hp->n_head_kv, NULL);
}

static tsr_status read_hparams(const struct tsr_host *host, const struct tsr_gguf *m,
                               const char *arch, struct gemma4_hparams *hp) {
  memset(hp, 0, sizeof *hp);
  tsr_status st = get_i32(host, m, arch, "block_count", &hp->n_layer);
  if (st == TSR_OK && (hp->n_layer <= 0 || hp->n_layer > GEMMA4_MAX_LAYERS))
    st = host->set_error(TSR_ERR_FORMAT, "%s.block_count is %d (1..%d supported)", arch,
                         hp->n_layer, GEMMA4_MAX_LAYERS);
  if (st == TSR_OK) st = get_i32(host, m, arch, "attention.head_count", &hp->n_head);
  if (st == TSR_OK) st = get_i32(host, m, arch, "attention.key_length", &hp->head_dim_k);
  if (st == TSR_OK) st = get_i32(host, m, arch, "attention.value_length", &hp->head_dim_v);
  /* Gemma 3's sliding and full layers share one head dim */
  const bool gemma3 = !strcmp(arch, "gemma3");
  if (gemma3) {
    hp->head_dim_k_swa = hp->head_dim_k;
    hp->head_dim_v_swa = hp->head_dim_v;
  } else {
    if (st == TSR_OK)
      st = get_i32(host, m, arch, "attention.key_length_swa", &hp->head_dim_k_swa);
    if (st == TSR_OK)
      st = get_i32(host, m, arch, "attention.value_length_swa", &hp->head_dim_v_swa);
  }
  if (st == TSR_OK) st = get_i32(host, m, arch, "attention.sliding_window", &hp->window);
  char key[MAX_KEY];
  /* optional in llama.cpp's loader: absent means no KV sharing */
  if (st == TSR_OK && host->gguf->has_key(m, key_of(key, arch, "attention.shared_kv_layers")))
    st = get_i32(host, m, arch, "attention.shared_kv_layers", &hp->n_kv_shared);
  if (st == TSR_OK) st = read_head_count_kv(host, m, arch, hp);
  if (st == TSR_OK) {
    key_of(key, arch, "attention.sliding_window_pattern");
    if (gemma3 && !host->gguf->has_key(m, key))
      for (int32_t l = 0; l < hp->n_layer; l++) hp->swa[l] = gemma3_layer_slides(l);
    else if (!host->gguf->has_key(m, key))
      st = host->set_error(TSR_ERR_FORMAT, "%s: missing key %s (which layers slide)", arch, key);
    else
      st = read_array(host, m, key, hp->n_layer, NULL, hp->swa);
  }
  return st;
}

static tsr_status gemma4_describe(void *ctx, const struct tsr_host *host, const struct tsr_gguf *m,
                                  struct tsr_arch_layer *layers, int32_t n_max, int32_t *n_layers) {
  (void)ctx;
  const char *arch;
  tsr_status st = host->gguf->get_str(m, "general.architecture", &arch);
  if (st != TSR_OK) return st;
  struct gemma4_hparams hp; /* 2.6 KB */
  st = read_hparams(host, m, arch, &hp);
  if (st == TSR_OK) st = gemma4_plan(host, arch, &hp, layers, n_max, NULL);
  if (st == TSR_OK) *n_layers = hp.n_layer;
  return st;
}

/* this plugin's op ids, once init registered them */
static struct gemma4_ops g_ops = {.rope = -1, .ordered_logits = -1};

/* One registration's state: the op ids (process-wide) and the plugin, so
** the forward passes it builds are counted for --require-engaged. */
struct gemma4_instance {
  struct gemma4_ops ops;
  struct tsr_plugin *self;
};

/* gemma3 and gemma4 share the plan; each has its own forward pass */
static tsr_status gemma_build(void *ctx, const struct tsr_host *host, struct tsr_arch_forward *fw) {
  struct gemma4_instance *inst = ctx;
  const char *arch;
  tsr_status st = host->gguf->get_str(fw->model, "general.architecture", &arch);
  if (st != TSR_OK) return st;
  st = !strcmp(arch, "gemma3") ? gemma3_build(&inst->ops, host, fw)
                               : gemma4_build(&inst->ops, host, fw);
  if (st == TSR_OK) host->engaged(inst->self, "forward_graphs", 1);
  return st;
}

static const char *gemma_chat_template(void *ctx, const char *arch) {
  (void)ctx;
  return arch && !strcmp(arch, "gemma3") ? "gemma" : "gemma4";
}

static const struct tsr_arch_v1 g_arch = {
    .struct_size = sizeof(struct tsr_arch_v1),
    .names = "gemma4,gemma4-assistant,gemma3",
    .ctx = NULL, /* each registration carries its own struct gemma4_instance */
    .describe = gemma4_describe,
    .build = gemma_build,
    .chat_template = gemma_chat_template,
    .validate = gemma4_validate, /* validate_gemma4.c */
};

/* Hugging Face checkpoints of Gemma 4 and its assistant drafter (convert_gemma4.c);
** Gemma 3 runs from llama.cpp's files only. */
static const struct tsr_convert_v1 g_convert = {
    .struct_size = sizeof(struct tsr_convert_v1),
    .hf_types = "gemma4,gemma4_text,gemma4_assistant",
    .convert = gemma4_convert,
};

static tsr_status gemma4_init(const struct tsr_host *host, struct tsr_plugin *self) {
  tsr_status st = gemma4_rope_register(host, self, &g_ops.rope);
  if (st == TSR_OK) st = gemma4_ordered_register(host, self, &g_ops.ordered_logits);
  if (st != TSR_OK) return st;
  struct gemma4_instance *inst = calloc(1, sizeof *inst);
  if (!inst) return host->set_error(TSR_ERR_NOMEM, "arch_gemma4: out of memory");
  inst->ops = g_ops;
  inst->self = self;
  host->set_state(self, inst);
  struct tsr_arch_v1 arch = g_arch; /* the host keeps its own copy */
  arch.ctx = inst;
  st = host->register_arch(self, &arch);
  return st == TSR_OK ? host->register_convert(self, &g_convert) : st;
}

static void gemma4_destroy(const struct tsr_host *host, struct tsr_plugin *self) {
  free(host->get_state(self));
}

static const struct tsr_plugin_iface g_provides[] = {{TSR_IFACE_ARCH, 1}, {TSR_IFACE_CONVERT, 1}};

static const struct tsr_plugin_descriptor g_descriptor = {
    .abi_major = TSR_PLUGIN_ABI_MAJOR,
    .abi_minor = TSR_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(struct tsr_plugin_descriptor),
    .name = "arch_gemma4",
    .version = "0.1.0",
    .description = "Gemma 4 (dense, MoE, E2B/E4B, assistant) layer plans, HF conversion "
                   "and forward pass; Gemma 3 layer plan and forward pass",
    .provides = g_provides,
    .n_provides = 2,
    .init = gemma4_init,
    .destroy = gemma4_destroy,
};

TSR_PLUGIN_EXPORT const struct tsr_plugin_descriptor *tsr_plugin_entry(void) {
  return &g_descriptor;
}
