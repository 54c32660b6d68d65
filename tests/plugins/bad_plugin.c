/*
** In-tree plugins that misbehave on purpose, one per BAD_* define, to test
** that the host refuses each with a precise message and rolls back.
*/
#include <stddef.h>
#include <string.h>

#include "tessera/plugin.h"

static tsr_status negotiate(void *ctx, const struct tsr_layer_desc *layer,
                            enum tsr_read_path *k_path, enum tsr_read_path *v_path) {
  (void)ctx, (void)layer;
  *k_path = *v_path = TSR_READ_NATIVE;
  return TSR_OK;
}
static struct tsr_tensor *build(void *ctx, const struct tsr_host *host, struct tsr_graph *g,
                                const struct tsr_attn_call *call) {
  (void)ctx;
  return host->graph->flash_attn(g, call);
}
__attribute__((unused)) static struct tsr_tensor *
prepare_k(void *ctx, const struct tsr_host *host, struct tsr_graph *g,
          const struct tsr_attn_rope *rope, struct tsr_tensor *k, struct tsr_tensor *pos) {
  (void)ctx;
  return host->graph->rope_apply(g, rope, k, pos);
}
static const struct tsr_attention_v1 g_attention = {
#if defined(BAD_SHORT)
    /* a struct that ends before ABI 2.0's last field (as ABI 1.0's did) */
    .struct_size = offsetof(struct tsr_attention_v1, applies_prepare_q),
#else
    .struct_size = sizeof(struct tsr_attention_v1),
#endif
#if defined(BAD_ROTATES)
    /* positions q itself, and never applies a K codec's query transform */
    .rotates = true,
    .prepare_k = prepare_k,
#endif
#if defined(BAD_DUPLICATE)
    .name = "flash", /* the core's name: refused */
#else
    .name = "bad_attention",
#endif
    .negotiate = negotiate,
    .build = build,
};
__attribute__((unused)) static void encode(void *ctx, const float *src, void *dst, int64_t n) {
  (void)ctx, (void)src, (void)dst, (void)n;
}
/* well-formed, but the descriptor does not provide kv_codec */
__attribute__((unused)) static const struct tsr_kv_codec_v1 g_codec = {
    .struct_size = sizeof(struct tsr_kv_codec_v1), .name = "bad_codec", .dtype = 1,
    .block_size = 1, .block_bytes = 2, .backends = "cpu", .encode_rows = encode,
};

__attribute__((unused)) static void decode(void *ctx, const void *src, float *dst, int64_t n) {
  (void)ctx, (void)src, (void)dst, (void)n;
}
#if defined(BAD_STATE)
/* more state tensors than a codec may keep */
static const struct tsr_kv_codec_v1 g_bad_codec = {
    .struct_size = sizeof(struct tsr_kv_codec_v1), .name = "bad_codec", .dtype = 1,
    .block_size = 1, .block_bytes = 2, .backends = "cpu", .encode_rows = encode,
    .n_state = TSR_KV_CODEC_MAX_STATE + 5,
};
#elif defined(BAD_READ)
/* a read kernel without the reads() that says which layers it takes */
static const struct tsr_kv_codec_kernels g_kernels = {
    .backend = "cuda", .file = "bad_read_cuda.so", .encode = "encode", .lift = "lift",
    .read = "read",
};
static const struct tsr_kv_codec_v1 g_bad_codec = {
    .struct_size = sizeof(struct tsr_kv_codec_v1), .name = "bad_codec",
    .dtype = TSR_KV_CODEC_OWN_DTYPE, .block_size = 32, .block_bytes = 36, .backends = "cpu,cuda",
    .encode_rows = encode, .decode_f32 = decode, .kernels = &g_kernels, .n_kernels = 1,
};
#endif

static tsr_status init(const struct tsr_host *host, struct tsr_plugin *self) {
  tsr_status st = host->register_attention(self, &g_attention);
#if defined(BAD_INIT_FAILS)
  if (st == TSR_OK) st = host->set_error(TSR_ERR_INVALID_ARG, "refusing to start on purpose");
#elif defined(BAD_UNDECLARED)
  if (st == TSR_OK) st = host->register_kv_codec(self, &g_codec);
#elif defined(BAD_STATE) || defined(BAD_READ)
  if (st == TSR_OK) st = host->register_kv_codec(self, &g_bad_codec);
#endif
  return st;
}

#if defined(BAD_STATE) || defined(BAD_READ)
static const struct tsr_plugin_iface g_provides[] = {{TSR_IFACE_ATTENTION, 1},
                                                     {TSR_IFACE_KV_CODEC, 1}};
#else
static const struct tsr_plugin_iface g_provides[] = {{TSR_IFACE_ATTENTION, 1}};
#endif
__attribute__((unused)) static const struct tsr_plugin_iface g_requires[] = {{TSR_IFACE_SPECULATOR, 1}};

static const struct tsr_plugin_descriptor g_descriptor = {
    .abi_major = TSR_PLUGIN_ABI_MAJOR,
    .abi_minor = TSR_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(struct tsr_plugin_descriptor),
    .name = BAD_NAME,
    .version = "1.0.0",
    .description = "misbehaves on purpose",
    .provides = g_provides,
#if defined(BAD_COUNTS)
    .n_provides = 1000000, /* one interface behind it: reading them all would crash */
#else
    .n_provides = sizeof g_provides / sizeof g_provides[0],
#endif
#if defined(BAD_REQUIRES)
    .requires = g_requires,
    .n_requires = 1,
#endif
    .init = init,
};

#if !defined(BAD_NO_ENTRY)
TSR_PLUGIN_EXPORT const struct tsr_plugin_descriptor *tsr_plugin_entry(void) {
  return &g_descriptor;
}
#else
TSR_PLUGIN_EXPORT const struct tsr_plugin_descriptor *not_the_entry(void) { return &g_descriptor; }
#endif
