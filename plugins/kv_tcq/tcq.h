/*
** kv_tcq's formats, shared by its CPU reference (kv_tcq.c), its CUDA kernels
** (cuda/tcq_cuda.cu) and its codebook trainer (tools/train_codebook.py, which
** restates them in numpy). README.md describes them for users.
**
** Rotation: kv_turbo's (../kv_turbo/rotation.h), head dims stored at whole blocks of 64.
**
** Blocks: each 64 rotated values y are scaled to u = 8 y / |y| (unit variance a value)
** and coded by a right-shift trellis of L = k + 6 state bits, k bits a step:
**   s_t = (s_{t-1} >> k) | (o_t << 6),   s_{-1} = 0,
** value t decoding to codebook[s_t] (2^L entries, f16-exact floats) times the block's
** scale n = |y| / |codebook[s_0..63]|, so the decoded block has y's norm. The encoder
** (Viterbi) picks o_0..o_63 minimising sum (u_t - codebook[s_t])^2.
** Bytes of a block: the o_t, k bits each, LSB-first (o_t at stream bit k t), then n as
** f16:
**   turbo3_tcq: k 3, 512 states: 24 bytes of steps, then n: 26 bytes (3.25 bits a value)
**   turbo2_tcq: k 2, 256 states: 16 bytes of steps, then n: 18 bytes (2.25 bits a value)
** s_t is bits [k t - 6, k t + k) of the stream, zeros below bit 0 (the known start):
** any value decodes from one two-byte window, which never leaves its block (the
** scale follows the steps).
*/
#ifndef KV_TCQ_H
#define KV_TCQ_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "../kv_turbo/rotation.h"

enum {
  TCQ_BLOCK = TURBO_BLOCK, /* values a block, a trellis of that many steps */
  TCQ_LOW_BITS = 6,        /* L - k: the state bits a step keeps from the last */
  TCQ_TIERS = 2,           /* turbo2_tcq, turbo3_tcq */
};

/* k of each tier (index 0 turbo2_tcq, 1 turbo3_tcq), its state count, its block bytes */
TURBO_FN int tcq_step_bits(int tier) { return tier == 0 ? 2 : 3; }
TURBO_FN int tcq_states(int k) { return 1 << (k + TCQ_LOW_BITS); }
TURBO_FN int tcq_stream_bytes(int k) { return TCQ_BLOCK * k / 8; }
TURBO_FN int tcq_block_bytes(int k) { return tcq_stream_bytes(k) + 2; }

/* The state of value t (0..63) of a block of steps of k bits. */
TURBO_FN int tcq_state(const uint8_t *block, int k, int t) {
  const int pos = k * t - TCQ_LOW_BITS, mask = tcq_states(k) - 1;
  if (pos < 0) return (block[0] << -pos) & mask;
  const int byte = pos >> 3;
  return ((block[byte] | block[byte + 1] << 8) >> (pos & 7)) & mask;
}

/* The block's scale, f16 bits. */
TURBO_FN uint16_t tcq_scale_bits(const uint8_t *block, int k) {
  const uint8_t *p = block + tcq_stream_bytes(k);
  return (uint16_t)(p[0] | p[1] << 8);
}

/* The plugin's state for one host. */
struct tcq_state {
  const void *host; /* const struct tsr_host * */
  void *self;       /* struct tsr_plugin * */
  char *dump_path;  /* dump_blocks: where the rotated blocks go, NULL when off */
  void *dump;       /* FILE *, open while dumping */
  int64_t dump_left;
  bool joined; /* holds the process's codec configuration (kv_tcq.c) */
};

TURBO_FN struct tcq_state *tcq_state_of(const int32_t *params) {
  struct tcq_state *st;
  memcpy(&st, &params[TURBO_P_STATE], sizeof st);
  return st;
}

/* What kv_tcq.c hands the CUDA kernels (their ctx): the services table and the dtype the
** host assigned each tier (process-wide, as dtypes are). The codebooks are compiled in
** (tcq_codebooks.h, made from codebooks/). */
struct tcq_cuda_ctx {
  const void *host; /* const struct tsr_host * */
  int32_t dtype[TCQ_TIERS];
};

#endif
