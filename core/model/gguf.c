/*
** GGUF reader: parse and validate everything at open, so the accessors below
** never need to check bounds again.
**
** Layout (all little-endian): "GGUF", u32 version, u64 n_tensors, u64 n_kv;
** n_kv pairs of {string key, u32 type, value}; n_tensors infos of {string
** name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset}; padding to the
** alignment; the data section. A string is {u64 len, len bytes}; an array is
** {u32 elem_type, u64 n, n values}.
**
** Allocations are bounded by the input size: every count is checked against
** the bytes left before anything is allocated for it.
*/
#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/file.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader assumes a little-endian host"
#endif

/* Smallest encodings, used to bound counts before allocating: a pair is a key
** (8-byte length + at least 1 byte), a type and a 1-byte value; a tensor info
** is a name (8 + 1), n_dims, one dim, a type and an offset. */
#define MIN_KV_BYTES (8 + 1 + 4 + 1)
#define MIN_TENSOR_BYTES (8 + 1 + 4 + 8 + 4 + 8)

/* ---- arena: owned copies of strings and string-array descriptors ------- */

struct chunk {
  struct chunk *next;
  size_t used, cap;
  _Alignas(16) unsigned char mem[];
};

static void *arena_alloc(struct chunk **head, size_t n) {
  size_t need;
  if (!tsr_size_add(n, 15, &need)) return NULL;
  need &= ~(size_t)15;
  struct chunk *c = *head;
  if (!c || c->cap - c->used < need) {
    size_t cap = need > 65536 ? need : 65536, total;
    if (!tsr_size_add(sizeof *c, cap, &total)) return NULL;
    c = malloc(total);
    if (!c) return NULL;
    c->next = *head;
    c->used = 0;
    c->cap = cap;
    *head = c;
  }
  void *p = c->mem + c->used;
  c->used += need;
  return p;
}

static void arena_free(struct chunk *c) {
  while (c) {
    struct chunk *next = c->next;
    free(c);
    c = next;
  }
}

/* ---- the handle --------------------------------------------------------- */

struct tsr_gguf {
  char *path;
  const uint8_t *base;
  size_t size;
  int mapped;
  uint32_t version, alignment;
  uint64_t data_offset;
  int64_t n_kv, n_tensors;
  struct tsr_gguf_kv *kv;
  struct tsr_gguf_tensor *tensors;
  struct tsr_gguf_kv **kv_by_key;          /* sorted by key, for lookup */
  struct tsr_gguf_tensor **tensor_by_name; /* sorted by name */
  struct chunk *arena;
};

static const char *const g_type_names[TSR_GGUF_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};
static const size_t g_type_sizes[TSR_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *tsr_gguf_type_name(enum tsr_gguf_type t) {
  return (unsigned)t < TSR_GGUF_TYPE_COUNT ? g_type_names[t] : "invalid";
}

size_t tsr_gguf_type_size(enum tsr_gguf_type t) {
  return (unsigned)t < TSR_GGUF_TYPE_COUNT ? g_type_sizes[t] : 0;
}

static int type_is_int(enum tsr_gguf_type t) {
  return t == TSR_GGUF_U8 || t == TSR_GGUF_I8 || t == TSR_GGUF_U16 || t == TSR_GGUF_I16 ||
         t == TSR_GGUF_U32 || t == TSR_GGUF_I32 || t == TSR_GGUF_U64 || t == TSR_GGUF_I64;
}

static int type_is_signed(enum tsr_gguf_type t) {
  return t == TSR_GGUF_I8 || t == TSR_GGUF_I16 || t == TSR_GGUF_I32 || t == TSR_GGUF_I64;
}

/* Printable form of an untrusted name for messages: non-printing bytes as
** \xNN, cut at about 80 characters. */
static const char *esc(const char *s, size_t len, char buf[128]) {
  size_t o = 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (o > 100) {
      memcpy(buf + o, "...", 4);
      return buf;
    }
    if (ch >= 0x20 && ch < 0x7f && ch != '\'' && ch != '\\') {
      buf[o++] = (char)ch;
    } else {
      snprintf(buf + o, 5, "\\x%02x", ch);
      o += 4;
    }
  }
  buf[o] = '\0';
  return buf;
}

/* ---- parsing ------------------------------------------------------------ */

struct parser {
  struct tsr_gguf *g;
  size_t pos;
  char where[200]; /* what is being read, e.g. "key 'general.name'" */
};

static tsr_status truncated(struct parser *p, const char *field, uint64_t need) {
  return tsr_error_set(TSR_ERR_FORMAT,
                       "%s: truncated: %s of %s needs %llu bytes at byte %zu, but the file "
                       "ends at byte %zu",
                       p->g->path, field, p->where, (unsigned long long)need, p->pos,
                       p->g->size);
}

static tsr_status rd_bytes(struct parser *p, void *dst, size_t n, const char *field) {
  if (p->g->size - p->pos < n) return truncated(p, field, n);
  memcpy(dst, p->g->base + p->pos, n);
  p->pos += n;
  return TSR_OK;
}

static tsr_status rd_u32(struct parser *p, uint32_t *v, const char *field) {
  return rd_bytes(p, v, 4, field);
}

static tsr_status rd_u64(struct parser *p, uint64_t *v, const char *field) {
  return rd_bytes(p, v, 8, field);
}

static size_t remaining(const struct parser *p) { return p->g->size - p->pos; }

/* A string: length checked against the bytes left, copied NUL-terminated. */
static tsr_status rd_str(struct parser *p, struct tsr_gguf_str *out, const char *field) {
  uint64_t len = 0;
  size_t at = p->pos;
  tsr_status st = rd_u64(p, &len, field);
  if (st) return st;
  if (len > remaining(p))
    return tsr_error_set(TSR_ERR_FORMAT,
                         "%s: %s of %s at byte %zu: length %llu exceeds the %zu bytes left "
                         "in the file",
                         p->g->path, field, p->where, at, (unsigned long long)len,
                         remaining(p));
  char *copy = arena_alloc(&p->g->arena, (size_t)len + 1);
  if (!copy) return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory", p->g->path);
  memcpy(copy, p->g->base + p->pos, (size_t)len);
  copy[len] = '\0';
  p->pos += (size_t)len;
  out->ptr = copy;
  out->len = len;
  return TSR_OK;
}

/* Keys and tensor names are C strings: not empty, no NUL inside. */
static tsr_status check_name(struct parser *p, const struct tsr_gguf_str *s, const char *what,
                             size_t at) {
  char b[128];
  if (s->len == 0)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: %s at byte %zu: empty %s", p->g->path, p->where,
                         at, what);
  if (memchr(s->ptr, '\0', (size_t)s->len))
    return tsr_error_set(TSR_ERR_FORMAT, "%s: %s at byte %zu: %s '%s' contains a NUL byte",
                         p->g->path, p->where, at, what, esc(s->ptr, (size_t)s->len, b));
  return TSR_OK;
}

static void load_scalar(enum tsr_gguf_type t, const uint8_t *src, struct tsr_gguf_kv *kv) {
  uint8_t u8;
  uint16_t u16;
  uint32_t u32;
  uint64_t u64;
  float f32;
  switch (t) {
  case TSR_GGUF_U8: memcpy(&u8, src, 1); kv->v.u = u8; break;
  case TSR_GGUF_I8: memcpy(&u8, src, 1); kv->v.i = (int8_t)u8; break;
  case TSR_GGUF_U16: memcpy(&u16, src, 2); kv->v.u = u16; break;
  case TSR_GGUF_I16: memcpy(&u16, src, 2); kv->v.i = (int16_t)u16; break;
  case TSR_GGUF_U32: memcpy(&u32, src, 4); kv->v.u = u32; break;
  case TSR_GGUF_I32: memcpy(&u32, src, 4); kv->v.i = (int32_t)u32; break;
  case TSR_GGUF_U64: memcpy(&u64, src, 8); kv->v.u = u64; break;
  case TSR_GGUF_I64: memcpy(&u64, src, 8); kv->v.i = (int64_t)u64; break;
  case TSR_GGUF_F32: memcpy(&f32, src, 4); kv->v.f = f32; break;
  case TSR_GGUF_F64: memcpy(&kv->v.f, src, 8); break;
  case TSR_GGUF_BOOL: memcpy(&u8, src, 1); kv->v.b = u8; break;
  default: break;
  }
}

static tsr_status parse_array(struct parser *p, struct tsr_gguf_kv *kv) {
  uint32_t et = 0;
  uint64_t n = 0;
  size_t at = p->pos;
  tsr_status st = rd_u32(p, &et, "array element type");
  if (!st) st = rd_u64(p, &n, "array length");
  if (st) return st;
  if (et == TSR_GGUF_ARRAY)
    return tsr_error_set(TSR_ERR_FORMAT,
                         "%s: %s at byte %zu: array of arrays (nested arrays are not supported)",
                         p->g->path, p->where, at);
  if (et >= TSR_GGUF_TYPE_COUNT)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: %s at byte %zu: invalid array element type %u",
                         p->g->path, p->where, at, et);
  kv->elem_type = (enum tsr_gguf_type)et;
  kv->n = n;
  size_t esize = g_type_sizes[et];
  size_t min_each = esize ? esize : 8; /* a string is at least its length */
  if (n > remaining(p) / min_each)
    return tsr_error_set(TSR_ERR_FORMAT,
                         "%s: %s at byte %zu: array of %llu %s elements needs at least %llu "
                         "bytes per element but only %zu bytes are left in the file",
                         p->g->path, p->where, at, (unsigned long long)n, g_type_names[et],
                         (unsigned long long)min_each, remaining(p));
  if (esize) {
    kv->data = p->g->base + p->pos;
    if (et == TSR_GGUF_BOOL)
      for (uint64_t i = 0; i < n; i++)
        if (p->g->base[p->pos + i] > 1)
          return tsr_error_set(TSR_ERR_FORMAT,
                               "%s: %s: bool element %llu at byte %zu is %u, not 0 or 1",
                               p->g->path, p->where, (unsigned long long)i, p->pos + (size_t)i,
                               p->g->base[p->pos + i]);
    p->pos += (size_t)n * esize; /* n * esize <= remaining: checked above */
    return TSR_OK;
  }
  size_t bytes;
  if (!tsr_size_mul((size_t)n, sizeof(struct tsr_gguf_str), &bytes))
    return tsr_error_set(TSR_ERR_NOMEM, "%s: %s: array too large", p->g->path, p->where);
  struct tsr_gguf_str *strs = arena_alloc(&p->g->arena, bytes ? bytes : 1);
  if (!strs) return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory", p->g->path);
  for (uint64_t i = 0; i < n; i++)
    if ((st = rd_str(p, &strs[i], "array string"))) return st;
  kv->strs = strs;
  return TSR_OK;
}

static tsr_status parse_kv(struct parser *p, int64_t idx) {
  struct tsr_gguf *g = p->g;
  struct tsr_gguf_kv *kv = &g->kv[idx];
  char b[128];
  struct tsr_gguf_str key;
  size_t at = p->pos;
  tsr_status st;

  kv->file_offset = at;
  snprintf(p->where, sizeof p->where, "kv #%lld", (long long)idx);
  if ((st = rd_str(p, &key, "key"))) return st;
  if ((st = check_name(p, &key, "key", at))) return st;
  kv->key = key.ptr;
  snprintf(p->where, sizeof p->where, "key '%s'", esc(key.ptr, (size_t)key.len, b));

  uint32_t type = 0;
  size_t type_at = p->pos;
  if ((st = rd_u32(p, &type, "value type"))) return st;
  if (type >= TSR_GGUF_TYPE_COUNT)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: %s: invalid value type %u at byte %zu", g->path,
                         p->where, type, type_at);
  kv->type = (enum tsr_gguf_type)type;
  if (type == TSR_GGUF_STRING) return rd_str(p, &kv->v.s, "string value");
  if (type == TSR_GGUF_ARRAY) return parse_array(p, kv);

  uint8_t raw[8];
  size_t val_at = p->pos;
  if ((st = rd_bytes(p, raw, g_type_sizes[type], "value"))) return st;
  load_scalar(kv->type, raw, kv);
  if (type == TSR_GGUF_BOOL && raw[0] > 1)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: %s: bool value at byte %zu is %u, not 0 or 1",
                         g->path, p->where, val_at, raw[0]);
  return TSR_OK;
}

static tsr_status parse_tensor_info(struct parser *p, int64_t idx) {
  struct tsr_gguf *g = p->g;
  struct tsr_gguf_tensor *t = &g->tensors[idx];
  char b[128];
  struct tsr_gguf_str name;
  size_t at = p->pos;
  tsr_status st;

  snprintf(p->where, sizeof p->where, "tensor #%lld", (long long)idx);
  if ((st = rd_str(p, &name, "tensor name"))) return st;
  if ((st = check_name(p, &name, "tensor name", at))) return st;
  if (name.len >= TSR_GGUF_MAX_NAME)
    return tsr_error_set(TSR_ERR_FORMAT,
                         "%s: tensor #%lld at byte %zu: name '%s' is %llu bytes; names must be "
                         "shorter than %d bytes",
                         g->path, (long long)idx, at, esc(name.ptr, (size_t)name.len, b),
                         (unsigned long long)name.len, TSR_GGUF_MAX_NAME);
  t->name = name.ptr;
  snprintf(p->where, sizeof p->where, "tensor '%s'", esc(name.ptr, (size_t)name.len, b));

  uint32_t n_dims = 0;
  size_t dims_at = p->pos;
  if ((st = rd_u32(p, &n_dims, "n_dims"))) return st;
  if (n_dims == 0 || n_dims > TSR_GGUF_MAX_DIMS)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: %s: n_dims is %u at byte %zu; must be 1 to %d",
                         g->path, p->where, n_dims, dims_at, TSR_GGUF_MAX_DIMS);
  t->n_dims = n_dims;
  for (int d = 0; d < TSR_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
  int64_t n_el = 1;
  for (uint32_t d = 0; d < n_dims; d++) {
    uint64_t ne = 0;
    size_t ne_at = p->pos;
    if ((st = rd_u64(p, &ne, "dimension"))) return st;
    if (ne == 0 || ne > (uint64_t)INT64_MAX)
      return tsr_error_set(TSR_ERR_FORMAT,
                           "%s: %s: dimension %u at byte %zu is %llu%s; dims must be in "
                           "[1, 2^63)",
                           g->path, p->where, d, ne_at, (unsigned long long)ne,
                           ne ? " (negative as int64)" : "");
    t->ne[d] = (int64_t)ne;
    if (__builtin_mul_overflow(n_el, (int64_t)ne, &n_el))
      return tsr_error_set(TSR_ERR_FORMAT,
                           "%s: %s: element count overflows at dimension %u (byte %zu)",
                           g->path, p->where, d, ne_at);
  }
  t->n_elements = n_el;

  uint32_t type = 0;
  size_t type_at = p->pos;
  if ((st = rd_u32(p, &type, "tensor type"))) return st;
  const struct tsr_dtype_traits *tr = type < TSR_DTYPE_COUNT ? tsr_dtype_traits((int)type) : NULL;
  if (!tr)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: %s: unknown tensor type id %u at byte %zu",
                         g->path, p->where, type, type_at);
  t->dtype = (enum tsr_dtype)type;
  if (t->ne[0] % tr->block_size)
    return tsr_error_set(TSR_ERR_FORMAT,
                         "%s: %s: ne[0] = %lld is not a multiple of %s's block size %lld",
                         g->path, p->where, (long long)t->ne[0], tr->name,
                         (long long)tr->block_size);
  size_t bytes = 0;
  int ok = tsr_size_mul((size_t)(t->ne[0] / tr->block_size), tr->type_size, &bytes);
  for (int d = 1; d < TSR_GGUF_MAX_DIMS && ok; d++)
    ok = tsr_size_mul(bytes, (size_t)t->ne[d], &bytes);
  if (!ok)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: %s: byte size overflows (%lld elements of %s)",
                         g->path, p->where, (long long)n_el, tr->name);
  t->nbytes = bytes;
  return rd_u64(p, &t->offset, "tensor data offset");
}

/* ---- whole-file checks -------------------------------------------------- */

/* Lookup tables hold pointers, so the comparators need no context. */
static int cmp_kv(const void *a, const void *b) {
  return strcmp((*(const struct tsr_gguf_kv *const *)a)->key,
                (*(const struct tsr_gguf_kv *const *)b)->key);
}
static int cmp_tensor_name(const void *a, const void *b) {
  return strcmp((*(const struct tsr_gguf_tensor *const *)a)->name,
                (*(const struct tsr_gguf_tensor *const *)b)->name);
}
static int cmp_tensor_offset(const void *a, const void *b) {
  uint64_t x = (*(const struct tsr_gguf_tensor *const *)a)->file_offset;
  uint64_t y = (*(const struct tsr_gguf_tensor *const *)b)->file_offset;
  return x < y ? -1 : x > y;
}

static tsr_status check_duplicate_keys(struct tsr_gguf *g) {
  char b[128];
  for (int64_t i = 0; i < g->n_kv; i++) g->kv_by_key[i] = &g->kv[i];
  qsort(g->kv_by_key, (size_t)g->n_kv, sizeof *g->kv_by_key, cmp_kv);
  for (int64_t i = 1; i < g->n_kv; i++) {
    const struct tsr_gguf_kv *x = g->kv_by_key[i - 1], *y = g->kv_by_key[i];
    if (strcmp(x->key, y->key) == 0) {
      if (x > y) {
        const struct tsr_gguf_kv *tmp = x;
        x = y;
        y = tmp;
      }
      return tsr_error_set(TSR_ERR_FORMAT, "%s: duplicate key '%s' at bytes %llu and %llu",
                           g->path, esc(x->key, strlen(x->key), b),
                           (unsigned long long)x->file_offset, (unsigned long long)y->file_offset);
    }
  }
  return TSR_OK;
}

static tsr_status read_alignment(struct tsr_gguf *g) {
  g->alignment = TSR_GGUF_DEFAULT_ALIGNMENT;
  int64_t i = tsr_gguf_find_key(g, "general.alignment");
  if (i < 0) return TSR_OK;
  const struct tsr_gguf_kv *kv = &g->kv[i];
  if (kv->type != TSR_GGUF_U32)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: key 'general.alignment' at byte %llu is %s; it "
                         "must be u32",
                         g->path, (unsigned long long)kv->file_offset, tsr_gguf_type_name(kv->type));
  uint64_t a = kv->v.u;
  if (a == 0 || (a & (a - 1)) || a > TSR_GGUF_MAX_ALIGNMENT)
    return tsr_error_set(TSR_ERR_FORMAT,
                         "%s: key 'general.alignment' at byte %llu is %llu; it must be a power "
                         "of two from 1 to %u",
                         g->path, (unsigned long long)kv->file_offset, (unsigned long long)a,
                         TSR_GGUF_MAX_ALIGNMENT);
  g->alignment = (uint32_t)a;
  return TSR_OK;
}

static tsr_status check_tensor_names(struct tsr_gguf *g) {
  char b[128];
  for (int64_t i = 0; i < g->n_tensors; i++) g->tensor_by_name[i] = &g->tensors[i];
  qsort(g->tensor_by_name, (size_t)g->n_tensors, sizeof *g->tensor_by_name, cmp_tensor_name);
  for (int64_t i = 1; i < g->n_tensors; i++) {
    long long x = g->tensor_by_name[i - 1] - g->tensors, y = g->tensor_by_name[i] - g->tensors;
    if (strcmp(g->tensors[x].name, g->tensors[y].name) == 0)
      return tsr_error_set(TSR_ERR_FORMAT, "%s: duplicate tensor name '%s' (tensors #%lld and "
                           "#%lld)",
                           g->path, esc(g->tensors[x].name, strlen(g->tensors[x].name), b),
                           x < y ? x : y, x < y ? y : x);
  }
  return TSR_OK;
}

/* Offsets aligned, data inside the file, no two tensors sharing bytes. */
static tsr_status check_tensor_data(struct tsr_gguf *g) {
  char b[128], b2[128];
  for (int64_t i = 0; i < g->n_tensors; i++) {
    struct tsr_gguf_tensor *t = &g->tensors[i];
    const char *nm = esc(t->name, strlen(t->name), b);
    if (t->offset % g->alignment)
      return tsr_error_set(TSR_ERR_FORMAT,
                           "%s: tensor '%s': data offset %llu is not a multiple of the "
                           "alignment %u",
                           g->path, nm, (unsigned long long)t->offset, g->alignment);
    uint64_t start, end;
    if (__builtin_add_overflow(g->data_offset, t->offset, &start) ||
        __builtin_add_overflow(start, (uint64_t)t->nbytes, &end))
      return tsr_error_set(TSR_ERR_FORMAT,
                           "%s: tensor '%s': data offset %llu + %zu bytes overflows; the file "
                           "has %zu bytes",
                           g->path, nm, (unsigned long long)t->offset, t->nbytes, g->size);
    if (end > g->size)
      return tsr_error_set(TSR_ERR_FORMAT,
                           "%s: tensor '%s': data [%llu, %llu) extends past end of file "
                           "(%zu bytes)",
                           g->path, nm, (unsigned long long)start, (unsigned long long)end,
                           g->size);
    t->file_offset = start;
    t->data = g->base + start;
  }
  const struct tsr_gguf_tensor **order =
      malloc((size_t)(g->n_tensors ? g->n_tensors : 1) * sizeof *order);
  if (!order) return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory", g->path);
  for (int64_t i = 0; i < g->n_tensors; i++) order[i] = &g->tensors[i];
  qsort(order, (size_t)g->n_tensors, sizeof *order, cmp_tensor_offset);
  tsr_status st = TSR_OK;
  for (int64_t i = 1; i < g->n_tensors; i++) {
    const struct tsr_gguf_tensor *x = order[i - 1], *y = order[i];
    if (y->file_offset < x->file_offset + x->nbytes) {
      st = tsr_error_set(TSR_ERR_FORMAT,
                         "%s: tensor '%s' data [%llu, %llu) overlaps tensor '%s' data "
                         "[%llu, %llu)",
                         g->path, esc(y->name, strlen(y->name), b),
                         (unsigned long long)y->file_offset,
                         (unsigned long long)(y->file_offset + y->nbytes),
                         esc(x->name, strlen(x->name), b2), (unsigned long long)x->file_offset,
                         (unsigned long long)(x->file_offset + x->nbytes));
      break;
    }
  }
  free(order);
  return st;
}

static tsr_status check_version(struct tsr_gguf *g, uint32_t v) {
  uint32_t swapped = __builtin_bswap32(v);
  if (v == 2 || v == 3) return TSR_OK;
  if (v == 1)
    return tsr_error_set(TSR_ERR_UNSUPPORTED,
                         "%s: GGUF version 1 is not supported (only versions 2 and 3 are); "
                         "convert the file again with a current tool",
                         g->path);
  if (swapped >= 1 && swapped <= 3)
    return tsr_error_set(TSR_ERR_UNSUPPORTED,
                         "%s: version field is 0x%08x, which is version %u byte-swapped: a "
                         "big-endian GGUF file, which tessera does not read",
                         g->path, v, swapped);
  if (v == 0)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: invalid GGUF version 0", g->path);
  return tsr_error_set(TSR_ERR_UNSUPPORTED,
                       "%s: GGUF version %u is not supported (only versions 2 and 3 are)",
                       g->path, v);
}

static tsr_status parse(struct tsr_gguf *g) {
  struct parser p = {.g = g, .pos = 0};
  tsr_status st;
  char magic[4];
  uint32_t version = 0;
  uint64_t n_tensors = 0, n_kv = 0;

  snprintf(p.where, sizeof p.where, "the header");
  if ((st = rd_bytes(&p, magic, 4, "magic"))) return st;
  if (memcmp(magic, TSR_GGUF_MAGIC, 4) != 0) {
    char b[128];
    return tsr_error_set(TSR_ERR_FORMAT, "%s: bad magic '%s' at byte 0, expected 'GGUF': not "
                         "a GGUF file",
                         g->path, esc(magic, 4, b));
  }
  if ((st = rd_u32(&p, &version, "version"))) return st;
  if ((st = check_version(g, version))) return st;
  g->version = version;
  if ((st = rd_u64(&p, &n_tensors, "tensor count"))) return st;
  if ((st = rd_u64(&p, &n_kv, "kv count"))) return st;

  /* Both counts together must fit in what is left; this bounds every
  ** allocation below by the file size. */
  size_t left = remaining(&p);
  if (n_kv > left / MIN_KV_BYTES || n_tensors > left / MIN_TENSOR_BYTES ||
      n_kv * MIN_KV_BYTES + n_tensors * MIN_TENSOR_BYTES > left)
    return tsr_error_set(TSR_ERR_FORMAT,
                         "%s: header claims %llu kv pairs and %llu tensors (bytes 8-23), more "
                         "than the %zu bytes after the header can hold",
                         g->path, (unsigned long long)n_kv, (unsigned long long)n_tensors, left);
  g->n_kv = (int64_t)n_kv;
  g->n_tensors = (int64_t)n_tensors;
  g->kv = calloc((size_t)n_kv + 1, sizeof *g->kv);
  g->kv_by_key = calloc((size_t)n_kv + 1, sizeof *g->kv_by_key);
  g->tensors = calloc((size_t)n_tensors + 1, sizeof *g->tensors);
  g->tensor_by_name = calloc((size_t)n_tensors + 1, sizeof *g->tensor_by_name);
  if (!g->kv || !g->kv_by_key || !g->tensors || !g->tensor_by_name)
    return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory", g->path);

  for (int64_t i = 0; i < g->n_kv; i++)
    if ((st = parse_kv(&p, i))) return st;
  if ((st = check_duplicate_keys(g))) return st;
  if ((st = read_alignment(g))) return st;

  for (int64_t i = 0; i < g->n_tensors; i++)
    if ((st = parse_tensor_info(&p, i))) return st;
  if ((st = check_tensor_names(g))) return st;

  /* pos <= size and alignment <= 1 MiB, so this cannot wrap. */
  g->data_offset = (p.pos + g->alignment - 1) / g->alignment * (uint64_t)g->alignment;
  return check_tensor_data(g);
}

static tsr_status open_common(struct tsr_gguf *g, const char *name, struct tsr_gguf **out) {
  g->path = strdup(name);
  if (!g->path) {
    tsr_gguf_close(g);
    return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory", name);
  }
  tsr_status st = parse(g);
  if (st) {
    tsr_gguf_close(g);
    return st;
  }
  *out = g;
  return TSR_OK;
}

tsr_status tsr_gguf_open_memory(const void *data, size_t size, const char *name,
                                struct tsr_gguf **out) {
  *out = NULL;
  if (!data && size)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "tsr_gguf_open_memory: NULL data of %zu bytes",
                         size);
  struct tsr_gguf *g = calloc(1, sizeof *g);
  if (!g) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  g->base = data;
  g->size = size;
  return open_common(g, name ? name : "<memory>", out);
}

tsr_status tsr_gguf_open(const char *path, struct tsr_gguf **out) {
  *out = NULL;
  int fd;
  tsr_status fst = tsr_file_open(path, &fd);
  if (fst != TSR_OK) return fst;
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    int e = errno;
    close(fd);
    return tsr_error_set(TSR_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
  }
  if ((uint64_t)sb.st_size > SIZE_MAX) {
    close(fd);
    return tsr_error_set(TSR_ERR_IO, "%s: file too large to map", path);
  }
  struct tsr_gguf *g = calloc(1, sizeof *g);
  if (!g) {
    close(fd);
    return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  }
  g->size = (size_t)sb.st_size;
  if (g->size > 0) { /* mmap of 0 bytes fails; an empty file is simply truncated */
    void *m = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      int e = errno;
      close(fd);
      free(g);
      return tsr_error_set(TSR_ERR_IO, "%s: cannot map %zu bytes: %s", path, (size_t)sb.st_size,
                           strerror(e));
    }
    g->base = m;
    g->mapped = 1;
  }
  close(fd);
  return open_common(g, path, out);
}

void tsr_gguf_close(struct tsr_gguf *g) {
  if (!g) return;
  if (g->mapped) munmap((void *)g->base, g->size);
  arena_free(g->arena);
  free(g->kv);
  free(g->kv_by_key);
  free(g->tensors);
  free(g->tensor_by_name);
  free(g->path);
  free(g);
}

/* ---- accessors ---------------------------------------------------------- */

const char *tsr_gguf_path(const struct tsr_gguf *g) { return g->path; }
uint32_t tsr_gguf_version(const struct tsr_gguf *g) { return g->version; }
uint32_t tsr_gguf_alignment(const struct tsr_gguf *g) { return g->alignment; }
uint64_t tsr_gguf_data_offset(const struct tsr_gguf *g) { return g->data_offset; }
uint64_t tsr_gguf_file_size(const struct tsr_gguf *g) { return g->size; }
int64_t tsr_gguf_n_kv(const struct tsr_gguf *g) { return g->n_kv; }
int64_t tsr_gguf_n_tensors(const struct tsr_gguf *g) { return g->n_tensors; }

const struct tsr_gguf_kv *tsr_gguf_kv_at(const struct tsr_gguf *g, int64_t i) {
  return i >= 0 && i < g->n_kv ? &g->kv[i] : NULL;
}

const struct tsr_gguf_tensor *tsr_gguf_tensor_at(const struct tsr_gguf *g, int64_t i) {
  return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

int64_t tsr_gguf_find_key(const struct tsr_gguf *g, const char *key) {
  int64_t lo = 0, hi = g->n_kv;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    int c = strcmp(g->kv_by_key[mid]->key, key);
    if (c == 0) return g->kv_by_key[mid] - g->kv;
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return -1;
}

const struct tsr_gguf_tensor *tsr_gguf_find_tensor(const struct tsr_gguf *g, const char *name) {
  int64_t lo = 0, hi = g->n_tensors;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    const struct tsr_gguf_tensor *t = g->tensor_by_name[mid];
    int c = strcmp(t->name, name);
    if (c == 0) return t;
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return NULL;
}

/* ---- typed getters ------------------------------------------------------ */

static tsr_status lookup(const struct tsr_gguf *g, const char *key,
                         const struct tsr_gguf_kv **out) {
  int64_t i = tsr_gguf_find_key(g, key);
  if (i < 0) return tsr_error_set(TSR_ERR_FORMAT, "%s: key '%s' not found", g->path, key);
  *out = &g->kv[i];
  return TSR_OK;
}

static tsr_status mismatch(const struct tsr_gguf *g, const struct tsr_gguf_kv *kv,
                           const char *want) {
  if (kv->type == TSR_GGUF_ARRAY)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: key '%s' is array of %s, asked for as %s", g->path,
                         kv->key, tsr_gguf_type_name(kv->elem_type), want);
  return tsr_error_set(TSR_ERR_FORMAT, "%s: key '%s' is %s, asked for as %s", g->path, kv->key,
                       tsr_gguf_type_name(kv->type), want);
}

/* An integer value of type t (from kv->v) into [lo, hi]; "neg" values are
** compared as int64, others as uint64, so no case wraps. */
static tsr_status int_in_range(const struct tsr_gguf *g, const struct tsr_gguf_kv *kv,
                               enum tsr_gguf_type t, const char *elem, int64_t lo, uint64_t hi,
                               const char *want, uint64_t *out) {
  int neg = type_is_signed(t) && kv->v.i < 0;
  int ok = neg ? kv->v.i >= lo : kv->v.u <= hi;
  if (!ok) {
    char val[32];
    if (neg) snprintf(val, sizeof val, "%lld", (long long)kv->v.i);
    else snprintf(val, sizeof val, "%llu", (unsigned long long)kv->v.u);
    return tsr_error_set(TSR_ERR_FORMAT, "%s: key '%s'%s holds %s %s, which does not fit %s",
                         g->path, kv->key, elem, tsr_gguf_type_name(t), val, want);
  }
  *out = kv->v.u; /* two's complement reinterpretation; caller casts back */
  return TSR_OK;
}

static tsr_status get_int(const struct tsr_gguf *g, const char *key, int64_t lo, uint64_t hi,
                          const char *want, uint64_t *out) {
  const struct tsr_gguf_kv *kv = NULL;
  tsr_status st = lookup(g, key, &kv);
  if (st) return st;
  if (!type_is_int(kv->type)) return mismatch(g, kv, want);
  return int_in_range(g, kv, kv->type, "", lo, hi, want, out);
}

tsr_status tsr_gguf_get_u32(const struct tsr_gguf *g, const char *key, uint32_t *out) {
  uint64_t v = 0;
  tsr_status st = get_int(g, key, 0, UINT32_MAX, "u32", &v);
  if (!st) *out = (uint32_t)v;
  return st;
}

tsr_status tsr_gguf_get_i32(const struct tsr_gguf *g, const char *key, int32_t *out) {
  uint64_t v = 0;
  tsr_status st = get_int(g, key, INT32_MIN, INT32_MAX, "i32", &v);
  if (!st) *out = (int32_t)(int64_t)v;
  return st;
}

tsr_status tsr_gguf_get_u64(const struct tsr_gguf *g, const char *key, uint64_t *out) {
  return get_int(g, key, 0, UINT64_MAX, "u64", out);
}

tsr_status tsr_gguf_get_i64(const struct tsr_gguf *g, const char *key, int64_t *out) {
  uint64_t v = 0;
  tsr_status st = get_int(g, key, INT64_MIN, INT64_MAX, "i64", &v);
  if (!st) *out = (int64_t)v;
  return st;
}

tsr_status tsr_gguf_get_f32(const struct tsr_gguf *g, const char *key, float *out) {
  const struct tsr_gguf_kv *kv = NULL;
  tsr_status st = lookup(g, key, &kv);
  if (st) return st;
  if (kv->type != TSR_GGUF_F32) return mismatch(g, kv, "f32");
  *out = (float)kv->v.f;
  return TSR_OK;
}

tsr_status tsr_gguf_get_f64(const struct tsr_gguf *g, const char *key, double *out) {
  const struct tsr_gguf_kv *kv = NULL;
  tsr_status st = lookup(g, key, &kv);
  if (st) return st;
  if (kv->type != TSR_GGUF_F32 && kv->type != TSR_GGUF_F64) return mismatch(g, kv, "f64");
  *out = kv->v.f;
  return TSR_OK;
}

tsr_status tsr_gguf_get_bool(const struct tsr_gguf *g, const char *key, int *out) {
  const struct tsr_gguf_kv *kv = NULL;
  tsr_status st = lookup(g, key, &kv);
  if (st) return st;
  if (kv->type != TSR_GGUF_BOOL) return mismatch(g, kv, "bool");
  *out = kv->v.b;
  return TSR_OK;
}

tsr_status tsr_gguf_get_str(const struct tsr_gguf *g, const char *key, const char **out) {
  const struct tsr_gguf_kv *kv = NULL;
  tsr_status st = lookup(g, key, &kv);
  if (st) return st;
  if (kv->type != TSR_GGUF_STRING) return mismatch(g, kv, "string");
  *out = kv->v.s.ptr;
  return TSR_OK;
}

tsr_status tsr_gguf_get_arr(const struct tsr_gguf *g, const char *key,
                            enum tsr_gguf_type elem_type, const struct tsr_gguf_kv **out) {
  const struct tsr_gguf_kv *kv = NULL;
  tsr_status st = lookup(g, key, &kv);
  if (st) return st;
  if (kv->type != TSR_GGUF_ARRAY)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: key '%s' is %s, asked for as array of %s", g->path,
                         key, tsr_gguf_type_name(kv->type),
                         elem_type == TSR_GGUF_TYPE_COUNT ? "any type"
                                                          : tsr_gguf_type_name(elem_type));
  if (elem_type != TSR_GGUF_TYPE_COUNT && kv->elem_type != elem_type)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: key '%s' is array of %s, asked for as array of %s",
                         g->path, key, tsr_gguf_type_name(kv->elem_type),
                         tsr_gguf_type_name(elem_type));
  *out = kv;
  return TSR_OK;
}

/* Element i decoded into a scalar pair, so the scalar rules apply to it. */
static tsr_status arr_elem(const struct tsr_gguf *g, const struct tsr_gguf_kv *kv, uint64_t i,
                           struct tsr_gguf_kv *elem, char elem_name[48]) {
  if (kv->type != TSR_GGUF_ARRAY)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: key '%s' is %s, not an array", g->path,
                         kv->key, tsr_gguf_type_name(kv->type));
  if (i >= kv->n)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: key '%s': index %llu is past the %llu "
                         "elements",
                         g->path, kv->key, (unsigned long long)i, (unsigned long long)kv->n);
  memset(elem, 0, sizeof *elem);
  elem->key = kv->key;
  elem->type = kv->elem_type;
  if (kv->elem_type == TSR_GGUF_STRING) elem->v.s = kv->strs[i];
  else load_scalar(kv->elem_type, (const uint8_t *)kv->data + i * g_type_sizes[kv->elem_type],
                   elem);
  snprintf(elem_name, 48, " element %llu", (unsigned long long)i);
  return TSR_OK;
}

static tsr_status elem_mismatch(const struct tsr_gguf *g, const struct tsr_gguf_kv *kv,
                                const char *want) {
  return tsr_error_set(TSR_ERR_FORMAT, "%s: key '%s' is array of %s, asked for elements as %s",
                       g->path, kv->key, tsr_gguf_type_name(kv->elem_type), want);
}

tsr_status tsr_gguf_arr_i64(const struct tsr_gguf *g, const struct tsr_gguf_kv *kv, uint64_t i,
                            int64_t *out) {
  struct tsr_gguf_kv e = {0};
  char en[48];
  uint64_t v = 0;
  tsr_status st = arr_elem(g, kv, i, &e, en);
  if (st) return st;
  if (!type_is_int(e.type)) return elem_mismatch(g, kv, "i64");
  if ((st = int_in_range(g, &e, e.type, en, INT64_MIN, INT64_MAX, "i64", &v))) return st;
  *out = (int64_t)v;
  return TSR_OK;
}

tsr_status tsr_gguf_arr_u64(const struct tsr_gguf *g, const struct tsr_gguf_kv *kv, uint64_t i,
                            uint64_t *out) {
  struct tsr_gguf_kv e = {0};
  char en[48];
  tsr_status st = arr_elem(g, kv, i, &e, en);
  if (st) return st;
  if (!type_is_int(e.type)) return elem_mismatch(g, kv, "u64");
  return int_in_range(g, &e, e.type, en, 0, UINT64_MAX, "u64", out);
}

tsr_status tsr_gguf_arr_f64(const struct tsr_gguf *g, const struct tsr_gguf_kv *kv, uint64_t i,
                            double *out) {
  struct tsr_gguf_kv e = {0};
  char en[48];
  tsr_status st = arr_elem(g, kv, i, &e, en);
  if (st) return st;
  if (e.type != TSR_GGUF_F32 && e.type != TSR_GGUF_F64) return elem_mismatch(g, kv, "f64");
  *out = e.v.f;
  return TSR_OK;
}

tsr_status tsr_gguf_arr_f32(const struct tsr_gguf *g, const struct tsr_gguf_kv *kv, uint64_t i,
                            float *out) {
  struct tsr_gguf_kv e = {0};
  char en[48];
  tsr_status st = arr_elem(g, kv, i, &e, en);
  if (st) return st;
  if (e.type != TSR_GGUF_F32) return elem_mismatch(g, kv, "f32");
  *out = (float)e.v.f;
  return TSR_OK;
}

tsr_status tsr_gguf_arr_str(const struct tsr_gguf *g, const struct tsr_gguf_kv *kv, uint64_t i,
                            struct tsr_gguf_str *out) {
  struct tsr_gguf_kv e = {0};
  char en[48];
  tsr_status st = arr_elem(g, kv, i, &e, en);
  if (st) return st;
  if (e.type != TSR_GGUF_STRING) return elem_mismatch(g, kv, "string");
  *out = e.v.s;
  return TSR_OK;
}
