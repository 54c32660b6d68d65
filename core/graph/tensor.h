/*
** Tensors: a dtype, up to four dimensions with byte strides, and either
** data (weights, inputs, planned intermediates) or an op with sources.
**
** ne[0] is the innermost (fastest) dimension. nb[i] is the byte stride of
** dimension i; for block types nb[0] is the block's byte size and a row
** holds ne[0]/block_size blocks. Views, permutes and reshapes share their
** source's bytes: view_src points at the tensor that owns them.
*/
#ifndef TSR_TENSOR_H
#define TSR_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "graph/dtype.h"

#define TSR_MAX_DIMS 4
#define TSR_MAX_SRC 8
#define TSR_MAX_NAME 64
#define TSR_MAX_OP_PARAMS 16 /* 32-bit words */

enum tsr_op {
  TSR_OP_NONE = 0, /* a leaf: weight, input or constant */
  TSR_OP_VIEW,     /* view, reshape, permute, transpose: no compute */
  TSR_OP_GET_ROWS,
  TSR_OP_MAT_MUL,
  TSR_OP_MAT_MUL_ID,
  TSR_OP_ADD,
  TSR_OP_MUL,
  TSR_OP_SCALE,
  TSR_OP_RMS_NORM,
  TSR_OP_L2_NORM,
  TSR_OP_ROPE,
  TSR_OP_SOFTMAX,
  TSR_OP_UNARY,
  TSR_OP_GLU,
  TSR_OP_SOFTCAP,
  TSR_OP_CONCAT,
  TSR_OP_CPY, /* copy/cast into a new tensor, or into an existing one */
  TSR_OP_SET_ROWS,
  TSR_OP_TOP_K,
  TSR_OP_ARGMAX,
  TSR_OP_FLASH_ATTN,
  TSR_OP_CUSTOM, /* an op a plugin registered (core/abi/op_registry.h) */
  TSR_OP_COUNT,
};

/* Sources and op_params per op (i = int32 word, f = float word):
**   GET_ROWS    src0 a, src1 idx
**   MAT_MUL     src0 w, src1 x
**   MAT_MUL_ID  src0 w, src1 x, src2 ids
**   ADD, MUL    src0 a, src1 b (broadcast)
**   SCALE       src0 a; f0 scale
**   RMS_NORM    src0 a, src1 weight or NULL; f0 eps
**   L2_NORM     src0 a; f0 eps
**   ROPE        src0 a, src1 pos, src2 freq_factors or NULL;
**               i0 n_rot, i1 mode, f2 freq_base, f3 freq_scale
**   SOFTMAX     src0 a, src1 mask or NULL; f0 scale
**   UNARY       src0 a; i0 enum tsr_unary_op
**   GLU         src0 gate (or [gate|up]), src1 up or NULL; i0 enum tsr_glu_op,
**               i1 swapped
**   SOFTCAP     src0 a; f0 cap
**   CONCAT      src0 a, src1 b; i0 dim
**   CPY         src0 a; dst is new, or a view of the target (view_src set)
**   SET_ROWS    src0 target, src1 rows, src2 idx; dst is a view of target
**   TOP_K       src0 a; i0 k
**   ARGMAX      src0 a
**   FLASH_ATTN  src0 q, src1 k, src2 v, src3 mask, src4 q_pos, src5 kv_pos
**               (last three may be NULL); f0 scale, f1 softcap, i2 causal,
**               i3 window
**   CUSTOM      src0..5 as given; i0 registered op id, i1 n_params,
**               i2.. params
** A node with an op and view_src set writes into its view_src's bytes. */

enum tsr_unary_op {
  TSR_UNARY_GELU, /* tanh approximation */
  TSR_UNARY_SILU,
  TSR_UNARY_SIGMOID,
  TSR_UNARY_SOFTPLUS,
  TSR_UNARY_TANH,
  TSR_UNARY_RELU,
  TSR_UNARY_NEG,
  TSR_UNARY_EXP,
  TSR_UNARY_COUNT,
};

enum tsr_glu_op {
  TSR_GLU_SWIGLU, /* silu(gate) * up */
  TSR_GLU_GEGLU,  /* gelu_tanh(gate) * up */
  TSR_GLU_REGLU,  /* relu(gate) * up */
  TSR_GLU_COUNT,
};

enum tsr_rope_mode {
  TSR_ROPE_NORMAL = 0, /* rotate adjacent pairs (x[2i], x[2i+1]) */
  TSR_ROPE_NEOX = 1,   /* rotate halves (x[i], x[i + n_rot/2]) */
};

enum tsr_tensor_flag {
  TSR_FLAG_INPUT = 1 << 0,  /* written by the caller before each run */
  TSR_FLAG_OUTPUT = 1 << 1, /* read by the caller after a run: kept alive */
  TSR_FLAG_WEIGHT = 1 << 2, /* data owned outside the graph (e.g. mmap) */
};

struct tsr_tensor {
  enum tsr_dtype dtype;
  int64_t ne[TSR_MAX_DIMS];
  size_t nb[TSR_MAX_DIMS];

  enum tsr_op op;
  int32_t op_params[TSR_MAX_OP_PARAMS];
  struct tsr_tensor *src[TSR_MAX_SRC];

  struct tsr_tensor *view_src; /* owner of the bytes, for views */
  size_t view_offs;            /* byte offset into view_src */

  void *data;  /* set for weights, and by the planner/backend for the rest */
  uint32_t flags;
  int32_t index; /* position in its graph's tensor list */
  char name[TSR_MAX_NAME];
};

int64_t tsr_tensor_nelements(const struct tsr_tensor *t);
int64_t tsr_tensor_nrows(const struct tsr_tensor *t); /* ne[1]*ne[2]*ne[3] */
size_t tsr_tensor_nbytes(const struct tsr_tensor *t); /* span of its bytes */
size_t tsr_tensor_row_size(const struct tsr_tensor *t); /* bytes of ne[0] elems */
/* Rows laid out back to back with no gaps (any block type). */
bool tsr_tensor_is_contiguous(const struct tsr_tensor *t);
/* Same ne in every dimension. */
bool tsr_tensor_same_shape(const struct tsr_tensor *a, const struct tsr_tensor *b);
/* b's dims each divide a's, so b can be broadcast over a. */
bool tsr_tensor_can_repeat(const struct tsr_tensor *b, const struct tsr_tensor *a);
/* Sets contiguous strides for the tensor's dtype and ne. */
void tsr_tensor_set_contiguous_strides(struct tsr_tensor *t);

/* Address of element (i0,i1,i2,i3) of a plain (non-block) tensor. */
static inline void *tsr_tensor_ptr(const struct tsr_tensor *t, int64_t i0,
                                   int64_t i1, int64_t i2, int64_t i3) {
  return (char *)t->data + i0 * (int64_t)t->nb[0] + i1 * (int64_t)t->nb[1] +
         i2 * (int64_t)t->nb[2] + i3 * (int64_t)t->nb[3];
}

/* Float op parameters stored bit-for-bit in op_params. */
static inline float tsr_param_f32(const struct tsr_tensor *t, int i) {
  float f;
  __builtin_memcpy(&f, &t->op_params[i], sizeof f);
  return f;
}
static inline void tsr_param_set_f32(struct tsr_tensor *t, int i, float f) {
  __builtin_memcpy(&t->op_params[i], &f, sizeof f);
}

const char *tsr_op_name(enum tsr_op op);
/* Whether a backend runs t: leaves (inputs, weights) and views compute nothing. */
static inline bool tsr_op_computes(const struct tsr_tensor *t) {
  return t->op != TSR_OP_NONE && t->op != TSR_OP_VIEW;
}
const char *tsr_unary_name(enum tsr_unary_op op);

#endif
