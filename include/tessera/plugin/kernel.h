/*
** tessera plugin ABI: plugin-defined graph ops and their kernels, on the CPU
** and on a device backend (host->kernel), and what a device kernel gets while
** the backend calls it. tessera/plugin_cuda.h wraps the device call for a
** plugin's .cu files; tessera/cpu_attn_tile.h and the tessera/cuda_*.cuh
** headers are the core's attention kernels, for a plugin to run as its own.
*/
#ifndef TESSERA_PLUGIN_KERNEL_H
#define TESSERA_PLUGIN_KERNEL_H

#include "tessera/plugin/abi.h"
#include "tessera/plugin/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a kernel registered for a device backend ("cuda") gets from
** host->kernel->device_call() while the backend calls it. */
struct tsr_device_call {
  uint32_t struct_size;
  const char *backend; /* "cuda" */
  int32_t device;      /* the device ordinal: cudaSetDevice(device) before launching */
  void *stream;        /* the cudaStream_t to enqueue on; the kernel never synchronizes it */
  int32_t status;      /* the kernel sets a tsr_status here (and host->set_error) when a
                       ** launch fails; the backend then fails the node with that message */
  /* How a CUDA graph holds this call, which only a kernel declared replayable
  ** (host->kernel->declare_replayable) sees as other than EAGER:
  **   TSR_DEVICE_CALL_CAPTURE  the launches are being captured: enqueue them as usual
  **                            but do no host-side bookkeeping (host->engaged counts);
  **   TSR_DEVICE_CALL_REPLAY   the captured launches are being replayed: enqueue
  **                            nothing, do only the bookkeeping of a call.
  ** The backend makes one bookkeeping call per node and compute (a replay after a
  ** successful capture too; a capture that fails runs its nodes eagerly), so counters
  ** read the same with graphs on or off. */
  int64_t graph;
  /* The backend's choices for the attention kernels a plugin may launch itself
  ** (tessera/cuda_attn_tile.cuh), as the backend's own attention takes them: the
  ** profile's backend.attention.pipeline (0, 1), .decode (0 tile, 1 gqa, 2 gqa_staged;
  ** TSR_ATTN_GQA_DECODE_DEFAULT), .split_keys (0: default). */
  int32_t attn_pipelined, attn_gqa_decode, attn_split_keys;
  /* ABI 2.7: backend.precision f32 (1), the exact mode: every kernel computes with f32
  ** operands and sums (tsr_tile_args.f32 for the attention kernels); a kernel that cannot
  ** fails the call, naming why. 0 from a backend built before it. */
  int32_t precision_f32;
  /* ABI 2.1: device memory for this call's own use (split partials, rows decoded for
  ** a kernel of the backend's), bytes of it at *out, valid for the launches the call
  ** queues; the same buffer on every call, so what one node leaves there the next may
  ** overwrite. Growing it is refused inside a graph capture: ask for a size the
  ** call's shapes bound, not one that creeps. Read it with tsr_device_call_scratch. */
  tsr_status (*scratch)(struct tsr_device_call *call, size_t bytes, void **out);
  void *backend_ctx; /* the backend's, for scratch */
};

/* Decode attention's default kernel: the GQA decode kernel, staged where its rows allow
** (backend.attention.decode gqa_staged; tessera/cuda_attn_gqa.cuh). */
enum { TSR_ATTN_GQA_DECODE_DEFAULT = 2 };

enum { TSR_DEVICE_CALL_EAGER = 0, TSR_DEVICE_CALL_CAPTURE = 1, TSR_DEVICE_CALL_REPLAY = 2 };

/* How a CUDA graph holds a device call; EAGER outside one (call NULL). */
static inline int64_t tsr_device_call_graph(const struct tsr_device_call *call) {
  return call ? call->graph : (int64_t)TSR_DEVICE_CALL_EAGER;
}

/* The backend's attention choices of a call (struct tsr_device_call.attn_*); the defaults
** outside one (call NULL). */
static inline void tsr_device_call_attn(const struct tsr_device_call *call, int32_t *pipelined,
                                        int32_t *gqa_decode, int32_t *split_keys) {
  *pipelined = call ? call->attn_pipelined : 0;
  *gqa_decode = call ? call->attn_gqa_decode : (int32_t)TSR_ATTN_GQA_DECODE_DEFAULT;
  *split_keys = call ? call->attn_split_keys : 0;
}

/* Whether the call asks for f32 operands only (tsr_device_call.precision_f32, ABI 2.7). */
static inline int32_t tsr_device_call_f32(const struct tsr_device_call *call) {
  return call ? call->precision_f32 : 0;
}

/* The call's scratch (tsr_device_call.scratch, ABI 2.1): TSR_ERR_UNSUPPORTED from a
** backend built before it. */
static inline tsr_status tsr_device_call_scratch(struct tsr_device_call *call, size_t bytes,
                                                void **out) {
  *out = NULL;
  if (!call || call->struct_size < offsetof(struct tsr_device_call, backend_ctx) +
                                       sizeof call->backend_ctx || !call->scratch)
    return TSR_ERR_UNSUPPORTED;
  return call->scratch(call, bytes, out);
}

/* A kernel of a plugin-defined op for one backend. */
typedef void (*tsr_plugin_kernel_fn)(void *ctx, int ith, int nth, const struct tsr_tensor_info *dst,
                                     const struct tsr_tensor_info *src, int n_src,
                                     const int32_t *params);

/* host->kernel: plugin-defined ops. A name gets an op id; each backend that
** should run it needs a kernel (a graph holding an op without a kernel for the
** active backend is refused at load, never run elsewhere). A builder appends
** the op with host->graph->custom_op. */
struct tsr_host_kernel {
  uint32_t struct_size;
  tsr_status (*register_op)(struct tsr_plugin *self, const char *name, int32_t *op_id);
  /* a kernel in the plugin's own .so; the cpu calls it on every thread (ith of nth) */
  tsr_status (*register_kernel)(struct tsr_plugin *self, int32_t op_id, const char *backend,
                                tsr_plugin_kernel_fn fn, void *ctx);
  /* A kernel for a device backend ("cuda") from a shared object of the plugin's
  ** built apart (its CUDA code, e.g. plugins/NAME/cuda/ built into NAME_cuda.so
  ** beside the plugin's .so), so that the plugin's own .so links no CUDA: file (a
  ** relative name is looked for in the directory of the plugin's .so) and the
  ** exported symbol, a tsr_plugin_kernel_fn. The host opens the file (dlopen,
  ** RTLD_LOCAL) only when that backend first asks for the op's kernel, i.e. when a
  ** graph holding the op is checked against it at load: a cpu run never opens it,
  ** and a file that is missing, does not load or lacks the symbol makes the
  ** backend refuse the graph with a message naming the file and the op.
  ** How a device backend calls a kernel: once per node (ith 0, nth 1), on the
  ** thread that runs the graph, in graph order, with tensor infos whose data are
  ** DEVICE addresses (planned tensors, kept or staged external memory; views
  ** already offset) and the layout the cpu kernel sees. The kernel enqueues its
  ** work on device_call()->stream after cudaSetDevice(device_call()->device) and
  ** returns without waiting; it reports a failed launch through
  ** device_call()->status. It may write into its sources (a state carried in
  ** place) exactly as its cpu kernel does: the backend copies such external
  ** memory back when it is not kept. */
  tsr_status (*register_kernel_lib)(struct tsr_plugin *self, int32_t op_id, const char *backend,
                                    const char *file, const char *symbol, void *ctx);
  /* Declares the op's kernel for `backend` ("cuda") replayable: a device backend may
  ** capture its launches in a CUDA graph and replay them for later computes whose
  ** nodes have the same layouts, device addresses and params. The kernel promises
  ** that its launches depend on nothing else (no host-side state that changes between
  ** calls), that it enqueues only stream-ordered work on device_call()->stream (no
  ** synchronization, no host reads of device memory, no cudaMalloc), and that it
  ** honours device_call()->graph. Without this a graph holding the op runs node by
  ** node. The op must be this plugin's and have a kernel for backend. */
  tsr_status (*declare_replayable)(struct tsr_plugin *self, int32_t op_id, const char *backend);
  /* the device call in progress on this thread; NULL outside one (and on the cpu) */
  struct tsr_device_call *(*device_call)(void);
  /* the CPU vector primitives the core's kernels use (f32 accumulation), so a
  ** plugin's kernel rounds exactly as they do */
  float (*vec_dot_f32)(const float *x, const float *y, int64_t n);
  float (*vec_dot_f16_f32)(const uint16_t *x, const float *y, int64_t n);
  void (*vec_axpy_f32)(float *y, float a, const float *x, int64_t n);
  void (*vec_axpy_f16)(float *y, float a, const uint16_t *x, int64_t n);
  void (*vec_scale_f32)(float *y, float a, int64_t n);
  /* ABI 2.6: x[t] = e^(x[t] - m) (0 where x[t] is -inf) and their sum, in the core's fixed
  ** order and vector exp (tsr_cpu_attn_weights' softmax) */
  float (*vec_exp_sum_f32)(float *x, int64_t n, float m);
};

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_PLUGIN_KERNEL_H */
