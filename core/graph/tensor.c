#include "graph/tensor.h"

int64_t tsr_tensor_nelements(const struct tsr_tensor *t) {
  return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

int64_t tsr_tensor_nrows(const struct tsr_tensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }

size_t tsr_tensor_row_size(const struct tsr_tensor *t) {
  return tsr_dtype_row_size(t->dtype, t->ne[0]);
}

size_t tsr_tensor_nbytes(const struct tsr_tensor *t) {
  for (int i = 0; i < TSR_MAX_DIMS; i++)
    if (t->ne[i] <= 0) return 0;
  /* last byte reached plus one element (or one row of blocks): covers
  ** permuted and strided views */
  size_t bytes;
  int first;
  if (tsr_dtype_block_size(t->dtype) == 1) {
    bytes = tsr_dtype_type_size(t->dtype);
    first = 0;
  } else {
    bytes = tsr_tensor_row_size(t);
    first = 1;
  }
  for (int i = first; i < TSR_MAX_DIMS; i++) bytes += (size_t)(t->ne[i] - 1) * t->nb[i];
  return bytes;
}

bool tsr_tensor_is_contiguous(const struct tsr_tensor *t) {
  size_t expect = tsr_dtype_type_size(t->dtype);
  if (t->nb[0] != expect) return false;
  expect = tsr_tensor_row_size(t);
  for (int i = 1; i < TSR_MAX_DIMS; i++) {
    if (t->ne[i] != 1 && t->nb[i] != expect) return false;
    expect *= (size_t)t->ne[i];
  }
  return true;
}

bool tsr_tensor_same_shape(const struct tsr_tensor *a, const struct tsr_tensor *b) {
  for (int i = 0; i < TSR_MAX_DIMS; i++)
    if (a->ne[i] != b->ne[i]) return false;
  return true;
}

bool tsr_tensor_can_repeat(const struct tsr_tensor *b, const struct tsr_tensor *a) {
  for (int i = 0; i < TSR_MAX_DIMS; i++)
    if (b->ne[i] <= 0 || a->ne[i] % b->ne[i]) return false;
  return true;
}

void tsr_tensor_set_contiguous_strides(struct tsr_tensor *t) {
  t->nb[0] = tsr_dtype_type_size(t->dtype);
  t->nb[1] = tsr_dtype_row_size(t->dtype, t->ne[0]);
  for (int i = 2; i < TSR_MAX_DIMS; i++) t->nb[i] = t->nb[i - 1] * (size_t)t->ne[i - 1];
}

const char *tsr_op_name(enum tsr_op op) {
  static const char *names[TSR_OP_COUNT] = {
      [TSR_OP_NONE] = "none",         [TSR_OP_VIEW] = "view",
      [TSR_OP_GET_ROWS] = "get_rows", [TSR_OP_MAT_MUL] = "mat_mul",
      [TSR_OP_MAT_MUL_ID] = "mat_mul_id", [TSR_OP_ADD] = "add",
      [TSR_OP_MUL] = "mul",           [TSR_OP_SCALE] = "scale",
      [TSR_OP_RMS_NORM] = "rms_norm", [TSR_OP_L2_NORM] = "l2_norm",
      [TSR_OP_ROPE] = "rope",         [TSR_OP_SOFTMAX] = "softmax",
      [TSR_OP_UNARY] = "unary",       [TSR_OP_GLU] = "glu",
      [TSR_OP_SOFTCAP] = "softcap",   [TSR_OP_CONCAT] = "concat",
      [TSR_OP_CPY] = "cpy",           [TSR_OP_SET_ROWS] = "set_rows",
      [TSR_OP_TOP_K] = "top_k",       [TSR_OP_ARGMAX] = "argmax",
      [TSR_OP_FLASH_ATTN] = "flash_attn", [TSR_OP_CUSTOM] = "custom",
  };
  return (op >= 0 && op < TSR_OP_COUNT && names[op]) ? names[op] : "invalid";
}

const char *tsr_unary_name(enum tsr_unary_op op) {
  static const char *names[TSR_UNARY_COUNT] = {
      [TSR_UNARY_GELU] = "gelu",         [TSR_UNARY_SILU] = "silu",
      [TSR_UNARY_SIGMOID] = "sigmoid",   [TSR_UNARY_SOFTPLUS] = "softplus",
      [TSR_UNARY_TANH] = "tanh",         [TSR_UNARY_RELU] = "relu",
      [TSR_UNARY_NEG] = "neg",           [TSR_UNARY_EXP] = "exp",
  };
  return (op >= 0 && op < TSR_UNARY_COUNT && names[op]) ? names[op] : "invalid";
}
