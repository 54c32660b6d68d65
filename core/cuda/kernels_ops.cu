/*
** Elementwise and row kernels of the CUDA backend: the semantics of
** core/cpu/ops_elementwise.c, ops_norm.c, ops_copy.c and get_rows in
** ops_matmul.c, read through the same byte strides (views need no copy).
**
** Elementwise ops give a thread one destination element (grid-stride
** loops); row ops (norms, softmax, top_k, argmax) give a block one row and
** reduce in shared memory. Sums of squares and softmax denominators are
** accumulated in double, as the CPU does.
*/
#include <cuda_runtime.h>
#include <math.h>

#include "cuda_kernels.h"
#include "cuda_launch.cuh"
#include "tessera/cuda_quant.cuh"

__device__ static inline char *at(const cu_t &t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return t.p + i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}

/* Flat index (i0 fastest) into coordinates of t's shape. */
__device__ static inline void unflat(const cu_t &t, int64_t f, int64_t *i) {
  i[0] = f % t.ne[0];
  f /= t.ne[0];
  i[1] = f % t.ne[1];
  f /= t.ne[1];
  i[2] = f % t.ne[2];
  i[3] = f / t.ne[2];
}

__device__ static inline float ldf(const char *p) { return *reinterpret_cast<const float *>(p); }

static int64_t nel(const cu_t *t) { return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; }
static int64_t nrows(const cu_t *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }

/* ---- activations (the CPU's formulas) ----------------------------------- */

__device__ static inline float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ static inline float activate(int op, float x) {
  switch (op) {
  case 0: return x * sigmoid_f(2.0f * 0.7978845608028654f * (x + 0.044715f * x * x * x)); /* gelu */
  case 1: return x * sigmoid_f(x);                       /* silu */
  case 2: return sigmoid_f(x);                           /* sigmoid */
  case 3: return x > 20.0f ? x : log1pf(expf(x));        /* softplus */
  case 4: return tanhf(x);
  case 5: return x > 0.0f ? x : 0.0f;                    /* relu */
  case 6: return -x;
  case 7: return expf(x);
  default: return x;
  }
}

/* ---- block reductions ----------------------------------------------------- */

__device__ static double block_sum(double v, double *sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  __syncthreads();
  if (l == 0) sh[w] = v;
  __syncthreads();
  double s = 0.0;
  for (int i = 0; i < (int)blockDim.x / 32; i++) s += sh[i];
  return s;
}

__device__ static float block_max(float v, float *sh) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  __syncthreads();
  if (l == 0) sh[w] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int i = 0; i < (int)blockDim.x / 32; i++) m = fmaxf(m, sh[i]);
  return m;
}

/* ---- get_rows --------------------------------------------------------------- */

__global__ void k_get_rows(cu_t dst, cu_t a, cu_t idx) {
  const int64_t k = a.ne[0], n = idx.ne[0];
  FOR_EACH(f, k * n * idx.ne[1]) {
    const int64_t i0 = f % k, i = (f / k) % n, b = f / (k * n);
    const int32_t row = *reinterpret_cast<const int32_t *>(idx.p + i * idx.nb[0] + b * idx.nb[1]);
    float v = 0.0f; /* an index outside [0, R) gives a zero row, as on the CPU */
    if (row >= 0 && row < a.ne[1]) v = dq_rt(a.type, a.p + row * a.nb[1] + b * a.nb[2], i0, a.nb[0]);
    *reinterpret_cast<float *>(at(dst, i0, i, b, 0)) = v;
  }
}

extern "C" int cu_get_rows(cu_stream s, const cu_t *dst, const cu_t *a, const cu_t *idx) {
  k_get_rows<<<grid_for(nel(dst)), NT, 0, s>>>(*dst, *a, *idx);
  return (int)cudaGetLastError();
}

/* ---- add, mul, scale, unary, softcap, glu ------------------------------------- */

__global__ void k_binary(cu_t dst, cu_t a, cu_t b, int mul) {
  FOR_EACH(f, dst.ne[0] * dst.ne[1] * dst.ne[2] * dst.ne[3]) {
    int64_t i[4];
    unflat(dst, f, i);
    const float x = ldf(at(a, i[0], i[1], i[2], i[3]));
    const float y = ldf(at(b, i[0] % b.ne[0], i[1] % b.ne[1], i[2] % b.ne[2], i[3] % b.ne[3]));
    *reinterpret_cast<float *>(at(dst, i[0], i[1], i[2], i[3])) = mul ? x * y : x + y;
  }
}

extern "C" int cu_binary(cu_stream s, const cu_t *dst, const cu_t *a, const cu_t *b, int mul) {
  k_binary<<<grid_for(nel(dst)), NT, 0, s>>>(*dst, *a, *b, mul);
  return (int)cudaGetLastError();
}

__global__ void k_map(cu_t dst, cu_t a, int m, int op, float p) {
  const float inv = 1.0f / p;
  FOR_EACH(f, dst.ne[0] * dst.ne[1] * dst.ne[2] * dst.ne[3]) {
    int64_t i[4];
    unflat(dst, f, i);
    const float x = ldf(at(a, i[0], i[1], i[2], i[3]));
    float y;
    if (m == CU_MAP_SCALE) y = x * p;
    else if (m == CU_MAP_UNARY) y = activate(op, x);
    else y = p * tanhf(x * inv);
    *reinterpret_cast<float *>(at(dst, i[0], i[1], i[2], i[3])) = y;
  }
}

extern "C" int cu_map(cu_stream s, const cu_t *dst, const cu_t *a, enum cu_map m, int unary_op,
                      float p) {
  k_map<<<grid_for(nel(dst)), NT, 0, s>>>(*dst, *a, (int)m, unary_op, p);
  return (int)cudaGetLastError();
}

/* op(gate) * up: separate tensors, or both halves of src0's row ([gate | up],
** swapped [up | gate]). glu op ids: 0 swiglu, 1 geglu, 2 reglu. */
__global__ void k_glu(cu_t dst, cu_t a, cu_t u, int has_up, int op, int swapped) {
  const int act = op == 0 ? 1 : op == 1 ? 0 : 5;
  const int64_t ne0 = dst.ne[0];
  const int64_t gate_off = !has_up && swapped ? ne0 : 0;
  const int64_t up_off = has_up ? 0 : (swapped ? 0 : ne0);
  const cu_t &ut = has_up ? u : a;
  FOR_EACH(f, dst.ne[0] * dst.ne[1] * dst.ne[2] * dst.ne[3]) {
    int64_t i[4];
    unflat(dst, f, i);
    const float g = activate(act, ldf(at(a, i[0] + gate_off, i[1], i[2], i[3])));
    const float x = ldf(at(ut, i[0] + up_off, i[1], i[2], i[3]));
    *reinterpret_cast<float *>(at(dst, i[0], i[1], i[2], i[3])) = g * x;
  }
}

extern "C" int cu_glu(cu_stream s, const cu_t *dst, const cu_t *a, const cu_t *up, int op,
                      int swapped) {
  cu_t none = {};
  k_glu<<<grid_for(nel(dst)), NT, 0, s>>>(*dst, *a, up ? *up : none, up != NULL, op, swapped);
  return (int)cudaGetLastError();
}

/* ---- rms_norm, l2_norm, softmax: a block per row ------------------------------ */

__global__ void k_norm(cu_t dst, cu_t a, cu_t w, int has_w, float eps, int l2) {
  __shared__ double shd[NT / 32];
  const int64_t r = blockIdx.x, ne0 = dst.ne[0];
  const int64_t i1 = r % dst.ne[1], i2 = (r / dst.ne[1]) % dst.ne[2], i3 = r / (dst.ne[1] * dst.ne[2]);
  const char *x = at(a, 0, i1, i2, i3);
  double ss = 0.0;
  for (int64_t j = threadIdx.x; j < ne0; j += blockDim.x) {
    const double v = ldf(x + j * a.nb[0]);
    ss += v * v;
  }
  ss = block_sum(ss, shd);
  const float sc = l2 ? (float)(1.0 / sqrt(ss + (double)eps))
                      : (float)(1.0 / sqrt(ss / (double)ne0 + (double)eps));
  const char *wr = has_w ? at(w, 0, i1 % w.ne[1], i2 % w.ne[2], i3 % w.ne[3]) : NULL;
  for (int64_t j = threadIdx.x; j < ne0; j += blockDim.x) {
    float y = ldf(x + j * a.nb[0]) * sc;
    if (wr) y = y * ldf(wr + j * w.nb[0]);
    *reinterpret_cast<float *>(at(dst, j, i1, i2, i3)) = y;
  }
}

extern "C" int cu_norm(cu_stream s, const cu_t *dst, const cu_t *a, const cu_t *w, float eps,
                       int l2) {
  cu_t none = {};
  k_norm<<<(unsigned)nrows(dst), NT, 0, s>>>(*dst, *a, w ? *w : none, w != NULL, eps, l2);
  return (int)cudaGetLastError();
}

__device__ static inline float softmax_in(const cu_t &a, const cu_t &m, int has_m, const char *x,
                                          const char *mr, int64_t j, float scale) {
  float v = ldf(x + j * a.nb[0]) * scale;
  if (has_m) {
    const char *p = mr + j * m.nb[0];
    v += m.type == T_F16 ? __half2float(*reinterpret_cast<const __half *>(p)) : ldf(p);
  }
  return v;
}

__global__ void k_softmax(cu_t dst, cu_t a, cu_t m, int has_m, float scale) {
  __shared__ double shd[NT / 32];
  __shared__ float shf[NT / 32];
  const int64_t r = blockIdx.x, ne0 = dst.ne[0];
  const int64_t i1 = r % dst.ne[1], i2 = (r / dst.ne[1]) % dst.ne[2], i3 = r / (dst.ne[1] * dst.ne[2]);
  const char *x = at(a, 0, i1, i2, i3);
  const char *mr = has_m ? at(m, 0, i1, i2 % m.ne[2], i3 % m.ne[3]) : NULL;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < ne0; j += blockDim.x)
    mx = fmaxf(mx, softmax_in(a, m, has_m, x, mr, j, scale));
  mx = block_max(mx, shf);
  if (mx == -INFINITY) { /* fully masked: zeros, never NaN */
    for (int64_t j = threadIdx.x; j < ne0; j += blockDim.x)
      *reinterpret_cast<float *>(at(dst, j, i1, i2, i3)) = 0.0f;
    return;
  }
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < ne0; j += blockDim.x) {
    const float e = expf(softmax_in(a, m, has_m, x, mr, j, scale) - mx);
    *reinterpret_cast<float *>(at(dst, j, i1, i2, i3)) = e;
    sum += e;
  }
  sum = block_sum(sum, shd);
  const float inv = (float)(1.0 / sum);
  for (int64_t j = threadIdx.x; j < ne0; j += blockDim.x)
    *reinterpret_cast<float *>(at(dst, j, i1, i2, i3)) *= inv;
}

extern "C" int cu_softmax(cu_stream s, const cu_t *dst, const cu_t *a, const cu_t *mask,
                          float scale) {
  cu_t none = {};
  k_softmax<<<(unsigned)nrows(dst), NT, 0, s>>>(*dst, *a, mask ? *mask : none, mask != NULL, scale);
  return (int)cudaGetLastError();
}

/* ---- rope: a thread per element; the angle in double as on the CPU ------------ */

__global__ void k_rope(cu_t dst, cu_t a, cu_t pos, cu_t ff, int has_ff, int n_rot, int neox,
                       double base, double freq_scale) {
  const int64_t ne0 = dst.ne[0], half = n_rot / 2;
  FOR_EACH(f, dst.ne[0] * dst.ne[1] * dst.ne[2]) {
    const int64_t j = f % ne0, i1 = (f / ne0) % dst.ne[1], i2 = f / (ne0 * dst.ne[1]);
    const char *x = at(a, 0, i1, i2, 0);
    float y;
    if (j >= n_rot) {
      y = ldf(x + j * a.nb[0]);
    } else {
      const int64_t i = neox ? (j < half ? j : j - half) : j / 2;
      const int64_t j0 = neox ? i : 2 * i, j1 = neox ? i + half : 2 * i + 1;
      const int32_t p = *reinterpret_cast<const int32_t *>(pos.p + i2 * pos.nb[0]);
      double theta = (double)p * freq_scale * pow(base, -2.0 * (double)i / n_rot);
      if (has_ff) theta /= ldf(ff.p + i * ff.nb[0]);
      const float c = (float)cos(theta), sn = (float)sin(theta);
      const float x0 = ldf(x + j0 * a.nb[0]), x1 = ldf(x + j1 * a.nb[0]);
      y = j == j0 ? __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn))
                  : __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c));
    }
    *reinterpret_cast<float *>(at(dst, j, i1, i2, 0)) = y;
  }
}

extern "C" int cu_rope(cu_stream s, const cu_t *dst, const cu_t *a, const cu_t *pos, const cu_t *ff,
                       int n_rot, int neox, float base, float freq_scale) {
  cu_t none = {};
  k_rope<<<grid_for(nel(dst)), NT, 0, s>>>(*dst, *a, *pos, ff ? *ff : none, ff != NULL, n_rot, neox,
                                           (double)base, (double)freq_scale);
  return (int)cudaGetLastError();
}

/* ---- concat, cpy, set_rows --------------------------------------------------- */

__device__ static inline void copy_bytes(char *d, const char *s, int n) {
  if (n == 4) *reinterpret_cast<uint32_t *>(d) = *reinterpret_cast<const uint32_t *>(s);
  else if (n == 2) *reinterpret_cast<uint16_t *>(d) = *reinterpret_cast<const uint16_t *>(s);
  else for (int k = 0; k < n; k++) d[k] = s[k];
}

__global__ void k_concat(cu_t dst, cu_t a, cu_t b, int dim, int ts) {
  FOR_EACH(f, dst.ne[0] * dst.ne[1] * dst.ne[2] * dst.ne[3]) {
    int64_t i[4];
    unflat(dst, f, i);
    char *d = at(dst, i[0], i[1], i[2], i[3]);
    if (i[dim] < a.ne[dim]) {
      copy_bytes(d, at(a, i[0], i[1], i[2], i[3]), ts);
    } else {
      i[dim] -= a.ne[dim];
      copy_bytes(d, at(b, i[0], i[1], i[2], i[3]), ts);
    }
  }
}

extern "C" int cu_concat(cu_stream s, const cu_t *dst, const cu_t *a, const cu_t *b, int dim) {
  k_concat<<<grid_for(nel(dst)), NT, 0, s>>>(*dst, *a, *b, dim, cu_block_bytes(dst->type));
  return (int)cudaGetLastError();
}

/* Address of unit (element, or block) u of t taken in flat order. */
__device__ static inline char *unit_at(const cu_t &t, int64_t u, int bs) {
  const int64_t per = t.ne[0] / bs, r = u / per;
  return t.p + (u % per) * t.nb[0] + (r % t.ne[1]) * t.nb[1] + ((r / t.ne[1]) % t.ne[2]) * t.nb[2] +
         (r / (t.ne[1] * t.ne[2])) * t.nb[3];
}

/* Same dtype: units move as bytes in flat order (block boundaries line up). */
__global__ void k_cpy_same(cu_t dst, cu_t a, int bs, int ts) {
  FOR_EACH(u, dst.ne[0] / bs * dst.ne[1] * dst.ne[2] * dst.ne[3])
    copy_bytes(unit_at(dst, u, bs), unit_at(a, u, bs), ts);
}

/* Element f (flat order) of any readable tensor. */
__device__ static inline float flat_value(const cu_t &a, int64_t f) {
  int64_t i[4];
  unflat(a, f, i);
  return dq_rt(a.type, at(a, 0, i[1], i[2], i[3]), i[0], a.nb[0]);
}

__global__ void k_cpy_plain(cu_t dst, cu_t a) {
  FOR_EACH(f, dst.ne[0] * dst.ne[1] * dst.ne[2] * dst.ne[3])
    st_plain(dst.type, unit_at(dst, f, 1), flat_value(a, f));
}

__global__ void k_cpy_quant(cu_t dst, cu_t a) {
  FOR_EACH(u, dst.ne[0] / 32 * dst.ne[1] * dst.ne[2] * dst.ne[3]) {
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = flat_value(a, u * 32 + j);
    quant_block32(dst.type, x, reinterpret_cast<uint8_t *>(unit_at(dst, u, 32)));
  }
}

extern "C" int cu_cpy(cu_stream s, const cu_t *dst, const cu_t *a) {
  const int bs = cu_block_size(dst->type);
  if (dst->type == a->type)
    k_cpy_same<<<grid_for(nel(dst) / bs), NT, 0, s>>>(*dst, *a, bs, cu_block_bytes(dst->type));
  else if (bs == 1)
    k_cpy_plain<<<grid_for(nel(dst)), NT, 0, s>>>(*dst, *a);
  else
    k_cpy_quant<<<grid_for(nel(dst) / 32), NT, 0, s>>>(*dst, *a);
  return (int)cudaGetLastError();
}

/* set_rows: dst[:, idx[i], b] = src[:, i, b]. When an index repeats, the last
** write in index order wins (as on the CPU): earlier ones are skipped. */
__device__ static inline int32_t idx_at(const cu_t &idx, int64_t i, int64_t b2, int per_batch) {
  return *reinterpret_cast<const int32_t *>(idx.p + i * idx.nb[0] + (per_batch ? b2 : 0) * idx.nb[1]);
}

/* A block a source row (i, b2, b3): whether a later index repeats its row is found once, by
** the block's threads over the indexes after it (each element scanning them alone made a
** ubatch of n rows O(n^2) a unit), then the threads write its units. */
__global__ void k_set_rows(cu_t dst, cu_t src, cu_t idx, int bs) {
  const int64_t n = src.ne[1], nb2 = dst.ne[2], row = blockIdx.x;
  const int64_t i = row % n, b = row / n, b2 = b % nb2, b3 = b / nb2;
  const int per_batch = idx.ne[1] > 1;
  const int32_t r = idx_at(idx, i, b2, per_batch);
  if (r < 0 || r >= dst.ne[1]) return; /* the whole block: one row */
  int later = 0;
  for (int64_t k = i + 1 + threadIdx.x; k < n && !later; k += blockDim.x)
    later = idx_at(idx, k, b2, per_batch) == r;
  if (__syncthreads_or(later)) return;
  const char *s = at(src, 0, i, b2, b3);
  char *d0 = at(dst, 0, r, b2, b3);
  for (int64_t u = threadIdx.x; u < dst.ne[0] / bs; u += blockDim.x) {
    char *d = d0 + u * dst.nb[0];
    if (bs == 1) {
      st_plain(dst.type, d, ldf(s + u * src.nb[0]));
    } else {
      float x[32];
      for (int j = 0; j < 32; j++) x[j] = ldf(s + (u * 32 + j) * src.nb[0]);
      quant_block32(dst.type, x, reinterpret_cast<uint8_t *>(d));
    }
  }
}

extern "C" int cu_set_rows(cu_stream s, const cu_t *dst, const cu_t *src, const cu_t *idx) {
  const int64_t rows = src->ne[1] * dst->ne[2] * dst->ne[3];
  if (rows > 0) k_set_rows<<<(unsigned)rows, NT, 0, s>>>(*dst, *src, *idx, cu_block_size(dst->type));
  return (int)cudaGetLastError();
}

/* ---- top_k, argmax: larger first, NaN below every number, lower index on ties --- */

__device__ static inline bool ranks_above(float va, int32_t ia, float vb, int32_t ib) {
  const bool na = va != va, nb = vb != vb;
  if (na != nb) return nb;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

/* The best element of the row that ranks strictly below (pv, pi) (pi < 0: any). */
__device__ static int32_t best_below(const char *row, int64_t nb0, int64_t n, float pv, int32_t pi,
                                     float *shv, int32_t *shi) {
  float bv = NAN;
  int32_t bi = -1;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = ldf(row + i * nb0);
    if (pi >= 0 && !ranks_above(pv, pi, v, i)) continue;
    if (bi < 0 || ranks_above(v, i, bv, bi)) bv = v, bi = i;
  }
  shv[threadIdx.x] = bv;
  shi[threadIdx.x] = bi;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if ((int)threadIdx.x < w) {
      const float ov = shv[threadIdx.x + w];
      const int32_t oi = shi[threadIdx.x + w];
      if (oi >= 0 && (shi[threadIdx.x] < 0 || ranks_above(ov, oi, shv[threadIdx.x], shi[threadIdx.x])))
        shv[threadIdx.x] = ov, shi[threadIdx.x] = oi;
    }
    __syncthreads();
  }
  const int32_t r = shi[0];
  __syncthreads();
  return r;
}

__global__ void k_top_k(cu_t dst, cu_t a, int k) {
  __shared__ float shv[NT];
  __shared__ int32_t shi[NT];
  const int64_t r = blockIdx.x;
  const int64_t i1 = r % a.ne[1], i2 = (r / a.ne[1]) % a.ne[2], i3 = r / (a.ne[1] * a.ne[2]);
  const char *row = at(a, 0, i1, i2, i3);
  float pv = 0.0f;
  int32_t pi = -1;
  for (int slot = 0; slot < k; slot++) {
    const int32_t b = best_below(row, a.nb[0], a.ne[0], pv, pi, shv, shi);
    if (threadIdx.x == 0) *reinterpret_cast<int32_t *>(at(dst, slot, i1, i2, i3)) = b;
    pv = ldf(row + b * a.nb[0]);
    pi = b;
  }
}

extern "C" int cu_top_k(cu_stream s, const cu_t *dst, const cu_t *a, int k) {
  k_top_k<<<(unsigned)nrows(a), NT, 0, s>>>(*dst, *a, k);
  return (int)cudaGetLastError();
}

__global__ void k_argmax(cu_t dst, cu_t a) {
  __shared__ float shv[NT];
  __shared__ int32_t shi[NT];
  const int64_t r = blockIdx.x;
  const int64_t i1 = r % a.ne[1], i2 = (r / a.ne[1]) % a.ne[2], i3 = r / (a.ne[1] * a.ne[2]);
  const int32_t b = best_below(at(a, 0, i1, i2, i3), a.nb[0], a.ne[0], 0.0f, -1, shv, shi);
  if (threadIdx.x == 0) *reinterpret_cast<int32_t *>(at(dst, i1, i2, i3, 0)) = b;
}

extern "C" int cu_argmax(cu_stream s, const cu_t *dst, const cu_t *a) {
  k_argmax<<<(unsigned)nrows(a), NT, 0, s>>>(*dst, *a);
  return (int)cudaGetLastError();
}

/* ---- what the device reads and writes ----------------------------------------- */

extern "C" int cu_can_read(int32_t t) {
  switch (t) {
  case T_F32: case T_F16: case T_BF16: case T_Q4_0: case T_Q4_1: case T_Q5_0: case T_Q5_1:
  case T_Q8_0: case T_Q6_0: case T_Q2_K: case T_Q3_K: case T_Q4_K: case T_Q5_K: case T_Q6_K:
  case T_Q8_K: return 1;
  default: return 0;
  }
}

extern "C" int cu_can_write(int32_t t) {
  switch (t) {
  case T_F32: case T_F16: case T_BF16: case T_Q4_0: case T_Q4_1: case T_Q5_0: case T_Q5_1:
  case T_Q8_0: case T_Q6_0: return 1;
  default: return 0;
  }
}
