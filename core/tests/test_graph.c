/* Graph builder, views, liveness planner, thread pool, and the slot sum plugins build. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "abi/plugin_host.h"
#include "graph/backend.h"
#include "cpu/threadpool.h"
#include "graph/graph.h"
#include "harness.h"
#include "op_test_util.h"
#include "tessera/plugin/graph.h"

static void test_views_share_bytes_without_copy(void) {
  struct tsr_graph *g = tsr_graph_new(64);
  float buf[2 * 3 * 4];
  for (int i = 0; i < 24; i++) buf[i] = (float)i;
  struct tsr_tensor *a = tsr_new_external(g, TSR_F32, 3, (int64_t[]){2, 3, 4}, buf);
  struct tsr_tensor *r = tsr_reshape(g, a, 2, (int64_t[]){6, 4});
  struct tsr_tensor *p = tsr_permute(g, a, 2, 0, 1, 3); /* [2,3,4] -> [3,4,2] */
  struct tsr_tensor *tr = tsr_transpose(g, r);          /* [4,6] */
  size_t nb[2] = {sizeof(float), 6 * sizeof(float)};
  struct tsr_tensor *v = tsr_view(g, a, 2, (int64_t[]){3, 2}, nb, 2 * sizeof(float));
  CHECK_OK(tsr_graph_status(g));
  CHECK(r && r->data == buf && r->ne[0] == 6 && r->ne[1] == 4);
  CHECK(p && p->data == buf && p->ne[0] == 3 && p->ne[1] == 4 && p->ne[2] == 2);
  /* element (i0,i1,i2) of the permute is a[i2, i0, i1] */
  CHECK(p && *(float *)tsr_tensor_ptr(p, 1, 2, 1, 0) == buf[1 + 2 * 1 + 6 * 2]);
  CHECK(tr && *(float *)tsr_tensor_ptr(tr, 3, 5, 0, 0) == buf[5 + 6 * 3]);
  CHECK(v && *(float *)tsr_tensor_ptr(v, 0, 1, 0, 0) == buf[2 + 6]);
  CHECK(!tsr_tensor_is_contiguous(p) && tsr_tensor_is_contiguous(r));
  tsr_graph_free(g);
}

static void test_view_past_end_is_refused(void) {
  struct tsr_graph *g = tsr_graph_new(8);
  float buf[8];
  struct tsr_tensor *a = tsr_new_external(g, TSR_F32, 1, (int64_t[]){8}, buf);
  struct tsr_tensor *v = tsr_view(g, a, 1, (int64_t[]){4}, (size_t[]){4}, 5 * sizeof(float));
  CHECK(v == NULL);
  CHECK(tsr_graph_status(g) == TSR_ERR_INVALID_ARG);
  CHECK(strstr(tsr_error_message(), "past") != NULL);
  /* later builders see the recorded error and return NULL too */
  CHECK(tsr_scale(g, a, 2.0f) == NULL);
  tsr_graph_free(g);
}

static void test_builder_rejects_mismatched_mat_mul(void) {
  struct tsr_graph *g = tsr_graph_new(8);
  struct tsr_tensor *w = tsr_new_tensor_2d(g, TSR_F32, 16, 4);
  struct tsr_tensor *x = tsr_new_tensor_2d(g, TSR_F32, 15, 3);
  tsr_tensor_set_name(w, "blk.0.attn_q.weight");
  CHECK(tsr_mat_mul(g, w, x) == NULL);
  CHECK(strstr(tsr_error_message(), "blk.0.attn_q.weight") != NULL);
  tsr_graph_free(g);
}

static void test_graph_capacity_is_an_error(void) {
  struct tsr_graph *g = tsr_graph_new(2);
  struct tsr_tensor *a = tsr_new_tensor_1d(g, TSR_F32, 4);
  struct tsr_tensor *b = tsr_scale(g, a, 1.0f);
  CHECK(b != NULL);
  CHECK(tsr_scale(g, b, 1.0f) == NULL);
  CHECK(tsr_graph_status(g) == TSR_ERR_NOMEM);
  tsr_graph_free(g);
}

/* True if the byte ranges of two planned tensors overlap. */
static int overlaps(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *b) {
  size_t oa = tsr_graph_offset_of(g, a), ob = tsr_graph_offset_of(g, b);
  return oa < ob + tsr_tensor_nbytes(b) && ob < oa + tsr_tensor_nbytes(a);
}

static void test_planner_reuses_dead_memory(void) {
  struct tsr_graph *g = tsr_graph_new(64);
  struct tsr_tensor *x = tsr_new_tensor_2d(g, TSR_F32, 1000, 4);
  struct tsr_tensor *t[8];
  t[0] = tsr_scale(g, x, 2.0f);
  for (int i = 1; i < 8; i++) t[i] = tsr_scale(g, t[i - 1], 2.0f);
  tsr_graph_mark_output(t[7]);
  struct tsr_graph_plan plan;
  CHECK_OK(tsr_graph_plan(g, &plan));
  CHECK(plan.n_nodes == 8);
  /* a chain needs the input plus two live intermediates at a time */
  size_t one = tsr_tensor_nbytes(x);
  CHECK_MSG(plan.arena_bytes <= 3 * one + 3 * TSR_ARENA_ALIGN, "arena %zu for chain of %zu",
            plan.arena_bytes, one);
  CHECK(plan.naive_bytes >= 9 * one);
  /* the input lives throughout: nothing may share its bytes */
  for (int i = 0; i < 8; i++) CHECK(!overlaps(g, x, t[i]));
  /* a node never shares bytes with its own source */
  for (int i = 1; i < 8; i++) CHECK(!overlaps(g, t[i - 1], t[i]));
  tsr_graph_free(g);
}

static void test_planner_keeps_views_and_outputs_alive(void) {
  struct tsr_graph *g = tsr_graph_new(64);
  struct tsr_tensor *x = tsr_new_tensor_2d(g, TSR_F32, 256, 2);
  struct tsr_tensor *a = tsr_scale(g, x, 1.0f);
  struct tsr_tensor *av = tsr_reshape(g, a, 1, (int64_t[]){512});
  struct tsr_tensor *b = tsr_scale(g, x, 3.0f);
  struct tsr_tensor *c = tsr_scale(g, b, 3.0f);
  struct tsr_tensor *d = tsr_scale(g, av, 1.0f); /* reads a through its view, last */
  struct tsr_tensor *early_out = tsr_scale(g, x, 5.0f);
  struct tsr_tensor *e = tsr_scale(g, d, 1.0f);
  tsr_graph_mark_output(early_out);
  tsr_graph_mark_output(e);
  tsr_graph_mark_output(c);
  struct tsr_graph_plan plan;
  CHECK_OK(tsr_graph_plan(g, &plan));
  /* a is read (via av) by d, so b and c, computed in between, must not take its bytes */
  CHECK(!overlaps(g, a, b) && !overlaps(g, a, c));
  CHECK(tsr_graph_offset_of(g, av) == (size_t)-1); /* views own nothing */
  /* an output computed early is not overwritten by anything later */
  CHECK(!overlaps(g, early_out, e) && !overlaps(g, early_out, d));
  void *arena = NULL;
  tsr_graph_free(g);
  g = tsr_graph_new(8);
  x = tsr_new_tensor_1d(g, TSR_F32, 16);
  struct tsr_tensor *xv = tsr_view(g, x, 1, (int64_t[]){8}, (size_t[]){4}, 8 * sizeof(float));
  CHECK_OK(tsr_graph_alloc(g, &plan, &arena));
  CHECK(xv->data == (char *)x->data + 8 * sizeof(float));
  free(arena);
  tsr_graph_free(g);
}

static void test_backend_refuses_unbound_graph(void) {
  struct tsr_backend *be = NULL;
  CHECK_OK(tsr_backend_cpu_new(2, &be));
  struct tsr_graph *g = tsr_graph_new(8);
  struct tsr_tensor *x = tsr_new_tensor_1d(g, TSR_F32, 16);
  tsr_scale(g, x, 2.0f);
  CHECK(tsr_backend_compute(be, g) == TSR_ERR_INVALID_ARG);
  CHECK(strstr(tsr_error_message(), "no memory") != NULL);
  tsr_graph_free(g);
  tsr_backend_free(be);
}

static void test_backend_refuses_unsupported_weight_type(void) {
  struct tsr_backend *be = NULL;
  CHECK_OK(tsr_backend_cpu_new(1, &be));
  struct tsr_graph *g = tsr_graph_new(8);
  static uint8_t iq[66 * 2];
  struct tsr_tensor *w = tsr_new_external(g, TSR_IQ2_XXS, 2, (int64_t[]){256, 2}, iq);
  tsr_tensor_set_name(w, "blk.3.ffn_up.weight");
  struct tsr_tensor *x = tsr_new_tensor_2d(g, TSR_F32, 256, 1);
  tsr_mat_mul(g, w, x);
  CHECK(tsr_backend_check_graph(be, g) != TSR_OK);
  CHECK_MSG(strstr(tsr_error_message(), "iq2_xxs") != NULL, "%s", tsr_error_message());
  tsr_graph_free(g);
  tsr_backend_free(be);
}

struct pool_job {
  atomic_int phase_sum[4];
  int seen_wrong;
};

static struct tsr_threadpool *g_pool;

/* tsr_graph_sum_slots (tessera/plugin/graph.h) against adding the slots one by one: every
** slot count from 1 to 9 (odd counts carry a slot to the end), through the host's graph
** builders as a plugin calls them. */
static void test_sum_slots_adds_every_slot(void) {
  const struct tsr_host_graph *gr = tsr_plugin_host_services()->graph;
  const int64_t a = 5, n = 3;
  for (int64_t k = 1; k <= 9; k++) {
    struct tsr_test_graph tg;
    tsr_test_graph_init(&tg, 128);
    struct tsr_tensor *t = tsr_new_tensor_3d(tg.g, TSR_F32, a, k, n);
    struct tsr_tensor *y = tsr_graph_sum_slots(gr, tg.g, t);
    CHECK_MSG(y != NULL, "k %lld: %s", (long long)k, tsr_error_message());
    if (!y) {
      tsr_test_graph_free(&tg);
      continue;
    }
    tsr_graph_mark_output(y);
    CHECK(y->ne[0] == a && y->ne[1] == n && y->ne[2] == 1);
    CHECK_OK(tsr_test_graph_alloc(&tg));
    tsr_test_fill_normal(t, 1.0f);
    CHECK_OK(tsr_test_graph_run(&tg, 2));
    for (int64_t j = 0; j < n; j++)
      for (int64_t i = 0; i < a; i++) {
        double want = 0.0;
        for (int64_t s = 0; s < k; s++) want += tsr_test_get(t, i, s, j, 0);
        const double got = tsr_test_get(y, i, j, 0, 0);
        CHECK_MSG(fabs(got - want) <= 1e-5 * (1.0 + fabs(want)), "k %lld [%lld,%lld]: %g, want %g",
                  (long long)k, (long long)i, (long long)j, got, want);
      }
    tsr_test_graph_free(&tg);
  }
}

static void pool_fn(void *arg, int ith, int nth) {
  struct pool_job *j = arg;
  for (int phase = 0; phase < 4; phase++) {
    atomic_fetch_add(&j->phase_sum[phase], ith + 1);
    tsr_threadpool_barrier(g_pool);
    /* after the barrier every thread's contribution to this phase is visible */
    if (atomic_load(&j->phase_sum[phase]) != nth * (nth + 1) / 2) j->seen_wrong = 1;
  }
}

static void test_threadpool_barrier_orders_phases(void) {
  for (int n = 1; n <= 4; n++) {
    g_pool = tsr_threadpool_new(n);
    CHECK(g_pool && tsr_threadpool_size(g_pool) == n);
    for (int rep = 0; rep < 50; rep++) {
      struct pool_job j = {0};
      tsr_threadpool_run(g_pool, pool_fn, &j);
      CHECK(!j.seen_wrong);
      for (int p = 0; p < 4; p++) CHECK(atomic_load(&j.phase_sum[p]) == n * (n + 1) / 2);
    }
    tsr_threadpool_free(g_pool);
  }
}

int main(void) {
  TSR_RUN(test_views_share_bytes_without_copy);
  TSR_RUN(test_view_past_end_is_refused);
  TSR_RUN(test_builder_rejects_mismatched_mat_mul);
  TSR_RUN(test_graph_capacity_is_an_error);
  TSR_RUN(test_planner_reuses_dead_memory);
  TSR_RUN(test_planner_keeps_views_and_outputs_alive);
  TSR_RUN(test_backend_refuses_unbound_graph);
  TSR_RUN(test_backend_refuses_unsupported_weight_type);
  TSR_RUN(test_threadpool_barrier_orders_phases);
  TSR_RUN(test_sum_slots_adds_every_slot);
  return TSR_TEST_EXIT();
}
