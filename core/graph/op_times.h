/*
** Time per kind of graph node, summed over the computes a backend runs while
** its node timing is on (`tessera bench --op-times`): where a step's time goes.
**
** A kind is the op's name, with what decides its speed: mat_mul / mat_mul_id
** the weight type and the column count class (n=1 decode, n=2-16 verification
** batches, n>16 prefill), flash_attn the K/V types, a plugin op its registered
** name. The cpu backend times a node on the host clock between the barriers
** around it; the cuda backend with events on its stream, so a node's time runs
** from the end of the previous node to the end of this one and includes any
** time the GPU waited for the host to launch it.
*/
#ifndef TSR_OP_TIMES_H
#define TSR_OP_TIMES_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "graph/tensor.h"

struct tsr_graph;

#define TSR_OP_TIMES_KINDS 64 /* the last one collects every kind past the others */

struct tsr_op_kind_time {
  char name[48];
  int64_t calls;
  double seconds;
};

struct tsr_op_times {
  struct tsr_op_kind_time kind[TSR_OP_TIMES_KINDS];
  int n_kinds;
  int64_t computes;
  double compute_seconds; /* host clock around whole computes (uploads and downloads in) */
  double node_seconds;    /* the nodes' times summed */
};

/* The kind of node t into buf; op_name names a plugin op by its registered id. */
void tsr_op_times_key(const struct tsr_tensor *t, const char *(*op_name)(int32_t op_id), char *buf,
                      size_t n);
/* The nodes of one compute of g in order: stamps[k] and stamps[k + 1] (seconds) bound
** the k-th tensor that computes (tsr_op_computes). */
void tsr_op_times_add_graph(struct tsr_op_times *acc, const struct tsr_graph *g,
                            const char *(*op_name)(int32_t op_id), const double *stamps);
/* One call of kind `key` that took `seconds`. */
void tsr_op_times_add(struct tsr_op_times *acc, const char *key, double seconds);
/* Kinds by time, longest first. */
void tsr_op_times_sort(struct tsr_op_times *acc);

/* Seconds on the monotonic clock, for host-side timings. */
static inline double tsr_op_times_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
