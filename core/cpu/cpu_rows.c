/* Helpers shared by the CPU kernels. */
#include <string.h>

#include "cpu_ops.h"

/* One row of any dequantizable tensor to f32; plain types honour nb[0]. */
void tsr_cpu_row_to_f32(const struct tsr_tensor *t, const char *row, float *out, int64_t n) {
  const struct tsr_dtype_traits *tr = tsr_dtype_traits((int)t->dtype);
  if (tr->block_size > 1 || t->nb[0] == tr->type_size) {
    tr->to_f32(row, out, n);
    return;
  }
  const size_t nb0 = t->nb[0];
  if (t->dtype == TSR_F32) {
    for (int64_t i = 0; i < n; i++) memcpy(&out[i], row + (size_t)i * nb0, sizeof(float));
  } else if (t->dtype == TSR_F16) {
    for (int64_t i = 0; i < n; i++) {
      uint16_t h;
      memcpy(&h, row + (size_t)i * nb0, sizeof h);
      out[i] = tsr_f16_to_f32(h);
    }
  } else {
    for (int64_t i = 0; i < n; i++) tr->to_f32(row + (size_t)i * nb0, &out[i], 1);
  }
}

void tsr_cpu_load_row_f32(float *y, const char *row, size_t nb0, int64_t n) {
  if (nb0 == sizeof(float)) {
    memcpy(y, row, (size_t)n * sizeof(float));
    return;
  }
  for (int64_t j = 0; j < n; j++) y[j] = tsr_cpu_load_f32(row, nb0, j);
}
