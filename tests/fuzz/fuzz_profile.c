/* libFuzzer target: profiles (YAML, extends, --set, the schema) on arbitrary
** bytes, with files in a private directory so extends chains are real files.
**
** Input: one flag byte, then the files p0.yaml, p1.yaml, ... separated by NUL
** bytes (libyaml refuses NUL in a profile, so no file loses a meaningful byte).
** p0.yaml is the profile loaded; the others are there for its extends to name.
** The directory also holds sub -> ".", so "sub/p1.yaml" and "sub/sub/p0.yaml"
** reach the same files under other names (cycles must still be seen).
**   flag bit 0: load p0 from memory (tsr_profile_load_mem) instead of the file
**   flag bit 1: the last segment is not a file but --set arguments, one a line
**   flag bit 2: no splitting: everything after the flag byte is p0.yaml
** A profile that loads is walked, printed, and its printout loaded back: it
** must load, with the same values, and print the same text again. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "profile/profile.h"

#define REQUIRE(c) do { if (!(c)) __builtin_trap(); } while (0)

#define MAX_FILES 8
#define MAX_SETS 16

static char g_dir[] = "/tmp/tsr_fuzz_profile_XXXXXX";
static FILE *g_null;
static volatile uint64_t g_sink;

static void remove_dir(void) {
  char path[sizeof g_dir + 32];
  for (int i = 0; i < MAX_FILES; i++) {
    snprintf(path, sizeof path, "%s/p%d.yaml", g_dir, i);
    unlink(path);
  }
  snprintf(path, sizeof path, "%s/sub", g_dir);
  unlink(path);
  rmdir(g_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  char sub[sizeof g_dir + 8];
  /* the environment's TESSERA_CUDA_* overrides would make results depend on the shell */
  for (int i = 0; i < TSR_CUDA_N_SETTINGS; i++) unsetenv(tsr_cuda_setting_key(i)->env);
  if (!mkdtemp(g_dir)) abort();
  snprintf(sub, sizeof sub, "%s/sub", g_dir);
  if (symlink(".", sub) != 0) abort();
  if (!(g_null = fopen("/dev/null", "w"))) abort();
  atexit(remove_dir);
  return 0;
}

static void write_file(int i, const uint8_t *data, size_t len) {
  char path[sizeof g_dir + 16];
  snprintf(path, sizeof path, "%s/p%d.yaml", g_dir, i);
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  if (len && fwrite(data, 1, len, f) != len) abort();
  fclose(f);
}

/* Every node of the merged tree: locations set, map keys plain scalars, and
** every typed read either succeeds or fails cleanly. */
static void walk(const struct tsr_pnode *n, int depth) {
  REQUIRE(n && n->where && n->file && depth < 200);
  if (n->kind == TSR_PNODE_SCALAR) {
    REQUIRE(n->str && n->n == 0);
    int64_t i;
    double d;
    int b;
    uint64_t sz;
    g_sink += tsr_pnode_int(n, "k", INT64_MIN, INT64_MAX, &i) + tsr_pnode_float(n, "k", &d) +
              tsr_pnode_bool(n, "k", &b) + tsr_pnode_size(n, "k", &sz) + tsr_pnode_is_null(n);
    return;
  }
  REQUIRE(n->kind == TSR_PNODE_MAP || n->kind == TSR_PNODE_SEQ);
  for (size_t i = 0; i < n->n; i++) {
    if (n->kind == TSR_PNODE_MAP) {
      REQUIRE(n->keys[i]->kind == TSR_PNODE_SCALAR);
      REQUIRE(tsr_pnode_get(n, n->keys[i]->str) != NULL);
    }
    walk(n->items[i], depth + 1);
  }
}

static void check_plugin(const struct tsr_profile_plugin *pl) {
  REQUIRE(pl->name && pl->name[0] && pl->node);
  REQUIRE(!pl->path || pl->resolved_path);
  struct tsr_profile_setting s;
  size_t n = tsr_profile_settings_count(pl->settings);
  for (size_t i = 0; i < n; i++) {
    REQUIRE(tsr_profile_settings_get(pl->settings, i, &s) && s.key && s.where && s.node);
    g_sink += strlen(s.key) + (s.value ? strlen(s.value) : 0);
  }
  REQUIRE(!tsr_profile_settings_get(pl->settings, n, &s));
}

static const char *const g_key_paths[] = {
    "model", "backend", "backend.name", "backend.gemm", "threads", "context", "batch", "ubatch",
    "memory_limit", "attention", "attention.full", "kv.k", "kv.v", "kv.per_kind.full.k",
    "kv.per_kind.sliding.v", "kv.boundary.layers", "plugins", "plugins.0", "plugins.0.settings", "plugins.99",
    "decode_policies.0", "speculator.name", "sampling.top_p", "sampling.seed", "server.port",
    "", ".", "..", "a..b", "plugins.18446744073709551616",
};

static char *print_to_string(const struct tsr_profile *p, size_t *len) {
  char *text = NULL;
  FILE *f = open_memstream(&text, len);
  if (!f) abort();
  tsr_profile_print(p, f);
  fclose(f);
  return text;
}

static int same_str(const char *a, const char *b) { return a == b || (a && b && !strcmp(a, b)); }

/* Two settings trees a plugin cannot tell apart: the same keys and structure,
** the same text, and every typed read giving the same answer (a plain value
** the printout has to quote stays a string either way). */
static void same_tree(const struct tsr_pnode *a, const struct tsr_pnode *b) {
  if (!a || !b) { /* no settings, or an empty map of them */
    REQUIRE(tsr_profile_settings_count(a) == 0 && tsr_profile_settings_count(b) == 0);
    return;
  }
  REQUIRE(a->kind == b->kind && a->n == b->n);
  if (a->kind == TSR_PNODE_SCALAR) {
    REQUIRE(!strcmp(a->str, b->str) && tsr_pnode_is_null(a) == tsr_pnode_is_null(b));
    int64_t ia = 0, ib = 0;
    double fa = 0, fb = 0;
    int ba = 0, bb = 0;
    uint64_t sa = 0, sb = 0;
    REQUIRE(tsr_pnode_int(a, "k", INT64_MIN, INT64_MAX, &ia) ==
                tsr_pnode_int(b, "k", INT64_MIN, INT64_MAX, &ib) && ia == ib);
    REQUIRE(tsr_pnode_float(a, "k", &fa) == tsr_pnode_float(b, "k", &fb) && !memcmp(&fa, &fb, sizeof fa));
    REQUIRE(tsr_pnode_bool(a, "k", &ba) == tsr_pnode_bool(b, "k", &bb) && ba == bb);
    REQUIRE(tsr_pnode_size(a, "k", &sa) == tsr_pnode_size(b, "k", &sb) && sa == sb);
    return;
  }
  for (size_t i = 0; i < a->n; i++) {
    if (a->kind == TSR_PNODE_MAP) REQUIRE(!strcmp(a->keys[i]->str, b->keys[i]->str));
    same_tree(a->items[i], b->items[i]);
  }
}

/* What the printout must carry over: every value the schema reads. */
static void same_values(const struct tsr_profile *a, const struct tsr_profile *b) {
  REQUIRE(same_str(a->model_path ? a->model_path : a->model, b->model_path ? b->model_path : b->model));
  REQUIRE(same_str(a->backend, b->backend) && !memcmp(&a->cuda, &b->cuda, sizeof a->cuda));
  REQUIRE(a->threads == b->threads && a->context == b->context && a->batch == b->batch &&
          a->ubatch == b->ubatch && a->memory_limit == b->memory_limit);
  for (int k = 0; k < TSR_PROFILE_LAYER_KINDS; k++) {
    REQUIRE(same_str(tsr_profile_attention(a, k), tsr_profile_attention(b, k)));
    REQUIRE(same_str(tsr_profile_k_codec(a, k), tsr_profile_k_codec(b, k)));
    REQUIRE(same_str(tsr_profile_v_codec(a, k), tsr_profile_v_codec(b, k)));
  }
  REQUIRE(a->kv_boundary.layers == b->kv_boundary.layers &&
          same_str(a->kv_boundary.k, b->kv_boundary.k) &&
          same_str(a->kv_boundary.v, b->kv_boundary.v));
  REQUIRE(a->n_plugins == b->n_plugins && a->n_decode_policies == b->n_decode_policies);
  for (size_t i = 0; i < a->n_plugins; i++) {
    REQUIRE(same_str(a->plugins[i].name, b->plugins[i].name));
    REQUIRE(same_str(a->plugins[i].resolved_path, b->plugins[i].resolved_path));
    same_tree(a->plugins[i].settings, b->plugins[i].settings);
  }
  for (size_t i = 0; i < a->n_decode_policies; i++)
    REQUIRE(same_str(a->decode_policies[i], b->decode_policies[i]));
  REQUIRE(a->has_speculator == b->has_speculator);
  if (a->has_speculator) {
    REQUIRE(same_str(a->speculator.name, b->speculator.name));
    same_tree(a->speculator.settings, b->speculator.settings);
  }
  REQUIRE(!memcmp(&a->sampling, &b->sampling, sizeof a->sampling));
  REQUIRE(same_str(a->server.host, b->server.host) && a->server.port == b->server.port &&
          a->server.parallel == b->server.parallel &&
          same_str(a->server.api_key_env, b->server.api_key_env));
}

static void check_loaded(struct tsr_profile *p) {
  REQUIRE(p->path && p->dir && p->model && p->backend && p->root);
  REQUIRE(p->ubatch <= p->batch && p->context >= 1);
  REQUIRE(!p->kv_boundary.layers == !(p->kv_boundary.k || p->kv_boundary.v));
  REQUIRE(!strcmp(p->backend, "cpu") || !strcmp(p->backend, "cuda"));
  walk(p->root, 0);
  for (size_t i = 0; i < p->n_plugins; i++) check_plugin(&p->plugins[i]);
  for (size_t i = 0; i < p->n_decode_policies; i++) REQUIRE(p->decode_policies[i][0]);
  if (p->has_speculator) check_plugin(&p->speculator);
  for (size_t i = 0; i < sizeof g_key_paths / sizeof g_key_paths[0]; i++)
    REQUIRE(tsr_profile_where(p, g_key_paths[i]) != NULL);
  for (int k = 0; k <= TSR_PROFILE_LAYER_KINDS; k++) {
    REQUIRE(tsr_profile_k_codec(p, k) && tsr_profile_v_codec(p, k) && tsr_profile_attention(p, k));
    REQUIRE(tsr_profile_layer_kind_name(k) != NULL);
  }
  tsr_profile_print(p, g_null);

  /* the printout loads back to the same profile, and prints the same again;
  ** its paths are already resolved, so it is loaded under a name with no folder */
  size_t len1, len2, len3;
  char *text1 = print_to_string(p, &len1);
  struct tsr_profile *p2, *p3;
  REQUIRE(tsr_profile_load_mem("printed.yaml", text1, len1, NULL, 0, &p2) == TSR_OK);
  same_values(p, p2);
  char *text2 = print_to_string(p2, &len2);
  REQUIRE(tsr_profile_load_mem("printed.yaml", text2, len2, NULL, 0, &p3) == TSR_OK);
  char *text3 = print_to_string(p3, &len3);
  REQUIRE(len2 == len3 && !memcmp(text2, text3, len2));
  free(text1);
  free(text2);
  free(text3);
  tsr_profile_free(p2);
  tsr_profile_free(p3);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const unsigned flags = data[0];
  const uint8_t *p = data + 1, *end = data + size;

  /* the segments: files, and perhaps the --set lines last */
  const uint8_t *seg[MAX_FILES + 1];
  size_t seg_len[MAX_FILES + 1];
  int n_seg = 0, max_seg = MAX_FILES + ((flags & 2) ? 1 : 0);
  for (;;) {
    const uint8_t *nul = (flags & 4) ? NULL : memchr(p, 0, (size_t)(end - p));
    const uint8_t *stop = nul && n_seg + 1 < max_seg ? nul : end;
    seg[n_seg] = p;
    seg_len[n_seg++] = (size_t)(stop - p);
    if (stop == end) break;
    p = stop + 1;
  }
  char *sets_buf = NULL;
  const char *sets[MAX_SETS];
  int n_sets = 0;
  if ((flags & 2) && n_seg > 1) {
    n_seg--;
    sets_buf = malloc(seg_len[n_seg] + 1);
    memcpy(sets_buf, seg[n_seg], seg_len[n_seg]);
    sets_buf[seg_len[n_seg]] = '\0';
    for (char *s = sets_buf; s && n_sets < MAX_SETS;) {
      char *nl = strchr(s, '\n');
      if (nl) *nl = '\0';
      sets[n_sets++] = s;
      s = nl ? nl + 1 : NULL;
    }
  }
  for (int i = 0; i < n_seg; i++) write_file(i, seg[i], seg_len[i]);

  char top[sizeof g_dir + 16];
  snprintf(top, sizeof top, "%s/p0.yaml", g_dir);
  struct tsr_profile *prof = NULL;
  tsr_error_clear();
  tsr_status st = (flags & 1) ? tsr_profile_load_mem(top, (const char *)seg[0], seg_len[0], sets,
                                                     n_sets, &prof)
                              : tsr_profile_load(top, sets, n_sets, &prof);
  if (st == TSR_OK) {
    check_loaded(prof);
    tsr_profile_free(prof);
  } else {
    REQUIRE(prof == NULL && tsr_error_message()[0]); /* every failure says why */
  }

  char path[sizeof g_dir + 16];
  for (int i = 0; i < n_seg; i++) {
    snprintf(path, sizeof path, "%s/p%d.yaml", g_dir, i);
    unlink(path);
  }
  free(sets_buf);
  return 0;
}
