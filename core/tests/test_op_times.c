/* Node timing (core/graph/op_times.h): kinds, their overflow, the order of the report, and
** the cpu backend adding exactly the nodes of the computes made while timing is on. */
#include <string.h>

#include "common/error.h"
#include "op_test_util.h"
#include "graph/op_times.h"

static const char *registered_name(int32_t op_id) { return op_id == 7 ? "dca_rotate_query" : NULL; }

static void kind_names_what_decides_the_speed(void) {
  struct tsr_graph *g = tsr_graph_new(32);
  struct tsr_tensor *w = tsr_new_tensor_2d(g, TSR_Q4_K, 256, 8);
  char key[48];
  tsr_op_times_key(tsr_mat_mul(g, w, tsr_new_tensor_2d(g, TSR_F32, 256, 1)), NULL, key, sizeof key);
  CHECK(!strcmp(key, "mat_mul q4_K n=1"));
  tsr_op_times_key(tsr_mat_mul(g, w, tsr_new_tensor_2d(g, TSR_F32, 256, 16)), NULL, key, sizeof key);
  CHECK(!strcmp(key, "mat_mul q4_K n=2-16"));
  tsr_op_times_key(tsr_mat_mul(g, w, tsr_new_tensor_2d(g, TSR_F32, 256, 17)), NULL, key, sizeof key);
  CHECK(!strcmp(key, "mat_mul q4_K n>16"));
  struct tsr_tensor *q = tsr_new_tensor_3d(g, TSR_F32, 64, 4, 2);
  struct tsr_tensor *k = tsr_new_tensor_3d(g, TSR_Q8_0, 64, 32, 1);
  struct tsr_tensor *v = tsr_new_tensor_3d(g, TSR_Q4_0, 64, 32, 1);
  const struct tsr_attn_params ap = {.scale = 0.125f};
  tsr_op_times_key(tsr_flash_attn(g, q, k, v, NULL, NULL, NULL, &ap), NULL, key, sizeof key);
  CHECK_MSG(!strcmp(key, "flash_attn K q8_0 V q4_0"), "%s", key);
  struct tsr_tensor *n = tsr_rms_norm(g, q, NULL, 1e-6f);
  tsr_op_times_key(n, NULL, key, sizeof key);
  CHECK(!strcmp(key, "rms_norm"));
  n->op = TSR_OP_CUSTOM; /* a plugin op goes by its registered name */
  n->op_params[0] = 7;
  tsr_op_times_key(n, registered_name, key, sizeof key);
  CHECK(!strcmp(key, "dca_rotate_query"));
  CHECK_OK(tsr_graph_status(g));
  tsr_graph_free(g);
}

static void kinds_past_the_table_share_one_row(void) {
  struct tsr_op_times t = {0};
  char key[48];
  for (int i = 0; i < TSR_OP_TIMES_KINDS + 10; i++) {
    snprintf(key, sizeof key, "kind %d", i);
    tsr_op_times_add(&t, key, 1.0);
  }
  tsr_op_times_add(&t, "kind 3", 2.0);
  CHECK(t.n_kinds == TSR_OP_TIMES_KINDS);
  CHECK(!strcmp(t.kind[TSR_OP_TIMES_KINDS - 1].name, "(other kinds)"));
  CHECK(t.kind[TSR_OP_TIMES_KINDS - 1].calls == 11);
  CHECK(t.kind[3].calls == 2 && t.kind[3].seconds == 3.0);
  CHECK(t.node_seconds == TSR_OP_TIMES_KINDS + 10 + 2.0);
  tsr_op_times_sort(&t);
  CHECK(!strcmp(t.kind[0].name, "(other kinds)") && !strcmp(t.kind[1].name, "kind 3"));
  for (int i = 1; i < t.n_kinds; i++) CHECK(t.kind[i - 1].seconds >= t.kind[i].seconds);
}

static void a_backend_that_cannot_time_says_so(void) {
  struct tsr_backend *be = NULL;
  CHECK_OK(tsr_backend_cpu_new(1, &be));
  be->i.time_nodes = NULL;
  struct tsr_op_times t = {0};
  CHECK(tsr_backend_time_nodes(be, &t) == TSR_ERR_UNSUPPORTED);
  CHECK(strstr(tsr_error_message(), "cpu backend cannot time its nodes") != NULL);
  CHECK(be->times == NULL);
  tsr_backend_free(be);
}

static void the_cpu_backend_times_the_nodes_of_timed_computes_only(void) {
  struct tsr_test_graph tg;
  tsr_test_graph_init(&tg, 16);
  struct tsr_tensor *a = tsr_new_tensor_2d(tg.g, TSR_F32, 256, 64);
  struct tsr_tensor *y = tsr_scale(tg.g, tsr_rms_norm(tg.g, a, NULL, 1e-6f), 2.0f);
  tsr_graph_mark_output(y);
  CHECK_OK(tsr_test_graph_alloc(&tg));
  tsr_test_fill_uniform(a, -1, 1);
  struct tsr_backend *be = NULL;
  CHECK_OK(tsr_backend_cpu_new(2, &be));
  struct tsr_op_times t = {0};
  CHECK_OK(tsr_backend_compute(be, tg.g)); /* not timed */
  CHECK_OK(tsr_backend_time_nodes(be, &t));
  for (int i = 0; i < 3; i++) CHECK_OK(tsr_backend_compute(be, tg.g));
  CHECK_OK(tsr_backend_time_nodes(be, NULL));
  CHECK_OK(tsr_backend_compute(be, tg.g)); /* not timed */
  CHECK(t.computes == 3 && t.n_kinds == 2);
  for (int k = 0; k < t.n_kinds; k++) {
    CHECK(t.kind[k].calls == 3 && t.kind[k].seconds > 0);
    CHECK(!strcmp(t.kind[k].name, "rms_norm") || !strcmp(t.kind[k].name, "scale"));
  }
  CHECK(t.node_seconds > 0 && t.node_seconds <= t.compute_seconds);
  tsr_backend_free(be);
  tsr_test_graph_free(&tg);
}

int main(void) {
  TSR_RUN(kind_names_what_decides_the_speed);
  TSR_RUN(kinds_past_the_table_share_one_row);
  TSR_RUN(a_backend_that_cannot_time_says_so);
  TSR_RUN(the_cpu_backend_times_the_nodes_of_timed_computes_only);
  return TSR_TEST_EXIT();
}
