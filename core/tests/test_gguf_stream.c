/* The GGUF writer's streaming tensors (tsr_gguf_writer_add_tensor_rows): the
** same bytes as buffered tensors, rows asked for in order and in whole
** blocks, a producer's error aborting the write, zero tensors as holes, and
** a memory peak that does not grow with the file. */
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

static void path_of(char *buf, size_t n, const char *name) {
  snprintf(buf, n, "%s/%s", g_dir, name);
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

/* A byte of a tensor as a function of where it sits, so a producer can make
** any rows without holding the tensor. */
static unsigned char byte_at(int tag, uint64_t i) {
  uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t)tag * 0xbf58476d1ce4e5b9ull;
  return (unsigned char)(x >> 56);
}

struct rows_src {
  int tag;
  size_t row_bytes;
  int64_t next_row;   /* the row the next call must start at */
  int64_t calls, max_rows;
  int64_t fail_at;    /* a call whose row0 reaches this fails (-1: never) */
  int out_of_order;
};

static tsr_status produce(void *ctx, int64_t row0, int64_t n_rows, void *dst) {
  struct rows_src *s = ctx;
  if (row0 != s->next_row) s->out_of_order = 1;
  s->next_row = row0 + n_rows;
  s->calls++;
  if (n_rows > s->max_rows) s->max_rows = n_rows;
  if (s->fail_at >= 0 && row0 + n_rows > s->fail_at)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "producer refused row %lld", (long long)s->fail_at);
  for (size_t i = 0; i < (size_t)n_rows * s->row_bytes; i++)
    ((unsigned char *)dst)[i] = byte_at(s->tag, (uint64_t)row0 * s->row_bytes + i);
  return TSR_OK;
}

struct spec {
  const char *name;
  enum tsr_dtype dtype;
  uint32_t n_dims;
  int64_t ne[4];
};

/* Mixed dtypes and ranks; the last spans several stream blocks (q8_0 rows of
** 4096 = 4352 bytes, 2 x 600 rows: 5.2 MB > TSR_GGUF_STREAM_BLOCK). */
static const struct spec g_specs[] = {
    {"a.weight", TSR_F32, 1, {7}},
    {"b.weight", TSR_F16, 2, {64, 3}},
    {"c.weight", TSR_Q4_K, 3, {512, 5, 2}},
    {"d.weight", TSR_Q8_0, 3, {4096, 600, 2}},
};
#define N_SPECS (int)(sizeof g_specs / sizeof g_specs[0])

static size_t bytes_of(const struct spec *s, size_t *row_bytes) {
  *row_bytes = tsr_dtype_row_size(s->dtype, s->ne[0]);
  size_t rows = 1;
  for (uint32_t d = 1; d < s->n_dims; d++) rows *= (size_t)s->ne[d];
  return *row_bytes * rows;
}

static struct tsr_gguf_writer *writer_with_keys(void) {
  struct tsr_gguf_writer *w;
  CHECK_OK(tsr_gguf_writer_new(&w));
  CHECK_OK(tsr_gguf_writer_add_str(w, "general.architecture", "test"));
  CHECK_OK(tsr_gguf_writer_add_u32(w, "test.block_count", 3));
  return w;
}

static unsigned char *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc(*n ? *n : 1);
  if (b && fread(b, 1, *n, f) != *n) {
    free(b);
    b = NULL;
  }
  fclose(f);
  return b;
}

static void streamed_file_is_byte_identical_to_buffered(void) {
  char buffered[512], streamed[512];
  path_of(buffered, sizeof buffered, "buffered.gguf");
  path_of(streamed, sizeof streamed, "streamed.gguf");
  struct tsr_gguf_writer *wb = writer_with_keys(), *ws = writer_with_keys();
  void *data[N_SPECS];
  struct rows_src src[N_SPECS];
  for (int i = 0; i < N_SPECS; i++) {
    size_t row_bytes, n = bytes_of(&g_specs[i], &row_bytes);
    data[i] = malloc(n);
    for (size_t k = 0; k < n; k++) ((unsigned char *)data[i])[k] = byte_at(i, k);
    src[i] = (struct rows_src){.tag = i, .row_bytes = row_bytes, .fail_at = -1};
    CHECK_OK(tsr_gguf_writer_add_tensor(wb, g_specs[i].name, g_specs[i].dtype, g_specs[i].n_dims,
                                        g_specs[i].ne, data[i]));
    CHECK_OK(tsr_gguf_writer_add_tensor_rows(ws, g_specs[i].name, g_specs[i].dtype,
                                             g_specs[i].n_dims, g_specs[i].ne, produce, &src[i]));
  }
  uint64_t predicted;
  CHECK_OK(tsr_gguf_writer_file_size(ws, &predicted));
  CHECK_OK(tsr_gguf_writer_write(wb, buffered));
  CHECK_OK(tsr_gguf_writer_write(ws, streamed));
  size_t nb = 0, ns = 0;
  unsigned char *b = read_file(buffered, &nb), *s = read_file(streamed, &ns);
  CHECK(b && s);
  CHECK_MSG(nb == ns && b && s && memcmp(b, s, nb) == 0, "files differ (%zu vs %zu bytes)", nb, ns);
  CHECK_MSG(predicted == ns, "file_size said %llu, the file has %zu bytes",
            (unsigned long long)predicted, ns);
  /* every row asked for exactly once, in order, in blocks that fit the stream block */
  for (int i = 0; i < N_SPECS; i++) {
    size_t row_bytes, n = bytes_of(&g_specs[i], &row_bytes);
    CHECK(!src[i].out_of_order);
    CHECK(src[i].next_row == (int64_t)(n / row_bytes));
    CHECK(src[i].max_rows == 1 || (size_t)src[i].max_rows * row_bytes <= TSR_GGUF_STREAM_BLOCK);
  }
  CHECK_MSG(src[N_SPECS - 1].calls > 1, "the large tensor came in %lld call(s)",
            (long long)src[N_SPECS - 1].calls);
  /* and the reader sees the producer's bytes */
  struct tsr_gguf *g;
  CHECK_OK(tsr_gguf_open(streamed, &g));
  const struct tsr_gguf_tensor *t = tsr_gguf_find_tensor(g, "d.weight");
  CHECK(t && t->nbytes == bytes_of(&g_specs[3], &(size_t){0}) &&
        memcmp(t->data, data[3], t->nbytes) == 0);
  tsr_gguf_close(g);
  free(b);
  free(s);
  for (int i = 0; i < N_SPECS; i++) free(data[i]);
  tsr_gguf_writer_free(wb);
  tsr_gguf_writer_free(ws);
  unlink(buffered);
  unlink(streamed);
}

static void producer_error_aborts_the_write_and_leaves_no_file(void) {
  char path[512];
  path_of(path, sizeof path, "failed.gguf");
  int before = count_dir_entries();
  struct tsr_gguf_writer *w = writer_with_keys();
  size_t row_bytes;
  bytes_of(&g_specs[3], &row_bytes);
  struct rows_src src = {.tag = 3, .row_bytes = row_bytes, .fail_at = 700};
  CHECK_OK(tsr_gguf_writer_add_tensor_rows(w, "d.weight", TSR_Q8_0, 3, g_specs[3].ne, produce,
                                           &src));
  tsr_status st = tsr_gguf_writer_write(w, path);
  CHECK(st == TSR_ERR_INVALID_ARG);
  CHECK_MSG(strstr(tsr_error_message(), "producer refused row 700") &&
                strstr(tsr_error_message(), "d.weight"),
            "message: %s", tsr_error_message());
  CHECK(access(path, F_OK) != 0);
  CHECK(count_dir_entries() == before); /* the temporary is gone too */
  tsr_gguf_writer_free(w);
}

static void zero_tensor_reads_as_zeros_and_is_a_hole(void) {
  char path[512];
  path_of(path, sizeof path, "holes.gguf");
  struct tsr_gguf_writer *w = writer_with_keys();
  const int64_t ne[2] = {4096, 8192}; /* 64 MiB of f16 zeros, then a small tensor */
  const float tail[4] = {1, 2, 3, 4};
  CHECK_OK(tsr_gguf_writer_add_tensor(w, "zeros.weight", TSR_F16, 2, ne, NULL));
  CHECK_OK(tsr_gguf_writer_add_tensor(w, "tail.weight", TSR_F32, 1, (int64_t[]){4}, tail));
  CHECK_OK(tsr_gguf_writer_add_tensor(w, "end.weight", TSR_F16, 2, ne, NULL)); /* ends in a hole */
  CHECK_OK(tsr_gguf_writer_write(w, path));
  struct stat sb;
  CHECK(stat(path, &sb) == 0);
  uint64_t predicted;
  CHECK_OK(tsr_gguf_writer_file_size(w, &predicted));
  CHECK((uint64_t)sb.st_size == predicted && sb.st_size > 128 << 20);
  /* a filesystem without holes would store them: the file still reads right */
  CHECK_MSG((uint64_t)sb.st_blocks * 512 < (uint64_t)sb.st_size / 8,
            "%lld bytes allocated for a %lld-byte file of holes", (long long)sb.st_blocks * 512,
            (long long)sb.st_size);
  struct tsr_gguf *g;
  CHECK_OK(tsr_gguf_open(path, &g));
  const struct tsr_gguf_tensor *z = tsr_gguf_find_tensor(g, "end.weight");
  const struct tsr_gguf_tensor *t = tsr_gguf_find_tensor(g, "tail.weight");
  CHECK(z && t && memcmp(t->data, tail, sizeof tail) == 0);
  int nonzero = 0;
  for (size_t i = 0; z && i < z->nbytes; i += 4093) nonzero |= ((const unsigned char *)z->data)[i];
  CHECK(z && !nonzero && ((const unsigned char *)z->data)[z->nbytes - 1] == 0);
  tsr_gguf_close(g);
  tsr_gguf_writer_free(w);
  unlink(path);
}

/* VmHWM: the peak resident set of this process so far, in bytes. */
static uint64_t peak_rss(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  unsigned long long kb = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %llu kB", &kb) == 1) break;
  if (f) fclose(f);
  return (uint64_t)kb * 1024;
}

static void peak_memory_does_not_grow_with_the_file(void) {
  char path[512];
  path_of(path, sizeof path, "large.gguf");
  struct tsr_gguf_writer *w = writer_with_keys();
  /* 8 tensors of 40 MB each: a 320 MB file */
  const int64_t ne[2] = {5120, 4096};
  struct rows_src src[8];
  for (int i = 0; i < 8; i++) {
    char name[32];
    snprintf(name, sizeof name, "big.%d.weight", i);
    src[i] = (struct rows_src){.tag = 100 + i, .row_bytes = 5120 * 2, .fail_at = -1};
    CHECK_OK(tsr_gguf_writer_add_tensor_rows(w, name, TSR_BF16, 2, ne, produce, &src[i]));
  }
  uint64_t before = peak_rss();
  CHECK_OK(tsr_gguf_writer_write(w, path));
  uint64_t after = peak_rss();
  struct stat sb;
  CHECK(stat(path, &sb) == 0 && sb.st_size > 300 << 20);
  CHECK_MSG(before > 0 && after - before < (16u << 20),
            "peak RSS grew by %.1f MiB while writing a %.0f MiB file",
            (after - before) / 1048576.0, sb.st_size / 1048576.0);
  printf("  peak RSS %.1f MiB before, %.1f MiB after writing %.0f MiB\n", before / 1048576.0,
         after / 1048576.0, sb.st_size / 1048576.0);
  tsr_gguf_writer_free(w);
  unlink(path);
}

static void rows_without_a_producer_are_refused(void) {
  struct tsr_gguf_writer *w = writer_with_keys();
  CHECK(tsr_gguf_writer_add_tensor_rows(w, "x.weight", TSR_F32, 1, (int64_t[]){4}, NULL, NULL) ==
        TSR_ERR_INVALID_ARG);
  /* and a streamed tensor is held to the same shape rules as any other */
  CHECK(tsr_gguf_writer_add_tensor_rows(w, "y.weight", TSR_Q4_K, 2, (int64_t[]){100, 2}, produce,
                                        NULL) == TSR_ERR_INVALID_ARG);
  CHECK(strstr(tsr_error_message(), "block size") != NULL);
  tsr_gguf_writer_free(w);
}

int main(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/tsr_test_gguf_stream_XXXXXX");
  if (!mkdtemp(g_dir)) {
    perror("mkdtemp");
    return 1;
  }
  /* first: the peak is measured from a process that has not yet held much */
  TSR_RUN(peak_memory_does_not_grow_with_the_file);
  TSR_RUN(streamed_file_is_byte_identical_to_buffered);
  TSR_RUN(producer_error_aborts_the_write_and_leaves_no_file);
  TSR_RUN(zero_tensor_reads_as_zeros_and_is_a_hole);
  TSR_RUN(rows_without_a_producer_are_refused);
  remove_dir();
  return TSR_TEST_EXIT();
}
