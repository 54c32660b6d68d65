/* Time per kind of graph node (core/graph/op_times.h). */
#include "graph/op_times.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/dtype.h"
#include "graph/graph_internal.h"

void tsr_op_times_key(const struct tsr_tensor *t, const char *(*op_name)(int32_t op_id), char *buf,
                      size_t n) {
  const char *custom = t->op == TSR_OP_CUSTOM && op_name ? op_name(t->op_params[0]) : NULL;
  const char *op = custom ? custom : tsr_op_name(t->op);
  if ((t->op == TSR_OP_MAT_MUL || t->op == TSR_OP_MAT_MUL_ID) && t->src[0] && t->src[1]) {
    /* columns per weight matrix: mat_mul's x [K, N, ...], mat_mul_id's tokens */
    const int64_t cols = t->op == TSR_OP_MAT_MUL ? t->src[1]->ne[1] : t->src[1]->ne[2];
    snprintf(buf, n, "%s %s %s", op, tsr_dtype_name(t->src[0]->dtype),
             cols <= 1 ? "n=1" : cols <= 16 ? "n=2-16" : "n>16");
  } else if (t->op == TSR_OP_FLASH_ATTN && t->src[1] && t->src[2]) {
    snprintf(buf, n, "%s K %s V %s", op, tsr_dtype_name(t->src[1]->dtype),
             tsr_dtype_name(t->src[2]->dtype));
  } else {
    snprintf(buf, n, "%s", op);
  }
}

static int find(const struct tsr_op_times *acc, const char *key) {
  for (int k = 0; k < acc->n_kinds; k++)
    if (!strcmp(acc->kind[k].name, key)) return k;
  return -1;
}

void tsr_op_times_add(struct tsr_op_times *acc, const char *key, double seconds) {
  acc->node_seconds += seconds;
  int k = find(acc, key);
  if (k < 0 && acc->n_kinds >= TSR_OP_TIMES_KINDS - 1) k = find(acc, key = "(other kinds)");
  if (k < 0) {
    k = acc->n_kinds++;
    snprintf(acc->kind[k].name, sizeof acc->kind[k].name, "%s", key);
    acc->kind[k].calls = 0, acc->kind[k].seconds = 0;
  }
  acc->kind[k].calls++;
  acc->kind[k].seconds += seconds;
}

void tsr_op_times_add_graph(struct tsr_op_times *acc, const struct tsr_graph *g,
                            const char *(*op_name)(int32_t op_id), const double *stamps) {
  int k = 0;
  for (int i = 0; i < g->n; i++) {
    if (!tsr_op_computes(&g->tensors[i])) continue;
    char key[48];
    tsr_op_times_key(&g->tensors[i], op_name, key, sizeof key);
    tsr_op_times_add(acc, key, stamps[k + 1] - stamps[k]);
    k++;
  }
}

static int by_seconds(const void *a, const void *b) {
  const double x = ((const struct tsr_op_kind_time *)a)->seconds;
  const double y = ((const struct tsr_op_kind_time *)b)->seconds;
  return x < y ? 1 : x > y ? -1 : 0;
}

void tsr_op_times_sort(struct tsr_op_times *acc) {
  qsort(acc->kind, (size_t)acc->n_kinds, sizeof *acc->kind, by_seconds);
}
