/*
** tessera convert, core side: config.json access, safetensors validation
** (a malformed-file corpus built here), sharded checkpoints, the
** unread-tensor check, --outtype storage and fallbacks, the core's keys, and
** the tokenizer metadata (hand-made tokenizers, plus the committed reference
** fixtures when their folder is given as argv[1]).
**
** Checkpoints are written by this file into a temporary folder: safetensors
** is an 8-byte header length, a JSON header and the data.
*/
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/convert.h"
#include "graph/dtype.h"
#include "common/error.h"
#include "model/gguf.h"
#include "harness.h"
#include "model/json.h"
#include "abi/plugin_host.h"

static char g_root[256];
static const char *g_fixtures; /* tests/reference/fixtures, or NULL */

/* ---- building checkpoints ------------------------------------------------ */

static void put(const char *dir, const char *name, const char *text) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  fputs(text, f);
  fclose(f);
}

/* A fresh folder under the test's root. */
static const char *folder(const char *name) {
  static char path[8][512];
  static int next;
  char *p = path[next++ % 8];
  snprintf(p, 512, "%s/%s", g_root, name);
  mkdir(p, 0755);
  return p;
}

/* Writes a safetensors file with a given header text and data bytes;
** hlen < 0 writes the header's true length. */
static void put_st_raw(const char *dir, const char *name, const char *header, long long hlen,
                       const void *data, size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  uint64_t len = hlen < 0 ? strlen(header) : (uint64_t)hlen;
  unsigned char le[8];
  for (int i = 0; i < 8; i++) le[i] = (unsigned char)(len >> (8 * i));
  fwrite(le, 1, 8, f);
  fputs(header, f);
  if (n) fwrite(data, 1, n, f);
  fclose(f);
}

struct st_entry {
  const char *name, *dtype;
  int n_dims;
  int64_t shape[4];
  const float *values; /* converted to the dtype */
};

/* A well-formed safetensors file holding the entries, data back to back. */
static void put_st(const char *dir, const char *name, const struct st_entry *e, int n) {
  char header[8192] = "{\"__metadata__\":{\"format\":\"pt\"}";
  size_t used = strlen(header), off = 0;
  unsigned char *data = malloc(1 << 20);
  for (int i = 0; i < n; i++) {
    int64_t count = 1;
    for (int d = 0; d < e[i].n_dims; d++) count *= e[i].shape[d];
    size_t es = !strcmp(e[i].dtype, "F32") ? 4 : 2;
    for (int64_t k = 0; k < count; k++) {
      float v = e[i].values[k];
      if (es == 4) memcpy(data + off + 4 * k, &v, 4);
      else {
        uint16_t h = !strcmp(e[i].dtype, "F16") ? tsr_f32_to_f16(v) : tsr_f32_to_bf16(v);
        memcpy(data + off + 2 * k, &h, 2);
      }
    }
    used += (size_t)snprintf(header + used, sizeof header - used,
                             ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", e[i].name, e[i].dtype);
    for (int d = 0; d < e[i].n_dims; d++)
      used += (size_t)snprintf(header + used, sizeof header - used, "%s%lld", d ? "," : "",
                               (long long)e[i].shape[d]);
    used += (size_t)snprintf(header + used, sizeof header - used,
                             "],\"data_offsets\":[%zu,%zu]}", off, off + es * (size_t)count);
    off += es * (size_t)count;
  }
  snprintf(header + used, sizeof header - used, "}");
  put_st_raw(dir, name, header, -1, data, off);
  free(data);
}

static const float g_vals[16] = {1, -2, 0.5f, 3, 0.25f, -1.5f, 8, 16,
                                 -0.125f, 2, 4, 6, -3, 1.75f, 0, 9};

/* A minimal checkpoint: config.json plus one model.safetensors. */
static const char *tiny_model(const char *name, const char *config) {
  const char *dir = folder(name);
  put(dir, "config.json", config);
  struct st_entry e[] = {
      {"model.a.weight", "F32", 2, {2, 4}, g_vals},
      {"model.b.weight", "BF16", 1, {4}, g_vals + 8},
  };
  put_st(dir, "model.safetensors", e, 2);
  return dir;
}

static bool contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

#define CHECK_ERR(expr, code, ...)                                                        \
  do {                                                                                    \
    tsr_status s_ = (expr);                                                               \
    CHECK_MSG(s_ == (code), "%s returned %d: %s", #expr, (int)s_, tsr_error_message());  \
    const char *needles_[] = {__VA_ARGS__};                                               \
    for (size_t i_ = 0; i_ < sizeof needles_ / sizeof needles_[0]; i_++)                  \
      CHECK_MSG(contains(tsr_error_message(), needles_[i_]), "message '%s' lacks '%s'",   \
                tsr_error_message(), needles_[i_]);                                       \
  } while (0)

static struct tsr_convert *open_cv(const char *dir, const char *out, enum tsr_dtype t) {
  struct tsr_convert_options o = {.hf_dir = dir, .out_path = out, .outtype = t};
  struct tsr_convert *cv = NULL;
  tsr_status st = tsr_convert_open(&o, &cv);
  CHECK_MSG(st == TSR_OK, "open %s: %s", dir, tsr_error_message());
  return cv;
}

/* ---- config.json ----------------------------------------------------------- */

static void test_config_values_by_dotted_path_with_strict_types(void) {
  const char *dir = tiny_model(
      "config", "{\"model_type\":\"toy\",\"n\":12,\"f\":12.5,\"big\":1e6,\"b\":true,\"s\":\"x\","
                "\"nul\":null,\"arr\":[1,2.5,\"a\"],\"text_config\":{\"num_hidden_layers\":4,"
                "\"rope_parameters\":{\"rope_theta\":1000000.0}}}");
  struct tsr_convert *cv = open_cv(dir, "/tmp/unused.gguf", TSR_F32);
  if (!cv) return;
  const struct tsr_host *h = tsr_plugin_host_services(); /* through the plugins' table */
  int64_t i = 0;
  double d = 0;
  bool b = false;
  const char *s = NULL;
  CHECK_OK(h->convert->hf_i64(cv, "n", &i));
  CHECK(i == 12);
  CHECK_OK(h->convert->hf_i64(cv, "text_config.num_hidden_layers", &i));
  CHECK(i == 4);
  CHECK_OK(h->convert->hf_f64(cv, "text_config.rope_parameters.rope_theta", &d));
  CHECK(d == 1e6);
  CHECK_OK(h->convert->hf_f64(cv, "n", &d)); /* an integer is a number */
  CHECK(d == 12.0);
  CHECK_ERR(h->convert->hf_i64(cv, "f", &i), TSR_ERR_FORMAT, "config.json", "'f'", "integer",
            "12.5");
  CHECK_ERR(h->convert->hf_i64(cv, "s", &i), TSR_ERR_FORMAT, "'s'", "string");
  CHECK_ERR(h->convert->hf_i64(cv, "text_config.nope", &i), TSR_ERR_FORMAT, "text_config.nope");
  CHECK_ERR(h->convert->hf_str(cv, "nul", &s), TSR_ERR_FORMAT, "'nul' is null");
  CHECK_ERR(h->convert->hf_bool(cv, "n", &b), TSR_ERR_FORMAT, "'n'", "number");
  CHECK_OK(h->convert->hf_bool(cv, "b", &b));
  CHECK(b);
  CHECK_OK(h->convert->hf_str(cv, "s", &s));
  CHECK(s && !strcmp(s, "x"));
  CHECK(h->convert->hf_has(cv, "text_config.rope_parameters") == 1);
  CHECK(h->convert->hf_has(cv, "nul") == 0); /* null reads as absent */
  CHECK(h->convert->hf_has(cv, "missing") == 0);
  CHECK_OK(h->convert->hf_arr_len(cv, "arr", &i));
  CHECK(i == 3);
  CHECK_OK(h->convert->hf_arr_i64(cv, "arr", 0, &i));
  CHECK(i == 1);
  CHECK_ERR(h->convert->hf_arr_i64(cv, "arr", 1, &i), TSR_ERR_FORMAT, "'arr'[1]", "2.5");
  CHECK_OK(h->convert->hf_arr_f64(cv, "arr", 1, &d));
  CHECK(d == 2.5);
  CHECK_OK(h->convert->hf_arr_str(cv, "arr", 2, &s));
  CHECK(s && !strcmp(s, "a"));
  CHECK_ERR(h->convert->hf_arr_str(cv, "arr", 3, &s), TSR_ERR_FORMAT, "3 elements");
  CHECK_ERR(h->convert->hf_arr_len(cv, "n", &i), TSR_ERR_FORMAT, "array");
  CHECK(!strcmp(tsr_convert_model_type(cv), "toy"));
  tsr_convert_free(cv);
}

static void test_config_that_is_not_json_names_line_and_column(void) {
  const char *dir = tiny_model("badconfig", "{\n  \"a\": 1,\n  \"b\": ]\n}");
  struct tsr_convert_options o = {.hf_dir = dir, .out_path = "/tmp/x.gguf", .outtype = TSR_F32};
  struct tsr_convert *cv = NULL;
  CHECK_ERR(tsr_convert_open(&o, &cv), TSR_ERR_FORMAT, "config.json", "line 3");
  CHECK(cv == NULL);
}

/* ---- safetensors --------------------------------------------------------- */

static void test_safetensors_reads_f32_f16_bf16_with_shapes(void) {
  const char *dir = folder("dtypes");
  put(dir, "config.json", "{\"model_type\":\"toy\"}");
  struct st_entry e[] = {
      {"x.f32", "F32", 3, {2, 2, 2}, g_vals},
      {"x.f16", "F16", 2, {4, 2}, g_vals},
      {"x.bf16", "BF16", 1, {8}, g_vals},
  };
  put_st(dir, "model.safetensors", e, 3);
  struct tsr_convert *cv = open_cv(dir, "/tmp/unused.gguf", TSR_F32);
  if (!cv) return;
  const struct tsr_host *h = tsr_plugin_host_services();
  CHECK(h->convert->hf_n_tensors(cv) == 3);
  CHECK(h->convert->hf_tensor_has(cv, "x.f16") && !h->convert->hf_tensor_has(cv, "x.f8"));
  int32_t nd = 0;
  int64_t shape[4];
  CHECK_OK(h->convert->hf_tensor_shape(cv, "x.f16", &nd, shape));
  CHECK(nd == 2 && shape[0] == 4 && shape[1] == 2 && shape[2] == 1);
  float out[8];
  const char *names[] = {"x.f32", "x.f16", "x.bf16"};
  for (int k = 0; k < 3; k++) {
    CHECK_OK(h->convert->hf_tensor_read(cv, names[k], out, 8));
    for (int i = 0; i < 8; i++) CHECK(out[i] == g_vals[i]); /* all exact in 8 bits of mantissa */
  }
  CHECK_ERR(h->convert->hf_tensor_read(cv, "x.f32", out, 7), TSR_ERR_INVALID_ARG, "x.f32",
            "8 elements");
  CHECK_ERR(h->convert->hf_tensor_read(cv, "nope", out, 8), TSR_ERR_FORMAT, "nope");
  tsr_convert_free(cv);
}

struct bad_case {
  const char *what;
  const char *header;
  long long hlen;   /* -1: true length */
  size_t data;      /* data bytes after the header */
  const char *needle;
};

/* The malformed corpus: every case must fail cleanly, naming the file and
** what is wrong (and the tensor, where there is one). */
static void test_malformed_safetensors_are_clear_errors(void) {
  static const struct bad_case cases[] = {
      {"header length past the end", "{}", 1000, 0, "header length 1000"},
      {"header length overflowing", "{}", 0x7fffffffffffffffLL, 0, "does not fit"},
      {"header not JSON", "{\"a\":", -1, 0, "not valid JSON"},
      {"header an array", "[1,2]", -1, 0, "not an object"},
      {"offsets past EOF", "{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", -1,
       8, "'t'"},
      {"unknown dtype", "{\"t\":{\"dtype\":\"F7\",\"shape\":[1],\"data_offsets\":[0,1]}}", -1, 1,
       "unknown dtype"},
      {"shape x dtype != span", "{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}",
       -1, 8, "span 8"},
      {"overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", -1, 12,
       "overlap"},
      {"overlap hidden behind an empty tensor",
       "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
       "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
       "\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", -1, 16, "overlap"},
      {"negative dim", "{\"t\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", -1, 0,
       "shape[0]"},
      {"fractional dim", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", -1,
       4, "shape[0]"},
      {"offsets reversed", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", -1,
       8, "data_offsets"},
      {"offsets not numbers",
       "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[\"0\",4]}}", -1, 4,
       "data_offsets"},
      {"no dtype", "{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4, "dtype"},
      {"entry not an object", "{\"t\":7}", -1, 0, "not an object"},
      {"element count overflows",
       "{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", -1,
       4, "overflows"},
      {"bytes overflow", "{\"t\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],"
                         "\"data_offsets\":[0,8]}}", -1, 8, "'t'"},
      {"too many dims", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                        "\"data_offsets\":[0,4]}}", -1, 4, "dimensions"},
      {"same name twice", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                          "\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", -1,
       8, "twice"},
      {"empty name", "{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4,
       "empty name"},
      {"trailing garbage", "{} x", -1, 0, "after the JSON"},
  };
  static const unsigned char zeros[64];
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    char name[32];
    snprintf(name, sizeof name, "bad%02zu", c);
    const char *dir = folder(name);
    put(dir, "config.json", "{\"model_type\":\"toy\"}");
    put_st_raw(dir, "model.safetensors", cases[c].header, cases[c].hlen, zeros, cases[c].data);
    struct tsr_convert_options o = {.hf_dir = dir, .out_path = "/tmp/x.gguf", .outtype = TSR_F32};
    struct tsr_convert *cv = NULL;
    tsr_status st = tsr_convert_open(&o, &cv);
    CHECK_MSG(st == TSR_ERR_FORMAT, "%s: status %d (%s)", cases[c].what, (int)st,
              tsr_error_message());
    CHECK_MSG(contains(tsr_error_message(), "model.safetensors") &&
                  contains(tsr_error_message(), cases[c].needle),
              "%s: message '%s' lacks the file or '%s'", cases[c].what, tsr_error_message(),
              cases[c].needle);
    tsr_convert_free(cv);
  }
  /* shorter than the 8-byte length itself */
  const char *dir = folder("bad_short");
  put(dir, "config.json", "{\"model_type\":\"toy\"}");
  put(dir, "model.safetensors", "abc");
  struct tsr_convert_options o = {.hf_dir = dir, .out_path = "/tmp/x.gguf", .outtype = TSR_F32};
  struct tsr_convert *cv = NULL;
  CHECK_ERR(tsr_convert_open(&o, &cv), TSR_ERR_FORMAT, "model.safetensors", "too short");
}

/* Integer index tables (a token ordering) read as exact floats; a value f32
** cannot hold exactly and a dtype with no reading are refused by name. */
static void test_index_tables_read_and_other_dtypes_refuse_reading(void) {
  const char *dir = folder("i64");
  put(dir, "config.json", "{\"model_type\":\"toy\"}");
  const int64_t vals[4] = {7, -3, 1 << 24, (1 << 24) + 1};
  const int32_t vals32[2] = {5, -9};
  unsigned char raw[48];
  memcpy(raw, vals, 32);
  memcpy(raw + 32, vals32, 8);
  memset(raw + 40, 0, 8);
  put_st_raw(dir, "model.safetensors",
             "{\"pos\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[0,24]},"
             "\"big\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[24,32]},"
             "\"ids\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[32,40]},"
             "\"u8\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[40,48]}}",
             -1, raw, 48);
  struct tsr_convert *cv = open_cv(dir, "/tmp/unused.gguf", TSR_F32);
  if (!cv) return;
  float out[8];
  CHECK_OK(tsr_convert_hf_tensor_read(cv, "pos", out, 3));
  CHECK(out[0] == 7.0f && out[1] == -3.0f && out[2] == 16777216.0f);
  CHECK_OK(tsr_convert_hf_tensor_read(cv, "ids", out, 2));
  CHECK(out[0] == 5.0f && out[1] == -9.0f);
  CHECK_ERR(tsr_convert_hf_tensor_read(cv, "big", out, 1), TSR_ERR_UNSUPPORTED, "'big'", "16777217");
  CHECK_ERR(tsr_convert_hf_tensor_read(cv, "u8", out, 8), TSR_ERR_UNSUPPORTED, "'u8'", "U8",
            "model.safetensors");
  tsr_convert_free(cv);
}

static void test_missing_checkpoint_is_named(void) {
  const char *dir = folder("empty");
  put(dir, "config.json", "{\"model_type\":\"toy\"}");
  struct tsr_convert_options o = {.hf_dir = dir, .out_path = "/tmp/x.gguf", .outtype = TSR_F32};
  struct tsr_convert *cv = NULL;
  CHECK_ERR(tsr_convert_open(&o, &cv), TSR_ERR_IO, "model.safetensors");
}

/* ---- shards -------------------------------------------------------------- */

static const char *two_shards(const char *name, const char *index) {
  const char *dir = folder(name);
  put(dir, "config.json", "{\"model_type\":\"toy\"}");
  struct st_entry a[] = {{"a.weight", "F32", 1, {4}, g_vals}};
  struct st_entry b[] = {{"b.weight", "BF16", 2, {2, 2}, g_vals + 4},
                         {"c.weight", "F16", 1, {3}, g_vals + 8}};
  put_st(dir, "model-00001-of-00002.safetensors", a, 1);
  put_st(dir, "model-00002-of-00002.safetensors", b, 2);
  if (index) put(dir, "model.safetensors.index.json", index);
  return dir;
}

static void test_sharded_checkpoints_with_and_without_index(void) {
  const char *good = "{\"metadata\":{},\"weight_map\":{\"a.weight\":\"model-00001-of-00002."
                     "safetensors\",\"b.weight\":\"model-00002-of-00002.safetensors\",\"c.weight\":"
                     "\"model-00002-of-00002.safetensors\"}}";
  const char *dirs[] = {two_shards("shard_index", good), two_shards("shard_glob", NULL)};
  for (int k = 0; k < 2; k++) {
    struct tsr_convert *cv = open_cv(dirs[k], "/tmp/unused.gguf", TSR_F32);
    if (!cv) continue;
    CHECK(tsr_convert_hf_n_tensors(cv) == 3);
    float out[4];
    CHECK_OK(tsr_convert_hf_tensor_read(cv, "a.weight", out, 4));
    CHECK(out[3] == g_vals[3]);
    CHECK_OK(tsr_convert_hf_tensor_read(cv, "c.weight", out, 3));
    CHECK(out[2] == g_vals[10]);
    tsr_convert_free(cv);
  }
  struct {
    const char *index, *needle;
  } bad[] = {
      {"{\"weight_map\":{\"a.weight\":\"model-00001-of-00002.safetensors\",\"b.weight\":"
       "\"model-00002-of-00002.safetensors\"}}", "does not list"},
      {"{\"weight_map\":{\"a.weight\":\"model-00001-of-00002.safetensors\",\"b.weight\":"
       "\"model-00002-of-00002.safetensors\",\"c.weight\":\"model-00002-of-00002.safetensors\","
       "\"d.weight\":\"model-00002-of-00002.safetensors\"}}", "'d.weight'"},
      {"{\"weight_map\":{\"a.weight\":\"model-00002-of-00002.safetensors\",\"b.weight\":"
       "\"model-00002-of-00002.safetensors\",\"c.weight\":\"model-00002-of-00002.safetensors\"}}",
       "does not hold"},
      {"{\"weight_map\":{\"a.weight\":\"../model-00001-of-00002.safetensors\"}}",
       "not a file name"},
      {"{\"weight_map\":[]}", "weight_map"},
      {"{\"weight_map\":{\"a.weight\":\"model-00003-of-00002.safetensors\"}}", "cannot open"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char name[32];
    snprintf(name, sizeof name, "shard_bad%zu", i);
    const char *dir = two_shards(name, bad[i].index);
    struct tsr_convert_options o = {.hf_dir = dir, .out_path = "/tmp/x.gguf", .outtype = TSR_F32};
    struct tsr_convert *cv = NULL;
    tsr_status st = tsr_convert_open(&o, &cv);
    CHECK_MSG(st != TSR_OK && contains(tsr_error_message(), bad[i].needle),
              "bad index %zu: status %d, '%s' lacks '%s'", i, (int)st, tsr_error_message(),
              bad[i].needle);
    tsr_convert_free(cv);
  }
  /* one tensor in two shards */
  const char *dir = folder("shard_dup");
  put(dir, "config.json", "{\"model_type\":\"toy\"}");
  struct st_entry a[] = {{"a.weight", "F32", 1, {4}, g_vals}};
  put_st(dir, "model-00001-of-00002.safetensors", a, 1);
  put_st(dir, "model-00002-of-00002.safetensors", a, 1);
  struct tsr_convert_options o = {.hf_dir = dir, .out_path = "/tmp/x.gguf", .outtype = TSR_F32};
  struct tsr_convert *cv = NULL;
  CHECK_ERR(tsr_convert_open(&o, &cv), TSR_ERR_FORMAT, "'a.weight' appears twice");
}

/* ---- conversion through a stand-in arch plugin ----------------------------- */

typedef tsr_status (*convert_fn)(const struct tsr_host *h, struct tsr_convert *cv);

static tsr_status trampoline(void *ctx, const struct tsr_host *h, struct tsr_convert *cv) {
  return ((convert_fn)ctx)(h, cv);
}

static tsr_status run_fake_with(const struct tsr_convert_options *o, convert_fn fn,
                                struct tsr_convert_stats *stats) {
  struct tsr_convert *cv = NULL;
  tsr_status st = tsr_convert_open(o, &cv);
  if (st != TSR_OK) return st;
  struct tsr_convert_v1 converter = {.struct_size = sizeof converter, .hf_types = "toy",
                                     .convert = trampoline};
  converter.ctx = (void *)fn;
  st = tsr_convert_with(cv, &converter, "fake_converter");
  if (st == TSR_OK) st = tsr_convert_finish(cv, stats);
  tsr_convert_free(cv);
  return st;
}

static tsr_status run_fake(const char *dir, const char *out, enum tsr_dtype t, convert_fn fn,
                           struct tsr_convert_stats *stats) {
  struct tsr_convert_options o = {.hf_dir = dir, .out_path = out, .outtype = t};
  return run_fake_with(&o, fn, stats);
}

static tsr_status convert_reads_a_only(const struct tsr_host *h, struct tsr_convert *cv) {
  float v[8];
  tsr_status st = h->convert->out_str(cv, "general.architecture", "toy");
  if (st == TSR_OK) st = h->convert->hf_tensor_read(cv, "model.a.weight", v, 8);
  int64_t ne[2] = {4, 2};
  if (st == TSR_OK) st = h->convert->out_tensor(cv, "a.weight", false, 2, ne, v);
  return st;
}

static tsr_status convert_skips_b(const struct tsr_host *h, struct tsr_convert *cv) {
  h->convert->hf_skip_prefix(cv, "model.b.");
  return convert_reads_a_only(h, cv);
}

static void test_tensors_neither_read_nor_skipped_fail_the_conversion(void) {
  const char *dir = tiny_model("unread", "{\"model_type\":\"toy\"}");
  char out[512];
  snprintf(out, sizeof out, "%s/out.gguf", dir);
  CHECK_ERR(run_fake(dir, out, TSR_F32, convert_reads_a_only, NULL), TSR_ERR_UNSUPPORTED,
            "model.b.weight", "fake_converter", "1 checkpoint tensor");
  CHECK(access(out, F_OK) != 0); /* nothing written */
  CHECK_OK(run_fake(dir, out, TSR_F32, convert_skips_b, NULL));
  struct tsr_gguf *g = NULL;
  CHECK_OK(tsr_gguf_open(out, &g));
  if (!g) return;
  const struct tsr_gguf_tensor *t = tsr_gguf_find_tensor(g, "a.weight");
  CHECK(t && t->dtype == TSR_F32 && t->ne[0] == 4 && t->ne[1] == 2);
  if (t) CHECK(memcmp(t->data, g_vals, 32) == 0);
  const char *s = NULL;
  CHECK_OK(tsr_gguf_get_str(g, "general.name", &s));
  CHECK(s && !strcmp(s, "unread"));
  tsr_gguf_close(g);
}

/* Rows of 512 (every type fits), 96 (not a k-quant block), 50 (no block). */
static tsr_status convert_three_widths(const struct tsr_host *h, struct tsr_convert *cv) {
  static float data[512 * 2];
  for (int i = 0; i < 512 * 2; i++) data[i] = sinf((float)i * 0.37f) * 2.0f;
  tsr_status st = h->convert->out_str(cv, "general.architecture", "toy");
  int64_t w512[2] = {512, 2}, w96[2] = {96, 3}, w50[2] = {50, 4}, n[1] = {7};
  float v[8];
  if (st == TSR_OK) st = h->convert->hf_tensor_read(cv, "model.a.weight", v, 8);
  if (st == TSR_OK) st = h->convert->hf_tensor_read(cv, "model.b.weight", v, 4);
  if (st == TSR_OK) st = h->convert->out_tensor(cv, "w512", true, 2, w512, data);
  if (st == TSR_OK) st = h->convert->out_tensor(cv, "w96", true, 2, w96, data);
  if (st == TSR_OK) st = h->convert->out_tensor(cv, "w50", true, 2, w50, data);
  if (st == TSR_OK) st = h->convert->out_tensor(cv, "norm", false, 1, n, data);
  return st;
}

static void check_types(const char *out, enum tsr_dtype a, enum tsr_dtype b, enum tsr_dtype c,
                        uint32_t file_type) {
  struct tsr_gguf *g = NULL;
  CHECK_OK(tsr_gguf_open(out, &g));
  if (!g) return;
  const struct tsr_gguf_tensor *t512 = tsr_gguf_find_tensor(g, "w512");
  const struct tsr_gguf_tensor *t96 = tsr_gguf_find_tensor(g, "w96");
  const struct tsr_gguf_tensor *t50 = tsr_gguf_find_tensor(g, "w50");
  const struct tsr_gguf_tensor *tn = tsr_gguf_find_tensor(g, "norm");
  CHECK(t512 && t96 && t50 && tn);
  if (t512 && t96 && t50 && tn) {
    CHECK_MSG(t512->dtype == a, "w512 is %s", tsr_dtype_name(t512->dtype));
    CHECK_MSG(t96->dtype == b, "w96 is %s", tsr_dtype_name(t96->dtype));
    CHECK_MSG(t50->dtype == c, "w50 is %s", tsr_dtype_name(t50->dtype));
    CHECK(tn->dtype == TSR_F32 && tn->ne[0] == 7);
    /* the stored values decode back close to the data */
    float back[1024];
    CHECK_OK(tsr_dtype_to_f32(t512->dtype, t512->data, back, 1024));
    double worst = 0;
    for (int i = 0; i < 1024; i++)
      worst = fmax(worst, fabs(back[i] - sinf((float)i * 0.37f) * 2.0f));
    CHECK_MSG(worst < 0.35, "w512 max error %g", worst);
  }
  uint32_t ft = 99, qv = 0;
  CHECK_OK(tsr_gguf_get_u32(g, "general.file_type", &ft));
  CHECK(ft == file_type);
  CHECK_OK(tsr_gguf_get_u32(g, "general.quantization_version", &qv));
  CHECK(qv == 2);
  tsr_gguf_close(g);
}

static void test_outtype_storage_and_row_length_fallbacks(void) {
  const char *dir = tiny_model("outtype", "{\"model_type\":\"toy\"}");
  char out[512];
  snprintf(out, sizeof out, "%s/out.gguf", dir);
  struct tsr_convert_stats s;
  CHECK_OK(run_fake(dir, out, TSR_Q4_K, convert_three_widths, &s));
  check_types(out, TSR_Q4_K, TSR_Q8_0, TSR_F16, 14);
  CHECK(s.n_fallback == 2 && s.n_tensors == 4 && s.n_params == 1024 + 288 + 200 + 7);
  CHECK(s.n_by_dtype[TSR_Q4_K] == 1 && s.n_by_dtype[TSR_F32] == 1);
  CHECK_OK(run_fake(dir, out, TSR_Q6_K, convert_three_widths, &s));
  check_types(out, TSR_Q6_K, TSR_Q8_0, TSR_F16, 18);
  CHECK_OK(run_fake(dir, out, TSR_Q8_0, convert_three_widths, &s));
  check_types(out, TSR_Q8_0, TSR_Q8_0, TSR_F16, 7);
  CHECK(s.n_fallback == 1);
  CHECK_OK(run_fake(dir, out, TSR_BF16, convert_three_widths, &s));
  check_types(out, TSR_BF16, TSR_BF16, TSR_BF16, 32);
  CHECK(s.n_fallback == 0);
  CHECK_OK(run_fake(dir, out, TSR_F32, convert_three_widths, &s));
  check_types(out, TSR_F32, TSR_F32, TSR_F32, 0);
  CHECK(tsr_convert_outtype_parse("q5_k") == TSR_Q5_K && tsr_convert_outtype_parse("q2_K") < 0);
  CHECK(tsr_convert_file_type(TSR_Q5_K) == 16 && tsr_convert_file_type(TSR_F16) == 1 &&
        tsr_convert_file_type(TSR_Q4_0) == 2);
}

static tsr_status convert_with_embedding(const struct tsr_host *h, struct tsr_convert *cv) {
  static float data[512 * 2];
  for (int i = 0; i < 512 * 2; i++) data[i] = cosf((float)i * 0.11f);
  h->convert->hf_skip_prefix(cv, "model.");
  int64_t ne[2] = {512, 2};
  tsr_status st = h->convert->out_str(cv, "general.architecture", "toy");
  /* kept unquantized by the plugin: the asked-for type applies all the same */
  if (st == TSR_OK) st = h->convert->out_tensor(cv, "token_embd.weight", false, 2, ne, data);
  return st == TSR_OK ? h->convert->out_tensor(cv, "blk.0.w.weight", true, 2, ne, data) : st;
}

static void test_token_embedding_type_overrides_one_tensor(void) {
  const char *dir = tiny_model("embd_type", "{\"model_type\":\"toy\"}");
  char out[512];
  snprintf(out, sizeof out, "%s/out.gguf", dir);
  struct tsr_convert_options o = {.hf_dir = dir, .out_path = out, .outtype = TSR_Q4_K,
                                  .token_embd_set = true, .token_embd_type = TSR_F16};
  struct tsr_convert_stats s;
  CHECK_OK(run_fake_with(&o, convert_with_embedding, &s));
  CHECK(s.n_fallback == 0 && s.n_by_dtype[TSR_F16] == 1 && s.n_by_dtype[TSR_Q4_K] == 1);
  struct tsr_gguf *g = NULL;
  CHECK_OK(tsr_gguf_open(out, &g));
  if (g) {
    const struct tsr_gguf_tensor *e = tsr_gguf_find_tensor(g, "token_embd.weight");
    const struct tsr_gguf_tensor *w = tsr_gguf_find_tensor(g, "blk.0.w.weight");
    CHECK(e && e->dtype == TSR_F16 && w && w->dtype == TSR_Q4_K);
    uint32_t ft = 0;
    CHECK_OK(tsr_gguf_get_u32(g, "general.file_type", &ft));
    CHECK(ft == 14); /* still the outtype's */
    tsr_gguf_close(g);
  }
  /* asked for, but the model has no token_embd.weight: an error, not a silent no-op */
  o.outtype = TSR_Q8_0;
  CHECK_ERR(run_fake_with(&o, convert_three_widths, &s), TSR_ERR_INVALID_ARG, "token_embd.weight");
  /* a type the converter cannot write */
  o.token_embd_type = TSR_I32;
  CHECK_ERR(run_fake_with(&o, convert_with_embedding, &s), TSR_ERR_INVALID_ARG,
            "token embedding type");
}

static tsr_status convert_sets_name(const struct tsr_host *h, struct tsr_convert *cv) {
  tsr_status st = h->convert->out_str(cv, "general.architecture", "toy");
  return st == TSR_OK ? h->convert->out_str(cv, "general.name", "mine") : st;
}
static tsr_status convert_twice(const struct tsr_host *h, struct tsr_convert *cv) {
  h->convert->hf_skip_prefix(cv, "model.");
  float v[4] = {0};
  int64_t ne[1] = {4};
  tsr_status st = h->convert->out_str(cv, "general.architecture", "toy");
  if (st == TSR_OK) st = h->convert->out_tensor(cv, "t", false, 1, ne, v);
  return st == TSR_OK ? h->convert->out_tensor(cv, "t", false, 1, ne, v) : st;
}
static tsr_status convert_no_arch(const struct tsr_host *h, struct tsr_convert *cv) {
  h->convert->hf_skip_prefix(cv, "");
  return TSR_OK;
}
static tsr_status convert_bad_dims(const struct tsr_host *h, struct tsr_convert *cv) {
  float v[4] = {0};
  int64_t ne[2] = {4, 0};
  return h->convert->out_tensor(cv, "t", false, 2, ne, v);
}

static void test_plugin_mistakes_are_refused_by_name(void) {
  const char *dir = tiny_model("mistakes", "{\"model_type\":\"toy\"}");
  char out[512];
  snprintf(out, sizeof out, "%s/out.gguf", dir);
  CHECK_ERR(run_fake(dir, out, TSR_F16, convert_sets_name, NULL), TSR_ERR_INVALID_ARG,
            "general.name", "fake_converter");
  CHECK_ERR(run_fake(dir, out, TSR_F16, convert_twice, NULL), TSR_ERR_INVALID_ARG, "'t'", "twice");
  CHECK_ERR(run_fake(dir, out, TSR_F16, convert_no_arch, NULL), TSR_ERR_INTERNAL,
            "general.architecture");
  CHECK_ERR(run_fake(dir, out, TSR_F16, convert_bad_dims, NULL), TSR_ERR_INVALID_ARG, "'t'",
            "dimension 1");
}

static void test_unknown_model_type_names_it_and_the_known_ones(void) {
  const char *dir = tiny_model("unknown", "{\"model_type\":\"no_such_model\"}");
  char out[512];
  snprintf(out, sizeof out, "%s/out.gguf", dir);
  struct tsr_plugin_host *h = NULL;
  CHECK_OK(tsr_plugin_host_new(&h));
  if (!h) return;
  struct tsr_convert_options o = {.hf_dir = dir, .out_path = out, .outtype = TSR_F16};
  CHECK_ERR(tsr_convert_run(h, &o, NULL), TSR_ERR_UNSUPPORTED, "'no_such_model'", "known");
  tsr_plugin_host_free(h);
  const char *none = tiny_model("no_type", "{\"hidden_size\":8}");
  CHECK_OK(tsr_plugin_host_new(&h));
  o.hf_dir = none;
  CHECK_ERR(tsr_convert_run(h, &o, NULL), TSR_ERR_FORMAT, "model_type");
  tsr_plugin_host_free(h);
}

/* ---- tokenizer --------------------------------------------------------- */

static const char *g_pre;
static tsr_status convert_tokenizer_only(const struct tsr_host *h, struct tsr_convert *cv) {
  h->convert->hf_skip_prefix(cv, "");
  tsr_status st = h->convert->out_str(cv, "general.architecture", "toy");
  return st == TSR_OK ? h->convert->tokenizer(cv, g_pre) : st;
}

/* Converts dir's tokenizer alone and opens the result. */
static struct tsr_gguf *tokenizer_gguf(const char *dir, const char *pre) {
  char out[512];
  snprintf(out, sizeof out, "%s/%s/tok.gguf", g_root, strrchr(dir, '/') + 1);
  char sub[512];
  snprintf(sub, sizeof sub, "%s/%s", g_root, strrchr(dir, '/') + 1);
  mkdir(sub, 0755);
  g_pre = pre;
  tsr_status st = run_fake(dir, out, TSR_F32, convert_tokenizer_only, NULL);
  CHECK_MSG(st == TSR_OK, "tokenizer of %s: %s", dir, tsr_error_message());
  struct tsr_gguf *g = NULL;
  if (st == TSR_OK) CHECK_OK(tsr_gguf_open(out, &g));
  return g;
}

static const char *token(const struct tsr_gguf *g, int64_t i) {
  const struct tsr_gguf_kv *kv = NULL;
  struct tsr_gguf_str s = {0};
  if (tsr_gguf_get_arr(g, "tokenizer.ggml.tokens", TSR_GGUF_STRING, &kv) != TSR_OK ||
      tsr_gguf_arr_str(g, kv, (uint64_t)i, &s) != TSR_OK)
    return "";
  return s.ptr;
}
static int64_t arr_i64(const struct tsr_gguf *g, const char *key, int64_t i) {
  const struct tsr_gguf_kv *kv = NULL;
  int64_t v = -999;
  if (tsr_gguf_get_arr(g, key, TSR_GGUF_TYPE_COUNT, &kv) == TSR_OK)
    tsr_gguf_arr_i64(g, kv, (uint64_t)i, &v);
  return v;
}
static int64_t arr_len(const struct tsr_gguf *g, const char *key) {
  const struct tsr_gguf_kv *kv = NULL;
  return tsr_gguf_get_arr(g, key, TSR_GGUF_TYPE_COUNT, &kv) == TSR_OK ? (int64_t)kv->n : -1;
}
static int64_t u32_or(const struct tsr_gguf *g, const char *key, int64_t dflt) {
  uint32_t v;
  return tsr_gguf_get_u32(g, key, &v) == TSR_OK ? v : dflt;
}
static int bool_or(const struct tsr_gguf *g, const char *key, int dflt) {
  int v;
  return tsr_gguf_get_bool(g, key, &v) == TSR_OK ? v : dflt;
}
static const char *str_or(const struct tsr_gguf *g, const char *key) {
  const char *s;
  return tsr_gguf_get_str(g, key, &s) == TSR_OK ? s : "";
}

/* tokenizer.json text of a byte-level BPE: the 256 byte-level characters at
** ids 0..255 (GPT-2's map: printable bytes stand for themselves, the others
** for U+0100 on), then extra_vocab's entries, added_tokens and merges. */
static const char *byte_level_tokenizer(const char *added, const char *extra_vocab,
                                        const char *merges) {
  static char text[8192];
  size_t o = (size_t)snprintf(text, sizeof text, "{\"added_tokens\":[%s],\"post_processor\":null,"
                              "\"model\":{\"type\":\"BPE\",\"vocab\":{", added);
  unsigned next = 256;
  for (unsigned b = 0; b < 256; b++) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    unsigned cp = printable ? b : next++;
    char ch[8];
    if (cp == '"' || cp == '\\') snprintf(ch, sizeof ch, "\\%c", (char)cp);
    else if (cp < 0x80) snprintf(ch, sizeof ch, "%c", (char)cp);
    else snprintf(ch, sizeof ch, "%c%c", (char)(0xC0 | (cp >> 6)), (char)(0x80 | (cp & 0x3F)));
    o += (size_t)snprintf(text + o, sizeof text - o, "%s\"%s\":%u", b ? "," : "", ch, b);
  }
  snprintf(text + o, sizeof text - o, "%s%s},\"merges\":[%s]}}", *extra_vocab ? "," : "",
           extra_vocab, merges);
  return text;
}

static void test_byte_level_bpe_tokenizer_metadata(void) {
  const char *dir = tiny_model("tok_gpt2", "{\"model_type\":\"toy\",\"vocab_size\":264,"
                                           "\"bos_token_id\":261}");
  put(dir, "tokenizer.json",
      byte_level_tokenizer("{\"id\":260,\"content\":\"<|end|>\",\"special\":true},"
                           "{\"id\":261,\"content\":\"<|im|>\",\"special\":false},"
                           "{\"id\":262,\"content\":\"\xe2\x96\x81hi\",\"special\":false}",
                           "\"ab\":256,\"abc\":257,\"a\xc4\xa0" "b\":258,\"a\xc4\xa0" "bc\":259",
                           "[\"a\",\"b\"],[\"ab\",\"c\"],[\"a b\",\"c\"]"));
  put(dir, "tokenizer_config.json",
      "{\"eos_token\":\"<|end|>\",\"pad_token\":{\"content\":\"<|end|>\"},"
      "\"add_bos_token\":false,\"chat_template\":\"{{x}}\"}");
  struct tsr_gguf *g = tokenizer_gguf(dir, "qwen2");
  if (!g) return;
  CHECK(!strcmp(str_or(g, "tokenizer.ggml.model"), "gpt2"));
  CHECK(!strcmp(str_or(g, "tokenizer.ggml.pre"), "qwen2"));
  CHECK(arr_len(g, "tokenizer.ggml.tokens") == 264);
  CHECK(!strcmp(token(g, 256), "ab") && !strcmp(token(g, 263), "[PAD263]"));
  CHECK(!strcmp(token(g, 262), " hi")); /* user-defined ▁ becomes a space */
  CHECK(arr_i64(g, "tokenizer.ggml.token_type", 0) == 1);
  CHECK(arr_i64(g, "tokenizer.ggml.token_type", 260) == 3); /* special */
  CHECK(arr_i64(g, "tokenizer.ggml.token_type", 261) == 3); /* looks special: <|...|> */
  CHECK(arr_i64(g, "tokenizer.ggml.token_type", 262) == 4);
  CHECK(arr_i64(g, "tokenizer.ggml.token_type", 263) == 5);
  CHECK(arr_len(g, "tokenizer.ggml.scores") == -1);
  CHECK(arr_len(g, "tokenizer.ggml.merges") == 3);
  const struct tsr_gguf_kv *kv = NULL;
  struct tsr_gguf_str m = {0};
  CHECK_OK(tsr_gguf_get_arr(g, "tokenizer.ggml.merges", TSR_GGUF_STRING, &kv));
  if (kv) {
    CHECK_OK(tsr_gguf_arr_str(g, kv, 0, &m));
    CHECK(m.ptr && !strcmp(m.ptr, "a b"));
    CHECK_OK(tsr_gguf_arr_str(g, kv, 2, &m));
    CHECK(m.ptr && !strcmp(m.ptr, "a\xc4\xa0" "b c")); /* space inside a part: U+0120 */
  }
  CHECK(u32_or(g, "tokenizer.ggml.eos_token_id", -1) == 260);
  CHECK(u32_or(g, "tokenizer.ggml.padding_token_id", -1) == 260);
  CHECK(u32_or(g, "tokenizer.ggml.bos_token_id", -1) == 261); /* from config.json */
  CHECK(u32_or(g, "tokenizer.ggml.unknown_token_id", -1) == -1);
  CHECK(bool_or(g, "tokenizer.ggml.add_bos_token", -1) == 0);
  CHECK(bool_or(g, "tokenizer.ggml.add_eos_token", -1) == -1);
  CHECK(!strcmp(str_or(g, "tokenizer.chat_template"), "{{x}}"));
  tsr_gguf_close(g);

  /* an id at or past vocab_size is an error naming it */
  const char *bad = tiny_model("tok_bad", "{\"model_type\":\"toy\",\"vocab_size\":2}");
  put(bad, "tokenizer.json",
      "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":5},\"merges\":[]}}");
  char out[512];
  snprintf(out, sizeof out, "%s/tok.gguf", bad);
  g_pre = "qwen2";
  CHECK_ERR(run_fake(bad, out, TSR_F32, convert_tokenizer_only, NULL), TSR_ERR_FORMAT,
            "tokenizer.json", "vocab_size");
  put(bad, "tokenizer.json", "{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}");
  CHECK_ERR(run_fake(bad, out, TSR_F32, convert_tokenizer_only, NULL), TSR_ERR_UNSUPPORTED,
            "Unigram");
}

/* A SentencePiece-style vocabulary (Gemma 4's kind): every byte needs its
** <0xXX> piece, or an unknown token that stands in for the missing ones. */
static void test_sentencepiece_bytes_need_a_piece_or_an_unknown_token(void) {
  static char vocab[8192];
  size_t o = (size_t)snprintf(vocab, sizeof vocab, "\"<pad>\":0,\"<eos>\":1,\"<bos>\":2,"
                                                   "\"<unk>\":3");
  for (int b = 0; b < 256; b++)
    o += (size_t)snprintf(vocab + o, sizeof vocab - o, ",\"<0x%02X>\":%d",
                          b == 0x41 ? 0x141 : b, 4 + b); /* <0x41> is <0x141>: no piece */
  snprintf(vocab + o, sizeof vocab - o, ",\"\xe2\x96\x81\":260,\"a\":261,\"\xe2\x96\x81" "a\":262");
  static char tj[9000];
  snprintf(tj, sizeof tj, "{\"added_tokens\":[],\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,"
           "\"vocab\":{%s},\"merges\":[[\"\xe2\x96\x81\",\"a\"]]}}", vocab);
  const char *with_unk = tiny_model("tok_spm_unk", "{\"model_type\":\"toy\",\"vocab_size\":263,"
                                                   "\"unk_token_id\":3}");
  put(with_unk, "tokenizer.json", tj);
  struct tsr_gguf *g = tokenizer_gguf(with_unk, "gemma4");
  if (g) {
    CHECK(!strcmp(str_or(g, "tokenizer.ggml.model"), "gemma4"));
    CHECK(u32_or(g, "tokenizer.ggml.unknown_token_id", -1) == 3);
    tsr_gguf_close(g);
  }
  const char *no_unk = tiny_model("tok_spm_no_unk", "{\"model_type\":\"toy\",\"vocab_size\":263}");
  put(no_unk, "tokenizer.json", tj);
  char out[512];
  snprintf(out, sizeof out, "%s/tok.gguf", no_unk);
  g_pre = "gemma4";
  CHECK_ERR(run_fake(no_unk, out, TSR_F32, convert_tokenizer_only, NULL), TSR_ERR_FORMAT,
            "tokenizer.json", "no byte token <0x41>", "no unknown token");
  CHECK(access(out, F_OK) != 0);
}

/* config.json's keys that converters read, by type and range, named by path;
** null is "not set" and passes. */
static void test_config_keys_of_another_type_or_range_are_refused_by_path(void) {
  static const struct {
    const char *config, *needle;
  } bad[] = {
      {"{\"rope_scaling\":[1]}", "rope_scaling should be an object (a RoPE dict) (or null), "
                                 "found an array of 1"},
      {"{\"num_hidden_layers\":0}", "num_hidden_layers should be an integer of at least 1"},
      {"{\"hidden_size\":64.5}", "hidden_size should be an integer of at least 1 (or null), "
                                 "found the number 64.5"},
      {"{\"tie_word_embeddings\":\"yes\"}", "tie_word_embeddings should be true or false"},
      {"{\"text_config\":{\"rms_norm_eps\":0}}", "text_config.rms_norm_eps should be a finite "
                                                 "number above 0"},
      {"{\"text_config\":7}", "text_config should be an object"},
      {"{\"rope_parameters\":{\"full_attention\":{\"rope_theta\":-1}}}",
       "rope_parameters.full_attention.rope_theta should be a finite number above 0"},
      {"{\"rope_parameters\":{\"mrope_section\":[16,-8]}}",
       "rope_parameters.mrope_section[1] should be a list of integers of at least 0"},
      {"{\"rope_scaling\":{\"factor\":\"2\"}}", "rope_scaling.factor should be a finite number "
                                               "above 0 (or null), found a string \"2\""},
      {"{\"eos_token_id\":[1,\"x\"]}", "eos_token_id[1] should be a token id"},
      {"{\"pad_token_id\":-1}", "pad_token_id should be a token id"},
      {"{\"num_hidden_layers\":2,\"text_config\":{\"layer_types\":[\"a\",\"b\",\"c\"]}}",
       "text_config.layer_types has 3 entries, but num_hidden_layers is 2"},
      {"{\"layer_types\":[\"full_attention\",4]}", "layer_types[1] should be a list of strings"},
  };
  char label[] = "/x/config.json";
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cJSON *c = cJSON_Parse(bad[i].config);
    CHECK_MSG(c != NULL, "case %zu does not parse", i);
    tsr_status st = tsr_convert_check_config(c, label);
    CHECK_MSG(st == TSR_ERR_FORMAT && contains(tsr_error_message(), label) &&
                  contains(tsr_error_message(), bad[i].needle),
              "%s: status %d, '%s' lacks '%s'", bad[i].config, (int)st, tsr_error_message(),
              bad[i].needle);
    cJSON_Delete(c);
  }
  cJSON *ok = cJSON_Parse("{\"rope_scaling\":null,\"sliding_window\":null,\"eos_token_id\":[1,106],"
                          "\"num_experts\":0,\"text_config\":{\"num_hidden_layers\":2,"
                          "\"layer_types\":[\"a\",\"b\"],\"rope_parameters\":{\"full_attention\":"
                          "{\"rope_type\":\"proportional\",\"partial_rotary_factor\":0.25}}}}");
  CHECK_OK(tsr_convert_check_config(ok, label));
  cJSON_Delete(ok);
}

/* The committed fixtures' tokenizers, checked against what their README and
** llama.cpp's converter say they hold. */
static void test_fixture_tokenizers(void) {
  if (!g_fixtures) {
    printf("  (no fixtures folder given; skipped)\n");
    return;
  }
  char dir[512];
  snprintf(dir, sizeof dir, "%s/qwen3_tied", g_fixtures);
  struct tsr_gguf *g = tokenizer_gguf(dir, "qwen2");
  if (g) {
    CHECK(!strcmp(str_or(g, "tokenizer.ggml.model"), "gpt2"));
    CHECK(arr_len(g, "tokenizer.ggml.tokens") == 512);
    CHECK(!strcmp(token(g, 511), "<|im_end|>"));
    for (int i = 0; i < 512; i++)
      CHECK_MSG(arr_i64(g, "tokenizer.ggml.token_type", i) == (i >= 509 ? 3 : 1), "type of %d", i);
    CHECK(u32_or(g, "tokenizer.ggml.eos_token_id", -1) == 511);
    CHECK(u32_or(g, "tokenizer.ggml.padding_token_id", -1) == 509);
    CHECK(u32_or(g, "tokenizer.ggml.bos_token_id", -1) == 509); /* config.json's bos_token_id */
    CHECK(arr_len(g, "tokenizer.ggml.merges") > 100);
    CHECK(contains(str_or(g, "tokenizer.chat_template"), "im_start"));
    tsr_gguf_close(g);
  }
  snprintf(dir, sizeof dir, "%s/gemma4_dense", g_fixtures);
  g = tokenizer_gguf(dir, "gemma4");
  if (g) {
    CHECK(!strcmp(str_or(g, "tokenizer.ggml.model"), "gemma4"));
    CHECK(!strcmp(str_or(g, "tokenizer.ggml.pre"), "")); /* as llama.cpp: none */
    CHECK(arr_len(g, "tokenizer.ggml.tokens") == 512 && arr_len(g, "tokenizer.ggml.scores") == 512);
    for (int i = 0; i < 512; i++) {
      int want = i <= 6 ? 3 : i <= 10 ? 4 : i <= 266 ? 6 : 1;
      CHECK_MSG(arr_i64(g, "tokenizer.ggml.token_type", i) == want, "type of %d (%s)", i,
                token(g, i));
    }
    CHECK(!strcmp(token(g, 11), "<0x00>"));
    CHECK(u32_or(g, "tokenizer.ggml.bos_token_id", -1) == 2);
    CHECK(u32_or(g, "tokenizer.ggml.eos_token_id", -1) == 1);
    CHECK(u32_or(g, "tokenizer.ggml.unknown_token_id", -1) == 3);
    CHECK(u32_or(g, "tokenizer.ggml.padding_token_id", -1) == 0);
    CHECK(u32_or(g, "tokenizer.ggml.mask_token_id", -1) == 4);
    CHECK(bool_or(g, "tokenizer.ggml.add_bos_token", -1) == 1);
    CHECK(bool_or(g, "tokenizer.ggml.add_space_prefix", -1) == 0);
    CHECK(bool_or(g, "tokenizer.ggml.add_sep_token", -1) == 0);
    CHECK(arr_len(g, "tokenizer.ggml.merges") == 170);
    tsr_gguf_close(g);
  }
}

int main(int argc, char **argv) {
  g_fixtures = argc > 1 ? argv[1] : NULL;
  snprintf(g_root, sizeof g_root, "/tmp/tsr-test-convert-XXXXXX");
  if (!mkdtemp(g_root)) return 1;
  TSR_RUN(test_config_values_by_dotted_path_with_strict_types);
  TSR_RUN(test_config_that_is_not_json_names_line_and_column);
  TSR_RUN(test_safetensors_reads_f32_f16_bf16_with_shapes);
  TSR_RUN(test_malformed_safetensors_are_clear_errors);
  TSR_RUN(test_index_tables_read_and_other_dtypes_refuse_reading);
  TSR_RUN(test_missing_checkpoint_is_named);
  TSR_RUN(test_sharded_checkpoints_with_and_without_index);
  TSR_RUN(test_tensors_neither_read_nor_skipped_fail_the_conversion);
  TSR_RUN(test_outtype_storage_and_row_length_fallbacks);
  TSR_RUN(test_token_embedding_type_overrides_one_tensor);
  TSR_RUN(test_plugin_mistakes_are_refused_by_name);
  TSR_RUN(test_unknown_model_type_names_it_and_the_known_ones);
  TSR_RUN(test_byte_level_bpe_tokenizer_metadata);
  TSR_RUN(test_sentencepiece_bytes_need_a_piece_or_an_unknown_token);
  TSR_RUN(test_config_keys_of_another_type_or_range_are_refused_by_path);
  TSR_RUN(test_fixture_tokenizers);
  char cmd[320];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_root);
  return TSR_TEST_EXIT();
}
