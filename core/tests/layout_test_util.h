/*
** Helpers for the element-wise and normalisation kernel tests: inputs in
** several memory layouts (views, so kernels see real strides), runs at two
** thread counts that must agree bit for bit, element-wise comparison.
*/
#ifndef TSR_LAYOUT_TEST_UTIL_H
#define TSR_LAYOUT_TEST_UTIL_H

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "common/error.h"
#include "op_test_util.h"

static struct tsr_backend *g_be[2]; /* 1 thread, 3 threads */

static bool alloc_graph(struct tsr_graph *g, void **arena) {
  struct tsr_graph_plan plan;
  tsr_status st = tsr_graph_alloc(g, &plan, arena);
  CHECK_MSG(st == TSR_OK, "alloc: %s", tsr_error_message());
  return st == TSR_OK;
}

#define FOR_EACH(t)                                 \
  for (int64_t i3 = 0; i3 < (t)->ne[3]; i3++)       \
    for (int64_t i2 = 0; i2 < (t)->ne[2]; i2++)     \
      for (int64_t i1 = 0; i1 < (t)->ne[1]; i1++)   \
        for (int64_t i0 = 0; i0 < (t)->ne[0]; i0++)

enum layout {
  LAYOUT_CONTIG,
  LAYOUT_TRANSPOSED, /* dims 0 and 1 swapped in memory: nb0 is a row */
  LAYOUT_PADDED,     /* rows at a stride longer than ne0, from a byte offset */
  LAYOUT_PERMUTED,   /* dims 1 and 2 swapped in memory */
  LAYOUT_COUNT,
};

/* A tensor of shape ne laid out as asked, built from a leaf of the graph. */
static struct tsr_tensor *input_dt(struct tsr_graph *g, enum tsr_dtype dt, const int64_t ne[4],
                                   enum layout l) {
  switch (l) {
  case LAYOUT_CONTIG:
    return tsr_new_tensor(g, dt, 4, ne);
  case LAYOUT_TRANSPOSED:
    return tsr_transpose(g, tsr_new_tensor_4d(g, dt, ne[1], ne[0], ne[2], ne[3]));
  case LAYOUT_PADDED: {
    struct tsr_tensor *b = tsr_new_tensor_4d(g, dt, ne[0] + 3, ne[1], ne[2], ne[3]);
    return b ? tsr_view(g, b, 4, ne, b->nb, b->nb[0]) : NULL;
  }
  case LAYOUT_PERMUTED:
    return tsr_permute(g, tsr_new_tensor_4d(g, dt, ne[0], ne[2], ne[1], ne[3]), 0, 2, 1, 3);
  case LAYOUT_COUNT:
    break;
  }
  return NULL;
}

static struct tsr_tensor *input(struct tsr_graph *g, const int64_t ne[4], enum layout l) {
  return input_dt(g, TSR_F32, ne, l);
}

static const char *layout_name(enum layout l) {
  static const char *names[] = {"contiguous", "transposed", "padded", "permuted"};
  return names[l];
}

/* Runs g with 1 and then 3 threads, out poisoned with NaN before each run:
** both runs must write every element and agree bit for bit. */
static bool run_threads(struct tsr_graph *g, struct tsr_tensor *out) {
  size_t n = tsr_tensor_nbytes(out);
  void *first = malloc(n);
  bool ok = first != NULL;
  for (int k = 0; k < 2 && ok; k++) {
    memset(out->data, 0xff, n);
    tsr_status st = tsr_backend_compute(g_be[k], g);
    CHECK_MSG(st == TSR_OK, "compute: %s", tsr_error_message());
    ok = st == TSR_OK;
    if (ok && k == 0) memcpy(first, out->data, n);
  }
  if (ok) CHECK_MSG(memcmp(first, out->data, n) == 0, "1 and 3 threads differ");
  free(first);
  return ok;
}

/* Compares out (contiguous) with want[] in out's element order: every
** element within atol + rtol*|want|; reports the first miss and the count. */
static void expect_close(const struct tsr_tensor *out, const double *want, double atol,
                         double rtol, const char *what) {
  const float *got = out->data;
  int64_t n = tsr_tensor_nelements(out), bad = 0, first = -1;
  for (int64_t i = 0; i < n; i++) {
    if (!(fabs(got[i] - want[i]) <= atol + rtol * fabs(want[i]))) {
      if (first < 0) first = i;
      bad++;
    }
  }
  CHECK_MSG(bad == 0, "%s: %lld of %lld elements off; first at %lld: %.9g, want %.9g", what,
            (long long)bad, (long long)n, (long long)first, first >= 0 ? got[first] : 0.0,
            first >= 0 ? want[first] : 0.0);
}

#endif
