/*
** Vector primitives for the CPU kernels. AVX2+FMA versions are chosen at
** run time (the same binary runs on older x86-64); every other machine gets
** the portable loops. Accumulation is always f32.
*/
#ifndef TSR_CPU_VEC_H
#define TSR_CPU_VEC_H

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
/* y[i] += a*x[i] */
void tsr_vec_axpy_f32(float *y, float a, const float *x, int64_t n);
/* y[i] += a*f16(x[i]) */
void tsr_vec_axpy_f16(float *y, float a, const uint16_t *x, int64_t n);
/* y[i] *= a */
void tsr_vec_scale_f32(float *y, float a, int64_t n);

/* sum_i w[i]*y[i] over a row w of n values (whole blocks) of a block type, the codes
** expanded in registers (vec_quant.c) */
typedef float (*tsr_vec_dot_row_fn)(const void *w, const float *y, int64_t n);
/* the kernel for a block type (enum tsr_dtype), or NULL where this machine or type has none */
tsr_vec_dot_row_fn tsr_vec_dot_row(int dtype);

#endif
