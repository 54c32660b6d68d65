/* arch_qwen's layer plans, read back from GGUFs written here. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "model/gguf.h"
#include "tests/harness.h"
#include "tests/arch_test_util.h"
#include "abi/plugin_host.h"

static const char *g_plugin_dir;

/* Writes a GGUF holding only the keys a test names; returns its path. */
static const char *write_model(const char *arch, int hybrid, int nextn, int drop_heads) {
  static char path[256];
  snprintf(path, sizeof path, "/tmp/tsr_arch_qwen_%d_%s_%d%d%d.gguf", (int)getpid(), arch, hybrid,
           nextn, drop_heads);
  struct tsr_gguf_writer *w;
  CHECK_OK(tsr_gguf_writer_new(&w));
  char key[96];
#define U32(suffix, v)                                      \
  do {                                                      \
    snprintf(key, sizeof key, "%s." suffix, arch);          \
    CHECK_OK(tsr_gguf_writer_add_u32(w, key, (uint32_t)(v))); \
  } while (0)
  CHECK_OK(tsr_gguf_writer_add_str(w, "general.architecture", arch));
  U32("block_count", 8 + nextn);
  U32("embedding_length", 256);
  if (!drop_heads) U32("attention.head_count", 8);
  U32("attention.head_count_kv", 2);
  U32("attention.key_length", hybrid ? 64 : 32);
  U32("attention.value_length", hybrid ? 64 : 32);
  if (hybrid) {
    U32("full_attention_interval", 4);
    U32("ssm.conv_kernel", 4);
    U32("ssm.state_size", 16);
    U32("ssm.group_count", 2);
    U32("ssm.time_step_rank", 4);
    U32("ssm.inner_size", 4 * 16);
  }
  if (nextn) U32("nextn_predict_layers", nextn);
#undef U32
  CHECK_OK(tsr_gguf_writer_write(w, path));
  tsr_gguf_writer_free(w);
  return path;
}

static tsr_status describe(const char *path, struct tsr_arch_layer *layers, int32_t *n) {
  tsr_status st = tsr_test_describe("arch_qwen", g_plugin_dir, path, layers, n);
  unlink(path);
  return st;
}

static void test_qwen3_layers_are_all_full_attention(void) {
  struct tsr_arch_layer l[64];
  int32_t n = 0;
  CHECK_OK(describe(write_model("qwen3", 0, 0, 0), l, &n));
  CHECK(n == 8);
  for (int i = 0; i < n; i++)
    CHECK(l[i].kind == TSR_LAYER_FULL && l[i].n_head == 8 && l[i].n_head_kv == 2 &&
          l[i].head_dim_k == 32 && l[i].head_dim_v == 32 && l[i].state_bytes == 0);
}

static void test_qwen35_interleaves_linear_and_full_layers(void) {
  struct tsr_arch_layer l[64];
  int32_t n = 0;
  CHECK_OK(describe(write_model("qwen35", 1, 1, 0), l, &n));
  CHECK(n == 9);
  for (int i = 0; i < 8; i++) CHECK(l[i].kind == ((i + 1) % 4 ? TSR_LAYER_LINEAR : TSR_LAYER_FULL));
  CHECK(l[8].kind == TSR_LAYER_FULL); /* the NextN block keeps its own KV cache */
  /* f32 state: 3 conv inputs x (2*2*16 + 4*16) channels + 4 heads x 16 x 16 */
  CHECK(l[0].state_bytes == 4 * (3 * (2 * 2 * 16 + 4 * 16) + 4 * 16 * 16));
  CHECK(l[3].head_dim_k == 64 && l[3].state_bytes == 0);
}

static void test_missing_key_is_named(void) {
  struct tsr_arch_layer l[64];
  int32_t n = 0;
  CHECK(describe(write_model("qwen3", 0, 0, 1), l, &n) != TSR_OK);
  CHECK_MSG(strstr(tsr_error_message(), "qwen3.attention.head_count") != NULL, "%s",
            tsr_error_message());
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PLUGIN_DIR\n", argv[0]);
    return 2;
  }
  g_plugin_dir = argv[1];
  TSR_RUN(test_qwen3_layers_are_all_full_attention);
  TSR_RUN(test_qwen35_interleaves_linear_and_full_layers);
  TSR_RUN(test_missing_key_is_named);
  return TSR_TEST_EXIT();
}
