/*
** CPU kernels. Every thread of the pool calls the kernel of a node with its
** own ith in [0, nth); the kernel computes its share and returns. A kernel
** may ask for per-thread scratch (work) sized from the node's shapes.
** check() runs before anything executes and rejects what the kernel cannot
** do (an unsupported dtype, say) with a message naming the tensor.
*/
#ifndef TSR_CPU_OPS_H
#define TSR_CPU_OPS_H

#include "common/error.h"
#include "graph/tensor.h"

struct tsr_threadpool;

struct tsr_cpu_compute {
  int ith, nth;
  void *work;        /* this thread's scratch, work_size bytes, 64-aligned */
  size_t work_size;
  bool activations_q8;      /* decode's products on the vector quantized to 8 bits (gemv: q8) */
  void *shared;             /* the node's scratch every thread sees (the kernel's shared_work
                            ** bytes, 64-aligned); written before tsr_cpu_sync, read after */
  int64_t *next_item;       /* the node's work counter, 0 when the node starts: tsr_cpu_take */
  struct tsr_threadpool *pool;
};

typedef void (*tsr_cpu_kernel_fn)(const struct tsr_cpu_compute *c, struct tsr_tensor *dst);
typedef size_t (*tsr_cpu_work_fn)(const struct tsr_tensor *dst);
typedef tsr_status (*tsr_cpu_check_fn)(const struct tsr_tensor *dst);

struct tsr_cpu_kernel {
  tsr_cpu_kernel_fn run;
  tsr_cpu_work_fn work;   /* NULL: no scratch */
  tsr_cpu_check_fn check; /* NULL: builder checks suffice */
  tsr_cpu_work_fn shared_work; /* NULL: no shared scratch */
};

/* Waits until every thread of the node has called it (a kernel's phases: each thread
** writes its share of c->shared, then all read the whole). */
void tsr_cpu_sync(const struct tsr_cpu_compute *c);

/* The next of the node's n work items not yet taken by any thread, or n when none is left:
** items go to whichever thread is free, so a thread the machine slows down takes fewer.
** Kernels whose outputs do not depend on which thread computes an item use it. */
static inline int64_t tsr_cpu_take(const struct tsr_cpu_compute *c, int64_t n) {
  const int64_t i = __atomic_fetch_add(c->next_item, 1, __ATOMIC_RELAXED);
  return i < n ? i : n;
}

/* Split [0, n) into nth near-equal parts; this thread's is [*lo, *hi). */
static inline void tsr_cpu_split(const struct tsr_cpu_compute *c, int64_t n,
                                 int64_t *lo, int64_t *hi) {
  int64_t per = (n + c->nth - 1) / c->nth;
  int64_t a = per * c->ith, b = a + per;
  *lo = a < n ? a : n;
  *hi = b < n ? b : n;
}

/* Row r of t's rows, as (i1, i2, i3). */
static inline void tsr_cpu_row_coords(const struct tsr_tensor *t, int64_t r, int64_t *i1,
                                      int64_t *i2, int64_t *i3) {
  *i1 = r % t->ne[1];
  r /= t->ne[1];
  *i2 = r % t->ne[2];
  *i3 = r / t->ne[2];
}

static inline const char *tsr_cpu_row_at(const struct tsr_tensor *t, int64_t i1, int64_t i2,
                                         int64_t i3) {
  return (const char *)t->data + i1 * (int64_t)t->nb[1] + i2 * (int64_t)t->nb[2] +
         i3 * (int64_t)t->nb[3];
}

/* Element j of an f32 row with element stride nb0 (memcpy: views may be unaligned). */
static inline float tsr_cpu_load_f32(const char *row, size_t nb0, int64_t j) {
  float v;
  __builtin_memcpy(&v, row + j * (int64_t)nb0, sizeof v);
  return v;
}

/* n values of an f32 row with element stride nb0, into contiguous y. */
void tsr_cpu_load_row_f32(float *y, const char *row, size_t nb0, int64_t n);

/* One row (n values) of any dequantizable tensor to f32; plain types honour
** nb[0], so strided views work (cpu_rows.c). */
void tsr_cpu_row_to_f32(const struct tsr_tensor *t, const char *row, float *out, int64_t n);

/* One entry per op (core/cpu/cpu_kernels.c). */
extern const struct tsr_cpu_kernel tsr_cpu_kernels[TSR_OP_COUNT];

#define TSR_CPU_KERNEL(op) \
  void tsr_cpu_##op(const struct tsr_cpu_compute *c, struct tsr_tensor *dst)

/* cpu_probe.c: the hardware ceilings of `tessera bench` (the backend's probe) */
struct tsr_threadpool;
struct tsr_backend_ceilings;
/* the ceilings (cpu_probe.c); q8: the products run on 8-bit activations */
tsr_status tsr_cpu_probe(struct tsr_threadpool *pool, bool q8, struct tsr_backend_ceilings *out);

/* ops_matmul.c */
TSR_CPU_KERNEL(get_rows);
TSR_CPU_KERNEL(mat_mul);
size_t tsr_cpu_mat_mul_work(const struct tsr_tensor *dst);
size_t tsr_cpu_mat_mul_shared(const struct tsr_tensor *dst);
tsr_status tsr_cpu_mat_mul_check(const struct tsr_tensor *dst);
TSR_CPU_KERNEL(mat_mul_id);
size_t tsr_cpu_mat_mul_id_work(const struct tsr_tensor *dst);
tsr_status tsr_cpu_get_rows_check(const struct tsr_tensor *dst);

/* ops_copy.c */
TSR_CPU_KERNEL(cpy);
size_t tsr_cpu_cpy_work(const struct tsr_tensor *dst);
tsr_status tsr_cpu_cpy_check(const struct tsr_tensor *dst);
TSR_CPU_KERNEL(set_rows);
size_t tsr_cpu_set_rows_work(const struct tsr_tensor *dst);
tsr_status tsr_cpu_set_rows_check(const struct tsr_tensor *dst);
TSR_CPU_KERNEL(concat);
TSR_CPU_KERNEL(top_k);
size_t tsr_cpu_top_k_work(const struct tsr_tensor *dst);
TSR_CPU_KERNEL(argmax);

/* ops_elementwise.c */
TSR_CPU_KERNEL(add);
TSR_CPU_KERNEL(mul);
TSR_CPU_KERNEL(scale);
TSR_CPU_KERNEL(unary);
TSR_CPU_KERNEL(glu);
TSR_CPU_KERNEL(softcap);

/* ops_norm.c */
TSR_CPU_KERNEL(rms_norm);
TSR_CPU_KERNEL(l2_norm);
TSR_CPU_KERNEL(softmax);
TSR_CPU_KERNEL(rope);

/* ops_custom.c: plugin-registered ops */
TSR_CPU_KERNEL(custom);
tsr_status tsr_cpu_custom_check(const struct tsr_tensor *dst);

/* ops_attention.c */
TSR_CPU_KERNEL(flash_attn);
size_t tsr_cpu_flash_attn_work(const struct tsr_tensor *dst);

#endif
