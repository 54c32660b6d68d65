/* arch_qwen's Gated DeltaNet kernels (ops_deltanet.c) against naive double
** references: the causal depthwise conv1d and the gated delta rule. */
#include <string.h>

#include "../ops_deltanet.h"
#include "tests/harness.h"

/* An f32 tensor info over data; row_pad extra floats after each dim-0 row
** make it a strided view, as the forward pass hands the kernels. */
static struct tsr_tensor_info info(float *data, int64_t ne0, int64_t ne1, int64_t ne2,
                                   int64_t row_pad) {
  struct tsr_tensor_info t = {.struct_size = sizeof t, .dtype = 0, .n_dims = 3,
                              .ne = {ne0, ne1, ne2, 1}, .data = data, .name = "t"};
  t.nb[0] = sizeof(float);
  t.nb[1] = (size_t)(ne0 + row_pad) * sizeof(float);
  t.nb[2] = t.nb[1] * (size_t)ne1;
  t.nb[3] = t.nb[2] * (size_t)ne2;
  return t;
}

static float *random_floats(int64_t n, float lo, float hi) {
  float *p = malloc((size_t)n * sizeof *p);
  for (int64_t i = 0; i < n; i++) p[i] = tsr_test_uniform(lo, hi);
  return p;
}

/* Runs a kernel as nth threads would, one slice after another. */
static void run_split(tsr_plugin_kernel_fn fn, int nth, const struct tsr_tensor_info *dst,
                      const struct tsr_tensor_info *src, int n_src, const int32_t *params) {
  for (int ith = 0; ith < nth; ith++) fn(NULL, ith, nth, dst, src, n_src, params);
}

static void check_conv1d(int64_t n_ch, int64_t n, int64_t k, int nth) {
  const int64_t pad = 3;
  float *x = random_floats((n_ch + pad) * n, -1, 1), *w = random_floats(k * n_ch, -1, 1);
  float *y = malloc((size_t)(n_ch * n) * sizeof *y);
  struct tsr_tensor_info src[2] = {info(x, n_ch, n, 1, pad), info(w, k, n_ch, 1, 0)};
  struct tsr_tensor_info dst = info(y, n_ch, n, 1, 0);
  run_split(tsr_qwen_conv1d_cpu, nth, &dst, src, 2, NULL);
  double worst = 0;
  for (int64_t c = 0; c < n_ch; c++)
    for (int64_t t = 0; t < n; t++) {
      double want = 0;
      for (int64_t j = 0; j < k; j++) {
        int64_t s = t - (k - 1) + j;
        if (s >= 0) want += (double)w[c * k + j] * x[s * (n_ch + pad) + c];
      }
      double err = fabs(y[t * n_ch + c] - want);
      if (err > worst) worst = err;
    }
  CHECK_MSG(worst < 1e-5, "conv1d C=%lld N=%lld K=%lld: max error %g", (long long)n_ch,
            (long long)n, (long long)k, worst);
  free(x), free(w), free(y);
}

static void test_conv1d_matches_causal_reference(void) {
  tsr_test_seed(11);
  check_conv1d(6, 9, 4, 1);
  check_conv1d(7, 9, 4, 3); /* channels split unevenly over threads */
  check_conv1d(5, 2, 4, 2); /* fewer tokens than taps: the rest read zeros */
  check_conv1d(3, 5, 1, 1);
}

/* The delta rule in double, state S_h [dk x dv] from s0 (or zero). o: [dv, hv, n];
** s_out: [dv, hv, dk] as the kernel lays out its final state. */
static void delta_reference(const float *q, const float *k, const float *v, const float *g,
                            const float *beta, const float *s0, int64_t dk, int64_t hk,
                            int64_t dv, int64_t hv, int64_t n, int grouped, double *o,
                            double *s_out) {
  double *s = malloc((size_t)(dk * dv) * sizeof *s);
  for (int64_t h = 0; h < hv; h++) {
    int64_t kh = grouped ? h / (hv / hk) : h % hk;
    for (int64_t i = 0; i < dk; i++)
      for (int64_t j = 0; j < dv; j++) s[i * dv + j] = s0 ? s0[(i * hv + h) * dv + j] : 0.0;
    for (int64_t t = 0; t < n; t++) {
      const float *qt = q + (t * hk + kh) * dk, *kt = k + (t * hk + kh) * dk;
      const float *vt = v + (t * hv + h) * dv;
      double decay = exp((double)g[t * hv + h]), b = beta[t * hv + h];
      for (int64_t i = 0; i < dk * dv; i++) s[i] *= decay;
      for (int64_t j = 0; j < dv; j++) {
        double u = 0;
        for (int64_t i = 0; i < dk; i++) u += s[i * dv + j] * kt[i];
        double d = b * (vt[j] - u);
        for (int64_t i = 0; i < dk; i++) s[i * dv + j] += kt[i] * d;
      }
      for (int64_t j = 0; j < dv; j++) {
        double acc = 0;
        for (int64_t i = 0; i < dk; i++) acc += s[i * dv + j] * qt[i];
        o[(t * hv + h) * dv + j] = acc;
      }
    }
    for (int64_t i = 0; i < dk; i++)
      for (int64_t j = 0; j < dv; j++) s_out[(i * hv + h) * dv + j] = s[i * dv + j];
  }
  free(s);
}

struct delta_case {
  int64_t dk, hk, dv, hv, n;
  float *q, *k, *v, *g, *beta;
};

static struct delta_case delta_case_new(int64_t dk, int64_t hk, int64_t dv, int64_t hv,
                                        int64_t n) {
  struct delta_case c = {dk, hk, dv, hv, n, random_floats(dk * hk * n, -0.5f, 0.5f),
                         random_floats(dk * hk * n, -0.5f, 0.5f), random_floats(dv * hv * n, -1, 1),
                         random_floats(hv * n, -1.5f, 0.0f), random_floats(hv * n, 0.05f, 1.0f)};
  return c;
}

static void delta_case_free(struct delta_case *c) {
  free(c->q), free(c->k), free(c->v), free(c->g), free(c->beta);
}

/* Runs the kernel on steps [t0, t0+n) of c, starting from s0 (NULL: zero);
** dst holds [dv, hv, n + dk]. */
static void delta_run(const struct delta_case *c, int64_t t0, int64_t n, float *s0, int grouped,
                      int nth, float *dst) {
  struct tsr_tensor_info src[6] = {
      info(c->q + t0 * c->dk * c->hk, c->dk, c->hk, n, 0),
      info(c->k + t0 * c->dk * c->hk, c->dk, c->hk, n, 0),
      info(c->v + t0 * c->dv * c->hv, c->dv, c->hv, n, 0),
      info(c->g + t0 * c->hv, c->hv, n, 1, 0), info(c->beta + t0 * c->hv, c->hv, n, 1, 0),
      s0 ? info(s0, c->dv, c->hv, c->dk, 0) : info(NULL, 1, 1, 1, 0)};
  struct tsr_tensor_info out = info(dst, c->dv, c->hv, n + c->dk, 0);
  const int32_t params[2] = {grouped ? TSR_DELTA_GROUPED : TSR_DELTA_TILED, 0};
  run_split(tsr_qwen_delta_rule_cpu, nth, &out, src, s0 ? 6 : 5, params);
}

static double max_diff(const float *a, const double *b, int64_t n) {
  double worst = 0;
  for (int64_t i = 0; i < n; i++)
    if (fabs(a[i] - b[i]) > worst) worst = fabs(a[i] - b[i]);
  return worst;
}

static void check_delta(int grouped, int nth) {
  struct delta_case c = delta_case_new(5, 2, 3, 6, 11);
  const int64_t no = c.dv * c.hv * c.n, ns = c.dv * c.hv * c.dk;
  float *dst = malloc((size_t)(no + ns) * sizeof *dst);
  double *o = malloc((size_t)no * sizeof *o), *s = malloc((size_t)ns * sizeof *s);
  delta_run(&c, 0, c.n, NULL, grouped, nth, dst);
  delta_reference(c.q, c.k, c.v, c.g, c.beta, NULL, c.dk, c.hk, c.dv, c.hv, c.n, grouped, o, s);
  double eo = max_diff(dst, o, no), es = max_diff(dst + no, s, ns);
  CHECK_MSG(eo < 1e-5 && es < 1e-5, "%s, %d threads: output error %g, state error %g",
            grouped ? "grouped" : "tiled", nth, eo, es);
  /* the other head order gives other outputs: the mapping is exercised */
  delta_reference(c.q, c.k, c.v, c.g, c.beta, NULL, c.dk, c.hk, c.dv, c.hv, c.n, !grouped, o, s);
  CHECK(max_diff(dst, o, no) > 1e-3);
  free(dst), free(o), free(s);
  delta_case_free(&c);
}

static void test_delta_rule_matches_reference_tiled(void) {
  tsr_test_seed(21);
  check_delta(0, 1);
  check_delta(0, 4); /* 6 heads over 4 threads */
}

static void test_delta_rule_matches_reference_grouped(void) {
  tsr_test_seed(22);
  check_delta(1, 1);
  check_delta(1, 3);
}

/* Two calls chained through the state equal one call over the whole
** sequence: what carrying the recurrent state across ubatches relies on. */
static void test_delta_rule_state_carries_across_calls(void) {
  tsr_test_seed(23);
  struct delta_case c = delta_case_new(4, 2, 4, 4, 9);
  const int64_t n1 = 4, n2 = c.n - n1, step = c.dv * c.hv, ns = step * c.dk;
  float *whole = malloc((size_t)(step * (c.n + c.dk)) * sizeof *whole);
  float *first = malloc((size_t)(step * (n1 + c.dk)) * sizeof *first);
  float *second = malloc((size_t)(step * (n2 + c.dk)) * sizeof *second);
  delta_run(&c, 0, c.n, NULL, 0, 2, whole);
  delta_run(&c, 0, n1, NULL, 0, 2, first);
  delta_run(&c, n1, n2, first + step * n1, 0, 2, second);
  double worst = 0;
  for (int64_t i = 0; i < step * n2; i++)
    worst = fmax(worst, fabs(second[i] - whole[step * n1 + i]));
  for (int64_t i = 0; i < ns; i++)
    worst = fmax(worst, fabs(second[step * n2 + i] - whole[step * c.n + i]));
  CHECK_MSG(worst < 1e-6, "chained vs whole: max difference %g", worst);
  free(whole), free(first), free(second);
  delta_case_free(&c);
}

/* The conv over a sequence split in three, its history carried in place
** (one token in the middle: a decode step), equals the conv over the whole. */
static void test_conv1d_history_carries_across_calls(void) {
  tsr_test_seed(29);
  const int64_t n_ch = 5, n = 9, k = 4, cuts[4] = {0, 4, 5, 9};
  float *x = random_floats(n_ch * n, -1, 1), *w = random_floats(k * n_ch, -1, 1);
  float *whole = malloc((size_t)(n_ch * n) * sizeof *whole);
  float *split = malloc((size_t)(n_ch * n) * sizeof *split);
  float hist[3 * 5] = {0}; /* [k-1, n_ch], zero before the sequence */
  struct tsr_tensor_info src[4] = {info(x, n_ch, n, 1, 0), info(w, k, n_ch, 1, 0),
                                   info(hist, k - 1, n_ch, 1, 0), info(hist, k - 1, n_ch, 1, 0)};
  struct tsr_tensor_info dst = info(whole, n_ch, n, 1, 0);
  run_split(tsr_qwen_conv1d_cpu, 2, &dst, src, 2, NULL);
  for (int part = 0; part < 3; part++) {
    const int64_t t0 = cuts[part], m = cuts[part + 1] - t0;
    src[0] = info(x + t0 * n_ch, n_ch, m, 1, 0);
    dst = info(split + t0 * n_ch, n_ch, m, 1, 0);
    run_split(tsr_qwen_conv1d_cpu, 2, &dst, src, 4, NULL);
  }
  double worst = 0;
  for (int64_t i = 0; i < n_ch * n; i++) worst = fmax(worst, fabs(split[i] - whole[i]));
  /* the history now holds the last k-1 inputs, oldest first */
  for (int64_t c = 0; c < n_ch; c++)
    for (int64_t j = 0; j < k - 1; j++)
      worst = fmax(worst, fabs(hist[c * (k - 1) + j] - x[(n - (k - 1) + j) * n_ch + c]));
  CHECK_MSG(worst < 1e-6, "split vs whole: max difference %g", worst);
  free(x), free(w), free(whole), free(split);
}

/* With params[1] the final state is written back over the initial one. */
static void test_delta_rule_writes_state_back_in_place(void) {
  tsr_test_seed(31);
  struct delta_case c = delta_case_new(4, 2, 4, 4, 6);
  const int64_t step = c.dv * c.hv, ns = step * c.dk;
  float *whole = malloc((size_t)(step * (c.n + c.dk)) * sizeof *whole);
  float *out = malloc((size_t)(step * (c.n + c.dk)) * sizeof *out);
  float *state = calloc((size_t)ns, sizeof *state);
  delta_run(&c, 0, c.n, NULL, 0, 1, whole);
  struct tsr_tensor_info src[6] = {
      info(c.q, c.dk, c.hk, c.n, 0), info(c.k, c.dk, c.hk, c.n, 0),
      info(c.v, c.dv, c.hv, c.n, 0), info(c.g, c.hv, c.n, 1, 0), info(c.beta, c.hv, c.n, 1, 0),
      info(state, c.dv, c.hv, c.dk, 0)};
  struct tsr_tensor_info dst = info(out, c.dv, c.hv, c.n + c.dk, 0);
  const int32_t params[2] = {TSR_DELTA_TILED, 1};
  run_split(tsr_qwen_delta_rule_cpu, 3, &dst, src, 6, params);
  double worst = 0;
  for (int64_t i = 0; i < ns; i++) worst = fmax(worst, fabs(state[i] - whole[step * c.n + i]));
  CHECK_MSG(worst < 1e-6, "written-back state vs final state: max difference %g", worst);
  CHECK(fabs(state[0]) + fabs(state[ns - 1]) > 0); /* something was written */
  free(whole), free(out), free(state);
  delta_case_free(&c);
}

int main(void) {
  TSR_RUN(test_conv1d_matches_causal_reference);
  TSR_RUN(test_delta_rule_matches_reference_tiled);
  TSR_RUN(test_delta_rule_matches_reference_grouped);
  TSR_RUN(test_delta_rule_state_carries_across_calls);
  TSR_RUN(test_conv1d_history_carries_across_calls);
  TSR_RUN(test_delta_rule_writes_state_back_in_place);
  return TSR_TEST_EXIT();
}
