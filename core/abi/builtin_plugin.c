/*
** The core's own plugin, registered through the same services table as any
** other: the `flash` attention and the scalar KV codecs (GGUF types and q6_0).
*/
#include <string.h>

#include "graph/dtype.h"
#include "tessera/attn_decode_fit.h"
#include "common/error.h"
#include "abi/plugin_host_internal.h"

/* The core KV codecs: every scalar dtype both backends read and write. */
static const enum tsr_dtype g_codec_types[] = {TSR_F32,  TSR_F16,  TSR_BF16, TSR_Q8_0, TSR_Q6_0,
                                               TSR_Q5_1, TSR_Q5_0, TSR_Q4_1, TSR_Q4_0};
#define N_CODECS (sizeof g_codec_types / sizeof g_codec_types[0])

/* ---- flash -------------------------------------------------------------- */

/* Whether a codec's own kernel reads this layer's K and V in register on its
** backend in place of the core's flash kernel (plugin.h, tsr_kv_codec_kernels.read):
** K's codec's when it has one, else V's, the order the cuda backend picks it in. */
static bool codec_reads_layer(void *ctx, const struct tsr_layer_desc *layer) {
  const char *codecs[2] = {layer->k_codec, layer->v_codec};
  for (int i = 0; i < 2; i++) {
    const struct tsr_kv_codec_v1 *c = tsr_plugin_host_services()->find_kv_codec(ctx, codecs[i], 0);
    if (!c || !tsr_dtype_is_codec(c->dtype)) continue;
    for (uint32_t j = 0; j < c->n_kernels; j++) {
      const struct tsr_kv_codec_kernels *k = &c->kernels[j];
      if (k->read && !strcmp(k->backend, layer->backend)) return k->reads(k->ctx, layer);
    }
  }
  return false;
}

static tsr_status flash_negotiate(void *ctx, const struct tsr_layer_desc *layer,
                                  enum tsr_read_path *k_path, enum tsr_read_path *v_path) {
  const bool cuda = !strcmp(layer->backend, "cuda");
  if (strcmp(layer->backend, "cpu") && !cuda)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "flash has no kernel for backend '%s' in this "
                         "build", layer->backend);
  if (layer->kind == TSR_LAYER_LINEAR)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "flash does not run linear-attention layers");
  const char *codecs[2] = {layer->k_codec, layer->v_codec};
  const int32_t dims[2] = {layer->head_dim_k, layer->head_dim_v};
  enum tsr_read_path *paths[2] = {k_path, v_path};
  if (cuda && codec_reads_layer(ctx, layer)) {
    /* the codec's kernel reads both sides as stored, in place of the core's */
    for (int i = 0; i < 2; i++) {
      const struct tsr_kv_codec_v1 *codec =
          tsr_plugin_host_services()->find_kv_codec(ctx, codecs[i], 0);
      const bool as_is = codec && (codec->dtype == TSR_F32 || codec->dtype == TSR_F16);
      *paths[i] = as_is ? TSR_READ_NATIVE : TSR_READ_IN_REGISTER;
    }
    return TSR_OK;
  }
  for (int i = 0; i < 2; i++) {
    /* What the kernel reads is the codec's storage dtype, whoever registered it.
    ** f32 and f16 are read as stored; bf16, the GGUF block types and (on the
    ** cpu) codecs of their own layout are decoded by the kernel itself, a tile
    ** at a time (cpu/ops_attention.c); on cuda a codec of its own layout
    ** without a read kernel taking the layer is lifted to f16 by its kernel first. */
    const struct tsr_kv_codec_v1 *codec =
        tsr_plugin_host_services()->find_kv_codec(ctx, codecs[i], 0);
    const int dt = codec ? codec->dtype : -1;
    const struct tsr_dtype_traits *tr = dt >= 0 ? tsr_dtype_traits(dt) : NULL;
    /* the cuda kernel (core/cuda/kernels_attn.cu) decodes the core codecs in
    ** registers, head dims up to 512; it cannot lift another codec */
    bool core_codec = false;
    for (size_t c = 0; c < N_CODECS; c++) core_codec |= dt == (int)g_codec_types[c];
    /* a codec of its own layout that runs on cuda has a kernel lifting it to f16 */
    const bool own_layout = tsr_dtype_is_codec(dt);
    if (cuda && !core_codec && !own_layout)
      return tsr_error_set(TSR_ERR_UNSUPPORTED, "flash on cuda reads codecs stored in the core "
                           "dtypes only (f32, f16, bf16, q8_0, q6_0, q5_1, q5_0, q4_1, q4_0); %s "
                           "codec %s is stored as %s", i ? "V" : "K", codecs[i],
                           tr ? tr->name : "none of them");
    if (cuda && dims[i] > 512)
      return tsr_error_set(TSR_ERR_UNSUPPORTED, "flash on cuda holds head dims up to 512; %s "
                           "head dim is %d", i ? "V" : "K", (int)dims[i]);
    if (tr && dims[i] > 0 && dims[i] % tr->block_size)
      return tsr_error_set(TSR_ERR_UNSUPPORTED, "flash reads %s codec %s in whole blocks of "
                           "%lld values; head dim %d is not a multiple", i ? "V" : "K",
                           codecs[i], (long long)tr->block_size, (int)dims[i]);
    if (dt == TSR_F32 || dt == TSR_F16)
      *paths[i] = TSR_READ_NATIVE;
    else if (cuda && own_layout)
      *paths[i] = TSR_READ_LIFT;
    else if (tr && tr->to_f32 && (tr->is_quantized || dt == TSR_BF16))
      *paths[i] = TSR_READ_IN_REGISTER;
    else
      *paths[i] = TSR_READ_LIFT;
  }
  return TSR_OK; /* mixed pairs are fine: each side is read on its own path */
}

static struct tsr_tensor *flash_build(void *ctx, const struct tsr_host *host, struct tsr_graph *g,
                                      const struct tsr_attn_call *call) {
  struct tsr_tensor *out = host->graph->flash_attn(g, call);
  /* ctx is the registering plugin (several hosts may live in one process) */
  if (out) host->engaged(ctx, "flash_layers_built", 1);
  return out;
}

/* V rows skipped as decode parameters ask: by the cpu kernel on every layer
** (cpu/ops_attention.c), on cuda by the GQA decode kernel, on the layers it takes */
static bool flash_honours_decode(void *ctx, const struct tsr_layer_desc *layer) {
  if (!strcmp(layer->backend, "cpu")) return true;
  if (strcmp(layer->backend, "cuda") || layer->n_head_kv <= 0 ||
      layer->n_head % layer->n_head_kv)
    return false;
  const struct tsr_host *h = tsr_plugin_host_services();
  const struct tsr_kv_codec_v1 *k = h->find_kv_codec(ctx, layer->k_codec, 0);
  const struct tsr_kv_codec_v1 *v = h->find_kv_codec(ctx, layer->v_codec, 0);
  return k && v &&
         tsr_gqa_decode_shape_fits(layer->n_head / layer->n_head_kv, layer->head_dim_k,
                                   layer->head_dim_v, k->dtype, v->dtype);
}

static const struct tsr_attention_v1 g_flash = {
    .struct_size = sizeof(struct tsr_attention_v1),
    .name = "flash",
    .negotiate = flash_negotiate,
    .build = flash_build,
    .v_skip = true,
    .honours_decode = flash_honours_decode,
    .v_skip_budget = true, /* on the cpu: the composition refuses a budget elsewhere */
};

/* ---- scalar codecs, straight from the dtype traits ---------------------- */

static void codec_encode(void *ctx, const float *src, void *dst, int64_t n) {
  tsr_dtype_traits((int)(intptr_t)ctx)->from_f32(src, dst, n);
}

static void codec_decode_f16(void *ctx, const void *src, uint16_t *dst, int64_t n) {
  const struct tsr_dtype_traits *tr = tsr_dtype_traits((int)(intptr_t)ctx);
  float tmp[256]; /* whole blocks at a time: every block size here divides 256 */
  const int64_t step = 256;
  for (int64_t i = 0; i < n; i += step) {
    int64_t m = n - i < step ? n - i : step;
    tr->to_f32((const char *)src + (size_t)(i / tr->block_size) * tr->type_size, tmp, m);
    for (int64_t j = 0; j < m; j++) dst[i + j] = tsr_f32_to_f16(tmp[j]);
  }
}

static void codec_decode_f32(void *ctx, const void *src, float *dst, int64_t n) {
  tsr_dtype_traits((int)(intptr_t)ctx)->to_f32(src, dst, n);
}

/* q6_0 is tessera's own block type (core/kv/KV_CODECS.md), the rest are GGUF's. */

static tsr_status core_init(const struct tsr_host *host, struct tsr_plugin *self) {
  struct tsr_attention_v1 flash = g_flash; /* the host keeps its own copy */
  flash.ctx = self;
  tsr_status st = host->register_attention(self, &flash);
  static struct tsr_kv_codec_v1 codecs[N_CODECS];
  for (size_t i = 0; i < N_CODECS && st == TSR_OK; i++) {
    const struct tsr_dtype_traits *tr = tsr_dtype_traits((int)g_codec_types[i]);
    codecs[i] = (struct tsr_kv_codec_v1){
        .struct_size = sizeof(struct tsr_kv_codec_v1),
        .name = tr->name,
        .dtype = (int32_t)g_codec_types[i],
        .block_size = tr->block_size,
        .block_bytes = tr->type_size,
        .backends = "cpu,cuda", /* cuda: set_rows and flash_attn read and write them */
        .ctx = (void *)(intptr_t)g_codec_types[i],
        .encode_rows = codec_encode,
        .decode_f16 = codec_decode_f16,
        .decode_f32 = codec_decode_f32,
    };
    st = host->register_kv_codec(self, &codecs[i]);
  }
  return st;
}

static const struct tsr_plugin_iface g_core_provides[] = {
    {TSR_IFACE_ATTENTION, 1},
    {TSR_IFACE_KV_CODEC, 1},
};

#define TSR_STR2(x) #x
#define TSR_STR(x) TSR_STR2(x)

static const struct tsr_plugin_descriptor g_core = {
    .abi_major = TSR_PLUGIN_ABI_MAJOR,
    .abi_minor = TSR_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(struct tsr_plugin_descriptor),
    .name = "core",
    .version = TSR_STR(TSR_VERSION_MAJOR) "." TSR_STR(TSR_VERSION_MINOR) "." TSR_STR(
        TSR_VERSION_PATCH),
    .description = "built-in: flash attention and the scalar KV codecs",
    .provides = g_core_provides,
    .n_provides = 2,
    .init = core_init,
};

const struct tsr_plugin_descriptor *tsr_builtin_core_descriptor(void) { return &g_core; }
