/*
** A KV codec written the way a third party would, against the installed
** <tessera/plugin.h> alone: rot_f16 stores each K and V row rotated
** (example_codec.h) in f16. Its hooks (kv_codec interface) do the rotation in the
** graph: prepare_rows rotates the rows a layer stores, prepare_q rotates the
** queries, finish_out rotates the attention output back. A rotation keeps dot
** products, so the logits equal plain f16 KV's within f16 rounding, through
** any attention: proof that the hooks compose. Head dims that are not whole
** groups of 128 are stored padded with zeros to the next whole group
** (storage_dim); the setting extra_groups pads further, so a test can run the
** padded path on any model.
**
** scaled_f16 keeps state: two f32 vectors per layer and side (a per-channel
** scale s and 1 / s) that the KV cache allocates and fills through
** state_init; its hooks store rows x s, score queries x 1/s and bring the
** output back by 1/s, the shape of InnerQ-style channel scaling.
**
** q8_f32 is a codec of its own block layout (TSR_KV_CODEC_OWN_DTYPE): 32
** int8 values with an f32 scale, a dtype the host assigns, read and written
** on the cpu through its reference functions and on cuda through its encode
** and lift kernels and its read kernel, which flash runs in place of its own
** where K and V are both q8_f32. q8_f32_lift is the same layout without the
** read kernel: attention reads it lifted to f16 on cuda.
**
** Kernels: cpu here; cuda in example_codec_cuda.cu, built into
** example_codec_cuda.so beside this library when nvcc is found.
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "example_codec.h"

/* In place: the normalised Walsh-Hadamard transform of 128 values. */
static void wht(float *x) {
  for (int len = 1; len < ROT_GROUP; len <<= 1)
    for (int i = 0; i < ROT_GROUP; i += len << 1)
      for (int j = i; j < i + len; j++) {
        const float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
  for (int i = 0; i < ROT_GROUP; i++) x[i] *= ROT_INV_SQRT_GROUP;
}

/* One row: forward, in_dim values (zero-padded) to out_dim rotated ones; inverse,
** out_dim of the in_dim rotated values' preimage. */
static void rotate_row(const float *in, int64_t in_dim, float *out, int64_t out_dim,
                       bool inverse) {
  const int64_t n = inverse ? in_dim : out_dim; /* the rotated side, whole groups */
  float g[ROT_GROUP];
  for (int64_t g0 = 0; g0 < n; g0 += ROT_GROUP) {
    for (int i = 0; i < ROT_GROUP; i++) {
      const float x = g0 + i < in_dim ? in[g0 + i] : 0.0f;
      g[i] = x * rot_sign((uint32_t)i, inverse ? 2 : 1);
    }
    wht(g);
    for (int i = 0; i < ROT_GROUP && g0 + i < out_dim; i++)
      out[g0 + i] = g[i] * rot_sign((uint32_t)i, inverse ? 1 : 2);
  }
}

/* example_codec.rotate: registered once a process (its ops are the process's) */
static int32_t g_op = -1;

static void rotate_cpu(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                       const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  const struct codec_state *st = rot_state(params);
  (void)ctx, (void)n_src;
  const int64_t rows = dst->ne[1] * dst->ne[2] * dst->ne[3];
  const bool inverse = params[ROT_P_INVERSE] != 0;
  int64_t done = 0;
  /* the host hands hooks contiguous rows and the op's output is contiguous */
  for (int64_t r = ith; r < rows; r += nth, done++)
    rotate_row((const float *)src[0].data + r * src[0].ne[0], src[0].ne[0],
               (float *)dst->data + r * dst->ne[0], dst->ne[0], inverse);
  if (done) st->host->engaged(st->self, inverse ? "rows_unrotated" : "rows_rotated",
                              (uint64_t)done);
}

static struct tsr_tensor *rotate(struct codec_state *st, const struct tsr_host *h,
                                 struct tsr_graph *g, struct tsr_tensor *x, int64_t out_dim,
                                 bool inverse) {
  struct tsr_tensor_info xi;
  h->graph->tensor_info(x, &xi);
  const int64_t ne[4] = {out_dim, xi.ne[1], xi.ne[2], xi.ne[3]};
  int32_t params[ROT_P_COUNT] = {inverse, (int32_t)out_dim};
  memcpy(&params[ROT_P_STATE], &st, sizeof st);
  return h->graph->custom_op(g, g_op, xi.n_dims > 3 ? xi.n_dims : 3, ne, &x, 1, params,
                             ROT_P_COUNT);
}

static int32_t codec_storage_dim(void *ctx, int32_t head_dim) {
  const struct codec_state *st = ctx;
  return head_dim > 0 ? rot_storage_dim(head_dim, st->extra_groups) : 0;
}

static struct tsr_tensor *codec_prepare(void *ctx, const struct tsr_host *h, struct tsr_graph *g,
                                        const struct tsr_kv_codec_site *site,
                                        struct tsr_tensor *x) {
  (void)site;
  struct tsr_tensor_info xi;
  h->graph->tensor_info(x, &xi);
  return rotate(ctx, h, g, x, codec_storage_dim(ctx, (int32_t)xi.ne[0]), false);
}

static struct tsr_tensor *codec_finish_out(void *ctx, const struct tsr_host *h,
                                           struct tsr_graph *g,
                                           const struct tsr_kv_codec_site *site,
                                           struct tsr_tensor *out) {
  return rotate(ctx, h, g, out, site->head_dim, true);
}

/* ---- scaled_f16: per-channel scales kept as the codec's state ------------ */

enum { SCALE_STATE = 0, INVERSE_STATE = 1 };

static tsr_status scaled_state_shape(void *ctx, int32_t head_dim, int32_t n_head_kv, bool is_k,
                                     int32_t i, const char **name, int64_t ne[2]) {
  (void)ctx, (void)n_head_kv, (void)is_k;
  *name = i == SCALE_STATE ? "channel_scale" : "channel_inverse";
  ne[0] = head_dim, ne[1] = 1;
  return TSR_OK;
}

/* s_c = 1 + ((c + layer + side) mod 7) / 8: no power of two, so the stored rows
** round differently from plain f16's; different per layer and side, so a hook
** reading another layer's state would show. */
static tsr_status scaled_state_init(void *ctx, int32_t layer, bool is_k, int32_t i, float *data,
                                    int64_t n) {
  (void)ctx;
  for (int64_t c = 0; c < n; c++) {
    const float s = 1.0f + (float)((c + layer + (is_k ? 0 : 1)) % 7) / 8.0f;
    data[c] = i == SCALE_STATE ? s : 1.0f / s;
  }
  return TSR_OK;
}

/* stored rows x s (K and V alike) */
static struct tsr_tensor *scaled_rows(void *ctx, const struct tsr_host *h, struct tsr_graph *g,
                                      const struct tsr_kv_codec_site *site, struct tsr_tensor *x) {
  (void)ctx;
  return h->graph->mul(g, x, site->state[SCALE_STATE]);
}

/* queries / s against keys x s, and an output of values x s back by 1 / s */
static struct tsr_tensor *scaled_inverse(void *ctx, const struct tsr_host *h, struct tsr_graph *g,
                                         const struct tsr_kv_codec_site *site,
                                         struct tsr_tensor *x) {
  (void)ctx;
  return h->graph->mul(g, x, site->state[INVERSE_STATE]);
}

/* The CPU reference of the stored values: f16, IEEE round to nearest even. */
static uint16_t to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xffu;
  uint32_t man = x & 0x7fffffu;
  if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
  const int32_t e = (int32_t)exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return (uint16_t)sign;
    man |= 0x800000u;
    const uint32_t shift = (uint32_t)(14 - e), half = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    return (uint16_t)(sign | (half + (rem > mid || (rem == mid && (half & 1)))));
  }
  const uint32_t half = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffu;
  return (uint16_t)(sign | (half + (rem > 0x1000u || (rem == 0x1000u && (half & 1)))));
}

static float from_f16(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  float f;
  if (exp == 0) f = ldexpf((float)man, -24);
  else if (exp == 31) f = man ? NAN : INFINITY;
  else f = ldexpf((float)(man | 0x400u), (int)exp - 25);
  return sign ? -f : f;
}

static void encode_rows(void *ctx, const float *src, void *dst, int64_t n) {
  (void)ctx;
  for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = to_f16(src[i]);
}

static void decode_f16(void *ctx, const void *src, uint16_t *dst, int64_t n) {
  (void)ctx;
  memcpy(dst, src, (size_t)n * sizeof *dst);
}

static void decode_f32(void *ctx, const void *src, float *dst, int64_t n) {
  (void)ctx;
  for (int64_t i = 0; i < n; i++) dst[i] = from_f16(((const uint16_t *)src)[i]);
}

/* ---- q8_f32: a codec of its own block layout --------------------------- */

static void q8f_encode(void *ctx, const float *src, void *dst, int64_t n) {
  (void)ctx;
  for (int64_t b = 0; b < n / Q8F_BLOCK; b++) {
    const float *x = src + b * Q8F_BLOCK;
    uint8_t *o = (uint8_t *)dst + b * Q8F_BYTES;
    float amax = 0;
    for (int i = 0; i < Q8F_BLOCK; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
    memcpy(o, &d, 4);
    for (int i = 0; i < Q8F_BLOCK; i++) o[4 + i] = (uint8_t)(int8_t)lrintf(x[i] * id);
  }
}

static void q8f_decode(void *ctx, const void *src, float *dst, int64_t n) {
  (void)ctx;
  for (int64_t b = 0; b < n / Q8F_BLOCK; b++) {
    const uint8_t *o = (const uint8_t *)src + b * Q8F_BYTES;
    float d;
    memcpy(&d, o, 4);
    for (int i = 0; i < Q8F_BLOCK; i++) dst[b * Q8F_BLOCK + i] = d * (float)(int8_t)o[4 + i];
  }
}

/* Its cuda read kernel takes K and V both in q8_f32 with head dims of whole
** warps (a lane a value of each block), at most 16 values a lane. */
static bool q8f_reads(void *ctx, const struct tsr_layer_desc *layer) {
  (void)ctx;
  const int32_t dk = layer->head_dim_k, dv = layer->head_dim_v;
  return !strcmp(layer->k_codec, "q8_f32") && !strcmp(layer->v_codec, "q8_f32") && dk > 0 &&
         dk % 32 == 0 && dk <= 512 && dv > 0 && dv % 32 == 0 && dv <= 512;
}

static const struct tsr_plugin_setting g_settings[] = {
    {"extra_groups", TSR_SETTING_INT, 0, 4, "0", NULL,
     "groups of 128 zeros stored past each row's own (tests the padded path)"},
};

static tsr_status codec_init(const struct tsr_host *h, struct tsr_plugin *self) {
  int64_t extra = 0;
  tsr_status st = h->setting_i64(self, "extra_groups", &extra);
  if (st != TSR_OK) return st;
  struct codec_state *cs = calloc(1, sizeof *cs);
  if (!cs) return h->set_error(TSR_ERR_NOMEM, "example_codec: out of memory");
  cs->host = h, cs->self = self, cs->extra_groups = (int32_t)extra;
  h->set_state(self, cs);
  if (g_op < 0) {
    int32_t op;
    st = h->kernel->register_op(self, "rotate", &op);
    if (st == TSR_OK) st = h->kernel->register_kernel(self, op, "cpu", rotate_cpu, NULL);
    if (st == TSR_OK)
      st = h->kernel->register_kernel_lib(self, op, "cuda", "example_codec_cuda.so",
                                          "example_codec_rotate_cuda", NULL);
    /* its launches depend on the node alone, and it counts on replay */
    if (st == TSR_OK) st = h->kernel->declare_replayable(self, op, "cuda");
    if (st == TSR_OK) g_op = op;
  }
  const struct tsr_kv_codec_v1 codec = {
      .struct_size = sizeof codec,
      .name = "rot_f16",
      .dtype = 1, /* f16: every attention kernel reads it as it reads f16 */
      .block_size = 1,
      .block_bytes = 2,
      .backends = "cpu,cuda",
      .ctx = cs,
      .encode_rows = encode_rows,
      .decode_f16 = decode_f16,
      .decode_f32 = decode_f32,
      .storage_dim = codec_storage_dim,
      .prepare_rows = codec_prepare,
      .prepare_q = codec_prepare,
      .finish_out = codec_finish_out,
  };
  if (st == TSR_OK) st = h->register_kv_codec(self, &codec);
  const struct tsr_kv_codec_v1 scaled = {
      .struct_size = sizeof scaled,
      .name = "scaled_f16",
      .dtype = 1,
      .block_size = 1,
      .block_bytes = 2,
      .backends = "cpu,cuda",
      .encode_rows = encode_rows,
      .decode_f16 = decode_f16,
      .decode_f32 = decode_f32,
      .prepare_rows = scaled_rows,
      .prepare_q = scaled_inverse,
      .finish_out = scaled_inverse,
      .n_state = 2,
      .state_shape = scaled_state_shape,
      .state_init = scaled_state_init,
  };
  if (st == TSR_OK) st = h->register_kv_codec(self, &scaled);
  /* its kernels' ctx is the services table, which lives as long as the process */
  const struct tsr_kv_codec_kernels q8f_cuda = {
      .backend = "cuda",
      .file = "example_codec_cuda.so",
      .encode = "example_codec_q8f_encode_cuda",
      .lift = "example_codec_q8f_lift_cuda",
      .ctx = (void *)h,
      .read = "example_codec_q8f_read_cuda",
      .reads = q8f_reads,
  };
  struct tsr_kv_codec_kernels q8f_lift_cuda = q8f_cuda;
  q8f_lift_cuda.read = NULL, q8f_lift_cuda.reads = NULL;
  const struct tsr_kv_codec_v1 q8f = {
      .struct_size = sizeof q8f,
      .name = "q8_f32",
      .dtype = TSR_KV_CODEC_OWN_DTYPE,
      .block_size = Q8F_BLOCK,
      .block_bytes = Q8F_BYTES,
      .backends = "cpu,cuda",
      .encode_rows = q8f_encode,
      .decode_f32 = q8f_decode,
      .kernels = &q8f_cuda,
      .n_kernels = 1,
  };
  if (st == TSR_OK) st = h->register_kv_codec(self, &q8f);
  struct tsr_kv_codec_v1 q8f_lift = q8f;
  q8f_lift.name = "q8_f32_lift", q8f_lift.kernels = &q8f_lift_cuda;
  if (st == TSR_OK) st = h->register_kv_codec(self, &q8f_lift);
  return st;
}

static void codec_destroy(const struct tsr_host *h, struct tsr_plugin *self) {
  free(h->get_state(self));
}

static const struct tsr_plugin_iface g_provides[] = {{TSR_IFACE_KV_CODEC, 1}};

static const struct tsr_plugin_descriptor g_descriptor = {
    .abi_major = TSR_PLUGIN_ABI_MAJOR,
    .abi_minor = TSR_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(struct tsr_plugin_descriptor),
    .name = "example_codec",
    .version = "1.0.0",
    .description = "rot_f16 (a rotation through kv_codec hooks), scaled_f16 (per-channel "
                   "scales as codec state), q8_f32 (an own block layout, read in register on "
                   "cuda) and q8_f32_lift (the same, lifted)",
    .provides = g_provides,
    .n_provides = 1,
    .settings = g_settings,
    .n_settings = 1,
    .init = codec_init,
    .destroy = codec_destroy,
};

TSR_PLUGIN_EXPORT const struct tsr_plugin_descriptor *tsr_plugin_entry(void) {
  return &g_descriptor;
}
