/* Built-in attention `flash` on the CPU against a double-precision reference
** that materializes the whole logit matrix and takes a plain softmax. */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "backend.h"
#include "dtype.h"
#include "graph.h"
#include "harness.h"

enum kv_layout {
  KV_DENSE,    /* k [D,Nkv,Hkv] packed */
  KV_CACHE,    /* a window of cells in a cache stored [D,Hkv,cells]: permuted and offset */
  KV_STRIDED0, /* every other element of a wider row: dim 0 is not packed */
};

struct attn_case {
  int D, Dv, Nq, Nkv, Hq, Hkv;
  enum tsr_dtype kv;
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
  float *k;       /* [Hkv][Nkv][D] */
  float *v;       /* [Hkv][Nkv][Dv] */
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
  else
    ((float *)base)[i] = x;
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
  for (size_t i = 0; i < nk; i++) d.k[i] = round_to(c->kv, tsr_test_normal());
  for (size_t i = 0; i < nv; i++) d.v[i] = round_to(c->kv, tsr_test_normal());
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
** outside the viewed elements, so reading a byte too far shows up. */
static struct tsr_tensor *make_kv(struct tsr_graph *g, const struct attn_case *c, int Dx,
                                  const float *src, void **storage) {
  const int N = c->Nkv, H = c->Hkv;
  const size_t es = tsr_dtype_type_size(c->kv);
  const float nan = NAN;
  int64_t ne[3];
  size_t nb[3], offs = 0, n_elems;
  if (c->layout == KV_CACHE) {
    const int cell0 = 3, cells = N + 7;
    ne[0] = Dx, ne[1] = H, ne[2] = cells;
    nb[0] = es, nb[1] = (size_t)H * Dx * es, nb[2] = (size_t)Dx * es; /* [Dx, N, H] order */
    offs = (size_t)cell0 * H * Dx * es;
    n_elems = (size_t)Dx * H * cells;
  } else if (c->layout == KV_STRIDED0) {
    ne[0] = 2 * Dx, ne[1] = N, ne[2] = H;
    nb[0] = 2 * es, nb[1] = 2 * (size_t)Dx * es, nb[2] = 2 * (size_t)Dx * N * es;
    n_elems = 2 * (size_t)Dx * N * H;
  } else {
    ne[0] = Dx, ne[1] = N, ne[2] = H;
    n_elems = (size_t)Dx * N * H;
  }
  *storage = malloc(n_elems * es);
  for (size_t i = 0; i < n_elems; i++) store(c->kv, *storage, i, nan);
  for (int h = 0; h < H; h++)
    for (int j = 0; j < N; j++)
      for (int e = 0; e < Dx; e++) {
        const float x = src[((size_t)h * N + j) * Dx + e];
        size_t at;
        if (c->layout == KV_CACHE)
          at = (((size_t)3 + j) * H + h) * Dx + e;
        else if (c->layout == KV_STRIDED0)
          at = ((size_t)h * N + j) * 2 * Dx + 2 * (size_t)e;
        else
          at = ((size_t)h * N + j) * Dx + e;
        store(c->kv, *storage, at, x);
      }
  struct tsr_tensor *t = tsr_new_external(g, c->kv, 3, ne, *storage);
  if (c->layout == KV_DENSE) return t;
  return tsr_view(g, t, 3, (int64_t[]){Dx, N, H}, nb, offs);
}

/* Runs the op on `threads` threads; out [Nq][Hq][Dv]. */
static tsr_status run_flash(const struct attn_case *c, const struct attn_data *d, int threads,
                            float *out) {
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
  struct tsr_tensor *k = make_kv(g, c, c->D, d->k, &ks);
  struct tsr_tensor *v = make_kv(g, c, c->Dv, d->v, &vs);
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
  const struct tsr_attn_params p = {c->scale, c->softcap, c->causal, c->window};
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
    fprintf(stderr, "  D=%d Dv=%d Nq=%d Nkv=%d Hq=%d Hkv=%d %s: %d off, worst [%zu] %.9g vs %.9g\n",
            c->D, c->Dv, c->Nq, c->Nkv, c->Hq, c->Hkv, tsr_dtype_name(c->kv), bad, worst,
            got[worst], ref[worst]);
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
                            .kv = kv, .scale = 1.0f / sqrtf((float)D)};
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
  const struct tsr_attn_params p = {0.125f, 0.0f, causal, window};
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
  CHECK(builder_refuses(4, 2, TSR_F32, TSR_F16, false, 0, false, 0, "both be f32 or both f16"));
  CHECK(builder_refuses(4, 2, TSR_F32, TSR_F32, false, 3, false, 0, "mask"));
  /* and the same shapes, done right, are accepted */
  struct tsr_graph *g = tsr_graph_new(16);
  struct tsr_tensor *q = tsr_new_tensor_3d(g, TSR_F32, 64, 4, 4);
  struct tsr_tensor *k = tsr_new_tensor_3d(g, TSR_F16, 64, 32, 2);
  struct tsr_tensor *v = tsr_new_tensor_3d(g, TSR_F16, 48, 32, 2);
  struct tsr_tensor *qp = tsr_new_tensor_1d(g, TSR_I32, 4);
  struct tsr_tensor *kp = tsr_new_tensor_1d(g, TSR_I32, 32);
  const struct tsr_attn_params p = {0.125f, 50.0f, true, 16};
  struct tsr_tensor *o = tsr_flash_attn(g, q, k, v, NULL, qp, kp, &p);
  CHECK(o && o->ne[0] == 48 && o->ne[1] == 4 && o->ne[2] == 4);
  tsr_graph_free(g);
}

int main(void) {
  TSR_RUN(test_matches_reference_across_shapes_and_gqa);
  TSR_RUN(test_permuted_q_and_kv_viewed_from_a_cache);
  TSR_RUN(test_kv_with_strided_dim0_is_gathered);
  TSR_RUN(test_causal_prefill_with_positions);
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
  for (int i = 0; i < 5; i++) tsr_backend_free(backends[i]);
  return TSR_TEST_EXIT();
}
