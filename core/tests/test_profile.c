/* Profiles: YAML parsing, extends, --set, schema checks and their messages.
** argv[1]: the fixture directory (core/tests/profiles), argv[2]: conf/. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "profile/profile.h"

static const char *g_fixtures = "core/tests/profiles";
static const char *g_conf = "conf";

static const char *fixture(const char *name) {
  static char buf[4][1024];
  static int next;
  char *b = buf[next++ % 4];
  snprintf(b, sizeof buf[0], "%s/%s", g_fixtures, name);
  return b;
}

static const char *conf(const char *name) {
  static char buf[1024];
  snprintf(buf, sizeof buf, "%s/%s", g_conf, name);
  return buf;
}

/* Loading PATH with SETS fails with INVALID_ARG and a message holding every one of
** the NULL-terminated substrings. */
static void expect_error_sets(const char *path, const char *const *sets, int n_sets, ...) {
  struct tsr_profile *p = NULL;
  tsr_status st = tsr_profile_load(path, sets, n_sets, &p);
  CHECK_MSG(st == TSR_ERR_INVALID_ARG, "%s: status %d, message '%s'", path, st, tsr_error_message());
  CHECK(p == NULL);
  const char *msg = tsr_error_message();
  va_list ap;
  va_start(ap, n_sets);
  for (const char *want; (want = va_arg(ap, const char *));)
    CHECK_MSG(strstr(msg, want) != NULL, "message '%s' lacks '%s'", msg, want);
  va_end(ap);
  tsr_profile_free(p);
}
#define expect_error(path, ...) expect_error_sets(path, NULL, 0, __VA_ARGS__, (const char *)NULL)

/* same, for a profile given as text named NAME */
static void expect_mem_error(const char *name, const char *text, const char *want1,
                             const char *want2) {
  struct tsr_profile *p = NULL;
  tsr_status st = tsr_profile_load_mem(name, text, strlen(text), NULL, 0, &p);
  CHECK_MSG(st == TSR_ERR_INVALID_ARG, "'%s': status %d", text, st);
  const char *msg = tsr_error_message();
  CHECK_MSG(strstr(msg, want1) != NULL, "message '%s' lacks '%s'", msg, want1);
  if (want2) CHECK_MSG(strstr(msg, want2) != NULL, "message '%s' lacks '%s'", msg, want2);
  tsr_profile_free(p);
}

static struct tsr_profile *load_ok(const char *path, const char *const *sets, int n_sets) {
  struct tsr_profile *p = NULL;
  CHECK_OK(tsr_profile_load(path, sets, n_sets, &p));
  return p;
}

static void test_default_profile_has_documented_defaults(void) {
  struct tsr_profile *p = load_ok(conf("default.yaml"), NULL, 0);
  if (!p) return;
  CHECK(!strcmp(p->model, "default") && p->model_path == NULL);
  CHECK(!strcmp(p->backend, "cpu"));
  CHECK(p->threads == 0 && p->context == 4096 && p->batch == 2048 && p->ubatch == 512);
  CHECK(p->memory_limit == 0);
  CHECK(!strcmp(p->attention, "flash"));
  CHECK(!strcmp(p->kv.k, "f16") && !strcmp(p->kv.v, "f16"));
  for (int k = 0; k < TSR_PROFILE_LAYER_KINDS; k++)
    CHECK(!strcmp(tsr_profile_k_codec(p, k), "f16") && !strcmp(tsr_profile_v_codec(p, k), "f16"));
  /* the default model is Qwen3-shaped: its arch plugin is the one plugin loaded */
  CHECK(p->n_plugins == 1 && !strcmp(p->plugins[0].name, "arch_qwen"));
  CHECK(p->n_decode_policies == 0 && !p->has_speculator);
  CHECK_CLOSE(p->sampling.temperature, 0.8, 0, 0);
  CHECK(p->sampling.top_k == 40 && p->sampling.seed == -1 && p->sampling.max_tokens == 256);
  CHECK_CLOSE(p->sampling.top_p, 0.95, 0, 0);
  CHECK_CLOSE(p->sampling.min_p, 0.05, 0, 0);
  CHECK(!strcmp(p->server.host, "127.0.0.1") && p->server.port == 8080);
  CHECK(p->server.parallel == 1 && p->server.api_key_env == NULL);
  CHECK(strstr(tsr_profile_where(p, "context"), "default.yaml:") != NULL);
  tsr_profile_free(p);
}

/* conf/default.yaml documents the built-in defaults: a profile naming only the
** model must resolve to the same values. */
static void test_builtin_defaults_match_default_yaml(void) {
  struct tsr_profile *a = load_ok(conf("default.yaml"), NULL, 0), *b = NULL;
  const char *text = "model: default\n";
  CHECK_OK(tsr_profile_load_mem("min.yaml", text, strlen(text), NULL, 0, &b));
  if (!a || !b) goto out;
  CHECK(!strcmp(a->backend, b->backend) && a->threads == b->threads);
  CHECK(a->context == b->context && a->batch == b->batch && a->ubatch == b->ubatch);
  CHECK(a->memory_limit == b->memory_limit && !strcmp(a->attention, b->attention));
  CHECK(!strcmp(a->kv.k, b->kv.k) && !strcmp(a->kv.v, b->kv.v));
  CHECK(!memcmp(&a->sampling, &b->sampling, sizeof a->sampling));
  CHECK(!strcmp(a->server.host, b->server.host) && a->server.port == b->server.port);
  CHECK(a->server.parallel == b->server.parallel);
  CHECK(strstr(tsr_profile_where(b, "context"), "(default)") != NULL);
out:
  tsr_profile_free(a);
  tsr_profile_free(b);
}

static void test_example_extends_default_and_overrides(void) {
  struct tsr_profile *p = load_ok(conf("example-deployment.yaml"), NULL, 0);
  if (!p) return;
  CHECK(!strcmp(p->backend, "cuda"));
  CHECK(p->context == 131072);
  CHECK(p->memory_limit == 120ull << 30);
  CHECK(!strcmp(tsr_profile_k_codec(p, TSR_PROFILE_LAYER_FULL), "q8_0"));
  CHECK(!strcmp(tsr_profile_v_codec(p, TSR_PROFILE_LAYER_FULL), "q4_0"));
  CHECK(!strcmp(tsr_profile_k_codec(p, TSR_PROFILE_LAYER_SLIDING), "f16"));
  CHECK(!strcmp(p->attention, "flash"));
  CHECK(p->server.port == 8081 && p->server.api_key_env && p->batch == 2048);
  CHECK(p->sampling.top_k == 40); /* inherited */
  CHECK(strstr(tsr_profile_where(p, "context"), "example-deployment.yaml:") != NULL);
  CHECK(strstr(tsr_profile_where(p, "batch"), "default.yaml:62:8") != NULL);
  tsr_profile_free(p);
}

static void test_extends_merges_maps_and_resolves_paths_per_file(void) {
  struct tsr_profile *p = load_ok(fixture("child.yaml"), NULL, 0);
  if (!p) return;
  CHECK(p->context == 2048);
  CHECK(p->sampling.seed == 9 && p->sampling.top_k == 10); /* merged, not replaced */
  CHECK(!strcmp(p->kv.k, "q8_0") && !strcmp(p->kv.v, "f16"));
  char want[1200];
  snprintf(want, sizeof want, "%s/sub/../models/tiny.gguf", g_fixtures);
  CHECK_MSG(p->model_path && !strcmp(p->model_path, want), "model_path %s", p->model_path);
  CHECK(p->n_plugins == 1 && !strcmp(p->plugins[0].name, "counter"));
  snprintf(want, sizeof want, "%s/sub/../plugins/counter.so", g_fixtures);
  CHECK(p->n_plugins == 1 && !strcmp(p->plugins[0].resolved_path, want));
  if (p->n_plugins == 1) { /* typed reads for plugin settings: bools */
    const struct tsr_pnode *verbose = tsr_pnode_get(p->plugins[0].settings, "verbose");
    int on = 0;
    CHECK(verbose && tsr_pnode_bool(verbose, "plugins.counter.verbose", &on) == TSR_OK && on);
    CHECK(verbose && tsr_pnode_float(verbose, "plugins.counter.verbose", &(double){0}) ==
                         TSR_ERR_INVALID_ARG);
    CHECK(strstr(tsr_error_message(), "sub/base.yaml:13:16: key 'plugins.counter.verbose': "
                                      "expected a number, got 'true'"));
  }
  CHECK(strstr(tsr_profile_where(p, "sampling.seed"), "child.yaml:4:9") != NULL);
  CHECK(strstr(tsr_profile_where(p, "sampling.top_k"), "sub/base.yaml:7:10") != NULL);
  tsr_profile_free(p);
}

static void test_error_in_base_names_the_base_file(void) {
  expect_error(fixture("child_of_bad.yaml"), "sub/bad_base.yaml:3:3: unknown key 'server.prot'",
               "did you mean 'port'");
}

static void test_unknown_keys_are_refused_with_position(void) {
  expect_error(fixture("unknown_top.yaml"), "unknown_top.yaml:2:1: unknown key 'contxt'",
               "did you mean 'context'", "known here: extends, model");
  expect_error(fixture("unknown_nested.yaml"), "unknown_nested.yaml:4:3: unknown key 'sampling.topk'",
               "top_k");
}

static void test_wrong_types_are_refused_with_position(void) {
  expect_error(fixture("wrong_type_context.yaml"),
               "wrong_type_context.yaml:2:10: key 'context': expected an integer", "'abc'");
  expect_error(fixture("wrong_type_port.yaml"),
               "wrong_type_port.yaml:3:9: key 'server.port': expected an integer, got a list");
  expect_mem_error("t.yaml", "model: default\nthreads: 12.5\n", "t.yaml:2:10: key 'threads'",
                   "expected an integer, got '12.5'");
  expect_mem_error("t.yaml", "model: default\nthreads: abc\n", "t.yaml:2:10: key 'threads'", NULL);
  expect_mem_error("t.yaml", "model: default\ncontext: 1e3\n", "t.yaml:2:10: key 'context'",
                   "exponents are not accepted");
  expect_mem_error("t.yaml", "model: default\nsampling:\n  seed: 9223372036854775808\n",
                   "t.yaml:3:9: key 'sampling.seed'", "does not fit in 64 bits");
  expect_mem_error("t.yaml", "model: default\nsampling:\n  seed: 9223372036854775807\n"
                   "  top_p: nan\n", "t.yaml:4:10: key 'sampling.top_p': expected a number", NULL);
  expect_mem_error("t.yaml", "model: [a]\n", "t.yaml:1:8: key 'model': expected a string", NULL);
  expect_mem_error("t.yaml", "model: default\nattention: [a]\n",
                   "t.yaml:2:12: key 'attention': expected an attention name", "got a list");
  expect_mem_error("t.yaml", "model: default\nattention: {a: 1}\n",
                   "t.yaml:2:13: unknown key 'attention.a'", "known here: full, sliding");
  expect_mem_error("t.yaml", "model: default\nkv: [f16]\n", "t.yaml:2:5: key 'kv': expected a map",
                   NULL);
  expect_mem_error("t.yaml", "model: default\nkv: {lift: maybe}\n",
                   "t.yaml:2:12: key 'kv.lift': unknown lift 'maybe' (known: true, false)", NULL);
  expect_mem_error("t.yaml", "model: default\nkv: {lift: [true]}\n", "t.yaml:2:12: key 'kv.lift'",
                   NULL);
  expect_mem_error("t.yaml", "model: default\nbackend: rocm\n",
                   "t.yaml:2:10: key 'backend': unknown backend 'rocm' (known: cpu, cuda)", NULL);
  expect_mem_error("t.yaml", "model: default\ndecode_policies: sparse_v\n",
                   "t.yaml:2:18: key 'decode_policies': expected a list", NULL);
  expect_mem_error("t.yaml", "model: default\nplugins:\n  - settings: {a: 1}\n",
                   "t.yaml:3:5: key 'plugins[0]': 'name' is required", NULL);
}

static void test_out_of_range_values_are_refused(void) {
  expect_error(fixture("range_port.yaml"),
               "range_port.yaml:3:9: key 'server.port': 70000 is out of range 1..65535");
  expect_error(fixture("range_top_p.yaml"),
               "range_top_p.yaml:3:10: key 'sampling.top_p': 0 is out of range (0, 1]");
  expect_error(fixture("ubatch_over_batch.yaml"),
               "ubatch_over_batch.yaml:3:9: key 'ubatch': 512 is larger than batch (256",
               "ubatch_over_batch.yaml:2:8");
  expect_mem_error("t.yaml", "model: default\ncontext: 0\n", "t.yaml:2:10: key 'context'",
                   "out of range 1..16777216");
  expect_mem_error("t.yaml", "model: default\nsampling: {min_p: 1}\n",
                   "key 'sampling.min_p': 1 is out of range [0, 1)", NULL);
  expect_mem_error("t.yaml", "model: default\nsampling: {temperature: -0.5}\n",
                   "key 'sampling.temperature': -0.5 is out of range at least 0", NULL);
  expect_mem_error("t.yaml", "model: default\nbatch: 128\n",
                   "t.yaml:2:8: key 'batch': 128 is smaller than ubatch (512", NULL);
  expect_mem_error("t.yaml", "context: 5\n", "t.yaml: key 'model' is required", NULL);
}

static void test_extends_cycles_are_refused_naming_the_chain(void) {
  char chain[3000];
  snprintf(chain, sizeof chain, "extends cycle: %s/cycle_a.yaml -> %s/cycle_b.yaml -> %s/cycle_a.yaml",
           g_fixtures, g_fixtures, g_fixtures);
  expect_error(fixture("cycle_a.yaml"), chain, "cycle_b.yaml:2:10:");
  snprintf(chain, sizeof chain, "cycle_self.yaml:1:10: extends cycle: %s/cycle_self.yaml -> %s/cycle_self.yaml",
           g_fixtures, g_fixtures);
  expect_error(fixture("cycle_self.yaml"), chain);
}

static void test_extends_missing_file_is_named(void) {
  char want[1200];
  snprintf(want, sizeof want, "extends: cannot open '%s/no_such_base.yaml'", g_fixtures);
  expect_error(fixture("extends_missing.yaml"), "extends_missing.yaml:2:26:", want);
}

/* a chain deeper than the limit is refused even though it has no cycle */
/* Each file naming its base 16 times: 16^4 reads if followed, refused at 64. */
static void test_extends_fan_out_is_limited(void) {
  char dir[] = "/tmp/tsr_profile_XXXXXX";
  if (!mkdtemp(dir)) {
    CHECK(0);
    return;
  }
  char path[6][128];
  for (int i = 0; i < 6; i++) {
    snprintf(path[i], sizeof path[i], "%s/f%d.yaml", dir, i);
    FILE *f = fopen(path[i], "w");
    if (!f) continue;
    if (i < 5) {
      fprintf(f, "extends: [");
      for (int k = 0; k < 16; k++) fprintf(f, "%sf%d.yaml", k ? ", " : "", i + 1);
      fprintf(f, "]\n");
    } else {
      fprintf(f, "model: default\n");
    }
    fclose(f);
  }
  struct tsr_profile *p = NULL;
  CHECK_OK(tsr_profile_load(path[4], NULL, 0, &p)); /* 16 reads of f5 */
  tsr_profile_free(p);
  expect_error(path[0], "extends reads more than 64 files in all", "f0.yaml -> ", "f5.yaml");
  for (int i = 0; i < 6; i++) unlink(path[i]);
  rmdir(dir);
}

static void test_extends_depth_is_limited(void) {
  char dir[] = "/tmp/tsr_profile_XXXXXX";
  if (!mkdtemp(dir)) {
    CHECK(0);
    return;
  }
  char path[64][128];
  int n = 20;
  for (int i = 0; i < n; i++) {
    snprintf(path[i], sizeof path[i], "%s/d%02d.yaml", dir, i);
    FILE *f = fopen(path[i], "w");
    if (!f) continue;
    if (i + 1 < n) fprintf(f, "extends: d%02d.yaml\n", i + 1);
    else fprintf(f, "model: default\n");
    fclose(f);
  }
  struct tsr_profile *p = NULL;
  CHECK_OK(tsr_profile_load(path[3], NULL, 0, &p)); /* d03 -> ... -> d19: 16 levels */
  tsr_profile_free(p);
  expect_error(path[2], "extends chain deeper than 16 files", "d02.yaml -> ", "-> ");
  for (int i = 0; i < n; i++) unlink(path[i]);
  rmdir(dir);
}

static void test_set_overrides_nested_and_new_keys(void) {
  const char *sets[] = {"sampling.top_k=5", "server.api_key_env=MY_KEY", "speculator.name=mtp",
                        "kv.per_kind.sliding.v=q8_0", "decode_policies=[sparse_v]",
                        "memory_limit=1.5GiB"};
  struct tsr_profile *p = load_ok(conf("example-deployment.yaml"), sets, 6);
  if (!p) return;
  CHECK(p->sampling.top_k == 5 && p->sampling.max_tokens == 2048);
  CHECK(!strcmp(p->server.api_key_env, "MY_KEY"));
  CHECK(p->has_speculator && !strcmp(p->speculator.name, "mtp")); /* through a null */
  CHECK(!strcmp(tsr_profile_v_codec(p, TSR_PROFILE_LAYER_SLIDING), "q8_0"));
  CHECK(!strcmp(tsr_profile_v_codec(p, TSR_PROFILE_LAYER_FULL), "q4_0"));
  CHECK(p->n_decode_policies == 1 && !strcmp(p->decode_policies[0], "sparse_v"));
  CHECK(p->memory_limit == 1610612736ull);
  CHECK(!strcmp(tsr_profile_where(p, "sampling.top_k"), "--set sampling.top_k"));
  tsr_profile_free(p);
}

static void test_set_errors_name_the_flag(void) {
  const char *through[] = {"context.x=1"};
  expect_error_sets(conf("default.yaml"), through, 1, "--set context.x: 'context' is a single value",
                    "default.yaml:58:10", (const char *)NULL);
  const char *bad_value[] = {"sampling.top_k=abc"};
  expect_error_sets(conf("default.yaml"), bad_value, 1,
                    "--set sampling.top_k: key 'sampling.top_k': expected an integer, got 'abc'",
                    (const char *)NULL);
  const char *no_eq[] = {"sampling.top_k"};
  expect_error_sets(conf("default.yaml"), no_eq, 1, "expected KEY.PATH=VALUE", (const char *)NULL);
  const char *unknown[] = {"sampling.topk=3"};
  expect_error_sets(conf("default.yaml"), unknown, 1, "--set sampling.topk: unknown key 'sampling.topk'",
                    (const char *)NULL);
  const char *malformed[] = {"decode_policies=[a"};
  expect_error_sets(conf("default.yaml"), malformed, 1, "--set decode_policies: did not find expected",
                    (const char *)NULL);
}

static void test_duplicate_keys_name_both_lines(void) {
  expect_error(fixture("duplicate_key.yaml"),
               "duplicate_key.yaml:5:3: duplicate key 'port' (first at line 3, again at line 5)");
}

static void test_duplicate_plugin_names_are_refused(void) {
  expect_error(fixture("duplicate_plugin.yaml"),
               "duplicate_plugin.yaml:7:5: plugin 'sparse_v' is listed twice",
               "(first at ", "duplicate_plugin.yaml:3:5)");
  expect_mem_error("t.yaml", "model: default\ndecode_policies: [a, b, a]\n",
                   "t.yaml:2:25: decode policy 'a' is listed twice", NULL);
}

static void test_anchors_and_aliases_are_refused(void) {
  expect_error(fixture("anchors.yaml"), "anchors.yaml:2:11: anchors (&s) are not supported");
  expect_error(fixture("alias.yaml"), "alias.yaml:2:12: aliases (*impl) are not supported");
}

static void test_malformed_yaml_reports_position(void) {
  expect_error(fixture("tab_indent.yaml"), "tab_indent.yaml:3:1: found character that cannot start");
  expect_error(fixture("unclosed_bracket.yaml"),
               "unclosed_bracket.yaml:3:8: did not find expected ',' or ']'",
               "started at line 2, column 18");
  expect_mem_error("t.yaml", "model: default\n---\ncontext: 5\n", "t.yaml:2:1:", "one YAML document");
  expect_mem_error("t.yaml", "- a\n- b\n", "t.yaml:1:1: a profile is a map", NULL);
  expect_mem_error("t.yaml", "model: \"\\xff\"\nx: \"a\\0b\"\n", "t.yaml:2:4:", "NUL");
  expect_mem_error("t.yaml", "model: \xff\n", "t.yaml:1:8:", "UTF-8");
}

static void test_memory_limit_units(void) {
  static const struct { const char *text; uint64_t bytes; } ok[] = {
      {"100", 100},         {"512MiB", 512ull << 20}, {"1.5GiB", 3ull << 29},
      {"1.5GB", 1500000000}, {"8 GiB", 8ull << 30},   {"2kib", 2048},
      {"0", 0},             {"1TB", 1000000000000ull}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    uint64_t b = 1;
    const char *why = NULL;
    CHECK_MSG(tsr_profile_parse_size(ok[i].text, &b, &why) && b == ok[i].bytes, "%s -> %llu (%s)",
              ok[i].text, (unsigned long long)b, why ? why : "");
  }
  static const char *const bad[] = {"12XB", "1.5B", "-1", "GiB", "", "1.2.3GiB",
                                    "99999999999999999999", "17179869184GiB"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    uint64_t b;
    const char *why = NULL;
    CHECK_MSG(!tsr_profile_parse_size(bad[i], &b, &why) && why, "'%s' was accepted", bad[i]);
  }
  expect_mem_error("t.yaml", "model: default\nmemory_limit: 12XB\n",
                   "t.yaml:2:15: key 'memory_limit': '12XB' is not a size: unknown unit", NULL);
  struct tsr_profile *p = NULL;
  const char *text = "model: default\nmemory_limit: \"512MiB\"\n";
  CHECK_OK(tsr_profile_load_mem("t.yaml", text, strlen(text), NULL, 0, &p));
  CHECK(p && p->memory_limit == 512ull << 20);
  tsr_profile_free(p);
}

static void test_plugin_settings_keep_their_positions(void) {
  struct tsr_profile *p = load_ok(fixture("plugin_settings.yaml"), NULL, 0);
  if (!p) return;
  CHECK(p->n_plugins == 2);
  if (p->n_plugins != 2) goto out;
  const struct tsr_pnode *s = p->plugins[0].settings;
  CHECK(!strcmp(p->plugins[0].name, "attn_dca") && tsr_profile_settings_count(s) == 3);
  struct tsr_profile_setting e;
  CHECK(tsr_profile_settings_get(s, 0, &e) && !strcmp(e.key, "chunk_size") &&
        !strcmp(e.value, "8192") && !e.quoted && strstr(e.where, "plugin_settings.yaml:5:7"));
  int64_t chunk = 0;
  CHECK_OK(tsr_pnode_int(e.node, "plugins.attn_dca.chunk_size", 1, 1 << 20, &chunk));
  CHECK(chunk == 8192);
  CHECK(tsr_profile_settings_get(s, 1, &e) && e.quoted && !strcmp(e.value, "4096"));
  /* quoted: a string, so a plugin asking for an integer is told where and why */
  CHECK(tsr_pnode_int(e.node, "plugins.attn_dca.local_window", 0, 100000, &chunk) ==
        TSR_ERR_INVALID_ARG);
  CHECK(strstr(tsr_error_message(), "plugin_settings.yaml:6:21: key 'plugins.attn_dca.local_window'"));
  CHECK(tsr_profile_settings_get(s, 2, &e) && e.value == NULL && e.node->kind == TSR_PNODE_SEQ);
  CHECK(!tsr_profile_settings_get(s, 3, &e));
  CHECK(!strcmp(p->plugins[1].name, "sparse_v") && p->plugins[1].settings == NULL);
  CHECK(tsr_profile_settings_count(p->plugins[1].settings) == 0);
  CHECK(p->has_speculator && !strcmp(p->speculator.name, "mtp") &&
        tsr_profile_settings_count(p->speculator.settings) == 1);
out:
  tsr_profile_free(p);
}

/* what `profile check` prints loads back to the same profile */
/* a's printout (*text, freed by the caller) loaded back as *b; NULL *b when a is NULL
** or the printout does not load (the CHECK has failed). */
static void print_and_reload(const struct tsr_profile *a, char **text, struct tsr_profile **b) {
  size_t len = 0;
  *text = NULL;
  *b = NULL;
  if (!a) return;
  FILE *f = open_memstream(text, &len);
  tsr_profile_print(a, f);
  fclose(f);
  CHECK_OK(tsr_profile_load_mem("printed.yaml", *text, len, NULL, 0, b));
}

static void test_print_round_trips(void) {
  const char *sets[] = {"plugins=[a, {name: b, settings: {x: \"1\", y: [1, {z: 2}], w: null}}]",
                        "speculator.name=mtp", "sampling.temperature=0.1"};
  struct tsr_profile *a = load_ok(conf("example-deployment.yaml"), sets, 3), *b = NULL;
  if (!a) return;
  char *text = NULL;
  print_and_reload(a, &text, &b);
  CHECK(strstr(text, "context: 131072") && strstr(text, "example-deployment.yaml:13:10"));
  CHECK(strstr(text, "memory_limit: 120GiB"));
  if (b) {
    CHECK(!strcmp(a->backend, b->backend) && a->context == b->context && a->batch == b->batch);
    CHECK(a->memory_limit == b->memory_limit && !strcmp(a->attention, b->attention));
    CHECK(!memcmp(&a->sampling, &b->sampling, sizeof a->sampling));
    CHECK(!strcmp(tsr_profile_k_codec(b, TSR_PROFILE_LAYER_FULL), "q8_0"));
    CHECK(b->n_plugins == 2 && b->has_speculator && b->server.port == a->server.port);
    if (b->n_plugins == 2) {
      struct tsr_profile_setting e;
      CHECK(tsr_profile_settings_get(b->plugins[1].settings, 0, &e) && e.quoted &&
            !strcmp(e.value, "1"));
      CHECK(tsr_profile_settings_get(b->plugins[1].settings, 2, &e) && tsr_pnode_is_null(e.node));
    }
  }
  free(text);
  tsr_profile_free(a);
  tsr_profile_free(b);
}

/* Values no fixed buffer holds, lists nested deep, and line breaks YAML knows
** beyond \n (NEL in a key, \r in a --set key path that lands in a comment) all
** print as YAML that loads back to the same values. */
static void test_print_round_trips_long_values_and_line_breaks(void) {
  char *text = malloc(8192);
  char model[2001];
  memset(model, 'm', 2000);
  model[2000] = '\0';
  int n = snprintf(text, 8192, "model: \"%s\"\nplugins:\n  - name: a\n    settings:\n"
                   "      \"k\\Nj\": \"%s\"\n      ? %s\n      : {x: 1}\n      deep: ", model,
                   "\u00e9\u00e9\u00e9", model); /* a key too long to be implicit */
  for (int i = 0; i < 40; i++) n += snprintf(text + n, 8192 - (size_t)n, "[");
  n += snprintf(text + n, 8192 - (size_t)n, "1");
  for (int i = 0; i < 40; i++) n += snprintf(text + n, 8192 - (size_t)n, "]");
  snprintf(text + n, 8192 - (size_t)n, "\n");
  const char *sets[] = {"plugins.0.settings.x\ry=2"};
  struct tsr_profile *a = NULL, *b = NULL;
  CHECK_OK(tsr_profile_load_mem("long.yaml", text, strlen(text), sets, 1, &a));
  char *printed = NULL;
  print_and_reload(a, &printed, &b);
  if (b) {
    CHECK(!strcmp(b->model_path, model));
    const struct tsr_pnode *s = b->plugins[0].settings;
    CHECK(tsr_profile_settings_count(s) == 4);
    const struct tsr_pnode *lk = tsr_pnode_get(s, model);
    CHECK(lk && lk->kind == TSR_PNODE_MAP && !strcmp(tsr_pnode_get(lk, "x")->str, "1"));
    struct tsr_profile_setting e;
    CHECK(tsr_profile_settings_get(s, 0, &e) && !strcmp(e.key, "k\xC2\x85j") &&
          !strcmp(e.value, "\xC3\xA9\xC3\xA9\xC3\xA9"));
    const struct tsr_pnode *deep = tsr_pnode_get(s, "deep");
    int depth = 0;
    for (; deep && deep->kind == TSR_PNODE_SEQ && deep->n == 1; deep = deep->items[0]) depth++;
    CHECK(depth == 40 && deep && !strcmp(deep->str, "1"));
    CHECK(tsr_profile_settings_get(s, 3, &e) && !strcmp(e.key, "x\ry") && !strcmp(e.value, "2"));
  }
  free(printed);
  free(text);
  tsr_profile_free(a);
  tsr_profile_free(b);
  /* nor one nested deeper than a file may be: the printout could not be loaded */
  char deep[400] = "plugins.0.settings";
  for (int i = 0; i < 60; i++) strcat(deep, ".a");
  strcat(deep, "=[[1]]");
  const char *deep_sets[] = {"plugins=[{name: a}]", deep};
  expect_error_sets(conf("example-deployment.yaml"), deep_sets, 2, "nested deeper than 64",
                    (const char *)NULL);
  deep[strlen(deep) - 6] = '\0';
  strcat(deep, "=1"); /* 63 maps and the value: as deep as a file may go */
  struct tsr_profile *ok = load_ok(conf("example-deployment.yaml"), deep_sets, 2);
  tsr_profile_free(ok);
  /* a --set key path that is not UTF-8 could not be printed: refused, as in a file */
  const char *bad[] = {"plugins.0.settings.\xff=1"};
  expect_error_sets(conf("example-deployment.yaml"), bad, 1, "not UTF-8", (const char *)NULL);
}

/* Code points a YAML file may not hold raw (a C1 control, DEL, U+FEFF, LS) in a
** --set key path print escaped, in the key and in the comment naming the --set,
** and load back to the same key. */
static void test_print_escapes_what_yaml_refuses_raw(void) {
  const char *key = "a\xC2\x81" "b\x7F\xEF\xBB\xBF\xE2\x80\xA8\xEF\xBF\xBE" "c";
  char set[128];
  snprintf(set, sizeof set, "plugins.0.settings.%s=1", key);
  const char *sets[] = {"plugins=[{name: a}]", set};
  struct tsr_profile *a = load_ok(conf("example-deployment.yaml"), sets, 2), *b = NULL;
  char *printed = NULL;
  print_and_reload(a, &printed, &b);
  if (b) {
    struct tsr_profile_setting e;
    CHECK(tsr_profile_settings_get(b->plugins[0].settings, 0, &e) && !strcmp(e.key, key) &&
          !strcmp(e.value, "1"));
  }
  free(printed);
  tsr_profile_free(a);
  tsr_profile_free(b);
}

/* kv.boundary: layers and at least one codec, or nothing; printed and loaded back. */
static void test_kv_boundary(void) {
  const char *sets[] = {"kv.boundary={layers: 2, k: q8_0}"};
  struct tsr_profile *a = load_ok(conf("example-deployment.yaml"), sets, 1), *b = NULL;
  if (a) CHECK(a->kv_boundary.layers == 2 && !strcmp(a->kv_boundary.k, "q8_0") && !a->kv_boundary.v);
  char *printed = NULL;
  print_and_reload(a, &printed, &b);
  if (b) CHECK(b->kv_boundary.layers == 2 && !strcmp(b->kv_boundary.k, "q8_0") && !b->kv_boundary.v);
  CHECK(printed && strstr(printed, "  boundary:\n    layers: 2") != NULL);
  free(printed);
  tsr_profile_free(a);
  tsr_profile_free(b);
  const char *no_codec[] = {"kv.boundary.layers=2"};
  expect_error_sets(conf("example-deployment.yaml"), no_codec, 1, "--set kv.boundary.layers",
                    "kv.boundary names no codec", (const char *)NULL);
  const char *no_layers[] = {"kv.boundary={v: q8_0}"};
  expect_error_sets(conf("example-deployment.yaml"), no_layers, 1,
                    "kv.boundary.v would reach no layer", (const char *)NULL);
  const char *zero[] = {"kv.boundary={layers: 0, k: q8_0}"};
  expect_error_sets(conf("example-deployment.yaml"), zero, 1, "kv.boundary.k would reach no layer",
                    (const char *)NULL);
  const char *negative[] = {"kv.boundary={layers: -1, k: q8_0}"};
  expect_error_sets(conf("example-deployment.yaml"), negative, 1, "layers", (const char *)NULL);
  const char *unknown[] = {"kv.boundary={layers: 1, k: q8_0, first: 2}"};
  expect_error_sets(conf("example-deployment.yaml"), unknown, 1, "first", (const char *)NULL);
}

/* A plugin gets a setting's text as written, so an empty value and ~ print as
** themselves: printed as null they would come back as the text "null". */
static void test_print_keeps_how_null_is_spelled(void) {
  const char *text = "model: m.gguf\nplugins: [{name: a, settings: {e: , t: ~, n: Null}}]\n";
  struct tsr_profile *a = NULL, *b = NULL;
  CHECK_OK(tsr_profile_load_mem("null.yaml", text, strlen(text), NULL, 0, &a));
  char *printed = NULL;
  print_and_reload(a, &printed, &b);
  if (b) {
    const char *want[] = {"", "~", "Null"};
    struct tsr_profile_setting e;
    for (size_t i = 0; i < 3; i++)
      CHECK(tsr_profile_settings_get(b->plugins[0].settings, i, &e) && !strcmp(e.value, want[i]) &&
            tsr_pnode_is_null(e.node));
  }
  free(printed);
  tsr_profile_free(a);
  tsr_profile_free(b);
}

/* backend.precision f32, the exact mode: gemm and gemv f32 and decode attention on the tile
** kernels, shown as its doing in the printout, which loads back the same; a value written
** against it (profile or variable) is refused naming where; TESSERA_CUDA_PRECISION turns it on. */
static void test_exact_mode_sets_what_it_needs_and_refuses_contradictions(void) {
  const char *vars[] = {"TESSERA_CUDA_PRECISION", "TESSERA_CUDA_GEMV", "TESSERA_CUDA_GEMM",
                        "TESSERA_CUDA_ATTN_GQA_DECODE"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
  const char *text = "model: m.gguf\nbackend: {name: cuda, precision: f32}\n";
  struct tsr_profile *p = NULL, *back = NULL;
  char *out = NULL;
  size_t len = 0;
  CHECK_OK(tsr_profile_load_mem("exact.yaml", text, strlen(text), NULL, 0, &p));
  if (p) {
    CHECK(p->cuda.precision_f32 == 1 && p->cuda.gemm_f32 == 1 && p->cuda.gemv_f32 == 1);
    CHECK(p->cuda.attn_decode == TSR_CUDA_DECODE_TILE && p->cuda.graphs == 1);
    CHECK(p->cuda_forced[1] && p->cuda_forced[2] && p->cuda_forced[6] && !p->cuda_forced[3]);
    FILE *f = open_memstream(&out, &len);
    tsr_profile_print(p, f);
    fclose(f);
    CHECK(strstr(out, "precision: f32") && strstr(out, "gemv: f32") &&
          strstr(out, "decode: tile") && strstr(out, "# backend.precision f32"));
    CHECK_OK(tsr_profile_load_mem("printed.yaml", out, len, NULL, 0, &back));
    if (back) CHECK(!memcmp(&p->cuda, &back->cuda, sizeof p->cuda));
  }
  tsr_profile_free(p);
  tsr_profile_free(back);
  free(out);
  /* the default is mixed; a setting written against the exact mode is refused where written */
  const char *mixed = "model: m.gguf\nbackend: cuda\n";
  CHECK_OK(tsr_profile_load_mem("mixed.yaml", mixed, strlen(mixed), NULL, 0, &p));
  if (p) CHECK(p->cuda.precision_f32 == 0 && p->cuda.gemv_f32 == 0 && !p->cuda_forced[2]);
  tsr_profile_free(p);
  expect_mem_error("q8.yaml", "model: m.gguf\nbackend: {name: cuda, precision: f32, gemv: q8}\n",
                   "q8.yaml:2:", "backend.gemv is q8, and backend.precision f32");
  expect_mem_error("gqa.yaml", "model: m.gguf\nbackend:\n  name: cuda\n  precision: f32\n"
                   "  attention: {decode: gqa}\n", "gqa.yaml:5:", "make it tile");
  expect_mem_error("f64.yaml", "model: m.gguf\nbackend: {name: cuda, precision: f64}\n",
                   "backend.precision is 'f64'", "mixed or f32");
  expect_mem_error("map.yaml", "model: m.gguf\nbackend: {name: cuda, precision: {f: 32}}\n",
                   "precision", "mixed or f32");
  setenv("TESSERA_CUDA_PRECISION", "fp32", 1);
  expect_mem_error("mixed.yaml", mixed, "TESSERA_CUDA_PRECISION is 'fp32'", "mixed or f32");
  unsetenv("TESSERA_CUDA_PRECISION");
  setenv("TESSERA_CUDA_GEMM", "f16", 1);
  expect_mem_error("exact.yaml", text, "TESSERA_CUDA_GEMM: backend.gemm is f16", "make it f32");
  unsetenv("TESSERA_CUDA_GEMM");
  /* the variable turns it on over a profile that says nothing of it */
  setenv("TESSERA_CUDA_PRECISION", "f32", 1);
  CHECK_OK(tsr_profile_load_mem("mixed.yaml", mixed, strlen(mixed), NULL, 0, &p));
  if (p) CHECK(p->cuda.precision_f32 == 1 && p->cuda.gemm_f32 == 1 && p->cuda_env[9]);
  tsr_profile_free(p);
  unsetenv("TESSERA_CUDA_PRECISION");
}

/* The cuda backend's settings: a map under `backend`, each key checked; a cuda setting
** under another backend is refused; a TESSERA_CUDA_* variable overrides its key and the
** printout says so; the printout loads back to the same settings. */
static void test_backend_settings_are_checked_overridden_and_printed(void) {
  const char *text = "model: m.gguf\nbackend:\n  name: cuda\n  gemm: f32\n  graphs: false\n"
                     "  attention: {decode: tile, split_keys: 512}\n";
  struct tsr_profile *p = NULL, *back = NULL;
  unsetenv("TESSERA_CUDA_GEMV");
  CHECK_OK(tsr_profile_load_mem("cuda.yaml", text, strlen(text), NULL, 0, &p));
  if (p) {
    CHECK(!strcmp(p->backend, "cuda") && p->cuda.gemm_f32 == 1 && p->cuda.graphs == 0);
    CHECK(p->cuda.attn_decode == TSR_CUDA_DECODE_TILE && p->cuda.attn_split_keys == 512);
    CHECK(p->cuda.gemv_f32 == 0 && p->cuda.device == 0 && p->cuda_env[2] == NULL);
  }
  tsr_profile_free(p);
  expect_mem_error("cpu.yaml", "model: m.gguf\nbackend: {name: cpu, graphs: false}\n",
                   "cpu.yaml:2:", "key 'backend.graphs' is a cuda setting, and the backend is cpu");
  expect_mem_error("bad.yaml", "model: m.gguf\nbackend: {name: cuda, gemm: f8}\n",
                   "bad.yaml:2:", "backend.gemm is 'f8'; it takes f16 or f32");
  expect_mem_error("key.yaml", "model: m.gguf\nbackend: {name: cuda, attention: {splitkeys: 1}}\n",
                   "unknown key 'backend.attention.splitkeys'", "split_keys");
  expect_mem_error("noname.yaml", "model: m.gguf\nbackend: {gemm: f32}\n", "noname.yaml:2:",
                   "needs its name");
  /* the environment over the profile, shown as such */
  setenv("TESSERA_CUDA_GEMV", "f32", 1);
  CHECK_OK(tsr_profile_load_mem("cuda.yaml", text, strlen(text), NULL, 0, &p));
  char *out = NULL;
  size_t len = 0;
  if (p) {
    CHECK(p->cuda.gemv_f32 == 1 && p->cuda_env[2] && !strcmp(p->cuda_env[2], "TESSERA_CUDA_GEMV"));
    FILE *f = open_memstream(&out, &len);
    tsr_profile_print(p, f);
    fclose(f);
    CHECK(strstr(out, "gemv: f32") && strstr(out, "TESSERA_CUDA_GEMV (environment, over the "
                                                  "profile)"));
    CHECK(strstr(out, "decode: tile") && strstr(out, "cuda.yaml:6:"));
  }
  unsetenv("TESSERA_CUDA_GEMV");
  CHECK_OK(tsr_profile_load_mem("printed.yaml", out, len, NULL, 0, &back));
  if (p && back) CHECK(!memcmp(&p->cuda, &back->cuda, sizeof p->cuda));
  tsr_profile_free(p);
  tsr_profile_free(back);
  free(out);
  /* a bad variable is named; on the cpu the variables are not applied */
  setenv("TESSERA_CUDA_ATTN_GQA_DECODE", "3", 1);
  expect_mem_error("cuda.yaml", text, "TESSERA_CUDA_ATTN_GQA_DECODE is '3'", "2, 1 or 0");
  CHECK_OK(tsr_profile_load_mem("cpu.yaml", "model: m.gguf\n", 14, NULL, 0, &p));
  if (p) CHECK(p->cuda.attn_decode == TSR_CUDA_DECODE_GQA_STAGED && !p->cuda_env[6]);
  tsr_profile_free(p);
  unsetenv("TESSERA_CUDA_ATTN_GQA_DECODE");
  /* graph_slots: 1..16 captures, 8 by default; anything else refused by name */
  unsetenv("TESSERA_CUDA_GRAPH_SLOTS");
  CHECK_OK(tsr_profile_load_mem("cuda.yaml", text, strlen(text), NULL, 0, &p));
  if (p) CHECK(p->cuda.graph_slots == 8);
  tsr_profile_free(p);
  const char *slots16 = "model: m.gguf\nbackend: {name: cuda, graph_slots: 16}\n";
  CHECK_OK(tsr_profile_load_mem("s.yaml", slots16, strlen(slots16), NULL, 0, &p));
  if (p) CHECK(p->cuda.graph_slots == 16);
  tsr_profile_free(p);
  const char *const bad[] = {"0", "17", "-1", "8x", "''", "99999999999999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char yaml[128];
    snprintf(yaml, sizeof yaml, "model: m.gguf\nbackend: {name: cuda, graph_slots: %s}\n", bad[i]);
    expect_mem_error("slots.yaml", yaml, "backend.graph_slots", "1..16 captures kept at once");
  }
  setenv("TESSERA_CUDA_GRAPH_SLOTS", "0", 1);
  expect_mem_error("cuda.yaml", text, "TESSERA_CUDA_GRAPH_SLOTS is '0'", "1..16");
  setenv("TESSERA_CUDA_GRAPH_SLOTS", "2", 1);
  CHECK_OK(tsr_profile_load_mem("cuda.yaml", text, strlen(text), NULL, 0, &p));
  if (p) CHECK(p->cuda.graph_slots == 2);
  tsr_profile_free(p);
  unsetenv("TESSERA_CUDA_GRAPH_SLOTS");
}

/* The cpu backend's one setting: activations (q8, the default, or f32), checked and
** printed; the printout loads back to the same choice; under cuda it is refused. */
static void test_cpu_activations_is_checked_and_printed(void) {
  struct tsr_profile *p = NULL, *back = NULL;
  CHECK_OK(tsr_profile_load_mem("cpu.yaml", "model: m.gguf\n", 14, NULL, 0, &p));
  if (p) CHECK(p->cpu_activations_f32 == 0);
  tsr_profile_free(p);
  const char *text = "model: m.gguf\nbackend: {name: cpu, activations: f32}\n";
  CHECK_OK(tsr_profile_load_mem("cpu.yaml", text, strlen(text), NULL, 0, &p));
  char *out = NULL;
  size_t len = 0;
  if (p) {
    CHECK(p->cpu_activations_f32 == 1);
    FILE *f = open_memstream(&out, &len);
    tsr_profile_print(p, f);
    fclose(f);
    CHECK(strstr(out, "  name: cpu") && strstr(out, "  activations: f32") && strstr(out, "cpu.yaml:2:"));
    CHECK_OK(tsr_profile_load_mem("printed.yaml", out, len, NULL, 0, &back));
    if (back) CHECK(back->cpu_activations_f32 == 1 && !strcmp(back->backend, "cpu"));
  }
  tsr_profile_free(p);
  tsr_profile_free(back);
  free(out);
  expect_mem_error("bad.yaml", "model: m.gguf\nbackend: {name: cpu, activations: q4}\n",
                   "bad.yaml:2:", "key 'backend.activations': expected q8 or f32");
  expect_mem_error("map.yaml", "model: m.gguf\nbackend: {name: cpu, activations: {q8: 1}}\n",
                   "map.yaml:2:", "key 'backend.activations': expected q8 or f32");
  expect_mem_error("cuda.yaml", "model: m.gguf\nbackend: {name: cuda, activations: q8}\n",
                   "cuda.yaml:2:", "'backend.activations' is a cpu setting, and the backend is cuda");
}

int main(int argc, char **argv) {
  if (argc > 1) g_fixtures = argv[1];
  if (argc > 2) g_conf = argv[2];
  TSR_RUN(test_default_profile_has_documented_defaults);
  TSR_RUN(test_cpu_activations_is_checked_and_printed);
  TSR_RUN(test_builtin_defaults_match_default_yaml);
  TSR_RUN(test_example_extends_default_and_overrides);
  TSR_RUN(test_extends_merges_maps_and_resolves_paths_per_file);
  TSR_RUN(test_error_in_base_names_the_base_file);
  TSR_RUN(test_unknown_keys_are_refused_with_position);
  TSR_RUN(test_wrong_types_are_refused_with_position);
  TSR_RUN(test_out_of_range_values_are_refused);
  TSR_RUN(test_extends_cycles_are_refused_naming_the_chain);
  TSR_RUN(test_extends_missing_file_is_named);
  TSR_RUN(test_extends_depth_is_limited);
  TSR_RUN(test_extends_fan_out_is_limited);
  TSR_RUN(test_set_overrides_nested_and_new_keys);
  TSR_RUN(test_set_errors_name_the_flag);
  TSR_RUN(test_duplicate_keys_name_both_lines);
  TSR_RUN(test_duplicate_plugin_names_are_refused);
  TSR_RUN(test_anchors_and_aliases_are_refused);
  TSR_RUN(test_malformed_yaml_reports_position);
  TSR_RUN(test_memory_limit_units);
  TSR_RUN(test_plugin_settings_keep_their_positions);
  TSR_RUN(test_print_round_trips);
  TSR_RUN(test_print_round_trips_long_values_and_line_breaks);
  TSR_RUN(test_print_escapes_what_yaml_refuses_raw);
  TSR_RUN(test_kv_boundary);
  TSR_RUN(test_print_keeps_how_null_is_spelled);
  TSR_RUN(test_backend_settings_are_checked_overridden_and_printed);
  TSR_RUN(test_exact_mode_sets_what_it_needs_and_refuses_contradictions);
  return TSR_TEST_EXIT();
}
