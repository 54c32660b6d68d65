/*
** Backend interface: a vtable with a context pointer. A backend executes a
** planned graph; before that, every node is checked against it and a node it
** has no kernel for is an error naming the op and tensor, never a silent
** fallback to another device.
*/
#ifndef TSR_BACKEND_H
#define TSR_BACKEND_H

#include "graph/graph.h"
#include "graph/op_times.h"

/* What a benchmark compares its rates with: a device-to-device copy (bytes
** read plus bytes written per second) and a large GEMM's FLOP/s, each with a
** line saying how it was measured. */
struct tsr_backend_ceilings {
  double copy_bytes_per_s, gemm_flops;
  char copy_how[128], gemm_how[384]; /* gemm_how also names the non-default paths a run took */
};

/* A device backend's memory: what it allocated itself (kept weights and
** caches, the arena, scratch) now and at its peak, and the peak of the
** device's memory in use by every process, sampled after each compute that
** allocated and whenever read. */
struct tsr_backend_memory {
  uint64_t held_bytes, held_peak_bytes;
  uint64_t device_used_peak_bytes, device_total_bytes;
};

struct tsr_backend_i {
  const char *(*name)(void *ctx);
  /* TSR_OK if the backend can compute this node, else an error naming it. */
  tsr_status (*supports)(void *ctx, const struct tsr_tensor *node);
  /* Runs every node of a planned, bound graph in order. */
  tsr_status (*compute)(void *ctx, struct tsr_graph *g);
  void (*free)(void *ctx);
  /* Device backends only; NULL where the backend computes in host
  ** memory (cpu). External memory (tsr_new_external: weights, KV cache,
  ** recurrent state, index arrays) is of two kinds on a device backend:
  **  - kept: [host, host + size) registered with keep. Its device copy is
  **    made at the first compute that uses it and is the authoritative one
  **    from then on: sync_to_host copies device bytes back over a sub-range,
  **    sync_to_device copies host bytes over one (after the host rewrote
  **    it), forget drops the copy and the registration (before the host
  **    frees or reuses the memory);
  **  - everything else: uploaded at every compute that uses it, and copied
  **    back after the compute when a node wrote into it, exactly as the cpu
  **    backend would have left it. Nothing is remembered by host address, so
  **    freed and reused host memory can never meet a stale copy. */
  tsr_status (*sync_to_host)(void *ctx, void *host, size_t size);
  void (*forget)(void *ctx, const void *host, size_t size);
  tsr_status (*keep)(void *ctx, const void *host, size_t size);
  tsr_status (*sync_to_device)(void *ctx, const void *host, size_t size);
  /* The device's ceilings for `tessera bench`: cuda measures the vendor's own copy and
  ** GEMM, cpu a streaming read and its cores' multiply-add peak; NULL where a backend
  ** has neither. */
  tsr_status (*probe)(void *ctx, struct tsr_backend_ceilings *out);
  /* From now on add every node's time to acc (core/graph/op_times.h), or stop when
  ** acc is NULL; NULL where the backend cannot time its nodes. */
  tsr_status (*time_nodes)(void *ctx, struct tsr_op_times *acc);
  /* Device memory so far; NULL where the backend computes in host memory (cpu). */
  tsr_status (*memory)(void *ctx, struct tsr_backend_memory *out);
  /* Computes captured as CUDA graphs and computes that replayed one, so far; NULL
  ** where the backend has no graphs (cpu). */
  void (*graph_counts)(void *ctx, uint64_t *captures, uint64_t *replays);
};

struct tsr_backend {
  struct tsr_backend_i i;
  void *context;
  struct tsr_op_times *times; /* set by tsr_backend_time_nodes; computes add to it */
};

/* n_threads <= 0 means one per online core. */
tsr_status tsr_backend_cpu_new(int n_threads, struct tsr_backend **out);
int tsr_backend_cpu_n_threads(const struct tsr_backend *b);
/* Decode's products (one or two columns against q4_0..q8_0 and q4_K..q6_K rows) on the
** vector quantized to 8 bits, in integers (core/cpu/vec_q8.c), instead of in f32; off
** when the backend is made. */
void tsr_backend_cpu_set_activations_q8(struct tsr_backend *b, bool on);
void tsr_backend_free(struct tsr_backend *b);
/* Opens libtessera-cuda.so (env TESSERA_CUDA_BACKEND, else beside the
** executable or in its build tree, else the install libdir) and its GPU.
** Every failure is an error naming it: the .so not built or not loadable, no
** CUDA driver, no GPU, a driver older than the runtime (core/graph/backend_cuda_loader.c). */
tsr_status tsr_backend_cuda_new(struct tsr_backend **out);
/* The same with the profile's settings (core/graph/cuda_settings.h; overrides applied):
** tsr_backend_cuda_new takes the defaults and the TESSERA_CUDA_* variables. */
struct tsr_cuda_settings;
tsr_status tsr_backend_cuda_open(const struct tsr_cuda_settings *settings,
                                 struct tsr_backend **out);
/* Device copies of external memory (see struct tsr_backend_i); no-ops on
** backends without them (cpu). keep registers a range as persistent (weights,
** KV cache, state): it may not overlap another kept range partly (an error
** naming both). forget drops every kept range overlapping [host, host+size),
** whole. sync_to_host / sync_to_device copy exactly the bytes asked for, where
** a device copy exists. tsr_backend_has_device_copies says whether any of it
** matters (callers skip the bookkeeping on the cpu). */
tsr_status tsr_backend_keep(struct tsr_backend *b, const void *host, size_t size);
tsr_status tsr_backend_sync_to_host(struct tsr_backend *b, void *host, size_t size);
tsr_status tsr_backend_sync_to_device(struct tsr_backend *b, const void *host, size_t size);
void tsr_backend_forget(struct tsr_backend *b, const void *host, size_t size);
bool tsr_backend_has_device_copies(const struct tsr_backend *b);
const char *tsr_backend_name(const struct tsr_backend *b);
/* The backend's vendor-measured ceilings; TSR_ERR_UNSUPPORTED (no message)
** where it has no probe: the caller measures with tessera's own kernels. */
tsr_status tsr_backend_probe(struct tsr_backend *b, struct tsr_backend_ceilings *out);
/* The backend's device memory; TSR_ERR_UNSUPPORTED (no message) where it has
** none (cpu). */
tsr_status tsr_backend_memory(struct tsr_backend *b, struct tsr_backend_memory *out);
/* The backend's graph captures and replays so far; false where it has no graphs (cpu). */
bool tsr_backend_graph_counts(const struct tsr_backend *b, uint64_t *captures, uint64_t *replays);

/* Checks every node against the backend; the first gap is the error. */
tsr_status tsr_backend_check_graph(struct tsr_backend *b, const struct tsr_graph *g);

/* Plans g, allocates its arena (returned in *arena, free() it), binds it. */
tsr_status tsr_graph_alloc(struct tsr_graph *g, struct tsr_graph_plan *plan, void **arena);

tsr_status tsr_backend_compute(struct tsr_backend *b, struct tsr_graph *g);
/* Times every node of the computes that follow into acc (each compute's host
** time too), until called with NULL; an error naming the backend when it
** cannot time its nodes. */
tsr_status tsr_backend_time_nodes(struct tsr_backend *b, struct tsr_op_times *acc);

#endif
