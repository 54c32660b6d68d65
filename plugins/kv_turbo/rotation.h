/*
** The rotation of kv_turbo's tiers, which kv_tcq shares: the head dim is stored at
** S = the next multiple of 64 (zeros past it); S is cut into groups of G = 128 values
** when S is a multiple of 128, else of 64, and each group x becomes y = D2 H D1 x,
** with D1, D2 fixed +-1 diagonals and H the Walsh-Hadamard matrix scaled by 1/sqrt(G)
** (orthogonal, so y has x's norm); the inverse is x = D1 H D2 y.
*/
#ifndef KV_TURBO_ROTATION_H
#define KV_TURBO_ROTATION_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __CUDACC__
#define TURBO_FN __host__ __device__ static inline
#else
#define TURBO_FN static inline
#endif

enum { TURBO_BLOCK = 64, TURBO_GROUP_MAX = 128 };

/* op params of the rotation (rotation_op.h): its direction, the dim of its output, and
** the plugin state of the host that built the node (for its counters) */
enum { TURBO_P_INVERSE = 0, TURBO_P_OUT_DIM = 1, TURBO_P_STATE = 2, TURBO_P_COUNT = 4 };

/* The stored dim of a head dim (whole blocks) and its rotation group. */
TURBO_FN int64_t turbo_storage_dim(int64_t head_dim) {
  return (head_dim + TURBO_BLOCK - 1) / TURBO_BLOCK * TURBO_BLOCK;
}
TURBO_FN int turbo_group(int64_t storage_dim) { return storage_dim % 128 == 0 ? 128 : 64; }

/* The sign of position i (0..127) of diagonal d (1 or 2): a fixed hash, so every
** build and backend agrees; a group of 64 takes positions 0..63. */
TURBO_FN float turbo_sign(uint32_t i, uint32_t d) {
  uint32_t x = (i + 1u) * 0x2545F491u ^ d * 0x9E3779B9u;
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  return (x & 1u) ? -1.0f : 1.0f;
}

#ifndef __CUDACC__
/* In place: the Walsh-Hadamard transform of g values (64 or 128), scaled by 1/sqrt(g). */
static inline void turbo_wht(float *x, int g) {
  for (int len = 1; len < g; len <<= 1)
    for (int i = 0; i < g; i += len << 1)
      for (int j = i; j < i + len; j++) {
        const float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
  const float k = 1.0f / sqrtf((float)g);
  for (int i = 0; i < g; i++) x[i] *= k;
}

/* One row: forward, in_dim values (zeros past them) to out_dim rotated ones;
** inverse, out_dim values of the in_dim rotated ones' preimage. */
static inline void turbo_rotate_row(const float *in, int64_t in_dim, float *out, int64_t out_dim,
                                    bool inverse) {
  const int64_t n = inverse ? in_dim : out_dim; /* the rotated side: whole blocks */
  const int g = turbo_group(n);
  float x[TURBO_GROUP_MAX];
  for (int64_t g0 = 0; g0 < n; g0 += g) {
    for (int i = 0; i < g; i++)
      x[i] = (g0 + i < in_dim ? in[g0 + i] : 0.0f) * turbo_sign((uint32_t)i, inverse ? 2 : 1);
    turbo_wht(x, g);
    for (int i = 0; i < g && g0 + i < out_dim; i++)
      out[g0 + i] = x[i] * turbo_sign((uint32_t)i, inverse ? 1 : 2);
  }
}
#endif

#endif
