/*
** kv_turbo's formats, shared by its CPU reference (kv_turbo.c) and its CUDA
** kernels (cuda/turbo_cuda.cu). README.md describes them for users.
**
** Rotation: rotation.h. Queries take the same rotation, so a key's score needs no
** inverse; the attention output of rotated values is rotated back once.
**
** Blocks: each 64 rotated values y (half a group of 128, or one of 64) are
** stored as an f16 scale s and, per value, the index of the Lloyd-Max centroid
** (turbo_centroids.h) nearest to u = 8 y / |y|; s = |y| / |c|, c the chosen
** centroids, so the decoded block s c has y's norm. Bytes of a block:
**   turbo2: s, then 16 bytes of 2-bit indices (value i: byte i / 4, bits 2 (i % 4))
**   turbo3: s, the low 2 bits of each index as turbo2's 16 bytes, then 8 bytes of
**           their high bits (value i: byte i / 8, bit i % 8)
**   turbo4: s, then 32 bytes of 4-bit indices (value i: byte i / 2, bits 4 (i % 2))
**   turbo8: s, then 64 bytes of 8-bit indices
*/
#ifndef KV_TURBO_H
#define KV_TURBO_H

#include <stdint.h>
#include <string.h>

#include "rotation.h"

/* The tiers, by bits per index. */
TURBO_FN int turbo_block_bytes(int bits) { return 2 + TURBO_BLOCK * bits / 8; }

/* Index i (0..63) of a block's codes. */
TURBO_FN int turbo_index(const uint8_t *block, int bits, int i) {
  const uint8_t *q = block + 2;
  switch (bits) {
  case 2: return q[i / 4] >> (2 * (i % 4)) & 3;
  case 3: return (q[i / 4] >> (2 * (i % 4)) & 3) | (q[16 + i / 8] >> (i % 8) & 1) << 2;
  case 4: return q[i / 2] >> (4 * (i % 2)) & 15;
  default: return q[i];
  }
}


/* The plugin's state for one host. */
struct innerq;
struct turbo_state {
  const void *host; /* const struct tsr_host * */
  void *self;       /* struct tsr_plugin * */
  /* InnerQ (innerq.h): the statistics being measured (calibrate_path set) or the
  ** scales in use; NULL when off */
  struct innerq *innerq;
  char *calibrate_path;
};

TURBO_FN struct turbo_state *turbo_state_of(const int32_t *params) {
  struct turbo_state *st;
  memcpy(&st, &params[TURBO_P_STATE], sizeof st);
  return st;
}

/* What kv_turbo.c hands the CUDA kernels (their ctx): the services table and the dtype the
** host assigned each tier, turbo2, turbo3, turbo4, turbo8 (process-wide, as dtypes are). */
enum { TURBO_TIERS = 4 };
struct turbo_cuda_ctx {
  const void *host; /* const struct tsr_host * */
  int32_t dtype[TURBO_TIERS];
};

#endif
