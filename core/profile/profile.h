/*
** Profiles: one YAML file per deployment (schema v1 in conf/default.yaml).
**
** Loading reads the file into a tree of nodes that remember where they came
** from (file, line, column), layers it on the files named by `extends:`,
** applies `--set key.path=value` overrides, then validates the tree against
** the schema into a struct tsr_profile. Any unknown key, wrong type or
** out-of-range value fails with TSR_ERR_INVALID_ARG and a message of the form
**
**   conf/x.yaml:12:5: key 'sampling.top_p': 0 is out of range (0, 1]
**
** Only the first error is reported (keys are checked in document order, then
** cross-key rules such as ubatch <= batch). Anchors, aliases and tags are
** refused: a profile is meant to be read top to bottom by a person.
**
** Everything a profile hands out (strings, nodes, location strings) lives
** until tsr_profile_free.
*/
#ifndef TSR_PROFILE_H
#define TSR_PROFILE_H

#include <stdint.h>
#include <stdio.h>

#include "graph/cuda_settings.h"
#include "common/error.h"
#include <stdbool.h>

#include "tessera/tessera.h"

struct tsr_parena; /* one allocation arena per loaded profile */

/* ---- the YAML tree --------------------------------------------------------
** Plugin settings stay as a tree so the plugin host can check each setting
** against what the plugin declares and still name the file, line and column. */

enum tsr_pnode_kind { TSR_PNODE_SCALAR, TSR_PNODE_MAP, TSR_PNODE_SEQ };

struct tsr_pnode {
  enum tsr_pnode_kind kind;
  const char *file;  /* the profile file, or "--set a.b.c" for overrides */
  int line, col;     /* 1-based; 0 when the node came from --set */
  const char *where; /* "file:line:col", or just file when line is 0 */
  /* scalar */
  const char *str;   /* text as written (escapes resolved); "" for an empty value */
  int quoted;        /* written quoted or as a block: always a string, never null */
  /* map: keys[i] (scalar nodes) -> items[i]; seq: items[i] */
  size_t n;
  struct tsr_pnode **keys;
  struct tsr_pnode **items;
  size_t cap_;
};

/* A plain scalar spelling null: empty, ~, null, Null, NULL. */
int tsr_pnode_is_null(const struct tsr_pnode *node);
/* Value of KEY in MAP, or NULL (also when MAP is NULL or not a map). */
const struct tsr_pnode *tsr_pnode_get(const struct tsr_pnode *map, const char *key);

/* Typed reads with the profile's rules, for the plugin host's checks of plugin
** settings. KEY is the dotted key path named in the message. Each returns
** TSR_ERR_INVALID_ARG with "where: key 'KEY': ..." when the value does not fit.
** Integers: decimal digits with an optional sign (no 1e3, 0x10 or 12.5).
** Floats: decimal, integers accepted, no inf/nan. Bools: true/false.
** Sizes: plain bytes or a number with B, KB, MB, GB, TB (powers of 1000) or
** KiB, MiB, GiB, TiB (powers of 1024), e.g. "1.5GiB", "512MiB", "8GB".
** Quoted scalars are strings in YAML and are refused as numbers and bools. */
tsr_status tsr_pnode_int(const struct tsr_pnode *node, const char *key, int64_t lo, int64_t hi,
                         int64_t *out);
tsr_status tsr_pnode_float(const struct tsr_pnode *node, const char *key, double *out);
tsr_status tsr_pnode_bool(const struct tsr_pnode *node, const char *key, int *out);
tsr_status tsr_pnode_size(const struct tsr_pnode *node, const char *key, uint64_t *out);
/* The size grammar alone, on a string; on failure *why says what is wrong. */
int tsr_profile_parse_size(const char *text, uint64_t *out, const char **why);

/* ---- the resolved profile ---------------------------------------------- */

enum tsr_profile_layer_kind {
  TSR_PROFILE_LAYER_FULL,
  TSR_PROFILE_LAYER_SLIDING,
  TSR_PROFILE_LAYER_LINEAR,
  TSR_PROFILE_LAYER_KINDS
};

struct tsr_profile_kv_pair {
  const char *k, *v; /* codec names; NULL in per_kind means "use kv.k / kv.v" */
};

/* kv.boundary: the first and last `layers` layers that keep K/V (in model order; layers
** with recurrent state or another layer's K/V do not count) store them in k / v instead
** of their kind's codecs; a NULL side keeps the kind's. */
struct tsr_profile_kv_boundary {
  int32_t layers;
  const char *k, *v;
};

struct tsr_profile_plugin {
  const char *name;
  const char *path;                 /* as written, or NULL */
  const char *resolved_path;        /* path made relative to the file that names it */
  const struct tsr_pnode *settings; /* a map, or NULL when none were given */
  const struct tsr_pnode *node;     /* the list item, for messages */
};

struct tsr_profile_sampling {
  double temperature, top_p, min_p;
  int32_t top_k, max_tokens;
  int64_t seed; /* -1: a random seed per run */
};

struct tsr_profile_server {
  const char *host;
  int32_t port, parallel;
  const char *api_key_env;  /* name of the environment variable, or NULL */
  int32_t header_timeout;   /* seconds for a request's headers, and for an idle kept-alive wait */
  int32_t body_timeout;     /* seconds for a request's body once its headers are in */
  int32_t client_connections; /* connections one client address may hold; 0: half the limit */
  const char *cors_origins; /* comma-separated origins (or "*") allowed cross-origin; NULL: none */
};

struct tsr_profile {
  const char *path; /* the top profile file as given */
  const char *dir;  /* its directory: base of relative paths given on the command line */

  const char *model;          /* as written; "default" means the model the build ships */
  const char *model_path;     /* relative paths resolved against the file that wrote
                                 them (the cwd for --set); NULL for "default" */
  const char *backend;        /* "cpu" or "cuda" (`backend: NAME` or `backend: {name: NAME}`) */
  /* backend cuda: its settings (the map's other keys), each TESSERA_CUDA_* variable that is
  ** set already applied over them; cuda_env[i] names the variable that set setting i */
  struct tsr_cuda_settings cuda;
  const char *cuda_env[TSR_CUDA_N_SETTINGS];
  bool cuda_forced[TSR_CUDA_N_SETTINGS]; /* set by backend.precision f32 (the exact mode) */
  /* backend cpu: products with q4_0..q8_0 and q4_K..q6_K weights on the activations coded to
  ** 8 bits, in integers (`activations: q8`, the default), or in f32 (`activations: f32`) */
  int32_t cpu_activations_f32;
  int32_t threads;            /* 0: all cores */
  int64_t context;
  int32_t batch, ubatch;
  uint64_t memory_limit;      /* bytes; 0: no limit */
  const char *attention;      /* the full layers' (and, written as one name, every kind's) */
  const char *attention_kind[TSR_PROFILE_LAYER_KINDS]; /* per kind; NULL: `attention` */

  struct tsr_profile_kv_pair kv;
  struct tsr_profile_kv_pair kv_per_kind[TSR_PROFILE_LAYER_KINDS];
  struct tsr_profile_kv_boundary kv_boundary;
  const char *kv_lift; /* "true": attention may read a codec lifted to f16; "false": refused */

  struct tsr_profile_plugin *plugins;
  size_t n_plugins;
  const char **decode_policies;
  size_t n_decode_policies;

  int has_speculator;
  struct tsr_profile_plugin speculator; /* name and settings; no path */

  struct tsr_profile_sampling sampling;
  struct tsr_profile_server server;

  const struct tsr_pnode *root; /* the merged tree after --set */
  struct tsr_parena *arena_;    /* owns everything above */
};

/* Loads PATH, its extends chain and the N_SETS overrides ("a.b.c=value"). */
tsr_status tsr_profile_load(const char *path, const char *const *sets, int n_sets,
                            struct tsr_profile **out);
/* Same, from memory: NAME is used in messages and as the base of `extends:`. */
tsr_status tsr_profile_load_mem(const char *name, const char *data, size_t len,
                                const char *const *sets, int n_sets, struct tsr_profile **out);
void tsr_profile_free(struct tsr_profile *p);

/* Prints the resolved profile (after merge, overrides and defaults) as YAML
** that loads back to the same values; each line says where its value came from. */
void tsr_profile_print(const struct tsr_profile *p, FILE *f);

/* "file:line:col" of the value at a dotted KEY_PATH ("kv.per_kind.full.k"),
** or "PROFILE (default)" when the profile does not set it. */
const char *tsr_profile_where(const struct tsr_profile *p, const char *key_path);
/* The same, or NULL when the profile does not set it. */
const char *tsr_profile_where_set(const struct tsr_profile *p, const char *key_path);
/* The resolved value of a scalar key ("context", "sampling.top_p", "server.port") as
** text in buf ("" for an optional string that is unset); false for a key that is not
** one scalar of the schema (unknown, a section, or a list such as plugins). */
bool tsr_profile_value(const struct tsr_profile *p, const char *key_path, char *buf, size_t cap);

/* Effective codecs for a layer kind: per_kind when set, else kv.k / kv.v. */
const char *tsr_profile_k_codec(const struct tsr_profile *p, enum tsr_profile_layer_kind kind);
const char *tsr_profile_v_codec(const struct tsr_profile *p, enum tsr_profile_layer_kind kind);
const char *tsr_profile_layer_kind_name(enum tsr_profile_layer_kind kind);
/* "k=q8_0 v=q4_0": the full layers' codecs, and kv.boundary's where set
** ("k=turbo3 v=turbo3, boundary 2 k=q8_0"), into buf (n > 0; always terminated). */
const char *tsr_profile_kv_label(const struct tsr_profile *p, char *buf, size_t n);
/* The attention implementation of a layer kind: `attention: NAME` names one
** for every kind; `attention: {full: NAME, sliding: NAME}` one per kind, a
** kind left out keeping flash (iSWA models: another implementation on the full
** layers, flash on the sliding window ones). */
const char *tsr_profile_attention(const struct tsr_profile *p, enum tsr_profile_layer_kind kind);

/* Plugin settings, one entry per key of a settings map, in document order. */
struct tsr_profile_setting {
  const char *key;
  const char *value;             /* scalar text, or NULL when the value is a map or list */
  int quoted;
  const struct tsr_pnode *node;  /* the value */
  const char *where;             /* location of the key */
};
size_t tsr_profile_settings_count(const struct tsr_pnode *settings);
int tsr_profile_settings_get(const struct tsr_pnode *settings, size_t i,
                             struct tsr_profile_setting *out);

/* ---- internals shared by profile_yaml.c and profile.c ------------------- */

struct tsr_parena *tsr_parena_new(void);
void tsr_parena_free(struct tsr_parena *a);
void *tsr_parena_alloc(struct tsr_parena *a, size_t n); /* zeroed; NULL on failure */
char *tsr_parena_strdup(struct tsr_parena *a, const char *s);
char *tsr_parena_printf(struct tsr_parena *a, const char *fmt, ...) TSR_PRINTF(2, 3);

struct tsr_pnode *tsr_pnode_new(struct tsr_parena *a, enum tsr_pnode_kind kind, const char *file,
                                int line, int col);
/* Appends to a seq (key NULL) or a map; returns 0 on allocation failure. */
int tsr_pnode_append(struct tsr_parena *a, struct tsr_pnode *node, struct tsr_pnode *key,
                     struct tsr_pnode *value);

/* Parses one YAML document (DATA, LEN bytes) into *root; FILE names it in
** messages and in the nodes. An empty document gives a null scalar. */
tsr_status tsr_profile_parse_yaml(struct tsr_parena *a, const char *file, const char *data,
                                  size_t len, struct tsr_pnode **root);

/* The merged tree of a profile: PATH and its extends chain, then the --set
** overrides. DATA, when not NULL, is PATH's content (PATH then only names it). */
tsr_status tsr_profile_build_tree(struct tsr_parena *a, const char *path, const char *data,
                                  size_t len, const char *const *sets, int n_sets,
                                  struct tsr_pnode **root);
/* Bytes of the UTF-8 character at S (1..4), or 0 when S does not start a valid
** one (overlong forms, surrogates and values past U+10FFFF included). */
size_t tsr_profile_utf8_len(const char *s);

/* Directory part of PATH ("" when it has none), and DIR joined with REL
** (REL unchanged when absolute or DIR is empty); both in the arena. */
char *tsr_profile_dirname(struct tsr_parena *a, const char *path);
char *tsr_profile_join(struct tsr_parena *a, const char *dir, const char *rel);

#endif
