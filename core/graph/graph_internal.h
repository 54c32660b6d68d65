/* The graph's private state, shared by the builders and the planner. */
#ifndef TSR_GRAPH_INTERNAL_H
#define TSR_GRAPH_INTERNAL_H

#include "common/error.h"
#include "graph/graph.h"

#define TSR_NO_OFFSET ((size_t)-1)

struct tsr_graph {
  struct tsr_tensor *tensors; /* fixed capacity, so tensor pointers stay valid */
  size_t *offsets;            /* arena offset per tensor, TSR_NO_OFFSET if none */
  int n, cap;
  tsr_status status;          /* first builder error */
  bool planned;
  size_t arena_bytes;
  uint64_t serial; /* unique per graph made in this process: addresses get reused */
};

/* Tensors that own arena memory: not views, not external data. */
static inline bool tsr_graph_owns_memory(const struct tsr_tensor *t) {
  return !t->view_src && !(t->flags & TSR_FLAG_WEIGHT) && t->op != TSR_OP_VIEW;
}

#endif
