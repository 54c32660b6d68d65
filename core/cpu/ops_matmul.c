/*
** get_rows, mat_mul and mat_mul_id on the CPU.
**
** mat_mul walks the weight matrix in tiles of rows. Contiguous f32 rows are
** read in place, and so are contiguous f16, bf16 and block-type rows with a
** register kernel (vec_quant.c) that meet one or two columns (decode); any
** other weight (other block types, strided views, f16 or blocks in a batch)
** is dequantized once per tile into the thread's scratch and reused for every
** column of x. With the backend's activations: q8, the columns meeting a block
** type with an integer kernel (vec_q8.c) are quantized to 8 bits once per
** product instead (every column, so a column's result does not depend on its
** batch), and each row meets up to 8 of them in integers. Dots accumulate in
** f32 (core/cpu/vec.h). Against dense
** columns, a dequantized tile is dotted in blocks of 4 rows x 3 columns (every
** output summed alike, so the results do not depend on how columns are cut
** over threads), and f32 rows two by two, each output summed as one column's
** dot sums it, so an f32 batch equals its columns one at a time. Work items
** are (weight batch, row tile, column chunk); columns are chunked only when
** there are too few tiles to keep every thread busy, so the usual case
** dequantizes each weight row exactly once.
**
** mat_mul_id groups the (slot, token) pairs by expert (a counting sort that
** every thread repeats, so no thread waits on another) and runs each expert
** as a small mat_mul over its columns.
**
** Indices out of range cannot be reported at run time, so they produce
** zeros: get_rows writes a zero row for an index outside [0, R), and
** mat_mul_id writes a zero column for an expert id outside [0, E). Model
** builders take ids from top_k, so neither happens in a well-formed graph.
*/
#include <string.h>

#include "cpu_ops.h"
#include "vec.h"

/* Rows per weight tile: enough to amortise each walk over x, few enough that
** a dequantized tile (TILE_FLOATS f32s) stays in the L2 cache while every
** column of x meets it. */
#define TILE_MAX 64
#define TILE_FLOATS 32768

/* Columns per work item of mat_mul_id, so one busy expert spreads over threads. */
#define ID_CHUNK 64

static int64_t tile_rows(int64_t k, int64_t m) {
  int64_t tm = TILE_FLOATS / (k > 0 ? k : 1);
  if (tm < 1) tm = 1;
  if (tm > TILE_MAX) tm = TILE_MAX;
  return tm < m ? tm : m;
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }


/* ---- weight tiles ---------------------------------------------------------- */

/* f16 and block rows meeting at most this many columns are dotted in place;
** more columns repay converting the tile to f32 once. */
#define F16_DIRECT_COLS 2

enum wmode {
  W_F32,     /* contiguous f32 rows, read in place */
  W_F16,     /* contiguous f16 rows, dotted without conversion */
  W_BLOCKS,  /* contiguous bf16 or block rows, dotted by their register kernel */
  W_Q8,      /* contiguous block rows against columns quantized to 8 bits (vec_q8.c) */
  W_CONVERT, /* anything else: dequantized into scratch per tile */
};

/* whether w's rows are whole blocks end to end */
static bool block_rows(const struct tsr_tensor *w) {
  const struct tsr_dtype_traits *tr = tsr_dtype_traits((int)w->dtype);
  return w->nb[0] == tr->type_size && w->ne[0] % tr->block_size == 0;
}

/* q8: the backend's activations: q8 (mat_mul of one weight batch), whatever the columns, so
** a column's result does not depend on how many columns meet the weight with it */
static enum wmode weight_mode(const struct tsr_tensor *w, int64_t cols, bool q8) {
  if (w->dtype == TSR_F32 && w->nb[0] == sizeof(float)) return W_F32;
  if (q8 && block_rows(w) && tsr_vec_dot_q8((int)w->dtype)) return W_Q8;
  if (cols > F16_DIRECT_COLS) return W_CONVERT;
  if (w->dtype == TSR_F16 && w->nb[0] == sizeof(uint16_t)) return W_F16;
  if (block_rows(w) && tsr_vec_dot_row((int)w->dtype)) return W_BLOCKS;
  return W_CONVERT;
}

struct wtile {
  enum wmode mode;
  tsr_vec_dot_row_fn dot; /* W_BLOCKS */
  tsr_vec_dot_q8_fn dot_q8; /* W_Q8, over the rows as stored or expanded */
  int64_t k, m0, n; /* rows [m0, m0+n) of length k */
  size_t row_bytes; /* of a row as stored */
  const void *row[TILE_MAX];
};

/* How far ahead of a row it reads a product asks the memory for the weights' next bytes, into
** the L2 cache (prefetcht1), where the rows are not 8-bit products' (whose kernels ask as they
** go: vec_q8.c): rows converted or expanded at a tile's load, and f16, bf16 and f32 rows read
** in place. A row-by-row stream is what hardware prefetchers follow, but on a 2-core Sapphire
** Rapids VM they did not keep up with decode; into L1 (prefetcht0) the requests waited on its
** fill buffers. */
#define PREFETCH_AHEAD 2048
static void prefetch_ahead(const void *at, size_t bytes) {
  for (size_t b = 0; b < bytes; b += 64)
    __builtin_prefetch((const char *)at + PREFETCH_AHEAD + b, 0, 2);
}

/* Whether W_Q8 rows are expanded once per tile (vec.h, tsr_q8_xblock): where the machine has
** the kernel and the tile meets more than one call's columns */
static bool q8_expands(const struct tsr_tensor *w, int64_t cols) {
  return cols > TSR_Q8_COLS && tsr_vec_q8_expander((int)w->dtype);
}

/* Points the tile at rows [m0, m0+n) of the matrix starting at base, or
** dequantizes them into buf (n*k floats), or expands them into xbuf (W_Q8 that expands);
** cols is how many columns will meet it. */
static void wtile_load(struct wtile *t, const struct tsr_tensor *w, const char *base, int64_t m0,
                       int64_t n, int64_t cols, bool q8, float *buf,
                       struct tsr_q8_xblock *xbuf) {
  t->mode = weight_mode(w, cols, q8);
  const bool expand = t->mode == W_Q8 && xbuf && q8_expands(w, cols);
  t->dot = t->mode == W_BLOCKS ? tsr_vec_dot_row((int)w->dtype) : NULL;
  t->dot_q8 = t->mode != W_Q8 ? NULL
              : expand        ? tsr_vec_dot_q8x((int)w->dtype)
                              : tsr_vec_dot_q8((int)w->dtype);
  t->k = w->ne[0];
  t->row_bytes = w->nb[1];
  t->m0 = m0;
  t->n = n;
  const int64_t nb = t->k / TSR_Q8_ACT_BLOCK;
  for (int64_t r = 0; r < n; r++) {
    const char *src = base + (size_t)(m0 + r) * w->nb[1];
    if (expand || t->mode == W_CONVERT) prefetch_ahead(src, w->nb[1]);
    if (expand) {
      tsr_vec_q8_expander((int)w->dtype)(src, t->k, xbuf + r * nb);
      t->row[r] = xbuf + r * nb;
    } else if (t->mode == W_CONVERT) {
      tsr_cpu_row_to_f32(w, src, buf + r * t->k, t->k);
      t->row[r] = buf + r * t->k;
    } else {
      t->row[r] = src;
    }
  }
}

/* Where column c of a work item reads x and writes its outputs: mat_mul
** numbers the columns of one weight batch, mat_mul_id the pairs of one expert. */
struct cols {
  const struct tsr_tensor *x, *dst;
  int64_t n, r2, r3, b2, b3;   /* mat_mul */
  const int32_t *pairs;        /* mat_mul_id: p = u + U*t, else NULL */
  int64_t nu;
  bool x_shared;
  const struct tsr_q8_act *q8; /* W_Q8: column c's blocks at q8 + c * k / 32 */
};

static void col_at(const struct cols *cs, int64_t c, int64_t m0, const char **xp, float **out) {
  const struct tsr_tensor *x = cs->x;
  if (cs->pairs) {
    const int64_t p = cs->pairs[c], u = p % cs->nu, t = p / cs->nu;
    *xp = (const char *)x->data + (cs->x_shared ? 0 : u) * x->nb[1] + t * x->nb[2];
    *out = tsr_tensor_ptr(cs->dst, m0, u, t, 0);
    return;
  }
  const int64_t in = c % cs->n, j = c / cs->n;
  const int64_t i2 = cs->b2 * cs->r2 + j % cs->r2, i3 = cs->b3 * cs->r3 + j / cs->r2;
  *xp = (const char *)x->data + in * x->nb[1] + i2 * x->nb[2] + i3 * x->nb[3];
  *out = tsr_tensor_ptr(cs->dst, m0, in, i2, i3);
}

/* A column of x as contiguous f32: in place when dim 0 is dense, else
** gathered into buf. */
static const float *x_column(const struct tsr_tensor *x, const char *col, float *buf) {
  if (x->nb[0] == sizeof(float)) return (const float *)col;
  for (int64_t i = 0; i < x->ne[0]; i++) memcpy(&buf[i], col + (size_t)i * x->nb[0], sizeof(float));
  return buf;
}

/* The tile times columns [c0, c1): rows m0.. of each output column. Each x
** column is read once into L1 and meets every row of the tile there. */
static void wtile_mul(const struct wtile *t, const struct cols *cs, int64_t c0, int64_t c1,
                      float *xbuf) {
  /* dequantized rows against dense columns in blocks of 4 x 3 (each value loaded once for
  ** three or four products; every output summed alike, whatever block it falls in) */
  if (t->mode == W_CONVERT && cs->x->nb[0] == sizeof(float)) {
    for (; c0 < c1; c0 += TSR_VEC_BLOCK_COLS) {
      const int nc = c1 - c0 < TSR_VEC_BLOCK_COLS ? (int)(c1 - c0) : TSR_VEC_BLOCK_COLS;
      const float *x[TSR_VEC_BLOCK_COLS];
      float *out[TSR_VEC_BLOCK_COLS];
      for (int c = 0; c < nc; c++) {
        const char *xp;
        col_at(cs, c0 + c, t->m0, &xp, &out[c]);
        x[c] = (const float *)xp;
      }
      for (int64_t r = 0; r < t->n; r += TSR_VEC_BLOCK_ROWS) {
        const int nr = t->n - r < TSR_VEC_BLOCK_ROWS ? (int)(t->n - r) : TSR_VEC_BLOCK_ROWS;
        const float *w[TSR_VEC_BLOCK_ROWS];
        for (int i = 0; i < nr; i++) w[i] = t->row[r + i];
        float d[TSR_VEC_BLOCK_ROWS * TSR_VEC_BLOCK_COLS];
        tsr_vec_dot_block_f32(w, nr, x, nc, t->k, d);
        for (int c = 0; c < nc; c++)
          for (int i = 0; i < nr; i++) out[c][r + i] = d[c * nr + i];
      }
    }
    return;
  }
  /* quantized columns, TSR_Q8_COLS at a time, TSR_Q8_ROWS rows a call (the VNNI kernels meet
  ** each column's codes with two rows, four where the tile expands): each row's codes expanded
  ** once for them all (in the kernel, or for the whole tile at its load where it expands) */
  if (t->mode == W_Q8) {
    const int64_t nb = t->k / TSR_Q8_ACT_BLOCK;
    for (; c0 < c1; c0 += TSR_Q8_COLS) {
      const int nc = c1 - c0 < TSR_Q8_COLS ? (int)(c1 - c0) : TSR_Q8_COLS;
      const struct tsr_q8_act *a[TSR_Q8_COLS];
      float *out[TSR_Q8_COLS];
      for (int c = 0; c < nc; c++) {
        const char *xp;
        col_at(cs, c0 + c, t->m0, &xp, &out[c]);
        a[c] = cs->q8 + (c0 + c) * nb;
      }
      for (int64_t r = 0; r < t->n; r += TSR_Q8_ROWS) {
        const int nr = t->n - r < TSR_Q8_ROWS ? (int)(t->n - r) : TSR_Q8_ROWS;
        float d[TSR_Q8_ROWS * TSR_Q8_COLS];
        t->dot_q8(t->row + r, nr, a, nc, t->k, d);
        for (int i = 0; i < nr; i++)
          for (int c = 0; c < nc; c++) out[c][r + i] = d[i * nc + c];
      }
    }
    return;
  }
  /* f32 rows against dense columns two by two: each value loaded once for two products,
  ** each output summed as the one-column dot sums it (so a batch equals its columns) */
  if (t->mode == W_F32 && cs->x->nb[0] == sizeof(float)) {
    for (; c0 + 1 < c1; c0 += 2) {
      const char *xp[2];
      float *out[2];
      col_at(cs, c0, t->m0, &xp[0], &out[0]);
      col_at(cs, c0 + 1, t->m0, &xp[1], &out[1]);
      const float *x0 = (const float *)xp[0], *x1 = (const float *)xp[1];
      int64_t r = 0;
      for (; r + 1 < t->n; r += 2) {
        float d[4];
        tsr_vec_dot2x2_f32(t->row[r], t->row[r + 1], x0, x1, t->k, d);
        out[0][r] = d[0], out[0][r + 1] = d[1], out[1][r] = d[2], out[1][r + 1] = d[3];
      }
      if (r < t->n) {
        out[0][r] = tsr_vec_dot_f32(t->row[r], x0, t->k);
        out[1][r] = tsr_vec_dot_f32(t->row[r], x1, t->k);
      }
    }
  }
  for (int64_t c = c0; c < c1; c++) {
    const char *xp;
    float *out;
    col_at(cs, c, t->m0, &xp, &out);
    const float *x = x_column(cs->x, xp, xbuf);
    /* rows read in place; later columns find them in the cache */
    const bool ahead = t->mode != W_CONVERT && c == c0;
    for (int64_t r = 0; r < t->n; r++) {
      if (ahead) prefetch_ahead(t->row[r], t->row_bytes);
      out[r] = t->mode == W_F16    ? tsr_vec_dot_f16_f32(t->row[r], x, t->k)
               : t->mode == W_BLOCKS ? t->dot(t->row[r], x, t->k)
                                     : tsr_vec_dot_f32(t->row[r], x, t->k);
    }
  }
}

/* Per-thread scratch of a matmul-like node: a dequantized tile, one x column, and the
** quantized columns of W_Q8. */
struct mm_scratch {
  float *tile; /* NULL when weights are always read in place */
  float *xcol; /* NULL when x columns are dense */
  struct tsr_q8_act *q8; /* NULL where the weight has no integer kernel */
  struct tsr_q8_xblock *xtile; /* NULL where W_Q8 rows are never expanded */
  void *rest;            /* past the parts above: size bytes from the start */
  size_t size;
};

static bool may_convert(const struct tsr_tensor *w) {
  return weight_mode(w, F16_DIRECT_COLS + 1, false) == W_CONVERT;
}

/* Columns quantized together by the node's threads (each its share, into the shared scratch)
** rather than each thread quantizing all of them: more than a call's columns */
static bool q8_shared(int64_t cols) { return cols > TSR_Q8_COLS; }

/* every column of x quantized (mat_mul of one weight batch), in this thread's scratch (shared:
** false) or the node's (true) */
static size_t q8_bytes(const struct tsr_tensor *w, const struct tsr_tensor *x, bool shared) {
  const int64_t cols = x->ne[1] * x->ne[2] * x->ne[3];
  if (!(block_rows(w) && tsr_vec_dot_q8((int)w->dtype)) || w->ne[2] * w->ne[3] != 1 ||
      q8_shared(cols) != shared)
    return 0;
  return align64((size_t)cols * (size_t)(w->ne[0] / TSR_Q8_ACT_BLOCK) * sizeof(struct tsr_q8_act));
}

/* The scratch's parts at work (NULL: only their end, the size) */
static struct mm_scratch mm_scratch_at(const struct tsr_tensor *w, const struct tsr_tensor *x,
                                       void *work) {
  const size_t k = (size_t)w->ne[0];
  const size_t tile = may_convert(w) ? align64((size_t)tile_rows(w->ne[0], w->ne[1]) * k * 4) : 0;
  const size_t xcol = x->nb[0] != sizeof(float) ? align64(k * 4) : 0, q8 = q8_bytes(w, x, false);
  const size_t xtile = q8_bytes(w, x, true) && q8_expands(w, x->ne[1] * x->ne[2] * x->ne[3])
                           ? align64((size_t)tile_rows(w->ne[0], w->ne[1]) *
                                     (k / TSR_Q8_ACT_BLOCK) * sizeof(struct tsr_q8_xblock))
                           : 0;
  struct mm_scratch s = {.size = tile + xcol + q8 + xtile};
  if (!work) return s;
  char *p = work;
  if (tile) s.tile = (float *)p;
  if (xcol) s.xcol = (float *)(p + tile);
  if (q8) s.q8 = (struct tsr_q8_act *)(p + tile + xcol);
  if (xtile) s.xtile = (struct tsr_q8_xblock *)(p + tile + xcol + q8);
  s.rest = p + s.size;
  return s;
}

static size_t mm_scratch_size(const struct tsr_tensor *w, const struct tsr_tensor *x) {
  return mm_scratch_at(w, x, NULL).size;
}

/* ---- check -------------------------------------------------------------- */

static bool weight_dtype_ok(enum tsr_dtype dt) {
  const struct tsr_dtype_traits *tr = tsr_dtype_traits((int)dt);
  if (!tr || !tr->to_f32) return false;
  return dt == TSR_F32 || dt == TSR_F16 || dt == TSR_BF16 || tr->block_size > 1;
}

tsr_status tsr_cpu_mat_mul_check(const struct tsr_tensor *dst) {
  const struct tsr_tensor *w = dst->src[0], *x = dst->src[1];
  if (!weight_dtype_ok(w->dtype))
    return tsr_error_set(TSR_ERR_UNSUPPORTED,
                         "%s: weight '%s' is %s; the cpu backend multiplies f32, f16, bf16 "
                         "and the q4_0..q8_K block types", tsr_op_name(dst->op), w->name,
                         tsr_dtype_name(w->dtype));
  if (x->dtype != TSR_F32)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: input '%s' is %s; needs f32",
                         tsr_op_name(dst->op), x->name, tsr_dtype_name(x->dtype));
  if (dst->dtype != TSR_F32 || dst->nb[0] != sizeof(float))
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: output must be dense f32",
                         tsr_op_name(dst->op));
  return TSR_OK;
}

/* ---- mat_mul -------------------------------------------------------------- */

size_t tsr_cpu_mat_mul_work(const struct tsr_tensor *dst) {
  return mm_scratch_size(dst->src[0], dst->src[1]);
}

size_t tsr_cpu_mat_mul_shared(const struct tsr_tensor *dst) {
  return q8_bytes(dst->src[0], dst->src[1], true);
}

TSR_CPU_KERNEL(mat_mul) {
  const struct tsr_tensor *w = dst->src[0], *x = dst->src[1];
  const int64_t m = w->ne[1], n = x->ne[1];
  const int64_t w2 = w->ne[2], r2 = x->ne[2] / w->ne[2], r3 = x->ne[3] / w->ne[3];
  const int64_t tm = tile_rows(w->ne[0], m), n_tiles = (m + tm - 1) / tm;
  const int64_t n_wb = w2 * w->ne[3];
  const int64_t cols = n * r2 * r3; /* columns of x that meet one weight batch */

  /* Chunk columns only when tiles alone leave threads idle. */
  int64_t chunks = 1, want = 4 * (int64_t)c->nth;
  if (n_wb * n_tiles < want) {
    chunks = (want + n_wb * n_tiles - 1) / (n_wb * n_tiles);
    if (chunks > cols) chunks = cols;
  }
  const int64_t per_chunk = (cols + chunks - 1) / chunks;

  struct mm_scratch s = mm_scratch_at(w, x, c->work);
  struct cols cs = {.x = x, .dst = dst, .n = n, .r2 = r2, .r3 = r3};
  /* W_Q8 (one weight batch, so column c is x's column c): a few columns each thread
  ** quantizes itself rather than wait on another; more, the threads share */
  const bool q8 = c->activations_q8 && n_wb == 1;
  const bool many = q8_shared(cols);
  if (weight_mode(w, cols, q8) == W_Q8) {
    struct tsr_q8_act *q8_cols = many ? c->shared : s.q8;
    int64_t lo = 0, hi = cols;
    if (many) tsr_cpu_split(c, cols, &lo, &hi);
    for (int64_t col = lo; col < hi; col++) {
      const char *xp;
      float *out;
      col_at(&cs, col, 0, &xp, &out);
      tsr_vec_quantize_q8(x_column(x, xp, s.xcol), w->ne[0],
                          q8_cols + col * (w->ne[0] / TSR_Q8_ACT_BLOCK));
    }
    if (many) tsr_cpu_sync(c);
    cs.q8 = q8_cols;
  }
  /* Items in equal shares, or (many columns: items that each take long, so a thread the
  ** machine slows down is worth working around) to whichever thread is free; each output is
  ** the same whoever computes it. */
  struct wtile tile = {0};
  int64_t loaded = -1; /* (batch, tile) now in the tile, so chunks reuse it */
  const int64_t n_items = n_wb * n_tiles * chunks;
  int64_t lo = 0, hi = n_items;
  if (!many) tsr_cpu_split(c, n_items, &lo, &hi);
  for (int64_t item = many ? tsr_cpu_take(c, n_items) : lo; item < hi;
       item = many ? tsr_cpu_take(c, n_items) : item + 1) {
    const int64_t chunk = item % chunks, bt = item / chunks;
    const int64_t t = bt % n_tiles, wb = bt / n_tiles;
    const int64_t b2 = wb % w2, b3 = wb / w2;
    if (bt != loaded) {
      const char *base = (const char *)w->data + b2 * w->nb[2] + b3 * w->nb[3];
      int64_t m0 = t * tm, rows = m - m0 < tm ? m - m0 : tm;
      wtile_load(&tile, w, base, m0, rows, cols, q8, s.tile, s.xtile);
      loaded = bt;
    }
    int64_t c0 = chunk * per_chunk, c1 = c0 + per_chunk < cols ? c0 + per_chunk : cols;
    cs.b2 = b2, cs.b3 = b3;
    wtile_mul(&tile, &cs, c0, c1, s.xcol);
  }
}

/* ---- mat_mul_id ---------------------------------------------------------- */

/* Pairs p = u + U*t grouped by expert: pairs of expert e are
** list[start[e] .. start[e+1]); pairs with an id outside [0, E) are left out. */
struct id_groups {
  int32_t *start; /* E + 1 */
  int32_t *list;  /* U * T */
};

static int32_t id_at(const struct tsr_tensor *ids, int64_t u, int64_t t) {
  int32_t v;
  memcpy(&v, (const char *)ids->data + u * ids->nb[0] + t * ids->nb[1], sizeof v);
  return v;
}

static void id_group(const struct tsr_tensor *ids, int64_t n_expert, struct id_groups *gr) {
  const int64_t nu = ids->ne[0], np = nu * ids->ne[1];
  memset(gr->start, 0, (size_t)(n_expert + 1) * sizeof *gr->start);
  for (int64_t p = 0; p < np; p++) {
    int32_t e = id_at(ids, p % nu, p / nu);
    if (e >= 0 && e < n_expert) gr->start[e + 1]++;
  }
  for (int64_t e = 0; e < n_expert; e++) gr->start[e + 1] += gr->start[e];
  /* fill in pair order, using start[e] as the cursor, then shift back */
  for (int64_t p = 0; p < np; p++) {
    int32_t e = id_at(ids, p % nu, p / nu);
    if (e >= 0 && e < n_expert) gr->list[gr->start[e]++] = (int32_t)p;
  }
  for (int64_t e = n_expert; e > 0; e--) gr->start[e] = gr->start[e - 1];
  gr->start[0] = 0;
}

size_t tsr_cpu_mat_mul_id_work(const struct tsr_tensor *dst) {
  const struct tsr_tensor *w = dst->src[0], *ids = dst->src[2];
  size_t groups = (size_t)(w->ne[2] + 1 + ids->ne[0] * ids->ne[1]) * sizeof(int32_t);
  return mm_scratch_size(w, dst->src[1]) + align64(groups);
}

TSR_CPU_KERNEL(mat_mul_id) {
  const struct tsr_tensor *w = dst->src[0], *x = dst->src[1], *ids = dst->src[2];
  const int64_t m = w->ne[1], n_expert = w->ne[2];
  const int64_t nu = ids->ne[0], np = nu * ids->ne[1];
  const int64_t tm = tile_rows(w->ne[0], m), n_tiles = (m + tm - 1) / tm;

  struct mm_scratch s = mm_scratch_at(w, x, c->work);
  struct id_groups gr = {.start = s.rest, .list = (int32_t *)s.rest + n_expert + 1};
  id_group(ids, n_expert, &gr);

  /* Items (expert, tile, chunk of ID_CHUNK columns), each costing its columns
  ** plus one for the tile load; an item goes to the thread whose share of the
  ** total cost holds the item's midpoint. */
  int64_t total = 0;
  for (int64_t e = 0; e < n_expert; e++) {
    int64_t cnt = gr.start[e + 1] - gr.start[e];
    total += n_tiles * (cnt + (cnt + ID_CHUNK - 1) / ID_CHUNK);
  }
  struct cols cs = {.x = x, .dst = dst, .nu = nu, .x_shared = x->ne[1] == 1};
  struct wtile tile = {0};
  int64_t acc = 0;
  for (int64_t e = 0; e < n_expert && total > 0; e++) {
    const int64_t first = gr.start[e], cnt = gr.start[e + 1] - first;
    if (cnt == 0) continue;
    const char *base = (const char *)w->data + e * w->nb[2];
    for (int64_t t = 0; t < n_tiles; t++) {
      bool loaded = false;
      for (int64_t c0 = 0; c0 < cnt; c0 += ID_CHUNK) {
        int64_t c1 = c0 + ID_CHUNK < cnt ? c0 + ID_CHUNK : cnt, cost = c1 - c0 + 1;
        int64_t owner = (2 * acc + cost) * c->nth / (2 * total);
        acc += cost;
        if (owner != c->ith) continue;
        if (!loaded) {
          int64_t m0 = t * tm, rows = m - m0 < tm ? m - m0 : tm;
          wtile_load(&tile, w, base, m0, rows, cnt, false, s.tile, NULL);
          loaded = true;
        }
        cs.pairs = gr.list + first;
        wtile_mul(&tile, &cs, c0, c1, s.xcol);
      }
    }
  }

  /* columns whose expert id is out of range: zeros (see the top of the file) */
  int64_t lo, hi;
  tsr_cpu_split(c, np, &lo, &hi);
  for (int64_t p = lo; p < hi; p++) {
    int32_t e = id_at(ids, p % nu, p / nu);
    if (e >= 0 && e < n_expert) continue;
    for (int64_t i = 0; i < m; i++) *(float *)tsr_tensor_ptr(dst, i, p % nu, p / nu, 0) = 0.0f;
  }
}

/* ---- get_rows ------------------------------------------------------------- */

tsr_status tsr_cpu_get_rows_check(const struct tsr_tensor *dst) {
  const struct tsr_tensor *a = dst->src[0];
  const struct tsr_dtype_traits *tr = tsr_dtype_traits((int)a->dtype);
  if (!tr || !tr->to_f32)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "get_rows: table '%s' is %s, which has no "
                         "dequantizer", a->name, tsr_dtype_name(a->dtype));
  if (dst->dtype != TSR_F32 || dst->nb[0] != sizeof(float))
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "get_rows: output must be dense f32");
  return TSR_OK;
}

TSR_CPU_KERNEL(get_rows) {
  const struct tsr_tensor *a = dst->src[0], *idx = dst->src[1];
  const int64_t k = a->ne[0], n_rows = a->ne[1], n = idx->ne[0];
  int64_t lo, hi;
  tsr_cpu_split(c, n * idx->ne[1], &lo, &hi);
  for (int64_t r = lo; r < hi; r++) {
    const int64_t i = r % n, b = r / n;
    int32_t row;
    memcpy(&row, (const char *)idx->data + i * idx->nb[0] + b * idx->nb[1], sizeof row);
    float *out = tsr_tensor_ptr(dst, 0, i, b, 0);
    if (row < 0 || row >= n_rows) {
      memset(out, 0, (size_t)k * sizeof *out);
      continue;
    }
    tsr_cpu_row_to_f32(a, (const char *)a->data + row * a->nb[1] + b * a->nb[2], out, k);
  }
}
