/*
** Op parity: every core op, weight type and KV codec on random inputs, run
** on the cpu backend (the reference) and on the cuda backend; the outputs
** must agree within each op's tolerance. Also what the cuda backend must
** refuse by name, and its memory model (external copies, sync, forget).
**
** The graph of a case is built twice from the same seeds, once per backend,
** so a node that writes into its inputs (set_rows, cpy into a view) starts
** from the same bytes on both. Error measure: max |gpu - cpu| over the
** output divided by max |cpu| (the output's own scale); i32 outputs and
** quantized writes must be identical. Tolerances (why):
**   exact          get_rows, concat, cpy, set_rows (quantizers repeat the cpu's
**                  arithmetic bit for bit), top_k, argmax
**   1e-6           add, mul, scale (one rounding)
**   1e-5           unary, glu, softcap, norms, softmax, rope (libm vs CUDA
**                  expf/tanhf, a few ulp), products with n <= 16 columns
**                  and f32 GEMMs (f32 accumulation in another order)
**   1e-4           flash attention (another summation and rescaling order)
**   5e-3           flash attention with head dims in steps of 16 (tensor
**                  cores, f16 Q, K, V and probabilities)
**   4e-3           batched products on f16 tensor cores (x rounded to f16:
**                  2^-11 relative per term)
**   1e-2           the q8 path (unless TESSERA_CUDA_GEMV=f32): products of
**                  n <= 64 columns (the gemv to 16, integer mma above) and
**                  mat_mul_id (few pairs: the gemv; more: grouped mma), of q4_0,
**                  q8_0, q4_K, q6_K weights (x coded to 8 bits per 32 values: up to 1/254 of
**                  the block's largest value per term; the codes and integer
**                  dots are checked exactly on the CPU, test_cuda_quant.cu)
** Prints one PASS/FAIL line per case (a FAIL names the first element that
** differs, its coordinates and both values) and a summary naming the first
** failure; exits non-zero on any FAIL.
**
** Isolation: a kernel fault poisons the CUDA context, after which every call
** of the process fails, so one bad kernel would fail every later case. The
** cases therefore run in a child process; when a case poisons the context or
** kills the child, the parent reports that case and starts a fresh child at
** the next one. TESSERA_CUDA_SYNC=1 (wait after every node, so an error names
** its node) is on unless the environment sets it. The external tensors of the
** cases are not kept (tsr_backend_keep): each compute uploads them, so the
** buffers each case frees can never be met again as stale device copies; the
** memory checks at the end exercise kept ranges.
** Plugin ops (arch_gemma4 rope_f32 and ordered_logits, arch_qwen conv1d and
** delta_rule) run through the plugins' cuda kernel libraries, loaded as the
** engine loads them; what they write into their sources (conv1d's history,
** delta_rule's state) is compared too. Tolerances: exact, except rope_f32 and
** delta_rule at 1e-6 (cos, sin and exp in double rounded to f32 against
** glibc's cosf, sinf and expf: the same value but where one misrounds).
** A FAIL of a block-typed output also prints the raw bytes of the first
** differing block on both sides (the scale d first: a wrong scale is
** visible at once).
** usage: gpu_op_parity [--no-fork] [--self] [filter]   (only cases whose name contains
** filter; --self runs the "cuda" side on a second cpu backend, one thread: a check of
** the harness and its cases on a machine without a GPU)
*/
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "graph/backend.h"
#include "abi/op_registry.h"
#include "op_test_util.h"
#include "abi/plugin_host.h"

#define MAX_T 24
#define MAX_OUT 4

struct pc {
  struct tsr_graph *g;
  int var;
  struct tsr_tensor *t[MAX_T];
  struct tsr_tensor *out[MAX_OUT];
  double tol[MAX_OUT];
  int n_out;
  void *ext[8];
  int n_ext;
  char name[160];
};

typedef void (*case_fn)(struct pc *p, int phase);

static struct tsr_backend *g_cpu, *g_cuda;
static int g_pass, g_fail;
static const char *g_filter;
static bool g_poisoned; /* the cuda context faulted: later cases need a fresh process */
static bool g_self;     /* --self: the "cuda" side is a one-thread cpu backend */
static char g_first_fail[200];

static void note_fail(const char *name) {
  if (!g_first_fail[0]) snprintf(g_first_fail, sizeof g_first_fail, "%s", name);
}

static void note_cuda_error(const char *msg) {
  if (strstr(msg, "CUDA context is unusable")) g_poisoned = true;
}

/* ---- helpers ----------------------------------------------------------- */

static void out(struct pc *p, struct tsr_tensor *t, double tol) {
  tsr_graph_mark_output(t);
  p->out[p->n_out] = t;
  p->tol[p->n_out++] = tol;
}

/* An external tensor over fresh host memory, filled N(0, sigma) (quantized
** for block types), as weights and caches are. */
static struct tsr_tensor *ext(struct pc *p, enum tsr_dtype dt, int64_t ne0, int64_t ne1,
                              int64_t ne2, float sigma) {
  int64_t ne[3] = {ne0, ne1, ne2};
  size_t bytes = tsr_dtype_row_size(dt, ne0) * (size_t)(ne1 * ne2);
  void *mem = calloc(1, bytes + 64);
  p->ext[p->n_ext++] = mem;
  struct tsr_tensor *t = tsr_new_external(p->g, dt, 3, ne, mem);
  if (t) tsr_test_fill_normal(t, sigma);
  return t;
}

static void fill_i32(struct tsr_tensor *t, const int32_t *v) {
  for (int64_t i = 0; i < tsr_tensor_nelements(t); i++)
    tsr_test_set(t, i % t->ne[0], (i / t->ne[0]) % t->ne[1], i / (t->ne[0] * t->ne[1]), 0, v[i]);
}

static const enum tsr_dtype k_weights[] = {TSR_F32, TSR_F16, TSR_BF16, TSR_Q4_0, TSR_Q4_1, TSR_Q5_0,
                                           TSR_Q5_1, TSR_Q8_0, TSR_Q6_0, TSR_Q2_K, TSR_Q3_K, TSR_Q4_K,
                                           TSR_Q5_K, TSR_Q6_K, TSR_Q8_K};
#define N_WEIGHTS (int)(sizeof k_weights / sizeof *k_weights)
static const enum tsr_dtype k_writes[] = {TSR_F32, TSR_F16, TSR_BF16, TSR_Q8_0, TSR_Q6_0,
                                          TSR_Q5_1, TSR_Q5_0, TSR_Q4_1, TSR_Q4_0};
#define N_WRITES (int)(sizeof k_writes / sizeof *k_writes)

/* ---- running one case on both backends --------------------------------- */

struct side {
  tsr_status st;
  char msg[512];
  double *vals[MAX_OUT];
  int64_t n[MAX_OUT];
  /* each output's layout, and for block types its bytes (the graph is gone
  ** by the time the sides are compared) */
  enum tsr_dtype dtype[MAX_OUT];
  int64_t ne[MAX_OUT][4];
  size_t nb[MAX_OUT][4];
  unsigned char *raw[MAX_OUT];
  size_t raw_n[MAX_OUT];
};

static void run_side(case_fn fn, int var, struct tsr_backend *be, struct pc *p, struct side *s) {
  memset(p, 0, sizeof *p);
  memset(s, 0, sizeof *s);
  p->var = var;
  p->g = tsr_graph_new(256);
  tsr_test_seed(1234 + (uint64_t)var);
  fn(p, 0);
  struct tsr_test_graph tg = {.g = p->g};
  s->st = tsr_test_graph_alloc(&tg);
  if (s->st == TSR_OK) {
    tsr_test_seed(777 + (uint64_t)var);
    fn(p, 1);
    s->st = tsr_backend_compute(be, p->g);
  }
  if (s->st != TSR_OK) snprintf(s->msg, sizeof s->msg, "%s", tsr_error_message());
  /* outputs written into (unkept) external memory are back on the host already */
  for (int i = 0; s->st == TSR_OK && i < p->n_out; i++) {
    const struct tsr_tensor *o = p->out[i];
    s->vals[i] = tsr_test_read_alloc(o);
    s->n[i] = tsr_tensor_nelements(o);
    s->dtype[i] = o->dtype;
    for (int d = 0; d < 4; d++) s->ne[i][d] = o->ne[d], s->nb[i][d] = o->nb[d];
    if (tsr_dtype_block_size(o->dtype) > 1 && (s->raw[i] = malloc(tsr_tensor_nbytes(o)))) {
      s->raw_n[i] = tsr_tensor_nbytes(o);
      memcpy(s->raw[i], o->data, s->raw_n[i]);
    }
  }
  free(tg.arena);
  tsr_graph_free(p->g);
  for (int i = 0; i < p->n_ext; i++) free(p->ext[i]);
}

/* The raw bytes of the block holding flat element `first` of output i, both sides. */
static void block_bytes(const struct side *a, const struct side *b, int i, int64_t first, char *buf,
                        size_t cap) {
  const enum tsr_dtype dt = a->dtype[i];
  const int64_t bs = tsr_dtype_block_size(dt), *ne = a->ne[i];
  const size_t *nb = a->nb[i], ts = tsr_dtype_type_size(dt);
  if (bs <= 1 || !a->raw[i] || !b->raw[i]) return;
  const int64_t i0 = first % ne[0], i1 = first / ne[0] % ne[1], i2 = first / (ne[0] * ne[1]) % ne[2],
                i3 = first / (ne[0] * ne[1] * ne[2]);
  const size_t off = (size_t)(i0 / bs) * nb[0] + (size_t)i1 * nb[1] + (size_t)i2 * nb[2] +
                     (size_t)i3 * nb[3];
  if (off + ts > a->raw_n[i] || off + ts > b->raw_n[i]) return;
  size_t used = (size_t)snprintf(buf, cap, "; block at byte %zu (%zu bytes, scale first)", off, ts);
  for (int side = 0; side < 2 && used < cap; side++) {
    const unsigned char *r = (side ? b : a)->raw[i] + off;
    used += (size_t)snprintf(buf + used, cap - used, "%s", side ? "; cuda" : "; cpu ");
    for (size_t k = 0; k < ts && used < cap; k++)
      used += (size_t)snprintf(buf + used, cap - used, " %02x", r[k]);
  }
}

static void run_case(case_fn fn, int var) {
  struct pc pa, pb;
  struct side a, b;
  /* names are set while building; build once to learn it for the filter */
  run_side(fn, var, g_cpu, &pa, &a);
  if (g_filter && !strstr(pa.name, g_filter)) goto done;
  run_side(fn, var, g_cuda, &pb, &b);
  bool ok = a.st == TSR_OK && b.st == TSR_OK;
  double worst = 0, worst_tol = 0;
  char where[800] = "";
  for (int i = 0; ok && i < pa.n_out; i++) {
    double scale = 0;
    for (int64_t j = 0; j < a.n[i]; j++)
      if (fabs(a.vals[i][j]) > scale) scale = fabs(a.vals[i][j]);
    if (scale == 0) scale = 1;
    double diff = 0;
    int64_t first = -1, n_bad = 0;
    for (int64_t j = 0; j < a.n[i]; j++) {
      double d = fabs(a.vals[i][j] - b.vals[i][j]);
      if (d != d) d = (a.vals[i][j] != a.vals[i][j] && b.vals[i][j] != b.vals[i][j]) ? 0 : INFINITY;
      if (d > diff) diff = d;
      if (!(d / scale <= pa.tol[i])) n_bad++, first = first < 0 ? j : first;
    }
    double err = diff / scale;
    if (err > worst) worst = err, worst_tol = pa.tol[i];
    if (!(err <= pa.tol[i])) {
      ok = false;
      const int64_t *ne = a.ne[i];
      int n = snprintf(where, sizeof where, "; output %d %s [%lld,%lld,%lld,%lld]: %lld of %lld "
                       "elements off, first at (%lld,%lld,%lld,%lld) cpu %.6g cuda %.6g", i,
                       tsr_dtype_name(a.dtype[i]), (long long)ne[0], (long long)ne[1],
                       (long long)ne[2], (long long)ne[3], (long long)n_bad, (long long)a.n[i],
                       (long long)(first % ne[0]), (long long)(first / ne[0] % ne[1]),
                       (long long)(first / (ne[0] * ne[1]) % ne[2]),
                       (long long)(first / (ne[0] * ne[1] * ne[2])), a.vals[i][first],
                       b.vals[i][first]);
      if (n > 0 && (size_t)n < sizeof where)
        block_bytes(&a, &b, i, first, where + n, sizeof where - (size_t)n);
    }
  }
  if (ok) g_pass++;
  else g_fail++, note_fail(pa.name);
  if (a.st != TSR_OK)
    printf("FAIL  %-48s cpu side failed: %s\n", pa.name, a.msg);
  else if (b.st != TSR_OK)
    printf("FAIL  %-48s cuda side failed: %s\n", pa.name, b.msg), note_cuda_error(b.msg);
  else
    printf("%s  %-48s err %.2e (tol %.0e)%s\n", ok ? "PASS" : "FAIL", pa.name, worst, worst_tol,
           where);
  fflush(stdout);
  for (int i = 0; i < MAX_OUT; i++) free(b.vals[i]), free(b.raw[i]);
done:
  for (int i = 0; i < MAX_OUT; i++) free(a.vals[i]), free(a.raw[i]);
}

/* ---- cases ----------------------------------------------------------------- */

/* get_rows from every readable table type; index -1 gives a zero row. */
static void c_get_rows(struct pc *p, int phase) {
  enum tsr_dtype dt = k_weights[p->var];
  if (phase == 0) {
    snprintf(p->name, sizeof p->name, "get_rows table=%s", tsr_dtype_name(dt));
    struct tsr_tensor *a = ext(p, dt, 256, 10, 2, 1.0f);
    p->t[0] = tsr_new_tensor_2d(p->g, TSR_I32, 5, 2);
    out(p, tsr_get_rows(p->g, a, p->t[0]), 0);
  } else {
    fill_i32(p->t[0], (const int32_t[]){3, 0, 9, -1, 3, 7, 7, 1, 10, 2});
  }
}

/* Whether products of w's type take the q8 path (x coded to 8 bits): the default for
** q4_0, q8_0, q4_K and q6_K unless TESSERA_CUDA_GEMV=f32. */
static bool coded_x(enum tsr_dtype w) {
  static int q8 = -1;
  if (q8 < 0) {
    const char *e = getenv("TESSERA_CUDA_GEMV");
    q8 = !(e && strcmp(e, "f32") == 0);
  }
  return q8 && (w == TSR_Q4_0 || w == TSR_Q8_0 || w == TSR_Q4_K || w == TSR_Q6_K);
}

/* The tolerance of a product with n <= 16 columns (the gemv): f32 dots, or the q8
** path's coded x for the types it takes. */
static double gemv_tol(enum tsr_dtype w) { return coded_x(w) ? 1e-2 : 1e-5; }

/* The tolerance of a product with n columns: the gemv's, the q8 path's up to 64 columns,
** else cuBLAS's (x rounded to f16, bf16 for bf16 weights; f32 SGEMM for f32). */
static double product_tol(enum tsr_dtype w, int n) {
  if (n <= 16 || (n <= 64 && coded_x(w))) return gemv_tol(w);
  return w == TSR_F32 ? 1e-5 : w == TSR_BF16 ? 1e-2 : 4e-3;
}

/* mat_mul: weight type x column count (the q8 path's types: the gemv below CU_MMQ_MIN_N
** columns, the integer mma from there to 64, one to eight tiles of 8 columns, the last one
** partial; other types: the gemv to 16; GEMM above). */
static const int k_cols[] = {1, 3, 16, 17, 40, 64, 70};
#define N_COLS 7
static void c_mat_mul(struct pc *p, int phase) {
  enum tsr_dtype dt = k_weights[p->var / N_COLS];
  int n = k_cols[p->var % N_COLS];
  if (phase == 0) {
    snprintf(p->name, sizeof p->name, "mat_mul w=%s n=%d", tsr_dtype_name(dt), n);
    /* rows not a multiple of a gemv block's (8 warps x 2 rows) and, for 32-weight blocks,
       a row length that ends inside a warp step (256 weights) */
    int64_t K = tsr_dtype_block_size(dt) == 256 ? 768 : 480;
    struct tsr_tensor *w = ext(p, dt, K, 99, 1, 0.05f);
    p->t[0] = tsr_new_tensor_2d(p->g, TSR_F32, K, n);
    out(p, tsr_mat_mul(p->g, w, p->t[0]), product_tol(dt, n));
  } else {
    tsr_test_fill_normal(p->t[0], 1.0f);
  }
}

/* Products with long rows: the q8 gemv splits a row over one, two or four warps by its
** length (1536 and 4608 weights: two and four), the integer mma (5 and 24 columns) over
** blocks (split K), the f32 gemv strides it. */
static void c_mat_mul_long(struct pc *p, int phase) {
  static const enum tsr_dtype w_t[] = {TSR_Q4_0, TSR_Q8_0, TSR_Q4_K, TSR_Q6_K};
  static const int n_cols[] = {1, 5, 24};
  const enum tsr_dtype dt = w_t[p->var % 4];
  const int64_t K = p->var / 4 % 2 ? 4608 : 1536;
  const int n = n_cols[p->var / 8];
  if (phase == 0) {
    snprintf(p->name, sizeof p->name, "mat_mul w=%s K=%lld n=%d", tsr_dtype_name(dt), (long long)K,
             n);
    struct tsr_tensor *w = ext(p, dt, K, 37, 1, 0.05f); /* 37: not whole blocks of rows */
    p->t[0] = tsr_new_tensor_2d(p->g, TSR_F32, K, n);
    out(p, tsr_mat_mul(p->g, w, p->t[0]), product_tol(dt, n));
  } else {
    tsr_test_fill_normal(p->t[0], 1.0f);
  }
}

/* mat_mul with weight batches broadcast over x, a strided x and a transposed weight. */
static void c_mat_mul_views(struct pc *p, int phase) {
  static const char *what[] = {"broadcast", "strided x", "transposed w"};
  int n = p->var % 2 ? 24 : 4;
  if (phase == 0) {
    snprintf(p->name, sizeof p->name, "mat_mul %s n=%d", what[p->var / 2], n);
    struct tsr_graph *g = p->g;
    if (p->var / 2 == 0) {
      struct tsr_tensor *w = ext(p, TSR_F16, 64, 40, 2, 0.1f);
      p->t[0] = tsr_new_tensor_4d(g, TSR_F32, 64, n, 4, 3);
      out(p, tsr_mat_mul(g, w, p->t[0]), n > 16 ? 4e-3 : 1e-5);
    } else if (p->var / 2 == 1) {
      struct tsr_tensor *w = ext(p, TSR_Q8_0, 64, 40, 1, 0.1f);
      p->t[0] = tsr_new_tensor_2d(g, TSR_F32, n, 64);
      out(p, tsr_mat_mul(g, w, tsr_transpose(g, p->t[0])), product_tol(TSR_Q8_0, n));
    } else {
      struct tsr_tensor *w = ext(p, TSR_F32, 40, 64, 1, 0.1f);
      p->t[0] = tsr_new_tensor_2d(g, TSR_F32, 64, n);
      out(p, tsr_mat_mul(g, tsr_transpose(g, w), p->t[0]), 1e-5);
    }
  } else {
    tsr_test_fill_normal(p->t[0], 1.0f);
  }
}

/* mat_mul_id: few pairs (device ids) and many: for the q8 path's types grouped on the
** device (40 tokens: tiles of 8 columns; 200: 32; 2100, 4200 pairs: 64, several a
** expert), else on the host (40 tokens give each expert 16 or fewer, the gemv; 200
** about 50, cuBLAS; 2100 two runs of experts of at most 4096 columns); one id out of
** range gives a zero column; x shared by every slot or one per slot. */
static void c_mat_mul_id(struct pc *p, int phase) {
  static const enum tsr_dtype w_t[] = {TSR_Q4_0, TSR_F16, TSR_Q4_K, TSR_Q8_0, TSR_Q6_K};
  static const int n_tokens[] = {3, 40, 200, 2100};
  enum tsr_dtype dt = w_t[p->var % 5];
  int tokens = n_tokens[p->var / 5 % 4], shared = p->var / 20;
  const int E = 8, U = 2;
  if (phase == 0) {
    snprintf(p->name, sizeof p->name, "mat_mul_id w=%s tokens=%d%s", tsr_dtype_name(dt), tokens,
             shared ? " x shared" : "");
    struct tsr_tensor *w = ext(p, dt, 256, 48, E, 0.05f);
    p->t[0] = tsr_new_tensor_3d(p->g, TSR_F32, 256, shared ? 1 : U, tokens);
    p->t[1] = tsr_new_tensor_2d(p->g, TSR_I32, U, tokens);
    /* many pairs are grouped by expert, and a group of 16 or fewer runs the gemv */
    bool grouped = tokens * U > 32 && dt != TSR_F32;
    out(p, tsr_mat_mul_id(p->g, w, p->t[0], p->t[1]), fmax(grouped ? 4e-3 : 0, gemv_tol(dt)));
  } else {
    tsr_test_fill_normal(p->t[0], 1.0f);
    static int32_t ids[4200];
    for (int i = 0; i < U * tokens; i++) ids[i] = (int32_t)(tsr_test_next() % E);
    ids[1] = E; /* out of range: a zero column */
    fill_i32(p->t[1], ids);
  }
}

static void c_elementwise(struct pc *p, int phase) {
  static const char *names[] = {"add broadcast", "mul broadcast", "add permuted", "scale",
                                "softcap", "rms_norm w", "rms_norm", "l2_norm"};
  if (phase == 0) {
    struct tsr_graph *g = p->g;
    snprintf(p->name, sizeof p->name, "%s", names[p->var]);
    p->t[0] = tsr_new_tensor_3d(g, TSR_F32, 96, 7, 4);
    p->t[1] = tsr_new_tensor_3d(g, TSR_F32, 96, 1, 2);
    p->t[2] = tsr_new_tensor_1d(g, TSR_F32, 96);
    struct tsr_tensor *a = p->t[0];
    switch (p->var) {
    case 0: out(p, tsr_add(g, a, p->t[1]), 1e-6); break;
    case 1: out(p, tsr_mul(g, a, p->t[2]), 1e-6); break;
    case 2: {
      struct tsr_tensor *pa = tsr_permute(g, a, 0, 2, 1, 3); /* [96, 4, 7] */
      out(p, tsr_add(g, pa, tsr_new_tensor_3d(g, TSR_F32, 96, 4, 1)), 1e-6);
      break;
    }
    case 3: out(p, tsr_scale(g, a, -0.37f), 1e-6); break;
    case 4: out(p, tsr_softcap(g, tsr_scale(g, a, 30.0f), 15.0f), 1e-5); break;
    case 5: out(p, tsr_rms_norm(g, a, p->t[2], 1e-6f), 1e-5); break;
    case 6: out(p, tsr_rms_norm(g, tsr_permute(g, a, 0, 2, 1, 3), NULL, 1e-5f), 1e-5); break;
    case 7: out(p, tsr_l2_norm(g, a, 1e-6f), 1e-5); break;
    }
  } else {
    for (int i = 0; i < tsr_graph_n_tensors(p->g); i++) {
      struct tsr_tensor *t = tsr_graph_tensor(p->g, i);
      if (t->op == TSR_OP_NONE && (t->flags & TSR_FLAG_INPUT)) tsr_test_fill_normal(t, 2.0f);
    }
  }
}

static void c_unary(struct pc *p, int phase) {
  if (phase == 0) {
    snprintf(p->name, sizeof p->name, "unary %s", tsr_unary_name((enum tsr_unary_op)p->var));
    p->t[0] = tsr_new_tensor_2d(p->g, TSR_F32, 300, 5);
    out(p, tsr_unary(p->g, p->t[0], (enum tsr_unary_op)p->var), 1e-5);
  } else {
    tsr_test_fill_uniform(p->t[0], -12.0f, 12.0f);
  }
}

static void c_glu(struct pc *p, int phase) {
  static const char *ops[] = {"swiglu", "geglu", "reglu"};
  const int op = p->var % 3, fused = p->var / 3 % 2, swapped = p->var / 6;
  if (phase == 0) {
    snprintf(p->name, sizeof p->name, "glu %s %s%s", ops[op], fused ? "fused" : "separate",
             swapped ? " swapped" : "");
    p->t[0] = tsr_new_tensor_2d(p->g, TSR_F32, fused ? 256 : 128, 6);
    p->t[1] = fused ? NULL : tsr_new_tensor_2d(p->g, TSR_F32, 128, 6);
    out(p, tsr_glu(p->g, p->t[0], p->t[1], (enum tsr_glu_op)op, swapped), 1e-5);
  } else {
    tsr_test_fill_normal(p->t[0], 2.0f);
    if (p->t[1]) tsr_test_fill_normal(p->t[1], 2.0f);
  }
}

/* softmax: f32 mask, f16 mask broadcast over dim 2, a fully masked row. */
static void c_softmax(struct pc *p, int phase) {
  const bool f16 = p->var == 1;
  if (phase == 0) {
    snprintf(p->name, sizeof p->name, "softmax %s", p->var == 0 ? "mask f32" : p->var == 1 ?
             "mask f16, masked row" : "no mask, long rows");
    int64_t n = p->var == 2 ? 70000 : 200;
    p->t[0] = tsr_new_tensor_3d(p->g, TSR_F32, n, 5, 3);
    p->t[1] = p->var < 2 ? tsr_new_tensor_2d(p->g, f16 ? TSR_F16 : TSR_F32, n, 5) : NULL;
    out(p, tsr_softmax(p->g, p->t[0], p->t[1], 0.7f), 1e-5);
  } else {
    tsr_test_fill_normal(p->t[0], 3.0f);
    if (p->t[1]) {
      tsr_test_fill_uniform(p->t[1], -2.0f, 0.0f);
      for (int64_t j = 0; j < p->t[1]->ne[0]; j++) {
        tsr_test_set(p->t[1], j, 2, 0, 0, -INFINITY);
        if (j % 3 == 0) tsr_test_set(p->t[1], j, 0, 0, 0, -INFINITY);
      }
    }
  }
}

static void c_rope(struct pc *p, int phase) {
  const int neox = p->var % 2, with_ff = p->var / 2 % 2;
  if (phase == 0) {
    snprintf(p->name, sizeof p->name, "rope %s%s n_rot<ne0", neox ? "neox" : "normal",
             with_ff ? " freq_factors" : "");
    p->t[0] = tsr_new_tensor_3d(p->g, TSR_F32, 128, 4, 6);
    p->t[1] = tsr_new_tensor_1d(p->g, TSR_I32, 6);
    p->t[2] = with_ff ? tsr_new_tensor_1d(p->g, TSR_F32, 48) : NULL;
    struct tsr_rope_params rp = {.n_rot = 96, .mode = neox ? TSR_ROPE_NEOX : TSR_ROPE_NORMAL,
                                 .freq_base = 1000000.0f, .freq_scale = 0.5f};
    out(p, tsr_rope(p->g, p->t[0], p->t[1], p->t[2], &rp), 1e-5);
  } else {
    tsr_test_fill_normal(p->t[0], 1.0f);
    fill_i32(p->t[1], (const int32_t[]){0, 1, 17, 4095, 65536, 999999});
    if (p->t[2]) tsr_test_fill_uniform(p->t[2], 1.0f, 8.0f);
  }
}

static void c_concat(struct pc *p, int phase) {
  const int dim = p->var % 3;
  const enum tsr_dtype dt = p->var >= 3 ? TSR_F16 : TSR_F32;
  if (p->var == 6) { /* a permuted view with itself, rows longer than a block */
    if (phase == 0) {
      snprintf(p->name, sizeof p->name, "concat dim 2 of a permuted view, rows of 300");
      p->t[0] = tsr_new_tensor(p->g, TSR_F32, 3, (int64_t[]){300, 9, 4});
      struct tsr_tensor *v = tsr_permute(p->g, p->t[0], 0, 2, 1, 3);
      out(p, tsr_concat(p->g, v, v, 2), 0);
    } else {
      tsr_test_fill_normal(p->t[0], 1.0f);
    }
    return;
  }
  if (phase == 0) {
    snprintf(p->name, sizeof p->name, "concat dim %d %s", dim, tsr_dtype_name(dt));
    int64_t na[3] = {16, 5, 3}, nb[3] = {16, 5, 3};
    nb[dim] = 7;
    p->t[0] = tsr_new_tensor(p->g, dt, 3, na);
    p->t[1] = tsr_new_tensor(p->g, dt, 3, nb);
    out(p, tsr_concat(p->g, tsr_permute(p->g, p->t[0], 0, 1, 2, 3), p->t[1], dim), 0);
  } else {
    tsr_test_fill_normal(p->t[0], 1.0f);
    tsr_test_fill_normal(p->t[1], 1.0f);
  }
}

/* cpy: casts into every writable type (quantized bytes must match), a
** dequantizing cast, and a same-type copy of a transposed view. */
static void c_cpy(struct pc *p, int phase) {
  if (phase == 0) {
    struct tsr_graph *g = p->g;
    if (p->var < N_WRITES) {
      enum tsr_dtype dt = k_writes[p->var];
      snprintf(p->name, sizeof p->name, "cpy f32 -> %s", tsr_dtype_name(dt));
      p->t[0] = tsr_new_tensor_3d(g, TSR_F32, 64, 6, 2);
      out(p, tsr_cast(g, tsr_permute(g, p->t[0], 0, 2, 1, 3), dt), 0);
    } else if (p->var == N_WRITES) {
      snprintf(p->name, sizeof p->name, "cpy q4_K -> f32, f16 -> f32");
      struct tsr_tensor *w = ext(p, TSR_Q4_K, 512, 3, 1, 1.0f);
      struct tsr_tensor *h = ext(p, TSR_F16, 64, 5, 1, 1.0f);
      out(p, tsr_cast(g, w, TSR_F32), 0);
      out(p, tsr_cast(g, tsr_transpose(g, h), TSR_F32), 0);
    } else {
      snprintf(p->name, sizeof p->name, "cpy f32 transposed into a cache view");
      struct tsr_tensor *dst = ext(p, TSR_F16, 32, 9, 1, 1.0f);
      p->t[0] = tsr_new_tensor_2d(g, TSR_F32, 4, 32);
      struct tsr_tensor *view = tsr_view(g, dst, 2, (int64_t[]){32, 4}, (size_t[]){2, 64}, 3 * 64);
      out(p, tsr_cpy(g, tsr_transpose(g, p->t[0]), view), 0);
    }
  } else if (p->t[0]) {
    tsr_test_fill_normal(p->t[0], 1.0f);
  }
}

/* set_rows into an external cache of every writable type; a repeated index
** (the last write wins) and one out of range (skipped); per-batch indices. */
static void c_set_rows(struct pc *p, int phase) {
  enum tsr_dtype dt = k_writes[p->var % N_WRITES];
  const bool per_batch = p->var >= N_WRITES;
  if (phase == 0) {
    snprintf(p->name, sizeof p->name, "set_rows into %s%s", tsr_dtype_name(dt),
             per_batch ? " per-batch idx" : "");
    struct tsr_tensor *cache = ext(p, dt, 128, 16, 2, 1.0f);
    p->t[0] = tsr_new_tensor_3d(p->g, TSR_F32, 128, 5, 2);
    p->t[1] = tsr_new_tensor_2d(p->g, TSR_I32, 5, per_batch ? 2 : 1);
    out(p, tsr_set_rows(p->g, cache, p->t[0], p->t[1]), 0);
  } else {
    tsr_test_fill_normal(p->t[0], 1.0f);
    fill_i32(p->t[1], (const int32_t[]){4, 15, 4, 99, 0, 1, 2, 3, 2, -5});
  }
}

static void c_select(struct pc *p, int phase) {
  if (phase == 0) {
    const int64_t n = p->var == 0 ? 128 : 5000;
    snprintf(p->name, sizeof p->name, "top_k %d of %lld, argmax", p->var == 0 ? 8 : 40, (long long)n);
    p->t[0] = tsr_new_tensor_2d(p->g, TSR_F32, n, 6);
    out(p, tsr_top_k(p->g, p->t[0], p->var == 0 ? 8 : 40), 0);
    out(p, tsr_argmax(p->g, p->t[0]), 0);
  } else {
    tsr_test_fill_normal(p->t[0], 1.0f);
    tsr_test_set(p->t[0], 5, 1, 0, 0, NAN); /* NaN ranks below every number */
    tsr_test_set(p->t[0], 2, 3, 0, 0, 100.0);
    tsr_test_set(p->t[0], 7, 3, 0, 0, 100.0); /* a tie: the lower index first */
  }
}

/* flash attention: K x V codecs, head dims, GQA, mask, positions (causal,
** window, empty cells), softcap, decode with split keys and prefill (16 queries
** or more: the tiled kernel). */
static const enum tsr_dtype k_codecs[] = {TSR_F32, TSR_F16, TSR_BF16, TSR_Q8_0, TSR_Q6_0,
                                          TSR_Q5_1, TSR_Q5_0, TSR_Q4_1, TSR_Q4_0};
#define N_CODECS 9
struct fa_case {
  int kc, vc, D, Dv, Hq, Hkv, Nq, Nkv, mask, causal, window;
  float softcap;
  int spare; /* K and V: views of the first Nkv cells of Nkv + spare, as the span reads */
  int gap;   /* cells Nkv / 3 .. Nkv / 3 + gap empty too: whole key tiles that no row sees
             ** between tiles that rows see (a tile's raw copy started ahead goes unused) */
};
static struct fa_case fa_case_of(int var) {
  if (var < N_CODECS) /* every codec on both sides, decode over split keys */
    return (struct fa_case){var, var, 128, 128, 8, 2, 1, 3000, 0, 1, 0, 0, 0, 0};
  static const struct fa_case more[] = {
      {3, 8, 64, 64, 4, 4, 33, 300, 1, 1, 0, 0, 0, 0},    /* q8_0 K, q4_0 V, prefill, mask */
      {1, 4, 256, 256, 8, 1, 17, 700, 0, 1, 128, 0, 0, 0}, /* f16 / q6_0, window, GQA 8 */
      {0, 0, 512, 512, 2, 1, 1, 5000, 0, 1, 0, 0, 0, 0},  /* hd 512 decode */
      {3, 3, 512, 512, 4, 2, 9, 400, 1, 1, 64, 30, 0, 0}, /* hd 512 prefill, window, softcap */
      {1, 1, 192, 128, 4, 2, 5, 90, 1, 0, 0, 50, 0, 0},   /* D != Dv, no causal, softcap */
      {2, 7, 96, 96, 6, 3, 4, 260, 0, 1, 0, 0, 0, 0},     /* bf16 / q4_1 */
      {1, 1, 192, 128, 4, 2, 40, 90, 1, 0, 0, 50, 0, 0},  /* tiled: D != Dv, no causal, softcap */
      {1, 5, 128, 128, 8, 2, 100, 1500, 1, 1, 0, 0, 0, 0}, /* tiled: f16 / q5_1, 47 key tiles */
      {1, 1, 512, 512, 16, 2, 64, 700, 1, 1, 0, 30, 0, 0},   /* tensor cores: D 512, two warps a row */
      {3, 8, 64, 64, 8, 2, 80, 1000, 0, 1, 0, 0, 0, 0},      /* tensor cores: q8_0 / q4_0, D 64 */
      {1, 1, 128, 128, 4, 4, 200, 1000, 1, 0, 0, 0, 0, 0},   /* tensor cores: f16 rows, no causal */
      {2, 3, 256, 256, 8, 2, 70, 2000, 0, 1, 256, 0, 0, 0},  /* tensor cores: bf16 / q8_0, window */
      {1, 2, 72, 72, 4, 2, 50, 700, 1, 1, 0, 0, 0, 0},       /* head dim 72: the f32 tiled kernel */
      {0, 1, 72, 72, 4, 2, 1, 3000, 0, 1, 0, 0, 0, 0},       /* head dim 72 decode, split keys */
      {1, 1, 128, 128, 32, 8, 1, 768, 0, 1, 0, 0, 500, 0}, /* span views: f16 decode */
      {3, 3, 128, 128, 8, 2, 40, 512, 0, 1, 0, 0, 300, 0}, /* span views: q8_0 prefill */
      {3, 8, 512, 512, 16, 2, 64, 700, 0, 1, 0, 0, 0, 0},  /* wide blocks: the 1M profile's K/V */
      {3, 8, 512, 512, 16, 2, 1, 5000, 0, 1, 0, 0, 0, 0},  /* and its decode over split keys */
      {3, 8, 512, 512, 16, 2, 64, 700, 0, 1, 0, 0, 0, 100},  /* wide blocks over empty tiles */
      {3, 8, 512, 512, 16, 2, 1, 5000, 0, 1, 0, 0, 0, 700},  /* its decode: empty splits too */
      {3, 3, 128, 128, 8, 2, 1, 3000, 0, 1, 0, 0, 0, 200},   /* q8_0 raw, 4 warps, decode */
  };
  return more[var - N_CODECS];
}
#define N_FA (N_CODECS + 21)

/* Head dims in steps of 16 go to the tensor-core kernel
** (include/tessera/cuda_attn_mma.cuh): f16 operands, so a looser bound. */
static double fa_tol(const struct fa_case *c) {
  return c->D % 16 == 0 && c->Dv % 16 == 0 ? 5e-3 : 1e-4;
}

static void c_flash_attn(struct pc *p, int phase) {
  struct fa_case c = fa_case_of(p->var);
  if (phase == 0) {
    snprintf(p->name, sizeof p->name, "flash_attn K=%s V=%s D=%d/%d H=%d/%d q=%d kv=%d%s%s%s%s%s",
             tsr_dtype_name(k_codecs[c.kc]), tsr_dtype_name(k_codecs[c.vc]), c.D, c.Dv, c.Hq,
             c.Hkv, c.Nq, c.Nkv, c.mask ? " mask" : "", c.window ? " window" : "",
             c.softcap > 0 ? " softcap" : "", c.spare ? " span views" : "",
             c.gap ? " empty tiles" : "");
    struct tsr_graph *g = p->g;
    p->t[0] = tsr_new_tensor_3d(g, TSR_F32, c.D, c.Nq, c.Hq);
    struct tsr_tensor *k = ext(p, k_codecs[c.kc], c.D, c.Nkv + c.spare, c.Hkv, 1.0f);
    struct tsr_tensor *v = ext(p, k_codecs[c.vc], c.Dv, c.Nkv + c.spare, c.Hkv, 1.0f);
    if (c.spare) { /* heads keep the whole buffer's stride */
      k = tsr_view(g, k, 3, (int64_t[]){c.D, c.Nkv, c.Hkv}, k->nb, 0);
      v = tsr_view(g, v, 3, (int64_t[]){c.Dv, c.Nkv, c.Hkv}, v->nb, 0);
    }
    p->t[1] = c.mask ? tsr_new_tensor_2d(g, TSR_F16, c.Nkv, c.Nq) : NULL;
    p->t[2] = tsr_new_tensor_1d(g, TSR_I32, c.Nq);
    p->t[3] = tsr_new_tensor_1d(g, TSR_I32, c.Nkv);
    struct tsr_attn_params ap = {.scale = 1.0f / sqrtf((float)c.D), .softcap = c.softcap,
                                 .causal = c.causal, .window = c.window};
    out(p, tsr_flash_attn(g, p->t[0], k, v, p->t[1], p->t[2], p->t[3], &ap), fa_tol(&c));
  } else {
    tsr_test_fill_normal(p->t[0], 1.0f);
    if (p->t[1]) {
      tsr_test_fill_uniform(p->t[1], -1.0f, 0.0f);
      for (int64_t j = 0; j < c.Nkv; j += 5) tsr_test_set(p->t[1], j, 0, 0, 0, -INFINITY);
    }
    /* queries at the end of the cache; every 7th cell empty */
    for (int i = 0; i < c.Nq; i++) tsr_test_set(p->t[2], i, 0, 0, 0, c.Nkv - c.Nq + i);
    for (int j = 0; j < c.Nkv; j++) {
      const bool empty = j % 7 == 3 || (j >= c.Nkv / 3 && j < c.Nkv / 3 + c.gap);
      tsr_test_set(p->t[3], j, 0, 0, 0, empty ? -1 : j);
    }
    if (c.Nq > 1) tsr_test_set(p->t[2], 0, 0, 0, 0, -100); /* sees no key: a zero row */
  }
}

/* ---- plugin ops (their cuda kernel libraries) ------------------------------------ */

/* The id of a plugin op the arch plugins registered, or -1 with the case
** named as failing (the plugins did not load). */
static int32_t plugin_op(struct pc *p, const char *name) {
  const int32_t id = tsr_op_registry_find(name);
  if (id < 0) {
    char msg[200];
    snprintf(msg, sizeof msg, "plugin op '%s' is not registered (are the arch plugins built "
             "beside this binary?)", name);
    tsr_graph_fail(p->g, TSR_ERR_UNSUPPORTED, msg);
  }
  return id;
}

static void put_f32(int32_t *word, float f) { memcpy(word, &f, sizeof f); }

/* arch_gemma4.rope_f32: head dims 256 and 512, positions up to 1e6, with
** and without freq factors (1 and 1e30, as proportional RoPE has them). */
static void c_gemma4_rope(struct pc *p, int phase) {
  const int D = p->var / 2 ? 512 : 256, with_ff = p->var % 2, N = 7;
  if (phase == 0) {
    snprintf(p->name, sizeof p->name, "plugin arch_gemma4.rope_f32 D=%d%s", D,
             with_ff ? " freq_factors" : "");
    const int32_t id = plugin_op(p, "arch_gemma4.rope_f32");
    p->t[0] = tsr_new_tensor_3d(p->g, TSR_F32, D, 3, N);
    p->t[1] = tsr_new_tensor_1d(p->g, TSR_I32, N);
    p->t[2] = with_ff ? tsr_new_tensor_1d(p->g, TSR_F32, D / 2) : NULL;
    int32_t params[1];
    put_f32(&params[0], with_ff ? 1000000.0f : 10000.0f);
    struct tsr_tensor *src[3] = {p->t[0], p->t[1], p->t[2]};
    if (id >= 0)
      out(p, tsr_custom_op(p->g, id, 3, p->t[0]->ne, src, with_ff ? 3 : 2, params, 1), 1e-6);
  } else {
    tsr_test_fill_normal(p->t[0], 1.0f);
    fill_i32(p->t[1], (const int32_t[]){0, 1, 17, 160, 4095, 65536, 999999});
    if (p->t[2])
      for (int i = 0; i < D / 2; i++) tsr_test_set(p->t[2], i, 0, 0, 0, i < D / 8 ? 1.0 : 1e30);
  }
}

/* arch_gemma4.ordered_logits: 64 clusters of 64 tokens (a shuffled
** ordering), top 8 and top 40, with tied centroid logits. */
static void c_gemma4_ordered(struct pc *p, int phase) {
  enum { V = 4096, C = 64, N = 3 };
  const int32_t k = p->var ? 40 : 8;
  if (phase == 0) {
    snprintf(p->name, sizeof p->name, "plugin arch_gemma4.ordered_logits top %d of %d", k, C);
    const int32_t id = plugin_op(p, "arch_gemma4.ordered_logits");
    p->t[0] = tsr_new_tensor_2d(p->g, TSR_F32, V, N);
    p->t[1] = tsr_new_tensor_2d(p->g, TSR_F32, C, N);
    p->t[2] = tsr_new_tensor_1d(p->g, TSR_I32, V);
    struct tsr_tensor *src[3] = {p->t[0], p->t[1], p->t[2]};
    if (id >= 0) out(p, tsr_custom_op(p->g, id, 2, p->t[0]->ne, src, 3, &k, 1), 0);
  } else {
    tsr_test_fill_normal(p->t[0], 3.0f);
    tsr_test_fill_normal(p->t[1], 1.0f);
    for (int t = 0; t < N; t++) { /* ties: the lower cluster first */
      tsr_test_set(p->t[1], 5, t, 0, 0, 9.0);
      tsr_test_set(p->t[1], 50, t, 0, 0, 9.0);
      tsr_test_set(p->t[1], 7, t, 0, 0, -0.0);
      tsr_test_set(p->t[1], 9, t, 0, 0, 0.0);
    }
    static int32_t perm[V];
    for (int i = 0; i < V; i++) perm[i] = i;
    for (int i = V - 1; i > 0; i--) {
      const int j = (int)(tsr_test_next() % (uint64_t)(i + 1));
      const int32_t x = perm[i];
      perm[i] = perm[j], perm[j] = x;
    }
    fill_i32(p->t[2], perm);
  }
}

/* arch_qwen.conv1d: without history (zeros before t = 0), and a decode-like
** step with history in and out in the same external memory. */
static void c_qwen_conv1d(struct pc *p, int phase) {
  enum { CH = 96, K = 4 };
  const int hist = p->var, N = hist ? 2 : 9;
  if (phase == 0) {
    snprintf(p->name, sizeof p->name, "plugin arch_qwen.conv1d%s", hist ? " history in place" : "");
    const int32_t id = plugin_op(p, "arch_qwen.conv1d");
    p->t[0] = tsr_new_tensor_2d(p->g, TSR_F32, CH, N);
    p->t[1] = tsr_new_tensor_2d(p->g, TSR_F32, K, CH);
    struct tsr_tensor *h = hist ? ext(p, TSR_F32, K - 1, CH, 1, 1.0f) : NULL;
    struct tsr_tensor *src[4] = {p->t[0], p->t[1], h, h};
    if (id < 0) return;
    out(p, tsr_custom_op(p->g, id, 2, p->t[0]->ne, src, hist ? 4 : 2, NULL, 0), 0);
    if (h) out(p, h, 0); /* the new history, written over the old */
  } else {
    tsr_test_fill_normal(p->t[0], 1.0f);
    tsr_test_fill_normal(p->t[1], 0.5f);
  }
}

/* arch_qwen.delta_rule: zero initial state, key heads tiled; a carried
** state written back, key heads grouped (the KV cache's state slot). */
static void c_qwen_delta(struct pc *p, int phase) {
  enum { DK = 32, HK = 2, DV = 48, HV = 4, N = 5 };
  const int state = p->var;
  if (phase == 0) {
    snprintf(p->name, sizeof p->name, "plugin arch_qwen.delta_rule %s",
             state ? "state written back, grouped" : "zero state, tiled");
    const int32_t id = plugin_op(p, "arch_qwen.delta_rule");
    struct tsr_graph *g = p->g;
    p->t[0] = tsr_new_tensor_3d(g, TSR_F32, DK, HK, N);
    p->t[1] = tsr_new_tensor_3d(g, TSR_F32, DK, HK, N);
    p->t[2] = tsr_new_tensor_3d(g, TSR_F32, DV, HV, N);
    p->t[3] = tsr_new_tensor_2d(g, TSR_F32, HV, N);
    p->t[4] = tsr_new_tensor_2d(g, TSR_F32, HV, N);
    struct tsr_tensor *s0 = state ? ext(p, TSR_F32, DV, HV, DK, 0.3f) : NULL;
    struct tsr_tensor *src[6] = {p->t[0], p->t[1], p->t[2], p->t[3], p->t[4], s0};
    const int32_t params[2] = {state ? 1 : 0, 1};
    if (id < 0) return;
    out(p, tsr_custom_op(g, id, 3, (int64_t[]){DV, HV, N + DK}, src, state ? 6 : 5, params, 2),
        1e-6);
    if (s0) out(p, s0, 1e-6);
  } else {
    tsr_test_fill_normal(p->t[0], 0.3f);
    tsr_test_fill_normal(p->t[1], 0.3f);
    tsr_test_fill_normal(p->t[2], 1.0f);
    tsr_test_fill_uniform(p->t[3], -1.0f, 0.0f);
    tsr_test_fill_uniform(p->t[4], 0.0f, 1.0f);
  }
}

/* ---- refusals and the memory model -------------------------------------------- */

static void check(bool ok, const char *what, const char *detail) {
  if (ok) g_pass++;
  else g_fail++, note_fail(what);
  if (!ok && detail) note_cuda_error(detail);
  printf("%s  %-48s %s\n", ok ? "PASS" : "FAIL", what, detail ? detail : "");
}

static bool refused_naming(struct tsr_graph *g, const char *needle) {
  tsr_status st = tsr_backend_check_graph(g_cuda, g);
  return st == TSR_ERR_UNSUPPORTED && strstr(tsr_error_message(), needle);
}

static void refusals(void) {
  if (g_filter && !strstr("refuses", g_filter)) return;
  struct tsr_graph *g = tsr_graph_new(32);
  static float kbuf[512 * 64], vbuf[64 * 64];
  struct tsr_tensor *q = tsr_new_tensor_3d(g, TSR_F32, 256, 1, 1);
  struct tsr_tensor *k = tsr_new_external(g, TSR_Q4_K, 3, (int64_t[]){256, 8, 1}, kbuf);
  struct tsr_tensor *v = tsr_new_external(g, TSR_F16, 3, (int64_t[]){64, 8, 1}, vbuf);
  struct tsr_attn_params ap = {.scale = 1.0f};
  tsr_flash_attn(g, q, k, v, NULL, NULL, NULL, &ap);
  check(refused_naming(g, "q4_K"), "refuses flash_attn K q4_K by name", tsr_error_message());
  tsr_graph_free(g);

  g = tsr_graph_new(32);
  struct tsr_tensor *cache = tsr_new_external(g, TSR_Q4_K, 3, (int64_t[]){256, 4, 1}, kbuf);
  tsr_set_rows(g, cache, tsr_new_tensor_2d(g, TSR_F32, 256, 1), tsr_new_tensor_1d(g, TSR_I32, 1));
  check(refused_naming(g, "set_rows into"), "refuses set_rows into q4_K by name", tsr_error_message());
  tsr_graph_free(g);

  int32_t id;
  if (tsr_op_registry_add("gpu_test_plugin_op", &id) == TSR_OK) {
    g = tsr_graph_new(32);
    struct tsr_tensor *a = tsr_new_tensor_1d(g, TSR_F32, 8);
    tsr_custom_op(g, id, 1, (int64_t[]){8}, &a, 1, NULL, 0);
    check(refused_naming(g, "gpu_test_plugin_op"), "refuses a plugin op by its name",
          tsr_error_message());
    tsr_graph_free(g);
  }
}

/* One product y = w x (x all ones, 64 columns of w summed per row) plus a
** set_rows of y's first column into cache row idx, on the cuda backend.
** y0 gets y[0] and y_last y[N * (n - 1)]. */
enum { MEM_N = 64 };
static tsr_status mem_round(float *w, float *cache, int64_t n, int32_t idx, double *y0,
                            double *y_last) {
  const int N = MEM_N;
  struct tsr_graph *g = tsr_graph_new(32);
  struct tsr_tensor *wt = tsr_new_external(g, TSR_F32, 2, (int64_t[]){N, N}, w);
  struct tsr_tensor *x = tsr_new_tensor_2d(g, TSR_F32, N, n);
  struct tsr_tensor *y = tsr_mat_mul(g, wt, x);
  struct tsr_tensor *ct = tsr_new_external(g, TSR_F32, 2, (int64_t[]){N, 4}, cache);
  struct tsr_tensor *ix = tsr_new_tensor_1d(g, TSR_I32, 1);
  struct tsr_tensor *sr = tsr_set_rows(g, ct, tsr_view(g, y, 2, (int64_t[]){N, 1},
                                                       (size_t[]){4, (size_t)N * 4}, 0), ix);
  tsr_graph_mark_output(y);
  tsr_graph_mark_output(sr);
  struct tsr_test_graph tg = {.g = g};
  tsr_status st = tsr_test_graph_alloc(&tg);
  for (int64_t i = 0; st == TSR_OK && i < N * n; i++) ((float *)x->data)[i] = 1.0f;
  if (st == TSR_OK) *(int32_t *)ix->data = idx;
  if (st == TSR_OK) st = tsr_backend_compute(g_cuda, g);
  *y0 = st == TSR_OK ? ((float *)y->data)[0] : NAN;
  *y_last = st == TSR_OK ? ((float *)y->data)[N * (n - 1)] : NAN;
  free(tg.arena);
  tsr_graph_free(g);
  return st;
}

static void fill(float *p, int n, float v) {
  for (int i = 0; i < n; i++) p[i] = v;
}

/* Kept ranges: uploaded at first use, then the device copy rules (a host
** rewrite is seen only after sync_to_device; set_rows results reach the host
** only through sync_to_host); forget ends it. Unkept memory: uploaded per
** compute, written bytes come back, and a freed-and-reused address never
** meets an old copy. The arena grows for a larger graph. */
static void memory_model(void) {
  if (g_filter && !strstr("memory", g_filter)) return;
  const int N = MEM_N;
  float *w = malloc(N * N * sizeof *w), *cache = calloc(N * 4, sizeof *cache);
  double expect = 0, y0, yl; /* row 0 of the weight as first uploaded, times ones */
  for (int i = 0; i < N * N; i++) w[i] = (float)(i % 7) - 3.0f;
  for (int k = 0; k < N; k++) expect += (float)(k % 7) - 3.0f;
  tsr_status st = tsr_backend_keep(g_cuda, w, sizeof(float) * N * N);
  if (st == TSR_OK) st = tsr_backend_keep(g_cuda, cache, sizeof(float) * N * 4);
  if (st == TSR_OK) st = mem_round(w, cache, 1, 0, &y0, &yl);
  check(st == TSR_OK && y0 == expect, "memory: first use uploads the kept weight",
        st == TSR_OK ? NULL : tsr_error_message());

  fill(w, N * N, 100.0f); /* the host rewrites it */
  st = mem_round(w, cache, 1, 1, &y0, &yl);
  check(st == TSR_OK && y0 == expect, "memory: kept copy rules after a host rewrite",
        st == TSR_OK ? NULL : tsr_error_message());
  check(cache[0] == 0.0f && cache[N] == 0.0f, "memory: set_rows into kept memory stays on device",
        NULL);
  st = tsr_backend_sync_to_host(g_cuda, cache, sizeof(float) * N * 4);
  check(st == TSR_OK && cache[0] == (float)expect && cache[N] == (float)expect && cache[2 * N] == 0.0f,
        "memory: sync_to_host brings kept cache rows back", st == TSR_OK ? NULL : tsr_error_message());

  st = tsr_backend_sync_to_device(g_cuda, w, sizeof(float) * N * N);
  if (st == TSR_OK) st = mem_round(w, cache, 512, 2, &y0, &yl); /* a larger arena */
  check(st == TSR_OK && y0 == 100.0 * N && yl == 100.0 * N,
        "memory: sync_to_device pushes a rewrite; arena grows", st == TSR_OK ? NULL : tsr_error_message());

  /* half of the cache rewritten on the host: only those bytes are pushed */
  fill(cache + 3 * N, N, 7.0f);
  st = tsr_backend_sync_to_device(g_cuda, cache + 3 * N, sizeof(float) * N);
  if (st == TSR_OK) st = tsr_backend_sync_to_host(g_cuda, cache, sizeof(float) * N * 4);
  check(st == TSR_OK && cache[0] == (float)expect && cache[2 * N] == 100.0f * N && cache[3 * N] == 7.0f,
        "memory: sync_to_device of a sub-range keeps the rest", st == TSR_OK ? NULL : tsr_error_message());

  tsr_backend_forget(g_cuda, w, sizeof(float) * N * N);
  tsr_backend_forget(g_cuda, cache, sizeof(float) * N * 4);
  fill(w, N * N, 2.0f);
  fill(cache, N * 4, 0.0f);
  st = mem_round(w, cache, 1, 3, &y0, &yl);
  check(st == TSR_OK && y0 == 2.0 * N && cache[3 * N] == 2.0f * N && cache[0] == 0.0f,
        "memory: after forget: per-compute upload, writes return", st == TSR_OK ? NULL : tsr_error_message());
  free(w);
  free(cache);

  /* unkept buffers freed and allocated again (glibc hands the same address
  ** back): every compute must see the new bytes */
  bool ok = true;
  st = TSR_OK;
  for (int r = 0; r < 4 && ok; r++) {
    float *w2 = malloc(N * N * sizeof *w2), *c2 = calloc(N * 4, sizeof *c2);
    fill(w2, N * N, (float)(r + 1));
    st = mem_round(w2, c2, 1 + 16 * r, r, &y0, &yl);
    ok = st == TSR_OK && y0 == (r + 1.0) * N && c2[r * N] == (float)((r + 1) * N);
    free(w2);
    free(c2);
  }
  check(ok, "memory: reused host addresses meet no stale copy", st == TSR_OK ? NULL : tsr_error_message());
}

/* ---- the case list, and a child process that runs it ------------------------- */

struct entry {
  case_fn fn; /* NULL: refusals (var 0) or the memory checks (var 1) */
  int var;
};
static struct entry g_cases[512];
static int g_n_cases;

static void add(case_fn fn, int n) {
  for (int v = 0; v < n; v++) g_cases[g_n_cases++] = (struct entry){fn, v};
}

static void list_cases(void) {
  add(c_get_rows, N_WEIGHTS);
  add(c_mat_mul, N_WEIGHTS * N_COLS);
  add(c_mat_mul_long, 24);
  add(c_mat_mul_views, 6);
  add(c_mat_mul_id, 40);
  add(c_elementwise, 8);
  add(c_unary, TSR_UNARY_COUNT);
  add(c_glu, 12);
  add(c_softmax, 3);
  add(c_rope, 4);
  add(c_concat, 7);
  add(c_cpy, N_WRITES + 2);
  add(c_set_rows, 2 * N_WRITES);
  add(c_select, 2);
  add(c_flash_attn, N_FA);
  add(c_gemma4_rope, 4);
  add(c_gemma4_ordered, 2);
  add(c_qwen_conv1d, 2);
  add(c_qwen_delta, 2);
  g_cases[g_n_cases++] = (struct entry){NULL, 0};
  g_cases[g_n_cases++] = (struct entry){NULL, 1};
}

/* What a child tells its parent about case k. */
struct record {
  int k, done, pass, fail, poisoned;
  char first_fail[200];
};

static void run_entry(int k) {
  if (g_cases[k].fn) run_case(g_cases[k].fn, g_cases[k].var);
  else if (g_self) return; /* the cpu refuses nothing and copies nothing */
  else if (g_cases[k].var == 0) refusals();
  else memory_model();
}

static int open_backends(void) {
  if (tsr_backend_cpu_new(0, &g_cpu) != TSR_OK ||
      (g_self ? tsr_backend_cpu_new(1, &g_cuda) : tsr_backend_cuda_new(&g_cuda)) != TSR_OK) {
    printf("FAIL  opening the backends: %s\n", tsr_error_message());
    return 1;
  }
  printf("      cuda backend: %s%s\n", tsr_backend_name(g_cuda),
         g_self ? " (--self: the harness and its cases checked on the cpu alone)" : "");
  return 0;
}

/* Runs cases [start, n) and reports each to fd; exits 3 when the CUDA
** context faulted (the parent restarts after the case), 4 when the backends
** do not open, 0 at the end. */
static int child(int start, int fd) {
  if (open_backends()) return 4;
  for (int k = start; k < g_n_cases; k++) {
    struct record r = {.k = k};
    if (write(fd, &r, sizeof r) != (ssize_t)sizeof r) return 5; /* started */
    int p0 = g_pass, f0 = g_fail;
    g_first_fail[0] = '\0';
    run_entry(k);
    r.done = 1, r.pass = g_pass - p0, r.fail = g_fail - f0, r.poisoned = g_poisoned;
    snprintf(r.first_fail, sizeof r.first_fail, "%s", g_first_fail);
    if (write(fd, &r, sizeof r) != (ssize_t)sizeof r) return 5;
    if (g_poisoned) return 3;
  }
  return 0;
}

static int run_forked(void) {
  int start = 0, pass = 0, fail = 0, restarts = 0;
  char first[200] = "";
  while (start < g_n_cases) {
    int fds[2];
    if (pipe(fds)) return perror("pipe"), 1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return perror("fork"), 1;
    if (pid == 0) {
      close(fds[0]);
      int rc = child(start, fds[1]);
      fflush(stdout);
      _exit(rc);
    }
    close(fds[1]);
    struct record r;
    int started = -1, last_done = start - 1;
    while (read(fds[0], &r, sizeof r) == (ssize_t)sizeof r) {
      if (!r.done) {
        started = r.k;
        continue;
      }
      last_done = r.k;
      pass += r.pass, fail += r.fail;
      if (r.first_fail[0] && !first[0]) snprintf(first, sizeof first, "%s", r.first_fail);
    }
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (rc == 0) break;
    if (rc == 4 || rc == 5) return printf("op parity: could not run\n"), 1;
    if (started > last_done) { /* died inside case `started` */
      fail++;
      char what[120];
      if (WIFSIGNALED(status)) snprintf(what, sizeof what, "signal %d (%s)", WTERMSIG(status),
                                        strsignal(WTERMSIG(status)));
      else snprintf(what, sizeof what, "exit status %d", rc);
      printf("FAIL  case #%d (the one after the last line above) killed the process: %s\n",
             started, what);
      if (!first[0]) snprintf(first, sizeof first, "case #%d (process died)", started);
      start = started + 1;
    } else {
      printf("      (the CUDA context faulted; the next cases run in a fresh process)\n");
      start = last_done + 1;
    }
    if (++restarts > 64) return printf("op parity: too many restarts, stopping\n"), 1;
  }
  printf("op parity: %d passed, %d failed%s%s\n", pass, fail, first[0] ? "; first failure: " : "",
         first);
  return fail ? 1 : 0;
}

int main(int argc, char **argv) {
  bool fork_cases = true;
  int a = 1;
  for (; a < argc && argv[a][0] == '-' && argv[a][1] == '-'; a++) {
    if (!strcmp(argv[a], "--no-fork")) fork_cases = false;
    else if (!strcmp(argv[a], "--self")) g_self = true;
    else return fprintf(stderr, "usage: gpu_op_parity [--no-fork] [--self] [filter]\n"), 2;
  }
  g_filter = a < argc ? argv[a] : NULL;
  /* the arch plugins register their ops (and cuda kernel libraries) as the engine does */
  struct tsr_plugin_host *plugins = NULL;
  if (tsr_plugin_host_new(&plugins) != TSR_OK ||
      tsr_plugin_host_load_providers(plugins, TSR_IFACE_ARCH) != TSR_OK)
    printf("      (arch plugins not loaded: %s; their op cases fail)\n", tsr_error_message());
  (void)tsr_tests_run_, (void)tsr_tests_failed_, (void)tsr_test_failures_; /* harness unused */
  setvbuf(stdout, NULL, _IOLBF, 0);
  setenv("TESSERA_CUDA_SYNC", "1", 0); /* each error names its node; export 0 to time it */
  list_cases();
  if (fork_cases) return run_forked(); /* the plugins stay loaded: the process ends */
  if (open_backends()) return printf("op parity: 0 passed, 1 failed\n"), 1;
  for (int k = 0; k < g_n_cases; k++) run_entry(k);
  printf("op parity: %d passed, %d failed%s%s\n", g_pass, g_fail,
         g_first_fail[0] ? "; first failure: " : "", g_first_fail);
  tsr_backend_free(g_cuda);
  tsr_backend_free(g_cpu);
  if (plugins) tsr_plugin_host_free(plugins);
  return g_fail ? 1 : 0;
}
