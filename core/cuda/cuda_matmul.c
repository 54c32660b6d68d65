/*
** mat_mul and mat_mul_id on the GPU.
**
** One product y[M,N] = W[K,M]^T x[K,N] goes one of three ways:
**   CU_MMQ_MIN_N <= N <= CU_MMQ_MAX_N with backend.gemv q8 (the default) and
**     q4_0, q8_0, q4_K or q6_K weights (several streams' decode steps, verify
**     batches): integer tensor cores on x coded to 8 bits (cu_mmq), the
**     weights read once for every column;
**   else N <= CU_GEMV_MAX_N (decode, short verify batches): cu_gemv reads the
**     weights in their own type and dots in f32 against f32 x, so decode
**     matches the cpu backend to f32 rounding; with backend.gemv q8 those four
**     types dot with the same 8-bit codes (cu_gemv_x8);
**   larger N: cuBLAS with f32 accumulation. f32 weights: SGEMM on f32 x.
**     f16 / bf16 weights: read in place, x rounded to f16 / bf16. Block types:
**     dequantized to f16 a tile of rows at a time (TILE_ELEMS values), x
**     rounded to f16. backend.gemm f32 makes every batched product f32
**     (dequantized f32 tiles, SGEMM): slower, for telling rounding from bugs.
** Weight batches broadcast over x's dims 2 and 3 as on the CPU.
**
** mat_mul_id with few (slot, token) pairs runs one kernel that reads each
** pair's expert id on the device (with x's slots packed, the q8 gemv's kernel
** per pair for the types it takes, unless backend.gemv is f32). With more pairs,
** backend.gemv q8, backend.gemm f16 and one of the four types, the pairs are
** grouped by expert on the device and one cu_mmq_id launch multiplies every
** expert's columns (nothing waits for the host, so such steps are captured as
** CUDA graphs). Otherwise the ids come to the host (one synchronisation), pairs
** are grouped by expert, and runs of whole experts up to GROUP_COLUMNS columns are
** gathered at once in expert order (and packed for cuBLAS once, when an expert has
** more columns than the gemv takes); each expert multiplies its columns as above,
** and one scatter a run puts them back: a gather, pack and scatter a run, not one of
** each per expert (128 experts made 384 launches of them). An id outside [0, E)
** gives a zero column, as on the CPU.
*/
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

#define TILE_ELEMS ((int64_t)32 << 20) /* a dequantized weight tile: 64 MiB of f16 */
/* Columns of a batched expert product gathered at once (more for one larger expert):
** its scratch stays K x 4096 f32 and packed x whatever the ubatch. */
#define GROUP_COLUMNS 4096

static int64_t unit_bytes(int32_t type) {
  switch (type) {
  case TSR_F32: return 4;
  case TSR_F16: case TSR_BF16: return 2;
  default: return (int64_t)tsr_dtype_type_size((enum tsr_dtype)type);
  }
}

/* x (f32 with strides) as a packed [K, N] buffer of the given kind (0 f32,
** 1 f16, 2 bf16), in place when it already is one. */
static tsr_status x_packed(struct cu_ctx *c, int to, const char *x, int64_t nb0, int64_t nb1,
                           int64_t K, int64_t N, const void **out, int64_t *ld) {
  if (to == 0 && nb0 == 4 && nb1 % 4 == 0 && (N == 1 || nb1 / 4 >= K)) {
    *out = x;
    *ld = N > 1 ? nb1 / 4 : K;
    return TSR_OK;
  }
  void *buf;
  tsr_status st = tsr_cuda_scratch(c, SCR_X, (size_t)(K * N) * (to ? 2 : 4), &buf);
  if (st != TSR_OK) return st;
  CU_LAUNCH(cu_pack_x((cu_stream)c->stream, buf, to, x, nb0, nb1, K, N));
  *out = buf;
  *ld = K;
  return TSR_OK;
}

static tsr_status gemm(struct cu_ctx *c, int64_t M, int64_t N, int64_t K, const void *a,
                       cudaDataType_t at, int64_t lda, const void *b, cudaDataType_t bt,
                       int64_t ldb, float *y, int64_t ldy) {
  const float one = 1.0f, zero = 0.0f;
  CU_BLAS(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)M, (int)N, (int)K, &one, a, at,
                       (int)lda, b, bt, (int)ldb, &zero, y, CUDA_R_32F, (int)ldy,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return TSR_OK;
}

/* Whether a batched product (more than CU_GEMV_MAX_N columns) reads the weight in
** place: f32, and f16 / bf16 unless backend.gemm is f32; block types are
** dequantized to tiles. */
static bool reads_in_place(const struct cu_ctx *c, int32_t type, int64_t wnb1) {
  return (type == TSR_F32 && wnb1 % 4 == 0) ||
         ((type == TSR_F16 || type == TSR_BF16) && wnb1 % 2 == 0 && !c->gemm_f32);
}

/* How a batched product takes x: 0 f32, 1 f16, 2 bf16 (cu_pack_x's kinds): a weight
** read in place against x of its own type, tiles in f16 (f32 with backend.gemm f32). */
static int x_kind(const struct cu_ctx *c, int32_t type, int64_t wnb1) {
  if (reads_in_place(c, type, wnb1)) return type == TSR_F32 ? 0 : type == TSR_F16 ? 1 : 2;
  return c->gemm_f32 ? 0 : 1;
}

/* The batched product y[m + n*ldy] = w . x for x already packed [K, N] (ldx apart) in
** x_kind's kind. */
static tsr_status product_packed(struct cu_ctx *c, float *y, int64_t ldy, const char *w,
                                 int32_t type, int64_t K, int64_t M, int64_t wnb1,
                                 const void *xp, int64_t ldx, int64_t N) {
  const int kind = x_kind(c, type, wnb1);
  const cudaDataType_t dt = kind == 0 ? CUDA_R_32F : kind == 1 ? CUDA_R_16F : CUDA_R_16BF;
  if (reads_in_place(c, type, wnb1))
    return gemm(c, M, N, K, w, dt, wnb1 / unit_bytes(type), xp, dt, ldx, y, ldy);
  const int half = kind == 1;
  int64_t rows = TILE_ELEMS / K;
  if (rows < 1) rows = 1;
  if (rows > M) rows = M;
  void *tile;
  tsr_status st = tsr_cuda_scratch(c, SCR_W, (size_t)(rows * K) * (half ? 2 : 4), &tile);
  if (st != TSR_OK) return st;
  for (int64_t m0 = 0; m0 < M; m0 += rows) {
    const int64_t n_rows = M - m0 < rows ? M - m0 : rows;
    CU_LAUNCH(cu_dequant_rows((cu_stream)c->stream, tile, half, w + m0 * wnb1, type, K, n_rows, wnb1));
    if ((st = gemm(c, n_rows, N, K, tile, dt, K, xp, dt, ldx, y + m0, ldy)) != TSR_OK) return st;
  }
  return TSR_OK;
}

/* Whether a product of N columns runs on cu_mmq. */
static bool takes_mmq(const struct cu_ctx *c, int32_t type, int64_t K, int64_t N) {
  return c->gemv_x8 && N >= CU_MMQ_MIN_N && N <= CU_MMQ_MAX_N && cu_gemv_x8_supports(type, K);
}

/* Whether mat_mul_id of np > MMID_DIRECT_PAIRS pairs runs on cu_mmq_id: x's slots packed
** (x [K, 1 or U, T], f32 rows). */
static bool takes_mmq_id(const struct cu_ctx *c, const struct cu_t *w, const struct cu_t *x,
                         int64_t np) {
  return c->gemv_x8 && !c->gemm_f32 && x->nb[0] == 4 && x->nb[1] % 4 == 0 &&
         x->nb[2] == x->nb[1] * x->ne[1] && cu_mmq_id_supports(w->type, w->ne[0], w->ne[2], np);
}

/* y[m + n*ldy] for one weight matrix w (rows wnb1 bytes apart, packed within
** a row) and x [K, N] with byte strides nb0, nb1. */
static tsr_status product(struct cu_ctx *c, float *y, int64_t ldy, const char *w, int32_t type,
                          int64_t K, int64_t M, int64_t wnb1, const char *x, int64_t xnb0,
                          int64_t xnb1, int64_t N) {
  const void *xp = NULL;
  int64_t ldx = 0;
  tsr_status st;
  if (takes_mmq(c, type, K, N)) {
    void *codes;
    if ((st = x_packed(c, 0, x, xnb0, xnb1, K, N, &xp, &ldx)) != TSR_OK) return st;
    if ((st = tsr_cuda_scratch(c, SCR_XQ, cu_mmq_scratch(K, M, N, c->n_sm), &codes)) != TSR_OK) return st;
    CU_LAUNCH(cu_mmq((cu_stream)c->stream, codes, y, ldy, w, type, K, M, wnb1, xp, ldx, N, c->n_sm));
    return TSR_OK;
  }
  if (N <= CU_GEMV_MAX_N) {
    if ((st = x_packed(c, 0, x, xnb0, xnb1, K, N, &xp, &ldx)) != TSR_OK) return st;
    if (c->gemv_x8 && cu_gemv_x8_supports(type, K)) {
      void *codes;
      if ((st = tsr_cuda_scratch(c, SCR_XQ, cu_gemv_x8_scratch(K, N), &codes)) != TSR_OK)
        return st;
      CU_LAUNCH(cu_gemv_x8((cu_stream)c->stream, codes, y, ldy, w, type, K, M, wnb1, xp, ldx, N));
      return TSR_OK;
    }
    CU_LAUNCH(cu_gemv((cu_stream)c->stream, y, ldy, w, type, K, M, wnb1, xp, ldx, N));
    return TSR_OK;
  }
  if ((st = x_packed(c, x_kind(c, type, wnb1), x, xnb0, xnb1, K, N, &xp, &ldx)) != TSR_OK)
    return st;
  return product_packed(c, y, ldy, w, type, K, M, wnb1, xp, ldx, N);
}

/* A plain-typed weight whose rows are not packed (a transposed view, say)
** is copied packed first: the product kernels read rows element by element. */
static tsr_status packed_weight(struct cu_ctx *c, const struct cu_t *w, struct cu_t *out) {
  *out = *w;
  if (tsr_dtype_block_size((enum tsr_dtype)w->type) > 1 || w->nb[0] == unit_bytes(w->type))
    return TSR_OK;
  const int64_t ts = unit_bytes(w->type);
  void *buf;
  tsr_status st = tsr_cuda_scratch(c, SCR_WPACK, (size_t)(w->ne[0] * w->ne[1] * w->ne[2] * w->ne[3] * ts),
                                   &buf);
  if (st != TSR_OK) return st;
  out->p = buf;
  out->nb[0] = ts;
  for (int d = 1; d < 4; d++) out->nb[d] = out->nb[d - 1] * out->ne[d - 1];
  CU_LAUNCH(cu_cpy((cu_stream)c->stream, out, w));
  return TSR_OK;
}

tsr_status tsr_cuda_mat_mul(struct cu_ctx *c, const struct cu_t *dst, const struct cu_t *w0,
                            const struct cu_t *x) {
  struct cu_t w;
  tsr_status st = packed_weight(c, w0, &w);
  if (st != TSR_OK) return st;
  const int64_t K = w.ne[0], M = w.ne[1], N = x->ne[1];
  const int64_t r2 = x->ne[2] / w.ne[2], r3 = x->ne[3] / w.ne[3];
  for (int64_t i3 = 0; i3 < x->ne[3]; i3++) {
    for (int64_t i2 = 0; i2 < x->ne[2]; i2++) {
      const char *wb = w.p + (i2 / r2) * w.nb[2] + (i3 / r3) * w.nb[3];
      const char *xb = x->p + i2 * x->nb[2] + i3 * x->nb[3];
      float *yb = (float *)(dst->p + i2 * dst->nb[2] + i3 * dst->nb[3]);
      st = product(c, yb, dst->nb[1] / 4, wb, w.type, K, M, w.nb[1], xb, x->nb[0], x->nb[1], N);
      if (st != TSR_OK) return st;
    }
  }
  return TSR_OK;
}

static int32_t id_at(const char *ids, const struct cu_t *t, int64_t u, int64_t tok) {
  int32_t v;
  memcpy(&v, ids + u * t->nb[0] + tok * t->nb[1], sizeof v);
  return v;
}

tsr_status tsr_cuda_mat_mul_id(struct cu_ctx *c, const struct cu_t *dst, const struct cu_t *w0,
                               const struct cu_t *x, const struct cu_t *ids) {
  const int64_t nu = ids->ne[0], np = nu * ids->ne[1], E = w0->ne[2];
  if (np <= MMID_DIRECT_PAIRS) {
    const bool x_packed_slots = x->nb[0] == 4 && x->nb[1] % 4 == 0 &&
                                x->nb[2] == x->nb[1] * x->ne[1];
    if (c->gemv_x8 && x_packed_slots && cu_gemv_x8_supports(w0->type, w0->ne[0])) {
      void *codes;
      tsr_status st = tsr_cuda_scratch(c, SCR_XQ, cu_gemv_x8_scratch(w0->ne[0], x->ne[1] * x->ne[2]),
                                       &codes);
      if (st != TSR_OK) return st;
      CU_LAUNCH(cu_mat_mul_id_x8((cu_stream)c->stream, codes, dst, w0, x, ids));
      return TSR_OK;
    }
    CU_LAUNCH(cu_mat_mul_id_direct((cu_stream)c->stream, dst, w0, x, ids));
    return TSR_OK;
  }
  if (takes_mmq_id(c, w0, x, np)) {
    void *scratch;
    tsr_status st = tsr_cuda_scratch(c, SCR_XQ, cu_mmq_id_scratch(w0->ne[0], np, E),
                                     &scratch);
    if (st != TSR_OK) return st;
    CU_LAUNCH(cu_mmq_id((cu_stream)c->stream, scratch, dst, w0, x, ids));
    return TSR_OK;
  }
  struct cu_t w;
  tsr_status st = packed_weight(c, w0, &w);
  if (st != TSR_OK) return st;
  /* the ids, on the host */
  const size_t span = (size_t)((ids->ne[0] - 1) * ids->nb[0] + (ids->ne[1] - 1) * ids->nb[1]) + 4;
  const size_t need = span + 4 + (size_t)(E + 1 + np) * sizeof(int32_t); /* 4: alignment */
  if (need > c->host_buf_cap) {
    void *b = realloc(c->host_buf, need);
    if (!b) return tsr_error_set(TSR_ERR_NOMEM, "cuda backend: out of host memory");
    c->host_buf = b;
    c->host_buf_cap = need;
  }
  char *hids = c->host_buf;
  int32_t *start = (int32_t *)(hids + ((span + 3) & ~(size_t)3)), *list = start + E + 1;
  CU_RT(cudaMemcpyAsync(hids, ids->p, span, cudaMemcpyDeviceToHost, c->stream));
  CU_RT(cudaStreamSynchronize(c->stream));
  /* counting sort of the pairs by expert; out-of-range ids are left out */
  memset(start, 0, (size_t)(E + 1) * sizeof *start);
  for (int64_t p = 0; p < np; p++) {
    int32_t e = id_at(hids, ids, p % nu, p / nu);
    if (e >= 0 && e < E) start[e + 1]++;
  }
  for (int64_t e = 0; e < E; e++) start[e + 1] += start[e];
  int32_t *cursor = calloc((size_t)E + 1, sizeof *cursor);
  if (!cursor) return tsr_error_set(TSR_ERR_NOMEM, "cuda backend: out of host memory");
  for (int64_t p = 0; p < np; p++) {
    int32_t e = id_at(hids, ids, p % nu, p / nu);
    if (e >= 0 && e < E) list[start[e] + cursor[e]++] = (int32_t)p;
  }
  free(cursor);
  const int64_t n_valid = start[E];
  int32_t *dlist;
  if ((st = tsr_cuda_scratch(c, SCR_LIST, (size_t)(np ? np : 1) * 4, (void **)&dlist)) != TSR_OK)
    return st;
  CU_RT(cudaMemcpyAsync(dlist, list, (size_t)n_valid * 4, cudaMemcpyHostToDevice, c->stream));
  if (n_valid < np) /* zero columns for ids out of range */
    CU_RT(cudaMemsetAsync(dst->p, 0, (size_t)(dst->nb[3] * dst->ne[3]), c->stream));
  if (!n_valid) return TSR_OK;
  /* runs of whole experts of up to GROUP_COLUMNS columns (or one larger expert): each
  ** run's columns gathered at once in expert order, packed for cuBLAS once when an
  ** expert of it is past the gemv's width, multiplied expert by expert, scattered once */
  const int64_t K = w.ne[0], M = w.ne[1];
  int64_t most = GROUP_COLUMNS;
  for (int64_t e = 0; e < E; e++)
    if (start[e + 1] - start[e] > most) most = start[e + 1] - start[e];
  if (most > n_valid) most = n_valid;
  float *gx, *gy;
  if ((st = tsr_cuda_scratch(c, SCR_G, (size_t)(K * most) * 4, (void **)&gx)) != TSR_OK)
    return st;
  if ((st = tsr_cuda_scratch(c, SCR_Y, (size_t)(M * most) * 4, (void **)&gy)) != TSR_OK)
    return st;
  const int kind = x_kind(c, w.type, w.nb[1]);
  for (int64_t e0 = 0, e1; e0 < E; e0 = e1) {
    bool batched = false;
    for (e1 = e0; e1 < E && (e1 == e0 || start[e1 + 1] - start[e0] <= most); e1++)
      batched |= start[e1 + 1] - start[e1] > CU_GEMV_MAX_N;
    const int64_t c0 = start[e0], cols = start[e1] - c0;
    if (!cols) continue;
    CU_LAUNCH(cu_gather_pairs((cu_stream)c->stream, gx, x, dlist + c0, cols, nu));
    const void *xp = NULL;
    int64_t ldx = 0;
    if (batched &&
        (st = x_packed(c, kind, (const char *)gx, 4, K * 4, K, cols, &xp, &ldx)) != TSR_OK)
      return st;
    for (int64_t e = e0; e < e1; e++) {
      const int64_t n = start[e + 1] - start[e], at = start[e] - c0;
      const char *we = w.p + e * w.nb[2];
      if (!n) continue;
      if (n <= CU_GEMV_MAX_N)
        st = product(c, gy + at * M, M, we, w.type, K, M, w.nb[1], (const char *)(gx + at * K), 4,
                     K * 4, n);
      else
        st = product_packed(c, gy + at * M, M, we, w.type, K, M, w.nb[1],
                            (const char *)xp + at * ldx * (kind ? 2 : 4), ldx, n);
      if (st != TSR_OK) return st;
    }
    CU_LAUNCH(cu_scatter_pairs((cu_stream)c->stream, dst, gy, dlist + c0, cols, nu));
  }
  return TSR_OK;
}

/* The cu_t view of a graph tensor's layout (no address: the choices do not look at it). */
static struct cu_t layout_of(const struct tsr_tensor *t) {
  struct cu_t v = {.p = NULL, .type = (int32_t)t->dtype};
  for (int d = 0; d < 4; d++) v.ne[d] = t->ne[d], v.nb[d] = (int64_t)t->nb[d];
  return v;
}

bool tsr_cuda_product_on_device(void *ctx, const struct tsr_tensor *t) {
  const struct cu_ctx *c = ctx;
  const struct cu_t w = layout_of(t->src[0]), x = layout_of(t->src[1]);
  if (t->op == TSR_OP_MAT_MUL)
    return x.ne[1] <= CU_GEMV_MAX_N || takes_mmq(c, w.type, w.ne[0], x.ne[1]);
  const int64_t np = t->src[2]->ne[0] * t->src[2]->ne[1];
  return np <= MMID_DIRECT_PAIRS || takes_mmq_id(c, &w, &x, np);
}
