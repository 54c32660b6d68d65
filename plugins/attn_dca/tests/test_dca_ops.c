/*
** attn_dca's graph pieces on the CPU, through the plugin as the host loads it:
**   - against an independent reference: per query, three attentions over the
**     intra, successive and inter keys, each with q rotated in double at its
**     band's position (dca.md §3), merged by log-sum-exp in double, over the
**     keys as the cache holds them (rotated at p mod C by prepare_k, then
**     encoded in the K codec and decoded back), many geometries and every
**     scalar KV codec;
**   - prepare_k against a double rotation at p mod C;
**   - a context of at most one chunk bit for bit against flash;
**   - decode one query at a time bit for bit against one prefill;
**   - geometries that leave bands (or whole rows) empty stay finite;
**   - a context shift re-rotates each key to where prepare_k puts it.
** `--backend cuda` runs the same tests through the cuda backend and the
** plugin's cuda kernels (tests/gpu/run.sh check, on the GPU machine), and
** compares cuda with the cpu on prefill and split-KV decode cases.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../dca.h"
#include "graph/backend.h"
#include "graph/dtype.h"
#include "graph/graph.h"
#include "graph/graph_internal.h"
#include "abi/op_registry.h"
#include "abi/plugin_host.h"
#include "model/gguf.h"
#include "tests/harness.h"

static struct tsr_plugin_host *g_host, *g_host_yarn;
static const struct tsr_attention_v1 *g_dca, *g_dca_yarn, *g_flash;
static struct tsr_backend *g_be, *g_cpu; /* g_be: the backend under test */
static const char *g_backend = "cpu";
static double g_worst[64]; /* worst relative error per K codec, for the summary */

struct dcase {
  int D, Dv, Hq, Hkv, n_rot, neox;
  int cs, ls;          /* the chunk geometry, given as the model's hints */
  int nkv, nq;         /* keys at positions 0..nkv-1 (cells shuffled), queries at the end */
  enum tsr_dtype kdt, vdt;
  int holes;           /* every holes-th cell empty (kv_pos -1); 0: none */
  int hole_lo, hole_hi; /* positions [lo, hi) removed too (seq_rm) */
  int mask;            /* a random -inf mask, as for a batch of sequences */
  int yarn;            /* the YaRN temperature past 16 positions */
  float softcap;
  int ff;              /* per-pair frequency factors */
};

struct data {
  float *q, *k, *v;        /* [Hq][nq][D], [Hkv][nkv][D] raw, [Hkv][nkv][Dv] */
  int32_t *qpos, *kvpos;   /* kvpos[cell]; -1 empty */
  float *mask;             /* [nq][nkv] or NULL */
  float *ff;               /* [n_rot/2] or NULL */
  float *kst;              /* prepare_k's keys [Hkv][nkv][D] */
  void *kenc, *venc;       /* encoded [Hkv][nkv] rows */
  float *kdec, *vdec;      /* what the kernel reads */
};

/* ---- graph plumbing ------------------------------------------------------------ */

static tsr_status run(struct tsr_graph *g, struct tsr_tensor *out, float *dst, size_t n) {
  struct tsr_graph_plan plan;
  void *arena = NULL;
  tsr_graph_mark_output(out);
  tsr_status st = tsr_graph_status(g);
  if (st == TSR_OK) st = tsr_graph_alloc(g, &plan, &arena);
  if (st == TSR_OK) st = tsr_backend_compute(g_be, g);
  if (st == TSR_OK) memcpy(dst, out->data, n * sizeof(float));
  free(arena);
  return st;
}

/* A model file holding general.architecture qwen2, the u32 keys given (NULL-terminated
** name, value pairs) and, unless NULL, the string key text_key, opened; the file itself
** is gone. */
static struct tsr_gguf *model_with(const char *const *keys, const uint32_t *values,
                                   const char *text_key) {
  char path[] = "/tmp/tsr_test_dca_XXXXXX";
  const int fd = mkstemp(path);
  CHECK(fd >= 0);
  close(fd);
  struct tsr_gguf_writer *w = NULL;
  struct tsr_gguf *m = NULL;
  CHECK_OK(tsr_gguf_writer_new(&w));
  CHECK_OK(tsr_gguf_writer_add_str(w, "general.architecture", "qwen2"));
  for (int i = 0; keys[i]; i++) CHECK_OK(tsr_gguf_writer_add_u32(w, keys[i], values[i]));
  if (text_key) CHECK_OK(tsr_gguf_writer_add_str(w, text_key, "long"));
  CHECK_OK(tsr_gguf_writer_write(w, path));
  CHECK_OK(tsr_gguf_open(path, &m));
  tsr_gguf_writer_free(w);
  unlink(path);
  return m;
}

/* The model a case's geometry comes from: its chunk_size and local_size as a
** Qwen2.5-1M file holds them, read by attn_dca itself; one file per geometry. */
static struct {
  int cs, ls;
  struct tsr_gguf *m;
} g_models[64];
static int g_n_models;

static const struct tsr_gguf *model_of(const struct dcase *c) {
  for (int i = 0; i < g_n_models; i++)
    if (g_models[i].cs == c->cs && g_models[i].ls == c->ls) return g_models[i].m;
  if (g_n_models == (int)(sizeof g_models / sizeof g_models[0])) {
    fprintf(stderr, "model_of: more geometries than g_models holds\n");
    exit(1);
  }
  static const char *const keys[] = {"qwen2.dual_chunk_attention.chunk_size",
                                     "qwen2.dual_chunk_attention.local_size", NULL};
  const uint32_t values[] = {(uint32_t)c->cs, (uint32_t)c->ls};
  g_models[g_n_models].cs = c->cs, g_models[g_n_models].ls = c->ls;
  return g_models[g_n_models++].m = model_with(keys, values, NULL);
}

static struct tsr_attn_rope rope_of(const struct dcase *c, struct tsr_tensor *ff) {
  return (struct tsr_attn_rope){.struct_size = sizeof(struct tsr_attn_rope), .n_rot = c->n_rot,
                                .neox = c->neox, .freq_base = 10000.0f, .freq_scale = 1.0f,
                                .freq_factors = ff, .model = model_of(c), .arch = "qwen2"};
}

static void *encode(enum tsr_dtype dt, const float *x, size_t rows, int n, float *dec) {
  const size_t rs = tsr_dtype_row_size(dt, n);
  char *enc = malloc(rows * rs);
  for (size_t r = 0; r < rows; r++) {
    CHECK_OK(tsr_dtype_from_f32(dt, x + r * n, enc + r * rs, n));
    CHECK_OK(tsr_dtype_to_f32(dt, enc + r * rs, dec + r * n, n));
  }
  return enc;
}

/* k [D, Hkv, nkv] (a projection's layout) through prepare_k: [Hkv][nkv][D] */
static void prepare_keys(const struct dcase *c, struct data *d,
                         const struct tsr_attention_v1 *a) {
  struct tsr_graph *g = tsr_graph_new(64);
  float *kin = malloc(sizeof(float) * c->D * c->Hkv * c->nkv);
  for (int h = 0; h < c->Hkv; h++)
    for (int j = 0; j < c->nkv; j++)
      memcpy(kin + ((size_t)j * c->Hkv + h) * c->D, d->k + ((size_t)h * c->nkv + j) * c->D,
             sizeof(float) * c->D);
  int32_t *pos = malloc(sizeof(int32_t) * c->nkv); /* an empty cell's key: any position */
  for (int j = 0; j < c->nkv; j++) pos[j] = d->kvpos[j] < 0 ? j : d->kvpos[j];
  struct tsr_tensor *k = tsr_new_external(g, TSR_F32, 3, (int64_t[]){c->D, c->Hkv, c->nkv}, kin);
  struct tsr_tensor *p = tsr_new_external(g, TSR_I32, 1, (int64_t[]){c->nkv}, pos);
  struct tsr_tensor *ff =
      d->ff ? tsr_new_external(g, TSR_F32, 1, (int64_t[]){c->n_rot / 2}, d->ff) : NULL;
  struct tsr_attn_rope rope = rope_of(c, ff);
  struct tsr_tensor *out = a->prepare_k(a->ctx, tsr_plugin_host_services(), g, &rope, k, p);
  float *o = malloc(sizeof(float) * c->D * c->Hkv * c->nkv);
  CHECK_OK(out ? run(g, out, o, (size_t)c->D * c->Hkv * c->nkv) : tsr_graph_status(g));
  for (int h = 0; h < c->Hkv; h++)
    for (int j = 0; j < c->nkv; j++)
      memcpy(d->kst + ((size_t)h * c->nkv + j) * c->D, o + ((size_t)j * c->Hkv + h) * c->D,
             sizeof(float) * c->D);
  free(o), free(kin), free(pos);
  tsr_graph_free(g);
}

static struct data data_new(const struct dcase *c, const struct tsr_attention_v1 *a) {
  struct data d = {0};
  const size_t nq = (size_t)c->Hq * c->nq * c->D, nk = (size_t)c->Hkv * c->nkv * c->D;
  const size_t nv = (size_t)c->Hkv * c->nkv * c->Dv;
  d.q = malloc(nq * sizeof(float)), d.k = malloc(nk * sizeof(float));
  d.v = malloc(nv * sizeof(float)), d.kst = malloc(nk * sizeof(float));
  d.kdec = malloc(nk * sizeof(float)), d.vdec = malloc(nv * sizeof(float));
  for (size_t i = 0; i < nq; i++) d.q[i] = tsr_test_normal();
  for (size_t i = 0; i < nk; i++) d.k[i] = tsr_test_normal();
  for (size_t i = 0; i < nv; i++) d.v[i] = tsr_test_normal();
  /* cell order is not position order: a cache after removals and reuse */
  d.kvpos = malloc(sizeof(int32_t) * c->nkv);
  for (int j = 0; j < c->nkv; j++) d.kvpos[j] = j;
  for (int j = c->nkv - 1; j > 0; j--) {
    int i = (int)(tsr_test_next() % (uint64_t)(j + 1)), t = d.kvpos[i];
    d.kvpos[i] = d.kvpos[j], d.kvpos[j] = t;
  }
  d.qpos = malloc(sizeof(int32_t) * c->nq);
  for (int i = 0; i < c->nq; i++) d.qpos[i] = c->nkv - c->nq + i;
  for (int j = 0; j < c->nkv; j++) {
    const int p = d.kvpos[j];
    bool gone = c->holes && p % c->holes == 1;
    gone |= p >= c->hole_lo && p < c->hole_hi;
    bool is_query = false; /* a query's own key is always there */
    for (int i = 0; i < c->nq; i++) is_query |= d.qpos[i] == p;
    if (gone && !is_query) d.kvpos[j] = -1;
  }
  if (c->mask) {
    d.mask = malloc(sizeof(float) * c->nq * c->nkv);
    for (int i = 0; i < c->nq * c->nkv; i++) d.mask[i] = tsr_test_uniform(0, 1) < 0.3f ? -INFINITY : 0;
  }
  if (c->ff) {
    d.ff = malloc(sizeof(float) * c->n_rot / 2);
    for (int i = 0; i < c->n_rot / 2; i++) d.ff[i] = i % 3 ? 1.0f : 1e30f; /* gemma4's rule */
  }
  prepare_keys(c, &d, a);
  d.kenc = encode(c->kdt, d.kst, (size_t)c->Hkv * c->nkv, c->D, d.kdec);
  d.venc = encode(c->vdt, d.v, (size_t)c->Hkv * c->nkv, c->Dv, d.vdec);
  return d;
}

static void data_free(struct data *d) {
  free(d->q), free(d->k), free(d->v), free(d->qpos), free(d->kvpos), free(d->mask), free(d->ff);
  free(d->kst), free(d->kenc), free(d->venc), free(d->kdec), free(d->vdec);
}

/* Attention over the encoded cache for queries [i0, i0+n) with q rotated by
** the implementation (dca) or, for flash, rotated here at q_pos first. kv_pos
** may hide the cells past the last query (decode). out [n][Hq][Dv]. */
static tsr_status attend(const struct dcase *c, const struct data *d,
                         const struct tsr_attention_v1 *a, int i0, int n, const int32_t *kvpos,
                         float *out) {
  struct tsr_graph *g = tsr_graph_new(64);
  float *qs = malloc(sizeof(float) * c->D * c->Hq * n);
  for (int h = 0; h < c->Hq; h++)
    for (int i = 0; i < n; i++)
      memcpy(qs + ((size_t)i * c->Hq + h) * c->D, d->q + ((size_t)h * c->nq + i0 + i) * c->D,
             sizeof(float) * c->D);
  struct tsr_tensor *q = tsr_new_external(g, TSR_F32, 3, (int64_t[]){c->D, c->Hq, n}, qs);
  struct tsr_tensor *qp = tsr_new_external(g, TSR_I32, 1, (int64_t[]){n}, d->qpos + i0);
  struct tsr_tensor *ff =
      d->ff ? tsr_new_external(g, TSR_F32, 1, (int64_t[]){c->n_rot / 2}, d->ff) : NULL;
  struct tsr_attn_rope rope = rope_of(c, ff);
  if (!a->rotates) q = tsr_plugin_host_services()->graph->rope_apply(g, &rope, q, qp);
  struct tsr_layer_desc desc = {.struct_size = sizeof desc, .kind = TSR_LAYER_FULL,
                                .n_head = c->Hq, .n_head_kv = c->Hkv, .head_dim_k = c->D,
                                .head_dim_v = c->Dv, .backend = g_backend};
  struct tsr_attn_call call = {
      .struct_size = sizeof call, .layer = &desc, .q = tsr_permute(g, q, 0, 2, 1, 3),
      .k = tsr_new_external(g, c->kdt, 3, (int64_t[]){c->D, c->nkv, c->Hkv}, d->kenc),
      .v = tsr_new_external(g, c->vdt, 3, (int64_t[]){c->Dv, c->nkv, c->Hkv}, d->venc),
      .q_pos = qp, .kv_pos = tsr_new_external(g, TSR_I32, 1, (int64_t[]){c->nkv}, (void *)kvpos),
      .mask = d->mask ? tsr_new_external(g, TSR_F32, 2, (int64_t[]){c->nkv, n},
                                         d->mask + (size_t)i0 * c->nkv)
                      : NULL,
      .scale = 1.0f / sqrtf((float)c->D), .softcap = c->softcap, .causal = true,
      .rope = &rope};
  struct tsr_tensor *o = a->build(a->ctx, tsr_plugin_host_services(), g, &call);
  tsr_status st = o ? run(g, o, out, (size_t)n * c->Hq * c->Dv) : tsr_graph_status(g);
  free(qs);
  tsr_graph_free(g);
  return st;
}

/* ---- the reference ---------------------------------------------------------------- */

static void rotate_double(const struct dcase *c, const float *ff, const float *x, double pos,
                          double *y) {
  for (int i = 0; i < c->D; i++) y[i] = x[i];
  const int half = c->n_rot / 2;
  for (int i = 0; i < half; i++) {
    double theta = pos * pow(10000.0, -2.0 * i / c->n_rot);
    if (ff) theta /= ff[i];
    const int a = c->neox ? i : 2 * i, b = c->neox ? i + half : 2 * i + 1;
    const double x0 = x[a], x1 = x[b];
    y[a] = x0 * cos(theta) - x1 * sin(theta);
    y[b] = x0 * sin(theta) + x1 * cos(theta);
  }
}

/* Three attentions (one per band, each a plain softmax over its keys with q
** rotated at the band's position), merged by log-sum-exp. ref [nq][Hq][Dv]. */
static void reference(const struct dcase *c, const struct data *d, double *ref) {
  const int C = c->cs - c->ls, group = c->Hq / c->Hkv;
  double *qr = malloc(sizeof(double) * c->D), *lg = malloc(sizeof(double) * c->nkv);
  double *ob = malloc(sizeof(double) * 3 * c->Dv);
  for (int i = 0; i < c->nq; i++) {
    const int p = d->qpos[i], n = p / C, r = p % C;
    const int qpos_b[3] = {r, r + C < c->cs ? r + C : c->cs, 2 * C - 1 < c->cs ? 2 * C - 1 : c->cs};
    double gain = 1.0;
    if (c->yarn && p + 1 > 16) {
      const double f = 0.1 * log((p + 1.0) / 16.0) + 1.0;
      gain = f * f;
    }
    for (int h = 0; h < c->Hq; h++) {
      const int hk = h / group;
      double lse[3];
      for (int b = 0; b < 3; b++) {
        rotate_double(c, d->ff, d->q + ((size_t)h * c->nq + i) * c->D, qpos_b[b], qr);
        double m = -INFINITY;
        for (int j = 0; j < c->nkv; j++) {
          const int kp = d->kvpos[j];
          const int band = kp >= n * C ? 0 : kp >= (n - 1) * C ? 1 : 2;
          const bool mask_hidden = d->mask && d->mask[(size_t)i * c->nkv + j] == -INFINITY;
          lg[j] = -INFINITY;
          if (kp < 0 || kp > p || band != b || mask_hidden) continue;
          const float *kr = d->kdec + ((size_t)hk * c->nkv + j) * c->D;
          double x = 0;
          for (int e = 0; e < c->D; e++) x += qr[e] * kr[e];
          x *= gain / sqrt((double)c->D);
          if (c->softcap > 0) x = c->softcap * tanh(x / c->softcap);
          lg[j] = x;
          if (x > m) m = x;
        }
        double *o = ob + (size_t)b * c->Dv, sum = 0;
        for (int e = 0; e < c->Dv; e++) o[e] = 0;
        lse[b] = -INFINITY;
        if (m == -INFINITY) continue; /* an empty band */
        for (int j = 0; j < c->nkv; j++) {
          if (lg[j] == -INFINITY) continue;
          const double w = exp(lg[j] - m);
          sum += w;
          const float *vr = d->vdec + ((size_t)hk * c->nkv + j) * c->Dv;
          for (int e = 0; e < c->Dv; e++) o[e] += w * vr[e];
        }
        for (int e = 0; e < c->Dv; e++) o[e] /= sum;
        lse[b] = m + log(sum);
      }
      double mm = -INFINITY, wsum = 0;
      for (int b = 0; b < 3; b++) mm = lse[b] > mm ? lse[b] : mm;
      double *out = ref + ((size_t)i * c->Hq + h) * c->Dv;
      for (int e = 0; e < c->Dv; e++) out[e] = 0;
      if (mm == -INFINITY) continue; /* no key at all: zeros */
      for (int b = 0; b < 3; b++) {
        if (lse[b] == -INFINITY) continue;
        const double w = exp(lse[b] - mm);
        wsum += w;
        for (int e = 0; e < c->Dv; e++) out[e] += w * ob[(size_t)b * c->Dv + e];
      }
      for (int e = 0; e < c->Dv; e++) out[e] /= wsum;
    }
  }
  free(qr), free(lg), free(ob);
}

/* max |got - ref| / (1 + |ref|); NaN counts as 1e9 */
static double rel_err(const double *ref, const float *got, size_t n) {
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    const double e = fabs(got[i] - ref[i]) / (1.0 + fabs(ref[i]));
    if (!(e <= worst)) worst = isnan(e) ? 1e9 : e;
  }
  return worst;
}

static double run_case(const struct dcase *c, bool report) {
  const struct tsr_attention_v1 *a = c->yarn ? g_dca_yarn : g_dca;
  struct data d = data_new(c, a);
  const size_t n = (size_t)c->nq * c->Hq * c->Dv;
  float *got = malloc(n * sizeof(float));
  double *ref = malloc(n * sizeof(double));
  tsr_status st = attend(c, &d, a, 0, c->nq, d.kvpos, got);
  CHECK_MSG(st == TSR_OK, "dca: %s", tsr_error_message());
  reference(c, &d, ref);
  const double e = st == TSR_OK ? rel_err(ref, got, n) : 1e9;
  if (report)
    printf("  D %3d/%3d rot %3d H %2d/%d CS %4d LS %3d keys %4d (%2d chunks) q %2d K %-5s V %-5s"
           " %s%s%s: %.2e\n", c->D, c->Dv, c->n_rot, c->Hq, c->Hkv, c->cs, c->ls, c->nkv,
           (c->nkv + c->cs - c->ls - 1) / (c->cs - c->ls), c->nq, tsr_dtype_name(c->kdt),
           tsr_dtype_name(c->vdt), c->mask ? "mask " : "", c->holes ? "holes " : "",
           c->yarn ? "yarn" : "", e);
  free(got), free(ref);
  data_free(&d);
  return e;
}

/* Bound on the relative error of a case: `exact` on the cpu and for cuda's f32
** kernel; cuda sends head dims in steps of 16 to its tensor-core kernel, whose
** f16 operands round to 2^-11 of each value. */
static double tol_of(const struct dcase *c, double exact) {
  const bool mma = !strcmp(g_backend, "cuda") && c->D % 16 == 0 && c->Dv % 16 == 0;
  return mma ? 5e-3 : exact;
}

/* ---- tests -------------------------------------------------------------------- */

static const enum tsr_dtype k_codecs[] = {TSR_F32,  TSR_F16,  TSR_BF16, TSR_Q8_0, TSR_Q6_0,
                                          TSR_Q5_1, TSR_Q5_0, TSR_Q4_1, TSR_Q4_0};
#define N_CODECS (int)(sizeof k_codecs / sizeof k_codecs[0])

static void test_agrees_with_three_band_reference_over_geometries(void) {
  tsr_test_seed(11);
  /* chunk counts 1..64, C not dividing the length, GQA 1..8, head dims 64..512, partial
  ** rotary, normal and NeoX pairing, frequency factors, softcap */
  const struct dcase cases[] = {
      {.D = 64, .Dv = 64, .Hq = 4, .Hkv = 4, .n_rot = 64, .neox = 1, .cs = 40, .ls = 8,
       .nkv = 30, .nq = 6},                                     /* one chunk */
      {.D = 64, .Dv = 64, .Hq = 4, .Hkv = 2, .n_rot = 64, .neox = 1, .cs = 20, .ls = 4,
       .nkv = 50, .nq = 8},                                     /* 4 chunks, C 16 */
      {.D = 128, .Dv = 128, .Hq = 8, .Hkv = 1, .n_rot = 128, .neox = 1, .cs = 13, .ls = 3,
       .nkv = 640, .nq = 3},                                    /* 64 chunks, GQA 8 */
      {.D = 128, .Dv = 128, .Hq = 6, .Hkv = 2, .n_rot = 32, .neox = 1, .cs = 37, .ls = 5,
       .nkv = 201, .nq = 12},                                   /* partial rotary, C 32 */
      {.D = 96, .Dv = 96, .Hq = 4, .Hkv = 4, .n_rot = 64, .neox = 0, .cs = 29, .ls = 0,
       .nkv = 173, .nq = 9},                                    /* GPT-J pairs, LS 0 */
      {.D = 256, .Dv = 256, .Hq = 4, .Hkv = 2, .n_rot = 256, .neox = 1, .cs = 50, .ls = 21,
       .nkv = 230, .nq = 5, .ff = 1},                           /* frequency factors */
      {.D = 512, .Dv = 512, .Hq = 2, .Hkv = 1, .n_rot = 512, .neox = 1, .cs = 48, .ls = 16,
       .nkv = 200, .nq = 3},                                    /* head dim 512 */
      {.D = 64, .Dv = 64, .Hq = 4, .Hkv = 1, .n_rot = 64, .neox = 1, .cs = 24, .ls = 7,
       .nkv = 150, .nq = 20, .mask = 1, .softcap = 5.0f},       /* mask, softcap */
      {.D = 64, .Dv = 64, .Hq = 2, .Hkv = 2, .n_rot = 64, .neox = 1, .cs = 24, .ls = 7,
       .nkv = 150, .nq = 20, .holes = 3, .hole_lo = 40, .hole_hi = 75}, /* removed cells */
      {.D = 64, .Dv = 64, .Hq = 2, .Hkv = 1, .n_rot = 64, .neox = 1, .cs = 24, .ls = 7,
       .nkv = 150, .nq = 10, .yarn = 1},                        /* temperature past 16 */
      {.D = 64, .Dv = 64, .Hq = 4, .Hkv = 2, .n_rot = 64, .neox = 1, .cs = 30, .ls = 20,
       .nkv = 97, .nq = 14},                                    /* LS >= C: inter at 2C-1 */
  };
  double worst = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct dcase c = cases[i];
    c.kdt = c.vdt = TSR_F32;
    const double e = run_case(&c, true);
    worst = e > worst ? e : worst;
    CHECK_MSG(e < tol_of(&c, 2e-5), "case %zu: %.3e", i, e);
  }
  printf("  f32 cache: worst %.2e\n", worst);
}

static void test_agrees_with_reference_for_every_kv_codec(void) {
  tsr_test_seed(12);
  for (int i = 0; i < N_CODECS; i++)
    for (int j = 0; j < N_CODECS; j++) {
      if (i != j && j != (i + 3) % N_CODECS) continue; /* symmetric, plus an asymmetric pair */
      struct dcase c = {.D = 128, .Dv = 128, .Hq = 4, .Hkv = 2, .n_rot = 64, .neox = 1,
                        .cs = 40, .ls = 9, .nkv = 180, .nq = 6, .kdt = k_codecs[i],
                        .vdt = k_codecs[j], .holes = 5};
      const double e = run_case(&c, true);
      if (i == j) g_worst[i] = e;
      CHECK_MSG(e < tol_of(&c, 2e-5), "K %s V %s: %.3e", tsr_dtype_name(c.kdt),
                tsr_dtype_name(c.vdt), e);
    }
}

/* prepare_k stores each key rotated at p mod C */
static void test_keys_are_stored_rotated_at_their_chunk_offset(void) {
  tsr_test_seed(13);
  const struct dcase c = {.D = 64, .Dv = 64, .Hq = 2, .Hkv = 2, .n_rot = 48, .neox = 1,
                          .cs = 20, .ls = 5, .nkv = 100, .nq = 1, .kdt = TSR_F32,
                          .vdt = TSR_F32};
  struct data d = data_new(&c, g_dca);
  double *y = malloc(sizeof(double) * c.D), worst = 0;
  for (int h = 0; h < c.Hkv; h++)
    for (int j = 0; j < c.nkv; j++) {
      const int p = d.kvpos[j] < 0 ? j : d.kvpos[j];
      rotate_double(&c, NULL, d.k + ((size_t)h * c.nkv + j) * c.D, p % 15, y);
      const float *got = d.kst + ((size_t)h * c.nkv + j) * c.D;
      for (int e = 0; e < c.D; e++) worst = fmax(worst, fabs(got[e] - y[e]));
    }
  printf("  prepare_k vs rotation at p mod 15: max abs %.2e\n", worst);
  CHECK(worst < 1e-5);
  free(y);
  data_free(&d);
}

/* n_ctx <= C: only the intra band exists, at true positions */
static void test_one_chunk_is_bit_identical_to_flash(void) {
  tsr_test_seed(14);
  int same = 0, total = 0;
  for (int i = 0; i < N_CODECS; i++) {
    struct dcase c = {.D = 128, .Dv = 128, .Hq = 8, .Hkv = 2, .n_rot = 64 + 64 * (i % 2),
                      .neox = 1, .cs = 200, .ls = 20, .nkv = 180, .nq = 37 + i,
                      .kdt = k_codecs[i], .vdt = k_codecs[(i + 2) % N_CODECS],
                      .mask = i % 3 == 0, .holes = i % 4 == 1 ? 4 : 0};
    struct data d = data_new(&c, g_dca); /* p mod C = p: flash's keys too */
    const size_t n = (size_t)c.nq * c.Hq * c.Dv;
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    CHECK_OK(attend(&c, &d, g_dca, 0, c.nq, d.kvpos, a));
    CHECK_OK(attend(&c, &d, g_flash, 0, c.nq, d.kvpos, b));
    const bool eq = !memcmp(a, b, n * sizeof(float));
    CHECK_MSG(eq, "K %s V %s differs from flash", tsr_dtype_name(c.kdt), tsr_dtype_name(c.vdt));
    same += eq, total++;
    free(a), free(b);
    data_free(&d);
  }
  printf("  bit-identical to flash: %d of %d codec pairs\n", same, total);
}

/* each query alone, the cache holding only what decode would have written */
static double max_rel(const float *got, const float *ref, size_t n) {
  double worst = 0;
  for (size_t e = 0; e < n; e++) {
    const double r = fabs((double)got[e] - ref[e]) / (1.0 + fabs(ref[e]));
    if (!(r <= worst)) worst = isnan(r) ? 1e9 : r;
  }
  return worst;
}

static void test_decode_step_by_step_equals_prefill(void) {
  tsr_test_seed(15);
  const bool cpu = !strcmp(g_backend, "cpu");
  const int codecs[][2] = {{0, 0}, {1, 1}, {3, 8}};
  for (size_t t = 0; t < 3; t++) {
    struct dcase c = {.D = 64, .Dv = 64, .Hq = 4, .Hkv = 2, .n_rot = 64, .neox = 1, .cs = 12,
                      .ls = 3, .nkv = 120, .nq = 120, .kdt = k_codecs[codecs[t][0]],
                      .vdt = k_codecs[codecs[t][1]], .yarn = t == 2};
    const struct tsr_attention_v1 *a = c.yarn ? g_dca_yarn : g_dca;
    struct data d = data_new(&c, a);
    const size_t row = (size_t)c.Hq * c.Dv;
    float *pre = malloc(row * c.nq * sizeof(float)), *one = malloc(row * sizeof(float));
    CHECK_OK(attend(&c, &d, a, 0, c.nq, d.kvpos, pre));
    int32_t *kv = malloc(sizeof(int32_t) * c.nkv);
    int equal = 0;
    for (int i = 0; i < c.nq; i++) {
      for (int j = 0; j < c.nkv; j++) kv[j] = d.kvpos[j] <= d.qpos[i] ? d.kvpos[j] : -1;
      CHECK_OK(attend(&c, &d, a, i, 1, kv, one));
      /* the cpu runs one kernel for both; cuda's tensor-core kernel sums the
      ** prefill's keys in one block and a decode step's over split blocks */
      equal += cpu ? !memcmp(one, pre + (size_t)i * row, row * sizeof(float))
                   : max_rel(one, pre + (size_t)i * row, row) < tol_of(&c, 1e-5);
    }
    char how[32] = "bit-identical";
    if (!cpu) snprintf(how, sizeof how, "within %.0e", tol_of(&c, 1e-5));
    printf("  decode = prefill, K %s V %s%s: %d of %d steps %s (10 chunks)\n",
           tsr_dtype_name(c.kdt), tsr_dtype_name(c.vdt), c.yarn ? " yarn" : "", equal, c.nq, how);
    CHECK(equal == c.nq);
    free(pre), free(one), free(kv);
    data_free(&d);
  }
}

static bool all_finite(const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(x[i])) return false;
  return true;
}

static void test_empty_bands_give_finite_outputs(void) {
  tsr_test_seed(16);
  /* queries at chunk starts (r = 0: intra holds the query alone), the previous
  ** chunk removed (no successive keys), everything but the query removed, and
  ** a mask that hides every key of some rows (those rows must be zeros) */
  const struct dcase cases[] = {
      {.D = 64, .Dv = 64, .Hq = 2, .Hkv = 1, .n_rot = 64, .neox = 1, .cs = 20, .ls = 4,
       .nkv = 65, .nq = 1},                                            /* p = 64 = 4C, r 0 */
      {.D = 64, .Dv = 64, .Hq = 2, .Hkv = 1, .n_rot = 64, .neox = 1, .cs = 20, .ls = 4,
       .nkv = 70, .nq = 6, .hole_lo = 48, .hole_hi = 64},             /* successive empty */
      {.D = 64, .Dv = 64, .Hq = 2, .Hkv = 1, .n_rot = 64, .neox = 1, .cs = 20, .ls = 4,
       .nkv = 70, .nq = 1, .hole_lo = 0, .hole_hi = 69},              /* only the query */
      {.D = 64, .Dv = 64, .Hq = 2, .Hkv = 1, .n_rot = 64, .neox = 1, .cs = 20, .ls = 4,
       .nkv = 40, .nq = 8, .hole_lo = 0, .hole_hi = 16},              /* inter empty */
      {.D = 64, .Dv = 64, .Hq = 2, .Hkv = 1, .n_rot = 64, .neox = 1, .cs = 9, .ls = 8,
       .nkv = 30, .nq = 30, .softcap = 30},                           /* C 1: every key alone */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct dcase c = cases[i];
    c.kdt = TSR_F16, c.vdt = TSR_Q4_0;
    const double e = run_case(&c, true);
    CHECK_MSG(e < tol_of(&c, 2e-5), "case %zu: %.3e", i, e);
  }
  /* rows with no visible key at all, and huge logits */
  struct dcase c = {.D = 64, .Dv = 64, .Hq = 2, .Hkv = 1, .n_rot = 64, .neox = 1, .cs = 20,
                    .ls = 4, .nkv = 90, .nq = 4, .kdt = TSR_F32, .vdt = TSR_F32, .mask = 1};
  struct data d = data_new(&c, g_dca);
  for (int j = 0; j < c.nkv; j++) d.mask[j] = -INFINITY; /* query 0 sees nothing */
  for (size_t i = 0; i < (size_t)c.Hq * c.nq * c.D; i++) d.q[i] *= 1e4f;
  const size_t n = (size_t)c.nq * c.Hq * c.Dv;
  float *out = malloc(n * sizeof(float));
  CHECK_OK(attend(&c, &d, g_dca, 0, c.nq, d.kvpos, out));
  CHECK(all_finite(out, n));
  bool zeros = true;
  for (size_t i = 0; i < (size_t)c.Hq * c.Dv; i++) zeros &= out[i] == 0.0f;
  CHECK_MSG(zeros, "a row without visible keys is zeros");
  free(out);
  data_free(&d);
}

/* shift_k: keys prepared at p, moved by delta, equal keys prepared at p + delta */
static void test_shift_rerotates_each_key_to_its_new_chunk_offset(void) {
  tsr_test_seed(17);
  const struct dcase c = {.D = 64, .Dv = 64, .Hq = 2, .Hkv = 2, .n_rot = 64, .neox = 1,
                          .cs = 20, .ls = 5, .nkv = 90, .nq = 1, .kdt = TSR_F32,
                          .vdt = TSR_F32};
  struct data d = data_new(&c, g_dca);
  const int deltas[] = {-7, -15, -30, -41};
  for (size_t t = 0; t < sizeof deltas / sizeof deltas[0]; t++) {
    const int delta = deltas[t];
    struct tsr_graph *g = tsr_graph_new(64);
    /* stored keys [Hkv][nkv][D] -> [D, Hkv, nkv] for shift_k */
    float *k = malloc(sizeof(float) * c.D * c.Hkv * c.nkv);
    int32_t *pos = malloc(sizeof(int32_t) * c.nkv);
    for (int j = 0; j < c.nkv; j++) {
      pos[j] = d.kvpos[j] < 0 ? j : d.kvpos[j];
      for (int h = 0; h < c.Hkv; h++)
        memcpy(k + ((size_t)j * c.Hkv + h) * c.D, d.kst + ((size_t)h * c.nkv + j) * c.D,
               sizeof(float) * c.D);
    }
    struct tsr_tensor *kt = tsr_new_external(g, TSR_F32, 3, (int64_t[]){c.D, c.Hkv, c.nkv}, k);
    struct tsr_tensor *pt = tsr_new_external(g, TSR_I32, 1, (int64_t[]){c.nkv}, pos);
    struct tsr_attn_rope rope = rope_of(&c, NULL);
    struct tsr_tensor *o =
        g_dca->shift_k(g_dca->ctx, tsr_plugin_host_services(), g, &rope, kt, pt, delta);
    float *got = malloc(sizeof(float) * c.D * c.Hkv * c.nkv);
    CHECK_OK(o ? run(g, o, got, (size_t)c.D * c.Hkv * c.nkv) : tsr_graph_status(g));
    if (delta % 15 == 0) CHECK(o == kt); /* a whole number of chunks: nothing to rotate */
    double worst = 0, *y = malloc(sizeof(double) * c.D);
    for (int j = 0; j < c.nkv; j++) {
      if (pos[j] + delta < 0) continue;
      for (int h = 0; h < c.Hkv; h++) {
        rotate_double(&c, NULL, d.k + ((size_t)h * c.nkv + j) * c.D, (pos[j] + delta) % 15, y);
        const float *r = got + ((size_t)j * c.Hkv + h) * c.D;
        for (int e = 0; e < c.D; e++) worst = fmax(worst, fabs(r[e] - y[e]));
      }
    }
    printf("  shift by %d: max abs %.2e against keys prepared at p %+d\n", delta, worst, delta);
    CHECK(worst < 1e-5);
    free(y), free(got), free(k), free(pos);
    tsr_graph_free(g);
  }
  /* without the keys' positions, a shift that is not whole chunks is refused */
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *kt = tsr_new_tensor(g, TSR_F32, 3, (int64_t[]){c.D, c.Hkv, 4});
  struct tsr_attn_rope rope = rope_of(&c, NULL);
  CHECK(!g_dca->shift_k(g_dca->ctx, tsr_plugin_host_services(), g, &rope, kt, NULL, -7));
  CHECK(tsr_graph_status(g) == TSR_ERR_UNSUPPORTED &&
        strstr(tsr_error_message(), "multiple of 15"));
  tsr_graph_free(g);
  data_free(&d);
}

static void test_refusals_name_what_is_missing(void) {
  struct tsr_layer_desc l = {.struct_size = sizeof l, .layer = 3, .kind = TSR_LAYER_SLIDING,
                             .n_head = 4, .n_head_kv = 2, .head_dim_k = 64, .head_dim_v = 64,
                             .window = 512, .k_codec = "f16", .v_codec = "q4_0",
                             .backend = "cpu"};
  enum tsr_read_path kp, vp;
  CHECK(g_dca->negotiate(g_dca->ctx, &l, &kp, &vp) == TSR_ERR_UNSUPPORTED);
  CHECK(strstr(tsr_error_message(), "sliding: flash"));
  l.kind = TSR_LAYER_FULL, l.window = 0;
  CHECK_OK(g_dca->negotiate(g_dca->ctx, &l, &kp, &vp));
  CHECK(kp == TSR_READ_NATIVE && vp == TSR_READ_IN_REGISTER);
  l.backend = "cuda"; /* the scalar tiers are read in the cuda kernel */
  CHECK_OK(g_dca->negotiate(g_dca->ctx, &l, &kp, &vp));
  CHECK(kp == TSR_READ_NATIVE && vp == TSR_READ_IN_REGISTER);
  l.backend = "metal";
  CHECK(g_dca->negotiate(g_dca->ctx, &l, &kp, &vp) == TSR_ERR_UNSUPPORTED);
  CHECK(strstr(tsr_error_message(), "'metal'"));
  /* an arch that does not describe its RoPE */
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_attn_call call = {.struct_size = sizeof call, .causal = true};
  CHECK(!g_dca->build(g_dca->ctx, tsr_plugin_host_services(), g, &call));
  CHECK(strstr(tsr_error_message(), "describe its RoPE"));
  tsr_graph_free(g);
}

/* prepare_k's graph for four keys of head dim 64 under rope; its status */
static tsr_status prepare_status(const struct tsr_attn_rope *rope) {
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *k = tsr_new_tensor(g, TSR_F32, 3, (int64_t[]){64, 1, 4});
  struct tsr_tensor *p = tsr_new_tensor(g, TSR_I32, 1, (int64_t[]){4});
  struct tsr_tensor *out = g_dca->prepare_k(g_dca->ctx, tsr_plugin_host_services(), g, rope, k, p);
  const tsr_status st = tsr_graph_status(g);
  CHECK((out != NULL) == (st == TSR_OK));
  tsr_graph_free(g);
  return st;
}

/* attn_dca reads the model's dual_chunk_attention keys itself, under the key prefix the
** arch names (struct tsr_attn_rope model and arch) */
static void test_model_keys_are_read_under_the_arch_prefix(void) {
  static const char *const keys[] = {"qwen2.dual_chunk_attention.chunk_size",
                                     "qwen2.dual_chunk_attention.local_size", NULL};
  const uint32_t values[] = {10, 12}; /* local_size past chunk_size */
  struct tsr_gguf *m = model_with(keys, values, NULL);
  struct tsr_attn_rope rope = {.struct_size = sizeof rope, .n_rot = 64, .neox = 1,
                               .freq_base = 10000.0f, .freq_scale = 1.0f, .model = m,
                               .arch = "qwen2"};
  CHECK(prepare_status(&rope) == TSR_ERR_INVALID_ARG);
  CHECK_MSG(strstr(tsr_error_message(), "chunk_size 10 and local_size 12 (from the model)"),
            "%s", tsr_error_message());
  rope.arch = "qwen3"; /* not this file's keys: the defaults */
  CHECK_OK(prepare_status(&rope));
  rope.model = NULL, rope.arch = NULL; /* an arch that names no file: the defaults */
  CHECK_OK(prepare_status(&rope));
  tsr_gguf_close(m);
  /* a key of another type is refused, naming it */
  static const char *const none[] = {NULL};
  m = model_with(none, NULL, "qwen2.dual_chunk_attention.chunk_size");
  rope.model = m, rope.arch = "qwen2";
  CHECK(prepare_status(&rope) == TSR_ERR_FORMAT);
  CHECK_MSG(strstr(tsr_error_message(), "qwen2.dual_chunk_attention.chunk_size is not a u32"),
            "%s", tsr_error_message());
  tsr_gguf_close(m);
}

/* Negotiated for cuda, a decode step's output is a view over rows that hold the kernel's
** split partials (as many splits as an H200 takes); for the cpu alone, the op's own output. */
static void test_cuda_plans_split_rows_past_the_output(void) {
  const int D = 128, Hq = 8, Hkv = 2, nkv = 6000, splits_h200 = 24; /* 6000 keys / 256 */
  struct tsr_layer_desc l = {.struct_size = sizeof l, .layer = 0, .kind = TSR_LAYER_FULL,
                             .n_head = Hq, .n_head_kv = Hkv, .head_dim_k = D, .head_dim_v = D,
                             .k_codec = "f16", .v_codec = "f16"};
  const struct dcase c = {.D = D, .Dv = D, .Hq = Hq, .Hkv = Hkv, .n_rot = D, .neox = 1,
                          .cs = 256, .ls = 32, .nkv = nkv, .nq = 1};
  const struct tsr_attn_rope rope = rope_of(&c, NULL);
  enum tsr_read_path kp, vp;
  struct dca_state *st = g_dca->ctx;
  const int was_on_cuda = st->on_cuda;
  st->on_cuda = 0; /* as a host that has negotiated nothing yet */
  for (int on_cuda = 0; on_cuda <= 1; on_cuda++) { /* cpu first: cuda's mark stays */
    l.backend = on_cuda ? "cuda" : "cpu";
    CHECK_OK(g_dca->negotiate(g_dca->ctx, &l, &kp, &vp));
    struct tsr_graph *g = tsr_graph_new(64);
    struct tsr_layer_desc arch_desc = l; /* an arch's call names no backend */
    arch_desc.backend = NULL;
    struct tsr_attn_call call = {
        .struct_size = sizeof call, .layer = &arch_desc,
        .q = tsr_permute(g, tsr_new_tensor(g, TSR_F32, 3, (int64_t[]){D, Hq, 1}), 0, 2, 1, 3),
        .k = tsr_new_tensor(g, TSR_F16, 3, (int64_t[]){D, nkv, Hkv}),
        .v = tsr_new_tensor(g, TSR_F16, 3, (int64_t[]){D, nkv, Hkv}),
        .q_pos = tsr_new_tensor(g, TSR_I32, 1, (int64_t[]){1}),
        .kv_pos = tsr_new_tensor(g, TSR_I32, 1, (int64_t[]){nkv}),
        .scale = 1.0f, .causal = true, .rope = &rope};
    struct tsr_tensor *o = g_dca->build(g_dca->ctx, tsr_plugin_host_services(), g, &call);
    CHECK(o && o->ne[0] == D && o->ne[1] == Hq && o->ne[2] == 1);
    if (o && on_cuda) {
      CHECK(o->op == TSR_OP_VIEW && o->view_offs == 0);
      const int64_t rows = o->view_src->ne[2] - 1;
      CHECK_MSG(rows * D * Hq >= (int64_t)Hq * splits_h200 * (D + 2), "%lld rows", (long long)rows);
    } else if (o) {
      CHECK(o->op != TSR_OP_VIEW);
    }
    tsr_graph_free(g);
  }
  st->on_cuda = was_on_cuda;
}

/* Every layer rotates at the graph's positions: the positions ops are built once a graph
** (one for the queries' bands, one for the keys), each reading that graph's positions. */
static void test_positions_built_once_a_graph(void) {
  const int D = 64, Hq = 4, Hkv = 2, nkv = 300, layers = 3;
  const struct dcase c = {.D = D, .Dv = D, .Hq = Hq, .Hkv = Hkv, .n_rot = D, .neox = 1,
                          .cs = 128, .ls = 16, .nkv = nkv, .nq = 1};
  const struct tsr_attn_rope rope = rope_of(&c, NULL);
  const struct tsr_host *h = tsr_plugin_host_services();
  const int32_t pos_op = tsr_op_registry_find("attn_dca.positions");
  CHECK(pos_op >= 0);
  for (int round = 0; round < 2; round++) { /* a second graph builds its own */
    struct tsr_graph *g = tsr_graph_new(256);
    struct tsr_tensor *q_pos = tsr_new_tensor(g, TSR_I32, 1, (int64_t[]){1});
    struct tsr_tensor *kv_pos = tsr_new_tensor(g, TSR_I32, 1, (int64_t[]){nkv});
    for (int il = 0; il < layers; il++) {
      struct tsr_tensor *k =
          g_dca->prepare_k(g_dca->ctx, h, g, &rope,
                           tsr_new_tensor(g, TSR_F32, 3, (int64_t[]){D, Hkv, 1}), q_pos);
      struct tsr_attn_call call = {
          .struct_size = sizeof call,
          .q = tsr_permute(g, tsr_new_tensor(g, TSR_F32, 3, (int64_t[]){D, Hq, 1}), 0, 2, 1, 3),
          .k = tsr_new_tensor(g, TSR_F16, 3, (int64_t[]){D, nkv, Hkv}),
          .v = tsr_new_tensor(g, TSR_F16, 3, (int64_t[]){D, nkv, Hkv}),
          .q_pos = q_pos, .kv_pos = kv_pos, .scale = 1.0f, .causal = true, .rope = &rope};
      CHECK(k && g_dca->build(g_dca->ctx, h, g, &call));
    }
    int n_pos = 0;
    for (int i = 0; i < g->n; i++) {
      const struct tsr_tensor *t = &g->tensors[i];
      if (t->op != TSR_OP_CUSTOM || t->op_params[0] != pos_op) continue;
      n_pos++;
      CHECK(t->src[0] == q_pos);
    }
    CHECK_MSG(n_pos == 2, "graph %d: %d positions ops for %d layers", round, n_pos, layers);
    tsr_graph_free(g);
  }
}

/* --backend cuda: the same cases on the cpu backend and the one under test */
static void test_cuda_equals_cpu(void) {
  tsr_test_seed(18);
  const struct dcase cases[] = {
      {.D = 128, .Dv = 128, .Hq = 8, .Hkv = 2, .n_rot = 128, .neox = 1, .cs = 256, .ls = 32,
       .nkv = 2000, .nq = 64, .kdt = TSR_F16, .vdt = TSR_F16},          /* prefill, 9 chunks */
      {.D = 128, .Dv = 128, .Hq = 8, .Hkv = 2, .n_rot = 128, .neox = 1, .cs = 256, .ls = 32,
       .nkv = 6000, .nq = 1, .kdt = TSR_Q8_0, .vdt = TSR_Q4_0, .holes = 7}, /* decode, splits */
      {.D = 512, .Dv = 512, .Hq = 2, .Hkv = 1, .n_rot = 128, .neox = 1, .cs = 300, .ls = 40,
       .nkv = 3000, .nq = 3, .kdt = TSR_BF16, .vdt = TSR_Q8_0, .ff = 1},  /* head dim 512 */
      {.D = 256, .Dv = 256, .Hq = 4, .Hkv = 1, .n_rot = 256, .neox = 1, .cs = 100, .ls = 10,
       .nkv = 700, .nq = 16, .kdt = TSR_Q6_0, .vdt = TSR_Q5_1, .mask = 1, .yarn = 1,
       .softcap = 20.0f},                                               /* mask, yarn, softcap */
      {.D = 64, .Dv = 64, .Hq = 6, .Hkv = 3, .n_rot = 32, .neox = 0, .cs = 50, .ls = 0,
       .nkv = 900, .nq = 40, .kdt = TSR_Q4_0, .vdt = TSR_BF16, .holes = 5}, /* GPT-J, LS 0 */
      {.D = 512, .Dv = 512, .Hq = 8, .Hkv = 1, .n_rot = 128, .neox = 1, .cs = 300, .ls = 40,
       .nkv = 3000, .nq = 16, .kdt = TSR_F16, .vdt = TSR_Q8_0},  /* tensor cores, D 512 */
      {.D = 128, .Dv = 128, .Hq = 4, .Hkv = 4, .n_rot = 128, .neox = 1, .cs = 40, .ls = 8,
       .nkv = 1500, .nq = 100, .kdt = TSR_F16, .vdt = TSR_F16, .mask = 1}, /* bands < a tile */
      {.D = 72, .Dv = 72, .Hq = 4, .Hkv = 2, .n_rot = 72, .neox = 1, .cs = 100, .ls = 10,
       .nkv = 1200, .nq = 24, .kdt = TSR_F16, .vdt = TSR_BF16}, /* head dim 72: f32 kernel */
      {.D = 72, .Dv = 72, .Hq = 4, .Hkv = 2, .n_rot = 72, .neox = 1, .cs = 100, .ls = 10,
       .nkv = 5000, .nq = 1, .kdt = TSR_F16, .vdt = TSR_F16},   /* and its split decode */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const struct dcase *c = &cases[i];
    const struct tsr_attention_v1 *a = c->yarn ? g_dca_yarn : g_dca;
    struct data d = data_new(c, a);
    const size_t n = (size_t)c->nq * c->Hq * c->Dv;
    float *dev = malloc(n * sizeof(float)), *cpu = malloc(n * sizeof(float));
    CHECK_OK(attend(c, &d, a, 0, c->nq, d.kvpos, dev));
    struct tsr_backend *under_test = g_be;
    const char *name = g_backend;
    g_be = g_cpu, g_backend = "cpu";
    CHECK_OK(attend(c, &d, a, 0, c->nq, d.kvpos, cpu));
    g_be = under_test, g_backend = name;
    const double worst = max_rel(dev, cpu, n);
    printf("  %s = cpu: D %d keys %d q %d K %s V %s: max rel %.2e\n", g_backend, c->D, c->nkv,
           c->nq, tsr_dtype_name(c->kdt), tsr_dtype_name(c->vdt), worst);
    CHECK_MSG(worst < tol_of(c, 1e-5), "case %zu: %.3e", i, worst);
    free(dev), free(cpu);
    data_free(&d);
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* --bench: CPU time of DCA against flash over the same f16 cache (32 q heads,
** 8 KV heads, D 128, chunk 1024 - 128), decode (1 query) and a 64-query ubatch. */
static void bench(void) {
  const int lens[] = {4096, 16384};
  for (int li = 0; li < 2; li++)
    for (int nq = 1; nq <= 64; nq += 63) {
      struct dcase c = {.D = 128, .Dv = 128, .Hq = 32, .Hkv = 8, .n_rot = 128, .neox = 1,
                        .cs = 1024, .ls = 128, .nkv = lens[li], .nq = nq, .kdt = TSR_F16,
                        .vdt = TSR_F16};
      struct data d = data_new(&c, g_dca);
      float *out = malloc(sizeof(float) * nq * c.Hq * c.Dv);
      double t[2];
      const struct tsr_attention_v1 *impl[2] = {g_flash, g_dca};
      for (int k = 0; k < 2; k++) {
        const int reps = nq == 1 ? 20 : 3;
        attend(&c, &d, impl[k], 0, nq, d.kvpos, out); /* warm */
        const double t0 = now_s();
        for (int r = 0; r < reps; r++) attend(&c, &d, impl[k], 0, nq, d.kvpos, out);
        t[k] = (now_s() - t0) / reps;
      }
      printf("  %5d keys, %2d queries: flash %8.2f ms, dca %8.2f ms, ratio %.3f\n", c.nkv, nq,
             t[0] * 1e3, t[1] * 1e3, t[1] / t[0]);
      free(out);
      data_free(&d);
    }
}

static void load(struct tsr_plugin_host **h, const struct tsr_attention_v1 **dca,
                 const struct tsr_setting_value *settings, int n) {
  CHECK_OK(tsr_plugin_host_new(h));
  tsr_status st = tsr_plugin_host_load(*h, "attn_dca", NULL, settings, n, NULL);
  CHECK_MSG(st == TSR_OK, "loading attn_dca: %s", tsr_error_message());
  *dca = tsr_plugin_host_attention(*h, "dca", NULL);
}

int main(int argc, char **argv) {
  const struct tsr_setting_value yarn[] = {{"temperature", "yarn", "test"},
                                           {"original_length", "16", "test"}};
  load(&g_host, &g_dca, NULL, 0);
  load(&g_host_yarn, &g_dca_yarn, yarn, 2);
  g_flash = g_host ? tsr_plugin_host_attention(g_host, "flash", NULL) : NULL;
  int a = 1;
  if (a + 1 < argc && !strcmp(argv[a], "--backend")) g_backend = argv[a + 1], a += 2;
  const bool cuda = !strcmp(g_backend, "cuda");
  if (!cuda && strcmp(g_backend, "cpu")) {
    fprintf(stderr, "usage: test_attn_dca_ops [--backend cpu|cuda] [--bench]\n");
    return 2;
  }
  if (!g_dca || !g_dca_yarn || !g_flash || tsr_backend_cpu_new(2, &g_cpu) != TSR_OK ||
      (cuda ? tsr_backend_cuda_new(&g_be) : tsr_backend_cpu_new(2, &g_be)) != TSR_OK) {
    fprintf(stderr, "setup failed: %s\n", tsr_error_message());
    return 1;
  }
  printf("  backend: %s\n", tsr_backend_name(g_be));
  if (a < argc && !strcmp(argv[a], "--bench")) {
    bench();
    return 0;
  }
  TSR_RUN(test_agrees_with_three_band_reference_over_geometries);
  TSR_RUN(test_agrees_with_reference_for_every_kv_codec);
  TSR_RUN(test_keys_are_stored_rotated_at_their_chunk_offset);
  TSR_RUN(test_one_chunk_is_bit_identical_to_flash);
  TSR_RUN(test_decode_step_by_step_equals_prefill);
  TSR_RUN(test_empty_bands_give_finite_outputs);
  TSR_RUN(test_shift_rerotates_each_key_to_its_new_chunk_offset);
  TSR_RUN(test_refusals_name_what_is_missing);
  TSR_RUN(test_model_keys_are_read_under_the_arch_prefix);
  TSR_RUN(test_cuda_plans_split_rows_past_the_output);
  TSR_RUN(test_positions_built_once_a_graph);
  if (cuda) TSR_RUN(test_cuda_equals_cpu);
  printf("  worst relative error per codec (K = V):");
  for (int i = 0; i < N_CODECS; i++) printf(" %s %.1e", tsr_dtype_name(k_codecs[i]), g_worst[i]);
  printf("\n");
  uint64_t served = tsr_plugin_engaged_total(tsr_plugin_host_find_plugin(g_host, "attn_dca"));
  printf("  attn_dca counted %llu\n", (unsigned long long)served);
  CHECK(served > 0);
  for (int i = 0; i < g_n_models; i++) tsr_gguf_close(g_models[i].m);
  tsr_backend_free(g_be);
  tsr_backend_free(g_cpu);
  tsr_plugin_host_free(g_host);
  tsr_plugin_host_free(g_host_yarn);
  return TSR_TEST_EXIT();
}
