/*
** cpy (copy and cast), set_rows, concat, top_k and argmax on the CPU.
**
** cpy follows ggml: elements are taken in row-major order (i0 fastest) from
** the source and written in row-major order into the destination, so the
** two shapes may differ as long as the element counts agree. A copy within
** one dtype moves bytes (elements, or whole blocks for block types: both
** ne0 are multiples of the block size, so block boundaries line up) and is
** exact; a cast goes through f32 one destination row at a time.
**
** set_rows: each target row is owned by one thread (rows are dealt out by
** a hash of row and batch), and that thread applies the writes to it in
** index order, so when an index repeats the last source row in index order
** wins, and no two threads ever write one row. An index outside [0, R) is
** skipped: the target row keeps what it held.
**
** top_k and argmax order values by size with NaN below every number; ties
** go to the lower index. So argmax never picks a NaN unless the whole row is
** NaN (then it returns 0), and top_k lists NaNs last, in index order, only
** when k exceeds the number of non-NaN values.
*/
#include <string.h>

#include "cpu_ops.h"

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static const char *label(const struct tsr_tensor *t) { return t->name[0] ? t->name : "(unnamed)"; }


/* n f32 values into one row of any quantizable tensor; plain types honour nb[0]. */
static void row_from_f32(const struct tsr_tensor *t, const float *in, char *row, int64_t n) {
  const struct tsr_dtype_traits *tr = tsr_dtype_traits((int)t->dtype);
  if (tr->block_size > 1 || t->nb[0] == tr->type_size) {
    tr->from_f32(in, row, n);
    return;
  }
  const size_t nb0 = t->nb[0];
  char tmp[16];
  for (int64_t i = 0; i < n; i++) {
    tr->from_f32(&in[i], tmp, 1);
    memcpy(row + (size_t)i * nb0, tmp, tr->type_size);
  }
}

/* Byte address of row r (flat over dims 1..3) of t. */
static char *row_ptr(const struct tsr_tensor *t, int64_t r) {
  int64_t i1 = r % t->ne[1], i2 = (r / t->ne[1]) % t->ne[2], i3 = r / (t->ne[1] * t->ne[2]);
  return (char *)t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}

/* ---- cpy ---------------------------------------------------------------- */

tsr_status tsr_cpu_cpy_check(const struct tsr_tensor *dst) {
  const struct tsr_tensor *a = dst->src[0];
  const struct tsr_tensor *target = dst->src[1] ? dst->src[1] : dst;
  if (tsr_tensor_nelements(a) != tsr_tensor_nelements(dst))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "cpy: '%s' and '%s' differ in element count",
                         label(a), label(target));
  int64_t bs_a = tsr_dtype_block_size(a->dtype), bs_d = tsr_dtype_block_size(dst->dtype);
  if (a->ne[0] % bs_a || dst->ne[0] % bs_d)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "cpy: rows of '%s' (%lld of %s) or '%s' (%lld of "
                         "%s) are not whole blocks", label(a), (long long)a->ne[0],
                         tsr_dtype_name(a->dtype), label(target), (long long)dst->ne[0],
                         tsr_dtype_name(dst->dtype));
  if (a->dtype == dst->dtype) return TSR_OK; /* a byte copy: any dtype */
  const struct tsr_dtype_traits *ta = tsr_dtype_traits((int)a->dtype);
  const struct tsr_dtype_traits *td = tsr_dtype_traits((int)dst->dtype);
  if (!ta || !ta->to_f32)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "cpy: source '%s' is %s, which has no dequantizer",
                         label(a), tsr_dtype_name(a->dtype));
  if (!td || !td->from_f32)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "cpy: destination '%s' is %s, which has no "
                         "quantizer", label(target), tsr_dtype_name(dst->dtype));
  if (td->block_size == 1 && td->type_size > 16)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "cpy: destination type %s is too wide",
                         tsr_dtype_name(dst->dtype));
  return TSR_OK;
}

size_t tsr_cpu_cpy_work(const struct tsr_tensor *dst) {
  const struct tsr_tensor *a = dst->src[0];
  if (a->dtype == dst->dtype) return 0;
  return align64((size_t)dst->ne[0] * 4) + align64((size_t)a->ne[0] * 4);
}

/* Same dtype: move units (elements, or blocks) in flat order, one destination
** row per step, in runs that stay inside one source row. */
static void cpy_bytes(const struct tsr_cpu_compute *c, const struct tsr_tensor *a,
                      struct tsr_tensor *dst) {
  const size_t ts = tsr_dtype_type_size(a->dtype);
  if (tsr_tensor_is_contiguous(a) && tsr_tensor_is_contiguous(dst)) {
    int64_t lo, hi;
    tsr_cpu_split(c, (int64_t)tsr_tensor_nbytes(dst), &lo, &hi);
    if (hi > lo) memcpy((char *)dst->data + lo, (const char *)a->data + lo, (size_t)(hi - lo));
    return;
  }
  const int64_t bs = tsr_dtype_block_size(a->dtype);
  const int64_t su = a->ne[0] / bs, du = dst->ne[0] / bs; /* units per row */
  int64_t lo, hi;
  tsr_cpu_split(c, tsr_tensor_nrows(dst), &lo, &hi);
  for (int64_t r = lo; r < hi; r++) {
    char *d = row_ptr(dst, r);
    int64_t flat = r * du, srow = flat / su, s0 = flat % su;
    for (int64_t done = 0; done < du;) {
      int64_t run = du - done < su - s0 ? du - done : su - s0;
      const char *s = row_ptr(a, srow) + s0 * (int64_t)a->nb[0];
      if (a->nb[0] == ts && dst->nb[0] == ts) {
        memcpy(d + done * (int64_t)ts, s, (size_t)run * ts);
      } else {
        for (int64_t i = 0; i < run; i++)
          memcpy(d + (done + i) * (int64_t)dst->nb[0], s + i * (int64_t)a->nb[0], ts);
      }
      done += run;
      s0 = 0;
      srow++;
    }
  }
}

TSR_CPU_KERNEL(cpy) {
  const struct tsr_tensor *a = dst->src[0];
  if (a->dtype == dst->dtype) {
    cpy_bytes(c, a, dst);
    return;
  }
  const int64_t dn = dst->ne[0], sn = a->ne[0];
  float *buf = c->work;
  float *srow_buf = (float *)((char *)c->work + align64((size_t)dn * 4));
  int64_t cached = -1; /* source row now in srow_buf */
  int64_t lo, hi;
  tsr_cpu_split(c, tsr_tensor_nrows(dst), &lo, &hi);
  for (int64_t r = lo; r < hi; r++) {
    if (sn == dn) {
      tsr_cpu_row_to_f32(a, row_ptr(a, r), buf, dn);
    } else {
      int64_t flat = r * dn, srow = flat / sn, s0 = flat % sn;
      for (int64_t done = 0; done < dn;) {
        int64_t run = dn - done < sn - s0 ? dn - done : sn - s0;
        if (srow != cached) {
          tsr_cpu_row_to_f32(a, row_ptr(a, srow), srow_buf, sn);
          cached = srow;
        }
        memcpy(buf + done, srow_buf + s0, (size_t)run * sizeof *buf);
        done += run;
        s0 = 0;
        srow++;
      }
    }
    row_from_f32(dst, buf, row_ptr(dst, r), dn);
  }
}

/* ---- set_rows ------------------------------------------------------------- */

tsr_status tsr_cpu_set_rows_check(const struct tsr_tensor *dst) {
  const struct tsr_tensor *target = dst->src[0];
  const struct tsr_dtype_traits *tr = tsr_dtype_traits((int)dst->dtype);
  if (!tr || !tr->from_f32)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "set_rows: target '%s' is %s, which has no "
                         "quantizer", label(target), tsr_dtype_name(dst->dtype));
  if (tr->block_size == 1 && tr->type_size > 16)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "set_rows: target type %s is too wide",
                         tsr_dtype_name(dst->dtype));
  if (dst->ne[0] % tr->block_size)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "set_rows: rows of '%s' (%lld) are not whole %s "
                         "blocks", label(target), (long long)dst->ne[0], tr->name);
  return TSR_OK;
}

size_t tsr_cpu_set_rows_work(const struct tsr_tensor *dst) {
  return align64((size_t)dst->ne[0] * sizeof(float));
}

TSR_CPU_KERNEL(set_rows) {
  const struct tsr_tensor *src = dst->src[1], *idx = dst->src[2];
  const int64_t k = dst->ne[0], n_rows = dst->ne[1], n = src->ne[1];
  const int64_t b2n = dst->ne[2], nbatch = b2n * dst->ne[3];
  const bool per_batch = idx->ne[1] > 1;
  float *buf = c->work;
  for (int64_t b = 0; b < nbatch; b++) {
    const int64_t b2 = b % b2n, b3 = b / b2n;
    for (int64_t i = 0; i < n; i++) {
      int32_t r;
      memcpy(&r, (const char *)idx->data + i * idx->nb[0] + (per_batch ? b2 : 0) * idx->nb[1],
             sizeof r);
      if (r < 0 || r >= n_rows) continue;
      if ((uint64_t)((int64_t)r * nbatch + b) % (uint64_t)c->nth != (uint64_t)c->ith) continue;
      const char *s = (const char *)src->data + i * src->nb[1] + b2 * src->nb[2] + b3 * src->nb[3];
      const float *row = (const float *)s;
      if (src->nb[0] != sizeof(float)) {
        tsr_cpu_row_to_f32(src, s, buf, k);
        row = buf;
      }
      char *d = (char *)dst->data + r * dst->nb[1] + b2 * dst->nb[2] + b3 * dst->nb[3];
      row_from_f32(dst, row, d, k);
    }
  }
}

/* ---- concat --------------------------------------------------------------- */

static void copy_elems(char *d, size_t dnb, const char *s, size_t snb, int64_t n, size_t ts) {
  if (dnb == ts && snb == ts) {
    memcpy(d, s, (size_t)n * ts);
    return;
  }
  for (int64_t i = 0; i < n; i++) memcpy(d + (size_t)i * dnb, s + (size_t)i * snb, ts);
}

TSR_CPU_KERNEL(concat) {
  const struct tsr_tensor *a = dst->src[0], *b = dst->src[1];
  const int dim = dst->op_params[0];
  const size_t ts = tsr_dtype_type_size(dst->dtype);
  int64_t lo, hi;
  tsr_cpu_split(c, tsr_tensor_nrows(dst), &lo, &hi);
  for (int64_t r = lo; r < hi; r++) {
    int64_t i[4] = {0, r % dst->ne[1], (r / dst->ne[1]) % dst->ne[2],
                    r / (dst->ne[1] * dst->ne[2])};
    char *d = tsr_tensor_ptr(dst, 0, i[1], i[2], i[3]);
    if (dim == 0) {
      copy_elems(d, dst->nb[0], tsr_tensor_ptr(a, 0, i[1], i[2], i[3]), a->nb[0], a->ne[0], ts);
      copy_elems(d + a->ne[0] * (int64_t)dst->nb[0], dst->nb[0],
                 tsr_tensor_ptr(b, 0, i[1], i[2], i[3]), b->nb[0], b->ne[0], ts);
      continue;
    }
    const struct tsr_tensor *s = a;
    if (i[dim] >= a->ne[dim]) {
      s = b;
      i[dim] -= a->ne[dim];
    }
    copy_elems(d, dst->nb[0], tsr_tensor_ptr(s, 0, i[1], i[2], i[3]), s->nb[0], s->ne[0], ts);
  }
}

/* ---- top_k and argmax ------------------------------------------------------ */

/* Strict order: larger value first, NaN below every number, lower index on ties. */
static bool ranks_above(float va, int32_t ia, float vb, int32_t ib) {
  bool na = va != va, nb = vb != vb;
  if (na != nb) return nb;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

static float value_at(const char *row, size_t nb0, int32_t i) {
  float v;
  memcpy(&v, row + (size_t)i * nb0, sizeof v);
  return v;
}

/* Min-heap on rank: heap[0] is the lowest-ranked of the kept indices. */
static void heap_sift_down(int32_t *heap, int64_t n, int64_t at, const char *row, size_t nb0) {
  for (;;) {
    int64_t l = 2 * at + 1, r = l + 1, low = at;
    if (l < n && ranks_above(value_at(row, nb0, heap[low]), heap[low], value_at(row, nb0, heap[l]),
                             heap[l]))
      low = l;
    if (r < n && ranks_above(value_at(row, nb0, heap[low]), heap[low], value_at(row, nb0, heap[r]),
                             heap[r]))
      low = r;
    if (low == at) return;
    int32_t tmp = heap[at];
    heap[at] = heap[low];
    heap[low] = tmp;
    at = low;
  }
}

size_t tsr_cpu_top_k_work(const struct tsr_tensor *dst) {
  return align64((size_t)dst->op_params[0] * sizeof(int32_t));
}

TSR_CPU_KERNEL(top_k) {
  const struct tsr_tensor *a = dst->src[0];
  const int64_t k = dst->op_params[0], n = a->ne[0];
  int32_t *heap = c->work;
  int64_t lo, hi;
  tsr_cpu_split(c, tsr_tensor_nrows(a), &lo, &hi);
  for (int64_t r = lo; r < hi; r++) {
    const char *row = row_ptr(a, r);
    int64_t size = 0;
    for (int32_t i = 0; i < n; i++) {
      if (size < k) {
        /* sift up */
        int64_t at = size++;
        heap[at] = i;
        while (at > 0) {
          int64_t up = (at - 1) / 2;
          if (!ranks_above(value_at(row, a->nb[0], heap[up]), heap[up],
                           value_at(row, a->nb[0], heap[at]), heap[at]))
            break;
          int32_t tmp = heap[up];
          heap[up] = heap[at];
          heap[at] = tmp;
          at = up;
        }
      } else if (ranks_above(value_at(row, a->nb[0], i), i, value_at(row, a->nb[0], heap[0]),
                             heap[0])) {
        heap[0] = i;
        heap_sift_down(heap, size, 0, row, a->nb[0]);
      }
    }
    /* pop the lowest-ranked into the last free slot, so slot 0 gets the best */
    char *out = row_ptr(dst, r);
    for (int64_t slot = k - 1; slot >= 0; slot--) {
      memcpy(out + slot * (int64_t)dst->nb[0], &heap[0], sizeof(int32_t));
      heap[0] = heap[--size];
      heap_sift_down(heap, size, 0, row, a->nb[0]);
    }
  }
}

TSR_CPU_KERNEL(argmax) {
  const struct tsr_tensor *a = dst->src[0];
  const int64_t n = a->ne[0];
  int64_t lo, hi;
  tsr_cpu_split(c, tsr_tensor_nrows(a), &lo, &hi);
  for (int64_t r = lo; r < hi; r++) {
    const char *row = row_ptr(a, r);
    int32_t best = 0;
    float bv = value_at(row, a->nb[0], 0);
    for (int32_t i = 1; i < n; i++) {
      float v = value_at(row, a->nb[0], i);
      if (ranks_above(v, i, bv, best)) {
        best = i;
        bv = v;
      }
    }
    /* dst is [ne1, ne2, ne3] of a: row r of a is element r of dst */
    int64_t i1 = r % a->ne[1], i2 = (r / a->ne[1]) % a->ne[2], i3 = r / (a->ne[1] * a->ne[2]);
    memcpy(tsr_tensor_ptr(dst, i1, i2, i3, 0), &best, sizeof best);
  }
}
