/*
** What the CUDA backend refuses, before anything runs: each refusal names the
** op, the tensor and what is missing. There is no fallback to the CPU.
*/
#include "abi/op_registry.h"
#include "cuda_internal.h"

static const char *label(const struct tsr_tensor *t) { return t->name[0] ? t->name : "(unnamed)"; }

#define READS "f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q6_0 and q2_K..q8_K"
#define WRITES "f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0 and q6_0"
#define ATTN_READS "f32, f16, bf16, q8_0, q6_0, q5_1, q5_0, q4_1 and q4_0"

static bool attn_reads(enum tsr_dtype t) {
  switch (t) {
  case TSR_F32: case TSR_F16: case TSR_BF16: case TSR_Q8_0: case TSR_Q6_0: case TSR_Q5_1:
  case TSR_Q5_0: case TSR_Q4_1: case TSR_Q4_0: return true;
  default: return false;
  }
}

static bool plain_f32(const struct tsr_tensor *t) {
  return t->dtype == TSR_F32;
}

static tsr_status refuse(const struct tsr_tensor *t, const char *what, const struct tsr_tensor *s,
                         const char *can) {
  return tsr_error_set(TSR_ERR_UNSUPPORTED, "cuda backend: op %s, tensor '%s': %s '%s' is %s; "
                       "the cuda backend handles %s", tsr_op_name(t->op), label(t), what, label(s),
                       tsr_dtype_name(s->dtype), can);
}

/* A codec dtype's kernel for role (0 encode, 1 lift), loaded now: a missing one
** refuses the graph at load, naming the op and file. */
static tsr_status codec_kernel(struct cu_ctx *c, const struct tsr_tensor *t, int32_t dtype,
                               int role) {
  int32_t op[3];
  if (!c->host->codec_ops(dtype, op, op + 1, op + 2))
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "cuda backend: op %s, tensor '%s': dtype %s has "
                         "no cuda kernels", tsr_op_name(t->op), label(t), tsr_dtype_name(dtype));
  tsr_plugin_kernel_fn fn;
  void *kctx;
  return c->host->custom_op_kernel(op[role], "cuda", &fn, &kctx);
}

int32_t tsr_cuda_codec_read_op(const struct cu_ctx *c, const struct tsr_tensor *t) {
  /* K's codec's read op when K's and V's resolve to one kernel and context (one plugin's
  ** tiers, mixed or not); any other pair is the core kernel's, which reads the core dtypes
  ** only (flash's negotiation lifts a codec no read kernel takes to f16 first) */
  int32_t read[2];
  tsr_plugin_kernel_fn fn[2];
  void *kctx[2];
  for (int i = 0; i < 2; i++) {
    int32_t op[3];
    if (!tsr_dtype_is_codec((int)t->src[i + 1]->dtype) ||
        !c->host->codec_ops((int32_t)t->src[i + 1]->dtype, op, op + 1, op + 2) || op[2] < 0 ||
        c->host->custom_op_kernel(op[2], "cuda", &fn[i], &kctx[i]) != TSR_OK)
      return -1;
    read[i] = op[2];
  }
  return fn[0] == fn[1] && kctx[0] == kctx[1] ? read[0] : -1;
}

/* K or V of an attention no kernel reads: a codec of its own layout outside a pair its
** read kernel takes, or any other dtype the core kernel does not read */
static tsr_status refuse_attn(const struct tsr_tensor *t, const char *what,
                              const struct tsr_tensor *s) {
  if (!tsr_dtype_is_codec((int)s->dtype)) return refuse(t, what, s, "attention over " ATTN_READS);
  return tsr_error_set(TSR_ERR_UNSUPPORTED, "cuda backend: op flash_attn, tensor '%s': %s '%s' "
                       "is %s, which a codec's read kernel takes only beside another of that "
                       "codec's dtypes (K and V); lift it to f16 first (flash's negotiation "
                       "does)", label(t), what, label(s), tsr_dtype_name(s->dtype));
}

tsr_status tsr_cuda_supports(struct cu_ctx *c, const struct tsr_tensor *t) {
  const struct tsr_tensor *a = t->src[0], *b = t->src[1];
  switch (t->op) {
  case TSR_OP_NONE:
  case TSR_OP_VIEW:
    return TSR_OK;
  case TSR_OP_GET_ROWS:
    return cu_can_read(a->dtype) ? TSR_OK : refuse(t, "table", a, READS);
  case TSR_OP_MAT_MUL:
  case TSR_OP_MAT_MUL_ID:
    if (!cu_can_read(a->dtype)) return refuse(t, "weight", a, READS);
    if (!plain_f32(b)) return refuse(t, "input", b, "f32 inputs");
    if (t->dtype != TSR_F32 || t->nb[0] != 4) return refuse(t, "output", t, "dense f32 outputs");
    return TSR_OK;
  case TSR_OP_ADD: case TSR_OP_MUL: case TSR_OP_SCALE: case TSR_OP_RMS_NORM: case TSR_OP_L2_NORM:
  case TSR_OP_ROPE: case TSR_OP_SOFTMAX: case TSR_OP_UNARY: case TSR_OP_GLU: case TSR_OP_SOFTCAP:
  case TSR_OP_TOP_K: case TSR_OP_ARGMAX:
    return TSR_OK; /* the builders admit f32 (and f32/f16 masks) only */
  case TSR_OP_CONCAT:
    if (t->dtype == TSR_F32 || t->dtype == TSR_F16 || t->dtype == TSR_BF16 || t->dtype == TSR_I32)
      return TSR_OK;
    return refuse(t, "source", a, "concat of f32, f16, bf16 and i32");
  case TSR_OP_CPY:
    if (tsr_dtype_is_codec((int)a->dtype)) /* a codec's lift */
      return t->dtype == TSR_F16 ? codec_kernel(c, t, (int32_t)a->dtype, 1)
                                 : refuse(t, "destination", t, "casts of a codec's rows to f16");
    if (a->dtype == t->dtype) {
      if (cu_can_read(t->dtype) || t->dtype == TSR_I32) return TSR_OK;
      return refuse(t, "source", a, "copies of i32 and " READS);
    }
    if (!cu_can_read(a->dtype)) return refuse(t, "source", a, "casts from " READS);
    if (!cu_can_write(t->dtype)) return refuse(t, "destination", t, "casts to " WRITES);
    return TSR_OK;
  case TSR_OP_SET_ROWS:
    if (tsr_dtype_is_codec((int)t->dtype)) return codec_kernel(c, t, (int32_t)t->dtype, 0);
    return cu_can_write(t->dtype) ? TSR_OK : refuse(t, "target", a, "set_rows into " WRITES);
  case TSR_OP_FLASH_ATTN: {
    const struct tsr_tensor *k = t->src[1], *v = t->src[2];
    if (tsr_cuda_codec_read_op(c, t) >= 0) return TSR_OK;
    if (!attn_reads(k->dtype)) return refuse_attn(t, "K", k);
    if (!attn_reads(v->dtype)) return refuse_attn(t, "V", v);
    if (a->ne[0] > CU_ATTN_MAX_D || v->ne[0] > CU_ATTN_MAX_D)
      return tsr_error_set(TSR_ERR_UNSUPPORTED, "cuda backend: op flash_attn, tensor '%s': head "
                           "dims %lld (K) and %lld (V); the cuda kernel holds at most %d",
                           label(t), (long long)a->ne[0], (long long)v->ne[0], CU_ATTN_MAX_D);
    return TSR_OK;
  }
  case TSR_OP_CUSTOM: {
    /* the plugin's cuda kernel, its library opened here the first time (plugin.h) */
    tsr_plugin_kernel_fn fn;
    void *kctx;
    if (c->host->custom_op_kernel(t->op_params[0], "cuda", &fn, &kctx) != TSR_OK) {
      tsr_error_prefix("cuda backend: no kernel for plugin op, tensor '%s'", label(t));
      return TSR_ERR_UNSUPPORTED;
    }
    return TSR_OK;
  }
  default:
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "cuda backend: no kernel for op %s (tensor '%s')",
                         tsr_op_name(t->op), label(t));
  }
}
