/* Launch geometry shared by the backend's kernel files: NT threads a block,
** a grid covering n items (capped; FOR_EACH strides over the rest). */
#ifndef TSR_CUDA_LAUNCH_CUH
#define TSR_CUDA_LAUNCH_CUH

#include <stdint.h>

#define NT 256

static inline unsigned grid_for(int64_t n) {
  int64_t b = (n + NT - 1) / NT;
  if (b > (1 << 20)) b = 1 << 20;
  return (unsigned)(b > 0 ? b : 1);
}

#define FOR_EACH(i, n) \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); \
       i += (int64_t)gridDim.x * blockDim.x)

#endif
