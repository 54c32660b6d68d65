/*
** The integer tensor-core product's fragments (mmq.cuh), run on the CPU: a warp's 32 lanes
** take their parts of 16 weight rows (mmq_part_of) and their words of 8 columns of x
** codes, an emulated mma (m16n8k32 .s8 for one-scale types, two m16n8k16 for q6_K; the
** PTX ISA's layouts, written out here apart from the helpers) multiplies them, and
** mmq_scaled turns each chunk's integer sums into f32. Each of the 128 results must be
** the sum over chunks of the gemv's x8_dot (itself checked against dq in
** test_cuda_quant.cu) to f32 summation, for q4_0, q8_0, q4_K (4-byte and 2-byte loads)
** and q6_K, x's words read as the kernels code them (mmq_code_at: lane t's 8 bytes are
** words t and 4 + t); and each lane's weight words must be x8_decode's words t and 4 + t. tests/gpu/
** gpu_op_parity runs the kernel itself on a GPU.
*/
#include <math.h>
#include <string.h>

extern "C" {
#include "graph/dtype.h"
#include "harness.h"
}
#include "mmq.cuh"

enum { ROWS = MMQ_ROWS, COLS = MMQ_COLS, KMAX = 1024 };

static int8_t byte_of(int w, int i) { return (int8_t)(w >> 8 * i); }

/* c[lane][e] += A B over one k-step of `kw` words (8: m16n8k32; 4: m16n8k16) from each
** lane's A words a[lane][0..kw/2) and B words b[lane][0..kw/4). Layout: A word r of a lane
** (4g + t) holds row g + 8 (r % 2), k bytes 4t + 16 (r / 2) ..; B word r holds k 4t + 16 r
** .., column g; C e holds row g + 8 (e / 2), column 2t + e % 2. */
static void mma_s8_emulated(int c[32][4], const int a[32][4], const int b[32][2], int kw) {
  int A[ROWS][32], B[32][COLS];
  for (int lane = 0; lane < 32; lane++) {
    const int g = lane / 4, t = lane % 4;
    for (int r = 0; r < kw / 2; r++)
      for (int i = 0; i < 4; i++) A[g + 8 * (r % 2)][4 * t + 16 * (r / 2) + i] = byte_of(a[lane][r], i);
    for (int r = 0; r < kw / 4; r++)
      for (int i = 0; i < 4; i++) B[4 * t + 16 * r + i][g] = byte_of(b[lane][r], i);
  }
  for (int lane = 0; lane < 32; lane++) {
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; e++) {
      const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
      for (int k = 0; k < 4 * kw; k++) c[lane][e] += A[row][k] * B[k][col];
    }
  }
}

/* Rows [ROWS, K] of type T from normal values; x [COLS, K] coded by x8_block. */
template <int T>
static void tile_matches(int64_t K, int wide) {
  static float v[ROWS * KMAX], x[COLS * KMAX];
  static char rows[ROWS * KMAX * 2];
  static int8_t xq[COLS * KMAX];
  static float xd[COLS][KMAX / 32];
  static int xs[COLS][KMAX / 32];
  for (int i = 0; i < ROWS * K; i++) v[i] = tsr_test_normal() * (i % 53 == 0 ? 6.0f : 1.0f);
  for (int i = 0; i < COLS * K; i++) x[i] = tsr_test_normal();
  const size_t rb = tsr_dtype_row_size((enum tsr_dtype)T, K);
  for (int r = 0; r < ROWS; r++)
    CHECK_OK(tsr_dtype_from_f32((enum tsr_dtype)T, v + r * K, rows + r * rb, K));
  const int64_t nc = K / 32;
  for (int n = 0; n < COLS; n++)
    for (int64_t c = 0; c < nc; c++) xd[n][c] = x8_block(x + n * K + 32 * c, xq + n * K + 32 * c, &xs[n][c]);
  const uint8_t *row = reinterpret_cast<const uint8_t *>(rows);
  float acc[32][4] = {{0}};
  int bad_words = 0;
  for (int64_t c = 0; c < nc; c++) {
    int a[32][4], b[32][2], hi_b[32], lo[32][4] = {{0}}, hi[32][4] = {{0}};
    struct mmq_part pa[32], pb[32];
    for (int lane = 0; lane < 32; lane++) {
      const int g = lane / 4, t = lane % 4;
      mmq_part_of<T>(row + g * rb, c, t, wide, &pa[lane]);
      mmq_part_of<T>(row + (g + 8) * rb, c, t, wide, &pb[lane]);
      struct x8_chunk ref;
      x8_decode<T>(row + g * rb, c, &ref);
      bad_words += ref.q[t] != pa[lane].lo || ref.q[4 + t] != pa[lane].hi;
      /* lane t's 8 bytes of column g's chunk as the kernels code it */
      int8_t coded[32];
      for (int i = 0; i < 32; i++) coded[mmq_code_at(i)] = xq[g * K + 32 * c + i];
      int xw[2];
      memcpy(xw, coded + 8 * t, 8);
      if (T == T_Q6_K) {
        a[lane][0] = pa[lane].lo, a[lane][1] = pb[lane].lo, b[lane][0] = xw[0];
        hi_b[lane] = xw[1];
      } else {
        a[lane][0] = pa[lane].lo, a[lane][1] = pb[lane].lo;
        a[lane][2] = pa[lane].hi, a[lane][3] = pb[lane].hi;
        b[lane][0] = xw[0], b[lane][1] = xw[1];
      }
    }
    if (T == T_Q6_K) {
      mma_s8_emulated(lo, a, b, 4);
      for (int lane = 0; lane < 32; lane++) {
        a[lane][0] = pa[lane].hi, a[lane][1] = pb[lane].hi;
        b[lane][0] = hi_b[lane];
      }
      mma_s8_emulated(hi, a, b, 4);
    } else {
      mma_s8_emulated(lo, a, b, 8);
    }
    for (int lane = 0; lane < 32; lane++)
      for (int e = 0; e < 4; e++) {
        const int col = 2 * (lane % 4) + e % 2;
        const struct mmq_part *p = e / 2 ? &pb[lane] : &pa[lane];
        acc[lane][e] += mmq_scaled<T>(p, lo[lane][e], hi[lane][e], xd[col][c], xs[col][c]);
      }
  }
  CHECK_MSG(bad_words == 0, "%s: %d lanes' words differ from x8_decode's",
            tsr_dtype_name((enum tsr_dtype)T), bad_words);
  int bad = 0;
  double worst = 0;
  for (int lane = 0; lane < 32; lane++)
    for (int e = 0; e < 4; e++) {
      const int r = lane / 4 + 8 * (e / 2), col = 2 * (lane % 4) + e % 2;
      double ref = 0, mag = 0;
      for (int64_t c = 0; c < nc; c++) {
        struct x8_chunk w;
        x8_decode<T>(row + r * rb, c, &w);
        const float d = x8_dot<T>(&w, reinterpret_cast<const int *>(xq + col * K + 32 * c), xd[col][c],
                                  xs[col][c]);
        ref += d, mag += fabs(d);
      }
      const double err = fabs(acc[lane][e] - ref) / (mag > 0 ? mag : 1);
      worst = err > worst ? err : worst;
      bad += !(err <= 4e-6);
    }
  CHECK_MSG(bad == 0, "%s K=%lld wide=%d: %d of 128 sums differ from x8_dot's, worst %.3g",
            tsr_dtype_name((enum tsr_dtype)T), (long long)K, wide, bad, worst);
}

static void every_type_tile_is_the_gemvs_sums(void) {
  for (int64_t K : {256, 1024}) {
    tile_matches<T_Q4_0>(K, 0);
    tile_matches<T_Q8_0>(K, 0);
    tile_matches<T_Q4_K>(K, 0);
    tile_matches<T_Q4_K>(K, 1);
    tile_matches<T_Q6_K>(K, 0);
  }
}

int main(void) {
  TSR_RUN(every_type_tile_is_the_gemvs_sums);
  return TSR_TEST_EXIT();
}
