/*
** Safetensors checkpoints for `tessera convert`: one model.safetensors, or
** shards listed by model.safetensors.index.json, each mapped read-only.
**
** File format: an 8-byte little-endian header length N, N bytes of JSON
** ({"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]},
** "__metadata__": {...}}), then the data; offsets count from the end of the
** header. Everything is validated when a file is opened, with overflow-
** checked arithmetic: header length against the file, each entry's fields and
** types, shape x dtype size = end - begin, end within the data, no two
** tensors overlapping, no name twice (in a file or across shards). A
** malformed file is TSR_ERR_FORMAT naming the file and the tensor.
**
** Every dtype the format defines is accepted in the index (a checkpoint may
** carry an int64 buffer the output skips); reading converts F32, F16 and BF16
** to f32 and refuses the others by name.
*/
#ifndef TSR_CONVERT_SAFETENSORS_H
#define TSR_CONVERT_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tessera/tessera.h"

#define TSR_ST_MAX_DIMS 8
#define TSR_ST_MAX_HEADER (100u << 20) /* the format's own limit: 100 MB */

struct tsr_st_tensor {
  const char *name;
  const char *dtype;  /* as written: "F32", "BF16", ... */
  size_t elem_size;   /* bytes per element */
  int32_t n_dims;     /* 0 for a scalar */
  int64_t shape[TSR_ST_MAX_DIMS]; /* outermost first; 1 past n_dims */
  int64_t n_elements;
  const void *data;   /* inside the mapping, possibly unaligned */
  size_t nbytes;
  const char *file;   /* the shard's path, for messages */
};

struct tsr_st_set;

/* Opens DIR/model.safetensors, or the shards DIR/model.safetensors.index.json
** names (checking the index and the shards agree), or else every
** DIR/model-*-of-*.safetensors. */
tsr_status tsr_st_open_dir(const char *dir, struct tsr_st_set **out);
/* Opens the given files as one checkpoint. */
tsr_status tsr_st_open_files(const char *const *paths, int n, struct tsr_st_set **out);
void tsr_st_close(struct tsr_st_set *s);

/* Tensors sorted by name. */
int64_t tsr_st_count(const struct tsr_st_set *s);
const struct tsr_st_tensor *tsr_st_at(const struct tsr_st_set *s, int64_t i);
/* Index of name, or -1. */
int64_t tsr_st_find(const struct tsr_st_set *s, const char *name);

/* The tensor's values as f32 (n must equal its element count). */
tsr_status tsr_st_read_f32(const struct tsr_st_tensor *t, float *out, int64_t n);

#endif
