/*
** JSON files for the converter (config.json, tokenizer.json, safetensors
** headers), read with cJSON, and typed access by dotted path
** ("text_config.rope_parameters.rope_theta"; a numeric component indexes an
** array: "layer_types.3").
**
** Errors name the file (the `label` given when parsing) and the path, and
** for a wrong type the JSON type found and its value. JSON null counts as
** absent: a Hugging Face config writes `"sliding_window": null` to mean
** "not set", and Python's hparams.get() reads it the same way.
*/
#ifndef TSR_JSON_H
#define TSR_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "tessera/tessera.h"

/* Parses len bytes (need not be NUL-terminated); a syntax error names the
** label and the line and column. *out is freed with cJSON_Delete. */
tsr_status tsr_json_parse(const char *text, size_t len, const char *label, cJSON **out);
/* Reads and parses a whole file; label for messages is the path. */
tsr_status tsr_json_load(const char *path, cJSON **out);
/* Whether a file exists and is a regular file. */
bool tsr_json_file_exists(const char *path);

/* "object", "array", "string", "number", "boolean", "null". */
const char *tsr_json_type_name(const cJSON *v);

/* The node at a dotted path, or NULL when absent or null (no error set). */
const cJSON *tsr_json_find(const cJSON *root, const char *path);

/* Typed access: a missing path or another type is TSR_ERR_FORMAT naming
** label, path and what was found. i64 takes integral numbers only (12.5 is
** refused); f64 takes any number. *out for str stays valid while root does. */
tsr_status tsr_json_i64(const cJSON *root, const char *label, const char *path, int64_t *out);
tsr_status tsr_json_f64(const cJSON *root, const char *label, const char *path, double *out);
tsr_status tsr_json_bool(const cJSON *root, const char *label, const char *path, bool *out);
tsr_status tsr_json_str(const cJSON *root, const char *label, const char *path, const char **out);
tsr_status tsr_json_arr_len(const cJSON *root, const char *label, const char *path, int64_t *n);
tsr_status tsr_json_arr_i64(const cJSON *root, const char *label, const char *path, int64_t i,
                            int64_t *out);
tsr_status tsr_json_arr_f64(const cJSON *root, const char *label, const char *path, int64_t i,
                            double *out);
tsr_status tsr_json_arr_str(const cJSON *root, const char *label, const char *path, int64_t i,
                            const char **out);

/* A number node as an exact integer: integral and within ±2^53 (beyond that
** a double no longer holds every integer, so the value may not be the one
** written). Returns false otherwise. */
bool tsr_json_as_i64(const cJSON *v, int64_t *out);

#endif
