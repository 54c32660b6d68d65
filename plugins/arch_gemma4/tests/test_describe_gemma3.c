/* arch_gemma4's layer plan of `gemma3` GGUFs, written here with the core's writer
** the way llama.cpp's converter writes Gemma 3: one head dim for both layer kinds and
** no sliding pattern key (the loader implies 5 sliding layers, then a full one). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "model/gguf.h"
#include "abi/plugin_host.h"
#include "tests/harness.h"
#include "tests/arch_test_util.h"

static const char *g_plugin_dir;

struct g3_spec {
  int n_layer;
  const bool *pattern; /* NULL: no sliding_window_pattern key */
  bool drop_key_length;
};

static const char *write_gemma3(const struct g3_spec *m) {
  static char path[256];
  static int serial;
  snprintf(path, sizeof path, "/tmp/tsr_arch_gemma3_%d_%d.gguf", (int)getpid(), serial++);
  struct tsr_gguf_writer *w;
  CHECK_OK(tsr_gguf_writer_new(&w));
  CHECK_OK(tsr_gguf_writer_add_str(w, "general.architecture", "gemma3"));
  /* the 270M's values */
  CHECK_OK(tsr_gguf_writer_add_u32(w, "gemma3.block_count", (uint32_t)m->n_layer));
  CHECK_OK(tsr_gguf_writer_add_u32(w, "gemma3.embedding_length", 640));
  CHECK_OK(tsr_gguf_writer_add_u32(w, "gemma3.attention.head_count", 4));
  CHECK_OK(tsr_gguf_writer_add_u32(w, "gemma3.attention.head_count_kv", 1));
  if (!m->drop_key_length)
    CHECK_OK(tsr_gguf_writer_add_u32(w, "gemma3.attention.key_length", 256));
  CHECK_OK(tsr_gguf_writer_add_u32(w, "gemma3.attention.value_length", 256));
  CHECK_OK(tsr_gguf_writer_add_u32(w, "gemma3.attention.sliding_window", 512));
  CHECK_OK(tsr_gguf_writer_add_f32(w, "gemma3.rope.freq_base", 1e6f));
  if (m->pattern) {
    uint8_t p[64];
    for (int l = 0; l < m->n_layer; l++) p[l] = m->pattern[l];
    CHECK_OK(tsr_gguf_writer_add_arr(w, "gemma3.attention.sliding_window_pattern", TSR_GGUF_BOOL,
                                     p, (uint64_t)m->n_layer));
  }
  CHECK_OK(tsr_gguf_writer_write(w, path));
  tsr_gguf_writer_free(w);
  return path;
}

/* The plan as the loaded plugin's describe() makes it. */
static tsr_status describe(const char *path, struct tsr_arch_layer *layers, int32_t *n) {
  tsr_status st = tsr_test_describe("arch_gemma4", g_plugin_dir, path, layers, n);
  return st;
}

static void test_every_sixth_layer_is_full_when_the_file_has_no_pattern(void) {
  struct g3_spec m = {18, NULL, false};
  const char *path = write_gemma3(&m);
  struct tsr_arch_layer l[64];
  int32_t n = 0;
  CHECK_OK(describe(path, l, &n));
  CHECK(n == 18);
  for (int i = 0; i < n; i++) {
    const bool full = i == 5 || i == 11 || i == 17;
    CHECK_MSG(l[i].kind == (full ? TSR_LAYER_FULL : TSR_LAYER_SLIDING), "layer %d kind %d", i,
              (int)l[i].kind);
    CHECK(l[i].window == (full ? 0 : 512));
    /* one head dim for both kinds, from key_length/value_length */
    CHECK(l[i].head_dim_k == 256 && l[i].head_dim_v == 256);
    CHECK(l[i].n_head == 4 && l[i].n_head_kv == 1);
    CHECK(l[i].kv_shared_from == 0 && l[i].state_bytes == 0);
  }
  unlink(path);
}

static void test_a_pattern_in_the_file_overrides_the_implied_one(void) {
  static const bool swa[] = {0, 1, 1, 0};
  struct g3_spec m = {4, swa, false};
  const char *path = write_gemma3(&m);
  struct tsr_arch_layer l[64];
  int32_t n = 0;
  CHECK_OK(describe(path, l, &n));
  CHECK(n == 4);
  for (int i = 0; i < 4; i++)
    CHECK_MSG(l[i].kind == (swa[i] ? TSR_LAYER_SLIDING : TSR_LAYER_FULL), "layer %d", i);
  unlink(path);
}

static void test_a_missing_head_dim_is_named(void) {
  struct g3_spec m = {18, NULL, true};
  const char *path = write_gemma3(&m);
  struct tsr_arch_layer l[64];
  int32_t n = 0;
  CHECK(describe(path, l, &n) != TSR_OK);
  CHECK_MSG(strstr(tsr_error_message(), "gemma3.attention.key_length") != NULL, "%s",
            tsr_error_message());
  unlink(path);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PLUGIN_DIR\n", argv[0]);
    return 2;
  }
  g_plugin_dir = argv[1];
  TSR_RUN(test_every_sixth_layer_is_full_when_the_file_has_no_pattern);
  TSR_RUN(test_a_pattern_in_the_file_overrides_the_implied_one);
  TSR_RUN(test_a_missing_head_dim_is_named);
  return TSR_TEST_EXIT();
}
