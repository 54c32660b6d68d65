/* Safetensors checkpoints: validated headers (cJSON), data by mmap. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/convert_safetensors.h"
#include "graph/dtype.h"
#include "common/error.h"
#include "common/file.h"
#include "model/json.h"

struct st_file {
  char *path;
  void *map;
  size_t size;
  cJSON *header; /* owns the names and dtype strings the tensors point at */
};

struct tsr_st_set {
  struct st_file *files;
  int n_files;
  struct tsr_st_tensor *tensors;
  int64_t n_tensors, cap_tensors;
};

static const struct {
  const char *name;
  size_t size;
} g_dtypes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
    {"I8", 1}, {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1}, {"BOOL", 1}, {"F8_E4M3", 1},
    {"F8_E5M2", 1}, {"F8_E8M0", 1},
};

static size_t dtype_size(const char *name) {
  for (size_t i = 0; i < sizeof g_dtypes / sizeof g_dtypes[0]; i++)
    if (!strcmp(g_dtypes[i].name, name)) return g_dtypes[i].size;
  return 0;
}

void tsr_st_close(struct tsr_st_set *s) {
  if (!s) return;
  for (int i = 0; i < s->n_files; i++) {
    if (s->files[i].map) munmap(s->files[i].map, s->files[i].size);
    cJSON_Delete(s->files[i].header);
    free(s->files[i].path);
  }
  free(s->files);
  free(s->tensors);
  free(s);
}

static tsr_status add_tensor(struct tsr_st_set *s, const struct tsr_st_tensor *t) {
  if (s->n_tensors == s->cap_tensors) {
    int64_t cap = s->cap_tensors ? 2 * s->cap_tensors : 256;
    struct tsr_st_tensor *grown = realloc(s->tensors, (size_t)cap * sizeof *grown);
    if (!grown) return tsr_error_set(TSR_ERR_NOMEM, "out of memory indexing safetensors");
    s->tensors = grown;
    s->cap_tensors = cap;
  }
  s->tensors[s->n_tensors++] = *t;
  return TSR_OK;
}

/* Validates one header entry into *t (data pointer relative to `data`). */
static tsr_status parse_entry(const cJSON *e, const char *path, const unsigned char *data,
                              size_t data_size, struct tsr_st_tensor *t) {
  const char *name = e->string;
  if (!cJSON_IsObject(e))
    return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor '%s': entry is a %s, not an object", path,
                         name, tsr_json_type_name(e));
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
  if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs))
    return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor '%s' needs a string dtype and arrays shape "
                         "and data_offsets", path, name);
  memset(t, 0, sizeof *t);
  t->name = name;
  t->dtype = dt->valuestring;
  t->file = path;
  t->elem_size = dtype_size(dt->valuestring);
  if (!t->elem_size)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%.32s'", path, name,
                         dt->valuestring);
  int n_dims = cJSON_GetArraySize(shape);
  if (n_dims > TSR_ST_MAX_DIMS)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor '%s' has %d dimensions (at most %d)", path,
                         name, n_dims, TSR_ST_MAX_DIMS);
  t->n_dims = n_dims;
  size_t n_el = 1;
  for (int d = 0; d < TSR_ST_MAX_DIMS; d++) t->shape[d] = 1;
  for (int d = 0; d < n_dims; d++) {
    int64_t v;
    if (!tsr_json_as_i64(cJSON_GetArrayItem(shape, d), &v) || v < 0)
      return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative "
                           "integer", path, name, d);
    t->shape[d] = v;
    if (!tsr_size_mul(n_el, (size_t)v, &n_el))
      return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor '%s': element count overflows", path, name);
  }
  int64_t begin, end;
  if (cJSON_GetArraySize(offs) != 2 || !tsr_json_as_i64(cJSON_GetArrayItem(offs, 0), &begin) ||
      !tsr_json_as_i64(cJSON_GetArrayItem(offs, 1), &end) || begin < 0 || end < begin)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor '%s': data_offsets must be two integers "
                         "0 <= begin <= end", path, name);
  if ((uint64_t)end > data_size)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor '%s': data ends at byte %lld of the data "
                         "section, which holds %zu bytes (truncated file?)", path, name,
                         (long long)end, data_size);
  size_t want;
  if (!tsr_size_mul(n_el, t->elem_size, &want) || want != (size_t)(end - begin))
    return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor '%s': shape and dtype %s make %zu bytes "
                         "but data_offsets span %lld", path, name, t->dtype,
                         tsr_size_mul(n_el, t->elem_size, &want) ? want : (size_t)-1,
                         (long long)(end - begin));
  if (n_el > (size_t)INT64_MAX)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: tensor '%s' is too large", path, name);
  t->n_elements = (int64_t)n_el;
  t->data = data + begin;
  t->nbytes = want;
  return TSR_OK;
}

static int by_offset(const void *a, const void *b) {
  const struct tsr_st_tensor *x = *(const struct tsr_st_tensor *const *)a;
  const struct tsr_st_tensor *y = *(const struct tsr_st_tensor *const *)b;
  if (x->data != y->data) return (const char *)x->data < (const char *)y->data ? -1 : 1;
  return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* No two tensors of a file may share bytes (a writer bug or a crafted file). */
static tsr_status check_overlaps(struct tsr_st_tensor *ts, int64_t n, const char *path) {
  if (n < 2) return TSR_OK;
  const struct tsr_st_tensor **v = malloc((size_t)n * sizeof *v);
  if (!v) return tsr_error_set(TSR_ERR_NOMEM, "out of memory checking %s", path);
  for (int64_t i = 0; i < n; i++) v[i] = &ts[i];
  qsort(v, (size_t)n, sizeof *v, by_offset);
  tsr_status st = TSR_OK;
  const struct tsr_st_tensor *reach = NULL; /* the non-empty tensor ending furthest so far */
  for (int64_t i = 0; i < n && st == TSR_OK; i++) {
    if (!v[i]->nbytes) continue;
    const char *start = v[i]->data, *end = start + v[i]->nbytes;
    if (reach && start < (const char *)reach->data + reach->nbytes)
      st = tsr_error_set(TSR_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap in the data section",
                         path, reach->name, v[i]->name);
    if (!reach || end > (const char *)reach->data + reach->nbytes) reach = v[i];
  }
  free(v);
  return st;
}

static tsr_status open_file(struct tsr_st_set *s, const char *path) {
  struct st_file *grown = realloc(s->files, (size_t)(s->n_files + 1) * sizeof *grown);
  if (!grown) return tsr_error_set(TSR_ERR_NOMEM, "out of memory opening %s", path);
  s->files = grown;
  struct st_file *f = &s->files[s->n_files++];
  memset(f, 0, sizeof *f);
  if (!(f->path = strdup(path))) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");

  int fd;
  tsr_status fst = tsr_file_open(path, &fd);
  if (fst != TSR_OK) return fst;
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    close(fd);
    return tsr_error_set(TSR_ERR_IO, "%s: not a regular file", path);
  }
  f->size = (size_t)sb.st_size;
  if (f->size < 8) {
    close(fd);
    return tsr_error_set(TSR_ERR_FORMAT, "%s: %zu bytes, too short for a safetensors header "
                         "length", path, f->size);
  }
  f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno; /* close() may change it */
  close(fd);
  if (f->map == MAP_FAILED) {
    f->map = NULL;
    return tsr_error_set(TSR_ERR_IO, "%s: mmap failed: %s", path, strerror(map_errno));
  }
  const unsigned char *base = f->map;
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | base[i];
  if (hlen > TSR_ST_MAX_HEADER || hlen > f->size - 8)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: header length %llu does not fit the file (%zu "
                         "bytes; the format allows at most %u)", path, (unsigned long long)hlen,
                         f->size, TSR_ST_MAX_HEADER);
  tsr_status st = tsr_json_parse((const char *)base + 8, (size_t)hlen, path, &f->header);
  if (st != TSR_OK) return st;
  if (!cJSON_IsObject(f->header))
    return tsr_error_set(TSR_ERR_FORMAT, "%s: the header is a JSON %s, not an object", path,
                         tsr_json_type_name(f->header));
  const unsigned char *data = base + 8 + hlen;
  size_t data_size = f->size - 8 - (size_t)hlen;
  int64_t first = s->n_tensors;
  for (const cJSON *e = f->header->child; e; e = e->next) {
    if (!strcmp(e->string, "__metadata__")) continue;
    if (!e->string[0]) return tsr_error_set(TSR_ERR_FORMAT, "%s: a tensor has an empty name", path);
    struct tsr_st_tensor t;
    if ((st = parse_entry(e, f->path, data, data_size, &t)) != TSR_OK) return st;
    if ((st = add_tensor(s, &t)) != TSR_OK) return st;
  }
  return s->n_tensors > first ? check_overlaps(s->tensors + first, s->n_tensors - first, path)
                              : TSR_OK;
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const struct tsr_st_tensor *)a)->name, ((const struct tsr_st_tensor *)b)->name);
}

tsr_status tsr_st_open_files(const char *const *paths, int n, struct tsr_st_set **out) {
  *out = NULL;
  struct tsr_st_set *s = calloc(1, sizeof *s);
  if (!s) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  tsr_status st = TSR_OK;
  for (int i = 0; i < n && st == TSR_OK; i++) st = open_file(s, paths[i]);
  if (st == TSR_OK && s->n_tensors) {
    qsort(s->tensors, (size_t)s->n_tensors, sizeof *s->tensors, by_name);
    for (int64_t i = 1; i < s->n_tensors && st == TSR_OK; i++)
      if (!strcmp(s->tensors[i].name, s->tensors[i - 1].name))
        st = tsr_error_set(TSR_ERR_FORMAT, "tensor '%s' appears twice (%s and %s)",
                           s->tensors[i].name, s->tensors[i - 1].file, s->tensors[i].file);
  }
  if (st != TSR_OK) {
    tsr_st_close(s);
    return st;
  }
  *out = s;
  return TSR_OK;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Shard names from the index's weight_map, unique and sorted; each must be a
** plain file name (an index must not reach outside the checkpoint). */
static tsr_status index_shards(const cJSON *map, const char *index, const char ***names, int *n) {
  int cap = cJSON_GetArraySize(map);
  *names = calloc((size_t)(cap ? cap : 1), sizeof **names);
  *n = 0;
  if (!*names) return tsr_error_set(TSR_ERR_NOMEM, "out of memory reading %s", index);
  for (const cJSON *e = map->child; e; e = e->next) {
    if (!cJSON_IsString(e))
      return tsr_error_set(TSR_ERR_FORMAT, "%s: weight_map['%s'] is a %s, not a file name",
                           index, e->string, tsr_json_type_name(e));
    const char *f = e->valuestring;
    if (!f[0] || strchr(f, '/') || !strcmp(f, ".") || !strcmp(f, ".."))
      return tsr_error_set(TSR_ERR_FORMAT, "%s: weight_map['%s'] = '%s' is not a file name in the "
                           "checkpoint's folder", index, e->string, f);
    (*names)[(*n)++] = f;
  }
  if (*n) qsort(*names, (size_t)*n, sizeof **names, cmp_str);
  int kept = 0;
  for (int i = 0; i < *n; i++)
    if (!kept || strcmp((*names)[kept - 1], (*names)[i])) (*names)[kept++] = (*names)[i];
  *n = kept;
  return TSR_OK;
}

/* The index and the shards must name the same tensors, each in its file. */
static tsr_status check_index(const struct tsr_st_set *s, const cJSON *map, const char *index) {
  int64_t n_map = 0;
  for (const cJSON *e = map->child; e; e = e->next, n_map++) {
    int64_t i = tsr_st_find(s, e->string);
    if (i < 0)
      return tsr_error_set(TSR_ERR_FORMAT, "%s lists tensor '%s' in %s, which does not hold it",
                           index, e->string, e->valuestring);
    const char *file = s->tensors[i].file, *slash = strrchr(file, '/');
    if (strcmp(slash ? slash + 1 : file, e->valuestring))
      return tsr_error_set(TSR_ERR_FORMAT, "%s lists tensor '%s' in %s, but it is in %s", index,
                           e->string, e->valuestring, file);
  }
  if (n_map != s->n_tensors)
    for (int64_t i = 0; i < s->n_tensors; i++)
      if (!cJSON_GetObjectItemCaseSensitive(map, s->tensors[i].name))
        return tsr_error_set(TSR_ERR_FORMAT, "%s holds tensor '%s', which %s does not list",
                             s->tensors[i].file, s->tensors[i].name, index);
  return TSR_OK;
}

static char *join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s/%s", dir, name);
  return p;
}

static tsr_status open_indexed(const char *dir, const char *index, struct tsr_st_set **out) {
  cJSON *root;
  tsr_status st = tsr_json_load(index, &root);
  if (st != TSR_OK) return st;
  const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
  const char **names = NULL;
  char **paths = NULL;
  int n = 0;
  if (!cJSON_IsObject(map))
    st = tsr_error_set(TSR_ERR_FORMAT, "%s: no weight_map object", index);
  if (st == TSR_OK) st = index_shards(map, index, &names, &n);
  if (st == TSR_OK && !(paths = calloc((size_t)(n ? n : 1), sizeof *paths)))
    st = tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  for (int i = 0; i < n && st == TSR_OK; i++)
    if (!(paths[i] = join(dir, names[i]))) st = tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  if (st == TSR_OK) st = tsr_st_open_files((const char *const *)paths, n, out);
  if (st == TSR_OK && (st = check_index(*out, map, index)) != TSR_OK) {
    tsr_st_close(*out);
    *out = NULL;
  }
  for (int i = 0; paths && i < n; i++) free(paths[i]);
  free(paths);
  free(names);
  cJSON_Delete(root);
  return st;
}

/* model-00001-of-00003.safetensors and the like, sorted. */
static tsr_status glob_shards(const char *dir, char ***paths, int *n) {
  *paths = NULL;
  *n = 0;
  DIR *d = opendir(dir);
  if (!d) return tsr_error_set(TSR_ERR_IO, "%s: cannot open the folder: %s", dir, strerror(errno));
  struct dirent *e;
  int cap = 0;
  tsr_status st = TSR_OK;
  while ((e = readdir(d)) && st == TSR_OK) {
    size_t len = strlen(e->d_name);
    if (strncmp(e->d_name, "model-", 6) || !strstr(e->d_name, "-of-") || len < 12 ||
        strcmp(e->d_name + len - 12, ".safetensors"))
      continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 8;
      char **grown = realloc(*paths, (size_t)cap * sizeof *grown);
      if (!grown) {
        st = tsr_error_set(TSR_ERR_NOMEM, "out of memory");
        break;
      }
      *paths = grown;
    }
    if (!((*paths)[*n] = join(dir, e->d_name))) st = tsr_error_set(TSR_ERR_NOMEM, "out of memory");
    else (*n)++;
  }
  closedir(d);
  if (*n) qsort(*paths, (size_t)*n, sizeof **paths, cmp_str);
  return st;
}

tsr_status tsr_st_open_dir(const char *dir, struct tsr_st_set **out) {
  *out = NULL;
  char *index = join(dir, "model.safetensors.index.json");
  char *single = join(dir, "model.safetensors");
  tsr_status st = TSR_OK;
  if (!index || !single) st = tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  else if (tsr_json_file_exists(index)) st = open_indexed(dir, index, out);
  else if (tsr_json_file_exists(single))
    st = tsr_st_open_files((const char *const *)&single, 1, out);
  else {
    char **paths;
    int n;
    st = glob_shards(dir, &paths, &n);
    if (st == TSR_OK && !n)
      st = tsr_error_set(TSR_ERR_IO, "%s holds no model.safetensors, "
                         "model.safetensors.index.json or model-*-of-*.safetensors", dir);
    if (st == TSR_OK) st = tsr_st_open_files((const char *const *)paths, n, out);
    for (int i = 0; i < n; i++) free(paths[i]);
    free(paths);
  }
  free(index);
  free(single);
  return st;
}

int64_t tsr_st_count(const struct tsr_st_set *s) { return s->n_tensors; }

const struct tsr_st_tensor *tsr_st_at(const struct tsr_st_set *s, int64_t i) {
  return (i >= 0 && i < s->n_tensors) ? &s->tensors[i] : NULL;
}

int64_t tsr_st_find(const struct tsr_st_set *s, const char *name) {
  int64_t lo = 0, hi = s->n_tensors - 1;
  while (lo <= hi) {
    int64_t mid = lo + (hi - lo) / 2;
    int c = strcmp(s->tensors[mid].name, name);
    if (!c) return mid;
    if (c < 0) lo = mid + 1;
    else hi = mid - 1;
  }
  return -1;
}

tsr_status tsr_st_read_f32(const struct tsr_st_tensor *t, float *out, int64_t n) {
  if (n != t->n_elements)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "tensor '%s' has %lld elements, asked to read %lld",
                         t->name, (long long)t->n_elements, (long long)n);
  const unsigned char *p = t->data;
  if (!strcmp(t->dtype, "F32")) {
    memcpy(out, p, (size_t)n * 4);
  } else if (!strcmp(t->dtype, "F16") || !strcmp(t->dtype, "BF16")) {
    bool bf = t->dtype[0] == 'B';
    for (int64_t i = 0; i < n; i++) {
      uint16_t h;
      memcpy(&h, p + 2 * i, 2);
      out[i] = bf ? tsr_bf16_to_f32(h) : tsr_f16_to_f32(h);
    }
  } else if (!strcmp(t->dtype, "I64") || !strcmp(t->dtype, "I32")) {
    /* index tables (e.g. a token ordering): exact in f32 up to 2^24 */
    const bool wide = t->dtype[1] == '6';
    for (int64_t i = 0; i < n; i++) {
      int64_t v;
      if (wide) {
        memcpy(&v, p + 8 * i, 8);
      } else {
        int32_t v32;
        memcpy(&v32, p + 4 * i, 4);
        v = v32;
      }
      if (v > (1 << 24) || v < -(1 << 24))
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: tensor '%s' (%s) holds %lld at %lld, "
                             "beyond what f32 holds exactly", t->file, t->name, t->dtype,
                             (long long)v, (long long)i);
      out[i] = (float)v;
    }
  } else {
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: tensor '%s' is %s; tessera convert reads F32, "
                         "F16 and BF16 checkpoints and I32/I64 index tables", t->file, t->name,
                         t->dtype);
  }
  return TSR_OK;
}
