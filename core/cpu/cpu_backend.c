/* The CPU backend: runs a planned graph node by node on the thread pool. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graph/backend.h"
#include "common/error.h"
#include "abi/op_registry.h"
#include "cpu_ops.h"
#include "threadpool.h"

struct cpu_backend {
  struct tsr_threadpool *pool;
  void *work;           /* n_threads slices of work_per_thread bytes */
  size_t work_per_thread;
  void *shared;         /* the node's shared scratch (tsr_cpu_compute.shared) */
  size_t shared_size;
  int64_t *items;       /* a work counter per node (tsr_cpu_take), zeroed per compute */
  int items_cap;
  struct tsr_op_times *times; /* node timing on: thread 0 stamps each node's end */
  double *stamps;             /* [0] the start, [k] the end of the k-th computed node */
  int stamps_cap;
  bool activations_q8;
};

struct cpu_run {
  struct cpu_backend *be;
  struct tsr_graph *g;
};

static const char *cpu_name(void *ctx) {
  (void)ctx;
  return "cpu";
}

static tsr_status cpu_supports(void *ctx, const struct tsr_tensor *t) {
  (void)ctx;
  if (!tsr_op_computes(t)) return TSR_OK;
  if (t->op < 0 || t->op >= TSR_OP_COUNT || !tsr_cpu_kernels[t->op].run)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "cpu backend: no kernel for op %s (tensor '%s')",
                         tsr_op_name(t->op), t->name);
  if (tsr_cpu_kernels[t->op].check) {
    tsr_status st = tsr_cpu_kernels[t->op].check(t);
    if (st != TSR_OK) {
      tsr_error_prefix("cpu backend, op %s, tensor '%s'", tsr_op_name(t->op), t->name);
      return st;
    }
  }
  return TSR_OK;
}

static void cpu_thread(void *arg, int ith, int nth) {
  struct cpu_run *run = arg;
  struct cpu_backend *be = run->be;
  struct tsr_cpu_compute c = {
      .ith = ith,
      .nth = nth,
      .work = (char *)be->work + (size_t)ith * be->work_per_thread,
      .work_size = be->work_per_thread,
      .activations_q8 = be->activations_q8,
      .shared = be->shared,
      .pool = be->pool,
  };
  int n = tsr_graph_n_tensors(run->g);
  /* a node's time runs from the barrier before it to the one after it; the first
  ** barrier keeps the workers' wake-up out of the first node */
  int k = 0;
  if (be->times) {
    tsr_threadpool_barrier(be->pool);
    if (ith == 0) be->stamps[k++] = tsr_op_times_now();
  }
  for (int i = 0; i < n; i++) {
    struct tsr_tensor *t = tsr_graph_tensor(run->g, i);
    if (!tsr_op_computes(t)) continue;
    c.next_item = &be->items[i];
    tsr_cpu_kernels[t->op].run(&c, t);
    tsr_threadpool_barrier(be->pool);
    if (be->times && ith == 0) be->stamps[k++] = tsr_op_times_now();
  }
}

void tsr_cpu_sync(const struct tsr_cpu_compute *c) { tsr_threadpool_barrier(c->pool); }

static tsr_status cpu_probe(void *ctx, struct tsr_backend_ceilings *out) {
  const struct cpu_backend *be = ctx;
  return tsr_cpu_probe(be->pool, be->activations_q8, out);
}

static tsr_status cpu_time_nodes(void *ctx, struct tsr_op_times *acc) {
  ((struct cpu_backend *)ctx)->times = acc;
  return TSR_OK;
}

static tsr_status cpu_compute(void *ctx, struct tsr_graph *g) {
  struct cpu_backend *be = ctx;
  size_t need = 0, shared = 0;
  int n = tsr_graph_n_tensors(g);
  for (int i = 0; i < n; i++) {
    const struct tsr_tensor *t = tsr_graph_tensor(g, i);
    if (!tsr_op_computes(t)) continue;
    if (!t->data)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "cpu backend: tensor '%s' (%s) has no memory; "
                           "plan and bind the graph first", t->name, tsr_op_name(t->op));
    if (tsr_cpu_kernels[t->op].work) {
      size_t w = tsr_cpu_kernels[t->op].work(t);
      if (w > need) need = w;
    }
    if (tsr_cpu_kernels[t->op].shared_work) {
      size_t w = tsr_cpu_kernels[t->op].shared_work(t);
      if (w > shared) shared = w;
    }
  }
  if (shared > be->shared_size) {
    void *w = NULL;
    if (posix_memalign(&w, 64, (shared + 63) & ~(size_t)63))
      return tsr_error_set(TSR_ERR_NOMEM, "cpu backend: cannot allocate %zu bytes of shared "
                           "scratch", shared);
    free(be->shared);
    be->shared = w;
    be->shared_size = shared;
  }
  if (n > be->items_cap) {
    int64_t *items = realloc(be->items, sizeof *items * (size_t)n);
    if (!items) return tsr_error_set(TSR_ERR_NOMEM, "cpu backend: %d work counters", n);
    be->items = items, be->items_cap = n;
  }
  if (n > 0) memset(be->items, 0, sizeof *be->items * (size_t)n);
  need = (need + 63) & ~(size_t)63;
  if (need > be->work_per_thread) {
    size_t total;
    if (!tsr_size_mul(need, (size_t)tsr_threadpool_size(be->pool), &total))
      return tsr_error_set(TSR_ERR_NOMEM, "cpu backend: scratch size overflows");
    void *w = NULL;
    if (posix_memalign(&w, 64, total))
      return tsr_error_set(TSR_ERR_NOMEM, "cpu backend: cannot allocate %zu bytes of scratch",
                           total);
    free(be->work);
    be->work = w;
    be->work_per_thread = need;
  }
  if (be->times && n + 1 > be->stamps_cap) {
    double *s = realloc(be->stamps, sizeof *s * (size_t)(n + 1));
    if (!s) return tsr_error_set(TSR_ERR_NOMEM, "cpu backend: %d node timestamps", n + 1);
    be->stamps = s, be->stamps_cap = n + 1;
  }
  struct cpu_run run = {be, g};
  tsr_threadpool_run(be->pool, cpu_thread, &run);
  /* each node's kind and time, off the clock */
  if (be->times) tsr_op_times_add_graph(be->times, g, tsr_op_registry_name, be->stamps);
  return TSR_OK;
}

static void cpu_free(void *ctx) {
  struct cpu_backend *be = ctx;
  tsr_threadpool_free(be->pool);
  free(be->work);
  free(be->shared);
  free(be->items);
  free(be->stamps);
  free(be);
}

tsr_status tsr_backend_cpu_new(int n_threads, struct tsr_backend **out) {
  *out = NULL;
  if (n_threads <= 0) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    n_threads = cores > 0 ? (int)cores : 1;
  }
  struct cpu_backend *be = calloc(1, sizeof *be);
  struct tsr_backend *b = calloc(1, sizeof *b);
  if (be) be->pool = tsr_threadpool_new(n_threads);
  /* a pool that started fewer threads than asked would run slower unannounced */
  if (be && be->pool && tsr_threadpool_size(be->pool) != n_threads) {
    int started = tsr_threadpool_size(be->pool);
    tsr_threadpool_free(be->pool);
    free(be);
    free(b);
    return tsr_error_set(TSR_ERR_NOMEM, "cpu backend: started only %d of %d threads", started,
                         n_threads);
  }
  if (!be || !b || !be->pool) {
    if (be) tsr_threadpool_free(be->pool);
    free(be);
    free(b);
    return tsr_error_set(TSR_ERR_NOMEM, "cpu backend: cannot start %d threads", n_threads);
  }
  b->i = (struct tsr_backend_i){cpu_name, cpu_supports, cpu_compute, cpu_free,
                                NULL, NULL, NULL, NULL, cpu_probe, cpu_time_nodes, NULL, NULL};
  b->context = be;
  *out = b;
  return TSR_OK;
}

void tsr_backend_cpu_set_activations_q8(struct tsr_backend *b, bool on) {
  ((struct cpu_backend *)b->context)->activations_q8 = on;
}

int tsr_backend_cpu_n_threads(const struct tsr_backend *b) {
  return tsr_threadpool_size(((const struct cpu_backend *)b->context)->pool);
}
