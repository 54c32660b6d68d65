/* Graph builders: validate shapes and dtypes, append one node each. */
#include "graph/graph_internal.h"
#include "abi/op_registry.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tsr_graph *tsr_graph_new(int max_tensors) {
  if (max_tensors <= 0) return NULL;
  struct tsr_graph *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  /* not zeroed: append clears each tensor it hands out, and nothing reads past n (a
  ** decode step's graph has room for thousands of tensors and uses a few hundred) */
  g->tensors = malloc((size_t)max_tensors * sizeof *g->tensors);
  g->offsets = malloc((size_t)max_tensors * sizeof *g->offsets);
  if (!g->tensors || !g->offsets) {
    tsr_graph_free(g);
    return NULL;
  }
  g->cap = max_tensors;
  static _Atomic uint64_t next_serial = 1;
  g->serial = next_serial++;
  return g;
}

void tsr_graph_free(struct tsr_graph *g) {
  if (!g) return;
  free(g->tensors);
  free(g->offsets);
  free(g);
}

tsr_status tsr_graph_status(const struct tsr_graph *g) { return g->status; }
uint64_t tsr_graph_serial(const struct tsr_graph *g) { return g->serial; }
int tsr_graph_n_tensors(const struct tsr_graph *g) { return g->n; }

struct tsr_tensor *tsr_graph_tensor(struct tsr_graph *g, int i) {
  return (i >= 0 && i < g->n) ? &g->tensors[i] : NULL;
}

struct tsr_tensor *tsr_graph_find(struct tsr_graph *g, const char *name) {
  for (int i = 0; i < g->n; i++)
    if (strcmp(g->tensors[i].name, name) == 0) return &g->tensors[i];
  return NULL;
}

/* Records the first builder error; later ones are consequences of it. */
__attribute__((format(printf, 3, 4))) static struct tsr_tensor *
fail(struct tsr_graph *g, tsr_status st, const char *fmt, ...) {
  if (g->status == TSR_OK) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    g->status = tsr_error_set(st, "%s", msg);
  }
  return NULL;
}

void tsr_graph_fail(struct tsr_graph *g, tsr_status st, const char *message) {
  fail(g, st, "%s", message);
}

void tsr_tensor_set_name(struct tsr_tensor *t, const char *fmt, ...) {
  if (!t) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->name, sizeof t->name, fmt, ap);
  va_end(ap);
}

static struct tsr_tensor *append(struct tsr_graph *g, enum tsr_dtype dt, const int64_t ne[4]) {
  if (g->status != TSR_OK) return NULL;
  if (g->planned) return fail(g, TSR_ERR_INVALID_ARG, "graph already planned: no more nodes");
  if (g->n >= g->cap)
    return fail(g, TSR_ERR_NOMEM, "graph is full (%d tensors); build it with a larger max", g->cap);
  if (!tsr_dtype_traits((int)dt))
    return fail(g, TSR_ERR_INVALID_ARG, "invalid dtype id %d", (int)dt);
  for (int i = 0; i < 4; i++)
    if (ne[i] <= 0)
      return fail(g, TSR_ERR_INVALID_ARG, "dimension %d is %lld; must be positive", i,
                  (long long)ne[i]);
  if (ne[0] % tsr_dtype_block_size(dt))
    return fail(g, TSR_ERR_INVALID_ARG, "ne0 = %lld is not a multiple of %s's block size",
                (long long)ne[0], tsr_dtype_name(dt));
  struct tsr_tensor *t = &g->tensors[g->n];
  memset(t, 0, sizeof *t);
  t->dtype = dt;
  memcpy(t->ne, ne, sizeof t->ne);
  tsr_tensor_set_contiguous_strides(t);
  t->index = g->n;
  g->offsets[g->n] = TSR_NO_OFFSET;
  g->n++;
  return t;
}

/* Sources must be real tensors of this graph; NULL means an earlier failure. */
static bool srcs_ok(struct tsr_graph *g, const char *op, int n, struct tsr_tensor *const *s) {
  if (g->status != TSR_OK) return false;
  for (int i = 0; i < n; i++) {
    if (!s[i]) {
      fail(g, TSR_ERR_INVALID_ARG, "%s: source %d is NULL", op, i);
      return false;
    }
    if (s[i] < g->tensors || s[i] >= g->tensors + g->n) {
      fail(g, TSR_ERR_INVALID_ARG, "%s: source %d belongs to another graph", op, i);
      return false;
    }
  }
  return true;
}
#define SRCS(op, ...)                                                   \
  do {                                                                  \
    struct tsr_tensor *s_[] = {__VA_ARGS__};                            \
    if (!srcs_ok(g, op, (int)(sizeof s_ / sizeof s_[0]), s_)) return NULL; \
  } while (0)

static struct tsr_tensor *node(struct tsr_graph *g, enum tsr_op op, enum tsr_dtype dt,
                               int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
  const int64_t ne[4] = {ne0, ne1, ne2, ne3};
  struct tsr_tensor *t = append(g, dt, ne);
  if (t) t->op = op;
  return t;
}

static const char *shape_str(const struct tsr_tensor *t, char *buf, size_t n) {
  snprintf(buf, n, "%s[%lld,%lld,%lld,%lld]", tsr_dtype_name(t->dtype), (long long)t->ne[0],
           (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3]);
  return buf;
}
#define SHAPE(t) shape_str((t), (char[96]){0}, 96)

static const char *label(const struct tsr_tensor *t) { return t->name[0] ? t->name : "(unnamed)"; }

/* ---- leaves ------------------------------------------------------------- */

struct tsr_tensor *tsr_new_tensor(struct tsr_graph *g, enum tsr_dtype dt, int n_dims,
                                  const int64_t *ne) {
  if (n_dims < 1 || n_dims > 4) return fail(g, TSR_ERR_INVALID_ARG, "n_dims %d not in 1..4", n_dims);
  int64_t full[4] = {1, 1, 1, 1};
  for (int i = 0; i < n_dims; i++) full[i] = ne[i];
  struct tsr_tensor *t = append(g, dt, full);
  if (t) t->flags |= TSR_FLAG_INPUT;
  return t;
}

struct tsr_tensor *tsr_new_tensor_1d(struct tsr_graph *g, enum tsr_dtype dt, int64_t ne0) {
  return tsr_new_tensor(g, dt, 1, (int64_t[]){ne0});
}
struct tsr_tensor *tsr_new_tensor_2d(struct tsr_graph *g, enum tsr_dtype dt, int64_t ne0,
                                     int64_t ne1) {
  return tsr_new_tensor(g, dt, 2, (int64_t[]){ne0, ne1});
}
struct tsr_tensor *tsr_new_tensor_3d(struct tsr_graph *g, enum tsr_dtype dt, int64_t ne0,
                                     int64_t ne1, int64_t ne2) {
  return tsr_new_tensor(g, dt, 3, (int64_t[]){ne0, ne1, ne2});
}
struct tsr_tensor *tsr_new_tensor_4d(struct tsr_graph *g, enum tsr_dtype dt, int64_t ne0,
                                     int64_t ne1, int64_t ne2, int64_t ne3) {
  return tsr_new_tensor(g, dt, 4, (int64_t[]){ne0, ne1, ne2, ne3});
}

struct tsr_tensor *tsr_new_external(struct tsr_graph *g, enum tsr_dtype dt, int n_dims,
                                    const int64_t *ne, void *data) {
  if (!data) return fail(g, TSR_ERR_INVALID_ARG, "external tensor without data");
  struct tsr_tensor *t = tsr_new_tensor(g, dt, n_dims, ne);
  if (!t) return NULL;
  t->flags = TSR_FLAG_WEIGHT;
  t->data = data;
  return t;
}

void tsr_graph_mark_output(struct tsr_tensor *t) {
  if (t) t->flags |= TSR_FLAG_OUTPUT;
}

/* ---- views -------------------------------------------------------------- */

struct tsr_tensor *tsr_view(struct tsr_graph *g, struct tsr_tensor *a, int n_dims,
                            const int64_t *ne, const size_t *nb, size_t offset) {
  SRCS("view", a);
  if (n_dims < 1 || n_dims > 4) return fail(g, TSR_ERR_INVALID_ARG, "view: n_dims %d", n_dims);
  int64_t full[4] = {1, 1, 1, 1};
  for (int i = 0; i < n_dims; i++) full[i] = ne[i];
  struct tsr_tensor *t = append(g, a->dtype, full);
  if (!t) return NULL;
  for (int i = 0; i < n_dims; i++) t->nb[i] = nb[i];
  for (int i = n_dims; i < 4; i++) t->nb[i] = t->nb[i - 1] * (size_t)t->ne[i - 1];
  if (tsr_dtype_block_size(a->dtype) != 1 && t->nb[0] != tsr_dtype_type_size(a->dtype)) {
    g->n--;
    return fail(g, TSR_ERR_INVALID_ARG, "view of block-type %s: nb0 must be the block size",
                label(a));
  }
  t->op = TSR_OP_VIEW;
  t->src[0] = a;
  t->view_src = a->view_src ? a->view_src : a;
  t->view_offs = a->view_offs + offset;
  size_t end;
  if (!tsr_size_add(t->view_offs, tsr_tensor_nbytes(t), &end) ||
      end > tsr_tensor_nbytes(t->view_src)) {
    g->n--;
    return fail(g, TSR_ERR_INVALID_ARG, "view of %s at offset %zu reaches past its bytes",
                label(a), offset);
  }
  if (t->view_src->data) t->data = (char *)t->view_src->data + t->view_offs;
  return t;
}

struct tsr_tensor *tsr_reshape(struct tsr_graph *g, struct tsr_tensor *a, int n_dims,
                               const int64_t *ne) {
  SRCS("reshape", a);
  if (!tsr_tensor_is_contiguous(a))
    return fail(g, TSR_ERR_INVALID_ARG, "reshape of non-contiguous %s; use tsr_cont first",
                label(a));
  if (n_dims < 1 || n_dims > 4) return fail(g, TSR_ERR_INVALID_ARG, "reshape: n_dims %d", n_dims);
  int64_t n = 1;
  for (int i = 0; i < n_dims; i++) n *= ne[i];
  if (n != tsr_tensor_nelements(a))
    return fail(g, TSR_ERR_INVALID_ARG, "reshape of %s %s to %lld elements", label(a), SHAPE(a),
                (long long)n);
  struct tsr_tensor tmp = {.dtype = a->dtype, .ne = {1, 1, 1, 1}};
  for (int i = 0; i < n_dims; i++) tmp.ne[i] = ne[i];
  tsr_tensor_set_contiguous_strides(&tmp);
  return tsr_view(g, a, 4, tmp.ne, tmp.nb, 0);
}

struct tsr_tensor *tsr_permute(struct tsr_graph *g, struct tsr_tensor *a, int ax0, int ax1,
                               int ax2, int ax3) {
  SRCS("permute", a);
  const int ax[4] = {ax0, ax1, ax2, ax3};
  int seen = 0;
  for (int i = 0; i < 4; i++) {
    if (ax[i] < 0 || ax[i] > 3 || (seen & (1 << ax[i])))
      return fail(g, TSR_ERR_INVALID_ARG, "permute(%d,%d,%d,%d) is not a permutation", ax0, ax1,
                  ax2, ax3);
    seen |= 1 << ax[i];
  }
  if (tsr_dtype_block_size(a->dtype) != 1 && ax0 != 0)
    return fail(g, TSR_ERR_INVALID_ARG, "permute of block-type %s must keep dim 0", label(a));
  int64_t ne[4];
  size_t nb[4];
  for (int i = 0; i < 4; i++) {
    ne[ax[i]] = a->ne[i];
    nb[ax[i]] = a->nb[i];
  }
  return tsr_view(g, a, 4, ne, nb, 0);
}

struct tsr_tensor *tsr_transpose(struct tsr_graph *g, struct tsr_tensor *a) {
  return tsr_permute(g, a, 1, 0, 2, 3);
}

/* ---- ops ---------------------------------------------------------------- */

static bool want_dtype(struct tsr_graph *g, const char *op, const struct tsr_tensor *t,
                       enum tsr_dtype dt) {
  if (t->dtype == dt) return true;
  fail(g, TSR_ERR_INVALID_ARG, "%s: %s is %s, needs %s", op, label(t), tsr_dtype_name(t->dtype),
       tsr_dtype_name(dt));
  return false;
}

struct tsr_tensor *tsr_get_rows(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *idx) {
  SRCS("get_rows", a, idx);
  if (!want_dtype(g, "get_rows", idx, TSR_I32)) return NULL;
  if (idx->ne[1] != a->ne[2] || idx->ne[2] != 1 || a->ne[3] != 1)
    return fail(g, TSR_ERR_INVALID_ARG, "get_rows: table %s and indices %s do not pair", SHAPE(a),
                SHAPE(idx));
  struct tsr_tensor *t = node(g, TSR_OP_GET_ROWS, TSR_F32, a->ne[0], idx->ne[0], idx->ne[1], 1);
  if (t) t->src[0] = a, t->src[1] = idx;
  return t;
}

struct tsr_tensor *tsr_mat_mul(struct tsr_graph *g, struct tsr_tensor *w, struct tsr_tensor *x) {
  SRCS("mat_mul", w, x);
  if (!want_dtype(g, "mat_mul", x, TSR_F32)) return NULL;
  if (w->ne[0] != x->ne[0] || x->ne[2] % w->ne[2] || x->ne[3] % w->ne[3])
    return fail(g, TSR_ERR_INVALID_ARG, "mat_mul: %s %s times %s %s", label(w), SHAPE(w),
                label(x), SHAPE(x));
  struct tsr_tensor *t = node(g, TSR_OP_MAT_MUL, TSR_F32, w->ne[1], x->ne[1], x->ne[2], x->ne[3]);
  if (t) t->src[0] = w, t->src[1] = x;
  return t;
}

struct tsr_tensor *tsr_mat_mul_id(struct tsr_graph *g, struct tsr_tensor *w, struct tsr_tensor *x,
                                  struct tsr_tensor *ids) {
  SRCS("mat_mul_id", w, x, ids);
  if (!want_dtype(g, "mat_mul_id", x, TSR_F32) || !want_dtype(g, "mat_mul_id", ids, TSR_I32))
    return NULL;
  if (w->ne[0] != x->ne[0] || w->ne[3] != 1 || x->ne[2] != ids->ne[1] ||
      (x->ne[1] != ids->ne[0] && x->ne[1] != 1) || ids->ne[2] != 1 || x->ne[3] != 1)
    return fail(g, TSR_ERR_INVALID_ARG, "mat_mul_id: experts %s, x %s, ids %s do not pair",
                SHAPE(w), SHAPE(x), SHAPE(ids));
  struct tsr_tensor *t = node(g, TSR_OP_MAT_MUL_ID, TSR_F32, w->ne[1], ids->ne[0], ids->ne[1], 1);
  if (t) t->src[0] = w, t->src[1] = x, t->src[2] = ids;
  return t;
}

static struct tsr_tensor *binary(struct tsr_graph *g, enum tsr_op op, struct tsr_tensor *a,
                                 struct tsr_tensor *b) {
  const char *name = tsr_op_name(op);
  SRCS(name, a, b);
  if (!want_dtype(g, name, a, TSR_F32) || !want_dtype(g, name, b, TSR_F32)) return NULL;
  if (!tsr_tensor_can_repeat(b, a))
    return fail(g, TSR_ERR_INVALID_ARG, "%s: %s %s does not broadcast over %s %s", name, label(b),
                SHAPE(b), label(a), SHAPE(a));
  struct tsr_tensor *t = node(g, op, TSR_F32, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
  if (t) t->src[0] = a, t->src[1] = b;
  return t;
}

struct tsr_tensor *tsr_add(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *b) {
  return binary(g, TSR_OP_ADD, a, b);
}
struct tsr_tensor *tsr_mul(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *b) {
  return binary(g, TSR_OP_MUL, a, b);
}

/* A same-shape f32 result of an f32 input. */
static struct tsr_tensor *like(struct tsr_graph *g, enum tsr_op op, struct tsr_tensor *a) {
  SRCS(tsr_op_name(op), a);
  if (!want_dtype(g, tsr_op_name(op), a, TSR_F32)) return NULL;
  struct tsr_tensor *t = node(g, op, TSR_F32, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
  if (t) t->src[0] = a;
  return t;
}

struct tsr_tensor *tsr_scale(struct tsr_graph *g, struct tsr_tensor *a, float s) {
  struct tsr_tensor *t = like(g, TSR_OP_SCALE, a);
  if (t) tsr_param_set_f32(t, 0, s);
  return t;
}

struct tsr_tensor *tsr_rms_norm(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *w,
                                float eps) {
  if (w) {
    SRCS("rms_norm", a, w);
    if (!want_dtype(g, "rms_norm", w, TSR_F32)) return NULL;
    if (w->ne[0] != a->ne[0] || !tsr_tensor_can_repeat(w, a))
      return fail(g, TSR_ERR_INVALID_ARG, "rms_norm: weight %s %s does not fit %s %s", label(w),
                  SHAPE(w), label(a), SHAPE(a));
  }
  struct tsr_tensor *t = like(g, TSR_OP_RMS_NORM, a);
  if (t) t->src[1] = w, tsr_param_set_f32(t, 0, eps);
  return t;
}

struct tsr_tensor *tsr_l2_norm(struct tsr_graph *g, struct tsr_tensor *a, float eps) {
  struct tsr_tensor *t = like(g, TSR_OP_L2_NORM, a);
  if (t) tsr_param_set_f32(t, 0, eps);
  return t;
}

struct tsr_tensor *tsr_rope(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *pos,
                            struct tsr_tensor *ff, const struct tsr_rope_params *p) {
  SRCS("rope", a, pos);
  if (!want_dtype(g, "rope", pos, TSR_I32)) return NULL;
  if (pos->ne[0] != a->ne[2] || tsr_tensor_nelements(pos) != pos->ne[0] || a->ne[3] != 1)
    return fail(g, TSR_ERR_INVALID_ARG, "rope: positions %s for %s %s (needs one per ne2)",
                SHAPE(pos), label(a), SHAPE(a));
  if (p->n_rot <= 0 || p->n_rot % 2 || p->n_rot > a->ne[0])
    return fail(g, TSR_ERR_INVALID_ARG, "rope: n_rot %d must be even and in 2..%lld", p->n_rot,
                (long long)a->ne[0]);
  if (p->mode != TSR_ROPE_NORMAL && p->mode != TSR_ROPE_NEOX)
    return fail(g, TSR_ERR_INVALID_ARG, "rope: unknown mode %d", (int)p->mode);
  if (!(p->freq_base > 0.0f) || !(p->freq_scale > 0.0f))
    return fail(g, TSR_ERR_INVALID_ARG, "rope: freq_base %g and freq_scale %g must be positive",
                p->freq_base, p->freq_scale);
  if (ff) {
    SRCS("rope", ff);
    if (!want_dtype(g, "rope", ff, TSR_F32)) return NULL;
    if (ff->ne[0] < p->n_rot / 2)
      return fail(g, TSR_ERR_INVALID_ARG, "rope: %lld frequency factors for n_rot %d",
                  (long long)ff->ne[0], p->n_rot);
  }
  struct tsr_tensor *t = like(g, TSR_OP_ROPE, a);
  if (!t) return NULL;
  t->src[1] = pos;
  t->src[2] = ff;
  t->op_params[0] = p->n_rot;
  t->op_params[1] = (int32_t)p->mode;
  tsr_param_set_f32(t, 2, p->freq_base);
  tsr_param_set_f32(t, 3, p->freq_scale);
  return t;
}

struct tsr_tensor *tsr_softmax(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *mask,
                               float scale) {
  if (mask) {
    SRCS("softmax", a, mask);
    if (mask->dtype != TSR_F32 && mask->dtype != TSR_F16)
      return fail(g, TSR_ERR_INVALID_ARG, "softmax: mask must be f32 or f16");
    if (mask->ne[0] != a->ne[0] || mask->ne[1] != a->ne[1] || a->ne[2] % mask->ne[2] ||
        a->ne[3] % mask->ne[3])
      return fail(g, TSR_ERR_INVALID_ARG, "softmax: mask %s does not fit %s", SHAPE(mask),
                  SHAPE(a));
  }
  struct tsr_tensor *t = like(g, TSR_OP_SOFTMAX, a);
  if (t) t->src[1] = mask, tsr_param_set_f32(t, 0, scale);
  return t;
}

struct tsr_tensor *tsr_unary(struct tsr_graph *g, struct tsr_tensor *a, enum tsr_unary_op op) {
  if ((int)op < 0 || op >= TSR_UNARY_COUNT)
    return fail(g, TSR_ERR_INVALID_ARG, "unary: unknown op %d", (int)op);
  struct tsr_tensor *t = like(g, TSR_OP_UNARY, a);
  if (t) t->op_params[0] = (int32_t)op;
  return t;
}

struct tsr_tensor *tsr_glu(struct tsr_graph *g, struct tsr_tensor *gate, struct tsr_tensor *up,
                           enum tsr_glu_op op, bool swapped) {
  if ((int)op < 0 || op >= TSR_GLU_COUNT)
    return fail(g, TSR_ERR_INVALID_ARG, "glu: unknown op %d", (int)op);
  SRCS("glu", gate);
  if (!want_dtype(g, "glu", gate, TSR_F32)) return NULL;
  int64_t ne0 = gate->ne[0];
  if (up) {
    SRCS("glu", up);
    if (!want_dtype(g, "glu", up, TSR_F32)) return NULL;
    if (!tsr_tensor_same_shape(gate, up))
      return fail(g, TSR_ERR_INVALID_ARG, "glu: gate %s and up %s differ", SHAPE(gate), SHAPE(up));
  } else {
    if (ne0 % 2) return fail(g, TSR_ERR_INVALID_ARG, "glu: fused input %s has odd ne0", SHAPE(gate));
    ne0 /= 2;
  }
  struct tsr_tensor *t = node(g, TSR_OP_GLU, TSR_F32, ne0, gate->ne[1], gate->ne[2], gate->ne[3]);
  if (!t) return NULL;
  t->src[0] = gate;
  t->src[1] = up;
  t->op_params[0] = (int32_t)op;
  t->op_params[1] = swapped;
  return t;
}

struct tsr_tensor *tsr_softcap(struct tsr_graph *g, struct tsr_tensor *a, float cap) {
  if (!(cap > 0.0f)) return fail(g, TSR_ERR_INVALID_ARG, "softcap: cap %g must be positive", cap);
  struct tsr_tensor *t = like(g, TSR_OP_SOFTCAP, a);
  if (t) tsr_param_set_f32(t, 0, cap);
  return t;
}

struct tsr_tensor *tsr_concat(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *b,
                              int dim) {
  SRCS("concat", a, b);
  if (dim < 0 || dim > 3) return fail(g, TSR_ERR_INVALID_ARG, "concat: dim %d", dim);
  if (a->dtype != b->dtype || tsr_dtype_block_size(a->dtype) != 1)
    return fail(g, TSR_ERR_INVALID_ARG, "concat: %s and %s must share a plain dtype", SHAPE(a),
                SHAPE(b));
  int64_t ne[4];
  for (int i = 0; i < 4; i++) {
    if (i != dim && a->ne[i] != b->ne[i])
      return fail(g, TSR_ERR_INVALID_ARG, "concat along %d: %s and %s differ in dim %d", dim,
                  SHAPE(a), SHAPE(b), i);
    ne[i] = i == dim ? a->ne[i] + b->ne[i] : a->ne[i];
  }
  struct tsr_tensor *t = node(g, TSR_OP_CONCAT, a->dtype, ne[0], ne[1], ne[2], ne[3]);
  if (t) t->src[0] = a, t->src[1] = b, t->op_params[0] = dim;
  return t;
}

struct tsr_tensor *tsr_cast(struct tsr_graph *g, struct tsr_tensor *a, enum tsr_dtype dt) {
  SRCS("cast", a);
  struct tsr_tensor *t = node(g, TSR_OP_CPY, dt, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
  if (t) t->src[0] = a;
  return t;
}

struct tsr_tensor *tsr_cont(struct tsr_graph *g, struct tsr_tensor *a) {
  return a ? tsr_cast(g, a, a->dtype) : tsr_cast(g, a, TSR_F32);
}

/* A node that writes into target's bytes, shaped and strided like target. */
static struct tsr_tensor *write_into(struct tsr_graph *g, enum tsr_op op, struct tsr_tensor *target) {
  struct tsr_tensor *t = node(g, op, target->dtype, target->ne[0], target->ne[1], target->ne[2],
                              target->ne[3]);
  if (!t) return NULL;
  memcpy(t->nb, target->nb, sizeof t->nb);
  t->view_src = target->view_src ? target->view_src : target;
  t->view_offs = target->view_offs;
  if (t->view_src->data) t->data = (char *)t->view_src->data + t->view_offs;
  return t;
}

struct tsr_tensor *tsr_cpy(struct tsr_graph *g, struct tsr_tensor *a, struct tsr_tensor *dst) {
  SRCS("cpy", a, dst);
  if (tsr_tensor_nelements(a) != tsr_tensor_nelements(dst))
    return fail(g, TSR_ERR_INVALID_ARG, "cpy: %s into %s: element counts differ", SHAPE(a),
                SHAPE(dst));
  struct tsr_tensor *t = write_into(g, TSR_OP_CPY, dst);
  if (t) t->src[0] = a, t->src[1] = dst;
  return t;
}

struct tsr_tensor *tsr_set_rows(struct tsr_graph *g, struct tsr_tensor *dst, struct tsr_tensor *src,
                                struct tsr_tensor *idx) {
  SRCS("set_rows", dst, src, idx);
  if (!want_dtype(g, "set_rows", src, TSR_F32) || !want_dtype(g, "set_rows", idx, TSR_I32))
    return NULL;
  bool idx_ok = idx->ne[0] == src->ne[1] && idx->ne[2] == 1 && idx->ne[3] == 1 &&
                (idx->ne[1] == 1 || idx->ne[1] == src->ne[2]);
  if (src->ne[0] != dst->ne[0] || src->ne[2] != dst->ne[2] || src->ne[3] != dst->ne[3] || !idx_ok)
    return fail(g, TSR_ERR_INVALID_ARG, "set_rows: rows %s with indices %s into %s %s",
                SHAPE(src), SHAPE(idx), label(dst), SHAPE(dst));
  struct tsr_tensor *t = write_into(g, TSR_OP_SET_ROWS, dst);
  if (t) t->src[0] = dst, t->src[1] = src, t->src[2] = idx;
  return t;
}

struct tsr_tensor *tsr_top_k(struct tsr_graph *g, struct tsr_tensor *a, int k) {
  SRCS("top_k", a);
  if (!want_dtype(g, "top_k", a, TSR_F32)) return NULL;
  if (k < 1 || k > a->ne[0])
    return fail(g, TSR_ERR_INVALID_ARG, "top_k: k = %d for rows of %lld", k, (long long)a->ne[0]);
  struct tsr_tensor *t = node(g, TSR_OP_TOP_K, TSR_I32, k, a->ne[1], a->ne[2], a->ne[3]);
  if (t) t->src[0] = a, t->op_params[0] = k;
  return t;
}

struct tsr_tensor *tsr_argmax(struct tsr_graph *g, struct tsr_tensor *a) {
  SRCS("argmax", a);
  if (!want_dtype(g, "argmax", a, TSR_F32)) return NULL;
  struct tsr_tensor *t = node(g, TSR_OP_ARGMAX, TSR_I32, a->ne[1], a->ne[2], a->ne[3], 1);
  if (t) t->src[0] = a;
  return t;
}

struct tsr_tensor *tsr_decode_counters(struct tsr_graph *g, const struct tsr_decode_params *p) {
  if (!p || !p->counters) return fail(g, TSR_ERR_INVALID_ARG, "decode counters: none given");
  const int64_t words = sizeof *p->counters / sizeof(int32_t);
  struct tsr_tensor *t = tsr_new_external(g, TSR_I32, 1, &words, p->counters);
  if (t) tsr_tensor_set_name(t, "decode_counters");
  return t;
}

struct tsr_tensor *tsr_flash_attn(struct tsr_graph *g, struct tsr_tensor *q, struct tsr_tensor *k,
                                  struct tsr_tensor *v, struct tsr_tensor *mask,
                                  struct tsr_tensor *q_pos, struct tsr_tensor *kv_pos,
                                  const struct tsr_attn_params *p) {
  SRCS("flash_attn", q, k, v);
  if (!want_dtype(g, "flash_attn", q, TSR_F32)) return NULL;
  /* K and V are read independently: any float or block type the kernel can
  ** decode row by row, so each row must be whole blocks, packed */
  const struct tsr_tensor *kv[2] = {k, v};
  for (int i = 0; i < 2; i++) {
    const struct tsr_tensor *x = kv[i];
    const struct tsr_dtype_traits *tr = tsr_dtype_traits((int)x->dtype);
    const bool readable = tr && tr->to_f32 && (tr->is_quantized || x->dtype == TSR_F32 ||
                                               x->dtype == TSR_F16 || x->dtype == TSR_BF16);
    if (!readable)
      return fail(g, TSR_ERR_INVALID_ARG, "flash_attn: %s %s is %s, which attention cannot "
                  "decode", i ? "V" : "K", label(x), tsr_dtype_name(x->dtype));
    if (x->ne[0] % tr->block_size || (tr->block_size > 1 && x->nb[0] != tr->type_size))
      return fail(g, TSR_ERR_INVALID_ARG, "flash_attn: %s %s is %s with head dim %lld, not "
                  "whole packed blocks of %lld", i ? "V" : "K", label(x),
                  tsr_dtype_name(x->dtype), (long long)x->ne[0], (long long)tr->block_size);
  }
  if (q->ne[0] != k->ne[0] || k->ne[1] != v->ne[1] || k->ne[2] != v->ne[2] ||
      q->ne[2] % k->ne[2] || q->ne[3] != 1 || k->ne[3] != 1 || v->ne[3] != 1)
    return fail(g, TSR_ERR_INVALID_ARG, "flash_attn: q %s, k %s, v %s do not pair", SHAPE(q),
                SHAPE(k), SHAPE(v));
  if (mask) {
    SRCS("flash_attn", mask);
    if ((mask->dtype != TSR_F32 && mask->dtype != TSR_F16) || mask->ne[0] != k->ne[1] ||
        mask->ne[1] != q->ne[1] || mask->ne[2] != 1 || mask->ne[3] != 1)
      return fail(g, TSR_ERR_INVALID_ARG, "flash_attn: mask %s must be f32/f16 [%lld,%lld]",
                  SHAPE(mask), (long long)k->ne[1], (long long)q->ne[1]);
  }
  if ((p->causal || p->window > 0) && (!q_pos || !kv_pos))
    return fail(g, TSR_ERR_INVALID_ARG, "flash_attn: causal or windowed attention needs positions");
  if (q_pos || kv_pos) {
    if (!q_pos || !kv_pos)
      return fail(g, TSR_ERR_INVALID_ARG, "flash_attn: q_pos and kv_pos come together");
    SRCS("flash_attn", q_pos, kv_pos);
    if (!want_dtype(g, "flash_attn", q_pos, TSR_I32) || !want_dtype(g, "flash_attn", kv_pos, TSR_I32))
      return NULL;
    if (tsr_tensor_nelements(q_pos) != q->ne[1] || tsr_tensor_nelements(kv_pos) != k->ne[1])
      return fail(g, TSR_ERR_INVALID_ARG, "flash_attn: %lld q positions for %lld queries, "
                  "%lld kv positions for %lld keys", (long long)tsr_tensor_nelements(q_pos),
                  (long long)q->ne[1], (long long)tsr_tensor_nelements(kv_pos),
                  (long long)k->ne[1]);
  }
  if (p->window < 0 || p->softcap < 0.0f)
    return fail(g, TSR_ERR_INVALID_ARG, "flash_attn: window %d and softcap %g must be >= 0",
                p->window, p->softcap);
  /* a decode policy's counters: memory the kernel adds to (kept on a device backend);
  ** skipping needs the keys' positions for its guards */
  struct tsr_tensor *counters = NULL;
  const bool skips = p->decode && (p->decode->v_skip_threshold > 0.0f ||
                                   p->decode->v_skip_budget > 0.0f);
  if (skips && p->decode->counters && kv_pos && !(counters = tsr_decode_counters(g, p->decode)))
    return NULL;
  struct tsr_tensor *t = node(g, TSR_OP_FLASH_ATTN, TSR_F32, v->ne[0], q->ne[2], q->ne[1], 1);
  if (!t) return NULL;
  t->src[0] = q, t->src[1] = k, t->src[2] = v;
  t->src[3] = mask, t->src[4] = q_pos, t->src[5] = kv_pos;
  tsr_param_set_f32(t, 0, p->scale);
  tsr_param_set_f32(t, 1, p->softcap);
  t->op_params[2] = p->causal;
  t->op_params[3] = p->window;
  /* decode parameters: the threshold and the guards */
  if (counters) {
    t->src[TSR_FA_SRC_COUNTERS] = counters;
    tsr_param_set_f32(t, TSR_FA_P_SKIP, p->decode->v_skip_threshold);
    tsr_param_set_f32(t, TSR_FA_P_BUDGET, p->decode->v_skip_budget);
    t->op_params[TSR_FA_P_SINK] = p->decode->sink;
    t->op_params[TSR_FA_P_RECENT] = p->decode->recent;
  }
  return t;
}

struct tsr_tensor *tsr_custom_op(struct tsr_graph *g, int32_t op_id, int n_dims, const int64_t *ne,
                                 struct tsr_tensor *const *src, int n_src, const int32_t *params,
                                 int n_params) {
  const char *name = tsr_op_registry_name(op_id);
  if (!name) return fail(g, TSR_ERR_INVALID_ARG, "custom op: no op registered with id %d", op_id);
  if (n_src < 0 || n_src > TSR_MAX_SRC || n_params < 0 || n_params > TSR_MAX_OP_PARAMS - 2 ||
      n_dims < 1 || n_dims > 4)
    return fail(g, TSR_ERR_INVALID_ARG, "custom op %s: %d sources, %d params, %d dims", name,
                n_src, n_params, n_dims);
  if (!srcs_ok(g, name, n_src, src)) return NULL;
  int64_t full[4] = {1, 1, 1, 1};
  for (int i = 0; i < n_dims; i++) full[i] = ne[i];
  struct tsr_tensor *t = node(g, TSR_OP_CUSTOM, TSR_F32, full[0], full[1], full[2], full[3]);
  if (!t) return NULL;
  for (int i = 0; i < n_src; i++) t->src[i] = src[i];
  t->op_params[0] = op_id;
  t->op_params[1] = n_params;
  for (int i = 0; i < n_params; i++) t->op_params[2 + i] = params[i];
  return t;
}
