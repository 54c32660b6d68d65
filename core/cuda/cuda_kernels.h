/*
** What the host half of the CUDA backend (C) asks of the kernels (CUDA C++).
**
** A kernel sees a tensor as struct cu_t: its device address, dtype id (the
** core's enum tsr_dtype values), ne and byte strides, exactly as the CPU
** kernel sees the tsr_tensor. Every launcher enqueues on the given stream and
** returns cudaGetLastError() as an int (0 = success); the caller turns a
** failure into an error naming the op, file and line.
*/
#ifndef TSR_CUDA_KERNELS_H
#define TSR_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cu_t {
  char *p;
  int32_t type;
  int64_t ne[4];
  int64_t nb[4];
};

typedef struct CUstream_st *cu_stream;

/* ---- elementwise and row ops (kernels_ops.cu) --------------------------- */
enum cu_map { CU_MAP_SCALE, CU_MAP_UNARY, CU_MAP_SOFTCAP };

int cu_get_rows(cu_stream s, const struct cu_t *dst, const struct cu_t *a, const struct cu_t *idx);
int cu_binary(cu_stream s, const struct cu_t *dst, const struct cu_t *a, const struct cu_t *b,
              int mul);
int cu_map(cu_stream s, const struct cu_t *dst, const struct cu_t *a, enum cu_map m, int unary_op,
           float p);
int cu_glu(cu_stream s, const struct cu_t *dst, const struct cu_t *a, const struct cu_t *up,
           int op, int swapped);
/* l2 != 0: x / sqrt(sum(x^2) + eps); else rms norm times w (may be NULL) */
int cu_norm(cu_stream s, const struct cu_t *dst, const struct cu_t *a, const struct cu_t *w,
            float eps, int l2);
int cu_softmax(cu_stream s, const struct cu_t *dst, const struct cu_t *a, const struct cu_t *mask,
               float scale);
int cu_rope(cu_stream s, const struct cu_t *dst, const struct cu_t *a, const struct cu_t *pos,
            const struct cu_t *ff, int n_rot, int neox, float base, float freq_scale);
int cu_concat(cu_stream s, const struct cu_t *dst, const struct cu_t *a, const struct cu_t *b,
              int dim);
int cu_cpy(cu_stream s, const struct cu_t *dst, const struct cu_t *a);
int cu_set_rows(cu_stream s, const struct cu_t *dst, const struct cu_t *src, const struct cu_t *idx);
int cu_top_k(cu_stream s, const struct cu_t *dst, const struct cu_t *a, int k);
int cu_argmax(cu_stream s, const struct cu_t *dst, const struct cu_t *a);

/* Dtypes the device can read element by element (dequantize) and write
** (quantize, for cpy and set_rows). Both are decided here, next to the code. */
int cu_can_read(int32_t type);
int cu_can_write(int32_t type);

/* ---- matrix products (kernels_matmul.cu) -------------------------------- */
/* Rows [0, rows) of weight w (row stride wnb1 bytes, K values each) as f16
** (half != 0) or f32, packed [K, rows]. */
int cu_dequant_rows(cu_stream s, void *out, int half, const char *w, int32_t type, int64_t K,
                    int64_t rows, int64_t wnb1);
/* x (f32, strides nb0/nb1 in bytes, K x N) packed into out as f16, bf16 or f32
** (to: 0 f32, 1 f16, 2 bf16). f16 saturates at +-65504 instead of becoming inf. */
int cu_pack_x(cu_stream s, void *out, int to, const char *x, int64_t nb0, int64_t nb1, int64_t K,
              int64_t N);
/* y[m + n*ldy] = sum_k w[m][k] * x[k + n*ldx] for n < N <= CU_GEMV_MAX_N (x packed f32). */
#define CU_GEMV_MAX_N 16
int cu_gemv(cu_stream s, float *y, int64_t ldy, const char *w, int32_t type, int64_t K, int64_t M,
            int64_t wnb1, const float *x, int64_t ldx, int64_t N);
/* The same product with x coded to 8 bits per 32 values (tessera/cuda_quant.cuh,
** x8_block) and integer dots, for the weight types and row lengths (whole chunks, one at
** least) cu_gemv_x8_supports; scratch:
** cu_gemv_x8_scratch(K, N) bytes, 16-byte aligned, for the codes. */
int cu_gemv_x8_supports(int32_t type, int64_t K);
size_t cu_gemv_x8_scratch(int64_t K, int64_t N);
int cu_gemv_x8(cu_stream s, void *scratch, float *y, int64_t ldy, const char *w, int32_t type,
               int64_t K, int64_t M, int64_t wnb1, const float *x, int64_t ldx, int64_t N);
/* mat_mul_id with few pairs on the same path: x [K, 1 or U, T] f32 with packed rows and
** slots (x->nb[0] 4, nb[2] = nb[1] ne[1]); scratch cu_gemv_x8_scratch(K, ne[1] ne[2]). */
int cu_mat_mul_id_x8(cu_stream s, void *scratch, const struct cu_t *dst, const struct cu_t *w,
                     const struct cu_t *x, const struct cu_t *ids);
/* The same products on integer tensor cores (mmq.cuh) for any column count (the
** backend takes it from CU_MMQ_MIN_N to CU_MMQ_MAX_N columns: below, the gemv reads each
** weight once in less time); n_sm: the device's multiprocessors. */
#define CU_MMQ_MIN_N 2
#define CU_MMQ_MAX_N 64
/* bytes of scratch (16-byte aligned): x's codes, and partial sums where K is split */
size_t cu_mmq_scratch(int64_t K, int64_t M, int64_t N, int n_sm);
int cu_mmq(cu_stream s, void *scratch, float *y, int64_t ldy, const char *w, int32_t type,
           int64_t K, int64_t M, int64_t wnb1, const float *x, int64_t ldx, int64_t N, int n_sm);
/* mat_mul_id of any number of pairs on them, nothing read back to the host: the pairs
** are grouped by expert on the device, then one launch multiplies every expert's tiles.
** x as cu_mat_mul_id_x8 takes it; scratch cu_mmq_id_scratch(K, pairs, E). */
#define CU_MMQ_MAX_EXPERTS 8192
int cu_mmq_id_supports(int32_t type, int64_t K, int64_t E, int64_t np);
size_t cu_mmq_id_scratch(int64_t K, int64_t np, int64_t E);
int cu_mmq_id(cu_stream s, void *scratch, const struct cu_t *dst, const struct cu_t *w,
              const struct cu_t *x, const struct cu_t *ids);
/* mat_mul_id for few pairs: every (row, pair) reads its expert id on the device. */
int cu_mat_mul_id_direct(cu_stream s, const struct cu_t *dst, const struct cu_t *w,
                         const struct cu_t *x, const struct cu_t *ids);
/* Columns of x for pairs list[0..n) (p = u + U*t) packed into out f32 [K, n]. */
int cu_gather_pairs(cu_stream s, float *out, const struct cu_t *x, const int32_t *list, int64_t n,
                    int64_t nu);
/* Column c of y [M, n] into dst at pair list[c]. */
int cu_scatter_pairs(cu_stream s, const struct cu_t *dst, const float *y, const int32_t *list,
                     int64_t n, int64_t nu);

/* ---- attention (kernels_attn.cu) ---------------------------------------- */
struct cu_attn {
  struct cu_t q, k, v, mask, q_pos, kv_pos; /* p == NULL when absent */
  float scale, softcap;
  int causal;
  int32_t window;
  int pipelined; /* backend.attention.pipeline: tsr_tile_args.pipelined */
  int gqa_decode; /* backend.attention.decode (0, 1, 2): tsr_tile_args.gqa_decode */
  int split_keys; /* backend.attention.split_keys: tsr_tile_args.split_keys */
  int f32;        /* backend.precision f32: tsr_tile_args.f32 */
  /* decode parameters (tsr_tile_args.skip_below, sink, recent, counters); 0: none */
  float skip_below;
  int32_t sink, recent;
  unsigned long long *counters;
};
/* Scratch bytes the launch needs (split-KV partials); 0 if none. */
size_t cu_flash_attn_scratch(const struct cu_t *dst, const struct cu_attn *a, int n_sm);
/* *tiled_refused: the error of a tiled launch that was refused (the per-query kernel
** then ran), else 0 */
int cu_flash_attn(cu_stream s, const struct cu_t *dst, const struct cu_attn *a, void *scratch,
                  int n_sm, int *tiled_refused);
/* Largest head dim the kernel holds in registers. */
#define CU_ATTN_MAX_D 512

#ifdef __cplusplus
}
#endif

#endif
