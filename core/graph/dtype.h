/*
** Data types: plain floats and integers, and the GGUF block-quantized types.
**
** Enum values equal the GGUF/ggml type ids so files interchange; ids that
** tessera knows by size but cannot compute with (the IQ family) still have
** traits so a file holding them can be read and described, and any attempt
** to compute with them is refused where the graph is planned.
*/
#ifndef TSR_DTYPE_H
#define TSR_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "tessera/tessera.h"

enum tsr_dtype {
  TSR_F32 = 0,
  TSR_F16 = 1,
  TSR_Q4_0 = 2,
  TSR_Q4_1 = 3,
  TSR_Q5_0 = 6,
  TSR_Q5_1 = 7,
  TSR_Q8_0 = 8,
  TSR_Q8_1 = 9,
  TSR_Q2_K = 10,
  TSR_Q3_K = 11,
  TSR_Q4_K = 12,
  TSR_Q5_K = 13,
  TSR_Q6_K = 14,
  TSR_Q8_K = 15,
  TSR_IQ2_XXS = 16,
  TSR_IQ2_XS = 17,
  TSR_IQ3_XXS = 18,
  TSR_IQ1_S = 19,
  TSR_IQ4_NL = 20,
  TSR_IQ3_S = 21,
  TSR_IQ2_S = 22,
  TSR_IQ4_XS = 23,
  TSR_I8 = 24,
  TSR_I16 = 25,
  TSR_I32 = 26,
  TSR_I64 = 27,
  TSR_F64 = 28,
  TSR_IQ1_M = 29,
  TSR_BF16 = 30,
  TSR_TQ1_0 = 34,
  TSR_TQ2_0 = 35,
  TSR_MXFP4 = 39,
  TSR_DTYPE_COUNT = 40, /* one past the largest GGUF id; not a type */

  /* tessera-only types, ids far above GGUF's so they can never collide with a
  ** type a future GGUF adds. They are KV codecs, never stored in a file: the
  ** GGUF reader accepts only ids below TSR_DTYPE_COUNT. */
  TSR_DTYPE_OWN_BASE = 1000,
  TSR_Q6_0 = 1000, /* 32 values: f16 d, 6-bit q, x = d * (q - 32); see core/kv/KV_CODECS.md */
  TSR_DTYPE_OWN_END = 1001, /* one past the largest tessera-only id; not a type */

  /* Ids the host assigns to KV codecs of their own block layout, in order of
  ** registration (tsr_dtype_register_codec). Like tessera's own types they
  ** never appear in a file. */
  TSR_DTYPE_CODEC_BASE = 1100,
  TSR_DTYPE_CODEC_MAX = 32,
};

/* Block sizes of the k-quants and the classic quants. */
#define TSR_QK4_0 32
#define TSR_QK4_1 32
#define TSR_QK5_0 32
#define TSR_QK5_1 32
#define TSR_QK8_0 32
#define TSR_QK6_0 32
#define TSR_QK8_1 32
#define TSR_QK_K 256
#define TSR_K_SCALE_SIZE 12

/* Dequantize n values (n a multiple of the block size) from src to dst. */
typedef void (*tsr_to_f32_fn)(const void *src, float *dst, int64_t n);
/* Reference round-to-nearest quantization of n values (multiple of block). */
typedef void (*tsr_from_f32_fn)(const float *src, void *dst, int64_t n);

struct tsr_dtype_traits {
  const char *name;    /* "q4_K"; NULL for ids that are not types */
  int64_t block_size;  /* elements per block (1 for plain types) */
  size_t type_size;    /* bytes per block */
  int is_quantized;
  tsr_to_f32_fn to_f32;     /* NULL where tessera cannot dequantize */
  tsr_from_f32_fn from_f32; /* NULL where no reference quantizer exists */
};

/* Traits of a type id (GGUF, tessera-only or codec-registered); NULL for ids
** that are not types. */
const struct tsr_dtype_traits *tsr_dtype_traits(int type_id);

/* A KV codec's own block layout as a dtype of the process: blocks of block_size
** values in type_size bytes, converted by the codec's CPU reference (encode /
** decode with ctx, which must live as long as the process: dtypes, like plugin
** ops, outlive any one host). owner and name identify it: registering the same
** pair again with the same geometry gives back the same id, so every host of
** a process agrees, and keeps the first registration's functions. */
typedef void (*tsr_codec_encode_fn)(void *ctx, const float *src, void *dst, int64_t n);
typedef void (*tsr_codec_decode_fn)(void *ctx, const void *src, float *dst, int64_t n);
tsr_status tsr_dtype_register_codec(const char *owner, const char *name, int64_t block_size,
                                    size_t type_size, tsr_codec_encode_fn encode,
                                    tsr_codec_decode_fn decode, void *ctx, int *id);
/* Whether type_id is in the range the host assigns to codecs of their own layout. */
static inline int tsr_dtype_is_codec(int type_id) {
  return type_id >= TSR_DTYPE_CODEC_BASE && type_id < TSR_DTYPE_CODEC_BASE + TSR_DTYPE_CODEC_MAX;
}

/* The plugin ops holding a codec dtype's device kernels (plugin.h,
** tsr_kv_codec_kernels): writing rows into it, lifting it to f16, and attention
** reading it in register (-1: none). */
tsr_status tsr_dtype_codec_set_ops(int type_id, int32_t encode_op, int32_t lift_op,
                                   int32_t read_op);
/* 1 and the ops when type_id is a codec dtype with device kernels, else 0. */
int tsr_dtype_codec_ops(int type_id, int32_t *encode_op, int32_t *lift_op, int32_t *read_op);
/* Where a copy of this file linked into another shared object (the cuda
** backend) finds the codec-registered dtypes of the process: the core's own
** tsr_dtype_traits. */
void tsr_dtype_set_codec_source(const struct tsr_dtype_traits *(*traits)(int type_id));
int tsr_dtype_valid(int type_id);
const char *tsr_dtype_name(enum tsr_dtype t);
/* Parses "q4_K", "f16", ... (case-insensitive); -1 if unknown. */
int tsr_dtype_from_name(const char *name);
int64_t tsr_dtype_block_size(enum tsr_dtype t);
size_t tsr_dtype_type_size(enum tsr_dtype t);

/* Bytes of one row of n elements; 0 if n is not a multiple of the block
** size or the size overflows. */
size_t tsr_dtype_row_size(enum tsr_dtype t, int64_t n);

/* Convert n elements of any dequantizable type to f32 (plain types too). */
tsr_status tsr_dtype_to_f32(enum tsr_dtype t, const void *src, float *dst,
                            int64_t n);
/* Convert n f32 values into type t (reference quantizers for block types). */
tsr_status tsr_dtype_from_f32(enum tsr_dtype t, const float *src, void *dst,
                              int64_t n);

/* Half-precision conversions, IEEE round-to-nearest-even. */
uint16_t tsr_f32_to_f16(float f);
float tsr_f16_to_f32(uint16_t h);
uint16_t tsr_f32_to_bf16(float f);
float tsr_bf16_to_f32(uint16_t h);

/* Block quantizers, one pair per type (core/graph/quant.c). */
#define TSR_DECLARE_QUANT(tn)                                                  \
  void tsr_dequantize_row_##tn(const void *src, float *dst, int64_t n);        \
  void tsr_quantize_row_##tn##_ref(const float *src, void *dst, int64_t n);
TSR_DECLARE_QUANT(q4_0)
TSR_DECLARE_QUANT(q4_1)
TSR_DECLARE_QUANT(q5_0)
TSR_DECLARE_QUANT(q5_1)
TSR_DECLARE_QUANT(q8_0)
TSR_DECLARE_QUANT(q6_0)
TSR_DECLARE_QUANT(q2_K)
TSR_DECLARE_QUANT(q3_K)
TSR_DECLARE_QUANT(q4_K)
TSR_DECLARE_QUANT(q5_K)
TSR_DECLARE_QUANT(q6_K)
TSR_DECLARE_QUANT(q8_K)
#undef TSR_DECLARE_QUANT

#endif
