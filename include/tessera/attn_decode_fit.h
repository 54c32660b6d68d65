/*
** Which layers the GPU's GQA decode kernel (tessera/cuda_attn_gqa.cuh) takes, by shape
** and K/V dtype alone, in C, so that an attention's negotiation (the core's flash,
** attn_dca) can answer at `profile check` time what the kernel will do: V skipping on
** decode steps (decode policies) runs in that kernel only.
*/
#ifndef TESSERA_ATTN_DECODE_FIT_H
#define TESSERA_ATTN_DECODE_FIT_H

#include <stdbool.h>
#include <stdint.h>

#include "tessera/plugin/dtype.h"

/* A group of 1..8 q heads per KV head (the mma fragment's 8 columns), K head dims in steps
** of 32 up to 512, V head dims of 128, 256 or 512 (compiled exactly), and K/V f16/f16,
** q8_0/q8_0, q8_0/q4_0 or q4_0/q4_0 (a kernel each). */
static inline bool tsr_gqa_decode_shape_fits(int64_t group, int64_t dk, int64_t dv,
                                             int32_t k_dtype, int32_t v_dtype) {
  const int32_t f16 = TSR_DTYPE_ID_F16, q8 = TSR_DTYPE_ID_Q8_0, q4 = TSR_DTYPE_ID_Q4_0;
  const bool pair = (k_dtype == f16 && v_dtype == f16) ||
                    (k_dtype == q8 && (v_dtype == q8 || v_dtype == q4)) ||
                    (k_dtype == q4 && v_dtype == q4);
  return group >= 1 && group <= 8 && dk % 32 == 0 && dk > 0 && dk <= 512 &&
         (dv == 128 || dv == 256 || dv == 512) && pair;
}

#endif
