/*
** Vector primitives for the CPU kernels. AVX2+FMA versions (AVX-512 VNNI for the
** integer dots) are chosen at run time (the same binary runs on older x86-64); every
** other machine gets the portable loops. Accumulation is always f32.
*/
#ifndef TSR_CPU_VEC_H
#define TSR_CPU_VEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* whether this machine runs the AVX2+FMA+F16C paths (checked once) */
int tsr_cpu_has_avx2(void);

/* sum_i x[i]*y[i] */
float tsr_vec_dot_f32(const float *x, const float *y, int64_t n);
/* The four dots of rows w0, w1 with columns x0, x1 (out: w0.x0, w1.x0, w0.x1, w1.x1),
** each equal bit for bit to tsr_vec_dot_f32's, in half its loads */
void tsr_vec_dot2x2_f32(const float *w0, const float *w1, const float *x0, const float *x1,
                        int64_t n, float out[4]);
/* Rows w[0..n_rows) (1..4) against columns x[0..n_cols) (1..3): out[c * n_rows + r] =
** w[r].x[c], each output summed in one order whatever the block's size (so a product cut
** into blocks any way gives the same values), not tsr_vec_dot_f32's */
#define TSR_VEC_BLOCK_ROWS 4
#define TSR_VEC_BLOCK_COLS 3
void tsr_vec_dot_block_f32(const float *const *w, int n_rows, const float *const *x, int n_cols,
                           int64_t n, float *out);
/* sum_i f16(x[i])*y[i] */
float tsr_vec_dot_f16_f32(const uint16_t *x, const float *y, int64_t n);
/* the same dot over x already converted to f32: tsr_vec_dot_f16_f32(h, y) and
** tsr_vec_dot_f32_as_f16(f32(h), y) are the same bits */
float tsr_vec_dot_f32_as_f16(const float *x, const float *y, int64_t n);
/* out[t] = tsr_vec_dot_f32_as_f16(x[t], y, n) for t < nx (1..3), the same bits, y read once */
#define TSR_VEC_DOTS_MAX 3
void tsr_vec_dots_f32_as_f16(const float *const *x, int nx, const float *y, int64_t n,
                             float *out);
/* y[i] += a*x[i] */
void tsr_vec_axpy_f32(float *y, float a, const float *x, int64_t n);
/* tsr_vec_axpy_f32(y, a[t], x + t * x_stride, n) for t = 0 .. nt-1 in order, skipping a[t] == 0:
** the same bits, y kept in registers over every t */
void tsr_vec_axpy_run_f32(float *y, const float *a, const float *x, size_t x_stride, int64_t nt,
                          int64_t n);
/* y[i] += a*f16(x[i]) */
void tsr_vec_axpy_f16(float *y, float a, const uint16_t *x, int64_t n);
/* y[i] *= a */
void tsr_vec_scale_f32(float *y, float a, int64_t n);
/* x[t] = e^(x[t] - m) for t < n, 0 where x[t] is -inf; returns their sum: the nonzero values
** in 8 lanes by rank (the k-th in lane k % 8, so where hidden keys lie in a tile does not
** change it), then ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)). The exp is the vector
** one of tsr_vec_silu_f32 (within about 2 ulp of expf): every machine, the AVX2 path or not,
** gives the same bits. */
float tsr_vec_exp_sum_f32(float *x, int64_t n, float m);
float tsr_vec_exp_sum_f32_ref(float *x, int64_t n, float m); /* the portable path */
/* y = y sigmoid(y) (SiLU), and GELU's tanh form y sigmoid(2 sqrt(2/pi)(y + 0.044715 y^3)),
** in place, with a vector exp within about 2 ulp of expf; false where the machine has no
** such path (the caller keeps expf) */
bool tsr_vec_silu_f32(float *y, int64_t n);
bool tsr_vec_gelu_f32(float *y, int64_t n);

/* sum_i w[i]*y[i] over a row w of n values (whole blocks) of a block type, the codes
** expanded in registers (vec_quant.c) */
typedef float (*tsr_vec_dot_row_fn)(const void *w, const float *y, int64_t n);
/* the kernel for a block type (enum tsr_dtype), or NULL where this machine or type has none */
tsr_vec_dot_row_fn tsr_vec_dot_row(int dtype);

/* A vector quantized for the integer dots (vec_q8.c): blocks of 32 int8 codes q (never
** -128) with scale d, x ~ d q, the codes' sum and the sums of codes 0-15 and 16-31 (as
** floats, exact) and the negated sum of each 4 adjacent codes */
#define TSR_Q8_ACT_BLOCK 32
struct tsr_q8_act {
  float d;
  float sumf;
  float sum16[2];
  int8_t q[TSR_Q8_ACT_BLOCK];
  int32_t nsum4[TSR_Q8_ACT_BLOCK / 4];
};
/* x (n a multiple of 32) as n / 32 blocks: d = amax / 127, q = round(x 127 / amax) (to
** even); a block holding NaN or an infinity is codes 0 and d NaN. The AVX2 path equals the
** reference bit for bit. */
void tsr_vec_quantize_q8(const float *x, int64_t n, struct tsr_q8_act *out);
void tsr_vec_quantize_q8_ref(const float *x, int64_t n, struct tsr_q8_act *out);
/* out[r * n_cols + c] = the sum over row w[r] of n values (whole blocks) of a block type
** times quantized column a[c], for r < n_rows (any) and c < n_cols (1..TSR_Q8_COLS): integer
** sums of 4 values, scaled into 8 f32 lanes (vec_q8.c); a result does not depend on the rows
** and columns beside it */
#define TSR_Q8_COLS 8
#define TSR_Q8_ROWS 4 /* rows a caller hands over at once, where it has them */
typedef void (*tsr_vec_dot_q8_fn)(const void *const *w, int n_rows,
                                  const struct tsr_q8_act *const *a, int n_cols, int64_t n,
                                  float *out);
/* the kernel for a block type (q4_0, q4_1, q5_0, q5_1, q8_0, q2_K-q6_K; the widest
** instruction set the machine has: AVX-512 VNNI, AVX2, else the reference), or NULL for any
** other type */
tsr_vec_dot_q8_fn tsr_vec_dot_q8(int dtype);
/* the kernel on one instruction set, or NULL where this machine lacks it (the tests compare
** each against the reference); every one gives the same bits */
enum tsr_q8_isa { TSR_Q8_ISA_REF, TSR_Q8_ISA_AVX2, TSR_Q8_ISA_VNNI, TSR_Q8_ISA_COUNT };
tsr_vec_dot_q8_fn tsr_vec_dot_q8_isa(int dtype, enum tsr_q8_isa isa);
/* Rows expanded once for the many columns of a prefill (the AVX-512 VNNI kernels): each 32
** values' codes as unsigned bytes (a signed type's plus its bias), the scales of lanes 0-3
** and 4-7, and the offset (q2_K: the offsets of its two halves) */
struct tsr_q8_xblock {
  uint8_t u[TSR_Q8_ACT_BLOCK];
  float s[2];
  float offs;
  float offs2;
};
/* a row of n values of a block type as n / 32 xblocks */
typedef void (*tsr_vec_q8_expand_fn)(const void *w, int64_t n, struct tsr_q8_xblock *out);
/* the expander of a type and the kernel over rows so expanded (tsr_vec_dot_q8_fn's contract, w[r]
** a row's xblocks; the same bits as tsr_vec_dot_q8's), or NULL where this machine has none */
tsr_vec_q8_expand_fn tsr_vec_q8_expander(int dtype);
tsr_vec_dot_q8_fn tsr_vec_dot_q8x(int dtype);
/* the portable reference of every type's kernel, one column: the same bits */
float tsr_vec_dot_q8_ref(int dtype, const void *w, const struct tsr_q8_act *a, int64_t n);

#endif
