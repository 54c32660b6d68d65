/*
** The GQA decode kernel's fragments (tessera/cuda_attn_gqa.cuh), run on the CPU: a
** warp's 32 lanes build their K, Q and V fragments with the kernel's own helpers, an
** emulated mma.m16n8k16 and movmatrix (the PTX ISA's fragment layouts, written out
** here apart from the helpers) multiply them, and the products must be Q K^T and P V
** of the decoded values, each key and row, each dim where the store puts it:
**   - every pair of values is dq's value rounded to f16, bit for bit (f16, q8_0, q4_0);
**   - S^T = K Q^T over head dims 128 and 512 within f32 summation;
**   - O^T = V^T P^T, dead keys' values zeroed even where their bytes are NaN;
** and which launches take the kernel (tsr_gqa_decode_fits) and its staged variant. tests/gpu/gpu_op_parity
** runs the kernel itself on a GPU (the default; TESSERA_CUDA_ATTN_GQA_DECODE=1 unstaged).
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "harness.h"
}
#include "tessera/cuda_attn_gqa.cuh"

enum { KEYS = 16, ROWS = 8, MAX_D = 512 };

static float lo_f(uint32_t x) { return __half2float(__ushort_as_half((unsigned short)(x & 0xffff))); }
static float hi_f(uint32_t x) { return __half2float(__ushort_as_half((unsigned short)(x >> 16))); }
static float f16_round(float x) { return __half2float(__float2half_rn(x)); }

static uint32_t rng = 12345u;
static uint32_t next_u32(void) {
  rng ^= rng << 13, rng ^= rng >> 17, rng ^= rng << 5;
  return rng;
}
static float uniform(void) { return (float)(next_u32() >> 8) / 16777216.0f * 2.0f - 1.0f; }

/* c += a b over a warp's fragments: a 16x16 (row-major), b 16x8, c 16x8 */
static void mma_emulated(float c[32][4], const uint32_t a[32][4], const uint32_t b[32][2]) {
  float A[16][16], B[16][8];
  for (int lane = 0; lane < 32; lane++) {
    const int g = lane / 4, t = lane % 4;
    A[g][2 * t] = lo_f(a[lane][0]), A[g][2 * t + 1] = hi_f(a[lane][0]);
    A[g + 8][2 * t] = lo_f(a[lane][1]), A[g + 8][2 * t + 1] = hi_f(a[lane][1]);
    A[g][2 * t + 8] = lo_f(a[lane][2]), A[g][2 * t + 9] = hi_f(a[lane][2]);
    A[g + 8][2 * t + 8] = lo_f(a[lane][3]), A[g + 8][2 * t + 9] = hi_f(a[lane][3]);
    B[2 * t][g] = lo_f(b[lane][0]), B[2 * t + 1][g] = hi_f(b[lane][0]);
    B[2 * t + 8][g] = lo_f(b[lane][1]), B[2 * t + 9][g] = hi_f(b[lane][1]);
  }
  for (int lane = 0; lane < 32; lane++) {
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; e++) {
      const int r = g + 8 * (e / 2), n = 2 * t + e % 2;
      double s = 0;
      for (int k = 0; k < 16; k++) s += (double)A[r][k] * B[k][n];
      c[lane][e] += (float)s;
    }
  }
}

/* movmatrix.m8n8.trans.b16: lane l holds row l / 4, columns 2 (l % 4), +1 */
static void movmatrix_t_emulated(uint32_t out[32], const uint32_t in[32]) {
  uint16_t M[8][8];
  for (int lane = 0; lane < 32; lane++) {
    M[lane / 4][2 * (lane % 4)] = (uint16_t)(in[lane] & 0xffff);
    M[lane / 4][2 * (lane % 4) + 1] = (uint16_t)(in[lane] >> 16);
  }
  for (int lane = 0; lane < 32; lane++) {
    const int r = lane / 4, c = 2 * (lane % 4);
    out[lane] = (uint32_t)M[c][r] | (uint32_t)M[c + 1][r] << 16;
  }
}

/* n rows of d values of type `type`, row stride returned; codes and scales random */
static int64_t random_rows(int type, int n, int d, unsigned char *buf) {
  const int64_t nb1 = type == T_F16 ? 2 * d : d / 32 * cu_block_bytes(type);
  for (int64_t i = 0; i < nb1 * n; i++) buf[i] = (unsigned char)next_u32();
  for (int r = 0; r < n; r++) {
    unsigned char *row = buf + r * nb1;
    if (type == T_F16) {
      for (int e = 0; e < d; e++) {
        const __half h = __float2half_rn(uniform());
        memcpy(row + 2 * e, &h, 2);
      }
      continue;
    }
    for (int blk = 0; blk < d / 32; blk++) { /* a finite scale */
      const __half h = __float2half_rn(0.01f + 0.05f * fabsf(uniform()));
      memcpy(row + blk * cu_block_bytes(type), &h, 2);
    }
  }
  return nb1;
}

static float value_f16(int type, const unsigned char *row, int64_t e) {
  return f16_round(dq_rt(type, reinterpret_cast<const char *>(row), e, 2));
}

static const int types[] = {T_F16, T_Q8_0, T_Q4_0};

/* the helpers are templates on the type (the kernel is compiled a type pair each) */
static uint32_t pair_of(int type, const char *row, int64_t e) {
  return type == T_F16    ? tsr_gqa_pair<T_F16>(row, e)
         : type == T_Q8_0 ? tsr_gqa_pair<T_Q8_0>(row, e)
                          : tsr_gqa_pair<T_Q4_0>(row, e);
}

static void k_frag_of(uint32_t a[4], int type, const char *rg, const char *rg8, int64_t blk, int s,
                      int t) {
  if (type == T_F16) tsr_gqa_k_frag<T_F16>(a, rg, rg8, blk, s, t);
  else if (type == T_Q8_0) tsr_gqa_k_frag<T_Q8_0>(a, rg, rg8, blk, s, t);
  else tsr_gqa_k_frag<T_Q4_0>(a, rg, rg8, blk, s, t);
}

static void v_frag_of(uint32_t a[2][4], int type, const char *const rows[4], const bool live[4],
                      int64_t blk, int g) {
  if (type == T_F16) tsr_gqa_v_frag<T_F16>(a, rows, live, blk, g);
  else if (type == T_Q8_0) tsr_gqa_v_frag<T_Q8_0>(a, rows, live, blk, g);
  else tsr_gqa_v_frag<T_Q4_0>(a, rows, live, blk, g);
}

static void pairs_are_dq_rounded_to_f16(void) {
  alignas(16) static unsigned char rows[KEYS * MAX_D * 2];
  for (int ti = 0; ti < 3; ti++) {
    const int type = types[ti];
    const int64_t nb1 = random_rows(type, KEYS, MAX_D, rows);
    int bad = 0;
    for (int r = 0; r < KEYS; r++)
      for (int64_t e = 0; e < MAX_D; e += 2) {
        const uint32_t p = pair_of(type, reinterpret_cast<const char *>(rows + r * nb1), e);
        const float want_lo = value_f16(type, rows + r * nb1, e);
        const float want_hi = value_f16(type, rows + r * nb1, e + 1);
        bad += lo_f(p) != want_lo || hi_f(p) != want_hi;
      }
    CHECK_MSG(bad == 0, "type %d: %d pairs differ", type, bad);
  }
}

static void k_and_q_fragments_make_q_k(void) {
  alignas(16) static unsigned char rows[KEYS * MAX_D * 2];
  static __half q[ROWS * (MAX_D + 8)];
  const int dims[] = {128, 512};
  for (int di = 0; di < 2; di++)
    for (int ti = 0; ti < 3; ti++) {
      const int D = dims[di], type = types[ti];
      const int64_t ldq = D + 8, nb1 = random_rows(type, KEYS, D, rows);
      for (int r = 0; r < ROWS; r++)
        for (int e = 0; e < ldq; e++) q[r * ldq + e] = __float2half_rn(e < D ? uniform() : 0.0f);
      float c[32][4] = {};
      for (int64_t blk = 0; blk < D / 32; blk++)
        for (int s = 0; s < 2; s++) {
          uint32_t a[32][4], b[32][2];
          for (int lane = 0; lane < 32; lane++) {
            const int g = lane / 4, t = lane % 4;
            k_frag_of(a[lane], type, reinterpret_cast<const char *>(rows + g * nb1),
                      reinterpret_cast<const char *>(rows + (g + 8) * nb1), blk, s, t);
            tsr_gqa_q_frag(b[lane], q, ldq, blk, s, g, t);
          }
          mma_emulated(c, a, b);
        }
      double worst = 0;
      for (int lane = 0; lane < 32; lane++)
        for (int e = 0; e < 4; e++) {
          const int key = lane / 4 + 8 * (e / 2), row = 2 * (lane % 4) + e % 2;
          double want = 0, mag = 0;
          for (int d = 0; d < D; d++) {
            const double p = (double)value_f16(type, rows + key * nb1, d) *
                             __half2float(q[row * ldq + d]);
            want += p, mag += fabs(p);
          }
          const double err = fabs(c[lane][e] - want) / (mag + 1e-30);
          worst = err > worst ? err : worst;
        }
      CHECK_MSG(worst < 1e-5, "D %d type %d: worst relative error %.3e", D, type, worst);
    }
}

static void v_fragments_and_transposed_p_make_p_v(void) {
  alignas(16) static unsigned char rows[KEYS * MAX_D * 2];
  const int dims[] = {128, 512};
  for (int di = 0; di < 2; di++)
    for (int ti = 0; ti < 3; ti++) {
      const int Dv = dims[di], type = types[ti];
      const int64_t nb1 = random_rows(type, KEYS, Dv, rows);
      bool live[KEYS];
      for (int k = 0; k < KEYS; k++) {
        live[k] = k % 5 != 3; /* keys 3, 8, 13 dead: their bytes NaN */
        if (!live[k]) memset(rows + k * nb1, 0xff, (size_t)nb1);
      }
      float P[KEYS][ROWS]; /* probabilities as the kernel rounds them, 0 where dead */
      for (int k = 0; k < KEYS; k++)
        for (int r = 0; r < ROWS; r++) P[k][r] = live[k] ? f16_round(fabsf(uniform())) : 0.0f;
      /* S^T's layout (key g + 8 (e / 2), row 2t + e % 2) packed, then transposed */
      uint32_t h0[32], h1[32], pb0[32], pb1[32];
      for (int lane = 0; lane < 32; lane++) {
        const int g = lane / 4, t = lane % 4;
        h0[lane] = (uint32_t)__half_as_ushort(__float2half_rn(P[g][2 * t])) |
                   (uint32_t)__half_as_ushort(__float2half_rn(P[g][2 * t + 1])) << 16;
        h1[lane] = (uint32_t)__half_as_ushort(__float2half_rn(P[g + 8][2 * t])) |
                   (uint32_t)__half_as_ushort(__float2half_rn(P[g + 8][2 * t + 1])) << 16;
      }
      movmatrix_t_emulated(pb0, h0);
      movmatrix_t_emulated(pb1, h1);
      static float O[ROWS][MAX_D];
      for (int64_t blk = 0; blk < Dv / 32; blk++) {
        uint32_t a[2][32][4], b[32][2];
        float c[2][32][4] = {};
        for (int lane = 0; lane < 32; lane++) {
          const int g = lane / 4, t = lane % 4, keys[4] = {2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9};
          const char *vr[4];
          bool lv[4];
          for (int i = 0; i < 4; i++)
            vr[i] = reinterpret_cast<const char *>(rows + keys[i] * nb1), lv[i] = live[keys[i]];
          uint32_t frag[2][4];
          v_frag_of(frag, type, vr, lv, blk, g);
          memcpy(a[0][lane], frag[0], sizeof frag[0]), memcpy(a[1][lane], frag[1], sizeof frag[1]);
          b[lane][0] = pb0[lane], b[lane][1] = pb1[lane];
        }
        for (int h = 0; h < 2; h++) {
          mma_emulated(c[h], a[h], b);
          for (int lane = 0; lane < 32; lane++)
            for (int e = 0; e < 4; e++) {
              const int g = lane / 4, t = lane % 4;
              O[2 * t + e % 2][tsr_gqa_v_dim(blk, h, g + 8 * (e / 2))] = c[h][lane][e];
            }
        }
      }
      double worst = 0;
      int finite = 1;
      for (int r = 0; r < ROWS; r++)
        for (int d = 0; d < Dv; d++) {
          double want = 0, mag = 0;
          for (int k = 0; k < KEYS; k++)
            if (live[k]) {
              const double p = (double)P[k][r] * value_f16(type, rows + k * nb1, d);
              want += p, mag += fabs(p);
            }
          finite &= isfinite(O[r][d]);
          const double err = fabs(O[r][d] - want) / (mag + 1e-30);
          worst = err > worst ? err : worst;
        }
      CHECK_MSG(finite, "Dv %d type %d: a dead key's NaN bytes reached the output", Dv, type);
      CHECK_MSG(worst < 1e-5, "Dv %d type %d: worst relative error %.3e", Dv, type, worst);
    }
}

static void fits_one_query_of_small_groups_in_three_types(void) {
  alignas(16) static char kv[4096];
  struct tsr_tile_args a;
  memset(&a, 0, sizeof a);
  a.gqa_decode = 1, a.Nq = 1, a.group = 8, a.D = a.Dv = 512;
  a.k = a.v = kv, a.k_type = T_Q8_0, a.v_type = T_Q4_0;
  a.k_nb1 = 16 * 34, a.v_nb1 = 16 * 18, a.k_nb2 = a.k_nb1 * 4, a.v_nb2 = a.v_nb1 * 4;
  CHECK(tsr_gqa_decode_fits(&a));
  struct tsr_tile_args b = a;
  b.gqa_decode = 0; /* not asked for */
  CHECK(!tsr_gqa_decode_fits(&b));
  b = a, b.Nq = 2; /* two queries: the tile kernels */
  CHECK(!tsr_gqa_decode_fits(&b));
  b = a, b.group = 16;
  CHECK(!tsr_gqa_decode_fits(&b));
  b = a, b.D = b.Dv = 80;
  CHECK(!tsr_gqa_decode_fits(&b));
  b = a, b.k_type = T_Q5_0;
  CHECK(!tsr_gqa_decode_fits(&b));
  b = a, b.k_type = T_Q4_0, b.v_type = T_Q8_0; /* a type pair not compiled */
  CHECK(!tsr_gqa_decode_fits(&b));
  b = a, b.Dv = 384; /* value head dims are compiled exactly: 128, 256, 512 */
  CHECK(!tsr_gqa_decode_fits(&b));
  b = a, b.D = 64, b.Dv = 128; /* D any step of 32 */
  CHECK(tsr_gqa_decode_fits(&b));
  b = a, b.k_type = b.v_type = T_F16, b.k_nb0 = b.v_nb0 = 2, b.k_nb1 = b.v_nb1 = 1024;
  b.k_nb2 = b.v_nb2 = 4096;
  CHECK(tsr_gqa_decode_fits(&b));
  b.k_nb0 = 4; /* a strided f16 view */
  CHECK(!tsr_gqa_decode_fits(&b));
  b.k_nb0 = 2, b.v_nb1 = 1026; /* f16 rows off their 4-byte alignment */
  CHECK(!tsr_gqa_decode_fits(&b));
  b = a, b.k = kv + 1; /* codes off their 2-byte alignment */
  CHECK(!tsr_gqa_decode_fits(&b));
  b = a, b.v_nb2 = 289;
  CHECK(!tsr_gqa_decode_fits(&b));
  /* the staged variant: asked for, and K and V 16-byte aligned (the copies' first chunk) */
  CHECK(!tsr_gqa_staged(&a));
  b = a, b.gqa_decode = 2;
  CHECK(tsr_gqa_decode_fits(&b) && tsr_gqa_staged(&b));
  b.v = kv + 2;
  CHECK(tsr_gqa_decode_fits(&b) && !tsr_gqa_staged(&b));
  b = a, b.gqa_decode = 2, b.k_nb1 = 2 * 16 * 34; /* rows with a gap: not one span */
  CHECK(tsr_gqa_decode_fits(&b) && !tsr_gqa_staged(&b));
  b = a, b.gqa_decode = 2, b.k_type = b.v_type = T_F16, b.k_nb0 = b.v_nb0 = 2;
  b.k_nb1 = b.v_nb1 = 1024, b.k_nb2 = b.v_nb2 = 4096; /* f16: unstaged */
  CHECK(tsr_gqa_decode_fits(&b) && !tsr_gqa_staged(&b));
}

int main(void) {
  TSR_RUN(pairs_are_dq_rounded_to_f16);
  TSR_RUN(k_and_q_fragments_make_q_k);
  TSR_RUN(v_fragments_and_transposed_p_make_p_v);
  TSR_RUN(fits_one_query_of_small_groups_in_three_types);
  return TSR_TEST_EXIT();
}
