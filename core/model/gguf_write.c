/*
** GGUF v3 writer. Pairs are stored already encoded (the bytes that follow the
** key and type), so writing is a straight copy; tensors keep the caller's
** data pointer, or the caller's row producer, asked for one block of rows at
** a time while the data section is written (every offset is known from the
** shapes alone, so the header goes out first and nothing is held back). The
** file appears under its name only once it is complete and on disk: write a
** temporary beside it, fsync, rename, fsync the directory.
*/
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "model/gguf.h"

struct wkv {
  char *key;
  enum tsr_gguf_type type;
  unsigned char *val; /* encoded value */
  size_t val_len;
};

struct wtensor {
  char *name;
  enum tsr_dtype dtype;
  uint32_t n_dims;
  int64_t ne[TSR_GGUF_MAX_DIMS];
  size_t nbytes;
  uint64_t offset; /* assigned at write */
  const void *data;
  tsr_gguf_rows_fn fn; /* or the bytes are produced, row block by row block */
  void *fn_ctx;
};

struct tsr_gguf_writer {
  struct wkv *kv;
  size_t n_kv, cap_kv;
  struct wtensor *tensors;
  size_t n_tensors, cap_tensors;
  uint32_t alignment;
};

tsr_status tsr_gguf_writer_new(struct tsr_gguf_writer **out) {
  *out = calloc(1, sizeof **out);
  if (!*out) return tsr_error_set(TSR_ERR_NOMEM, "gguf writer: out of memory");
  (*out)->alignment = TSR_GGUF_DEFAULT_ALIGNMENT;
  return TSR_OK;
}

void tsr_gguf_writer_free(struct tsr_gguf_writer *w) {
  if (!w) return;
  for (size_t i = 0; i < w->n_kv; i++) {
    free(w->kv[i].key);
    free(w->kv[i].val);
  }
  for (size_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
  free(w->kv);
  free(w->tensors);
  free(w);
}

static int grow(void **arr, size_t *cap, size_t n, size_t elem) {
  if (n < *cap) return 1;
  size_t ncap = *cap ? *cap * 2 : 16, bytes;
  if (!tsr_size_mul(ncap, elem, &bytes)) return 0;
  void *p = realloc(*arr, bytes);
  if (!p) return 0;
  *arr = p;
  *cap = ncap;
  return 1;
}

/* Takes ownership of val (freed on failure too). */
static tsr_status add_kv(struct tsr_gguf_writer *w, const char *key, enum tsr_gguf_type type,
                         unsigned char *val, size_t val_len) {
  tsr_status st = TSR_OK;
  if (!key || !key[0]) {
    st = tsr_error_set(TSR_ERR_INVALID_ARG, "gguf writer: empty key");
    goto fail;
  }
  for (size_t i = 0; i < w->n_kv; i++)
    if (strcmp(w->kv[i].key, key) == 0) {
      st = tsr_error_set(TSR_ERR_INVALID_ARG, "gguf writer: duplicate key '%s'", key);
      goto fail;
    }
  if (strcmp(key, "general.alignment") == 0) {
    uint32_t a = 0;
    if (type == TSR_GGUF_U32) memcpy(&a, val, 4);
    if (type != TSR_GGUF_U32 || a == 0 || (a & (a - 1)) || a > TSR_GGUF_MAX_ALIGNMENT) {
      st = tsr_error_set(TSR_ERR_INVALID_ARG,
                         "gguf writer: general.alignment must be a u32 power of two from 1 "
                         "to %u",
                         TSR_GGUF_MAX_ALIGNMENT);
      goto fail;
    }
    w->alignment = a;
  }
  char *k = strdup(key);
  if (!k || !grow((void **)&w->kv, &w->cap_kv, w->n_kv, sizeof *w->kv)) {
    free(k);
    st = tsr_error_set(TSR_ERR_NOMEM, "gguf writer: out of memory");
    goto fail;
  }
  w->kv[w->n_kv++] = (struct wkv){k, type, val, val_len};
  return TSR_OK;
fail:
  free(val);
  return st;
}

tsr_status tsr_gguf_writer_add_scalar(struct tsr_gguf_writer *w, const char *key,
                                      enum tsr_gguf_type type, const void *value) {
  size_t n = tsr_gguf_type_size(type);
  if (!n)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "gguf writer: key '%s': %s is not a scalar type",
                         key ? key : "", tsr_gguf_type_name(type));
  if (type == TSR_GGUF_BOOL && *(const uint8_t *)value > 1)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "gguf writer: key '%s': bool must be 0 or 1",
                         key ? key : "");
  unsigned char *val = malloc(n);
  if (!val) return tsr_error_set(TSR_ERR_NOMEM, "gguf writer: out of memory");
  memcpy(val, value, n);
  return add_kv(w, key, type, val, n);
}

tsr_status tsr_gguf_writer_add_u32(struct tsr_gguf_writer *w, const char *key, uint32_t v) {
  return tsr_gguf_writer_add_scalar(w, key, TSR_GGUF_U32, &v);
}
tsr_status tsr_gguf_writer_add_i32(struct tsr_gguf_writer *w, const char *key, int32_t v) {
  return tsr_gguf_writer_add_scalar(w, key, TSR_GGUF_I32, &v);
}
tsr_status tsr_gguf_writer_add_u64(struct tsr_gguf_writer *w, const char *key, uint64_t v) {
  return tsr_gguf_writer_add_scalar(w, key, TSR_GGUF_U64, &v);
}
tsr_status tsr_gguf_writer_add_f32(struct tsr_gguf_writer *w, const char *key, float v) {
  return tsr_gguf_writer_add_scalar(w, key, TSR_GGUF_F32, &v);
}
tsr_status tsr_gguf_writer_add_bool(struct tsr_gguf_writer *w, const char *key, int v) {
  uint8_t b = v ? 1 : 0;
  return tsr_gguf_writer_add_scalar(w, key, TSR_GGUF_BOOL, &b);
}

static void put_u64(unsigned char *dst, uint64_t v) { memcpy(dst, &v, 8); }

tsr_status tsr_gguf_writer_add_strn(struct tsr_gguf_writer *w, const char *key, const char *s,
                                    uint64_t len) {
  size_t n;
  if (len > SIZE_MAX || !tsr_size_add((size_t)len, 8, &n))
    return tsr_error_set(TSR_ERR_NOMEM, "gguf writer: key '%s': string too long", key);
  unsigned char *val = malloc(n);
  if (!val) return tsr_error_set(TSR_ERR_NOMEM, "gguf writer: out of memory");
  put_u64(val, len);
  if (len) memcpy(val + 8, s, (size_t)len);
  return add_kv(w, key, TSR_GGUF_STRING, val, n);
}

tsr_status tsr_gguf_writer_add_str(struct tsr_gguf_writer *w, const char *key, const char *s) {
  return tsr_gguf_writer_add_strn(w, key, s, strlen(s));
}

tsr_status tsr_gguf_writer_add_arr(struct tsr_gguf_writer *w, const char *key,
                                   enum tsr_gguf_type elem_type, const void *data, uint64_t n) {
  size_t esize = tsr_gguf_type_size(elem_type), bytes, total;
  if (!esize)
    return tsr_error_set(TSR_ERR_INVALID_ARG,
                         "gguf writer: key '%s': arrays of %s need tsr_gguf_writer_add_arr_str "
                         "or are not supported",
                         key ? key : "", tsr_gguf_type_name(elem_type));
  if (n > SIZE_MAX || !tsr_size_mul((size_t)n, esize, &bytes) || !tsr_size_add(bytes, 12, &total))
    return tsr_error_set(TSR_ERR_NOMEM, "gguf writer: key '%s': array too long", key);
  if (elem_type == TSR_GGUF_BOOL)
    for (uint64_t i = 0; i < n; i++)
      if (((const uint8_t *)data)[i] > 1)
        return tsr_error_set(TSR_ERR_INVALID_ARG,
                             "gguf writer: key '%s': bool element %llu must be 0 or 1", key,
                             (unsigned long long)i);
  unsigned char *val = malloc(total);
  if (!val) return tsr_error_set(TSR_ERR_NOMEM, "gguf writer: out of memory");
  uint32_t et = elem_type;
  memcpy(val, &et, 4);
  put_u64(val + 4, n);
  if (bytes) memcpy(val + 12, data, bytes);
  return add_kv(w, key, TSR_GGUF_ARRAY, val, total);
}

tsr_status tsr_gguf_writer_add_arr_str(struct tsr_gguf_writer *w, const char *key,
                                       const char *const *strs, uint64_t n) {
  size_t total = 12;
  for (uint64_t i = 0; i < n; i++)
    if (!tsr_size_add(total, 8, &total) || !tsr_size_add(total, strlen(strs[i]), &total))
      return tsr_error_set(TSR_ERR_NOMEM, "gguf writer: key '%s': array too long", key);
  unsigned char *val = malloc(total), *p = val;
  if (!val) return tsr_error_set(TSR_ERR_NOMEM, "gguf writer: out of memory");
  uint32_t et = TSR_GGUF_STRING;
  memcpy(p, &et, 4);
  put_u64(p + 4, n);
  p += 12;
  for (uint64_t i = 0; i < n; i++) {
    size_t len = strlen(strs[i]);
    put_u64(p, len);
    memcpy(p + 8, strs[i], len);
    p += 8 + len;
  }
  return add_kv(w, key, TSR_GGUF_ARRAY, val, total);
}

static tsr_status add_tensor(struct tsr_gguf_writer *w, const char *name, enum tsr_dtype dtype,
                             uint32_t n_dims, const int64_t *ne, const void *data,
                             tsr_gguf_rows_fn fn, void *fn_ctx) {
  const struct tsr_dtype_traits *tr = tsr_dtype_traits((int)dtype);
  if (!name || !name[0] || strlen(name) >= TSR_GGUF_MAX_NAME)
    return tsr_error_set(TSR_ERR_INVALID_ARG,
                         "gguf writer: tensor name '%s' must be 1 to %d bytes", name ? name : "",
                         TSR_GGUF_MAX_NAME - 1);
  if (!tr) return tsr_error_set(TSR_ERR_INVALID_ARG, "gguf writer: tensor '%s': unknown dtype %d",
                                name, (int)dtype);
  /* tessera-only ids (KV codecs such as q6_0) are not GGUF types */
  if ((int)dtype >= TSR_DTYPE_COUNT)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "gguf writer: tensor '%s': %s is not a GGUF type",
                         name, tr->name);
  if (n_dims == 0 || n_dims > TSR_GGUF_MAX_DIMS)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "gguf writer: tensor '%s': n_dims %u not in 1..%d",
                         name, n_dims, TSR_GGUF_MAX_DIMS);
  struct wtensor t = {.dtype = dtype, .n_dims = n_dims, .ne = {1, 1, 1, 1}, .data = data,
                      .fn = fn, .fn_ctx = fn_ctx};
  for (uint32_t d = 0; d < n_dims; d++) {
    if (ne[d] <= 0)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "gguf writer: tensor '%s': dimension %u is %lld",
                           name, d, (long long)ne[d]);
    t.ne[d] = ne[d];
  }
  if (t.ne[0] % tr->block_size)
    return tsr_error_set(TSR_ERR_INVALID_ARG,
                         "gguf writer: tensor '%s': ne[0] = %lld is not a multiple of %s's "
                         "block size %lld",
                         name, (long long)t.ne[0], tr->name, (long long)tr->block_size);
  int ok = tsr_size_mul((size_t)(t.ne[0] / tr->block_size), tr->type_size, &t.nbytes);
  int64_t n_el = t.ne[0];
  for (int d = 1; d < TSR_GGUF_MAX_DIMS && ok; d++)
    ok = tsr_size_mul(t.nbytes, (size_t)t.ne[d], &t.nbytes) &&
         !__builtin_mul_overflow(n_el, t.ne[d], &n_el);
  if (!ok) return tsr_error_set(TSR_ERR_INVALID_ARG, "gguf writer: tensor '%s': size overflows",
                                name);
  t.name = strdup(name);
  if (!t.name || !grow((void **)&w->tensors, &w->cap_tensors, w->n_tensors, sizeof t)) {
    free(t.name);
    return tsr_error_set(TSR_ERR_NOMEM, "gguf writer: out of memory");
  }
  w->tensors[w->n_tensors++] = t;
  return TSR_OK;
}

tsr_status tsr_gguf_writer_add_tensor(struct tsr_gguf_writer *w, const char *name,
                                      enum tsr_dtype dtype, uint32_t n_dims, const int64_t *ne,
                                      const void *data) {
  return add_tensor(w, name, dtype, n_dims, ne, data, NULL, NULL);
}

tsr_status tsr_gguf_writer_add_tensor_rows(struct tsr_gguf_writer *w, const char *name,
                                           enum tsr_dtype dtype, uint32_t n_dims,
                                           const int64_t *ne, tsr_gguf_rows_fn fn, void *ctx) {
  if (!fn)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "gguf writer: tensor '%s': no row producer",
                         name ? name : "");
  return add_tensor(w, name, dtype, n_dims, ne, NULL, fn, ctx);
}

/* ---- writing ------------------------------------------------------------- */

static int cmp_name(const void *a, const void *b) {
  return strcmp((*(const struct wtensor *const *)a)->name, (*(const struct wtensor *const *)b)->name);
}

/* Duplicate names are checked here, once, by sorting: O(n log n) for the
** many-thousand-tensor files a model generator writes. */
static tsr_status check_unique_names(const struct tsr_gguf_writer *w) {
  if (w->n_tensors < 2) return TSR_OK;
  const struct wtensor **v = malloc(w->n_tensors * sizeof *v);
  if (!v) return tsr_error_set(TSR_ERR_NOMEM, "gguf writer: out of memory");
  for (size_t i = 0; i < w->n_tensors; i++) v[i] = &w->tensors[i];
  qsort(v, w->n_tensors, sizeof *v, cmp_name);
  tsr_status st = TSR_OK;
  for (size_t i = 1; i < w->n_tensors && !st; i++)
    if (strcmp(v[i - 1]->name, v[i]->name) == 0)
      st = tsr_error_set(TSR_ERR_INVALID_ARG, "gguf writer: duplicate tensor name '%s'",
                         v[i]->name);
  free(v);
  return st;
}

struct out {
  FILE *f;
  const char *path;
  uint64_t pos;
  int failed;          /* errno of a failed write or seek */
  tsr_status gen_st;   /* a row producer's error (its message stands) */
  unsigned char *block; /* the one buffer streamed tensors are produced in */
};

static void emit(struct out *o, const void *p, size_t n) {
  if (o->failed || o->gen_st || n == 0) return;
  if (fwrite(p, 1, n, o->f) != n) o->failed = errno ? errno : EIO;
  o->pos += n;
}

static void emit_u32(struct out *o, uint32_t v) { emit(o, &v, 4); }
static void emit_u64(struct out *o, uint64_t v) { emit(o, &v, 8); }

static void emit_zeros(struct out *o, uint64_t n) {
  static const unsigned char zeros[4096];
  while (n > 0) {
    size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
    emit(o, zeros, k);
    n -= k;
  }
}

/* Zeros of a tensor without data: a hole when large (the file reads the same
** and a shape-only model takes no disk); the caller truncates to the final
** size, so a hole at the end still counts. */
static void emit_hole(struct out *o, uint64_t n) {
  if (n < (64u << 10) || o->failed || o->gen_st) {
    emit_zeros(o, n);
    return;
  }
  if (fflush(o->f) != 0 || fseeko(o->f, (off_t)n, SEEK_CUR) != 0) {
    o->failed = errno ? errno : EIO;
    return;
  }
  o->pos += n;
}

static void emit_pad(struct out *o, uint32_t align) {
  emit_zeros(o, (align - o->pos % align) % align);
}

static int64_t rows_of(const struct wtensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }

/* Whole rows per produced block: as many as fit in TSR_GGUF_STREAM_BLOCK, at least one. */
static int64_t block_rows(const struct wtensor *t) {
  size_t row = t->nbytes / (size_t)rows_of(t);
  int64_t k = row ? (int64_t)(TSR_GGUF_STREAM_BLOCK / row) : 1;
  if (k < 1) k = 1;
  return k < rows_of(t) ? k : rows_of(t);
}

static void emit_rows(struct out *o, const struct wtensor *t) {
  const int64_t n = rows_of(t), k = block_rows(t);
  const size_t row = t->nbytes / (size_t)n;
  for (int64_t r = 0; r < n && !o->failed && !o->gen_st; r += k) {
    int64_t m = n - r < k ? n - r : k;
    o->gen_st = t->fn(t->fn_ctx, r, m, o->block);
    if (o->gen_st) tsr_error_prefix("tensor '%s', rows %lld..%lld", t->name, (long long)r,
                                    (long long)(r + m - 1));
    emit(o, o->block, (size_t)m * row);
  }
}

static void emit_header(struct out *o, const struct tsr_gguf_writer *w) {
  emit(o, TSR_GGUF_MAGIC, 4);
  emit_u32(o, TSR_GGUF_VERSION);
  emit_u64(o, w->n_tensors);
  emit_u64(o, w->n_kv);
  for (size_t i = 0; i < w->n_kv; i++) {
    size_t len = strlen(w->kv[i].key);
    emit_u64(o, len);
    emit(o, w->kv[i].key, len);
    emit_u32(o, w->kv[i].type);
    emit(o, w->kv[i].val, w->kv[i].val_len);
  }
  for (size_t i = 0; i < w->n_tensors; i++) {
    const struct wtensor *t = &w->tensors[i];
    size_t len = strlen(t->name);
    emit_u64(o, len);
    emit(o, t->name, len);
    emit_u32(o, t->n_dims);
    for (uint32_t d = 0; d < t->n_dims; d++) emit_u64(o, (uint64_t)t->ne[d]);
    emit_u32(o, (uint32_t)t->dtype);
    emit_u64(o, t->offset);
  }
  emit_pad(o, w->alignment);
}

static void emit_file(struct out *o, const struct tsr_gguf_writer *w) {
  emit_header(o, w);
  for (size_t i = 0; i < w->n_tensors; i++) {
    const struct wtensor *t = &w->tensors[i];
    if (t->data) emit(o, t->data, t->nbytes);
    else if (t->fn) emit_rows(o, t);
    else emit_hole(o, t->nbytes);
    emit_pad(o, w->alignment);
  }
}

static uint64_t pad_to(uint64_t n, uint32_t align) { return n + (align - n % align) % align; }

/* Every tensor's offset in the data section; *data_bytes its padded size. */
static tsr_status assign_offsets(struct tsr_gguf_writer *w, uint64_t *data_bytes) {
  uint64_t off = 0;
  for (size_t i = 0; i < w->n_tensors; i++) {
    w->tensors[i].offset = off;
    if (__builtin_add_overflow(off, (uint64_t)w->tensors[i].nbytes, &off) ||
        off > UINT64_MAX - w->alignment || off > SIZE_MAX)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "gguf writer: tensor data exceeds the address "
                           "space");
    off = pad_to(off, w->alignment);
  }
  *data_bytes = off;
  return TSR_OK;
}

static uint64_t header_bytes(const struct tsr_gguf_writer *w) {
  uint64_t n = 4 + 4 + 8 + 8;
  for (size_t i = 0; i < w->n_kv; i++) n += 8 + strlen(w->kv[i].key) + 4 + w->kv[i].val_len;
  for (size_t i = 0; i < w->n_tensors; i++)
    n += 8 + strlen(w->tensors[i].name) + 4 + 8 * (uint64_t)w->tensors[i].n_dims + 4 + 8;
  return pad_to(n, w->alignment);
}

tsr_status tsr_gguf_writer_file_size(const struct tsr_gguf_writer *w, uint64_t *out) {
  uint64_t data = 0;
  for (size_t i = 0; i < w->n_tensors; i++) {
    if (__builtin_add_overflow(data, (uint64_t)w->tensors[i].nbytes, &data) ||
        data > UINT64_MAX - w->alignment)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "gguf writer: tensor data exceeds 64 bits");
    data = pad_to(data, w->alignment);
  }
  *out = header_bytes(w) + data;
  return TSR_OK;
}

static void fsync_dir_of(const char *path) {
  char *dir = strdup(path);
  if (!dir) return;
  char *slash = strrchr(dir, '/');
  const char *d = ".";
  if (slash == dir) d = "/";
  else if (slash) {
    *slash = '\0';
    d = dir;
  }
  int fd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd); /* best effort: some filesystems refuse fsync on directories */
    close(fd);
  }
  free(dir);
}

tsr_status tsr_gguf_writer_write(struct tsr_gguf_writer *w, const char *path) {
  tsr_status st = check_unique_names(w);
  if (st) return st;
  uint64_t data_bytes;
  if ((st = assign_offsets(w, &data_bytes)) != TSR_OK) {
    tsr_error_prefix("%s", path);
    return st;
  }
  size_t block_bytes = 0;
  for (size_t i = 0; i < w->n_tensors; i++) {
    const struct wtensor *t = &w->tensors[i];
    size_t b = t->fn ? (size_t)block_rows(t) * (t->nbytes / (size_t)rows_of(t)) : 0;
    if (b > block_bytes) block_bytes = b;
  }
  unsigned char *block = NULL;
  if (block_bytes && !(block = malloc(block_bytes)))
    return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory for a %zu-byte row block", path,
                         block_bytes);

  size_t plen = strlen(path);
  char *tmp = malloc(plen + 16);
  if (!tmp) {
    free(block);
    return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory", path);
  }
  memcpy(tmp, path, plen);
  memcpy(tmp + plen, ".tmp-XXXXXX", 12);
  int fd = mkstemp(tmp);
  if (fd < 0) {
    st = tsr_error_set(TSR_ERR_IO, "%s: cannot create temporary file %s: %s", path, tmp,
                       strerror(errno));
    free(tmp);
    free(block);
    return st;
  }
  /* mkstemp makes 0600: keep the mode of the file being replaced, else use
  ** 0644, as a model file is meant to be shared like any other. */
  struct stat old;
  fchmod(fd, stat(path, &old) == 0 ? (old.st_mode & 0777) : 0644);
  struct out o = {.f = fdopen(fd, "wb"), .path = path, .block = block};
  if (!o.f) {
    st = tsr_error_set(TSR_ERR_IO, "%s: fdopen: %s", tmp, strerror(errno));
    close(fd);
    goto fail;
  }
  errno = 0;
  emit_file(&o, w);
  if (!o.failed && !o.gen_st && fflush(o.f) != 0) o.failed = errno ? errno : EIO;
  /* a file that ends in a hole gets its length here */
  if (!o.failed && !o.gen_st && ftruncate(fd, (off_t)o.pos) != 0) o.failed = errno;
  if (!o.failed && !o.gen_st && fsync(fd) != 0) o.failed = errno;
  if (fclose(o.f) != 0 && !o.failed) o.failed = errno ? errno : EIO;
  if (o.gen_st) {
    st = o.gen_st;
    tsr_error_prefix("%s", path);
    goto fail;
  }
  if (o.failed) {
    st = tsr_error_set(TSR_ERR_IO, "%s: writing %s failed: %s", path, tmp, strerror(o.failed));
    goto fail;
  }
  if (rename(tmp, path) != 0) {
    st = tsr_error_set(TSR_ERR_IO, "%s: cannot rename %s into place: %s", path, tmp,
                       strerror(errno));
    goto fail;
  }
  fsync_dir_of(path);
  free(tmp);
  free(block);
  return TSR_OK;
fail:
  unlink(tmp);
  free(tmp);
  free(block);
  return st;
}
