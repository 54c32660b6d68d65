/*
** Dual Chunk Attention's three bands as a band policy of the shared attention
** kernels (tessera/cuda_attn_tile.cuh says what a policy provides). With chunk
** length c, a query at qp sits in the chunk starting at lo = qp / c * c; a key
** at kp is intra (band 0, the query rotated at its own offset) when kp >= lo,
** successive (band 1) when lo - c <= kp < lo, inter (band 2) below. Past
** temp_from positions (0: never) a query's scores take the YaRN temperature,
** as dca_logit_gain (dca_cpu.c) gives it on the cpu.
*/
#ifndef ATTN_DCA_BANDS_CUH
#define ATTN_DCA_BANDS_CUH

#include <math.h>
#include <stdint.h>

struct dca_bands {
  static constexpr int n = 3;
  int32_t c, temp_from; /* chunk length c >= 1 (attn_dca.c, geometry) */
  /* Chunk starts in 32 bits (|qp / c * c| <= |qp| fits), so that neither the division
  ** nor a row's state takes 64-bit registers. A key below lo is at most c below it when
  ** lo - kp <= c: lo - kp lies in [1, 2^32) there, exact as an unsigned difference, so
  ** lo - c (which could wrap) is never formed. */
  struct row {
    int32_t lo; /* the start of the query's chunk */
  };
  struct span {
    int32_t lo_min, lo_max; /* the chunk starts of the lowest and highest query */
  };
  __device__ row row_of(int32_t qp) const { return {qp / c * c}; }
  __device__ float gain(int32_t qp) const {
    if (temp_from <= 0 || (int64_t)qp + 1 <= temp_from) return 1.0f;
    const double f = 0.1 * log(((double)qp + 1.0) / (double)temp_from) + 1.0;
    return (float)(f * f);
  }
  __device__ int band(const row &r, int32_t kp) const {
    return kp >= r.lo ? 0 : (uint32_t)r.lo - (uint32_t)kp <= (uint32_t)c ? 1 : 2;
  }
  __device__ span span_of(int32_t qlo, int32_t qhi) const { return {qlo / c * c, qhi / c * c}; }
  /* intra for every row: at or past the highest query's chunk; successive: in the chunk
  ** before it and below the lowest query's; inter: before the lowest query's previous */
  __device__ int uniform(const span &s, int32_t kmin, int32_t kmax) const {
    if (kmin >= s.lo_max) return 0;
    if (kmin >= (int64_t)s.lo_max - c && kmax < s.lo_min) return 1;
    if (kmax < (int64_t)s.lo_min - c) return 2;
    return -1;
  }
};

#endif
