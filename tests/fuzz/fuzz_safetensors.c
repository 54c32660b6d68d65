/* libFuzzer target: what `tessera convert` reads from a Hugging Face folder,
** on arbitrary bytes: safetensors files (alone, sharded with an index, or
** found by name) and config.json, through the same calls convert makes.
**
** Input: one mode byte, then the payload, written into a private directory.
**   mode % 4 == 0: the payload is model.safetensors; tsr_st_open_dir
**   mode % 4 == 1: the payload is config.json; tsr_json_load, then typed reads
**                  of every path in the document and of the keys arch plugins ask for
**   mode % 4 == 2: model.safetensors.index.json up to the first NUL, then
**                  shards model-0000K-of-0000N.safetensors separated by SEP
**   mode % 4 == 3: shards only (separated by SEP), found by their names
**
** The build renames mmap/munmap in convert_safetensors.c to the copies below,
** which read the file into a heap block of exactly its size: a read past the
** end of a file is then a heap overflow AddressSanitizer reports, where a real
** mapping would have returned the zeros of the last page. */
#define _GNU_SOURCE /* memmem */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model/convert_safetensors.h"
#include "common/error.h"
#include "model/json.h"

#define REQUIRE(c) do { if (!(c)) __builtin_trap(); } while (0)

#define SEP "\xffST\xff"
#define MAX_SHARDS 4
#define MAX_READ 65536 /* elements read back per tensor */

static char g_dir[] = "/tmp/tsr_fuzz_st_XXXXXX";
static volatile uint64_t g_sink;

/* ---- a mapping ASan can see the end of ------------------------------------- */

void *tsr_fuzz_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  (void)addr, (void)prot, (void)flags;
  void *p = malloc(len ? len : 1);
  if (!p) return MAP_FAILED;
  size_t got = 0;
  while (got < len) {
    ssize_t r = pread(fd, (char *)p + got, len - got, off + (off_t)got);
    if (r <= 0) {
      free(p);
      return MAP_FAILED;
    }
    got += (size_t)r;
  }
  return p;
}

int tsr_fuzz_munmap(void *addr, size_t len) {
  (void)len;
  free(addr);
  return 0;
}

/* ---- the directory ----------------------------------------------------------- */

static const char *const g_names[] = {
    "model.safetensors", "config.json", "model.safetensors.index.json",
    "model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
    "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors",
};
#define N_NAMES (sizeof g_names / sizeof g_names[0])

static void clear_dir(void) {
  char path[sizeof g_dir + 48];
  for (size_t i = 0; i < N_NAMES; i++) {
    snprintf(path, sizeof path, "%s/%s", g_dir, g_names[i]);
    unlink(path);
  }
}

static void remove_dir(void) {
  clear_dir();
  rmdir(g_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  if (!mkdtemp(g_dir)) abort();
  atexit(remove_dir);
  return 0;
}

static const char *write_file(const char *name, const uint8_t *data, size_t len) {
  static char path[sizeof g_dir + 48];
  snprintf(path, sizeof path, "%s/%s", g_dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  if (len && fwrite(data, 1, len, f) != len) abort();
  fclose(f);
  return path;
}

/* ---- safetensors --------------------------------------------------------------- */

static int readable_as_f32(const char *dtype) {
  return !strcmp(dtype, "F32") || !strcmp(dtype, "F16") || !strcmp(dtype, "BF16");
}

static void check_set(struct tsr_st_set *s) {
  int64_t n = tsr_st_count(s);
  REQUIRE(n >= 0 && tsr_st_at(s, n) == NULL && tsr_st_at(s, -1) == NULL);
  float *buf = malloc(MAX_READ * sizeof *buf);
  for (int64_t i = 0; i < n; i++) {
    const struct tsr_st_tensor *t = tsr_st_at(s, i);
    REQUIRE(t && t->name && t->name[0] && t->dtype && t->file);
    REQUIRE(tsr_st_find(s, t->name) == i); /* sorted, and each name once */
    if (i) REQUIRE(strcmp(tsr_st_at(s, i - 1)->name, t->name) < 0);
    REQUIRE(t->n_dims >= 0 && t->n_dims <= TSR_ST_MAX_DIMS && t->elem_size >= 1);
    int64_t el = 1;
    for (int d = 0; d < TSR_ST_MAX_DIMS; d++) {
      REQUIRE(t->shape[d] >= 0 && (d < t->n_dims || t->shape[d] == 1));
      el *= t->shape[d]; /* cannot overflow: the reader checked the product */
    }
    REQUIRE(el == t->n_elements && (size_t)el * t->elem_size == t->nbytes);
    /* every byte of the tensor lies in the file: ASan checks these reads */
    const unsigned char *p = t->data;
    if (t->nbytes) g_sink += p[0] + p[t->nbytes - 1];
    REQUIRE(tsr_st_read_f32(t, buf, t->n_elements + 1) == TSR_ERR_INVALID_ARG);
    if (t->n_elements > MAX_READ) continue;
    tsr_status st = tsr_st_read_f32(t, buf, t->n_elements);
    if (readable_as_f32(t->dtype)) REQUIRE(st == TSR_OK);
    else if (!strcmp(t->dtype, "I32") || !strcmp(t->dtype, "I64"))
      REQUIRE(st == TSR_OK || st == TSR_ERR_UNSUPPORTED);
    else
      REQUIRE(st == TSR_ERR_UNSUPPORTED);
  }
  free(buf);
}

static void open_dir(void) {
  struct tsr_st_set *s = (struct tsr_st_set *)1;
  tsr_error_clear();
  if (tsr_st_open_dir(g_dir, &s) != TSR_OK) {
    REQUIRE(s == NULL && tsr_error_message()[0]);
    return;
  }
  check_set(s);
  tsr_st_close(s);
}

/* Shards separated by SEP, named model-0000K-of-00004.safetensors. */
static void write_shards(const uint8_t *p, const uint8_t *end) {
  for (int k = 0; k < MAX_SHARDS && p <= end; k++) {
    const uint8_t *sep = k + 1 < MAX_SHARDS ? memmem(p, (size_t)(end - p), SEP, 4) : NULL;
    const uint8_t *stop = sep ? sep : end;
    write_file(g_names[3 + k], p, (size_t)(stop - p));
    if (!sep) break;
    p = sep + 4;
  }
}

/* ---- config.json ----------------------------------------------------------------- */

/* What the arch plugins and convert ask config.json for (misses included). */
static const char *const g_config_paths[] = {
    "model_type", "architectures.0", "num_hidden_layers", "hidden_size", "intermediate_size",
    "num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta", "rms_norm_eps",
    "vocab_size", "tie_word_embeddings", "sliding_window", "layer_types", "layer_types.3",
    "rope_parameters.rope_theta", "rope_parameters.full_attention.rope_theta",
    "text_config.model_type", "text_config.num_hidden_layers", "text_config.layer_types.0",
    "text_config.rope_parameters.sliding_attention.rope_theta", "num_experts",
    "num_experts_per_tok", "full_attention_interval", "mtp_num_hidden_layers",
    "", ".", "a..b", "0", "layer_types.999999999", "layer_types.-1", "layer_types.01",
};

static void read_path(const cJSON *root, const char *path) {
  int64_t i64, n;
  double f64;
  bool b;
  const char *s;
  g_sink += (uintptr_t)tsr_json_find(root, path);
  g_sink += tsr_json_i64(root, "config.json", path, &i64) + tsr_json_f64(root, "config.json", path, &f64) +
            tsr_json_bool(root, "config.json", path, &b) + tsr_json_str(root, "config.json", path, &s);
  if (tsr_json_arr_len(root, "config.json", path, &n) != TSR_OK) return;
  REQUIRE(n >= 0);
  for (int64_t k = -1; k <= n && k < 64; k++) {
    tsr_status st = tsr_json_arr_i64(root, "config.json", path, k, &i64);
    if (k < 0 || k == n) REQUIRE(st == TSR_ERR_FORMAT);
    g_sink += st + tsr_json_arr_f64(root, "config.json", path, k, &f64) +
              tsr_json_arr_str(root, "config.json", path, k, &s);
  }
}

/* Whether NAME can be written as one path component that names it alone. */
static int plain_key(const cJSON *parent, const cJSON *node) {
  const char *k = node->string;
  if (!k || !k[0] || strchr(k, '.')) return 0;
  for (const cJSON *c = parent->child; c != node; c = c->next) /* the first of equal keys wins */
    if (c->string && !strcmp(c->string, k)) return 0;
  return 1;
}

/* Every node: its dotted path finds it (where the path can name it), and every
** typed read of that path succeeds or fails cleanly. */
static void walk(const cJSON *root, const cJSON *node, char *path, size_t len, int exact,
                 int depth) {
  if (depth > 24) return;
  int k = 0;
  for (const cJSON *c = node->child; c; c = c->next, k++) {
    int n;
    if (cJSON_IsArray(node)) n = snprintf(path + len, 512 - len, "%s%d", len ? "." : "", k);
    else n = snprintf(path + len, 512 - len, "%s%s", len ? "." : "", c->string ? c->string : "");
    if (n < 0 || len + (size_t)n >= 512) continue;
    int ex = exact && (cJSON_IsArray(node) ? k < 1000000000 : plain_key(node, c));
    read_path(root, path);
    if (ex && !cJSON_IsNull(c)) REQUIRE(tsr_json_find(root, path) == c);
    if (cJSON_IsNull(c)) ex = 0; /* a null stops the walk: nothing under it is found */
    walk(root, c, path, len + (size_t)n, ex, depth + 1);
    path[len] = '\0';
  }
}

static void config(const uint8_t *data, size_t len) {
  const char *path = write_file("config.json", data, len);
  cJSON *root;
  tsr_error_clear();
  if (tsr_json_load(path, &root) != TSR_OK) {
    REQUIRE(root == NULL && tsr_error_message()[0]);
    return;
  }
  REQUIRE(root != NULL);
  REQUIRE(tsr_json_type_name(root) != NULL);
  for (size_t i = 0; i < sizeof g_config_paths / sizeof g_config_paths[0]; i++)
    read_path(root, g_config_paths[i]);
  char buf[512] = "";
  walk(root, root, buf, 0, 1, 0);
  cJSON_Delete(root);

  /* the same bytes from memory, as the tokenizer.json and header readers take them */
  if (tsr_json_parse((const char *)data, len, "memory", &root) == TSR_OK) cJSON_Delete(root);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const uint8_t *p = data + 1, *end = data + size;
  clear_dir();
  switch (data[0] % 4) {
  case 0:
    write_file("model.safetensors", p, (size_t)(end - p));
    open_dir();
    break;
  case 1:
    config(p, (size_t)(end - p));
    break;
  case 2: {
    const uint8_t *nul = memchr(p, 0, (size_t)(end - p));
    const uint8_t *stop = nul ? nul : end;
    write_file("model.safetensors.index.json", p, (size_t)(stop - p));
    if (nul) write_shards(nul + 1, end);
    open_dir();
    break;
  }
  case 3:
    write_shards(p, end);
    open_dir();
    break;
  }
  return 0;
}
