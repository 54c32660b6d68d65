/*
** example_codec's rotation and state, shared by its CPU and CUDA kernels: each
** 128-value group x of a row becomes y = D2 H D1 x, with D1, D2 fixed +-1
** diagonals and H the Walsh-Hadamard matrix scaled by 1/sqrt(128), so that
** y has x's norm and the inverse is x = D1 H D2 y.
*/
#ifndef EXAMPLE_CODEC_H
#define EXAMPLE_CODEC_H

#include <stdint.h>
#include <string.h>
#include <tessera/plugin.h>

#ifdef __CUDACC__
#define ROT_FN __host__ __device__ static inline
#else
#define ROT_FN static inline
#endif

enum { ROT_GROUP = 128 };

/* op params: the direction, the head dim of the output, and the state of the
** host that built the node (ops are the process's, states one a host) */
enum { ROT_P_INVERSE = 0, ROT_P_OUT_DIM = 1, ROT_P_STATE = 2, ROT_P_COUNT = 4 };

/* The sign of position i (0..127) of diagonal d (1 or 2): a fixed hash, so
** every build and backend agrees. */
ROT_FN float rot_sign(uint32_t i, uint32_t d) {
  uint32_t x = i * 0x9E3779B1u ^ d * 0x85EBCA77u;
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  x ^= x >> 12;
  return (x & 1u) ? -1.0f : 1.0f;
}

/* Storage dim of a head dim: whole groups, plus extra_groups of zeros. */
ROT_FN int32_t rot_storage_dim(int32_t head_dim, int32_t extra_groups) {
  return (head_dim + ROT_GROUP - 1) / ROT_GROUP * ROT_GROUP + extra_groups * ROT_GROUP;
}

#define ROT_INV_SQRT_GROUP 0.08838834764831845f /* 1/sqrt(128) */

/* q8_f32, a codec of its own layout: 32 values, an f32 scale d, then 32 int8 q;
** x = d * q, d = max |x| / 127. */
enum { Q8F_BLOCK = 32, Q8F_BYTES = 4 + Q8F_BLOCK };

/* The plugin's state for one host, which its kernels count for. */
struct codec_state {
  const struct tsr_host *host;
  struct tsr_plugin *self;
  int32_t extra_groups; /* setting */
};

ROT_FN struct codec_state *rot_state(const int32_t *params) {
  struct codec_state *st;
  memcpy(&st, &params[ROT_P_STATE], sizeof st);
  return st;
}

#endif
