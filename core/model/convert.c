/* `tessera convert`: checkpoint access, output, dispatch and the final checks. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model/convert.h"
#include "model/convert_safetensors.h"
#include "common/error.h"
#include "model/gguf.h"
#include "model/json.h"
#include "abi/plugin_host_internal.h"

#define MAX_QUANT_THREADS 32

struct out_rec {
  char *name;
  enum tsr_dtype dtype;
  uint32_t n_dims;
  int64_t ne[4];
  uint64_t offset; /* in the spill file */
  size_t nbytes;
};

struct tsr_convert {
  struct tsr_convert_options o;
  char *dir, *name, *config_path;
  cJSON *config;
  struct tsr_st_set *st;
  bool *read; /* per checkpoint tensor */
  char **skips;
  int n_skips;
  struct tsr_gguf_writer *w;
  bool wrote_arch;
  const char *plugin; /* for messages */
  int spill_fd;
  uint64_t spill_size;
  void *spill_map;
  struct out_rec *outs;
  int64_t n_outs, cap_outs;
  struct tsr_convert_stats stats;
  bool progress; /* the log is a terminal */
  bool wrote_token_embd;
};

/* ---- outtypes ------------------------------------------------------------ */

static const struct {
  const char *name;
  enum tsr_dtype dtype;
  int file_type; /* llama.cpp's LLAMA_FTYPE */
} g_outtypes[] = {
    {"f32", TSR_F32, 0},   {"f16", TSR_F16, 1},   {"bf16", TSR_BF16, 32},
    {"q8_0", TSR_Q8_0, 7}, {"q4_0", TSR_Q4_0, 2}, {"q4_K", TSR_Q4_K, 14}, /* MOSTLY_Q4_K_S */
    {"q5_K", TSR_Q5_K, 16},                                                /* MOSTLY_Q5_K_S */
    {"q6_K", TSR_Q6_K, 18},
};
#define N_OUTTYPES (sizeof g_outtypes / sizeof g_outtypes[0])

int tsr_convert_outtype_parse(const char *name) {
  for (size_t i = 0; i < N_OUTTYPES; i++)
    if (!strcasecmp(g_outtypes[i].name, name)) return (int)g_outtypes[i].dtype;
  return -1;
}

const char *tsr_convert_outtypes(void) { return "f32|f16|bf16|q8_0|q4_0|q4_K|q5_K|q6_K"; }

int tsr_convert_file_type(enum tsr_dtype outtype) {
  for (size_t i = 0; i < N_OUTTYPES; i++)
    if (g_outtypes[i].dtype == outtype) return g_outtypes[i].file_type;
  return -1;
}

/* ---- open / free --------------------------------------------------------- */

void tsr_convert_free(struct tsr_convert *cv) {
  if (!cv) return;
  if (cv->spill_map) munmap(cv->spill_map, cv->spill_size);
  if (cv->spill_fd >= 0) close(cv->spill_fd);
  for (int64_t i = 0; i < cv->n_outs; i++) free(cv->outs[i].name);
  free(cv->outs);
  for (int i = 0; i < cv->n_skips; i++) free(cv->skips[i]);
  free(cv->skips);
  free(cv->read);
  tsr_st_close(cv->st);
  tsr_gguf_writer_free(cv->w);
  cJSON_Delete(cv->config);
  free(cv->dir);
  free(cv->name);
  free(cv->config_path);
  free(cv);
}

/* The folder's own name ("Qwen3-0.6B" for /models/Qwen3-0.6B/). */
static char *dir_name(const char *dir) {
  size_t n = strlen(dir);
  while (n > 1 && dir[n - 1] == '/') n--;
  size_t start = n;
  while (start > 0 && dir[start - 1] != '/') start--;
  if (n - start == 1 && dir[start] == '.') {
    char cwd[4096];
    if (getcwd(cwd, sizeof cwd) && strcmp(cwd, "/")) return dir_name(cwd);
  }
  return strndup(dir + start, n - start);
}

/* An unlinked file beside the output: converted tensors wait there. */
static tsr_status open_spill(struct tsr_convert *cv) {
  const char *out = cv->o.out_path;
  const char *slash = strrchr(out, '/');
  size_t dlen = slash ? (size_t)(slash - out) : 0;
  char tmpl[4200];
  if (dlen + 32 > sizeof tmpl)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "output path too long: %s", out);
  if (slash) snprintf(tmpl, sizeof tmpl, "%.*s/.tessera-convert.XXXXXX", (int)dlen, out);
  else snprintf(tmpl, sizeof tmpl, ".tessera-convert.XXXXXX");
  cv->spill_fd = mkstemp(tmpl);
  if (cv->spill_fd < 0)
    return tsr_error_set(TSR_ERR_IO, "cannot create a scratch file beside %s: %s", out,
                         strerror(errno));
  unlink(tmpl);
  return TSR_OK;
}

tsr_status tsr_convert_open(const struct tsr_convert_options *o, struct tsr_convert **out) {
  *out = NULL;
  if (!o->hf_dir || !o->out_path)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "convert: need a checkpoint folder and an output");
  if (tsr_convert_file_type(o->outtype) < 0)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "convert: outtype %s is not one of %s",
                         tsr_dtype_name(o->outtype) ? tsr_dtype_name(o->outtype) : "?",
                         tsr_convert_outtypes());
  if (o->token_embd_set && tsr_convert_file_type(o->token_embd_type) < 0)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "convert: token embedding type %s is not one of %s",
                         tsr_dtype_name(o->token_embd_type) ? tsr_dtype_name(o->token_embd_type) : "?",
                         tsr_convert_outtypes());
  struct tsr_convert *cv = calloc(1, sizeof *cv);
  if (!cv) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  cv->o = *o;
  cv->spill_fd = -1;
  cv->progress = o->log && isatty(fileno(o->log));
  tsr_status st = TSR_OK;
  size_t plen = strlen(o->hf_dir) + 16;
  cv->dir = strdup(o->hf_dir);
  cv->name = dir_name(o->hf_dir);
  cv->config_path = malloc(plen);
  if (!cv->dir || !cv->name || !cv->config_path) st = tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  if (st == TSR_OK) {
    snprintf(cv->config_path, plen, "%s/config.json", o->hf_dir);
    st = tsr_json_load(cv->config_path, &cv->config);
  }
  if (st == TSR_OK && !cJSON_IsObject(cv->config))
    st = tsr_error_set(TSR_ERR_FORMAT, "%s: a JSON %s, not an object", cv->config_path,
                       tsr_json_type_name(cv->config));
  if (st == TSR_OK) st = tsr_st_open_dir(o->hf_dir, &cv->st);
  if (st == TSR_OK && !(cv->read = calloc((size_t)tsr_st_count(cv->st) + 1, sizeof *cv->read)))
    st = tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  if (st == TSR_OK) st = tsr_gguf_writer_new(&cv->w);
  if (st == TSR_OK) st = open_spill(cv);
  if (st != TSR_OK) {
    tsr_convert_free(cv);
    return st;
  }
  *out = cv;
  return TSR_OK;
}

const char *tsr_convert_dir(const struct tsr_convert *cv) { return cv->dir; }
const void *tsr_convert_config(const struct tsr_convert *cv) { return cv->config; }

const char *tsr_convert_model_type(const struct tsr_convert *cv) {
  const cJSON *v = tsr_json_find(cv->config, "model_type");
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ---- config.json --------------------------------------------------------- */

int tsr_convert_hf_has(const struct tsr_convert *cv, const char *path) {
  return tsr_json_find(cv->config, path) != NULL;
}
tsr_status tsr_convert_hf_i64(const struct tsr_convert *cv, const char *path, int64_t *out) {
  return tsr_json_i64(cv->config, cv->config_path, path, out);
}
tsr_status tsr_convert_hf_f64(const struct tsr_convert *cv, const char *path, double *out) {
  return tsr_json_f64(cv->config, cv->config_path, path, out);
}
tsr_status tsr_convert_hf_bool(const struct tsr_convert *cv, const char *path, bool *out) {
  return tsr_json_bool(cv->config, cv->config_path, path, out);
}
tsr_status tsr_convert_hf_str(const struct tsr_convert *cv, const char *path, const char **out) {
  return tsr_json_str(cv->config, cv->config_path, path, out);
}
tsr_status tsr_convert_hf_arr_len(const struct tsr_convert *cv, const char *path, int64_t *n) {
  return tsr_json_arr_len(cv->config, cv->config_path, path, n);
}
tsr_status tsr_convert_hf_arr_i64(const struct tsr_convert *cv, const char *path, int64_t i,
                                  int64_t *out) {
  return tsr_json_arr_i64(cv->config, cv->config_path, path, i, out);
}
tsr_status tsr_convert_hf_arr_f64(const struct tsr_convert *cv, const char *path, int64_t i,
                                  double *out) {
  return tsr_json_arr_f64(cv->config, cv->config_path, path, i, out);
}
tsr_status tsr_convert_hf_arr_str(const struct tsr_convert *cv, const char *path, int64_t i,
                                  const char **out) {
  return tsr_json_arr_str(cv->config, cv->config_path, path, i, out);
}

/* ---- checkpoint tensors -------------------------------------------------- */

int64_t tsr_convert_hf_n_tensors(const struct tsr_convert *cv) { return tsr_st_count(cv->st); }

const char *tsr_convert_hf_tensor_name(const struct tsr_convert *cv, int64_t i) {
  const struct tsr_st_tensor *t = tsr_st_at(cv->st, i);
  return t ? t->name : NULL;
}

int tsr_convert_hf_tensor_has(const struct tsr_convert *cv, const char *name) {
  return tsr_st_find(cv->st, name) >= 0;
}

static tsr_status find(const struct tsr_convert *cv, const char *name, int64_t *i) {
  *i = tsr_st_find(cv->st, name);
  if (*i < 0)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: the checkpoint has no tensor '%s'", cv->dir, name);
  return TSR_OK;
}

tsr_status tsr_convert_hf_tensor_shape(const struct tsr_convert *cv, const char *name,
                                       int32_t *n_dims, int64_t shape[4]) {
  int64_t i;
  tsr_status st = find(cv, name, &i);
  if (st != TSR_OK) return st;
  const struct tsr_st_tensor *t = tsr_st_at(cv->st, i);
  if (t->n_dims > 4)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: tensor '%s' has %d dimensions (at most 4 "
                         "convert)", t->file, name, t->n_dims);
  *n_dims = t->n_dims;
  for (int d = 0; d < 4; d++) shape[d] = t->shape[d];
  return TSR_OK;
}

tsr_status tsr_convert_hf_tensor_read(struct tsr_convert *cv, const char *name, float *out,
                                      int64_t n) {
  int64_t i;
  tsr_status st = find(cv, name, &i);
  if (st != TSR_OK) return st;
  st = tsr_st_read_f32(tsr_st_at(cv->st, i), out, n);
  if (st == TSR_OK) cv->read[i] = true;
  return st;
}

void tsr_convert_hf_skip_prefix(struct tsr_convert *cv, const char *prefix) {
  char **grown = realloc(cv->skips, (size_t)(cv->n_skips + 1) * sizeof *grown);
  char *copy = strdup(prefix);
  if (!grown || !copy) {
    /* the tensors stay unskipped, so the final check names them: never silent */
    free(copy);
    if (grown) cv->skips = grown;
    return;
  }
  cv->skips = grown;
  cv->skips[cv->n_skips++] = copy;
}

static bool skipped(const struct tsr_convert *cv, const char *name) {
  for (int i = 0; i < cv->n_skips; i++)
    if (!strncmp(name, cv->skips[i], strlen(cv->skips[i]))) return true;
  return false;
}

/* ---- output metadata ----------------------------------------------------- */

static tsr_status key_ok(struct tsr_convert *cv, const char *key) {
  static const char *reserved[] = {"general.name", "general.type", "general.file_type",
                                   "general.quantization_version"};
  if (!key || !*key) return tsr_error_set(TSR_ERR_INVALID_ARG, "convert: an empty output key");
  for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
    if (!strcmp(key, reserved[i]))
      return tsr_error_set(TSR_ERR_INVALID_ARG, "convert: %s is written by the core, not the "
                           "converter plugin", key);
  if (!strcmp(key, "general.architecture")) cv->wrote_arch = true;
  return TSR_OK;
}

#define OUT_SCALAR(fn, ctype, writer_fn)                                                 \
  tsr_status fn(struct tsr_convert *cv, const char *key, ctype v) {                      \
    tsr_status st = key_ok(cv, key);                                                     \
    return st != TSR_OK ? st : writer_fn(cv->w, key, v);                                 \
  }
OUT_SCALAR(tsr_convert_out_u32, uint32_t, tsr_gguf_writer_add_u32)
OUT_SCALAR(tsr_convert_out_i32, int32_t, tsr_gguf_writer_add_i32)
OUT_SCALAR(tsr_convert_out_bool, bool, tsr_gguf_writer_add_bool)
OUT_SCALAR(tsr_convert_out_str, const char *, tsr_gguf_writer_add_str)
#undef OUT_SCALAR

/* A config value past float's range arrives here as inf (the plugin's cast):
** tessera run refuses a non-finite float key, so it is refused here, named. */
tsr_status tsr_convert_out_f32(struct tsr_convert *cv, const char *key, float v) {
  tsr_status st = key_ok(cv, key);
  if (st == TSR_OK && !isfinite(v))
    st = tsr_error_set(TSR_ERR_FORMAT, "%s would be %g: config.json's value does not fit a "
                       "32-bit float", key, (double)v);
  return st != TSR_OK ? st : tsr_gguf_writer_add_f32(cv->w, key, v);
}

static tsr_status out_arr(struct tsr_convert *cv, const char *key, enum tsr_gguf_type type,
                          const void *v, int64_t n) {
  tsr_status st = key_ok(cv, key);
  if (st == TSR_OK && n < 0) st = tsr_error_set(TSR_ERR_INVALID_ARG, "%s: negative length", key);
  return st != TSR_OK ? st : tsr_gguf_writer_add_arr(cv->w, key, type, v, (uint64_t)n);
}

tsr_status tsr_convert_out_arr_i32(struct tsr_convert *cv, const char *key, const int32_t *v,
                                   int64_t n) {
  return out_arr(cv, key, TSR_GGUF_I32, v, n);
}

tsr_status tsr_convert_out_arr_f32(struct tsr_convert *cv, const char *key, const float *v,
                                   int64_t n) {
  return out_arr(cv, key, TSR_GGUF_F32, v, n);
}

tsr_status tsr_convert_out_arr_bool(struct tsr_convert *cv, const char *key, const bool *v,
                                    int64_t n) {
  /* GGUF bools are one byte holding 0 or 1, whatever the C bool's bytes are */
  uint8_t *bytes = malloc(n > 0 ? (size_t)n : 1);
  if (!bytes) return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory", key);
  for (int64_t i = 0; i < n; i++) bytes[i] = v[i] ? 1 : 0;
  tsr_status st = out_arr(cv, key, TSR_GGUF_BOOL, bytes, n);
  free(bytes);
  return st;
}

tsr_status tsr_convert_out_arr_str(struct tsr_convert *cv, const char *key,
                                   const char *const *v, int64_t n) {
  tsr_status st = key_ok(cv, key);
  if (st == TSR_OK && n < 0) st = tsr_error_set(TSR_ERR_INVALID_ARG, "%s: negative length", key);
  return st != TSR_OK ? st : tsr_gguf_writer_add_arr_str(cv->w, key, v, (uint64_t)n);
}

/* ---- output tensors ------------------------------------------------------ */

/* The type a tensor is stored in; *requested differs from it on a fallback. The token
** embedding's own type applies even where the plugin keeps the tensor unquantized. */
static enum tsr_dtype storage_type(const struct tsr_convert *cv, bool token_embd, bool quantize,
                                   int64_t ne0, enum tsr_dtype *requested) {
  enum tsr_dtype t = quantize ? cv->o.outtype : TSR_F32;
  if (token_embd && cv->o.token_embd_set) t = cv->o.token_embd_type;
  *requested = t;
  if (ne0 % tsr_dtype_block_size(t) == 0) return t;
  /* llama.cpp's converter also falls back to a type the row fits, per tensor */
  if (tsr_dtype_block_size(t) == TSR_QK_K && ne0 % TSR_QK8_0 == 0) return TSR_Q8_0;
  return TSR_F16;
}

/* A terminal gets a progress line, rewritten in place; anything else gets none. */
static void clear_progress(const struct tsr_convert *cv) {
  if (cv->progress) fprintf(cv->o.log, "\r\033[K");
}

static tsr_status spill_write(struct tsr_convert *cv, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t k = write(cv->spill_fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      return tsr_error_set(TSR_ERR_IO, "writing the scratch file beside %s: %s", cv->o.out_path,
                           k < 0 ? strerror(errno) : "no progress");
    p += k;
    n -= (size_t)k;
    cv->spill_size += (uint64_t)k;
  }
  return TSR_OK;
}

/* One thread's share of a chunk: rows [r0, r1) into buf. */
struct quant_job {
  enum tsr_dtype t;
  const float *src;
  void *dst;
  int64_t ne0, rows;
  tsr_status st;
};

static void *quant_rows(void *arg) {
  struct quant_job *j = arg;
  j->st = tsr_dtype_from_f32(j->t, j->src, j->dst, j->rows * j->ne0);
  return NULL;
}

/* Converts rows in chunks so a large tensor needs no second full-size buffer;
** the reference k-quantizers run at ~10 M values/s, so a chunk is split over
** the machine's cores (a 7B model would otherwise take a quarter hour). */
static tsr_status spill_tensor(struct tsr_convert *cv, enum tsr_dtype t, const float *data,
                               int64_t ne0, int64_t rows) {
  size_t row_bytes = tsr_dtype_row_size(t, ne0);
  if (!row_bytes) return tsr_error_set(TSR_ERR_INTERNAL, "row size of %s", tsr_dtype_name(t));
  int64_t chunk = (int64_t)((32u << 20) / row_bytes);
  if (chunk < 1) chunk = 1;
  if (chunk > rows) chunk = rows;
  unsigned char *buf = malloc(row_bytes * (size_t)chunk);
  if (!buf) return tsr_error_set(TSR_ERR_NOMEM, "out of memory converting a tensor");
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int n_threads = cpus < 1 ? 1 : cpus > MAX_QUANT_THREADS ? MAX_QUANT_THREADS : (int)cpus;
  tsr_status st = TSR_OK;
  for (int64_t r = 0; r < rows && st == TSR_OK; r += chunk) {
    int64_t nr = rows - r < chunk ? rows - r : chunk;
    int nt = t == TSR_F32 || nr < n_threads ? 1 : n_threads;
    struct quant_job jobs[MAX_QUANT_THREADS];
    pthread_t tid[MAX_QUANT_THREADS];
    bool started[MAX_QUANT_THREADS] = {false};
    for (int k = 0; k < nt; k++) {
      int64_t a = nr * k / nt, b = nr * (k + 1) / nt;
      jobs[k] = (struct quant_job){t, data + (r + a) * ne0, buf + (size_t)a * row_bytes, ne0,
                                   b - a, TSR_OK};
      started[k] = k > 0 && pthread_create(&tid[k], NULL, quant_rows, &jobs[k]) == 0;
    }
    for (int k = 0; k < nt; k++)
      if (!started[k]) quant_rows(&jobs[k]); /* this thread's share, or a failed start */
    for (int k = 0; k < nt; k++) {
      if (started[k]) pthread_join(tid[k], NULL);
      if (jobs[k].st != TSR_OK && st == TSR_OK)
        st = started[k] ? tsr_error_set(jobs[k].st, "quantizing rows to %s failed",
                                        tsr_dtype_name(t)) /* its message stayed in its thread */
                        : jobs[k].st;
    }
    if (st == TSR_OK) st = spill_write(cv, buf, row_bytes * (size_t)nr);
  }
  free(buf);
  return st;
}

/* Checks an output tensor's name and shape; n gets its element count. */
static tsr_status check_out(const struct tsr_convert *cv, const char *name, int32_t n_dims,
                            const int64_t *ne, const void *data, int64_t *n) {
  if (!name || !*name || strlen(name) >= TSR_GGUF_MAX_NAME)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "convert: output tensor name '%s' must be 1 to %d "
                         "bytes", name ? name : "", TSR_GGUF_MAX_NAME - 1);
  if (n_dims < 1 || n_dims > 4 || !ne || !data)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "convert: output tensor '%s': n_dims %d (1..4), "
                         "dims and data are required", name, n_dims);
  *n = 1;
  for (int d = 0; d < n_dims; d++)
    if (ne[d] <= 0 || __builtin_mul_overflow(*n, ne[d], n))
      return tsr_error_set(TSR_ERR_INVALID_ARG, "convert: output tensor '%s': bad dimension %d "
                           "(%lld)", name, d, (long long)ne[d]);
  for (int64_t i = 0; i < cv->n_outs; i++)
    if (!strcmp(cv->outs[i].name, name))
      return tsr_error_set(TSR_ERR_INVALID_ARG, "convert: output tensor '%s' written twice", name);
  return TSR_OK;
}

/* A new output record of dtype t at the end of the spill file (not counted yet). */
static tsr_status new_out(struct tsr_convert *cv, enum tsr_dtype t, int32_t n_dims,
                          const int64_t *ne, struct out_rec **out) {
  if (cv->n_outs == cv->cap_outs) {
    int64_t cap = cv->cap_outs ? 2 * cv->cap_outs : 256;
    struct out_rec *grown = realloc(cv->outs, (size_t)cap * sizeof *grown);
    if (!grown) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
    cv->outs = grown;
    cv->cap_outs = cap;
  }
  struct out_rec *r = *out = &cv->outs[cv->n_outs];
  memset(r, 0, sizeof *r);
  r->dtype = t;
  r->n_dims = (uint32_t)n_dims;
  for (int d = 0; d < 4; d++) r->ne[d] = d < n_dims ? ne[d] : 1;
  r->offset = cv->spill_size;
  return TSR_OK;
}

/* Names and counts the record new_out made, once its bytes are spilled. */
static tsr_status commit_out(struct tsr_convert *cv, struct out_rec *r, const char *name,
                             int64_t n) {
  r->nbytes = (size_t)(cv->spill_size - r->offset);
  if (!(r->name = strdup(name))) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  cv->n_outs++;
  cv->stats.n_tensors++;
  cv->stats.n_params += n;
  cv->stats.n_bytes += r->nbytes;
  cv->stats.n_by_dtype[r->dtype]++;
  if (cv->progress)
    fprintf(cv->o.log, "\rconverting: %lld tensors, %.0f MiB", (long long)cv->stats.n_tensors,
            (double)cv->stats.n_bytes / 1048576.0);
  return TSR_OK;
}

tsr_status tsr_convert_out_tensor(struct tsr_convert *cv, const char *name, bool quantize,
                                  int32_t n_dims, const int64_t *ne, const float *data) {
  int64_t n = 0;
  tsr_status st = check_out(cv, name, n_dims, ne, data, &n);
  if (st != TSR_OK) return st;
  const bool token_embd = !strcmp(name, "token_embd.weight");
  enum tsr_dtype requested;
  enum tsr_dtype t = storage_type(cv, token_embd, quantize, ne[0], &requested);
  cv->wrote_token_embd |= token_embd;
  struct out_rec *r;
  if ((st = new_out(cv, t, n_dims, ne, &r)) != TSR_OK) return st;
  if ((st = spill_tensor(cv, t, data, ne[0], n / ne[0])) != TSR_OK) return st;
  if (t != requested) {
    cv->stats.n_fallback++;
    clear_progress(cv);
    if (cv->o.log)
      fprintf(cv->o.log, "note: %s: row length %lld is not a multiple of %s's block of %lld; "
              "stored as %s\n", name, (long long)ne[0], tsr_dtype_name(requested),
              (long long)tsr_dtype_block_size(requested), tsr_dtype_name(t));
  }
  return commit_out(cv, r, name, n);
}

tsr_status tsr_convert_out_tensor_i32(struct tsr_convert *cv, const char *name, int32_t n_dims,
                                      const int64_t *ne, const int32_t *data) {
  int64_t n = 0;
  tsr_status st = check_out(cv, name, n_dims, ne, data, &n);
  struct out_rec *r;
  if (st == TSR_OK) st = new_out(cv, TSR_I32, n_dims, ne, &r);
  if (st == TSR_OK) st = spill_write(cv, data, (size_t)n * sizeof *data);
  return st == TSR_OK ? commit_out(cv, r, name, n) : st;
}

/* ---- dispatch and finish --------------------------------------------------- */

tsr_status tsr_convert_with(struct tsr_convert *cv, const struct tsr_convert_v1 *converter,
                            const char *plugin_name) {
  cv->plugin = plugin_name;
  tsr_status st = tsr_convert_check_config(cv->config, cv->config_path);
  if (st != TSR_OK) return st;
  st = converter->convert(converter->ctx, tsr_plugin_host_services(), cv);
  if (st != TSR_OK) {
    clear_progress(cv);
    const char *mt = tsr_convert_model_type(cv);
    tsr_error_prefix("%s: plugin %s converting model_type %s", cv->dir, plugin_name,
                     mt ? mt : "?");
  }
  return st;
}

/* Every checkpoint tensor was read or deliberately skipped. */
static tsr_status check_all_read(const struct tsr_convert *cv) {
  int64_t n_bad = 0;
  char list[1024] = "";
  size_t used = 0;
  for (int64_t i = 0; i < tsr_st_count(cv->st); i++) {
    const char *name = tsr_st_at(cv->st, i)->name;
    if (cv->read[i] || skipped(cv, name)) continue;
    if (n_bad < 8 && used < sizeof list)
      used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", n_bad ? ", " : "", name);
    n_bad++;
  }
  if (!n_bad) return TSR_OK;
  return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: %lld checkpoint tensor%s neither converted nor "
                       "skipped by plugin %s (so a weight would be lost): %s%s", cv->dir,
                       (long long)n_bad, n_bad == 1 ? " was" : "s were",
                       cv->plugin ? cv->plugin : "?", list, n_bad > 8 ? ", ..." : "");
}

static void print_summary(const struct tsr_convert *cv) {
  FILE *f = cv->o.log;
  if (!f) return;
  const struct tsr_convert_stats *s = &cv->stats;
  fprintf(f, "wrote %s: %lld tensors, %.2f MiB of tensor data, %lld parameters (%.3g B), "
          "outtype %s\n", cv->o.out_path, (long long)s->n_tensors, (double)s->n_bytes / 1048576.0,
          (long long)s->n_params, (double)s->n_params / 1e9, tsr_dtype_name(cv->o.outtype));
  fprintf(f, "  by type:");
  for (int t = 0; t < TSR_DTYPE_COUNT; t++)
    if (s->n_by_dtype[t]) fprintf(f, " %s %lld", tsr_dtype_name(t), (long long)s->n_by_dtype[t]);
  fprintf(f, "\n");
  if (s->n_fallback)
    fprintf(f, "  %lld tensor%s stored in another type than asked (row length; notes above)\n",
            (long long)s->n_fallback, s->n_fallback == 1 ? "" : "s");
}

tsr_status tsr_convert_finish(struct tsr_convert *cv, struct tsr_convert_stats *stats) {
  clear_progress(cv);
  tsr_status st = check_all_read(cv);
  if (st == TSR_OK && !cv->wrote_arch)
    st = tsr_error_set(TSR_ERR_INTERNAL, "plugin %s wrote no general.architecture",
                       cv->plugin ? cv->plugin : "?");
  if (st == TSR_OK && cv->o.token_embd_set && !cv->wrote_token_embd)
    st = tsr_error_set(TSR_ERR_INVALID_ARG, "a token embedding type was asked for, but plugin %s "
                       "wrote no token_embd.weight", cv->plugin ? cv->plugin : "?");
  struct tsr_gguf_writer *w = cv->w;
  if (st == TSR_OK) st = tsr_gguf_writer_add_str(w, "general.type", "model");
  if (st == TSR_OK) st = tsr_gguf_writer_add_str(w, "general.name", cv->name);
  if (st == TSR_OK)
    st = tsr_gguf_writer_add_u32(w, "general.file_type",
                                 (uint32_t)tsr_convert_file_type(cv->o.outtype));
  /* llama.cpp's converter writes the quantization version (GGML_QNT_VERSION) always */
  if (st == TSR_OK) st = tsr_gguf_writer_add_u32(w, "general.quantization_version", 2);
  if (st == TSR_OK && cv->spill_size) {
    cv->spill_map = mmap(NULL, cv->spill_size, PROT_READ, MAP_SHARED, cv->spill_fd, 0);
    if (cv->spill_map == MAP_FAILED) {
      cv->spill_map = NULL;
      st = tsr_error_set(TSR_ERR_IO, "mapping the scratch file: %s", strerror(errno));
    }
  }
  for (int64_t i = 0; i < cv->n_outs && st == TSR_OK; i++) {
    const struct out_rec *r = &cv->outs[i];
    st = tsr_gguf_writer_add_tensor(w, r->name, r->dtype, r->n_dims, r->ne,
                                    (const char *)cv->spill_map + r->offset);
  }
  if (st == TSR_OK) st = tsr_gguf_writer_write(w, cv->o.out_path);
  if (st == TSR_OK) print_summary(cv);
  if (stats) *stats = cv->stats;
  return st;
}

/* The converter registered for model_type; *known lists every convertible type. */
static const struct registered *converter_for(const struct tsr_plugin_host *h,
                                              const char *model_type, char *known, size_t n) {
  size_t used = 0;
  known[0] = '\0';
  for (int i = 0; i < h->converters.n; i++) {
    const char *s = h->converters.items[i].u.convert.hf_types;
    while (*s) {
      while (*s == ',' || *s == ' ') s++;
      size_t len = strcspn(s, ", ");
      if (len == strlen(model_type) && !strncmp(s, model_type, len))
        return &h->converters.items[i];
      if (len && used < n)
        used += (size_t)snprintf(known + used, n - used, "%s%.*s", used ? ", " : "", (int)len, s);
      s += len;
    }
  }
  return NULL;
}

tsr_status tsr_convert_run(struct tsr_plugin_host *h, const struct tsr_convert_options *o,
                           struct tsr_convert_stats *stats) {
  struct tsr_convert *cv;
  tsr_status st = tsr_convert_open(o, &cv);
  if (st != TSR_OK) return st;
  const char *mt = tsr_convert_model_type(cv);
  if (!mt) {
    st = tsr_error_set(TSR_ERR_FORMAT, "%s: no string model_type", cv->config_path);
    tsr_convert_free(cv);
    return st;
  }
  st = tsr_plugin_host_load_providers(h, TSR_IFACE_CONVERT);
  char known[1024];
  const struct registered *r = st == TSR_OK ? converter_for(h, mt, known, sizeof known) : NULL;
  if (st == TSR_OK && !r)
    st = tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: model_type '%s' has no converter (known: %s)",
                       cv->config_path, mt, known[0] ? known : "none; are the converter plugins "
                       "on the plugin path?");
  if (st == TSR_OK && o->log)
    fprintf(o->log, "converting %s (model_type %s) with plugin %s %s to %s, outtype %s\n",
            cv->dir, mt, r->owner->desc->name, r->owner->desc->version, o->out_path,
            tsr_dtype_name(o->outtype));
  if (st == TSR_OK) st = tsr_convert_with(cv, &r->u.convert, r->owner->desc->name);
  if (st == TSR_OK) st = tsr_convert_finish(cv, stats);
  tsr_convert_free(cv);
  return st;
}
