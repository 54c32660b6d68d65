/*
** GGUF reader and writer.
**
** The reader takes a file (mapped read-only) or a caller's memory buffer and
** validates all of it before returning: every count, length, dimension and
** offset is checked against the bytes that exist, with overflow-checked
** arithmetic, so nothing read later through this API can point outside the
** file. A malformed file fails with TSR_ERR_FORMAT and a message naming the
** file, what is wrong and where (key, tensor, byte offset); a well-formed file
** this reader does not handle (GGUF v1, big-endian, a newer version) fails
** with TSR_ERR_UNSUPPORTED; open/stat/mmap failures are TSR_ERR_IO.
**
** Accepted: GGUF v2 and v3, little-endian, on a little-endian host.
** Refused on purpose, beyond what the format forbids outright:
**  - arrays of arrays (no writer emits them and no consumer reads them; one
**    level keeps every element a fixed size or a string),
**  - bool values other than 0 and 1,
**  - keys and tensor names that are empty or hold a NUL byte (they are used
**    as C strings), tensor names of 64 bytes or more,
**  - general.alignment that is not a u32 power of two in [1, 1 MiB],
**  - tensors with 0 or more than 4 dims, any dim of 0 or >= 2^63, an element
**    count or byte size that overflows, an unknown type id, ne[0] not a
**    multiple of the type's block size, a data offset not a multiple of the
**    alignment, data that extends past the end of the file, or data that
**    overlaps another tensor's.
*/
#ifndef TSR_GGUF_H
#define TSR_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "graph/dtype.h"
#include "tessera/tessera.h"

#define TSR_GGUF_MAGIC "GGUF"
#define TSR_GGUF_VERSION 3            /* what the writer emits */
#define TSR_GGUF_DEFAULT_ALIGNMENT 32
#define TSR_GGUF_MAX_ALIGNMENT (1u << 20)
#define TSR_GGUF_MAX_NAME 64          /* tensor names are shorter than this */
#define TSR_GGUF_MAX_DIMS 4

/* Value types; numbering is the file format's. */
enum tsr_gguf_type {
  TSR_GGUF_U8 = 0,
  TSR_GGUF_I8 = 1,
  TSR_GGUF_U16 = 2,
  TSR_GGUF_I16 = 3,
  TSR_GGUF_U32 = 4,
  TSR_GGUF_I32 = 5,
  TSR_GGUF_F32 = 6,
  TSR_GGUF_BOOL = 7,
  TSR_GGUF_STRING = 8,
  TSR_GGUF_ARRAY = 9,
  TSR_GGUF_U64 = 10,
  TSR_GGUF_I64 = 11,
  TSR_GGUF_F64 = 12,
  TSR_GGUF_TYPE_COUNT = 13, /* not a type; as an argument it means "any" */
};

/* "u32", "string", "array", ...; "invalid" for ids that are not types. */
const char *tsr_gguf_type_name(enum tsr_gguf_type t);
/* Bytes of one value of a fixed-size type; 0 for string, array, invalid. */
size_t tsr_gguf_type_size(enum tsr_gguf_type t);

/* A string as stored: len bytes, plus a NUL the reader appends (string
** values may themselves contain NUL bytes; keys and names may not). */
struct tsr_gguf_str {
  const char *ptr;
  uint64_t len;
};

/* One key/value pair, read-only. For arrays of fixed-size elements, `data`
** points at the raw little-endian elements inside the file: it may be
** unaligned, so read it with memcpy or the tsr_gguf_arr_* helpers. */
struct tsr_gguf_kv {
  const char *key;
  enum tsr_gguf_type type;
  uint64_t file_offset; /* where the pair starts, for messages */
  union {
    uint64_t u;  /* u8, u16, u32, u64 */
    int64_t i;   /* i8, i16, i32, i64 */
    double f;    /* f32, f64 (f32 widened exactly) */
    int b;       /* bool: 0 or 1 */
    struct tsr_gguf_str s;
  } v;
  /* arrays only */
  enum tsr_gguf_type elem_type;
  uint64_t n;
  const void *data;                /* fixed-size elements */
  const struct tsr_gguf_str *strs; /* string elements */
};

struct tsr_gguf_tensor {
  const char *name;
  enum tsr_dtype dtype;
  uint32_t n_dims;
  int64_t ne[TSR_GGUF_MAX_DIMS]; /* dims past n_dims are 1 */
  int64_t n_elements;
  uint64_t offset;      /* from the start of the data section, as stored */
  uint64_t file_offset; /* from the start of the file */
  size_t nbytes;
  const void *data;     /* inside the mapping or the caller's buffer */
};

struct tsr_gguf; /* opaque */

/* Map and validate a file. */
tsr_status tsr_gguf_open(const char *path, struct tsr_gguf **out);
/* Validate a buffer the caller keeps alive until tsr_gguf_close; `name`
** labels messages (NULL: "<memory>"). */
tsr_status tsr_gguf_open_memory(const void *data, size_t size, const char *name,
                                struct tsr_gguf **out);
void tsr_gguf_close(struct tsr_gguf *g);

/* ---- file level ---- */
const char *tsr_gguf_path(const struct tsr_gguf *g);
uint32_t tsr_gguf_version(const struct tsr_gguf *g);
uint32_t tsr_gguf_alignment(const struct tsr_gguf *g);
uint64_t tsr_gguf_data_offset(const struct tsr_gguf *g); /* start of tensor data */
uint64_t tsr_gguf_file_size(const struct tsr_gguf *g);

/* ---- key/value pairs ---- */
int64_t tsr_gguf_n_kv(const struct tsr_gguf *g);
const struct tsr_gguf_kv *tsr_gguf_kv_at(const struct tsr_gguf *g, int64_t i);
/* Index of a key, or -1 if absent (not an error; no message set). */
int64_t tsr_gguf_find_key(const struct tsr_gguf *g, const char *key);

/*
** Typed getters. A missing key or a stored type that differs from the one
** asked for fails with TSR_ERR_FORMAT and a message naming the key and both
** types. Conversions accepted, because no value can change:
**  - any integer type into any integer getter when the stored value fits the
**    target (a u32 read as i64, an i32 of 4096 read as u32; an i32 of -1 read
**    as u32 fails and names the value),
**  - f32 into the f64 getter.
** Never accepted: float <-> integer, f64 into f32, bool <-> integer, anything
** <-> string, scalar <-> array.
*/
tsr_status tsr_gguf_get_u32(const struct tsr_gguf *g, const char *key, uint32_t *out);
tsr_status tsr_gguf_get_i32(const struct tsr_gguf *g, const char *key, int32_t *out);
tsr_status tsr_gguf_get_u64(const struct tsr_gguf *g, const char *key, uint64_t *out);
tsr_status tsr_gguf_get_i64(const struct tsr_gguf *g, const char *key, int64_t *out);
tsr_status tsr_gguf_get_f32(const struct tsr_gguf *g, const char *key, float *out);
tsr_status tsr_gguf_get_f64(const struct tsr_gguf *g, const char *key, double *out);
tsr_status tsr_gguf_get_bool(const struct tsr_gguf *g, const char *key, int *out);
/* *out stays valid until tsr_gguf_close; it is NUL-terminated. */
tsr_status tsr_gguf_get_str(const struct tsr_gguf *g, const char *key, const char **out);

/* An array's pair, checking its element type (TSR_GGUF_TYPE_COUNT: any). */
tsr_status tsr_gguf_get_arr(const struct tsr_gguf *g, const char *key,
                            enum tsr_gguf_type elem_type, const struct tsr_gguf_kv **out);
/* Element i of an array pair, with the scalar getters' conversion rules;
** an index out of range or a type mismatch names the key. */
tsr_status tsr_gguf_arr_i64(const struct tsr_gguf *g, const struct tsr_gguf_kv *kv,
                            uint64_t i, int64_t *out);
tsr_status tsr_gguf_arr_u64(const struct tsr_gguf *g, const struct tsr_gguf_kv *kv,
                            uint64_t i, uint64_t *out);
tsr_status tsr_gguf_arr_f64(const struct tsr_gguf *g, const struct tsr_gguf_kv *kv,
                            uint64_t i, double *out);
tsr_status tsr_gguf_arr_f32(const struct tsr_gguf *g, const struct tsr_gguf_kv *kv,
                            uint64_t i, float *out);
tsr_status tsr_gguf_arr_str(const struct tsr_gguf *g, const struct tsr_gguf_kv *kv,
                            uint64_t i, struct tsr_gguf_str *out);

/* ---- tensors ---- */
int64_t tsr_gguf_n_tensors(const struct tsr_gguf *g);
const struct tsr_gguf_tensor *tsr_gguf_tensor_at(const struct tsr_gguf *g, int64_t i);
/* NULL if absent. */
const struct tsr_gguf_tensor *tsr_gguf_find_tensor(const struct tsr_gguf *g, const char *name);

/* ---- writer ----
** Collects pairs and tensors, then writes a GGUF v3 file atomically: into a
** temporary file in the target's directory, fsync, rename over the target,
** fsync the directory. A failure at any step leaves an existing target as it
** was. Keys, strings and arrays are copied when added; tensor data is not
** (the pointer must stay valid until tsr_gguf_writer_write returns; NULL
** writes zeros), or is produced while writing (tsr_gguf_writer_add_tensor_rows).
** The writer refuses what the reader would refuse (duplicate
** or empty keys and names, bad dims, ne[0] not a multiple of the block size),
** so everything it writes reads back. Setting general.alignment (u32, power of
** two, at most 1 MiB) changes the padding used; the default is 32. */
struct tsr_gguf_writer;

tsr_status tsr_gguf_writer_new(struct tsr_gguf_writer **out);
void tsr_gguf_writer_free(struct tsr_gguf_writer *w);

/* `value` points at one value of `type` (any fixed-size scalar type). */
tsr_status tsr_gguf_writer_add_scalar(struct tsr_gguf_writer *w, const char *key,
                                      enum tsr_gguf_type type, const void *value);
tsr_status tsr_gguf_writer_add_u32(struct tsr_gguf_writer *w, const char *key, uint32_t v);
tsr_status tsr_gguf_writer_add_i32(struct tsr_gguf_writer *w, const char *key, int32_t v);
tsr_status tsr_gguf_writer_add_u64(struct tsr_gguf_writer *w, const char *key, uint64_t v);
tsr_status tsr_gguf_writer_add_f32(struct tsr_gguf_writer *w, const char *key, float v);
tsr_status tsr_gguf_writer_add_bool(struct tsr_gguf_writer *w, const char *key, int v);
tsr_status tsr_gguf_writer_add_str(struct tsr_gguf_writer *w, const char *key, const char *s);
/* A string of len bytes that may hold NULs. */
tsr_status tsr_gguf_writer_add_strn(struct tsr_gguf_writer *w, const char *key,
                                    const char *s, uint64_t len);
/* n elements of a fixed-size type, host (little-endian) layout. */
tsr_status tsr_gguf_writer_add_arr(struct tsr_gguf_writer *w, const char *key,
                                   enum tsr_gguf_type elem_type, const void *data, uint64_t n);
tsr_status tsr_gguf_writer_add_arr_str(struct tsr_gguf_writer *w, const char *key,
                                       const char *const *strs, uint64_t n);
tsr_status tsr_gguf_writer_add_tensor(struct tsr_gguf_writer *w, const char *name,
                                      enum tsr_dtype dtype, uint32_t n_dims,
                                      const int64_t *ne, const void *data);

/* Streaming tensors. A tensor's bytes are rows of ne[0] elements (every dim
** above 0 flattened: ne[1]*ne[2]*ne[3] rows). fn writes rows [row0, row0 +
** n_rows) into dst (n_rows whole rows, tightly packed) and returns TSR_OK, or
** an error that aborts the write (its message stands). */
typedef tsr_status (*tsr_gguf_rows_fn)(void *ctx, int64_t row0, int64_t n_rows, void *dst);

/* Bytes of the row blocks fn is asked for: each call gets as many whole rows
** as fit in this (at least one row). */
#define TSR_GGUF_STREAM_BLOCK (4u << 20)

/* Adds a tensor whose bytes fn produces while the file is written: the header,
** with every offset, goes out first; then each streamed tensor's rows are
** asked for in order, block by block, and written at once, so the writer holds
** one block (TSR_GGUF_STREAM_BLOCK) whatever the file's size. fn is called
** from the thread that called tsr_gguf_writer_write; ctx must stay valid
** until then. The file is byte for byte what tsr_gguf_writer_add_tensor with
** the same bytes writes. */
tsr_status tsr_gguf_writer_add_tensor_rows(struct tsr_gguf_writer *w, const char *name,
                                           enum tsr_dtype dtype, uint32_t n_dims,
                                           const int64_t *ne, tsr_gguf_rows_fn fn, void *ctx);

/* Bytes the file will have when written as the writer stands (header, padding
** and tensor data): what a caller can check against free disk space. */
tsr_status tsr_gguf_writer_file_size(const struct tsr_gguf_writer *w, uint64_t *out);

/* Writes the file (see above). A tensor with neither data nor fn is zeros,
** left as a hole in the file where the filesystem allows (it reads as zeros
** and takes no disk). */
tsr_status tsr_gguf_writer_write(struct tsr_gguf_writer *w, const char *path);

#endif
