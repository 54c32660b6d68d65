/*
** The host half of the CUDA backend: its context and the helpers its C files
** share (cuda_backend.c: memory and execution; cuda_matmul.c: products;
** cuda_supports.c: what it refuses). See README.md for the memory model.
*/
#ifndef TSR_CUDA_INTERNAL_H
#define TSR_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdbool.h>

#include "common/error.h"
#include "graph/graph_internal.h"
#include "cuda_abi.h"
#include "cuda_graphs.h"
#include "cuda_kernels.h"

/* A kept range of external host memory [host, host + size) (tsr_backend_keep)
** and its device copy, made at the first compute that uses it (NULL before). */
struct cu_region {
  const char *host;
  size_t size;
  char *dev;
};

/* External memory a compute uploads for itself (not kept): the union of the
** ranges of one or more external tensors, staged at offset off. */
struct cu_span {
  const char *lo, *hi;
  size_t off;
  bool written; /* a node writes into it: copied back after the compute */
};

enum cu_scratch_slot {
  SCR_X,     /* x packed for a product */
  SCR_XQ,    /* x coded to 8 bits for the q8 gemv and mmq (and mmq_id's pair lists) */
  SCR_W,     /* a dequantized weight tile */
  SCR_WPACK, /* a strided plain weight, packed */
  SCR_G,     /* mat_mul_id: one expert's columns gathered */
  SCR_Y,     /* mat_mul_id: one expert's outputs before the scatter */
  SCR_LIST,  /* mat_mul_id: pairs grouped by expert */
  SCR_ATTN,  /* attention split partials */
  SCR_STAGE, /* external memory that is not kept, uploaded for one compute */
  SCR_PLUGIN, /* a plugin kernel's own (tsr_device_call.scratch) */
  SCR_COUNT,
};

struct cu_ctx {
  const struct tsr_cuda_host *host;
  int device, n_sm;
  char name[300];
  cudaStream_t stream;
  cublasHandle_t blas;
  bool gemm_f32;   /* backend.gemm f32: batched products in f32, not f16 */
  bool gemv_x8;    /* decode products with x coded to 8 bits (backend.gemv f32: off) */
  bool attn_pipelined; /* backend.attention.pipeline: tsr_tile_args.pipelined */
  int attn_gqa_decode; /* backend.attention.decode (TSR_CUDA_DECODE_*): tsr_tile_args.gqa_decode */
  int attn_split_keys;  /* backend.attention.split_keys; 0: the kernel's default */
  bool sync_nodes; /* backend.sync: wait after every node, so a fault names it */
  bool precision_f32; /* backend.precision f32: attention without tensor cores (tsr_tile_args.f32),
                      ** and plugin kernels told so (tsr_device_call.precision_f32) */

  char *arena; /* mirrors the host arena: same size, same offsets */
  size_t arena_cap;

  struct cu_region *regions; /* kept ranges, sorted by host address, never overlapping */
  int n_regions, cap_regions;
  struct cu_span *spans; /* the compute being run: unkept external memory */
  int n_spans, cap_spans;

  void *scratch[SCR_COUNT];
  size_t scratch_cap[SCR_COUNT];

  char **dptr; /* device address of each tensor of the graph being run */
  int dptr_cap;
  void *host_buf; /* small host staging (mat_mul_id ids) */
  size_t host_buf_cap;

  size_t held_bytes, held_peak; /* device memory allocated here (weights, KV, arena, scratch) */
  size_t held_sampled;            /* held_bytes when the device was last sampled */
  size_t used_peak, device_total; /* cudaMemGetInfo: see cu_compute */

  /* CUDA graphs (on unless backend.graphs is false; cuda_graphs.h): a decode compute whose
  ** signature a recent one had replays that one's capture */
  bool use_graphs;
  bool capturing;            /* the node loop is being captured: scratch must not grow */
  struct tsr_cuda_graph_cache graphs; /* recent signatures and their captures */
  unsigned char *sig_next;   /* this compute's signature */
  size_t sig_next_cap;
  bool said_uncapturable;    /* a decode graph that cannot be captured was named */
  uint64_t n_captures, n_replays; /* computes captured, computes that replayed a capture */
  bool said_attn_refused;    /* an attention launch the tiled kernel refused was named */

  struct tsr_op_times *times; /* node timing on: an event after each node */
  cudaEvent_t *events;        /* [0] before the first node, [k] after the k-th */
  double *stamps;             /* the events as seconds since [0], for core/graph/op_times.h */
  int n_events;
};

/* The ceilings for `tessera bench` (cuda_probe.c). */
struct tsr_backend_ceilings;
tsr_status tsr_cuda_probe(void *ctx, struct tsr_backend_ceilings *out);

/* cudaError_t / cublasStatus_t to a tsr_status with the call, file and line. */
tsr_status tsr_cuda_rt_fail(int err, const char *call, const char *file, int line);
tsr_status tsr_cuda_blas_fail(int st, const char *call, const char *file, int line);
#define CU_RT(call) \
  do { cudaError_t e_ = (call); \
       if (e_ != cudaSuccess) return tsr_cuda_rt_fail((int)e_, #call, __FILE__, __LINE__); } while (0)
#define CU_BLAS(call) \
  do { cublasStatus_t s_ = (call); \
       if (s_ != CUBLAS_STATUS_SUCCESS) return tsr_cuda_blas_fail((int)s_, #call, __FILE__, __LINE__); \
  } while (0)
/* A kernel launcher's result (cudaGetLastError after the launch). */
#define CU_LAUNCH(call) \
  do { int e_ = (call); if (e_) return tsr_cuda_rt_fail(e_, #call, __FILE__, __LINE__); } while (0)

/* mat_mul_id with more (slot, token) pairs reads the ids back to the host and groups them. */
#define MMID_DIRECT_PAIRS 32

/* Device scratch of at least bytes in slot (grown, never shrunk; refused while capturing). */
tsr_status tsr_cuda_scratch(struct cu_ctx *c, enum cu_scratch_slot slot, size_t bytes, void **out);

tsr_status tsr_cuda_supports(struct cu_ctx *c, const struct tsr_tensor *t);
/* The plugin op of the codec kernel that reads flash_attn node t's K and V as stored (both
** that kernel's codecs), or -1: the core's kernel reads them. */
int32_t tsr_cuda_codec_read_op(const struct cu_ctx *c, const struct tsr_tensor *t);
tsr_status tsr_cuda_mat_mul(struct cu_ctx *c, const struct cu_t *dst, const struct cu_t *w,
                            const struct cu_t *x);
/* Whether mat_mul / mat_mul_id node t runs on the backend's own kernels alone: no cuBLAS,
** no expert ids read back to the host (tsr_cuda_graph_capturable's on_device; ctx the
** cu_ctx). */
bool tsr_cuda_product_on_device(void *ctx, const struct tsr_tensor *t);
tsr_status tsr_cuda_mat_mul_id(struct cu_ctx *c, const struct cu_t *dst, const struct cu_t *w,
                               const struct cu_t *x, const struct cu_t *ids);

#endif
