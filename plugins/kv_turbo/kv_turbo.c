/*
** kv_turbo: rotated Lloyd-Max KV codecs turbo2, turbo3, turbo4 and turbo8
** (formats in turbo.h, for users in README.md).
**
** The rotation is the codec's graph hooks, so it composes with any attention
** (flash, attn_dca) on any backend: prepare_rows rotates the rows a layer
** stores (zero-padded to whole blocks of 64), prepare_q rotates the queries,
** finish_out rotates the attention output back. What is stored is the rotated
** rows' blocks, in a dtype of the codec's own layout: the CPU writes and reads
** them through encode_rows and decode_f32 here (the CPU attention decodes a
** tile at a time, in register); CUDA through cuda/turbo_cuda.cu's encode and
** lift kernels and its read kernel, which flash runs in place of its own where K
** and V are both turbo tiers (GQA decode in register; more query rows lifted
** to f16 for the tensor-core kernels). Other pairs (a turbo V with a q8_0 K)
** lift the turbo side to f16 on CUDA.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tessera/plugin.h>

#include "innerq.h"
#include "rotation_op.h"
#include "turbo.h"
#include "turbo_centroids.h"

/* ---- the tiers ------------------------------------------------------------ */

struct turbo_tier {
  const char *name;
  int bits;
  const float *centroids;
  float mids[255]; /* the boundaries between adjacent centroids, ascending */
};

static const float g_centroids2[] = {TURBO2_CENTROIDS}, g_centroids3[] = {TURBO3_CENTROIDS},
                   g_centroids4[] = {TURBO4_CENTROIDS}, g_centroids8[] = {TURBO8_CENTROIDS};

static struct turbo_tier g_tiers[] = {
    {"turbo2", 2, g_centroids2, {0}},
    {"turbo3", 3, g_centroids3, {0}},
    {"turbo4", 4, g_centroids4, {0}},
    {"turbo8", 8, g_centroids8, {0}},
};
#define N_TIERS (sizeof g_tiers / sizeof g_tiers[0])
_Static_assert(N_TIERS == TURBO_TIERS, "a dtype slot for each tier");

static void tiers_init(void) {
  for (size_t t = 0; t < N_TIERS; t++) {
    struct turbo_tier *r = &g_tiers[t];
    for (int i = 0; i + 1 < 1 << r->bits; i++)
      r->mids[i] = (r->centroids[i] + r->centroids[i + 1]) / 2;
  }
}

/* The nearest centroid's index: how many boundaries lie below u (a tie takes the
** lower index; NaN index 0). */
static int nearest(const struct turbo_tier *r, float u) {
  int lo = 0, hi = (1 << r->bits) - 1; /* the answer lies in [lo, hi] */
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (u > r->mids[mid]) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static void put_index(uint8_t *block, int bits, int i, int idx) {
  uint8_t *q = block + 2;
  switch (bits) {
  case 2: q[i / 4] |= (uint8_t)(idx << (2 * (i % 4))); break;
  case 3:
    q[i / 4] |= (uint8_t)((idx & 3) << (2 * (i % 4)));
    q[16 + i / 8] |= (uint8_t)((idx >> 2) << (i % 8));
    break;
  case 4: q[i / 2] |= (uint8_t)(idx << (4 * (i % 2))); break;
  default: q[i] = (uint8_t)idx;
  }
}

static void encode_block(const struct turbo_tier *r, const float *y, uint8_t *block) {
  memset(block, 0, (size_t)turbo_block_bytes(r->bits));
  double ss = 0;
  for (int i = 0; i < TURBO_BLOCK; i++) ss += (double)y[i] * y[i];
  const double norm = sqrt(ss);
  _Float16 s = 0;
  if (norm > 0 || norm != norm) { /* zeros stay zeros (s = 0); NaN stays NaN */
    const double inv = norm > 0 ? 8.0 / norm : 0.0;
    double cc = 0;
    for (int i = 0; i < TURBO_BLOCK; i++) {
      const int idx = nearest(r, (float)(y[i] * inv));
      put_index(block, r->bits, i, idx);
      cc += (double)r->centroids[idx] * r->centroids[idx];
    }
    s = (_Float16)(norm / sqrt(cc));
  }
  memcpy(block, &s, 2);
}

static void decode_block(const struct turbo_tier *r, const uint8_t *block, float *out) {
  _Float16 s;
  memcpy(&s, block, 2);
  for (int i = 0; i < TURBO_BLOCK; i++)
    out[i] = (float)s * r->centroids[turbo_index(block, r->bits, i)];
}

static void encode_rows(const struct turbo_tier *r, const float *src, void *dst, int64_t n) {
  const int bytes = turbo_block_bytes(r->bits);
  for (int64_t b = 0; b < n / TURBO_BLOCK; b++)
    encode_block(r, src + b * TURBO_BLOCK, (uint8_t *)dst + b * bytes);
}

static void decode_f32(const struct turbo_tier *r, const void *src, float *dst, int64_t n) {
  const int bytes = turbo_block_bytes(r->bits);
  for (int64_t b = 0; b < n / TURBO_BLOCK; b++)
    decode_block(r, (const uint8_t *)src + b * bytes, dst + b * TURBO_BLOCK);
}

static void decode_f16(const struct turbo_tier *r, const void *src, uint16_t *dst, int64_t n) {
  float tmp[TURBO_BLOCK];
  const int bytes = turbo_block_bytes(r->bits);
  for (int64_t b = 0; b < n / TURBO_BLOCK; b++) {
    decode_block(r, (const uint8_t *)src + b * bytes, tmp);
    for (int i = 0; i < TURBO_BLOCK; i++) {
      const _Float16 h = (_Float16)tmp[i];
      memcpy(&dst[b * TURBO_BLOCK + i], &h, 2);
    }
  }
}

/* Each tier's reference functions: a dtype keeps the first registration's for the
** process, so they name their tier themselves rather than through a host's ctx. */
#define TIER_FNS(T)                                                                       \
  static void encode_rows_##T(void *ctx, const float *src, void *dst, int64_t n) {       \
    (void)ctx;                                                                            \
    encode_rows(&g_tiers[T], src, dst, n);                                                \
  }                                                                                       \
  static void decode_f32_##T(void *ctx, const void *src, float *dst, int64_t n) {        \
    (void)ctx;                                                                            \
    decode_f32(&g_tiers[T], src, dst, n);                                                 \
  }                                                                                       \
  static void decode_f16_##T(void *ctx, const void *src, uint16_t *dst, int64_t n) {     \
    (void)ctx;                                                                            \
    decode_f16(&g_tiers[T], src, dst, n);                                                 \
  }
TIER_FNS(0)
TIER_FNS(1)
TIER_FNS(2)
TIER_FNS(3)
static void (*const g_encode[])(void *, const float *, void *, int64_t) = {
    encode_rows_0, encode_rows_1, encode_rows_2, encode_rows_3};
static void (*const g_decode_f32[])(void *, const void *, float *, int64_t) = {
    decode_f32_0, decode_f32_1, decode_f32_2, decode_f32_3};
static void (*const g_decode_f16[])(void *, const void *, uint16_t *, int64_t) = {
    decode_f16_0, decode_f16_1, decode_f16_2, decode_f16_3};

/* ---- the rotation ----------------------------------------------------------- */

static int32_t g_rotate_op = -1; /* kv_turbo.rotate, registered once a process */

static void rotate_cpu(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                       const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  (void)ctx, (void)n_src;
  const struct turbo_state *st = turbo_state_of(params);
  const bool inverse = params[TURBO_P_INVERSE] != 0;
  const uint64_t done = turbo_rotate_rows_cpu(ith, nth, dst, src, inverse);
  if (done)
    ((const struct tsr_host *)st->host)
        ->engaged(st->self, inverse ? "outputs_unrotated" : "rows_rotated", done);
}

static struct tsr_tensor *rotate(struct turbo_state *st, struct tsr_graph *g,
                                 struct tsr_tensor *x, int64_t out_dim, bool inverse) {
  return turbo_rotate_node(st->host, g, g_rotate_op, st, x, out_dim, inverse);
}

/* ---- InnerQ (innerq.h) --------------------------------------------------------- */

static int32_t g_stats_op = -1; /* kv_turbo.channel_stats: the rows as they are, measured */
enum { STATS_P_LAYER = 0 };

static void channel_stats_cpu(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                              const struct tsr_tensor_info *src, int n_src,
                              const int32_t *params) {
  (void)ctx, (void)n_src;
  struct turbo_state *st = turbo_state_of(params);
  const struct tsr_host *h = st->host;
  const int64_t dim = dst->ne[0], rows = dst->ne[1] * dst->ne[2] * dst->ne[3];
  for (int64_t r = ith; r < rows; r += nth) /* contiguous rows in and out */
    memcpy((float *)dst->data + r * dim, (const float *)src[0].data + r * dim,
           sizeof(float) * (size_t)dim);
  if (ith != 0) return; /* one thread adds to the sums, in row order: the same every run */
  innerq_measure(st->innerq, params[STATS_P_LAYER], src[0].data, (int32_t)dim, rows);
  h->engaged(st->self, "innerq_rows_measured", (uint64_t)rows);
}

static struct tsr_tensor *channel_stats(struct turbo_state *st, struct tsr_graph *g,
                                        int32_t layer, struct tsr_tensor *x) {
  const struct tsr_host *h = st->host;
  struct tsr_tensor_info xi;
  h->graph->tensor_info(x, &xi);
  if (layer < 0 || layer >= INNERQ_MAX_LAYERS || xi.ne[0] > INNERQ_MAX_DIM) {
    h->graph->fail(g, TSR_ERR_UNSUPPORTED, "kv_turbo innerq_calibrate: layer %d of head dim "
                   "%lld is past what a calibration records (%d layers, head dims to %d)",
                   (int)layer, (long long)xi.ne[0], INNERQ_MAX_LAYERS, INNERQ_MAX_DIM);
    return NULL;
  }
  if (!innerq_reserve(st->innerq, layer, (int32_t)xi.ne[0])) {
    h->graph->fail(g, TSR_ERR_NOMEM, "kv_turbo innerq_calibrate: out of memory, or layer %d "
                   "seen at two head dims", (int)layer);
    return NULL;
  }
  int32_t params[TURBO_P_COUNT] = {layer};
  memcpy(&params[TURBO_P_STATE], &st, sizeof st);
  return h->graph->custom_op(g, g_stats_op, xi.n_dims, xi.ne, &x, 1, params, TURBO_P_COUNT);
}

/* K: one scale a channel ([head_dim, 1]: state 0 the scales, 1 their inverses for the
** queries); V keeps a placeholder, as every side of a codec with state has one. */
static tsr_status state_shape(void *ctx, int32_t head_dim, int32_t n_head_kv, bool is_k,
                              int32_t i, const char **name, int64_t ne[2]) {
  (void)ctx, (void)n_head_kv;
  *name = !is_k ? "unused" : i == 0 ? "innerq_k_scale" : "innerq_q_scale";
  ne[0] = is_k ? head_dim : 1;
  ne[1] = 1;
  return TSR_OK;
}

static tsr_status state_init(void *ctx, int32_t layer, bool is_k, int32_t i, float *data,
                             int64_t n) {
  struct turbo_state *st = ctx;
  const struct tsr_host *h = st->host;
  if (!is_k) {
    data[0] = 1;
    return TSR_OK;
  }
  tsr_status s = innerq_scales(h, st->innerq, layer, (int32_t)n, i == 1, data);
  if (s == TSR_OK && i == 0) h->engaged(st->self, "innerq_layers_scaled", 1);
  return s;
}

/* ---- the hooks ---------------------------------------------------------------- */

/* rows: K measured or scaled (InnerQ), then rotated into whole blocks */
static struct tsr_tensor *prepare_rows(void *ctx, const struct tsr_host *h, struct tsr_graph *g,
                                       const struct tsr_kv_codec_site *site,
                                       struct tsr_tensor *x) {
  struct turbo_state *st = ctx;
  if (site->is_k && st->innerq && st->calibrate_path)
    x = channel_stats(st, g, site->layer, x);
  else if (site->is_k && st->innerq)
    x = h->graph->mul(g, x, site->state[0]);
  if (!x) return NULL;
  struct tsr_tensor_info xi;
  h->graph->tensor_info(x, &xi);
  return rotate(st, g, x, turbo_storage_dim(xi.ne[0]), false);
}

/* queries: scaled inversely to the keys (InnerQ), then rotated */
static struct tsr_tensor *prepare_q(void *ctx, const struct tsr_host *h, struct tsr_graph *g,
                                    const struct tsr_kv_codec_site *site, struct tsr_tensor *q) {
  struct turbo_state *st = ctx;
  if (st->innerq && !st->calibrate_path && !(q = h->graph->mul(g, q, site->state[1])))
    return NULL;
  struct tsr_tensor_info qi;
  h->graph->tensor_info(q, &qi);
  return rotate(st, g, q, turbo_storage_dim(qi.ne[0]), false);
}

static struct tsr_tensor *finish_out(void *ctx, const struct tsr_host *h, struct tsr_graph *g,
                                     const struct tsr_kv_codec_site *site,
                                     struct tsr_tensor *out) {
  (void)h;
  return rotate(ctx, g, out, site->head_dim, true);
}

/* ---- cuda ------------------------------------------------------------------- */

static struct turbo_cuda_ctx g_cuda; /* the cuda kernels' ctx (turbo.h) */

static bool is_tier(const char *name) {
  for (size_t t = 0; t < N_TIERS; t++)
    if (!strcmp(name, g_tiers[t].name)) return true;
  return false;
}

/* The read kernel takes K and V both in turbo tiers, stored head dims up to 512. */
static bool reads(void *ctx, const struct tsr_layer_desc *layer) {
  (void)ctx;
  return is_tier(layer->k_codec) && is_tier(layer->v_codec) && layer->head_dim_k > 0 &&
         layer->head_dim_k <= 512 && layer->head_dim_v > 0 && layer->head_dim_v <= 512;
}

/* ---- the plugin ------------------------------------------------------------- */

static const struct tsr_plugin_setting g_settings[] = {
    {"innerq_calibrate", TSR_SETTING_STRING, 1, 0, "", NULL,
     "InnerQ: measure each layer's K channel RMS over this run (cpu backend, a turbo tier as K) "
     "and write them to this file when the plugin unloads; empty: off"},
    {"innerq_scales", TSR_SETTING_STRING, 1, 0, "", NULL,
     "InnerQ: scale K channels by such a file's statistics, the queries inversely; empty: off"},
    {"innerq_strength", TSR_SETTING_FLOAT, 0, 1, "0.5", NULL,
     "InnerQ: a channel's scale is (mean RMS / its RMS) to this power"},
    {"innerq_range", TSR_SETTING_FLOAT, 1, 64, "2", NULL,
     "InnerQ: scales are clamped to [1/range, range]"},
};
#define N_SETTINGS (sizeof g_settings / sizeof g_settings[0])

/* The InnerQ settings: off, measuring (calibrate) or scaling (scales). */
static tsr_status innerq_init(const struct tsr_host *h, struct tsr_plugin *self,
                              struct turbo_state *st) {
  const char *calibrate = NULL, *scales = NULL;
  double strength = 0, range = 0;
  tsr_status s = h->setting_str(self, "innerq_calibrate", &calibrate);
  if (s == TSR_OK) s = h->setting_str(self, "innerq_scales", &scales);
  if (s == TSR_OK) s = h->setting_f64(self, "innerq_strength", &strength);
  if (s == TSR_OK) s = h->setting_f64(self, "innerq_range", &range);
  if (s != TSR_OK) return s;
  if (!calibrate[0] && !scales[0]) return TSR_OK;
  if (calibrate[0] && scales[0])
    return h->set_error(TSR_ERR_INVALID_ARG, "kv_turbo: innerq_calibrate and innerq_scales both "
                        "set: a calibration measures unscaled keys; set one");
  if (!(st->innerq = calloc(1, sizeof *st->innerq)))
    return h->set_error(TSR_ERR_NOMEM, "kv_turbo: out of memory");
  st->innerq->strength = strength, st->innerq->range = range;
  if (scales[0]) return innerq_load(h, st->innerq, scales);
  if (!(st->calibrate_path = strdup(calibrate)))
    return h->set_error(TSR_ERR_NOMEM, "kv_turbo: out of memory");
  if (g_stats_op >= 0) return TSR_OK;
  /* a cpu kernel only: while calibrating the tiers run on the cpu alone (turbo_init) */
  int32_t op;
  s = h->kernel->register_op(self, "channel_stats", &op);
  if (s == TSR_OK) s = h->kernel->register_kernel(self, op, "cpu", channel_stats_cpu, NULL);
  if (s == TSR_OK) g_stats_op = op;
  return s;
}

static tsr_status turbo_init(const struct tsr_host *h, struct tsr_plugin *self) {
  struct turbo_state *st = calloc(1, sizeof *st);
  if (!st) return h->set_error(TSR_ERR_NOMEM, "kv_turbo: out of memory");
  st->host = h, st->self = self;
  h->set_state(self, st);
  tsr_status s = innerq_init(h, self, st);
  if (s == TSR_OK && g_rotate_op < 0) {
    tiers_init();
    int32_t op;
    s = h->kernel->register_op(self, "rotate", &op);
    if (s == TSR_OK) s = h->kernel->register_kernel(self, op, "cpu", rotate_cpu, NULL);
    if (s == TSR_OK)
      s = h->kernel->register_kernel_lib(self, op, "cuda", "kv_turbo_cuda.so",
                                         "kv_turbo_rotate_cuda", NULL);
    /* its launches depend on the node alone, and it counts on replay */
    if (s == TSR_OK) s = h->kernel->declare_replayable(self, op, "cuda");
    if (s == TSR_OK) g_rotate_op = op;
    g_cuda.host = h;
  }
  static const char *const encode[] = {"kv_turbo_encode2_cuda", "kv_turbo_encode3_cuda",
                                       "kv_turbo_encode4_cuda", "kv_turbo_encode8_cuda"};
  static const char *const lift[] = {"kv_turbo_lift2_cuda", "kv_turbo_lift3_cuda",
                                     "kv_turbo_lift4_cuda", "kv_turbo_lift8_cuda"};
  for (size_t t = 0; t < N_TIERS && s == TSR_OK; t++) {
    const struct tsr_kv_codec_kernels cuda = {
        .backend = "cuda",
        .file = "kv_turbo_cuda.so",
        .encode = encode[t],
        .lift = lift[t],
        .ctx = &g_cuda,
        .read = "kv_turbo_read_cuda",
        .reads = reads,
    };
    const struct tsr_kv_codec_v1 codec = {
        .struct_size = sizeof codec,
        .name = g_tiers[t].name,
        .dtype = TSR_KV_CODEC_OWN_DTYPE,
        .block_size = TURBO_BLOCK,
        .block_bytes = (size_t)turbo_block_bytes(g_tiers[t].bits),
        /* measuring keys is a cpu op: profile check refuses a calibration on another backend */
        .backends = st->calibrate_path ? "cpu" : "cpu,cuda",
        .ctx = st,
        .encode_rows = g_encode[t],
        .decode_f16 = g_decode_f16[t],
        .decode_f32 = g_decode_f32[t],
        .storage_dim = turbo_codec_storage_dim,
        .prepare_rows = prepare_rows,
        .prepare_q = prepare_q,
        .finish_out = finish_out,
        .kernels = &cuda,
        .n_kernels = 1,
        .n_state = st->innerq && !st->calibrate_path ? 2 : 0,
        .state_shape = state_shape,
        .state_init = state_init,
    };
    s = h->register_kv_codec(self, &codec);
    const struct tsr_kv_codec_v1 *got = s == TSR_OK ? h->find_kv_codec(self, codec.name, 0) : NULL;
    if (got) g_cuda.dtype[t] = got->dtype;
  }
  return s;
}

static void turbo_destroy(const struct tsr_host *h, struct tsr_plugin *self) {
  struct turbo_state *st = h->get_state(self);
  if (st && st->calibrate_path) { /* the calibration's result, or why there is none */
    int64_t layers = 0, rows = 0;
    char why[512];
    for (int32_t i = 0; i < INNERQ_MAX_LAYERS; i++)
      if (st->innerq->layer[i].rows > 0) layers++, rows += st->innerq->layer[i].rows;
    if (!layers)
      h->log(self, TSR_LOG_INFO, "innerq_calibrate: no key rows were measured (nothing ran, or "
             "kv.k is not a turbo tier): %s not written", st->calibrate_path);
    else if (innerq_write(st->innerq, st->calibrate_path, why, sizeof why))
      h->log(self, TSR_LOG_INFO, "innerq_calibrate: K channel RMS of %lld layers (%lld rows) "
             "written to %s", (long long)layers, (long long)rows, st->calibrate_path);
    else
      h->log(self, TSR_LOG_ERROR, "innerq_calibrate: %s", why);
  }
  if (st) {
    innerq_free(st->innerq);
    free(st->calibrate_path);
  }
  free(st);
}

static const struct tsr_plugin_iface g_provides[] = {{TSR_IFACE_KV_CODEC, 1}};

static const struct tsr_plugin_descriptor g_descriptor = {
    .abi_major = TSR_PLUGIN_ABI_MAJOR,
    .abi_minor = TSR_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(struct tsr_plugin_descriptor),
    .name = "kv_turbo",
    .version = "1.0.0",
    .description = "rotated Lloyd-Max KV codecs turbo2/3/4/8 (2.25/3.25/4.25/8.25 bits a value)",
    .provides = g_provides,
    .n_provides = 1,
    .settings = g_settings,
    .n_settings = N_SETTINGS,
    .init = turbo_init,
    .destroy = turbo_destroy,
};

TSR_PLUGIN_EXPORT const struct tsr_plugin_descriptor *tsr_plugin_entry(void) {
  return &g_descriptor;
}
