/*
** `tessera convert` on each gemma4 reference fixture, against what llama.cpp's
** converter writes for it (tests/expected/<fixture>.json, made by
** make_expected.py): every metadata key with its GGUF type and value, every
** tensor with its ne, dtype and a checksum of its f32 bytes; then the dtypes
** of an --outtype q8_0 conversion (what stays f32, what falls back to f16);
** then the layer plan of the converted file.
**
** Not compared, and why:
**  - general.name, general.size_label: llama.cpp derives them from its own
**    metadata heuristics ("Gemma4_Dense", "1.3M"); the core writes the folder
**    name and no size label.
** Tolerated where this host writes them differently (printed as notes):
**  - tokenizer.ggml.pre = "gemma4", which llama.cpp's converter omits: its
**    loader sets that pre-tokenizer itself for tokenizer model "gemma4"
**    (llama-vocab.cpp), so the file loads the same.
** Everything else must match exactly, and nothing may be extra.
*/
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/gguf.h"
#include "gguf_hparams.h"
#include "model/json.h"
#include "abi/plugin_host.h"
#include "tests/harness.h"

extern char **environ;

static const char *g_tessera, *g_fixtures, *g_expected;

static const char *const k_ignored[] = {"general.name", "general.size_label"};

static bool ignored(const char *key) {
  for (size_t i = 0; i < sizeof k_ignored / sizeof k_ignored[0]; i++)
    if (!strcmp(key, k_ignored[i])) return true;
  return false;
}

/* tessera convert DIR OUT --outtype T; stderr to err_path when not NULL. */
static int run_convert_dir(const char *dir, const char *outtype, const char *out,
                           const char *err_path) {
  char *argv[] = {(char *)g_tessera, "convert", (char *)dir, (char *)out, "--outtype",
                  (char *)outtype, NULL};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (err_path)
    posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid;
  int rc = posix_spawn(&pid, g_tessera, &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc) return -1;
  int status;
  if (waitpid(pid, &status, 0) < 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int run_convert(const char *fixture, const char *outtype, const char *out) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/%s", g_fixtures, fixture);
  return run_convert_dir(dir, outtype, out, NULL);
}

static uint64_t fnv1a64(const void *data, size_t n) {
  const unsigned char *p = data;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/* One element (or the scalar) of ours as JSON would hold it, compared. */
static bool value_equal(const struct tsr_gguf *g, const struct tsr_gguf_kv *kv, int64_t i,
                        enum tsr_gguf_type t, const cJSON *want) {
  if (t == TSR_GGUF_STRING) {
    struct tsr_gguf_str s = kv->v.s;
    if (i >= 0 && tsr_gguf_arr_str(g, kv, (uint64_t)i, &s) != TSR_OK) return false;
    return cJSON_IsString(want) && strlen(want->valuestring) == s.len &&
           !memcmp(want->valuestring, s.ptr, s.len);
  }
  if (t == TSR_GGUF_BOOL) {
    int8_t b = 0;
    if (i >= 0) memcpy(&b, (const char *)kv->data + i, 1);
    else b = (int8_t)kv->v.b;
    return cJSON_IsBool(want) && (b != 0) == cJSON_IsTrue(want);
  }
  if (t == TSR_GGUF_F32 || t == TSR_GGUF_F64) {
    double v = kv->v.f;
    if (i >= 0 && tsr_gguf_arr_f64(g, kv, (uint64_t)i, &v) != TSR_OK) return false;
    return cJSON_IsNumber(want) && (float)v == (float)want->valuedouble;
  }
  int64_t v = kv->type == TSR_GGUF_U64 || kv->type == TSR_GGUF_U32 ? (int64_t)kv->v.u : kv->v.i;
  if (i >= 0 && tsr_gguf_arr_i64(g, kv, (uint64_t)i, &v) != TSR_OK) return false;
  if (cJSON_IsBool(want)) return v == (cJSON_IsTrue(want) ? 1 : 0);
  return cJSON_IsNumber(want) && (double)v == want->valuedouble;
}

static int compare_key(const struct tsr_gguf *g, const char *key, const cJSON *want) {
  int64_t idx = tsr_gguf_find_key(g, key);
  if (idx < 0) {
    fprintf(stderr, "  missing key %s\n", key);
    return 1;
  }
  const struct tsr_gguf_kv *kv = tsr_gguf_kv_at(g, idx);
  const char *type = cJSON_GetObjectItemCaseSensitive(want, "type")->valuestring;
  const cJSON *value = cJSON_GetObjectItemCaseSensitive(want, "value");
  if (strcmp(type, tsr_gguf_type_name(kv->type))) {
    fprintf(stderr, "  %s: type %s, llama.cpp writes %s\n", key, tsr_gguf_type_name(kv->type), type);
    return 1;
  }
  if (kv->type != TSR_GGUF_ARRAY) {
    if (value_equal(g, kv, -1, kv->type, value)) return 0;
    char *s = cJSON_PrintUnformatted(value);
    fprintf(stderr, "  %s differs from llama.cpp's %.200s\n", key, s);
    free(s);
    return 1;
  }
  const char *elem = cJSON_GetObjectItemCaseSensitive(want, "elem")->valuestring;
  if (strcmp(elem, tsr_gguf_type_name(kv->elem_type))) {
    fprintf(stderr, "  %s: array of %s, llama.cpp writes %s\n", key,
            tsr_gguf_type_name(kv->elem_type), elem);
    return 1;
  }
  if ((int64_t)kv->n != cJSON_GetArraySize(value)) {
    fprintf(stderr, "  %s: %llu elements, llama.cpp writes %d\n", key, (unsigned long long)kv->n,
            cJSON_GetArraySize(value));
    return 1;
  }
  for (int64_t i = 0; i < (int64_t)kv->n; i++) {
    if (!value_equal(g, kv, i, kv->elem_type, cJSON_GetArrayItem(value, (int)i))) {
      fprintf(stderr, "  %s[%lld] differs from llama.cpp's\n", key, (long long)i);
      return 1;
    }
  }
  return 0;
}

/* What tessera writes beyond llama.cpp's converter, on purpose (README): the
** assistant's ordered embeddings, which llama.cpp's loader accepts by these
** names; their contents are checked in check_plan. */
static bool is_addition(const char *name) {
  static const char *const added[] = {"masked_embd_centroids.weight", "masked_embd_ordering",
                                      "gemma4-assistant.centroid_intermediate_top_k"};
  for (size_t i = 0; i < sizeof added / sizeof added[0]; i++)
    if (!strcmp(name, added[i])) return true;
  return false;
}

static int compare_keys(const struct tsr_gguf *g, const cJSON *keys) {
  int bad = 0;
  for (const cJSON *k = keys->child; k; k = k->next)
    if (!ignored(k->string)) bad += compare_key(g, k->string, k);
  for (int64_t i = 0; i < tsr_gguf_n_kv(g); i++) {
    const char *key = tsr_gguf_kv_at(g, i)->key;
    if (ignored(key) || cJSON_GetObjectItemCaseSensitive(keys, key)) continue;
    if (is_addition(key)) {
      printf("  note: %s (tessera's addition)\n", key);
      continue;
    }
    const char *pre;
    if (!strcmp(key, "tokenizer.ggml.pre") && tsr_gguf_get_str(g, key, &pre) == TSR_OK &&
        !strcmp(pre, "gemma4")) {
      printf("  note: tokenizer.ggml.pre = \"gemma4\" (llama.cpp omits it and sets it at load)\n");
      continue;
    }
    fprintf(stderr, "  extra key %s (llama.cpp writes none)\n", key);
    bad++;
  }
  return bad;
}

static int compare_tensor(const struct tsr_gguf *g, const char *name, const cJSON *want) {
  const struct tsr_gguf_tensor *t = tsr_gguf_find_tensor(g, name);
  if (!t) {
    fprintf(stderr, "  missing tensor %s\n", name);
    return 1;
  }
  const cJSON *ne = cJSON_GetObjectItemCaseSensitive(want, "ne");
  bool same = (int)t->n_dims == cJSON_GetArraySize(ne);
  for (uint32_t d = 0; same && d < t->n_dims; d++)
    same = (double)t->ne[d] == cJSON_GetArrayItem(ne, (int)d)->valuedouble;
  if (!same) {
    char *s = cJSON_PrintUnformatted(ne);
    fprintf(stderr, "  %s: ne [%lld %lld %lld %lld] (%u dims), llama.cpp %s\n", name,
            (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
            t->n_dims, s);
    free(s);
    return 1;
  }
  const char *dtype = cJSON_GetObjectItemCaseSensitive(want, "dtype")->valuestring;
  if (strcmp(dtype, tsr_dtype_name(t->dtype))) {
    fprintf(stderr, "  %s: %s, llama.cpp %s\n", name, tsr_dtype_name(t->dtype), dtype);
    return 1;
  }
  char sum[17];
  snprintf(sum, sizeof sum, "%016llx", (unsigned long long)fnv1a64(t->data, t->nbytes));
  const char *want_sum = cJSON_GetObjectItemCaseSensitive(want, "fnv1a64")->valuestring;
  if (strcmp(sum, want_sum)) {
    const float *f = t->data;
    const cJSON *head = cJSON_GetObjectItemCaseSensitive(want, "head");
    fprintf(stderr, "  %s: data differs (fnv1a64 %s, llama.cpp %s); first values %g %g, "
            "llama.cpp %g %g\n", name, sum, want_sum, f[0], t->n_elements > 1 ? f[1] : 0.0,
            cJSON_GetArrayItem(head, 0)->valuedouble,
            cJSON_GetArraySize(head) > 1 ? cJSON_GetArrayItem(head, 1)->valuedouble : 0.0);
    return 1;
  }
  return 0;
}

static int compare_tensors(const struct tsr_gguf *g, const cJSON *tensors) {
  int bad = 0;
  for (const cJSON *t = tensors->child; t; t = t->next) bad += compare_tensor(g, t->string, t);
  for (int64_t i = 0; i < tsr_gguf_n_tensors(g); i++) {
    const char *name = tsr_gguf_tensor_at(g, i)->name;
    if (is_addition(name)) {
      printf("  note: %s (tessera's addition)\n", name);
    } else if (!cJSON_GetObjectItemCaseSensitive(tensors, name)) {
      fprintf(stderr, "  extra tensor %s (llama.cpp writes none)\n", name);
      bad++;
    }
  }
  return bad;
}

static int compare_q8_0_dtypes(const struct tsr_gguf *g, const cJSON *dtypes) {
  int bad = 0;
  int64_t n = 0;
  for (int64_t i = 0; i < tsr_gguf_n_tensors(g); i++) n += !is_addition(tsr_gguf_tensor_at(g, i)->name);
  if (n != cJSON_GetArraySize(dtypes)) {
    fprintf(stderr, "  q8_0: %lld tensors, llama.cpp %d\n", (long long)n,
            cJSON_GetArraySize(dtypes));
    bad++;
  }
  for (const cJSON *d = dtypes->child; d; d = d->next) {
    const struct tsr_gguf_tensor *t = tsr_gguf_find_tensor(g, d->string);
    if (!t || strcmp(tsr_dtype_name(t->dtype), d->valuestring)) {
      fprintf(stderr, "  q8_0: %s is %s, llama.cpp stores %s\n", d->string,
              t ? tsr_dtype_name(t->dtype) : "missing", d->valuestring);
      bad++;
    }
  }
  return bad;
}

/* The layer plan of the converted file: kinds from the pattern, KV
** sharing from shared_kv_layers. */
static void check_plan(const struct tsr_gguf *g, const char *fixture) {
  struct gemma4_hparams hp;
  struct tsr_arch_layer l[GEMMA4_MAX_LAYERS];
  int32_t src[GEMMA4_MAX_LAYERS];
  CHECK_OK(hparams_from_gguf(g, &hp));
  CHECK_OK(gemma4_plan(tsr_plugin_host_services(), fixture, &hp, l, GEMMA4_MAX_LAYERS, src));
  if (!strcmp(fixture, "gemma4_dense")) {
    CHECK(hp.n_layer == 5 && l[2].kind == TSR_LAYER_FULL && l[2].n_head_kv == 1);
    CHECK(l[2].head_dim_k == 512 && l[0].kind == TSR_LAYER_SLIDING && l[0].n_head_kv == 2);
  } else if (!strcmp(fixture, "gemma4_e2b")) {
    CHECK(hp.n_layer == 8 && src[3] == GEMMA4_KV_OWN && src[6] == 2 && src[7] == 3);
    CHECK(l[5].kv_shared_from == 3 && l[3].n_head_kv == 1 && l[4].window == 32);
  } else if (!strcmp(fixture, "gemma4_assistant")) {
    for (int i = 0; i < hp.n_layer; i++) CHECK(src[i] == GEMMA4_KV_TARGET);
    /* the ordered embeddings: f32 centroids [H, C], an i32 permutation of the vocabulary */
    const struct tsr_gguf_tensor *c = tsr_gguf_find_tensor(g, "masked_embd_centroids.weight");
    const struct tsr_gguf_tensor *o = tsr_gguf_find_tensor(g, "masked_embd_ordering");
    uint32_t top_k = 0;
    CHECK(c && c->dtype == TSR_F32 && c->n_dims == 2 && c->ne[0] == 32 && c->ne[1] == 32);
    CHECK_OK(tsr_gguf_get_u32(g, "gemma4-assistant.centroid_intermediate_top_k", &top_k));
    CHECK(top_k == 4);
    CHECK(o && o->dtype == TSR_I32 && o->n_dims == 1);
    if (o && o->dtype == TSR_I32) {
      char *seen = calloc((size_t)o->ne[0], 1);
      bool perm = seen != NULL;
      for (int64_t i = 0; perm && i < o->ne[0]; i++) {
        const int32_t id = ((const int32_t *)o->data)[i];
        perm = id >= 0 && id < o->ne[0] && !seen[id];
        if (perm) seen[id] = 1;
      }
      CHECK_MSG(perm, "masked_embd_ordering is not a permutation of the vocabulary");
      free(seen);
    }
  }
}

static void convert_and_compare(const char *fixture) {
  char path[1024], out[256];
  snprintf(path, sizeof path, "%s/%s.json", g_expected, fixture);
  cJSON *want = NULL;
  CHECK_OK(tsr_json_load(path, &want));
  if (!want) return;
  snprintf(out, sizeof out, "/tmp/tsr_gemma4_convert_%d_%s.gguf", (int)getpid(), fixture);
  int rc = run_convert(fixture, "f32", out);
  CHECK_MSG(rc == 0, "tessera convert %s --outtype f32 exited %d", fixture, rc);
  struct tsr_gguf *g = NULL;
  if (rc == 0) CHECK_OK(tsr_gguf_open(out, &g));
  if (g) {
    int bad = compare_keys(g, cJSON_GetObjectItemCaseSensitive(want, "keys"));
    bad += compare_tensors(g, cJSON_GetObjectItemCaseSensitive(want, "tensors"));
    CHECK_MSG(bad == 0, "%s: %d differences from llama.cpp (f32)", fixture, bad);
    check_plan(g, fixture);
    tsr_gguf_close(g);
    g = NULL;
  }
  rc = run_convert(fixture, "q8_0", out);
  CHECK_MSG(rc == 0, "tessera convert %s --outtype q8_0 exited %d", fixture, rc);
  if (rc == 0) CHECK_OK(tsr_gguf_open(out, &g));
  if (g) {
    int bad = compare_q8_0_dtypes(g, cJSON_GetObjectItemCaseSensitive(want, "q8_0_dtypes"));
    CHECK_MSG(bad == 0, "%s: %d tensor types differ from llama.cpp (q8_0)", fixture, bad);
    tsr_gguf_close(g);
  }
  unlink(out);
  cJSON_Delete(want);
}

static void test_dense_converts_as_llama_cpp_does(void) { convert_and_compare("gemma4_dense"); }
static void test_moe_converts_as_llama_cpp_does(void) { convert_and_compare("gemma4_moe"); }
static void test_e2b_converts_as_llama_cpp_does(void) { convert_and_compare("gemma4_e2b"); }
static void test_assistant_converts_as_llama_cpp_does(void) {
  convert_and_compare("gemma4_assistant");
}

/* A copy of a fixture (links to its files) whose config.json has `from`
** replaced by `to`; returns what tessera convert printed on stderr. */
static int convert_edited(const char *fixture, const char *from, const char *to, char *err,
                          size_t err_size) {
  char dir[256], src[1024], dst[1024], out[300], err_path[300];
  snprintf(dir, sizeof dir, "/tmp/tsr_gemma4_edit_%d", (int)getpid());
  mkdir(dir, 0755);
  static const char *const files[] = {"model.safetensors", "tokenizer.json",
                                      "tokenizer_config.json", "chat_template.jinja",
                                      "generation_config.json"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    snprintf(src, sizeof src, "%s/%s/%s", g_fixtures, fixture, files[i]);
    snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
    unlink(dst);
    CHECK(symlink(src, dst) == 0);
  }
  snprintf(src, sizeof src, "%s/%s/config.json", g_fixtures, fixture);
  FILE *f = fopen(src, "rb");
  static char text[1 << 16];
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  if (f) fclose(f);
  text[n] = '\0';
  char *at = strstr(text, from);
  CHECK_MSG(at != NULL, "%s not in %s", from, src);
  snprintf(dst, sizeof dst, "%s/config.json", dir);
  f = fopen(dst, "wb");
  CHECK(f != NULL);
  if (f && at) {
    fwrite(text, 1, (size_t)(at - text), f);
    fputs(to, f);
    fputs(at + strlen(from), f);
  }
  if (f) fclose(f);
  snprintf(out, sizeof out, "%s/out.gguf", dir);
  snprintf(err_path, sizeof err_path, "%s/stderr.txt", dir);
  int rc = run_convert_dir(dir, "f32", out, err_path);
  f = fopen(err_path, "rb");
  n = f ? fread(err, 1, err_size - 1, f) : 0;
  err[n] = '\0';
  if (f) fclose(f);
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
    unlink(dst);
  }
  unlink(out);
  unlink(err_path);
  snprintf(dst, sizeof dst, "%s/config.json", dir);
  unlink(dst);
  rmdir(dir);
  return rc;
}

static void test_a_checkpoint_that_does_not_fit_its_config_is_refused_naming_the_tensor(void) {
  char err[4096];
  int rc = convert_edited("gemma4_dense", "\"intermediate_size\": 128", "\"intermediate_size\": 96",
                          err, sizeof err);
  CHECK(rc != 0);
  CHECK_MSG(strstr(err, "model.language_model.layers.0.mlp.gate_proj.weight") &&
                strstr(err, "[128, 64]") && strstr(err, "[96, 64]"),
            "%s", err);
}

static void test_a_full_layer_rope_other_than_proportional_is_refused(void) {
  char err[4096];
  int rc = convert_edited("gemma4_dense", "\"rope_type\": \"proportional\"",
                          "\"rope_type\": \"yarn\"", err, sizeof err);
  CHECK(rc != 0);
  CHECK_MSG(strstr(err, "yarn") && strstr(err, "proportional"), "%s", err);
}

static void test_kv_sharing_that_leaves_layers_without_kv_weights_is_refused(void) {
  /* with no shared layers every layer needs its own k_proj: layers 4-7 have none */
  char err[4096];
  int rc = convert_edited("gemma4_e2b", "\"num_kv_shared_layers\": 4",
                          "\"num_kv_shared_layers\": 0", err, sizeof err);
  CHECK(rc != 0);
  CHECK_MSG(strstr(err, "model.language_model.layers.4.self_attn.k_proj.weight"), "%s", err);
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s TESSERA FIXTURES_DIR EXPECTED_DIR\n", argv[0]);
    return 2;
  }
  g_tessera = argv[1];
  g_fixtures = argv[2];
  g_expected = argv[3];
  TSR_RUN(test_dense_converts_as_llama_cpp_does);
  TSR_RUN(test_moe_converts_as_llama_cpp_does);
  TSR_RUN(test_e2b_converts_as_llama_cpp_does);
  TSR_RUN(test_assistant_converts_as_llama_cpp_does);
  TSR_RUN(test_a_checkpoint_that_does_not_fit_its_config_is_refused_naming_the_tensor);
  TSR_RUN(test_a_full_layer_rope_other_than_proportional_is_refused);
  TSR_RUN(test_kv_sharing_that_leaves_layers_without_kv_weights_is_refused);
  return TSR_TEST_EXIT();
}
