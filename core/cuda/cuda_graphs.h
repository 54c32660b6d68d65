/*
** Which computes the CUDA backend may replay as a CUDA graph, and how it knows a
** compute's launches are those of the last one. No CUDA here, so
** core/cuda/tests/test_cuda_graphs.c checks it on the CPU in CI.
**
** A decode step's graph is the same for 256 steps (the cache's span of used cells
** grows in steps of 256, positions and tokens are uploaded inputs), so its kernel
** launches are too: the backend captures them once and replays the capture, one
** launch instead of one per node (unless backend.graphs is false). The signature
** holds everything a launch is made from: per computing node its op, parameters,
** type, shape and strides and the device addresses of it and its sources, then the
** backend's own (arena, scratch).
*/
#ifndef TSR_CUDA_GRAPHS_H
#define TSR_CUDA_GRAPHS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "graph/graph.h"

/* Whether every node of g launches the same kernels from the same signature
** without the host reading device memory or waiting: plugin ops only where
** replayable(op id, "cuda") says their plugin declared the cuda kernel replayable
** (plugin.h; NULL: none is), products (mat_mul, mat_mul_id) only where
** on_device(ctx, node) says the backend multiplies it with its own kernels alone (not
** cuBLAS, and no expert ids read back to the host). why names the first node that is
** not. */
bool tsr_cuda_graph_capturable(const struct tsr_graph *g,
                               bool (*on_device)(void *ctx, const struct tsr_tensor *node),
                               void *ctx, int (*replayable)(int32_t op_id, const char *backend),
                               char *why, size_t why_len);

/* The signature of a compute of g into *buf (grown as needed; *cap its size), given
** each tensor's device address dptr[index] and `extra` bytes of the backend's own.
** Returns its length, 0 when out of memory. */
size_t tsr_cuda_graph_signature(const struct tsr_graph *g, char *const *dptr, const void *extra,
                                size_t extra_len, unsigned char **buf, size_t *cap);

/* Captured graphs kept by signature, several at once: speculative decoding alternates
** decode steps, verify batches of a few sizes and a drafter's steps on one backend, and
** each replays its own capture. Taking a slot for a new signature evicts the least
** recently used one, whose capture goes through drop. */
enum { TSR_CUDA_GRAPH_SLOTS_MAX = 16 };

struct tsr_cuda_graph_slot {
  unsigned char *sig;
  size_t len, cap;
  void *exec;       /* the capture (the backend's cudaGraphExec_t), NULL before one */
  bool refused;     /* capturing it failed (said once): it runs node by node */
  uint64_t used;    /* when it was last found or taken */
};

struct tsr_cuda_graph_cache {
  struct tsr_cuda_graph_slot slot[TSR_CUDA_GRAPH_SLOTS_MAX];
  int n_slots;                /* slots in use at most, 1..TSR_CUDA_GRAPH_SLOTS_MAX */
  uint64_t clock;
  void (*drop)(void *exec);   /* releases a capture */
};

/* The slot holding signature sig (marked used), or NULL. */
struct tsr_cuda_graph_slot *tsr_cuda_graph_find(struct tsr_cuda_graph_cache *c,
                                                const unsigned char *sig, size_t len);

/* A slot holding sig, with no capture: an empty one, else the least recently used one
** (its capture dropped). NULL when out of memory. */
struct tsr_cuda_graph_slot *tsr_cuda_graph_take(struct tsr_cuda_graph_cache *c,
                                                const unsigned char *sig, size_t len);

/* Drops every capture and frees the signatures. */
void tsr_cuda_graph_cache_clear(struct tsr_cuda_graph_cache *c);

#endif
