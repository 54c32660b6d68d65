/* GGUF reader and writer: round trips, typed getters, and refusal of
** malformed files (the full malformed corpus runs through the CLI in
** tests/gguf_malformed; here each refusal is checked at the API). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "model/gguf.h"
#include "harness.h"

static char g_dir[256];

static void make_dir(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/tsr_test_gguf_XXXXXX");
  if (!mkdtemp(g_dir)) {
    perror("mkdtemp");
    exit(1);
  }
}

static void remove_dir(void) {
  DIR *d = opendir(g_dir);
  struct dirent *e;
  char p[512];
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
    unlink(p);
  }
  if (d) closedir(d);
  rmdir(g_dir);
}

static int count_dir_entries(void) {
  DIR *d = opendir(g_dir);
  struct dirent *e;
  int n = 0;
  while (d && (e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  if (d) closedir(d);
  return n;
}

static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* ---- a raw byte builder for files the writer would refuse to make ------- */

struct buf {
  unsigned char b[8192];
  size_t n;
};

static void put(struct buf *b, const void *p, size_t n) {
  memcpy(b->b + b->n, p, n);
  b->n += n;
}
static void put_u32(struct buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(struct buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(struct buf *b, const char *s) {
  put_u64(b, strlen(s));
  put(b, s, strlen(s));
}
static void put_header(struct buf *b, uint64_t n_tensors, uint64_t n_kv) {
  put(b, "GGUF", 4);
  put_u32(b, 3);
  put_u64(b, n_tensors);
  put_u64(b, n_kv);
}
static void put_kv_u32(struct buf *b, const char *key, uint32_t v) {
  put_str(b, key);
  put_u32(b, TSR_GGUF_U32);
  put_u32(b, v);
}
static void put_tensor(struct buf *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                       uint32_t type, uint64_t off) {
  put_str(b, name);
  put_u32(b, n_dims);
  for (uint32_t d = 0; d < n_dims; d++) put_u64(b, ne[d]);
  put_u32(b, type);
  put_u64(b, off);
}
static void pad_to(struct buf *b, size_t align, size_t extra) {
  while (b->n % align) b->b[b->n++] = 0;
  memset(b->b + b->n, 0, extra);
  b->n += extra;
}

/* Opens b, expects status st and a message holding `want`. */
static void expect_refused(const struct buf *b, tsr_status st, const char *want) {
  struct tsr_gguf *g = NULL;
  tsr_status got = tsr_gguf_open_memory(b->b, b->n, "case.gguf", &g);
  CHECK_MSG(got == st, "status %s, expected %s (%s)", tsr_status_name(got), tsr_status_name(st),
            tsr_error_message());
  CHECK(g == NULL);
  CHECK_MSG(contains(tsr_error_message(), want), "message '%s' lacks '%s'", tsr_error_message(),
            want);
  CHECK(contains(tsr_error_message(), "case.gguf"));
  tsr_gguf_close(g);
}

/* ---- round trip ---------------------------------------------------------- */

static float g_w_f32[4 * 3];
static uint16_t g_w_f16[8 * 2 * 2];
static unsigned char g_w_q4[2 * 18 * 3];
static unsigned char g_w_q8[34 * 5 * 1 * 2];

static void fill_weights(void) {
  tsr_test_seed(7);
  for (size_t i = 0; i < sizeof g_w_f32 / 4; i++) g_w_f32[i] = tsr_test_normal();
  for (size_t i = 0; i < sizeof g_w_f16 / 2; i++) g_w_f16[i] = (uint16_t)tsr_test_next();
  for (size_t i = 0; i < sizeof g_w_q4; i++) g_w_q4[i] = (unsigned char)tsr_test_next();
  for (size_t i = 0; i < sizeof g_w_q8; i++) g_w_q8[i] = (unsigned char)tsr_test_next();
}

static const char *const g_tokens[] = {"<unk>", "", "hello", "w\xc3\xb6rld", "a b"};

/* A writer holding every value type and four tensors. */
static struct tsr_gguf_writer *full_writer(uint32_t alignment) {
  struct tsr_gguf_writer *w;
  CHECK_OK(tsr_gguf_writer_new(&w));
  uint8_t u8 = 200;
  int8_t i8 = -100;
  uint16_t u16 = 60000;
  int16_t i16 = -30000;
  int64_t i64 = -5000000000ll;
  double f64 = 3.141592653589793;
  CHECK_OK(tsr_gguf_writer_add_str(w, "general.architecture", "llama"));
  if (alignment) CHECK_OK(tsr_gguf_writer_add_u32(w, "general.alignment", alignment));
  CHECK_OK(tsr_gguf_writer_add_scalar(w, "t.u8", TSR_GGUF_U8, &u8));
  CHECK_OK(tsr_gguf_writer_add_scalar(w, "t.i8", TSR_GGUF_I8, &i8));
  CHECK_OK(tsr_gguf_writer_add_scalar(w, "t.u16", TSR_GGUF_U16, &u16));
  CHECK_OK(tsr_gguf_writer_add_scalar(w, "t.i16", TSR_GGUF_I16, &i16));
  CHECK_OK(tsr_gguf_writer_add_u32(w, "t.u32", 4000000000u));
  CHECK_OK(tsr_gguf_writer_add_i32(w, "t.i32", -7));
  CHECK_OK(tsr_gguf_writer_add_f32(w, "t.f32", 0.125f));
  CHECK_OK(tsr_gguf_writer_add_bool(w, "t.bool", 1));
  CHECK_OK(tsr_gguf_writer_add_u64(w, "t.u64", 0xfedcba9876543210ull));
  CHECK_OK(tsr_gguf_writer_add_scalar(w, "t.i64", TSR_GGUF_I64, &i64));
  CHECK_OK(tsr_gguf_writer_add_scalar(w, "t.f64", TSR_GGUF_F64, &f64));
  CHECK_OK(tsr_gguf_writer_add_strn(w, "t.nul", "a\0b", 3));
  float scores[3] = {-1.5f, 0.0f, 2.25f};
  int32_t ids[4] = {1, -2, 3, 2147483647};
  uint8_t flags[3] = {0, 1, 1};
  CHECK_OK(tsr_gguf_writer_add_arr(w, "t.arr_f32", TSR_GGUF_F32, scores, 3));
  CHECK_OK(tsr_gguf_writer_add_arr(w, "t.arr_i32", TSR_GGUF_I32, ids, 4));
  CHECK_OK(tsr_gguf_writer_add_arr(w, "t.arr_bool", TSR_GGUF_BOOL, flags, 3));
  CHECK_OK(tsr_gguf_writer_add_arr(w, "t.arr_empty", TSR_GGUF_U64, NULL, 0));
  CHECK_OK(tsr_gguf_writer_add_arr_str(w, "t.tokens", g_tokens, 5));
  CHECK_OK(tsr_gguf_writer_add_tensor(w, "a.f32", TSR_F32, 2, (int64_t[]){4, 3}, g_w_f32));
  CHECK_OK(tsr_gguf_writer_add_tensor(w, "b.f16", TSR_F16, 3, (int64_t[]){8, 2, 2}, g_w_f16));
  CHECK_OK(tsr_gguf_writer_add_tensor(w, "c.q4_0", TSR_Q4_0, 2, (int64_t[]){64, 3}, g_w_q4));
  CHECK_OK(tsr_gguf_writer_add_tensor(w, "d.q8_0", TSR_Q8_0, 4, (int64_t[]){32, 5, 1, 2}, g_w_q8));
  return w;
}

static void write_file(struct tsr_gguf_writer *w, const char *name, char *path) {
  snprintf(path, 512, "%s/%s", g_dir, name);
  CHECK_OK(tsr_gguf_writer_write(w, path));
}

static void roundtrip_preserves_every_value_type_and_tensor(void) {
  char path[512];
  struct tsr_gguf_writer *w = full_writer(0);
  write_file(w, "full.gguf", path);
  tsr_gguf_writer_free(w);

  struct tsr_gguf *g;
  CHECK_OK(tsr_gguf_open(path, &g));
  if (!g) return;
  CHECK(tsr_gguf_version(g) == 3);
  CHECK(tsr_gguf_alignment(g) == 32);
  CHECK(tsr_gguf_data_offset(g) % 32 == 0);
  CHECK(tsr_gguf_n_kv(g) == 18);
  CHECK(strcmp(tsr_gguf_kv_at(g, 0)->key, "general.architecture") == 0); /* file order kept */

  const char *s;
  CHECK_OK(tsr_gguf_get_str(g, "general.architecture", &s));
  CHECK(strcmp(s, "llama") == 0);
  uint32_t u32;
  int32_t i32;
  uint64_t u64;
  int64_t i64;
  float f32;
  double f64;
  int b;
  CHECK_OK(tsr_gguf_get_u32(g, "t.u8", &u32));
  CHECK(u32 == 200);
  CHECK_OK(tsr_gguf_get_i32(g, "t.i8", &i32));
  CHECK(i32 == -100);
  CHECK_OK(tsr_gguf_get_u32(g, "t.u16", &u32));
  CHECK(u32 == 60000);
  CHECK_OK(tsr_gguf_get_i32(g, "t.i16", &i32));
  CHECK(i32 == -30000);
  CHECK_OK(tsr_gguf_get_u32(g, "t.u32", &u32));
  CHECK(u32 == 4000000000u);
  CHECK_OK(tsr_gguf_get_i32(g, "t.i32", &i32));
  CHECK(i32 == -7);
  CHECK_OK(tsr_gguf_get_f32(g, "t.f32", &f32));
  CHECK(f32 == 0.125f);
  CHECK_OK(tsr_gguf_get_bool(g, "t.bool", &b));
  CHECK(b == 1);
  CHECK_OK(tsr_gguf_get_u64(g, "t.u64", &u64));
  CHECK(u64 == 0xfedcba9876543210ull);
  CHECK_OK(tsr_gguf_get_i64(g, "t.i64", &i64));
  CHECK(i64 == -5000000000ll);
  CHECK_OK(tsr_gguf_get_f64(g, "t.f64", &f64));
  CHECK(f64 == 3.141592653589793);
  const struct tsr_gguf_kv *kv = tsr_gguf_kv_at(g, tsr_gguf_find_key(g, "t.nul"));
  CHECK(kv && kv->type == TSR_GGUF_STRING && kv->v.s.len == 3 && memcmp(kv->v.s.ptr, "a\0b", 4) == 0);

  CHECK_OK(tsr_gguf_get_arr(g, "t.arr_f32", TSR_GGUF_F32, &kv));
  CHECK(kv->n == 3);
  CHECK_OK(tsr_gguf_arr_f32(g, kv, 2, &f32));
  CHECK(f32 == 2.25f);
  CHECK_OK(tsr_gguf_get_arr(g, "t.arr_i32", TSR_GGUF_I32, &kv));
  CHECK_OK(tsr_gguf_arr_i64(g, kv, 1, &i64));
  CHECK(i64 == -2);
  CHECK_OK(tsr_gguf_arr_i64(g, kv, 3, &i64));
  CHECK(i64 == 2147483647);
  CHECK_OK(tsr_gguf_get_arr(g, "t.arr_bool", TSR_GGUF_BOOL, &kv));
  CHECK(kv->n == 3 && ((const uint8_t *)kv->data)[1] == 1);
  CHECK_OK(tsr_gguf_get_arr(g, "t.arr_empty", TSR_GGUF_TYPE_COUNT, &kv));
  CHECK(kv->n == 0 && kv->elem_type == TSR_GGUF_U64);
  CHECK_OK(tsr_gguf_get_arr(g, "t.tokens", TSR_GGUF_STRING, &kv));
  CHECK(kv->n == 5);
  for (uint64_t i = 0; i < 5 && kv->n == 5; i++) {
    struct tsr_gguf_str str;
    CHECK_OK(tsr_gguf_arr_str(g, kv, i, &str));
    CHECK(str.len == strlen(g_tokens[i]) && strcmp(str.ptr, g_tokens[i]) == 0);
  }

  CHECK(tsr_gguf_n_tensors(g) == 4);
  const struct tsr_gguf_tensor *t = tsr_gguf_find_tensor(g, "a.f32");
  CHECK(t && t->dtype == TSR_F32 && t->n_dims == 2 && t->ne[0] == 4 && t->ne[1] == 3 &&
        t->ne[2] == 1 && t->n_elements == 12 && t->nbytes == sizeof g_w_f32 &&
        memcmp(t->data, g_w_f32, sizeof g_w_f32) == 0);
  t = tsr_gguf_find_tensor(g, "b.f16");
  CHECK(t && t->dtype == TSR_F16 && t->n_dims == 3 && t->nbytes == sizeof g_w_f16 &&
        memcmp(t->data, g_w_f16, sizeof g_w_f16) == 0);
  t = tsr_gguf_find_tensor(g, "c.q4_0");
  CHECK(t && t->dtype == TSR_Q4_0 && t->n_elements == 192 && t->nbytes == sizeof g_w_q4 &&
        memcmp(t->data, g_w_q4, sizeof g_w_q4) == 0);
  t = tsr_gguf_find_tensor(g, "d.q8_0");
  CHECK(t && t->n_dims == 4 && t->ne[3] == 2 && t->nbytes == sizeof g_w_q8 &&
        memcmp(t->data, g_w_q8, sizeof g_w_q8) == 0);
  for (int64_t i = 0; i < tsr_gguf_n_tensors(g); i++) {
    t = tsr_gguf_tensor_at(g, i);
    CHECK(t->file_offset == tsr_gguf_data_offset(g) + t->offset);
    CHECK(t->offset % 32 == 0);
  }
  CHECK(tsr_gguf_find_tensor(g, "missing") == NULL);
  CHECK(tsr_gguf_find_key(g, "missing") == -1);
  tsr_gguf_close(g);
}

static void roundtrip_honours_custom_alignment(void) {
  char path[512];
  struct tsr_gguf_writer *w = full_writer(256);
  write_file(w, "align.gguf", path);
  tsr_gguf_writer_free(w);
  struct tsr_gguf *g;
  CHECK_OK(tsr_gguf_open(path, &g));
  if (!g) return;
  CHECK(tsr_gguf_alignment(g) == 256);
  CHECK(tsr_gguf_data_offset(g) % 256 == 0);
  for (int64_t i = 0; i < tsr_gguf_n_tensors(g); i++)
    CHECK(tsr_gguf_tensor_at(g, i)->file_offset % 256 == 0);
  tsr_gguf_close(g);
}

static void every_truncation_of_a_valid_file_is_refused(void) {
  char path[512];
  struct tsr_gguf_writer *w = full_writer(0);
  write_file(w, "trunc.gguf", path);
  tsr_gguf_writer_free(w);
  FILE *f = fopen(path, "rb");
  static unsigned char data[8192];
  size_t n = f ? fread(data, 1, sizeof data, f) : 0;
  if (f) fclose(f);
  CHECK(n > 100 && n < sizeof data);
  struct tsr_gguf *g;
  CHECK_OK(tsr_gguf_open_memory(data, n, "full", &g));
  tsr_gguf_close(g);
  /* The last tensor's trailing padding is not part of its data, so prefixes
  ** that keep all tensor bytes still read; every shorter one must fail. */
  size_t min_ok = n - (sizeof g_w_q8 % 32 ? 32 - sizeof g_w_q8 % 32 : 0);
  int bad = 0;
  for (size_t len = 0; len < min_ok; len++) {
    tsr_status st = tsr_gguf_open_memory(data, len, "cut", &g);
    if (st != TSR_ERR_FORMAT || g != NULL) bad++;
    tsr_gguf_close(g);
  }
  CHECK_MSG(bad == 0, "%d truncations were not refused as format errors", bad);
  CHECK(tsr_gguf_open_memory(data, 10, "cut", &g) == TSR_ERR_FORMAT);
  CHECK(contains(tsr_error_message(), "truncated"));
  CHECK(contains(tsr_error_message(), "tensor count"));
}

static void getters_refuse_wrong_types_and_name_both(void) {
  char path[512];
  struct tsr_gguf_writer *w = full_writer(0);
  write_file(w, "types.gguf", path);
  tsr_gguf_writer_free(w);
  struct tsr_gguf *g;
  CHECK_OK(tsr_gguf_open(path, &g));
  if (!g) return;
  float f32;
  double f64;
  uint32_t u32;
  int32_t i32;
  int64_t i64;
  int b;
  const char *s;
  const struct tsr_gguf_kv *kv;

  CHECK(tsr_gguf_get_f32(g, "t.u32", &f32) == TSR_ERR_FORMAT);
  CHECK(contains(tsr_error_message(), "'t.u32' is u32, asked for as f32"));
  CHECK(contains(tsr_error_message(), "types.gguf"));
  CHECK(tsr_gguf_get_f32(g, "t.f64", &f32) == TSR_ERR_FORMAT); /* narrowing refused */
  CHECK_OK(tsr_gguf_get_f64(g, "t.f32", &f64));                /* widening accepted */
  CHECK(f64 == 0.125);
  CHECK(tsr_gguf_get_u32(g, "t.i32", &u32) == TSR_ERR_FORMAT); /* -7 does not fit */
  CHECK(contains(tsr_error_message(), "i32 -7, which does not fit u32"));
  CHECK(tsr_gguf_get_i32(g, "t.u32", &i32) == TSR_ERR_FORMAT); /* 4e9 does not fit */
  CHECK(tsr_gguf_get_i64(g, "t.u64", &i64) == TSR_ERR_FORMAT);
  CHECK_OK(tsr_gguf_get_i64(g, "t.u32", &i64));
  CHECK(i64 == 4000000000ll);
  CHECK(tsr_gguf_get_bool(g, "t.u8", &b) == TSR_ERR_FORMAT);
  CHECK(tsr_gguf_get_u32(g, "t.bool", &u32) == TSR_ERR_FORMAT);
  CHECK(tsr_gguf_get_str(g, "t.tokens", &s) == TSR_ERR_FORMAT);
  CHECK(contains(tsr_error_message(), "is array of string, asked for as string"));
  CHECK(tsr_gguf_get_u32(g, "general.architecture", &u32) == TSR_ERR_FORMAT);
  CHECK(tsr_gguf_get_u32(g, "no.such.key", &u32) == TSR_ERR_FORMAT);
  CHECK(contains(tsr_error_message(), "'no.such.key' not found"));

  CHECK(tsr_gguf_get_arr(g, "t.arr_i32", TSR_GGUF_F32, &kv) == TSR_ERR_FORMAT);
  CHECK(contains(tsr_error_message(), "array of i32, asked for as array of f32"));
  CHECK(tsr_gguf_get_arr(g, "t.u32", TSR_GGUF_TYPE_COUNT, &kv) == TSR_ERR_FORMAT);
  CHECK_OK(tsr_gguf_get_arr(g, "t.arr_i32", TSR_GGUF_I32, &kv));
  CHECK(tsr_gguf_arr_f32(g, kv, 0, &f32) == TSR_ERR_FORMAT); /* ints are not read as floats */
  CHECK(tsr_gguf_arr_i64(g, kv, 4, &i64) == TSR_ERR_INVALID_ARG);
  CHECK(contains(tsr_error_message(), "index 4"));
  uint64_t u64;
  CHECK(tsr_gguf_arr_u64(g, kv, 1, &u64) == TSR_ERR_FORMAT); /* -2 */
  CHECK(contains(tsr_error_message(), "element 1"));
  tsr_gguf_close(g);
}

static void writer_refuses_what_the_reader_would_refuse(void) {
  struct tsr_gguf_writer *w;
  CHECK_OK(tsr_gguf_writer_new(&w));
  CHECK(tsr_gguf_writer_add_u32(w, "", 1) == TSR_ERR_INVALID_ARG);
  CHECK_OK(tsr_gguf_writer_add_u32(w, "k", 1));
  CHECK(tsr_gguf_writer_add_u32(w, "k", 2) == TSR_ERR_INVALID_ARG);
  CHECK(tsr_gguf_writer_add_u32(w, "general.alignment", 48) == TSR_ERR_INVALID_ARG);
  CHECK(tsr_gguf_writer_add_u64(w, "general.alignment", 64) == TSR_ERR_INVALID_ARG);
  CHECK(tsr_gguf_writer_add_tensor(w, "q", TSR_Q4_0, 1, (int64_t[]){33}, NULL) ==
        TSR_ERR_INVALID_ARG);
  /* a tessera-only KV codec id is not a GGUF type */
  CHECK(tsr_gguf_writer_add_tensor(w, "k", TSR_Q6_0, 1, (int64_t[]){32}, NULL) ==
        TSR_ERR_INVALID_ARG);
  CHECK(strstr(tsr_error_message(), "not a GGUF type") != NULL);
  CHECK(tsr_gguf_writer_add_tensor(w, "z", TSR_F32, 2, (int64_t[]){4, 0}, NULL) ==
        TSR_ERR_INVALID_ARG);
  CHECK(tsr_gguf_writer_add_tensor(w, "five", TSR_F32, 5, (int64_t[]){1, 1, 1, 1, 1}, NULL) ==
        TSR_ERR_INVALID_ARG);
  char longname[80];
  memset(longname, 'x', 64);
  longname[64] = '\0';
  CHECK(tsr_gguf_writer_add_tensor(w, longname, TSR_F32, 1, (int64_t[]){4}, NULL) ==
        TSR_ERR_INVALID_ARG);
  longname[63] = '\0'; /* 63 bytes is the longest allowed */
  CHECK_OK(tsr_gguf_writer_add_tensor(w, longname, TSR_F32, 1, (int64_t[]){4}, NULL));
  tsr_gguf_writer_free(w);
}

static void failed_write_keeps_the_existing_file(void) {
  char path[512];
  struct tsr_gguf_writer *w = full_writer(0);
  write_file(w, "keep.gguf", path);
  tsr_gguf_writer_free(w);
  struct stat before, after;
  CHECK(stat(path, &before) == 0);
  int entries = count_dir_entries();

  CHECK_OK(tsr_gguf_writer_new(&w));
  CHECK_OK(tsr_gguf_writer_add_tensor(w, "same", TSR_F32, 1, (int64_t[]){4}, NULL));
  CHECK_OK(tsr_gguf_writer_add_tensor(w, "same", TSR_F32, 1, (int64_t[]){8}, NULL));
  CHECK(tsr_gguf_writer_write(w, path) == TSR_ERR_INVALID_ARG);
  CHECK(contains(tsr_error_message(), "duplicate tensor name 'same'"));
  tsr_gguf_writer_free(w);

  /* A target whose directory does not exist fails at the temporary file. */
  char bad[700];
  snprintf(bad, sizeof bad, "%s/no/such/dir.gguf", g_dir);
  CHECK_OK(tsr_gguf_writer_new(&w));
  CHECK(tsr_gguf_writer_write(w, bad) == TSR_ERR_IO);
  tsr_gguf_writer_free(w);

  /* A directory in the target's place makes rename fail after the data is
  ** written: the temporary must be cleaned up. */
  char dirpath[600];
  snprintf(dirpath, sizeof dirpath, "%s/adir", g_dir);
  CHECK(mkdir(dirpath, 0755) == 0);
  snprintf(bad, sizeof bad, "%s/x", dirpath);
  FILE *f = fopen(bad, "w"); /* non-empty, so rename over it fails */
  if (f) fclose(f);
  w = full_writer(0);
  CHECK(tsr_gguf_writer_write(w, dirpath) == TSR_ERR_IO);
  CHECK(contains(tsr_error_message(), "rename"));
  tsr_gguf_writer_free(w);
  unlink(bad);
  rmdir(dirpath);

  CHECK(stat(path, &after) == 0);
  CHECK(after.st_size == before.st_size && after.st_ino == before.st_ino);
  CHECK_MSG(count_dir_entries() == entries, "temporary files left behind: %d entries, expected %d",
            count_dir_entries(), entries);
  struct tsr_gguf *g;
  CHECK_OK(tsr_gguf_open(path, &g));
  tsr_gguf_close(g);
}

static void header_problems_are_named(void) {
  struct buf b = {.n = 0};
  put(&b, "GGUX", 4);
  put_u32(&b, 3);
  put_u64(&b, 0);
  put_u64(&b, 0);
  expect_refused(&b, TSR_ERR_FORMAT, "bad magic 'GGUX'");

  uint32_t versions[] = {0, 1, 0x03000000u, 0x02000000u, 4};
  const char *want[] = {"version 0", "version 1 is not supported", "byte-swapped",
                        "byte-swapped", "version 4"};
  for (int i = 0; i < 5; i++) {
    b.n = 0;
    put(&b, "GGUF", 4);
    put_u32(&b, versions[i]);
    put_u64(&b, 0);
    put_u64(&b, 0);
    expect_refused(&b, i == 0 ? TSR_ERR_FORMAT : TSR_ERR_UNSUPPORTED, want[i]);
  }

  b.n = 0;
  put_header(&b, 0, UINT64_MAX / 2);
  put_kv_u32(&b, "a", 1);
  expect_refused(&b, TSR_ERR_FORMAT, "kv pairs");

  b.n = 0;
  put_header(&b, 0, 0);
  struct tsr_gguf *g;
  CHECK_OK(tsr_gguf_open_memory(b.b, b.n, "empty", &g)); /* no pairs, no tensors: valid */
  CHECK(g && tsr_gguf_n_kv(g) == 0 && tsr_gguf_n_tensors(g) == 0);
  tsr_gguf_close(g);
}

static void key_problems_are_named(void) {
  struct buf b = {.n = 0};
  put_header(&b, 0, 2);
  put_kv_u32(&b, "dup", 1);
  put_kv_u32(&b, "dup", 2);
  expect_refused(&b, TSR_ERR_FORMAT, "duplicate key 'dup'");

  b.n = 0;
  put_header(&b, 0, 1);
  put_kv_u32(&b, "", 1);
  expect_refused(&b, TSR_ERR_FORMAT, "empty key");

  b.n = 0;
  put_header(&b, 0, 1);
  put_str(&b, "k");
  put_u32(&b, 13);
  put_u32(&b, 0);
  expect_refused(&b, TSR_ERR_FORMAT, "invalid value type 13");

  b.n = 0;
  put_header(&b, 0, 1);
  put_str(&b, "nest");
  put_u32(&b, TSR_GGUF_ARRAY);
  put_u32(&b, TSR_GGUF_ARRAY);
  put_u64(&b, 1);
  put_u32(&b, TSR_GGUF_U8);
  put_u64(&b, 0);
  expect_refused(&b, TSR_ERR_FORMAT, "nested arrays");

  b.n = 0;
  put_header(&b, 0, 1);
  put_str(&b, "s");
  put_u32(&b, TSR_GGUF_STRING);
  put_u64(&b, UINT64_MAX);
  put(&b, "abc", 3);
  expect_refused(&b, TSR_ERR_FORMAT, "key 's'");
  expect_refused(&b, TSR_ERR_FORMAT, "exceeds");

  b.n = 0;
  put_header(&b, 0, 1);
  put_str(&b, "arr");
  put_u32(&b, TSR_GGUF_ARRAY);
  put_u32(&b, TSR_GGUF_U32);
  put_u64(&b, 1ull << 62);
  put_u32(&b, 1);
  expect_refused(&b, TSR_ERR_FORMAT, "array of 4611686018427387904 u32 elements");

  uint32_t aligns[] = {0, 3, 1u << 31};
  for (int i = 0; i < 3; i++) {
    b.n = 0;
    put_header(&b, 0, 1);
    put_kv_u32(&b, "general.alignment", aligns[i]);
    expect_refused(&b, TSR_ERR_FORMAT, "general.alignment");
    expect_refused(&b, TSR_ERR_FORMAT, "power of two");
  }
  b.n = 0;
  put_header(&b, 0, 1);
  put_str(&b, "general.alignment");
  put_u32(&b, TSR_GGUF_U64);
  put_u64(&b, 32);
  expect_refused(&b, TSR_ERR_FORMAT, "must be u32");

  b.n = 0;
  put_header(&b, 0, 1);
  put_str(&b, "flag");
  put_u32(&b, TSR_GGUF_BOOL);
  put(&b, "\x02", 1);
  expect_refused(&b, TSR_ERR_FORMAT, "not 0 or 1");
}

static void tensor_problems_are_named(void) {
  struct buf b;
  const uint64_t ne4[1] = {4}, ne32[1] = {32};

#define TENSOR_CASE(setup, want)                                                                   \
  do {                                                                                             \
    b.n = 0;                                                                                       \
    setup;                                                                                         \
    expect_refused(&b, TSR_ERR_FORMAT, want);                                                      \
  } while (0)

  TENSOR_CASE((put_header(&b, 2, 0), put_tensor(&b, "t", 1, ne4, 0, 0),
               put_tensor(&b, "t", 1, ne4, 0, 32), pad_to(&b, 32, 64)),
              "duplicate tensor name 't'");
  TENSOR_CASE((put_header(&b, 1, 0), put_tensor(&b, "", 1, ne4, 0, 0), pad_to(&b, 32, 32)),
              "empty tensor name");
  char name64[65];
  memset(name64, 'n', 64);
  name64[64] = 0;
  TENSOR_CASE((put_header(&b, 1, 0), put_tensor(&b, name64, 1, ne4, 0, 0), pad_to(&b, 32, 32)),
              "is 64 bytes");
  TENSOR_CASE((put_header(&b, 1, 0), put_tensor(&b, "t", 0, ne4, 0, 0), pad_to(&b, 32, 32)),
              "n_dims is 0");
  const uint64_t ne5[5] = {1, 1, 1, 1, 1};
  TENSOR_CASE((put_header(&b, 1, 0), put_tensor(&b, "t", 5, ne5, 0, 0), pad_to(&b, 32, 32)),
              "n_dims is 5");
  const uint64_t ne0[2] = {4, 0};
  TENSOR_CASE((put_header(&b, 1, 0), put_tensor(&b, "t", 2, ne0, 0, 0), pad_to(&b, 32, 32)),
              "dimension 1");
  const uint64_t neneg[2] = {4, (uint64_t)-3};
  TENSOR_CASE((put_header(&b, 1, 0), put_tensor(&b, "t", 2, neneg, 0, 0), pad_to(&b, 32, 32)),
              "negative as int64");
  const uint64_t nebig[3] = {1ull << 32, 1ull << 31, 1ull << 2};
  TENSOR_CASE((put_header(&b, 1, 0), put_tensor(&b, "t", 3, nebig, 0, 0), pad_to(&b, 32, 32)),
              "element count overflows");
  const uint64_t nebytes[2] = {1ull << 32, 1ull << 30};
  TENSOR_CASE((put_header(&b, 1, 0), put_tensor(&b, "t", 2, nebytes, 0, 0), pad_to(&b, 32, 32)),
              "byte size overflows");
  TENSOR_CASE((put_header(&b, 1, 0), put_tensor(&b, "t", 1, ne4, 99, 0), pad_to(&b, 32, 32)),
              "unknown tensor type id 99");
  TENSOR_CASE((put_header(&b, 1, 0), put_tensor(&b, "t", 1, ne4, TSR_Q4_0, 0), pad_to(&b, 32, 32)),
              "not a multiple of q4_0's block size 32");
  TENSOR_CASE((put_header(&b, 1, 0), put_tensor(&b, "t", 1, ne4, 0, 16), pad_to(&b, 32, 64)),
              "not a multiple of the alignment 32");
  TENSOR_CASE((put_header(&b, 1, 0), put_tensor(&b, "t.w", 1, ne32, 0, 0), pad_to(&b, 32, 64)),
              "tensor 't.w': data [");
  TENSOR_CASE((put_header(&b, 1, 0), put_tensor(&b, "t.w", 1, ne32, 0, 0), pad_to(&b, 32, 64)),
              "extends past end of file (");
  TENSOR_CASE((put_header(&b, 1, 0), put_tensor(&b, "t", 1, ne4, 0, UINT64_MAX - 31),
               pad_to(&b, 32, 32)),
              "overflows");
  TENSOR_CASE((put_header(&b, 2, 0), put_tensor(&b, "a", 1, ne32, 0, 0),
               put_tensor(&b, "b", 1, ne4, 0, 64), pad_to(&b, 32, 160)),
              "tensor 'b' data");
  TENSOR_CASE((put_header(&b, 2, 0), put_tensor(&b, "a", 1, ne32, 0, 0),
               put_tensor(&b, "b", 1, ne4, 0, 64), pad_to(&b, 32, 160)),
              "overlaps tensor 'a'");
  /* Control: the same two tensors without overlap read fine. */
  b.n = 0;
  put_header(&b, 2, 0);
  put_tensor(&b, "a", 1, ne32, 0, 0);
  put_tensor(&b, "b", 1, ne4, 0, 128);
  pad_to(&b, 32, 160);
  struct tsr_gguf *g;
  CHECK_OK(tsr_gguf_open_memory(b.b, b.n, "ok", &g));
  tsr_gguf_close(g);
#undef TENSOR_CASE
}

static void open_reports_missing_files_as_io(void) {
  struct tsr_gguf *g;
  CHECK(tsr_gguf_open("/nonexistent/dir/model.gguf", &g) == TSR_ERR_IO);
  CHECK(contains(tsr_error_message(), "/nonexistent/dir/model.gguf"));
  CHECK(tsr_gguf_open(g_dir, &g) == TSR_ERR_IO); /* a directory */
  char path[512];
  snprintf(path, sizeof path, "%s/empty.gguf", g_dir);
  FILE *f = fopen(path, "w");
  if (f) fclose(f);
  CHECK(tsr_gguf_open(path, &g) == TSR_ERR_FORMAT);
  CHECK(contains(tsr_error_message(), "truncated"));
  unlink(path);
}

int main(void) {
  make_dir();
  fill_weights();
  TSR_RUN(roundtrip_preserves_every_value_type_and_tensor);
  TSR_RUN(roundtrip_honours_custom_alignment);
  TSR_RUN(every_truncation_of_a_valid_file_is_refused);
  TSR_RUN(getters_refuse_wrong_types_and_name_both);
  TSR_RUN(writer_refuses_what_the_reader_would_refuse);
  TSR_RUN(failed_write_keeps_the_existing_file);
  TSR_RUN(header_problems_are_named);
  TSR_RUN(key_problems_are_named);
  TSR_RUN(tensor_problems_are_named);
  TSR_RUN(open_reports_missing_files_as_io);
  remove_dir();
  return TSR_TEST_EXIT();
}
