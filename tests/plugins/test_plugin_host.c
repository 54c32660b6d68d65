/*
** The plugin host end to end: the built-in core plugin, loading from a
** profile, the out-of-tree example A/B-swapped against flash, ABI and
** manifest refusals, rollback, settings validation, negotiation errors and
** engagement. argv: BUILD_ROOT BAD_PLUGIN_DIR OUT_OF_TREE_DIR
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graph/backend.h"
#include "abi/composition.h"
#include "abi/setup.h"
#include "tests/harness.h"

static const char *g_build, *g_bad, *g_oot;

/* "a/b" in one of a few rotating buffers (callers use each result at once). */
static const char *path_join(const char *a, const char *b) {
  static char bufs[8][1024];
  static int next;
  char *buf = bufs[next++ % 8];
  snprintf(buf, 1024, "%s/%s", a, b);
  return buf;
}

/* The folder of one out-of-tree build variant of the example plugin. */
static const char *example_dir(const char *variant) {
  static char buf[1024];
  snprintf(buf, sizeof buf, "%s/%s/example_attention", g_oot, variant);
  return buf;
}

static void test_core_plugin_registers_flash_and_codecs(void) {
  struct tsr_plugin_host *h;
  CHECK_OK(tsr_plugin_host_new(&h));
  const struct tsr_plugin *owner = NULL;
  CHECK(tsr_plugin_host_attention(h, "flash", &owner) != NULL);
  CHECK(owner && !strcmp(tsr_plugin_name(owner), "core"));
  CHECK(tsr_plugin_host_kv_codec(h, "q8_0", NULL) != NULL);
  CHECK(tsr_plugin_host_kv_codec(h, "q9_0", NULL) == NULL);
  tsr_plugin_host_free(h);
}

/* A plugin built for ABI 1 (what every plugin said before major 2) or for the next
** major is refused, naming its version and the host's. */
static void test_abi_major_mismatch_names_both_versions(void) {
  /* build_out_of_tree.sh's skewed copies: the previous major with the next minor, and
  ** the next major */
  char prev[32], next[32], ours[64];
  snprintf(prev, sizeof prev, "ABI %d.%d", TSR_PLUGIN_ABI_MAJOR - 1, TSR_PLUGIN_ABI_MINOR + 1);
  snprintf(next, sizeof next, "ABI %d.%d", TSR_PLUGIN_ABI_MAJOR + 1, TSR_PLUGIN_ABI_MINOR);
  snprintf(ours, sizeof ours, "ABI %d.%d (majors must match)", TSR_PLUGIN_ABI_MAJOR,
           TSR_PLUGIN_ABI_MINOR);
  const struct {
    const char *dir, *plugin_abi;
  } cases[] = {{"abi1", prev}, {"next_major", next}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct tsr_plugin_host *h;
    CHECK_OK(tsr_plugin_host_new(&h));
    const char *dir = example_dir(cases[i].dir);
    CHECK_ERR_HAS(tsr_plugin_host_load(h, "example_attention", dir, NULL, 0, NULL),
                  cases[i].plugin_abi);
    CHECK(strstr(tsr_error_message(), ours) != NULL);
    CHECK(tsr_plugin_host_attention(h, "example_attention", NULL) == NULL);
    tsr_plugin_host_free(h);
  }
}

static void test_newer_abi_minor_is_refused(void) {
  struct tsr_plugin_host *h;
  CHECK_OK(tsr_plugin_host_new(&h));
  const char *dir = example_dir("newer_minor");
  CHECK_ERR_HAS(tsr_plugin_host_load(h, "example_attention", dir, NULL, 0, NULL), "newer");
  char newer[16];
  snprintf(newer, sizeof newer, "%d.%d", TSR_PLUGIN_ABI_MAJOR, TSR_PLUGIN_ABI_MINOR + 1);
  CHECK(strstr(tsr_error_message(), newer) != NULL);
  tsr_plugin_host_free(h);
}

static void test_misbehaving_plugins_are_refused_precisely(void) {
  struct {
    const char *ini, *needle;
  } cases[] = {
      {"bad_manifest.ini", "says version 2.0.0"},
      {"bad_duplicate.ini", "already registered by plugin core"},
      {"bad_init_fails.ini", "refusing to start on purpose"},
      {"bad_undeclared.ini", "does not provide kv_codec"},
      {"bad_counts.ini", "lists 1 interfaces it provides, the library bad_counts counts 1000000"},
      {"bad_no_entry.ini", "does not export tsr_plugin_entry"},
      {"bad_short.ini", "less than ABI 2.0's"},
      {"bad_state.ini", "kv codec 'bad_codec' declares 9 state tensors: 0..4"},
      {"bad_read.ini", "kernels[0] has a read symbol without reads()"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct tsr_plugin_host *h;
    CHECK_OK(tsr_plugin_host_new(&h));
    CHECK_ERR_HAS(tsr_plugin_host_load(h, NULL, path_join(g_bad, cases[i].ini), NULL, 0, NULL),
                  cases[i].needle);
    /* whatever it registered before failing is gone */
    CHECK(tsr_plugin_host_attention(h, "bad_attention", NULL) == NULL);
    CHECK(tsr_plugin_host_n_plugins(h) == 1);
    tsr_plugin_host_free(h);
  }
}

static void test_unmet_requirement_is_named(void) {
  struct tsr_plugin_host *h;
  CHECK_OK(tsr_plugin_host_new(&h));
  CHECK_OK(tsr_plugin_host_load(h, NULL, path_join(g_bad, "bad_requires.ini"), NULL, 0, NULL));
  CHECK_ERR_HAS(tsr_plugin_host_check_requires(h), "requires speculator:1");
  tsr_plugin_host_free(h);
}

static void test_plugin_without_code_and_missing_plugin(void) {
  struct tsr_plugin_host *h;
  CHECK_OK(tsr_plugin_host_new(&h));
  /* a manifest without a library: a plugin folder whose code is not written yet */
  const char *ini = path_join(g_bad, "no_code_yet.ini");
  FILE *f = fopen(ini, "w");
  CHECK(f != NULL);
  if (f) {
    fputs("[plugin]\nname = no_code_yet\nversion = 0.0.0\nabi = 2.2\nprovides = attention:1\n"
          "requires =\ndescription = not written yet\n", f);
    fclose(f);
  }
  CHECK_ERR_HAS(tsr_plugin_host_load(h, NULL, ini, NULL, 0, NULL), "has no code yet");
  CHECK_ERR_HAS(tsr_plugin_host_load(h, "no_such_plugin", NULL, NULL, 0, NULL),
                "not found on the search path");
  tsr_plugin_host_free(h);
}

static void test_settings_are_validated_against_the_declaration(void) {
  const char *dir = example_dir("good");
  struct tsr_setting_value unknown = {"verbosity", "true", "p.yaml:7:9"};
  struct tsr_setting_value wrong = {"verbose", "yes", "p.yaml:7:18"};
  struct tsr_plugin_host *h;
  CHECK_OK(tsr_plugin_host_new(&h));
  CHECK_ERR_HAS(tsr_plugin_host_load(h, "example_attention", dir, &unknown, 1, NULL),
                "p.yaml:7:9: plugin example_attention has no setting 'verbosity' (settings: verbose)");
  CHECK_ERR_HAS(tsr_plugin_host_load(h, "example_attention", dir, &wrong, 1, NULL),
                "p.yaml:7:18");
  CHECK(strstr(tsr_error_message(), "not true or false") != NULL);
  tsr_plugin_host_free(h);
}

static void test_negotiation_names_layer_plugin_and_codec(void) {
  struct tsr_plugin_host *h;
  CHECK_OK(tsr_plugin_host_new(&h));
  struct tsr_arch_layer layers[3] = {
      {.kind = TSR_LAYER_LINEAR, .state_bytes = 64},
      {.kind = TSR_LAYER_FULL, .n_head = 4, .n_head_kv = 2, .head_dim_k = 64, .head_dim_v = 64},
      {.kind = TSR_LAYER_FULL, .n_head = 4, .n_head_kv = 2, .head_dim_k = 64, .head_dim_v = 64},
  };
  struct tsr_composition_request r = {.backend = "cpu", .attention = "flash", .layers = layers,
                                      .n_layers = 3};
  r.k_codec[TSR_LAYER_FULL] = "q8_0";
  r.v_codec[TSR_LAYER_FULL] = "f16";
  struct tsr_composition c;
  CHECK_OK(tsr_compose(h, &r, &c));
  CHECK(c.n_groups == 2 && c.groups[1].kind == TSR_LAYER_FULL && c.groups[1].n_layers == 2);
  CHECK(c.groups[1].k_path == TSR_READ_IN_REGISTER && c.groups[1].v_path == TSR_READ_NATIVE);
  CHECK(!strcmp(c.groups[1].layer_list, "1-2"));

  r.k_codec[TSR_LAYER_FULL] = "q9_0";
  CHECK_ERR_HAS(tsr_compose(h, &r, &c), "layer 1 (full): K codec 'q9_0' is not registered");
  r.k_codec[TSR_LAYER_FULL] = "q8_0";
  r.backend = "cuda"; /* flash reads the core codecs on cuda as well */
  CHECK_OK(tsr_compose(h, &r, &c));
  r.backend = "vulkan"; /* the codecs are asked first: no codec runs there */
  CHECK_ERR_HAS(tsr_compose(h, &r, &c), "K codec q8_0 (core ");
  CHECK(strstr(tsr_error_message(), "layer 1") != NULL);
  r.backend = "cpu";
  r.attention = "dca";
  CHECK_ERR_HAS(tsr_compose(h, &r, &c), "attention 'dca' is not provided by any loaded plugin");
  r.attention = "flash";
  const char *policy = "sparse_v";
  r.policies = &policy;
  r.n_policies = 1;
  CHECK_ERR_HAS(tsr_compose(h, &r, &c), "decode policy 'sparse_v'");
  tsr_plugin_host_free(h);
}

/* kv.boundary: the first and last N layers that keep K/V (recurrent layers and layers
** reading another's K/V not counted) form groups of their own with the boundary's codecs,
** a layer sharing K/V takes its source's, and a boundary covering every layer is refused. */
static void test_boundary_layers_group_apart(void) {
  struct tsr_plugin_host *h;
  CHECK_OK(tsr_plugin_host_new(&h));
  const struct tsr_arch_layer full = {.kind = TSR_LAYER_FULL, .n_head = 4, .n_head_kv = 2,
                                      .head_dim_k = 64, .head_dim_v = 64};
  const struct tsr_arch_layer lin = {.kind = TSR_LAYER_LINEAR, .state_bytes = 64};
  struct tsr_arch_layer slid = full;
  slid.kind = TSR_LAYER_SLIDING, slid.window = 16;
  /* 0 linear, 1 sliding, 2-5 full, 6 sliding, 7 sliding reading layer 1's K/V */
  struct tsr_arch_layer layers[8] = {lin, slid, full, full, full, full, slid, full};
  layers[7].kind = TSR_LAYER_SLIDING, layers[7].window = 16, layers[7].kv_shared_from = 2;
  struct tsr_composition_request r = {.backend = "cpu", .attention = "flash", .layers = layers,
                                      .n_layers = 8, .boundary_layers = 2, .boundary_k = "q8_0"};
  r.k_codec[TSR_LAYER_FULL] = r.k_codec[TSR_LAYER_SLIDING] = "q4_0";
  r.v_codec[TSR_LAYER_FULL] = "q4_0";
  struct tsr_composition c;
  CHECK_OK(tsr_compose(h, &r, &c));
  /* the layers keeping K/V are 1-6: 1, 2 and 5, 6 are the boundary */
  const char *want_k[8] = {NULL, "q8_0", "q8_0", "q4_0", "q4_0", "q8_0", "q8_0", "q8_0"};
  const char *want_v[8] = {NULL, "f16", "q4_0", "q4_0", "q4_0", "q4_0", "f16", "f16"};
  for (int i = 0; i < 8; i++) {
    const char *k, *v;
    bool boundary;
    tsr_compose_layer_codecs(&r, i, &k, &v, &boundary);
    CHECK_MSG((!k && !want_k[i]) || (k && want_k[i] && !strcmp(k, want_k[i])),
              "layer %d: K %s, want %s", i, k ? k : "none", want_k[i] ? want_k[i] : "none");
    CHECK_MSG((!v && !want_v[i]) || (v && want_v[i] && !strcmp(v, want_v[i])),
              "layer %d: V %s, want %s", i, v ? v : "none", want_v[i] ? want_v[i] : "none");
    CHECK(boundary == (i == 1 || i == 2 || i == 5 || i == 6 || i == 7));
    const struct tsr_composition_group *g = tsr_composition_group_of(&c, &r, i);
    CHECK(g && g->kind == layers[i].kind && (!k || !strcmp(g->k_codec, k)));
  }
  /* linear; sliding boundary 1, 6, 7; full boundary 2, 5; full 3-4 */
  CHECK(c.n_groups == 4);
  CHECK(!strcmp(tsr_composition_group_of(&c, &r, 1)->layer_list, "1,6-7"));
  CHECK(!strcmp(tsr_composition_group_of(&c, &r, 2)->layer_list, "2,5"));
  CHECK(!strcmp(tsr_composition_group_of(&c, &r, 3)->layer_list, "3-4"));
  CHECK(tsr_composition_group_of(&c, &r, 2)->boundary && !tsr_composition_group_of(&c, &r, 3)->boundary);
  CHECK(tsr_composition_group_of(&c, &r, 8) == NULL);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  tsr_composition_print(&c, f);
  fclose(f);
  CHECK(strstr(text, "full    layers 2,5 (2), kv.boundary") != NULL);
  CHECK(strstr(text, "K q8_0 (") != NULL && strstr(text, "K q4_0 (") != NULL);
  free(text);
  /* six layers keep K/V: a boundary of 3 is all of them */
  r.boundary_layers = 3;
  CHECK_ERR_HAS(tsr_compose(h, &r, &c), "kv.boundary.layers 3: the model has 6 layers that keep "
                                        "K/V");
  /* a boundary codec is negotiated as any other: named with its layer */
  r.boundary_layers = 1, r.boundary_k = "q9_0";
  CHECK_ERR_HAS(tsr_compose(h, &r, &c), "layer 1 (sliding): K codec 'q9_0' is not registered");
  tsr_plugin_host_free(h);
}

/* Runs one attention layer through the named implementation; returns the output. */
static float *run_attention(struct tsr_setup *s, const char *attention, const float *q,
                            const uint16_t *k, const uint16_t *v, int D, int Nq, int Nkv, int Hq,
                            int Hkv) {
  const struct tsr_attention_v1 *a = tsr_plugin_host_attention(s->host, attention, NULL);
  CHECK(a != NULL);
  if (!a) return NULL;
  struct tsr_graph *g = tsr_graph_new(32);
  struct tsr_tensor *tq = tsr_new_tensor_3d(g, TSR_F32, D, Nq, Hq);
  struct tsr_tensor *tk = tsr_new_tensor_3d(g, TSR_F16, D, Nkv, Hkv);
  struct tsr_tensor *tv = tsr_new_tensor_3d(g, TSR_F16, D, Nkv, Hkv);
  struct tsr_tensor *qp = tsr_new_tensor_1d(g, TSR_I32, Nq);
  struct tsr_tensor *kp = tsr_new_tensor_1d(g, TSR_I32, Nkv);
  struct tsr_layer_desc d = {.struct_size = sizeof d, .kind = TSR_LAYER_FULL, .n_head = Hq,
                             .n_head_kv = Hkv, .head_dim_k = D, .head_dim_v = D,
                             .k_codec = "f16", .v_codec = "f16", .backend = "cpu"};
  struct tsr_attn_call call = {.struct_size = sizeof call, .layer = &d, .q = tq, .k = tk, .v = tv,
                               .q_pos = qp, .kv_pos = kp, .scale = 0.125f, .causal = true};
  struct tsr_tensor *out = a->build(a->ctx, tsr_plugin_host_services(), g, &call);
  CHECK(out != NULL);
  tsr_graph_mark_output(out);
  struct tsr_graph_plan plan;
  void *arena = NULL;
  float *result = NULL;
  if (out && tsr_graph_alloc(g, &plan, &arena) == TSR_OK) {
    memcpy(tq->data, q, sizeof(float) * D * Nq * Hq);
    memcpy(tk->data, k, sizeof(uint16_t) * D * Nkv * Hkv);
    memcpy(tv->data, v, sizeof(uint16_t) * D * Nkv * Hkv);
    for (int i = 0; i < Nq; i++) ((int32_t *)qp->data)[i] = Nkv - Nq + i;
    for (int i = 0; i < Nkv; i++) ((int32_t *)kp->data)[i] = i;
    struct tsr_backend *be;
    CHECK_OK(tsr_backend_cpu_new(2, &be));
    CHECK_OK(tsr_backend_compute(be, g));
    tsr_backend_free(be);
    size_t n = (size_t)D * Hq * Nq;
    result = malloc(n * sizeof *result);
    memcpy(result, out->data, n * sizeof *result);
  }
  free(arena);
  tsr_graph_free(g);
  return result;
}

/* The whole model's logits for a fixed token sequence through one attention
** implementation (the default model is Qwen3-shaped; arch_qwen runs it). */
static float *run_model(struct tsr_setup *s, const char *attention, int64_t *n_out) {
  enum { N = 24 };
  struct tsr_graph *g = tsr_graph_new(4096);
  struct tsr_arch_forward fw = {
      .struct_size = sizeof fw, .g = g, .model = s->model, .n_tokens = N,
      .tokens = tsr_new_tensor_1d(g, TSR_I32, N), .positions = tsr_new_tensor_1d(g, TSR_I32, N),
      .attention = tsr_plugin_host_attention(s->host, attention, NULL), .layers = s->layers,
      .n_layers = s->n_layers};
  CHECK(fw.attention != NULL);
  float *out = NULL;
  if (fw.attention) CHECK_OK(s->arch->build(s->arch->ctx, tsr_plugin_host_services(), &fw));
  struct tsr_graph_plan plan;
  void *arena = NULL;
  if (fw.logits && tsr_graph_status(g) == TSR_OK) {
    tsr_graph_mark_output(fw.logits);
    CHECK_OK(tsr_graph_alloc(g, &plan, &arena));
    for (int i = 0; i < N; i++) {
      ((int32_t *)fw.tokens->data)[i] = (i * 37 + 11) % 256;
      ((int32_t *)fw.positions->data)[i] = i;
    }
    struct tsr_backend *be;
    CHECK_OK(tsr_backend_cpu_new(2, &be));
    CHECK_OK(tsr_backend_compute(be, g));
    tsr_backend_free(be);
    *n_out = tsr_tensor_nelements(fw.logits);
    out = malloc((size_t)*n_out * sizeof *out);
    memcpy(out, fw.logits->data, (size_t)*n_out * sizeof *out);
  }
  free(arena);
  tsr_graph_free(g);
  return out;
}

static void test_example_plugin_from_profile_ab_swaps_with_flash(void) {
  char profile[256];
  snprintf(profile, sizeof profile, "/tmp/tsr_plugin_profile_%d.yaml", (int)getpid());
  FILE *f = fopen(profile, "w");
  fprintf(f, "model: %s\nattention: example_attention\nplugins:\n  - arch_qwen\n"
             "  - name: example_attention\n    path: %s\n    settings:\n      verbose: false\n",
          path_join(g_build, "core/cli/default-model.gguf"),
          example_dir("good"));
  fclose(f);
  struct tsr_setup *s = NULL;
  CHECK_OK(tsr_setup_from_profile(profile, NULL, 0, &s));
  unlink(profile);
  if (!s || !s->host || !s->n_layers) {
    tsr_setup_free(s);
    return;
  }
  CHECK(strstr(s->composition.attention, "example_attention (example_attention 1.0.0)") != NULL);

  /* the same inputs through both implementations */
  enum { D = 64, NQ = 5, NKV = 37, HQ = 4, HKV = 2 };
  static float q[D * NQ * HQ];
  static uint16_t k[D * NKV * HKV], v[D * NKV * HKV];
  tsr_test_seed(7);
  for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) q[i] = tsr_test_normal();
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
    k[i] = tsr_f32_to_f16(tsr_test_normal());
    v[i] = tsr_f32_to_f16(tsr_test_normal());
  }
  const struct tsr_plugin *ex = tsr_plugin_host_find_plugin(s->host, "example_attention");
  const char *name = "example_attention";
  CHECK_ERR_HAS(tsr_plugin_host_require_engaged(s->host, &name, 1), "never engaged");
  float *a = run_attention(s, "flash", q, k, v, D, NQ, NKV, HQ, HKV);
  float *b = run_attention(s, "example_attention", q, k, v, D, NQ, NKV, HQ, HKV);
  CHECK(a && b && memcmp(a, b, sizeof(float) * D * HQ * NQ) == 0);
  CHECK(ex && tsr_plugin_engaged_total(ex) == 1);
  CHECK_OK(tsr_plugin_host_require_engaged(s->host, &name, 1));
  /* the same on the whole model: every layer's attention swapped */
  int64_t na = 0, nb = 0;
  float *la = run_model(s, "flash", &na), *lb = run_model(s, "example_attention", &nb);
  CHECK(la && lb && na == nb && na > 0 && memcmp(la, lb, (size_t)na * sizeof *la) == 0);
  CHECK(ex && tsr_plugin_engaged_total(ex) == 1 + (uint64_t)s->n_layers);
  free(la);
  free(lb);
  /* the arch built both forward graphs, flash its layers of the first */
  const char *engaged[] = {"arch_qwen", "core"};
  CHECK_OK(tsr_plugin_host_require_engaged(s->host, engaged, 2));
  free(a);
  free(b);
  tsr_setup_free(s);
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s BUILD_ROOT BAD_PLUGIN_DIR OUT_OF_TREE_DIR\n", argv[0]);
    return 2;
  }
  g_build = argv[1], g_bad = argv[2], g_oot = argv[3];
  TSR_RUN(test_core_plugin_registers_flash_and_codecs);
  TSR_RUN(test_abi_major_mismatch_names_both_versions);
  TSR_RUN(test_newer_abi_minor_is_refused);
  TSR_RUN(test_misbehaving_plugins_are_refused_precisely);
  TSR_RUN(test_unmet_requirement_is_named);
  TSR_RUN(test_plugin_without_code_and_missing_plugin);
  TSR_RUN(test_settings_are_validated_against_the_declaration);
  TSR_RUN(test_negotiation_names_layer_plugin_and_codec);
  TSR_RUN(test_boundary_layers_group_apart);
  TSR_RUN(test_example_plugin_from_profile_ab_swaps_with_flash);
  return TSR_TEST_EXIT();
}
