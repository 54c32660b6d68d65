/*
** Backend interface: a vtable with a context pointer. A backend executes a
** planned graph; before that, every node is checked against it and a node it
** has no kernel for is an error naming the op and tensor, never a silent
** fallback to another device.
*/
#ifndef TSR_BACKEND_H
#define TSR_BACKEND_H

#include "graph.h"

struct tsr_backend_i {
  const char *(*name)(void *ctx);
  /* TSR_OK if the backend can compute this node, else an error naming it. */
  tsr_status (*supports)(void *ctx, const struct tsr_tensor *node);
  /* Runs every node of a planned, bound graph in order. */
  tsr_status (*compute)(void *ctx, struct tsr_graph *g);
  void (*free)(void *ctx);
};

struct tsr_backend {
  struct tsr_backend_i i;
  void *context;
};

/* n_threads <= 0 means one per online core. */
tsr_status tsr_backend_cpu_new(int n_threads, struct tsr_backend **out);
int tsr_backend_cpu_n_threads(const struct tsr_backend *b);
void tsr_backend_free(struct tsr_backend *b);
const char *tsr_backend_name(const struct tsr_backend *b);

/* Checks every node against the backend; the first gap is the error. */
tsr_status tsr_backend_check_graph(struct tsr_backend *b, const struct tsr_graph *g);

/* Plans g, allocates its arena (returned in *arena, free() it), binds it. */
tsr_status tsr_graph_alloc(struct tsr_graph *g, struct tsr_graph_plan *plan, void **arena);

tsr_status tsr_backend_compute(struct tsr_backend *b, struct tsr_graph *g);

#endif
