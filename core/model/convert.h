/*
** `tessera convert`: a Hugging Face checkpoint (config.json, safetensors,
** tokenizer.json) to GGUF with llama.cpp's names, so files interchange.
**
** The core owns the mechanics; the rules of each architecture (tensor
** names, keys, value transforms) live in the plugin whose converter
** (interface convert, tessera/plugin/convert.h) lists config.json's
** model_type in its hf_types. The plugin reads through the hf_* calls of
** host->convert and writes through its out_* calls, all of which are the
** functions below (plugin_services.c puts them in the services table).
**
** What the core guarantees around the plugin:
**  - every checkpoint tensor is either read by the plugin or under a prefix
**    it declared skipped (hf_skip_prefix), or the conversion fails naming
**    it: a missing rule never drops a weight silently;
**  - out_tensor with quantize=true stores the --outtype; a row length the
**    type cannot hold (ne[0] not a multiple of its block) falls back to q8_0
**    (k-quants, when ne[0] % 32 == 0) or f16, printing one note per tensor
**    and counting them in the summary; quantize=false stores f32; the
**    token embedding takes token_embd_type instead of either when it is set;
**  - general.name (the folder's name), general.type, general.file_type
**    (llama.cpp's LLAMA_FTYPE number for the outtype) and
**    general.quantization_version are written by the core; a plugin that
**    sets them is refused;
**  - config.json is checked before the plugin reads it: every key a
**    converter reads has its JSON type and range (convert_config.c); the
**    tokenizer writer refuses what tessera run's tokenizer loader would
**    (convert_tokenizer.c); a float key that is not finite (a config value
**    past float's range) is refused; each refusal names file and key;
**  - the output appears atomically (the GGUF writer's temp + rename), so a
**    failed conversion leaves a file already at the output path as it was;
**    converted tensor data waits in an unlinked spill file beside the
**    output, not in memory, so a model larger than RAM converts.
*/
#ifndef TSR_CONVERT_H
#define TSR_CONVERT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "graph/dtype.h"
#include "tessera/plugin.h"

struct tsr_plugin_host;

struct tsr_convert_options {
  const char *hf_dir;
  const char *out_path;
  enum tsr_dtype outtype; /* f32, f16, bf16, q8_0, q4_0, q4_K, q5_K, q6_K */
  /* token_embd.weight's own type (one of the outtypes) when set: a tied embedding is also
     the output head, the tensor whose rounding moves the logits most */
  bool token_embd_set;
  enum tsr_dtype token_embd_type;
  FILE *log;              /* fallback notes and the summary; NULL: quiet */
};

struct tsr_convert_stats {
  int64_t n_tensors;
  int64_t n_params;    /* elements over all output tensors */
  uint64_t n_bytes;    /* tensor data bytes in the output */
  int64_t n_fallback;  /* quantized tensors stored in another type (row length) */
  int64_t n_by_dtype[TSR_DTYPE_COUNT];
};

/* The dtype for an --outtype name (f32 f16 bf16 q8_0 q4_0 q4_K q5_K q6_K),
** or -1. */
int tsr_convert_outtype_parse(const char *name);
/* "f32|f16|bf16|q8_0|q4_0|q4_K|q5_K|q6_K" */
const char *tsr_convert_outtypes(void);
/* llama.cpp's general.file_type (LLAMA_FTYPE) for an outtype, or -1. */
int tsr_convert_file_type(enum tsr_dtype outtype);

/* The whole conversion: opens the checkpoint, loads the plugins on h's
** search path that provide convert, picks the one for config.json's model_type (unknown:
** TSR_ERR_UNSUPPORTED naming it and the known types), runs it, checks,
** writes. */
tsr_status tsr_convert_run(struct tsr_plugin_host *h, const struct tsr_convert_options *o,
                           struct tsr_convert_stats *stats);

/* ---- the steps, for tests and callers with their own dispatch ---- */
/* Reads config.json and indexes the safetensors; opens the spill file. */
tsr_status tsr_convert_open(const struct tsr_convert_options *o, struct tsr_convert **out);
void tsr_convert_free(struct tsr_convert *cv);
const char *tsr_convert_dir(const struct tsr_convert *cv);
/* config.json's model_type (or NULL when absent). */
const char *tsr_convert_model_type(const struct tsr_convert *cv);
/* core/model/convert_config.c: the type and range of every config.json key a
** converter reads (label names the file in messages). */
tsr_status tsr_convert_check_config(const void *config, const char *label);
/* A JSON value (cJSON) as messages name what they found: "the number 5",
** "a string \"x\"", "an object", "an array of 3". */
void tsr_convert_describe(const void *value, char *buf, size_t n);
/* Runs a plugin's converter with the host's services, after checking
** config.json (tsr_convert_check_config). */
tsr_status tsr_convert_with(struct tsr_convert *cv, const struct tsr_convert_v1 *converter,
                            const char *plugin_name);
/* The unread-tensor check, the core's keys, the write and the summary. */
tsr_status tsr_convert_finish(struct tsr_convert *cv, struct tsr_convert_stats *stats);

/* ---- host services (struct tsr_host_convert, host->convert) ---- */
int tsr_convert_hf_has(const struct tsr_convert *cv, const char *path);
tsr_status tsr_convert_hf_i64(const struct tsr_convert *cv, const char *path, int64_t *out);
tsr_status tsr_convert_hf_f64(const struct tsr_convert *cv, const char *path, double *out);
tsr_status tsr_convert_hf_bool(const struct tsr_convert *cv, const char *path, bool *out);
tsr_status tsr_convert_hf_str(const struct tsr_convert *cv, const char *path, const char **out);
tsr_status tsr_convert_hf_arr_len(const struct tsr_convert *cv, const char *path, int64_t *n);
tsr_status tsr_convert_hf_arr_i64(const struct tsr_convert *cv, const char *path, int64_t i,
                                  int64_t *out);
tsr_status tsr_convert_hf_arr_f64(const struct tsr_convert *cv, const char *path, int64_t i,
                                  double *out);
tsr_status tsr_convert_hf_arr_str(const struct tsr_convert *cv, const char *path, int64_t i,
                                  const char **out);
int64_t tsr_convert_hf_n_tensors(const struct tsr_convert *cv);
const char *tsr_convert_hf_tensor_name(const struct tsr_convert *cv, int64_t i);
int tsr_convert_hf_tensor_has(const struct tsr_convert *cv, const char *name);
tsr_status tsr_convert_hf_tensor_shape(const struct tsr_convert *cv, const char *name,
                                       int32_t *n_dims, int64_t shape[4]);
tsr_status tsr_convert_hf_tensor_read(struct tsr_convert *cv, const char *name, float *out,
                                      int64_t n);
void tsr_convert_hf_skip_prefix(struct tsr_convert *cv, const char *prefix);
tsr_status tsr_convert_out_u32(struct tsr_convert *cv, const char *key, uint32_t v);
tsr_status tsr_convert_out_i32(struct tsr_convert *cv, const char *key, int32_t v);
tsr_status tsr_convert_out_f32(struct tsr_convert *cv, const char *key, float v);
tsr_status tsr_convert_out_bool(struct tsr_convert *cv, const char *key, bool v);
tsr_status tsr_convert_out_str(struct tsr_convert *cv, const char *key, const char *v);
tsr_status tsr_convert_out_arr_i32(struct tsr_convert *cv, const char *key, const int32_t *v,
                                   int64_t n);
tsr_status tsr_convert_out_arr_f32(struct tsr_convert *cv, const char *key, const float *v,
                                   int64_t n);
tsr_status tsr_convert_out_arr_bool(struct tsr_convert *cv, const char *key, const bool *v,
                                    int64_t n);
tsr_status tsr_convert_out_tensor(struct tsr_convert *cv, const char *name, bool quantize,
                                  int32_t n_dims, const int64_t *ne, const float *data);
tsr_status tsr_convert_out_tensor_i32(struct tsr_convert *cv, const char *name, int32_t n_dims,
                                      const int64_t *ne, const int32_t *data);
/* core/model/convert_tokenizer.c */
tsr_status tsr_convert_tokenizer(struct tsr_convert *cv, const char *pre);

/* ---- for the tokenizer writer ---- */
tsr_status tsr_convert_out_arr_str(struct tsr_convert *cv, const char *key,
                                   const char *const *v, int64_t n);
/* The parsed config.json (a cJSON object). */
const void *tsr_convert_config(const struct tsr_convert *cv);

#endif
