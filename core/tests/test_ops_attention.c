/* Built-in attention `flash` on the CPU against a double-precision reference
** that materializes the whole logit matrix and takes a plain softmax. K and V
** of a quantized dtype are compared against the reference on their
** dequantized values, so any error left is the kernel's own. */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "graph/backend.h"
#include "abi/composition.h"
#include "cpu/vec.h"
#include "graph/dtype.h"
#include "graph/graph.h"
#include "harness.h"
#include "tessera/cpu_attn_tile.h"

enum kv_layout {
  KV_DENSE,    /* k [D,Nkv,Hkv] packed */
  KV_CACHE,    /* a window of cells in a cache stored [D,Hkv,cells]: permuted and offset */
  KV_STRIDED0, /* every other element of a wider row: dim 0 is not packed (plain types) */
  KV_CELLS,    /* the first Nkv cells of a cache stored [D,cells,Hkv] */
};

struct attn_case {
  int D, Dv, Nq, Nkv, Hq, Hkv;
  enum tsr_dtype kdt, vdt;
  bool q_permuted; /* q stored [D,Hq,Nq] as a projection writes it, then permuted */
  enum kv_layout layout;
  bool has_mask;
  enum tsr_dtype mask_dt;
  bool positions, causal;
  int window;
  float softcap, scale;
};

/* Logical values, in the order the reference reads them. */
struct attn_data {
  float *q;       /* [Hq][Nq][D] */
  float *k;       /* [Hkv][Nkv][D], as the kernel will decode them */
  float *v;       /* [Hkv][Nkv][Dv] */
  void *kq, *vq;  /* the same rows encoded, for block types (NULL for plain types) */
  float *mask;    /* [Nq][Nkv] or NULL */
  int32_t *qpos;  /* [Nq] or NULL */
  int32_t *kvpos; /* [Nkv] or NULL */
};

static float round_to(enum tsr_dtype dt, float x) {
  return dt == TSR_F16 ? tsr_f16_to_f32(tsr_f32_to_f16(x)) : x;
}

static void store(enum tsr_dtype dt, void *base, size_t i, float x) {
  if (dt == TSR_F16)
    ((uint16_t *)base)[i] = tsr_f32_to_f16(x);
  else if (dt == TSR_BF16)
    ((uint16_t *)base)[i] = tsr_f32_to_bf16(x);
  else
    ((float *)base)[i] = x;
}

static bool is_block(enum tsr_dtype dt) { return tsr_dtype_block_size(dt) > 1; }

/* Random rows through dt's reference encoder and back: x then holds what the
** kernel will read. For block types the encoded rows are returned, since a
** k-quant encoder need not reproduce its own output from the decoded values. */
static void *random_rows(enum tsr_dtype dt, float *x, size_t rows, int n) {
  const size_t rs = tsr_dtype_row_size(dt, n);
  char *enc = malloc(rows * rs);
  for (size_t i = 0; i < rows * (size_t)n; i++) x[i] = tsr_test_normal();
  for (size_t r = 0; r < rows; r++) {
    if (tsr_dtype_from_f32(dt, x + r * n, enc + r * rs, n) != TSR_OK ||
        tsr_dtype_to_f32(dt, enc + r * rs, x + r * n, n) != TSR_OK) {
      fprintf(stderr, "cannot encode %s rows of %d\n", tsr_dtype_name(dt), n);
      exit(1);
    }
  }
  if (is_block(dt)) return enc;
  free(enc);
  return NULL;
}

/* Random data; prefill sits at the end of the keys (q_pos = Nkv - Nq + i). */
static struct attn_data data_new(const struct attn_case *c) {
  struct attn_data d = {0};
  const size_t nq = (size_t)c->Hq * c->Nq * c->D, nk = (size_t)c->Hkv * c->Nkv * c->D;
  const size_t nv = (size_t)c->Hkv * c->Nkv * c->Dv;
  d.q = malloc(nq * sizeof(float));
  d.k = malloc(nk * sizeof(float));
  d.v = malloc(nv * sizeof(float));
  for (size_t i = 0; i < nq; i++) d.q[i] = tsr_test_normal();
  d.kq = random_rows(c->kdt, d.k, nk / c->D, c->D);
  d.vq = random_rows(c->vdt, d.v, nv / c->Dv, c->Dv);
  if (c->has_mask) {
    d.mask = malloc((size_t)c->Nq * c->Nkv * sizeof(float));
    for (size_t i = 0; i < (size_t)c->Nq * c->Nkv; i++) {
      float u = tsr_test_uniform(0.0f, 1.0f);
      d.mask[i] = u < 0.15f ? -INFINITY : round_to(c->mask_dt, -2.0f * u);
    }
  }
  if (c->positions) {
    d.qpos = malloc((size_t)c->Nq * sizeof(int32_t));
    d.kvpos = malloc((size_t)c->Nkv * sizeof(int32_t));
    for (int i = 0; i < c->Nq; i++) d.qpos[i] = c->Nkv - c->Nq + i;
    for (int j = 0; j < c->Nkv; j++) d.kvpos[j] = j;
  }
  return d;
}

static void data_free(struct attn_data *d) {
  free(d->q), free(d->k), free(d->v), free(d->mask), free(d->qpos), free(d->kvpos);
  free(d->kq), free(d->vq);
  memset(d, 0, sizeof *d);
}

/* out [Nq][Hq][Dv], the op's output layout. */
static void reference(const struct attn_case *c, const struct attn_data *d, double *out) {
  double *s = malloc((size_t)c->Nkv * sizeof(double));
  const int group = c->Hq / c->Hkv;
  for (int iq = 0; iq < c->Nq; iq++) {
    for (int h = 0; h < c->Hq; h++) {
      const int hk = h / group;
      const float *q = d->q + ((size_t)h * c->Nq + iq) * c->D;
      double mx = -INFINITY;
      for (int j = 0; j < c->Nkv; j++) {
        const float *k = d->k + ((size_t)hk * c->Nkv + j) * c->D;
        double x = 0;
        for (int e = 0; e < c->D; e++) x += (double)q[e] * k[e];
        x *= c->scale;
        if (c->softcap > 0) x = c->softcap * tanh(x / c->softcap);
        if (d->mask) x += d->mask[(size_t)iq * c->Nkv + j];
        if (d->kvpos) {
          const int32_t qp = d->qpos[iq], kp = d->kvpos[j];
          if (kp < 0 || (c->causal && kp > qp) || (c->window > 0 && qp - kp >= c->window))
            x = -INFINITY;
        }
        s[j] = x;
        if (x > mx) mx = x;
      }
      double *o = out + ((size_t)iq * c->Hq + h) * c->Dv;
      for (int e = 0; e < c->Dv; e++) o[e] = 0;
      if (mx == -INFINITY) continue;
      double sum = 0;
      for (int j = 0; j < c->Nkv; j++) {
        if (s[j] == -INFINITY) continue;
        const double p = exp(s[j] - mx);
        sum += p;
        const float *v = d->v + ((size_t)hk * c->Nkv + j) * c->Dv;
        for (int e = 0; e < c->Dv; e++) o[e] += p * v[e];
      }
      for (int e = 0; e < c->Dv; e++) o[e] /= sum;
    }
  }
  free(s);
}

/* ---- running the op -------------------------------------------------------- */

static struct tsr_backend *backends[5];

static struct tsr_backend *backend(int threads) {
  if (!backends[threads] && tsr_backend_cpu_new(threads, &backends[threads]) != TSR_OK) {
    fprintf(stderr, "cannot start a %d-thread backend: %s\n", threads, tsr_error_message());
    exit(1);
  }
  return backends[threads];
}

/* Lays out K or V (logical [H][N][Dx]) as the layout asks; storage is NaN
** (all bits set, which is NaN in every float and every block scale) outside
** the viewed rows, so reading a byte too far shows up. Block types copy the
** encoded rows; plain types are stored from the values. */
static struct tsr_tensor *make_kv(struct tsr_graph *g, const struct attn_case *c,
                                  enum tsr_dtype dt, int Dx, const float *src, const void *enc,
                                  void **storage) {
  const int N = c->Nkv, H = c->Hkv, cell0 = 3, cells = N + 7;
  const size_t es = tsr_dtype_type_size(dt), rs = tsr_dtype_row_size(dt, Dx);
  int64_t ne[3];
  size_t nb[3], offs = 0, bytes;
  if (c->layout == KV_CACHE) {
    ne[0] = Dx, ne[1] = H, ne[2] = cells;
    nb[0] = es, nb[1] = (size_t)H * rs, nb[2] = rs; /* [Dx, N, H] order */
    offs = (size_t)cell0 * H * rs;
    bytes = rs * H * cells;
  } else if (c->layout == KV_CELLS) {
    ne[0] = Dx, ne[1] = cells, ne[2] = H;
    nb[0] = es, nb[1] = rs, nb[2] = (size_t)cells * rs;
    bytes = rs * H * cells;
  } else if (c->layout == KV_STRIDED0) {
    ne[0] = 2 * Dx, ne[1] = N, ne[2] = H;
    nb[0] = 2 * es, nb[1] = 2 * rs, nb[2] = 2 * rs * N;
    bytes = 2 * rs * N * H;
  } else {
    ne[0] = Dx, ne[1] = N, ne[2] = H;
    bytes = rs * N * H;
  }
  char *buf = *storage = malloc(bytes);
  memset(buf, 0xff, bytes);
  for (int h = 0; h < H; h++)
    for (int j = 0; j < N; j++) {
      const size_t r = (size_t)h * N + j;
      size_t at; /* byte offset of the row in storage */
      if (c->layout == KV_CACHE)
        at = (((size_t)cell0 + j) * H + h) * rs;
      else if (c->layout == KV_CELLS)
        at = ((size_t)h * cells + j) * rs;
      else if (c->layout == KV_STRIDED0)
        at = r * 2 * rs;
      else
        at = r * rs;
      if (enc) {
        memcpy(buf + at, (const char *)enc + r * rs, rs);
        continue;
      }
      const size_t step = c->layout == KV_STRIDED0 ? 2 : 1;
      for (int e = 0; e < Dx; e++) store(dt, buf + at, step * (size_t)e, src[r * Dx + e]);
    }
  struct tsr_tensor *t = tsr_new_external(g, dt, 3, ne, buf);
  if (c->layout == KV_DENSE) return t;
  return tsr_view(g, t, 3, (int64_t[]){Dx, N, H}, nb, offs);
}

/* Runs the op on `threads` threads, with decode parameters dp (NULL: none); out
** [Nq][Hq][Dv]. */
static tsr_status run_flash_with(const struct attn_case *c, const struct attn_data *d,
                                 int threads, float *out, const struct tsr_decode_params *dp) {
  struct tsr_graph *g = tsr_graph_new(32);
  const size_t nq = (size_t)c->Hq * c->Nq * c->D;
  float *qs = malloc(nq * sizeof(float));
  void *ks = NULL, *vs = NULL, *ms = NULL, *arena = NULL;
  struct tsr_tensor *q;
  if (c->q_permuted) {
    for (int h = 0; h < c->Hq; h++)
      for (int i = 0; i < c->Nq; i++)
        memcpy(qs + ((size_t)i * c->Hq + h) * c->D, d->q + ((size_t)h * c->Nq + i) * c->D,
               (size_t)c->D * sizeof(float));
    q = tsr_new_external(g, TSR_F32, 3, (int64_t[]){c->D, c->Hq, c->Nq}, qs);
    q = tsr_permute(g, q, 0, 2, 1, 3);
  } else {
    memcpy(qs, d->q, nq * sizeof(float));
    q = tsr_new_external(g, TSR_F32, 3, (int64_t[]){c->D, c->Nq, c->Hq}, qs);
  }
  struct tsr_tensor *k = make_kv(g, c, c->kdt, c->D, d->k, d->kq, &ks);
  struct tsr_tensor *v = make_kv(g, c, c->vdt, c->Dv, d->v, d->vq, &vs);
  struct tsr_tensor *mask = NULL, *qp = NULL, *kp = NULL;
  if (d->mask) {
    const size_t n = (size_t)c->Nq * c->Nkv;
    ms = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) store(c->mask_dt, ms, i, d->mask[i]);
    mask = tsr_new_external(g, c->mask_dt, 2, (int64_t[]){c->Nkv, c->Nq}, ms);
  }
  if (d->qpos) {
    qp = tsr_new_external(g, TSR_I32, 1, (int64_t[]){c->Nq}, d->qpos);
    kp = tsr_new_external(g, TSR_I32, 1, (int64_t[]){c->Nkv}, d->kvpos);
  }
  const struct tsr_attn_params p = {.scale = c->scale, .softcap = c->softcap,
                                    .causal = c->causal, .window = c->window, .decode = dp};
  struct tsr_tensor *o = tsr_flash_attn(g, q, k, v, mask, qp, kp, &p);
  tsr_graph_mark_output(o);
  struct tsr_graph_plan plan;
  tsr_status st = tsr_graph_status(g);
  if (st == TSR_OK) st = tsr_graph_alloc(g, &plan, &arena);
  if (st == TSR_OK) st = tsr_backend_compute(backend(threads), g);
  if (st == TSR_OK)
    memcpy(out, o->data, (size_t)c->Nq * c->Hq * c->Dv * sizeof(float));
  free(arena), free(qs), free(ks), free(vs), free(ms);
  tsr_graph_free(g);
  return st;
}

static tsr_status run_flash(const struct attn_case *c, const struct attn_data *d, int threads,
                            float *out) {
  return run_flash_with(c, d, threads, out, NULL);
}

/* Number of outputs off the reference by more than tol * (1 + |ref|); with
** report, the worst is printed. NaN counts as off. */
static int count_off(const struct attn_case *c, const double *ref, const float *got,
                     double tol, bool report) {
  const size_t n = (size_t)c->Nq * c->Hq * c->Dv;
  int bad = 0;
  size_t worst = 0;
  double worst_err = -1;
  for (size_t i = 0; i < n; i++) {
    const double err = fabs(got[i] - ref[i]) / (1.0 + fabs(ref[i]));
    if (!(err <= tol)) bad++;
    if (!(err <= worst_err)) worst_err = err, worst = i;
  }
  if (bad && report)
    fprintf(stderr, "  D=%d Dv=%d Nq=%d Nkv=%d Hq=%d Hkv=%d K %s V %s: %d off, worst [%zu] "
            "%.9g vs %.9g\n", c->D, c->Dv, c->Nq, c->Nkv, c->Hq, c->Hkv, tsr_dtype_name(c->kdt),
            tsr_dtype_name(c->vdt), bad, worst, got[worst], ref[worst]);
  return bad;
}

/* Runs a case on 1 and 2 threads and checks both against the reference. */
static void check_against_reference(const struct attn_case *c, const struct attn_data *d,
                                    double tol) {
  const size_t n = (size_t)c->Nq * c->Hq * c->Dv;
  double *ref = malloc(n * sizeof(double));
  float *got = malloc(n * sizeof(float));
  reference(c, d, ref);
  for (int threads = 1; threads <= 2; threads++) {
    memset(got, 0xff, n * sizeof(float)); /* NaN until written */
    CHECK_OK(run_flash(c, d, threads, got));
    CHECK_MSG(count_off(c, ref, got, tol, true) == 0, "%d thread(s)", threads);
  }
  free(ref), free(got);
}

static void check_random_case(const struct attn_case *c, double tol) {
  struct attn_data d = data_new(c);
  check_against_reference(c, &d, tol);
  data_free(&d);
}

#define TOL 1e-5

static struct attn_case plain(int D, int Nq, int Nkv, int Hq, int Hkv, enum tsr_dtype kv) {
  return (struct attn_case){.D = D, .Dv = D, .Nq = Nq, .Nkv = Nkv, .Hq = Hq, .Hkv = Hkv,
                            .kdt = kv, .vdt = kv, .scale = 1.0f / sqrtf((float)D)};
}

/* ---- tests ----------------------------------------------------------------- */

static void test_matches_reference_across_shapes_and_gqa(void) {
  tsr_test_seed(11);
  const struct attn_case cases[] = {
      plain(64, 1, 1, 1, 1, TSR_F32),     plain(64, 1, 300, 4, 1, TSR_F32),
      plain(128, 1, 257, 8, 2, TSR_F16),  plain(128, 9, 64, 4, 4, TSR_F32),
      plain(256, 5, 65, 2, 1, TSR_F16),   plain(256, 1, 129, 4, 2, TSR_F32),
      plain(80, 7, 100, 6, 3, TSR_F32),   plain(80, 3, 31, 2, 2, TSR_F16),
      plain(64, 33, 200, 4, 2, TSR_F16),
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_random_case(&cases[i], TOL);
  /* V narrower than K */
  struct attn_case c = plain(128, 4, 90, 4, 2, TSR_F32);
  c.Dv = 64;
  check_random_case(&c, TOL);
}

static void test_permuted_q_and_kv_viewed_from_a_cache(void) {
  tsr_test_seed(12);
  for (int f16 = 0; f16 < 2; f16++) {
    struct attn_case c = plain(128, 6, 150, 8, 2, f16 ? TSR_F16 : TSR_F32);
    c.q_permuted = true;
    c.layout = KV_CACHE;
    check_random_case(&c, TOL);
    c = plain(64, 1, 77, 4, 4, f16 ? TSR_F16 : TSR_F32);
    c.q_permuted = true;
    c.layout = KV_CACHE;
    check_random_case(&c, TOL);
  }
}

static void test_kv_with_strided_dim0_is_gathered(void) {
  tsr_test_seed(13);
  for (int f16 = 0; f16 < 2; f16++) {
    struct attn_case c = plain(80, 3, 70, 4, 2, f16 ? TSR_F16 : TSR_F32);
    c.layout = KV_STRIDED0;
    check_random_case(&c, TOL);
  }
}

static void test_causal_prefill_with_positions(void) {
  tsr_test_seed(14);
  for (int f16 = 0; f16 < 2; f16++) {
    struct attn_case c = plain(64, 40, 140, 4, 2, f16 ? TSR_F16 : TSR_F32);
    c.positions = c.causal = true;
    check_random_case(&c, TOL);
  }
  /* a fresh prompt: Nq == Nkv, row 0 sees one key */
  struct attn_case c = plain(128, 70, 70, 2, 1, TSR_F32);
  c.positions = c.causal = true;
  check_random_case(&c, TOL);
}

/* Prefill over f16 K and V takes a block of queries a unit (each K and V row converted once
** for them, a few keys' dots together, V sums in registers): every query's output equals
** that query run alone bit for bit, with a mask, a window, softcap and a last block of fewer
** queries, over head dims that take the vector paths (multiples of 32) and one that does not
** (80), GQA groups of 1, 2 and 4, and 1 and 2 threads */
static void check_queries_together_equal_each_alone(int D, int Dv, int Nq, int Hq, int Hkv,
                                                    int threads) {
  struct attn_case c = plain(D, Nq, 150, Hq, Hkv, TSR_F16);
  c.Dv = Dv;
  c.positions = c.causal = c.has_mask = true;
  c.mask_dt = TSR_F32;
  c.window = 120;
  c.softcap = 30.0f;
  struct attn_data d = data_new(&c);
  const size_t per_q = (size_t)c.Hq * c.Dv;
  float *all = malloc(c.Nq * per_q * sizeof(float)), *one = malloc(per_q * sizeof(float));
  float *q1 = malloc((size_t)c.Hq * c.D * sizeof(float));
  CHECK_OK(run_flash(&c, &d, threads, all));
  struct attn_case c1 = c;
  c1.Nq = 1;
  for (int i = 0; i < c.Nq; i++) {
    struct attn_data d1 = d;
    for (int h = 0; h < c.Hq; h++)
      memcpy(q1 + (size_t)h * c.D, d.q + ((size_t)h * c.Nq + i) * c.D, c.D * sizeof(float));
    d1.q = q1, d1.qpos = d.qpos + i, d1.mask = d.mask + (size_t)i * c.Nkv;
    CHECK_OK(run_flash(&c1, &d1, 1, one));
    CHECK_MSG(!memcmp(one, all + i * per_q, per_q * sizeof(float)),
              "D %d Dv %d, %d/%d heads, %d threads: query %d alone differs from the batch of %d",
              D, Dv, Hq, Hkv, threads, i, c.Nq);
  }
  free(all), free(one), free(q1);
  data_free(&d);
}

static void test_f16_queries_together_equal_each_alone(void) {
  tsr_test_seed(19);
  check_queries_together_equal_each_alone(128, 128, 7, 4, 2, 2);
  check_queries_together_equal_each_alone(64, 64, 37, 2, 2, 2);   /* several blocks */
  check_queries_together_equal_each_alone(256, 128, 21, 8, 2, 1); /* group 4 */
  check_queries_together_equal_each_alone(80, 80, 9, 2, 1, 2);    /* dims past the vectors */
}

/* The vector runs the prefill block uses give each of their items the bits of the single
** call: dots of 1-3 keys against a row, and a run of multiply-adds skipping zero weights */
static void test_vector_runs_equal_single_calls(void) {
  tsr_test_seed(23);
  enum { NT = 7, MAXN = 264 };
  static const int64_t lens[] = {32, 64, 96, 128, 256, 8, 40, 72, 20};
  float x[NT][MAXN], y[MAXN], a[NT], acc1[MAXN], acc2[MAXN];
  for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
    const int64_t n = lens[li];
    for (int t = 0; t < NT; t++)
      for (int64_t i = 0; i < n; i++) x[t][i] = (float)tsr_test_normal();
    for (int64_t i = 0; i < n; i++) y[i] = (float)tsr_test_normal();
    for (int nk = 1; nk <= TSR_VEC_DOTS_MAX; nk++) {
      const float *keys[TSR_VEC_DOTS_MAX];
      float got[TSR_VEC_DOTS_MAX];
      for (int j = 0; j < nk; j++) keys[j] = x[(j * 3 + nk) % NT];
      tsr_vec_dots_f32_as_f16(keys, nk, y, n, got);
      for (int j = 0; j < nk; j++) {
        const float want = tsr_vec_dot_f32_as_f16(keys[j], y, n);
        CHECK_MSG(!memcmp(&got[j], &want, sizeof want), "n %lld, dot %d of %d: %.9g, alone %.9g",
                  (long long)n, j, nk, got[j], want);
      }
    }
    for (int t = 0; t < NT; t++) a[t] = t % 3 == 1 ? 0.0f : (float)tsr_test_normal();
    x[1][0] = INFINITY; /* under a zero weight: never read */
    for (int64_t i = 0; i < n; i++) acc1[i] = acc2[i] = (float)tsr_test_normal();
    tsr_vec_axpy_run_f32(acc1, a, &x[0][0], MAXN, NT, n);
    for (int t = 0; t < NT; t++)
      if (a[t] != 0.0f) tsr_vec_axpy_f32(acc2, a[t], x[t], n);
    CHECK_MSG(!memcmp(acc1, acc2, (size_t)n * sizeof(float)), "n %lld: the run differs from its "
              "calls", (long long)n);
  }
}

/* The tile's max in eight running maxima is the one-chain max: any length, -inf for hidden
** keys, NaN never taken, either zero */
static void test_tile_max_equals_one_chain(void) {
  tsr_test_seed(29);
  float x[TSR_CPU_ATTN_TILE];
  for (int trial = 0; trial < 400; trial++) {
    const int64_t n = trial % (TSR_CPU_ATTN_TILE + 1);
    for (int64_t t = 0; t < n; t++) {
      const int kind = (int)(tsr_test_normal() * 4.0);
      x[t] = kind == 1 ? -INFINITY : kind == 2 ? NAN : kind == 3 ? -0.0f : (float)tsr_test_normal();
    }
    if (trial % 7 == 0)
      for (int64_t t = 0; t < n; t++) x[t] = -INFINITY;
    float want = -INFINITY;
    for (int64_t t = 0; t < n; t++) want = x[t] > want ? x[t] : want;
    const float got = tsr_cpu_attn_tile_max(x, n);
    CHECK_MSG(got == want, "n %lld: %.9g, one chain %.9g", (long long)n, got, want);
  }
}

/* The softmax weights' exp and sum: the vector path gives the portable path's bits (any
** length, -inf keys, NaN, both ends of the range), each weight within 3 ulp of expf and
** the sum within 1e-6 of the double sum */
static void test_exp_sum_is_portable_and_close_to_expf(void) {
  tsr_test_seed(29);
  enum { MAXN = 70 };
  for (int n = 1; n <= MAXN; n += 3) {
    float x[MAXN], a[MAXN], b[MAXN];
    for (int t = 0; t < n; t++) x[t] = (float)(8.0 * tsr_test_normal());
    x[n / 2] = -INFINITY;
    if (n > 10) x[3] = -100.0f, x[5] = 40.0f, x[7] = -47.0f; /* e^-140 (0), e^0, e^-87 */
    float m = -INFINITY;
    for (int t = 0; t < n; t++) m = x[t] > m ? x[t] : m; /* as the tile's max */
    memcpy(a, x, sizeof x), memcpy(b, x, sizeof x);
    const float sa = tsr_vec_exp_sum_f32(a, n, m), sb = tsr_vec_exp_sum_f32_ref(b, n, m);
    CHECK_MSG(!memcmp(a, b, (size_t)n * sizeof(float)) && !memcmp(&sa, &sb, sizeof sa),
              "n %d: the vector path differs from the portable one", n);
    double exact = 0.0;
    for (int t = 0; t < n; t++) {
      const float want = x[t] == -INFINITY ? 0.0f : expf(x[t] - m);
      exact += want;
      /* a result below the normal range is 0 (expf's would be subnormal) */
      CHECK_MSG(a[t] == want || (want < FLT_MIN && a[t] == 0.0f) ||
                    fabsf(a[t] - want) <= 3.0f * (nextafterf(want, INFINITY) - want),
                "n %d, key %d: exp(%.9g) = %.9g, expf %.9g", n, t, x[t] - m, a[t], want);
    }
    CHECK_MSG(fabs(sa - exact) <= 1e-6 * exact + 1e-30, "n %d: sum %.9g, exact %.9g", n, sa,
              exact);
  }
  /* the same visible keys elsewhere in the tile, among hidden ones: the same sum */
  float at0[20], at5[20];
  for (int t = 0; t < 20; t++) at0[t] = at5[t] = -INFINITY;
  for (int t = 0; t < 11; t++) at0[t] = at5[t + 5] = (float)(-t) * 0.37f;
  const float s0 = tsr_vec_exp_sum_f32(at0, 20, 0.0f), s5 = tsr_vec_exp_sum_f32(at5, 20, 0.0f);
  CHECK_MSG(!memcmp(&s0, &s5, sizeof s0), "the sum moved with the keys: %.9g, %.9g", s0, s5);
  float nan_in[9] = {0, 1, NAN, 2, 3, 4, 5, 6, 7}, nan_ref[9];
  memcpy(nan_ref, nan_in, sizeof nan_in);
  const float s1 = tsr_vec_exp_sum_f32(nan_in, 9, 1.0f);
  const float s2 = tsr_vec_exp_sum_f32_ref(nan_ref, 9, 1.0f);
  CHECK(isnan(s1) && isnan(s2) && isnan(nan_in[2]) && isnan(nan_ref[2]));
}

static void test_sliding_window_hides_old_keys(void) {
  tsr_test_seed(15);
  struct attn_case c = plain(64, 12, 200, 4, 2, TSR_F16);
  c.positions = c.causal = true;
  c.window = 16;
  check_random_case(&c, TOL);
  /* decode with a window, no causal flag: keys newer than q stay visible */
  c = plain(128, 1, 300, 8, 4, TSR_F32);
  c.positions = true;
  c.window = 100;
  struct attn_data d = data_new(&c);
  d.qpos[0] = 250;
  check_against_reference(&c, &d, TOL);
  data_free(&d);
}

static void test_softcap_bounds_logits(void) {
  tsr_test_seed(16);
  for (int f16 = 0; f16 < 2; f16++) {
    /* logits of std ~4 and tails near 15, which a cap of 50 bends by a few
    ** percent; f32 rounding of larger random logits would outgrow TOL */
    struct attn_case c = plain(256, 4, 120, 4, 2, f16 ? TSR_F16 : TSR_F32);
    c.scale = 4.0f / sqrtf(256.0f);
    c.softcap = 50.0f;
    c.positions = c.causal = true;
    check_random_case(&c, TOL);
  }
  /* Logits of +-200 that the cap folds into +-50: integer q and k keep the
  ** dot products exact, so only tanh's rounding separates kernel and
  ** reference. Without the cap the softmax would be nearly one-hot. */
  struct attn_case c = plain(128, 2, 150, 2, 1, TSR_F32);
  c.scale = 1.0f;
  c.softcap = 50.0f;
  struct attn_data d = data_new(&c);
  for (int i = 0; i < c.Hq * c.Nq * c.D; i++) d.q[i] = (float)(int)tsr_test_uniform(-4, 5);
  for (int i = 0; i < c.Hkv * c.Nkv * c.D; i++) d.k[i] = (float)(int)tsr_test_uniform(-4, 5);
  check_against_reference(&c, &d, TOL);
  const size_t n = (size_t)c.Nq * c.Hq * c.Dv;
  double *uncapped = malloc(n * sizeof(double));
  float *got = malloc(n * sizeof(float));
  c.softcap = 0.0f;
  reference(&c, &d, uncapped);
  c.softcap = 50.0f;
  CHECK_OK(run_flash(&c, &d, 1, got));
  CHECK(count_off(&c, uncapped, got, 1e-2, false) > 0); /* the cap changed the answer */
  free(uncapped), free(got);
  data_free(&d);
}

static void test_additive_mask_with_inf_entries(void) {
  tsr_test_seed(17);
  for (int mdt = 0; mdt < 2; mdt++) {
    struct attn_case c = plain(128, 8, 180, 4, 1, mdt ? TSR_F16 : TSR_F32);
    c.has_mask = true;
    c.mask_dt = mdt ? TSR_F16 : TSR_F32;
    check_random_case(&c, TOL);
  }
  /* mask, softcap and positions together */
  struct attn_case c = plain(80, 5, 96, 4, 2, TSR_F32);
  c.has_mask = true, c.mask_dt = TSR_F32;
  c.positions = c.causal = true, c.window = 40;
  c.softcap = 30.0f, c.scale = 0.5f;
  check_random_case(&c, TOL);
}

static void test_negative_kv_pos_marks_empty_cells(void) {
  tsr_test_seed(18);
  struct attn_case c = plain(64, 3, 130, 2, 1, TSR_F32);
  c.positions = c.causal = true;
  struct attn_data d = data_new(&c);
  for (int j = 0; j < c.Nkv; j += 3) d.kvpos[j] = -1;
  check_against_reference(&c, &d, TOL);
  /* the result must not depend on what the empty cells hold */
  const size_t n = (size_t)c.Nq * c.Hq * c.Dv;
  float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
  CHECK_OK(run_flash(&c, &d, 1, a));
  for (int j = 0; j < c.Nkv; j += 3)
    for (int e = 0; e < c.D; e++) d.k[(size_t)j * c.D + e] = 1e4f, d.v[(size_t)j * c.D + e] = 1e4f;
  CHECK_OK(run_flash(&c, &d, 1, b));
  CHECK(memcmp(a, b, n * sizeof(float)) == 0);
  free(a), free(b);
  data_free(&d);
}

static bool all_zero(const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (x[i] != 0.0f || signbit(x[i])) return false;
  return true;
}

static void test_fully_hidden_row_is_exact_zeros(void) {
  tsr_test_seed(19);
  struct attn_case c = plain(64, 4, 150, 4, 2, TSR_F32);
  c.has_mask = true, c.mask_dt = TSR_F16;
  struct attn_data d = data_new(&c);
  for (int j = 0; j < c.Nkv; j++) d.mask[2 * c.Nkv + j] = -INFINITY;
  check_against_reference(&c, &d, TOL);
  const size_t row = (size_t)c.Hq * c.Dv;
  float *out = malloc(row * c.Nq * sizeof(float));
  CHECK_OK(run_flash(&c, &d, 2, out));
  CHECK(all_zero(out + 2 * row, row));
  CHECK(!all_zero(out + 1 * row, row));
  data_free(&d);

  /* causal: a query older than every key */
  c = plain(128, 2, 90, 2, 2, TSR_F16);
  c.positions = c.causal = true;
  d = data_new(&c);
  d.qpos[0] = 10;
  for (int j = 0; j < c.Nkv; j++) d.kvpos[j] = 20 + j;
  CHECK_OK(run_flash(&c, &d, 1, out));
  CHECK(all_zero(out, (size_t)c.Hq * c.Dv));
  CHECK(!all_zero(out + (size_t)c.Hq * c.Dv, (size_t)c.Hq * c.Dv));
  data_free(&d);

  /* an empty cache: every cell marked -1 */
  c = plain(64, 1, 70, 4, 1, TSR_F32);
  c.positions = true;
  d = data_new(&c);
  for (int j = 0; j < c.Nkv; j++) d.kvpos[j] = -1;
  CHECK_OK(run_flash(&c, &d, 2, out));
  CHECK(all_zero(out, (size_t)c.Hq * c.Dv));
  data_free(&d);
  free(out);
}

static void test_only_last_key_visible_returns_its_value(void) {
  tsr_test_seed(20);
  struct attn_case c = plain(64, 2, 150, 2, 1, TSR_F32);
  c.has_mask = true, c.mask_dt = TSR_F32;
  struct attn_data d = data_new(&c);
  for (int i = 0; i < c.Nq * c.Nkv; i++) d.mask[i] = -INFINITY;
  d.mask[c.Nkv - 1] = 0.0f;
  d.mask[2 * c.Nkv - 1] = -3.0f;
  float *out = malloc((size_t)c.Nq * c.Hq * c.Dv * sizeof(float));
  CHECK_OK(run_flash(&c, &d, 2, out));
  const float *vlast = d.v + (size_t)(c.Nkv - 1) * c.Dv;
  int off = 0;
  for (int r = 0; r < c.Nq * c.Hq; r++)
    for (int e = 0; e < c.Dv; e++) off += out[(size_t)r * c.Dv + e] != vlast[e];
  CHECK_MSG(off == 0, "%d outputs differ from V's last row", off);
  free(out);
  data_free(&d);
}

static void test_hidden_keys_before_and_between_visible_ones(void) {
  tsr_test_seed(21);
  struct attn_case c = plain(128, 3, 260, 4, 2, TSR_F16);
  c.has_mask = true, c.mask_dt = TSR_F32;
  struct attn_data d = data_new(&c);
  for (int i = 0; i < c.Nq; i++)
    for (int j = 0; j < c.Nkv; j++) {
      float *m = &d.mask[(size_t)i * c.Nkv + j];
      if (i == 0 && j < 100) *m = -INFINITY;                  /* first tile and a half */
      if (i == 1 && (j / 64) % 2 == 0) *m = -INFINITY;        /* whole tiles alternate */
      if (i == 2 && j % 5 != 0 && j < 250) *m = -INFINITY;    /* scattered */
    }
  check_against_reference(&c, &d, TOL);
  data_free(&d);
}

/* Integer-valued q and k make every logit exact in f32, so the reference is
** exact too even at magnitude 1e4, where exp without a max would overflow
** (or, negated, underflow every term to zero). */
static void test_large_logits_neither_overflow_nor_underflow(void) {
  tsr_test_seed(22);
  for (int sign = -1; sign <= 1; sign += 2) {
    struct attn_case c = plain(64, 3, 200, 2, 1, TSR_F32);
    c.scale = 1.0f;
    struct attn_data d = data_new(&c);
    for (int i = 0; i < c.Hq * c.Nq * c.D; i++)
      d.q[i] = (float)(int)tsr_test_uniform(-30.0f, 31.0f);
    for (int i = 0; i < c.Hkv * c.Nkv * c.D; i++)
      d.k[i] = (float)(int)tsr_test_uniform(-30.0f, 31.0f);
    for (int h = 0; h < c.Hq; h++)
      for (int i = 0; i < c.Nq; i++) d.q[((size_t)h * c.Nq + i) * c.D] = sign * 1000.0f;
    for (int j = 0; j < c.Nkv; j++) d.k[(size_t)j * c.D] = 10.0f + (float)(j / 20);
    check_against_reference(&c, &d, TOL);
    data_free(&d);
  }
}

/* Bitwise equal on 1..4 threads. The decode case has one KV head shared by
** five q heads, so the kernel splits that group to keep threads busy. */
static void test_thread_count_does_not_change_results(void) {
  tsr_test_seed(23);
  struct attn_case cases[2] = {plain(80, 9, 111, 6, 2, TSR_F16), plain(64, 1, 200, 5, 1, TSR_F32)};
  cases[0].positions = cases[0].causal = true;
  for (int i = 0; i < 2; i++) {
    const struct attn_case *c = &cases[i];
    struct attn_data d = data_new(c);
    const size_t n = (size_t)c->Nq * c->Hq * c->Dv;
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    double *ref = malloc(n * sizeof(double));
    reference(c, &d, ref);
    CHECK_OK(run_flash(c, &d, 1, a));
    CHECK(count_off(c, ref, a, TOL, true) == 0);
    for (int threads = 2; threads <= 4; threads++) {
      memset(b, 0xff, n * sizeof(float));
      CHECK_OK(run_flash(c, &d, threads, b));
      CHECK_MSG(memcmp(a, b, n * sizeof(float)) == 0, "case %d, %d threads", i, threads);
    }
    free(a), free(b), free(ref);
    data_free(&d);
  }
}

static bool builder_refuses(int Hq, int Hkv, enum tsr_dtype kdt, enum tsr_dtype vdt,
                            bool positions, int mask_nq, bool causal, int window,
                            const char *msg) {
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *q = tsr_new_tensor_3d(g, TSR_F32, 64, 4, Hq);
  struct tsr_tensor *k = tsr_new_tensor_3d(g, kdt, 64, 32, Hkv);
  struct tsr_tensor *v = tsr_new_tensor_3d(g, vdt, 64, 32, Hkv);
  struct tsr_tensor *m = mask_nq ? tsr_new_tensor_2d(g, TSR_F32, 32, mask_nq) : NULL;
  struct tsr_tensor *qp = positions ? tsr_new_tensor_1d(g, TSR_I32, 4) : NULL;
  struct tsr_tensor *kp = positions ? tsr_new_tensor_1d(g, TSR_I32, 32) : NULL;
  const struct tsr_attn_params p = {.scale = 0.125f, .causal = causal, .window = window};
  struct tsr_tensor *o = tsr_flash_attn(g, q, k, v, m, qp, kp, &p);
  bool refused = o == NULL && tsr_graph_status(g) == TSR_ERR_INVALID_ARG &&
                 strstr(tsr_error_message(), msg) != NULL;
  if (!refused) fprintf(stderr, "  expected '%s', got: %s\n", msg, tsr_error_message());
  tsr_graph_free(g);
  return refused;
}

static void test_builder_rejects_impossible_attention(void) {
  CHECK(builder_refuses(4, 2, TSR_F32, TSR_F32, false, 0, true, 0, "needs positions"));
  CHECK(builder_refuses(4, 2, TSR_F32, TSR_F32, false, 0, false, 8, "needs positions"));
  CHECK(builder_refuses(6, 4, TSR_F32, TSR_F32, true, 0, true, 0, "do not pair"));
  CHECK(builder_refuses(4, 2, TSR_I32, TSR_F16, false, 0, false, 0, "K (unnamed) is i32"));
  CHECK(builder_refuses(4, 2, TSR_F16, TSR_IQ4_NL, false, 0, false, 0, "V (unnamed) is iq4_nl"));
  CHECK(builder_refuses(4, 2, TSR_F32, TSR_F32, false, 3, false, 0, "mask"));
  /* and the same shapes, done right, are accepted */
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *q = tsr_new_tensor_3d(g, TSR_F32, 64, 4, 4);
  struct tsr_tensor *k = tsr_new_tensor_3d(g, TSR_F16, 64, 32, 2);
  struct tsr_tensor *v = tsr_new_tensor_3d(g, TSR_F16, 48, 32, 2);
  struct tsr_tensor *qp = tsr_new_tensor_1d(g, TSR_I32, 4);
  struct tsr_tensor *kp = tsr_new_tensor_1d(g, TSR_I32, 32);
  const struct tsr_attn_params p = {.scale = 0.125f, .softcap = 50.0f, .causal = true,
                                    .window = 16};
  struct tsr_tensor *o = tsr_flash_attn(g, q, k, v, NULL, qp, kp, &p);
  CHECK(o && o->ne[0] == 48 && o->ne[1] == 4 && o->ne[2] == 4);
  tsr_graph_free(g);
}

/* A block row must be whole blocks: head dim 80 is 2.5 blocks of q8_0 and a
** third of a q4_K block. The graph refuses such a block tensor when it is
** made; flash's builder checks again for a tensor whose shape it did not see
** made (faked here by editing one), naming the side, tensor, dtype and dim. */
static void test_builder_refuses_head_dim_not_a_multiple_of_the_block(void) {
  const struct {
    enum tsr_dtype k, v;
    const char *msg;
  } cases[] = {
      {TSR_Q4_K, TSR_F16, "K w_k is q4_K with head dim 80, not whole packed blocks of 256"},
      {TSR_F16, TSR_Q4_K, "V w_v is q4_K with head dim 80"},
      {TSR_Q8_0, TSR_Q8_0, "K w_k is q8_0 with head dim 80, not whole packed blocks of 32"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct tsr_graph *g = tsr_graph_new(16);
    CHECK(tsr_new_tensor_3d(g, cases[i].k == TSR_F16 ? cases[i].v : cases[i].k, 80, 64, 2) ==
          NULL);
    CHECK(tsr_graph_status(g) == TSR_ERR_INVALID_ARG && strstr(tsr_error_message(), "80"));
    tsr_graph_free(g);

    g = tsr_graph_new(16);
    struct tsr_tensor *q = tsr_new_tensor_3d(g, TSR_F32, 80, 1, 4);
    struct tsr_tensor *k = tsr_new_tensor_3d(g, cases[i].k, 256, 64, 2);
    struct tsr_tensor *v = tsr_new_tensor_3d(g, cases[i].v, 256, 64, 2);
    k->ne[0] = v->ne[0] = 80;
    tsr_tensor_set_name(k, "w_k");
    tsr_tensor_set_name(v, "w_v");
    const struct tsr_attn_params p = {.scale = 0.125f};
    CHECK(tsr_flash_attn(g, q, k, v, NULL, NULL, NULL, &p) == NULL);
    CHECK(tsr_graph_status(g) == TSR_ERR_INVALID_ARG);
    CHECK_MSG(strstr(tsr_error_message(), cases[i].msg), "got: %s", tsr_error_message());
    tsr_graph_free(g);
  }
  /* the same dtypes with D = 256 are accepted */
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *q = tsr_new_tensor_3d(g, TSR_F32, 256, 1, 4);
  struct tsr_tensor *k = tsr_new_tensor_3d(g, TSR_Q4_K, 256, 64, 2);
  struct tsr_tensor *v = tsr_new_tensor_3d(g, TSR_Q8_0, 256, 64, 2);
  const struct tsr_attn_params p = {.scale = 0.125f};
  CHECK(tsr_flash_attn(g, q, k, v, NULL, NULL, NULL, &p) != NULL);
  tsr_graph_free(g);
}

/* Negotiation tells, at load, which codecs flash reads itself and which
** head dims their blocks cannot tile. */
static void test_negotiation_reads_block_codecs_in_register(void) {
  struct tsr_plugin_host *h;
  CHECK_OK(tsr_plugin_host_new(&h));
  struct tsr_arch_layer layer = {.kind = TSR_LAYER_FULL, .n_head = 8, .n_head_kv = 2,
                                 .head_dim_k = 128, .head_dim_v = 128};
  struct tsr_composition_request r = {.backend = "cpu", .attention = "flash", .layers = &layer,
                                      .n_layers = 1};
  struct tsr_composition c;
  const char *native[] = {"f32", "f16"}, *in_reg[] = {"bf16", "q8_0", "q5_1", "q5_0", "q4_1",
                                                       "q4_0"};
  for (size_t i = 0; i < 2; i++)
    for (size_t j = 0; j < 6; j++) {
      r.k_codec[TSR_LAYER_FULL] = native[i], r.v_codec[TSR_LAYER_FULL] = in_reg[j];
      CHECK_OK(tsr_compose(h, &r, &c));
      CHECK(c.groups[0].k_path == TSR_READ_NATIVE && c.groups[0].v_path == TSR_READ_IN_REGISTER);
      r.k_codec[TSR_LAYER_FULL] = in_reg[j], r.v_codec[TSR_LAYER_FULL] = in_reg[5 - j];
      CHECK_OK(tsr_compose(h, &r, &c));
      CHECK(c.groups[0].k_path == TSR_READ_IN_REGISTER &&
            c.groups[0].v_path == TSR_READ_IN_REGISTER);
    }
  layer.head_dim_v = 80; /* 2.5 blocks of 32 */
  r.k_codec[TSR_LAYER_FULL] = "f16", r.v_codec[TSR_LAYER_FULL] = "q4_0";
  tsr_status st = tsr_compose(h, &r, &c);
  CHECK(st == TSR_ERR_UNSUPPORTED);
  CHECK_MSG(strstr(tsr_error_message(), "layer 0") &&
                strstr(tsr_error_message(), "V codec q4_0 in whole blocks of 32 values; head "
                                            "dim 80"),
            "got: %s", tsr_error_message());
  r.v_codec[TSR_LAYER_FULL] = "bf16"; /* one value a block: any head dim */
  CHECK_OK(tsr_compose(h, &r, &c));
  tsr_plugin_host_free(h);
}

/* ---- K and V in every scalar codec ----------------------------------------- */

static const enum tsr_dtype g_codecs[] = {
    TSR_F32,  TSR_F16,  TSR_BF16, TSR_Q8_0, TSR_Q5_1, TSR_Q5_0, TSR_Q4_1,
    TSR_Q4_0, TSR_Q2_K, TSR_Q3_K, TSR_Q4_K, TSR_Q5_K, TSR_Q6_K, TSR_Q8_K,
};
#define N_CODECS (sizeof g_codecs / sizeof g_codecs[0])

/* Against the reference on 1 thread, and bit for bit the same on 3. */
static void check_codec_case(const struct attn_case *c) {
  struct attn_data d = data_new(c);
  const size_t n = (size_t)c->Nq * c->Hq * c->Dv;
  double *ref = malloc(n * sizeof(double));
  float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
  reference(c, &d, ref);
  memset(a, 0xff, n * sizeof(float));
  memset(b, 0xff, n * sizeof(float));
  CHECK_OK(run_flash(c, &d, 1, a));
  CHECK_MSG(count_off(c, ref, a, TOL, true) == 0, "K %s V %s", tsr_dtype_name(c->kdt),
            tsr_dtype_name(c->vdt));
  CHECK_OK(run_flash(c, &d, 3, b));
  CHECK_MSG(memcmp(a, b, n * sizeof(float)) == 0, "K %s V %s: 3 threads differ from 1",
            tsr_dtype_name(c->kdt), tsr_dtype_name(c->vdt));
  free(ref), free(a), free(b);
  data_free(&d);
}

static int head_dim_for(enum tsr_dtype k, enum tsr_dtype v) {
  return tsr_dtype_block_size(k) == 256 || tsr_dtype_block_size(v) == 256 ? 256 : 128;
}

/* Decode (one query, a sliding window, cells past the window) and causal
** prefill, both with GQA and the cache read as a view of its first cells. */
static void check_codec_pair(enum tsr_dtype k, enum tsr_dtype v) {
  const int D = head_dim_for(k, v);
  struct attn_case c = plain(D, 1, 230, 8, 2, TSR_F32);
  c.kdt = k, c.vdt = v;
  c.layout = KV_CELLS;
  c.positions = c.causal = true;
  c.window = 150;
  check_codec_case(&c);
  c = plain(D, 20, 140, 6, 2, TSR_F32);
  c.kdt = k, c.vdt = v;
  c.layout = KV_CELLS;
  c.positions = c.causal = true;
  c.window = 100;
  check_codec_case(&c);
}

static void test_every_codec_pair_of_one_type_matches_reference(void) {
  tsr_test_seed(24);
  for (size_t i = 0; i < N_CODECS; i++) check_codec_pair(g_codecs[i], g_codecs[i]);
}

static void test_asymmetric_codec_pairs_match_reference(void) {
  tsr_test_seed(25);
  const enum tsr_dtype pairs[][2] = {
      {TSR_Q8_0, TSR_Q4_0}, {TSR_F16, TSR_Q4_0},  {TSR_Q4_0, TSR_F16},  {TSR_BF16, TSR_Q8_0},
      {TSR_Q8_0, TSR_F32},  {TSR_Q5_1, TSR_Q4_1}, {TSR_Q6_K, TSR_Q8_0}, {TSR_F16, TSR_Q4_K},
  };
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
    check_codec_pair(pairs[i][0], pairs[i][1]);
  /* every codec as K against f16 V, and as V against f16 K */
  for (size_t i = 0; i < N_CODECS; i++) {
    struct attn_case c = plain(head_dim_for(g_codecs[i], TSR_F16), 3, 100, 4, 1, TSR_F16);
    c.kdt = g_codecs[i];
    c.positions = c.causal = true;
    check_codec_case(&c);
    c.kdt = TSR_F16, c.vdt = g_codecs[i];
    c.layout = KV_CACHE;
    check_codec_case(&c);
  }
}

/* q6_0, tessera's own codec, as K and V, beside q8_0 and f16 and against f16:
** the kernel decodes it a tile at a time like any block type. */
static void test_q6_0_kv_matches_reference(void) {
  tsr_test_seed(28);
  const enum tsr_dtype pairs[][2] = {
      {TSR_Q6_0, TSR_Q6_0}, {TSR_Q8_0, TSR_Q6_0}, {TSR_Q6_0, TSR_Q4_0}, {TSR_F16, TSR_Q6_0}};
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
    check_codec_pair(pairs[i][0], pairs[i][1]);
  struct attn_case c = plain(64, 3, 100, 4, 1, TSR_F16);
  c.kdt = TSR_Q6_0;
  c.positions = c.causal = true;
  check_codec_case(&c);
}

/* V narrower than K in another codec, an additive mask, softcap, and a
** permuted q: the decoded-row path goes through every feature. */
static void test_quantized_kv_with_mask_softcap_and_narrow_v(void) {
  tsr_test_seed(26);
  struct attn_case c = plain(128, 5, 170, 4, 2, TSR_F32);
  c.kdt = TSR_Q8_0, c.vdt = TSR_Q4_1;
  c.Dv = 64;
  c.q_permuted = true;
  c.layout = KV_CACHE;
  c.has_mask = true, c.mask_dt = TSR_F16;
  c.softcap = 30.0f;
  check_codec_case(&c);
  /* bf16 through a dim-0-strided view: gathered element by element */
  c = plain(80, 3, 70, 4, 2, TSR_BF16);
  c.layout = KV_STRIDED0;
  check_codec_case(&c);
}

/* A fully hidden row is zeros and empty cells are never decoded into the
** answer, whatever bytes they hold. */
static void test_quantized_cache_with_empty_cells_and_hidden_rows(void) {
  tsr_test_seed(27);
  struct attn_case c = plain(64, 3, 130, 4, 2, TSR_Q4_0);
  c.vdt = TSR_Q8_0;
  c.positions = c.causal = true;
  struct attn_data d = data_new(&c);
  for (int j = 0; j < c.Nkv; j += 3) d.kvpos[j] = -1;
  d.qpos[0] = -5; /* older than every key: a zero row */
  const size_t n = (size_t)c.Nq * c.Hq * c.Dv;
  double *ref = malloc(n * sizeof(double));
  float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
  reference(&c, &d, ref);
  CHECK_OK(run_flash(&c, &d, 1, a));
  CHECK(count_off(&c, ref, a, TOL, true) == 0);
  CHECK(all_zero(a, (size_t)c.Hq * c.Dv));
  /* poison the empty cells' blocks: all bits set decodes to NaN */
  const size_t krs = tsr_dtype_row_size(c.kdt, c.D), vrs = tsr_dtype_row_size(c.vdt, c.Dv);
  for (int h = 0; h < c.Hkv; h++)
    for (int j = 0; j < c.Nkv; j += 3) {
      memset((char *)d.kq + ((size_t)h * c.Nkv + j) * krs, 0xff, krs);
      memset((char *)d.vq + ((size_t)h * c.Nkv + j) * vrs, 0xff, vrs);
    }
  CHECK_OK(run_flash(&c, &d, 2, b));
  CHECK(memcmp(a, b, n * sizeof(float)) == 0);
  free(ref), free(a), free(b);
  data_free(&d);
}


/* ---- V skipping on decode steps (struct tsr_decode_params) -------------------- */

/* The reference with the kernel's skipping rule, in double: per query and KV head, tiles
** of TSR_CPU_ATTN_TILE keys; the running max moves over a tile's logits first, then a
** visible key none of whose group's weights exp(s - m) reaches dp->v_skip_threshold (with
** a mass budget: none of whose rows' final shares exp(s - M) / L reach budget / visible
** keys, and with both, both) and no guard keeps (position below sink, within recent of
** the query) has its V row skipped. The sum l keeps every weight. Counts as struct
** tsr_decode_counters does; *mass gets the skipped rows' share of each row's softmax,
** summed over rows, *worst the largest one row dropped. */
static void reference_skip(const struct attn_case *c, const struct attn_data *d,
                           const struct tsr_decode_params *dp, double *out,
                           struct tsr_decode_counters *n, double *mass, double *worst) {
  const int group = c->Hq / c->Hkv, T = TSR_CPU_ATTN_TILE;
  double *s = malloc((size_t)group * c->Nkv * sizeof(double));
  double *m = malloc((size_t)group * sizeof(double)), *l = malloc((size_t)group * sizeof(double));
  double *drop = malloc((size_t)group * sizeof(double));
  double *cut = malloc((size_t)group * sizeof(double)); /* a budget's bar on s - M */
  memset(n, 0, sizeof *n);
  *mass = 0, *worst = 0;
  for (int iq = 0; iq < c->Nq; iq++)
    for (int hk = 0; hk < c->Hkv; hk++) {
      const int32_t qp = d->qpos[iq];
      for (int g = 0; g < group; g++) {
        const float *q = d->q + ((size_t)(hk * group + g) * c->Nq + iq) * c->D;
        for (int j = 0; j < c->Nkv; j++) {
          const float *k = d->k + ((size_t)hk * c->Nkv + j) * c->D;
          double x = 0;
          for (int e = 0; e < c->D; e++) x += (double)q[e] * k[e];
          const int32_t kp = d->kvpos[j];
          s[(size_t)g * c->Nkv + j] = kp < 0 || kp > qp ? -INFINITY : x * c->scale;
        }
        m[g] = -INFINITY, l[g] = 0, drop[g] = 0;
        double *o = out + ((size_t)iq * c->Hq + hk * group + g) * c->Dv;
        for (int e = 0; e < c->Dv; e++) o[e] = 0;
      }
      if (dp->v_skip_budget > 0) { /* each row's final max and sum over the visible keys */
        int visible = 0;
        for (int j = 0; j < c->Nkv; j++) visible += s[j] != -INFINITY;
        for (int g = 0; g < group; g++) {
          double M = -INFINITY, L = 0;
          for (int j = 0; j < c->Nkv; j++) M = fmax(M, s[(size_t)g * c->Nkv + j]);
          for (int j = 0; M != -INFINITY && j < c->Nkv; j++)
            L += s[(size_t)g * c->Nkv + j] == -INFINITY ? 0 : exp(s[(size_t)g * c->Nkv + j] - M);
          cut[g] = M == -INFINITY ? -INFINITY : M + log(L * dp->v_skip_budget / visible);
        }
      }
      for (int j0 = 0; j0 < c->Nkv; j0 += T) {
        const int nt = c->Nkv - j0 < T ? c->Nkv - j0 : T;
        for (int g = 0; g < group; g++) {
          double tmax = -INFINITY;
          for (int t = 0; t < nt; t++) tmax = fmax(tmax, s[(size_t)g * c->Nkv + j0 + t]);
          if (tmax > m[g]) {
            const double f = m[g] == -INFINITY ? 0 : exp(m[g] - tmax);
            double *o = out + ((size_t)iq * c->Hq + hk * group + g) * c->Dv;
            for (int e = 0; e < c->Dv; e++) o[e] *= f;
            l[g] *= f, drop[g] *= f, m[g] = tmax;
          }
        }
        for (int t = 0; t < nt; t++) {
          const int j = j0 + t;
          if (s[j] == -INFINITY) continue; /* hidden for every head alike */
          n->v_rows_read++;
          bool above = false;
          for (int g = 0; g < group; g++) {
            const double x = s[(size_t)g * c->Nkv + j];
            if (dp->v_skip_threshold > 0) above |= exp(x - m[g]) >= dp->v_skip_threshold;
            if (dp->v_skip_budget > 0) above |= x >= cut[g];
          }
          const int32_t kp = d->kvpos[j];
          const bool kept = kp < dp->sink || (int64_t)qp - kp < dp->recent;
          const bool skip = !above && !kept;
          n->v_rows_skipped += skip;
          for (int g = 0; g < group; g++) {
            const double w = exp(s[(size_t)g * c->Nkv + j] - m[g]);
            l[g] += w;
            if (skip) {
              drop[g] += w;
              continue;
            }
            const float *v = d->v + ((size_t)hk * c->Nkv + j) * c->Dv;
            double *o = out + ((size_t)iq * c->Hq + hk * group + g) * c->Dv;
            for (int e = 0; e < c->Dv; e++) o[e] += w * v[e];
          }
        }
      }
      for (int g = 0; g < group; g++) {
        double *o = out + ((size_t)iq * c->Hq + hk * group + g) * c->Dv;
        for (int e = 0; e < c->Dv; e++) o[e] = l[g] > 0 ? o[e] / l[g] : 0;
        if (l[g] > 0) *mass += drop[g] / l[g], *worst = fmax(*worst, drop[g] / l[g]);
        n->query_rows++;
      }
    }
  free(s), free(m), free(l), free(drop), free(cut);
}

struct skip_case {
  int D, Hq, Hkv, Nkv;
  enum tsr_dtype kv;
  float scale_gain; /* logits scaled by this over 1/sqrt(D): larger is more concentrated */
  float threshold;
  int sink, recent;
  int empty_every; /* every n-th cell empty (kv_pos -1); 0: none */
  float budget;    /* a mass budget; 0: none */
};

/* One decode query (at the last position) against Nkv keys, skipping as sc says: the
** kernel on 1 and 2 threads (the same bits, the same counts) against reference_skip. */
static void check_skip_data(const struct skip_case *sc, const struct attn_case *cp,
                            struct attn_data *dd);

static void check_skip_case(const struct skip_case *sc) {
  struct attn_case c = plain(sc->D, 1, sc->Nkv, sc->Hq, sc->Hkv, sc->kv);
  c.positions = c.causal = true;
  c.scale = sc->scale_gain / sqrtf((float)sc->D);
  struct attn_data d = data_new(&c);
  for (int j = 0; sc->empty_every && j < c.Nkv; j += sc->empty_every) d.kvpos[j] = -1;
  check_skip_data(sc, &c, &d);
  data_free(&d);
}

/* sc's parameters on the case and data given */
static void check_skip_data(const struct skip_case *sc, const struct attn_case *cp,
                            struct attn_data *dd) {
  const struct attn_case c = *cp;
  struct attn_data d = *dd;
  struct tsr_decode_counters got[2] = {{0}}, want;
  const struct tsr_decode_params dp0 = {.struct_size = sizeof dp0,
                                        .v_skip_threshold = sc->threshold,
                                        .sink = sc->sink, .recent = sc->recent,
                                        .v_skip_budget = sc->budget};
  const size_t n = (size_t)c.Hq * c.Dv;
  double *ref = malloc(n * sizeof(double)), mass, worst;
  float *out[2] = {malloc(n * sizeof(float)), malloc(n * sizeof(float))};
  reference_skip(&c, &d, &dp0, ref, &want, &mass, &worst);
  for (int t = 0; t < 2; t++) {
    struct tsr_decode_params dp = dp0;
    dp.counters = &got[t];
    CHECK_OK(run_flash_with(&c, &d, t + 1, out[t], &dp));
  }
  CHECK_MSG(!memcmp(out[0], out[1], n * sizeof(float)) && !memcmp(&got[0], &got[1], sizeof want),
            "1 and 2 threads differ (D %d, %d/%d heads, %d keys)", c.D, c.Hq, c.Hkv, c.Nkv);
  /* a key at the threshold's edge may fall either side of it in float: a few may differ,
  ** each moving the output by at most the threshold's share */
  const long dskip = labs((long)got[0].v_rows_skipped - (long)want.v_rows_skipped);
  const double bar = sc->threshold > sc->budget ? sc->threshold : sc->budget;
  const double tol = 1e-5 + 2.0 * dskip * bar;
  const double got_mass = (double)got[0].mass_dropped_e9 / TSR_DECODE_MASS_UNIT;
  printf("  D %d, %d/%d heads, %d keys, %s, gain %.1f, threshold %g, budget %g, guards %d/%d: "
         "%llu of %llu rows skipped (reference %llu), mass %.4g (reference %.4g, at most %.3g "
         "a row)\n", c.D, c.Hq, c.Hkv, c.Nkv, tsr_dtype_name(c.kdt), (double)sc->scale_gain,
         (double)sc->threshold, (double)sc->budget, sc->sink, sc->recent,
         (unsigned long long)got[0].v_rows_skipped, (unsigned long long)got[0].v_rows_read,
         (unsigned long long)want.v_rows_skipped, got_mass, mass, worst);
  if (sc->budget > 0) /* no row over its budget: the reference's, and the kernel's in sum */
    CHECK_MSG(worst <= sc->budget * (1 + 1e-9) &&
                  got_mass <= sc->budget * (double)got[0].query_rows * (1 + 1e-5),
              "a row dropped %.9g of its mass, the rows %.9g in all (budget %g)", worst,
              got_mass, (double)sc->budget);
  CHECK(got[0].v_rows_read == want.v_rows_read && got[0].query_rows == want.query_rows);
  CHECK_MSG(dskip <= 2, "%ld rows skipped differently", dskip);
  CHECK_MSG(count_off(&c, ref, out[0], tol, true) == 0, "tolerance %.3g", tol);
  CHECK_MSG(fabs(got_mass - mass) <= 1e-6 * (double)want.query_rows + 1e-3 * mass +
                                        (double)dskip * sc->threshold,
            "mass %.9g against %.9g", got_mass, mass);
  free(ref), free(out[0]), free(out[1]);
}

static void test_v_skipping_matches_a_reference_with_the_same_rule(void) {
  tsr_test_seed(41);
  const struct skip_case cases[] = {
      {64, 8, 1, 300, TSR_F32, 3.0f, 0.05f, 0, 0, 0, 0.0f},
      {128, 8, 2, 1000, TSR_Q8_0, 3.0f, 0.05f, 4, 16, 0, 0.0f},
      {128, 4, 4, 700, TSR_F16, 1.0f, 0.2f, 0, 8, 7, 0.0f},
      {256, 16, 2, 257, TSR_Q4_0, 4.0f, 0.01f, 64, 64, 0, 0.0f},
      {512, 8, 1, 150, TSR_Q8_0, 2.0f, 0.1f, 1, 1, 5, 0.0f},
      {96, 2, 1, 64, TSR_F32, 3.0f, 0.3f, 0, 0, 0, 0.0f}, /* one tile */
      {64, 4, 2, 1, TSR_F32, 3.0f, 0.3f, 0, 0, 0, 0.0f}, /* one key: the max, never skipped */
      /* mass budgets, alone and with a threshold */
      {128, 8, 2, 1000, TSR_Q8_0, 3.0f, 0.0f, 4, 16, 0, 1e-3f},
      {64, 8, 1, 300, TSR_F32, 1.0f, 0.0f, 0, 0, 0, 0.05f},
      {256, 16, 2, 257, TSR_Q4_0, 4.0f, 0.01f, 1, 4, 3, 1e-2f},
      {128, 4, 1, 600, TSR_F32, 8.0f, 0.0f, 0, 0, 0, 1e-3f}, /* concentrated: most go */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_skip_case(&cases[i]);
}

/* A mass budget judges every key against the row's final normaliser, found first: with
** the one heavy key last, every earlier key is negligible and skipped. A budget on a
** normaliser still growing (the running sum at the time a key is scored, over every key
** the row will see) would keep the early keys: the earlier system's partial-L inversion. */
static void test_budget_uses_the_final_normaliser(void) {
  tsr_test_seed(47);
  struct attn_case c = plain(64, 1, 200, 2, 1, TSR_F32);
  c.positions = c.causal = true;
  c.scale = 1.0f / 8.0f;
  struct attn_data d = data_new(&c);
  float *last = d.k + (size_t)(c.Nkv - 1) * c.D; /* both heads' query, tripled */
  for (int e = 0; e < c.D; e++) last[e] = 3.0f * (d.q[e] + d.q[c.D + e]);
  const struct skip_case sc = {64, 2, 1, 200, TSR_F32, 1.0f, 0.0f, 0, 1, 0, 1e-3f};
  check_skip_data(&sc, &c, &d);
  struct tsr_decode_counters cnt = {0};
  const struct tsr_decode_params dp = {.struct_size = sizeof dp, .v_skip_budget = 1e-3f,
                                       .recent = 1, .counters = &cnt};
  float *out = malloc((size_t)c.Hq * c.Dv * sizeof(float));
  CHECK_OK(run_flash_with(&c, &d, 1, out, &dp));
  CHECK_MSG(cnt.v_rows_skipped == (uint64_t)c.Nkv - 1, "%llu of %d skipped",
            (unsigned long long)cnt.v_rows_skipped, c.Nkv - 1);
  free(out);
  data_free(&d);
}

/* Guards that cover every key: the V skipping path reads every row and gives the dense
** kernel's bits; a row with every key hidden is zeros, counted as read nothing. */
static void test_v_skipping_that_skips_nothing_is_dense_bit_for_bit(void) {
  tsr_test_seed(43);
  struct attn_case c = plain(128, 1, 500, 8, 2, TSR_Q8_0);
  c.positions = c.causal = true;
  c.scale = 3.0f / sqrtf(128.0f);
  struct attn_data d = data_new(&c);
  const size_t n = (size_t)c.Hq * c.Dv;
  float *dense = malloc(n * sizeof(float)), *kept = malloc(n * sizeof(float));
  struct tsr_decode_counters cnt = {0};
  struct tsr_decode_params dp = {.struct_size = sizeof dp, .v_skip_threshold = 0.4f,
                                 .sink = 0, .recent = 1 << 30, .counters = &cnt};
  CHECK_OK(run_flash(&c, &d, 2, dense));
  CHECK_OK(run_flash_with(&c, &d, 2, kept, &dp));
  CHECK(!memcmp(dense, kept, n * sizeof(float)));
  CHECK(cnt.v_rows_read == (uint64_t)(c.Nkv * c.Hkv) && cnt.v_rows_skipped == 0 &&
        cnt.mass_dropped_e9 == 0 && cnt.query_rows == (uint64_t)c.Hq);
  /* every cell empty: zeros, no NaN, nothing read */
  for (int j = 0; j < c.Nkv; j++) d.kvpos[j] = -1;
  memset(&cnt, 0, sizeof cnt);
  dp.recent = 0;
  CHECK_OK(run_flash_with(&c, &d, 2, kept, &dp));
  CHECK(all_zero(kept, n) && cnt.v_rows_read == 0 && cnt.mass_dropped_e9 == 0);
  free(dense), free(kept);
  data_free(&d);
}

int main(void) {
  TSR_RUN(test_matches_reference_across_shapes_and_gqa);
  TSR_RUN(test_permuted_q_and_kv_viewed_from_a_cache);
  TSR_RUN(test_kv_with_strided_dim0_is_gathered);
  TSR_RUN(test_causal_prefill_with_positions);
  TSR_RUN(test_f16_queries_together_equal_each_alone);
  TSR_RUN(test_vector_runs_equal_single_calls);
  TSR_RUN(test_tile_max_equals_one_chain);
  TSR_RUN(test_exp_sum_is_portable_and_close_to_expf);
  TSR_RUN(test_sliding_window_hides_old_keys);
  TSR_RUN(test_softcap_bounds_logits);
  TSR_RUN(test_additive_mask_with_inf_entries);
  TSR_RUN(test_negative_kv_pos_marks_empty_cells);
  TSR_RUN(test_fully_hidden_row_is_exact_zeros);
  TSR_RUN(test_only_last_key_visible_returns_its_value);
  TSR_RUN(test_hidden_keys_before_and_between_visible_ones);
  TSR_RUN(test_large_logits_neither_overflow_nor_underflow);
  TSR_RUN(test_thread_count_does_not_change_results);
  TSR_RUN(test_builder_rejects_impossible_attention);
  TSR_RUN(test_builder_refuses_head_dim_not_a_multiple_of_the_block);
  TSR_RUN(test_negotiation_reads_block_codecs_in_register);
  TSR_RUN(test_every_codec_pair_of_one_type_matches_reference);
  TSR_RUN(test_asymmetric_codec_pairs_match_reference);
  TSR_RUN(test_q6_0_kv_matches_reference);
  TSR_RUN(test_quantized_kv_with_mask_softcap_and_narrow_v);
  TSR_RUN(test_quantized_cache_with_empty_cells_and_hidden_rows);
  TSR_RUN(test_v_skipping_matches_a_reference_with_the_same_rule);
  TSR_RUN(test_v_skipping_that_skips_nothing_is_dense_bit_for_bit);
  TSR_RUN(test_budget_uses_the_final_normaliser);
  for (int i = 0; i < 5; i++) tsr_backend_free(backends[i]);
  return TSR_TEST_EXIT();
}
