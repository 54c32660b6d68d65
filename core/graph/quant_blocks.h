/*
** Bit layouts of the GGUF block types, byte for byte as GGUF files store
** them (little-endian, no padding). Half-precision scales are raw uint16.
*/
#ifndef TSR_QUANT_BLOCKS_H
#define TSR_QUANT_BLOCKS_H

#include <stdint.h>

#include "graph/dtype.h"

struct tsr_block_q4_0 { uint16_t d; uint8_t qs[TSR_QK4_0 / 2]; };
struct tsr_block_q4_1 { uint16_t d, m; uint8_t qs[TSR_QK4_1 / 2]; };
struct tsr_block_q5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[TSR_QK5_0 / 2]; };
struct tsr_block_q5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[TSR_QK5_1 / 2]; };
struct tsr_block_q8_0 { uint16_t d; int8_t qs[TSR_QK8_0]; };

struct tsr_block_q2_K {
  uint8_t scales[TSR_QK_K / 16]; /* 4-bit scale | 4-bit min per 16 values */
  uint8_t qs[TSR_QK_K / 4];
  uint16_t d, dmin;
};
struct tsr_block_q3_K {
  uint8_t hmask[TSR_QK_K / 8];
  uint8_t qs[TSR_QK_K / 4];
  uint8_t scales[12]; /* 16 six-bit scales */
  uint16_t d;
};
struct tsr_block_q4_K {
  uint16_t d, dmin;
  uint8_t scales[TSR_K_SCALE_SIZE]; /* 8 six-bit scales and mins */
  uint8_t qs[TSR_QK_K / 2];
};
struct tsr_block_q5_K {
  uint16_t d, dmin;
  uint8_t scales[TSR_K_SCALE_SIZE];
  uint8_t qh[TSR_QK_K / 8];
  uint8_t qs[TSR_QK_K / 2];
};
struct tsr_block_q6_K {
  uint8_t ql[TSR_QK_K / 2];
  uint8_t qh[TSR_QK_K / 4];
  int8_t scales[TSR_QK_K / 16];
  uint16_t d;
};
struct tsr_block_q8_K {
  float d;
  int8_t qs[TSR_QK_K];
  int16_t bsums[TSR_QK_K / 16];
};

_Static_assert(sizeof(struct tsr_block_q4_0) == 18, "q4_0 layout");
_Static_assert(sizeof(struct tsr_block_q4_1) == 20, "q4_1 layout");
_Static_assert(sizeof(struct tsr_block_q5_0) == 22, "q5_0 layout");
_Static_assert(sizeof(struct tsr_block_q5_1) == 24, "q5_1 layout");
_Static_assert(sizeof(struct tsr_block_q8_0) == 34, "q8_0 layout");
/* q3_K's 16 six-bit scales, minus 32: the low nibbles of j < 8 in scales[j] low, of j >= 8 in
** scales[j - 8] high; the top two bits of scale j at bits 2 (j / 4) of scales[8 + j % 4] */
static inline int tsr_q3_K_scale(const uint8_t s[12], int j) {
  const int lo = j < 8 ? s[j] & 0x0f : s[j - 8] >> 4;
  const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (lo | hi << 4) - 32;
}

_Static_assert(sizeof(struct tsr_block_q2_K) == 84, "q2_K layout");
_Static_assert(sizeof(struct tsr_block_q3_K) == 110, "q3_K layout");
_Static_assert(sizeof(struct tsr_block_q4_K) == 144, "q4_K layout");
_Static_assert(sizeof(struct tsr_block_q5_K) == 176, "q5_K layout");
_Static_assert(sizeof(struct tsr_block_q6_K) == 210, "q6_K layout");
_Static_assert(sizeof(struct tsr_block_q8_K) == 292, "q8_K layout");

#endif
