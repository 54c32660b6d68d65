/*
** tessera plugin ABI: the convert interface, from a Hugging Face checkpoint to
** a GGUF (tessera convert), and the host's services for it (host->convert).
**
** A converter names the config.json "model_type" values it converts; convert()
** reads config.json and the checkpoint's tensors through host->convert's hf_*
** calls and writes llama.cpp's architecture string, keys, tensor names and
** layouts through its out_* calls, so files interchange with llama.cpp both
** ways. An arch plugin that converts provides both interfaces.
*/
#ifndef TESSERA_PLUGIN_CONVERT_H
#define TESSERA_PLUGIN_CONVERT_H

#include "tessera/plugin/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

struct tsr_convert_v1 {
  uint32_t struct_size;
  /* comma-separated config.json "model_type" values it converts ("qwen3,qwen3_moe") */
  const char *hf_types;
  void *ctx;
  tsr_status (*convert)(void *ctx, const struct tsr_host *host, struct tsr_convert *cv);
};

struct tsr_host_convert {
  uint32_t struct_size;
  /* config.json read by dotted path ("text_config.num_hidden_layers"); a
  ** missing key or another type is an error naming the path */
  int (*hf_has)(const struct tsr_convert *cv, const char *path);
  tsr_status (*hf_i64)(const struct tsr_convert *cv, const char *path, int64_t *out);
  tsr_status (*hf_f64)(const struct tsr_convert *cv, const char *path, double *out);
  tsr_status (*hf_bool)(const struct tsr_convert *cv, const char *path, bool *out);
  tsr_status (*hf_str)(const struct tsr_convert *cv, const char *path, const char **out);
  /* arrays in config.json: length, then elements by index */
  tsr_status (*hf_arr_len)(const struct tsr_convert *cv, const char *path, int64_t *n);
  tsr_status (*hf_arr_i64)(const struct tsr_convert *cv, const char *path, int64_t i,
                           int64_t *out);
  tsr_status (*hf_arr_f64)(const struct tsr_convert *cv, const char *path, int64_t i,
                           double *out);
  tsr_status (*hf_arr_str)(const struct tsr_convert *cv, const char *path, int64_t i,
                           const char **out);
  /* checkpoint tensors (one safetensors file or an indexed set of shards);
  ** shape in the checkpoint's own order (outermost first) */
  int64_t (*hf_n_tensors)(const struct tsr_convert *cv);
  const char *(*hf_tensor_name)(const struct tsr_convert *cv, int64_t i);
  int (*hf_tensor_has)(const struct tsr_convert *cv, const char *name);
  tsr_status (*hf_tensor_shape)(const struct tsr_convert *cv, const char *name, int32_t *n_dims,
                                int64_t shape[4]);
  /* the tensor's n values converted to f32, in the checkpoint's order */
  tsr_status (*hf_tensor_read)(struct tsr_convert *cv, const char *name, float *out, int64_t n);
  /* checkpoint tensors the output does not need (e.g. "model.visual."):
  ** every other tensor must be read, or the conversion fails naming it */
  void (*hf_skip_prefix)(struct tsr_convert *cv, const char *prefix);
  /* output metadata */
  tsr_status (*out_u32)(struct tsr_convert *cv, const char *key, uint32_t v);
  tsr_status (*out_i32)(struct tsr_convert *cv, const char *key, int32_t v);
  tsr_status (*out_f32)(struct tsr_convert *cv, const char *key, float v);
  tsr_status (*out_bool)(struct tsr_convert *cv, const char *key, bool v);
  tsr_status (*out_str)(struct tsr_convert *cv, const char *key, const char *v);
  tsr_status (*out_arr_i32)(struct tsr_convert *cv, const char *key, const int32_t *v, int64_t n);
  tsr_status (*out_arr_f32)(struct tsr_convert *cv, const char *key, const float *v, int64_t n);
  tsr_status (*out_arr_bool)(struct tsr_convert *cv, const char *key, const bool *v, int64_t n);
  /* output tensor: ne in GGUF order (innermost first); the host copies the
  ** data and stores it in the --outtype when quantize is true and the row
  ** length allows, else in f32 (norms, biases, small vectors) */
  tsr_status (*out_tensor)(struct tsr_convert *cv, const char *name, bool quantize,
                           int32_t n_dims, const int64_t *ne, const float *data);
  /* output tensor of int32 values (indices, orderings), stored as i32 */
  tsr_status (*out_tensor_i32)(struct tsr_convert *cv, const char *name, int32_t n_dims,
                               const int64_t *ne, const int32_t *data);
  /* tokenizer.json / tokenizer_config.json -> tokenizer.ggml.* with the
  ** given pre-tokenizer name ("qwen2", "qwen35", "gemma4", ...) */
  tsr_status (*tokenizer)(struct tsr_convert *cv, const char *pre);
};

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_PLUGIN_CONVERT_H */
