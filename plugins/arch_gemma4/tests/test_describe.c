/* arch_gemma4's layer plans, from GGUFs written here with the core's writer. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "model/gguf.h"
#include "gguf_hparams.h"
#include "abi/plugin_host.h"
#include "tests/harness.h"
#include "tests/arch_test_util.h"

static const char *g_plugin_dir;

struct model_spec {
  const char *arch;
  int n_layer;
  const bool *swa;
  const int32_t *kv;  /* per layer, or NULL: scalar kv_scalar */
  int32_t kv_scalar;
  int n_shared;
  bool drop_pattern;
};

static const char *write_model(const struct model_spec *m) {
  static char path[256];
  static int serial;
  snprintf(path, sizeof path, "/tmp/tsr_arch_gemma4_%d_%d.gguf", (int)getpid(), serial++);
  struct tsr_gguf_writer *w;
  CHECK_OK(tsr_gguf_writer_new(&w));
  char key[128];
#define U32(suffix, v)                                         \
  do {                                                         \
    snprintf(key, sizeof key, "%s." suffix, m->arch);          \
    CHECK_OK(tsr_gguf_writer_add_u32(w, key, (uint32_t)(v)));  \
  } while (0)
  CHECK_OK(tsr_gguf_writer_add_str(w, "general.architecture", m->arch));
  U32("block_count", m->n_layer);
  U32("embedding_length", 64);
  U32("attention.head_count", 4);
  U32("attention.key_length", 512);
  U32("attention.value_length", 512);
  U32("attention.key_length_swa", 256);
  U32("attention.value_length_swa", 256);
  U32("attention.sliding_window", 32);
  U32("attention.shared_kv_layers", m->n_shared);
  snprintf(key, sizeof key, "%s.attention.head_count_kv", m->arch);
  if (m->kv)
    CHECK_OK(tsr_gguf_writer_add_arr(w, key, TSR_GGUF_I32, m->kv, (uint64_t)m->n_layer));
  else
    U32("attention.head_count_kv", m->kv_scalar);
  if (!m->drop_pattern) {
    uint8_t pattern[64];
    for (int l = 0; l < m->n_layer; l++) pattern[l] = m->swa[l];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", m->arch);
    CHECK_OK(tsr_gguf_writer_add_arr(w, key, TSR_GGUF_BOOL, pattern, (uint64_t)m->n_layer));
  }
#undef U32
  CHECK_OK(tsr_gguf_writer_write(w, path));
  tsr_gguf_writer_free(w);
  return path;
}

/* The plan as gemma4_plan makes it from the file (read by the test). */
static tsr_status plan_of(const char *path, struct tsr_arch_layer *layers, int32_t *kv_source) {
  struct tsr_gguf *g;
  struct gemma4_hparams hp;
  tsr_status st = tsr_gguf_open(path, &g);
  if (st != TSR_OK) return st;
  st = hparams_from_gguf(g, &hp);
  if (st == TSR_OK)
    st = gemma4_plan(tsr_plugin_host_services(), "test", &hp, layers, 64, kv_source);
  tsr_gguf_close(g);
  return st;
}

/* The plan as the loaded plugin's describe() makes it. */
static tsr_status describe(const char *path, struct tsr_arch_layer *layers, int32_t *n) {
  tsr_status st = tsr_test_describe("arch_gemma4", g_plugin_dir, path, layers, n);
  return st;
}

static const bool k_dense_swa[] = {1, 1, 0, 1, 0};
static const int32_t k_dense_kv[] = {2, 2, 1, 2, 1};
static const bool k_e2b_swa[] = {1, 1, 1, 0, 1, 1, 1, 0};

static void test_dense_layers_slide_by_pattern_with_their_own_head_dims(void) {
  struct model_spec m = {"gemma4", 5, k_dense_swa, k_dense_kv, 0, 0, false};
  const char *path = write_model(&m);
  struct tsr_arch_layer l[64];
  int32_t src[64];
  CHECK_OK(plan_of(path, l, src));
  for (int i = 0; i < 5; i++) {
    bool swa = k_dense_swa[i];
    CHECK(l[i].kind == (swa ? TSR_LAYER_SLIDING : TSR_LAYER_FULL));
    CHECK(l[i].n_head == 4 && l[i].n_head_kv == k_dense_kv[i] && src[i] == GEMMA4_KV_OWN);
    CHECK(l[i].head_dim_k == (swa ? 256 : 512) && l[i].head_dim_v == l[i].head_dim_k);
    CHECK(l[i].window == (swa ? 32 : 0) && l[i].state_bytes == 0);
  }
  unlink(path);
}

static void test_kv_shared_layers_own_no_cache_and_read_the_last_owner_of_their_kind(void) {
  struct model_spec m = {"gemma4", 8, k_e2b_swa, NULL, 1, 4, false};
  const char *path = write_model(&m);
  struct tsr_arch_layer l[64];
  int32_t src[64];
  CHECK_OK(plan_of(path, l, src));
  static const int32_t want_src[] = {-1, -1, -1, -1, 2, 2, 2, 3};
  for (int i = 0; i < 8; i++) {
    CHECK_MSG(src[i] == want_src[i], "layer %d reads %d", i, src[i]);
    CHECK(l[i].n_head_kv == 1 && l[i].kv_shared_from == (i < 4 ? 0 : want_src[i] + 1));
    CHECK(l[i].head_dim_k == (k_e2b_swa[i] ? 256 : 512)); /* the dims of the K/V it reads */
  }
  unlink(path);
}

static void test_assistant_layers_all_read_the_target(void) {
  static const bool swa[] = {1, 1, 1, 0};
  struct model_spec m = {"gemma4-assistant", 4, swa, NULL, 1, 4, false};
  const char *path = write_model(&m);
  struct tsr_arch_layer l[64];
  int32_t src[64];
  CHECK_OK(plan_of(path, l, src));
  for (int i = 0; i < 4; i++) CHECK(src[i] == GEMMA4_KV_TARGET && l[i].kv_shared_from == -1);
  CHECK(l[3].kind == TSR_LAYER_FULL && l[2].kind == TSR_LAYER_SLIDING && l[2].window == 32);
  unlink(path);
}

static void test_inconsistent_head_counts_are_refused_naming_the_layer(void) {
  static const int32_t kv[] = {2, 3, 1, 2, 1}; /* 4 heads over 3 KV heads */
  struct model_spec m = {"gemma4", 5, k_dense_swa, kv, 0, 0, false};
  const char *path = write_model(&m);
  struct tsr_arch_layer l[64];
  CHECK(plan_of(path, l, NULL) == TSR_ERR_FORMAT);
  CHECK_MSG(strstr(tsr_error_message(), "layer 1") != NULL, "%s", tsr_error_message());
  unlink(path);
}

static void test_more_shared_layers_than_layers_is_refused(void) {
  struct model_spec m = {"gemma4", 5, k_dense_swa, NULL, 1, 6, false};
  const char *path = write_model(&m);
  struct tsr_arch_layer l[64];
  CHECK(plan_of(path, l, NULL) == TSR_ERR_FORMAT);
  CHECK_MSG(strstr(tsr_error_message(), "shared_kv_layers") != NULL, "%s", tsr_error_message());
  unlink(path);
}

/* describe() through the loaded plugin reads the per-layer sliding pattern
** through the host and gives gemma4_plan's plan. */
static void test_plugin_describe_reads_the_per_layer_pattern(void) {
  struct model_spec m = {"gemma4", 8, k_e2b_swa, NULL, 1, 4, false};
  const char *path = write_model(&m);
  struct tsr_arch_layer l[64], want[64];
  int32_t n = 0;
  tsr_status st = describe(path, l, &n);
  CHECK_OK(st);
  CHECK_OK(plan_of(path, want, NULL));
  CHECK(n == 8);
  for (int i = 0; i < 8; i++) /* field by field: padding bytes are unspecified */
    CHECK(l[i].kind == want[i].kind && l[i].n_head == want[i].n_head &&
          l[i].n_head_kv == want[i].n_head_kv && l[i].head_dim_k == want[i].head_dim_k &&
          l[i].head_dim_v == want[i].head_dim_v && l[i].window == want[i].window &&
          l[i].state_bytes == want[i].state_bytes &&
          l[i].kv_shared_from == want[i].kv_shared_from);
  unlink(path);
}

static void test_plugin_describe_names_a_missing_pattern(void) {
  struct model_spec m = {"gemma4", 5, k_dense_swa, NULL, 1, 0, true};
  const char *path = write_model(&m);
  struct tsr_arch_layer l[64];
  int32_t n = 0;
  CHECK(describe(path, l, &n) == TSR_ERR_FORMAT);
  CHECK_MSG(strstr(tsr_error_message(), "gemma4.attention.sliding_window_pattern") != NULL, "%s",
            tsr_error_message());
  unlink(path);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PLUGIN_DIR\n", argv[0]);
    return 2;
  }
  g_plugin_dir = argv[1];
  TSR_RUN(test_dense_layers_slide_by_pattern_with_their_own_head_dims);
  TSR_RUN(test_kv_shared_layers_own_no_cache_and_read_the_last_owner_of_their_kind);
  TSR_RUN(test_assistant_layers_all_read_the_target);
  TSR_RUN(test_inconsistent_head_counts_are_refused_naming_the_layer);
  TSR_RUN(test_more_shared_layers_than_layers_is_refused);
  TSR_RUN(test_plugin_describe_reads_the_per_layer_pattern);
  TSR_RUN(test_plugin_describe_names_a_missing_pattern);
  return TSR_TEST_EXIT();
}
