#include "graph/backend.h"

#include <stdlib.h>

#include "common/error.h"

void tsr_backend_free(struct tsr_backend *b) {
  if (!b) return;
  b->i.free(b->context);
  free(b);
}

const char *tsr_backend_name(const struct tsr_backend *b) { return b->i.name(b->context); }

tsr_status tsr_backend_check_graph(struct tsr_backend *b, const struct tsr_graph *g) {
  tsr_status st = tsr_graph_status(g);
  if (st != TSR_OK) return st;
  for (int i = 0; i < tsr_graph_n_tensors(g); i++) {
    st = b->i.supports(b->context, tsr_graph_tensor((struct tsr_graph *)g, i));
    if (st != TSR_OK) return st;
  }
  return TSR_OK;
}

tsr_status tsr_graph_alloc(struct tsr_graph *g, struct tsr_graph_plan *plan, void **arena) {
  *arena = NULL;
  tsr_status st = tsr_graph_plan(g, plan);
  if (st != TSR_OK) return st;
  if (plan->arena_bytes && posix_memalign(arena, TSR_ARENA_ALIGN, plan->arena_bytes))
    return tsr_error_set(TSR_ERR_NOMEM, "cannot allocate a %zu-byte compute arena",
                         plan->arena_bytes);
  return tsr_graph_bind_arena(g, *arena);
}

tsr_status tsr_backend_compute(struct tsr_backend *b, struct tsr_graph *g) {
  tsr_status st = tsr_backend_check_graph(b, g);
  if (st != TSR_OK) return st;
  if (!b->times) return b->i.compute(b->context, g);
  const double t0 = tsr_op_times_now();
  st = b->i.compute(b->context, g);
  if (st == TSR_OK) b->times->compute_seconds += tsr_op_times_now() - t0, b->times->computes++;
  return st;
}

tsr_status tsr_backend_time_nodes(struct tsr_backend *b, struct tsr_op_times *acc) {
  if (!acc && !b->times) return TSR_OK;
  if (!b->i.time_nodes)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "the %s backend cannot time its nodes",
                         tsr_backend_name(b));
  tsr_status st = b->i.time_nodes(b->context, acc);
  if (st == TSR_OK) b->times = acc;
  return st;
}
