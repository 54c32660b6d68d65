/*
** The device's ceilings for `tessera bench` (struct tsr_backend_ceilings),
** measured with the vendor's code, not tessera's: cudaMemcpy device to device
** over 1 GiB, and a bf16 GEMM of 8192^3 through cuBLAS (f32 accumulate,
** tensor cores). Each is the median of several timed runs after a warm-up,
** timed with events on the backend's stream.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/backend.h"
#include "cuda_internal.h"

#define PROBE_COPY_BYTES ((size_t)1 << 30)
#define PROBE_GEMM_N 8192
#define PROBE_RUNS 9

static int cmp_float(const void *a, const void *b) {
  const float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

/* Median milliseconds of PROBE_RUNS runs of op(c, a, b) after one warm-up. */
static tsr_status time_median(struct cu_ctx *c, tsr_status (*op)(struct cu_ctx *, char *, char *),
                              char *a, char *b, float *ms) {
  cudaEvent_t e0 = NULL, e1 = NULL;
  float t[PROBE_RUNS];
  tsr_status st = TSR_OK;
  if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess)
    st = tsr_error_set(TSR_ERR_INTERNAL, "probe: cudaEventCreate failed");
  for (int i = -1; st == TSR_OK && i < PROBE_RUNS; i++) {
    cudaError_t e = cudaEventRecord(e0, c->stream);
    if (e == cudaSuccess) st = op(c, a, b);
    if (st == TSR_OK && e == cudaSuccess) e = cudaEventRecord(e1, c->stream);
    if (st == TSR_OK && e == cudaSuccess) e = cudaEventSynchronize(e1);
    if (st == TSR_OK && e == cudaSuccess && i >= 0) e = cudaEventElapsedTime(&t[i], e0, e1);
    if (st == TSR_OK && e != cudaSuccess) st = tsr_cuda_rt_fail((int)e, "probe timing", __FILE__, __LINE__);
  }
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  if (st != TSR_OK) return st;
  qsort(t, PROBE_RUNS, sizeof *t, cmp_float);
  *ms = t[PROBE_RUNS / 2];
  return TSR_OK;
}

static tsr_status copy_op(struct cu_ctx *c, char *a, char *b) {
  CU_RT(cudaMemcpyAsync(b, a, PROBE_COPY_BYTES, cudaMemcpyDeviceToDevice, c->stream));
  return TSR_OK;
}

/* C = A B, all bf16 n x n, A and B in a, C in b */
static tsr_status gemm_op(struct cu_ctx *c, char *a, char *b) {
  const int n = PROBE_GEMM_N;
  const float one = 1.0f, zero = 0.0f;
  const size_t mat = (size_t)n * n * 2;
  CU_BLAS(cublasGemmEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n,
                       a + mat, CUDA_R_16BF, n, &zero, b, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT));
  return TSR_OK;
}

tsr_status tsr_cuda_probe(void *ctx, struct tsr_backend_ceilings *out) {
  struct cu_ctx *c = ctx;
  char *a = NULL, *b = NULL;
  float copy_ms = 0, gemm_ms = 0;
  tsr_status st = TSR_OK;
  if (cudaMalloc((void **)&a, PROBE_COPY_BYTES) != cudaSuccess ||
      cudaMalloc((void **)&b, PROBE_COPY_BYTES) != cudaSuccess)
    st = tsr_error_set(TSR_ERR_NOMEM, "probe: two buffers of 1 GiB on the device");
  /* bf16 0x3c3c (about 0.0115) everywhere: finite products, no denormals, not all zeros */
  if (st == TSR_OK && cudaMemsetAsync(a, 0x3c, PROBE_COPY_BYTES, c->stream) != cudaSuccess)
    st = tsr_error_set(TSR_ERR_INTERNAL, "probe: cudaMemsetAsync failed");
  if (st == TSR_OK) st = time_median(c, copy_op, a, b, &copy_ms);
  if (st == TSR_OK) st = time_median(c, gemm_op, a, b, &gemm_ms);
  if (a) cudaFree(a);
  if (b) cudaFree(b);
  if (st != TSR_OK) return st;
  out->copy_bytes_per_s = 2.0 * (double)PROBE_COPY_BYTES / (copy_ms * 1e-3);
  out->gemm_flops = 2.0 * PROBE_GEMM_N * (double)PROBE_GEMM_N * PROBE_GEMM_N / (gemm_ms * 1e-3);
  snprintf(out->copy_how, sizeof out->copy_how, "cudaMemcpy device to device, 1 GiB, median of %d",
           PROBE_RUNS);
  /* what this run does that the defaults do not (TESSERA_CUDA_GEMV / GEMM / GRAPHS),
  ** so a bench's output says what it measured */
  snprintf(out->gemm_how, sizeof out->gemm_how,
           "cuBLAS bf16 GEMM %d^3 (f32 accumulate), median of %d%s%s%s%s%s%s", PROBE_GEMM_N,
           PROBE_RUNS, c->precision_f32 ? "; run in the exact mode (backend.precision f32)" : "",
           c->gemv_x8 ? "" : "; run with the f32 gemv",
           c->gemm_f32 ? "; run with f32 GEMMs" : "",
           c->use_graphs ? "" : "; run without CUDA graphs",
           c->attn_pipelined ? "; run with the pipelined attention tile loop" : "",
           c->attn_gqa_decode == 0 ? "; run with the tile kernels for decode attention"
           : c->attn_gqa_decode == 1 ? "; run with the GQA decode kernel never staged"
                                     : "");
  if (c->attn_split_keys) {
    const size_t n = strlen(out->gemm_how);
    snprintf(out->gemm_how + n, sizeof out->gemm_how - n, "; attention splits of at least %d keys",
             c->attn_split_keys);
  }
  return TSR_OK;
}
