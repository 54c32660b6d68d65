/* The model-file checks behind an arch's validate() (model_check.h): shape
** and layer-consistency messages, float ranges, and the unused-tensor
** warning, on GGUFs written here. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "model/gguf.h"
#include "graph/graph.h"
#include "harness.h"
#include "model/model_check.h"
#include "abi/plugin_graph_api.h"

#define N_LAYERS 10

static int has(const char *needle) {
  const char *msg = tsr_error_message();
  if (strstr(msg, needle)) return 1;
  fprintf(stderr, "  message: %s\n  lacks:   %s\n", msg, needle);
  return 0;
}

/* Arch "t": t.embedding_length 8, token_embd.weight [8, 16], blk.L.n.weight [8]
** in every layer but those `skip` names (a bit per layer), float keys as given. */
static struct tsr_gguf *open_model(unsigned skip, float eps, float arr2) {
  char path[] = "/tmp/tsr_test_model_check_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) {
    perror("mkstemp");
    exit(1);
  }
  close(fd);
  struct tsr_gguf_writer *w;
  CHECK_OK(tsr_gguf_writer_new(&w));
  CHECK_OK(tsr_gguf_writer_add_str(w, "general.architecture", "t"));
  CHECK_OK(tsr_gguf_writer_add_u32(w, "t.embedding_length", 8));
  CHECK_OK(tsr_gguf_writer_add_f32(w, "t.eps", eps));
  const float arr[3] = {1.0f, 2.0f, arr2};
  CHECK_OK(tsr_gguf_writer_add_arr(w, "t.arr", TSR_GGUF_F32, arr, 3));
  /* outside the arch's keys: a -inf score is a tokenizer's business */
  const float scores[2] = {0.0f, -INFINITY};
  CHECK_OK(tsr_gguf_writer_add_arr(w, "tokenizer.ggml.scores", TSR_GGUF_F32, scores, 2));
  CHECK_OK(tsr_gguf_writer_add_tensor(w, "token_embd.weight", TSR_F32, 2, (int64_t[]){8, 16},
                                      NULL));
  CHECK_OK(tsr_gguf_writer_add_tensor(w, "col.weight", TSR_F32, 2, (int64_t[]){8, 1}, NULL));
  CHECK_OK(tsr_gguf_writer_add_tensor(w, "exps.weight", TSR_F32, 3, (int64_t[]){8, 4, 2}, NULL));
  for (int l = 0; l < N_LAYERS; l++) {
    if (skip >> l & 1) continue;
    char name[64];
    snprintf(name, sizeof name, "blk.%d.n.weight", l);
    CHECK_OK(tsr_gguf_writer_add_tensor(w, name, TSR_F32, 1, (int64_t[]){8}, NULL));
  }
  CHECK_OK(tsr_gguf_writer_write(w, path));
  tsr_gguf_writer_free(w);
  struct tsr_gguf *g = NULL;
  CHECK_OK(tsr_gguf_open(path, &g));
  unlink(path); /* the mapping stays */
  if (!g) exit(1);
  return g;
}

static void test_shape_mismatch_names_the_key_and_both_sizes(void) {
  struct tsr_gguf *g = open_model(0, 1e-6f, 3.0f);
  CHECK_OK(tsr_model_check_weight(g, "token_embd.weight", 2, (int64_t[]){8, 16}, NULL));
  CHECK_OK(tsr_model_check_weight(g, "token_embd.weight", 2, (int64_t[]){-1, 16}, NULL));
  /* a stored trailing dim of 1 is the same tensor */
  CHECK_OK(tsr_model_check_weight(g, "col.weight", 1, (int64_t[]){8}, NULL));
  CHECK(tsr_model_check_weight(g, "token_embd.weight", 2, (int64_t[]){10, 16},
                               (const char *[]){"t.embedding_length", NULL}) == TSR_ERR_FORMAT);
  CHECK(has("t.embedding_length is 10 but token_embd.weight has 8 columns (shape [8, 16])"));
  CHECK(tsr_model_check_weight(g, "token_embd.weight", 2, (int64_t[]){8, 17},
                               (const char *[]){NULL, "tokenizer.ggml.tokens' count"}) != TSR_OK);
  CHECK(has("tokenizer.ggml.tokens' count is 17 but token_embd.weight has 16 rows"));
  CHECK(tsr_model_check_weight(g, "exps.weight", 3, (int64_t[]){8, 4, 3},
                               (const char *[]){NULL, NULL, "t.expert_count"}) != TSR_OK);
  CHECK(has("t.expert_count is 3 but exps.weight has 2 in dim 2 (shape [8, 4, 2])"));
  /* no reason given: both shapes */
  CHECK(tsr_model_check_weight(g, "exps.weight", 2, (int64_t[]){8, 4}, NULL) != TSR_OK);
  CHECK(has("exps.weight has shape [8, 4, 2], expected [8, 4]"));
  CHECK(tsr_model_check_weight(g, "absent.weight", 1, (int64_t[]){8}, NULL) == TSR_ERR_FORMAT);
  CHECK(has("tensor absent.weight is missing (expected [8])"));
  int32_t n_dims = 0;
  int64_t ne[4] = {0};
  CHECK_OK(tsr_model_weight_shape(g, "exps.weight", &n_dims, ne));
  CHECK(n_dims == 3 && ne[0] == 8 && ne[1] == 4 && ne[2] == 2 && ne[3] == 1);
  CHECK(tsr_model_weight_shape(g, "absent.weight", &n_dims, ne) == TSR_ERR_FORMAT);
  tsr_gguf_close(g);
}

static const int32_t g_all[N_LAYERS] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};

static void test_a_layer_tensor_is_in_every_layer_or_none(void) {
  bool present = false;
  struct tsr_gguf *g = open_model(0, 1e-6f, 3.0f);
  CHECK_OK(tsr_model_check_layer_weights(g, "n.weight", g_all, N_LAYERS, &present));
  CHECK(present);
  CHECK_OK(tsr_model_check_layer_weights(g, "absent.weight", g_all, N_LAYERS, &present));
  CHECK(!present);
  tsr_gguf_close(g);

  g = open_model(1u << 3 | 1u << 7, 1e-6f, 3.0f);
  CHECK(tsr_model_check_layer_weights(g, "n.weight", g_all, N_LAYERS, &present) ==
        TSR_ERR_FORMAT);
  CHECK(has("blk.3.n.weight is missing (layers 0-2, 4-6, 8-9 have it)"));
  /* a subset: only the layers listed count */
  CHECK_OK(tsr_model_check_layer_weights(g, "n.weight", (int32_t[]){0, 4, 8}, 3, &present));
  CHECK(tsr_model_check_layer_weights(g, "n.weight", (int32_t[]){0, 7}, 2, &present) != TSR_OK);
  CHECK(has("blk.7.n.weight is missing (layer 0 has it)"));
  tsr_gguf_close(g);

  /* the first layer lacks it: a stray one in a later layer is refused too */
  g = open_model(~(1u << 5), 1e-6f, 3.0f);
  CHECK(tsr_model_check_layer_weights(g, "n.weight", g_all, N_LAYERS, &present) != TSR_OK);
  CHECK(has("blk.5.n.weight is present but layers 0-4, 6-9 lack it"));
  tsr_gguf_close(g);

  /* every other layer: each run a single layer */
  g = open_model(0x2aa, 1e-6f, 3.0f);
  CHECK(tsr_model_check_layer_weights(g, "n.weight", g_all, N_LAYERS, &present) != TSR_OK);
  CHECK(has("blk.1.n.weight is missing (layers 0, 2, 4, 6, 8 have it)"));
  tsr_gguf_close(g);
}

static void test_float_hyperparameters_must_be_finite(void) {
  float v = 0;
  struct tsr_gguf *g = open_model(0, 1e-6f, 3.0f);
  CHECK_OK(tsr_model_check_floats(g)); /* the tokenizer's -inf is not the arch's */
  CHECK_OK(tsr_model_f32_positive(g, "t.eps", &v));
  CHECK(v == 1e-6f);
  tsr_gguf_close(g);
  const float bad[] = {INFINITY, NAN, 0.0f, -1.0f};
  const char *want[] = {"t.eps is inf: must be a finite positive number",
                        "t.eps is nan: must be a finite positive number",
                        "t.eps is 0: must be a finite positive number",
                        "t.eps is -1: must be a finite positive number"};
  for (int i = 0; i < 4; i++) {
    g = open_model(0, bad[i], 3.0f);
    CHECK(tsr_model_f32_positive(g, "t.eps", &v) == TSR_ERR_FORMAT);
    CHECK(has(want[i]));
    tsr_gguf_close(g);
  }
  g = open_model(0, NAN, 3.0f);
  CHECK(tsr_model_check_floats(g) == TSR_ERR_FORMAT);
  CHECK(has("t.eps is nan: must be a finite number"));
  tsr_gguf_close(g);
  g = open_model(0, 1e-6f, -INFINITY);
  CHECK(tsr_model_check_floats(g) == TSR_ERR_FORMAT);
  CHECK(has("t.arr[2] is -inf: must be a finite number"));
  tsr_gguf_close(g);
}

/* The warning's line, read back from a temporary file. */
static void warn_line(const struct tsr_gguf *g, const bool *used, int64_t *n_unused, char *line,
                      size_t cap) {
  FILE *f = tmpfile();
  if (!f) exit(1);
  *n_unused = tsr_model_warn_unused(g, used, f);
  rewind(f);
  line[0] = '\0';
  if (!fgets(line, (int)cap, f)) line[0] = '\0';
  char extra[8];
  CHECK(!fgets(extra, sizeof extra, f)); /* one line at most */
  fclose(f);
}

static void test_tensors_no_graph_reads_are_warned_of_in_one_line(void) {
  struct tsr_gguf *g = open_model(0, 1e-6f, 3.0f);
  const int64_t n = tsr_gguf_n_tensors(g);
  bool used[32] = {0};
  CHECK(n == 13 && n <= 32);
  /* a graph reading two weights through the plugins' call */
  struct tsr_graph *gr = tsr_graph_new(64);
  CHECK(tsr_api_weight(gr, g, "token_embd.weight") != NULL);
  CHECK(tsr_api_weight(gr, g, "blk.4.n.weight") != NULL);
  tsr_model_note_used(g, gr, used);
  tsr_graph_free(gr);
  int64_t n_used = 0;
  for (int64_t i = 0; i < n; i++) n_used += used[i];
  CHECK(n_used == 2);
  CHECK(used[0]); /* token_embd.weight, written first */

  int64_t n_unused;
  char line[1024];
  warn_line(g, used, &n_unused, line, sizeof line);
  CHECK(n_unused == 11);
  CHECK_MSG(strstr(line, "11 of its 13 tensors are read by no t graph") && strstr(line, "col.weight") &&
                strstr(line, ", ...") && !strstr(line, "token_embd.weight"),
            "%s", line);

  for (int64_t i = 0; i < n; i++) used[i] = true;
  used[1] = false; /* col.weight */
  warn_line(g, used, &n_unused, line, sizeof line);
  CHECK(n_unused == 1);
  CHECK_MSG(strstr(line, "1 of its 13 tensors is read by no t graph (ignored): col.weight\n"),
            "%s", line);

  used[1] = true;
  warn_line(g, used, &n_unused, line, sizeof line);
  CHECK(n_unused == 0 && line[0] == '\0');
  tsr_gguf_close(g);
}

int main(void) {
  TSR_RUN(test_shape_mismatch_names_the_key_and_both_sizes);
  TSR_RUN(test_a_layer_tensor_is_in_every_layer_or_none);
  TSR_RUN(test_float_hyperparameters_must_be_finite);
  TSR_RUN(test_tensors_no_graph_reads_are_warned_of_in_one_line);
  return TSR_TEST_EXIT();
}
