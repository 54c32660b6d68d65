/*
** Profile schema v1: the merged YAML tree (profile_yaml.c) checked key by key
** into struct tsr_profile. The schema is a table per map, so the list of known
** keys in an "unknown key" message is the table itself and cannot drift.
** conf/default.yaml documents every key; keep the two in step.
*/
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "profile/profile.h"

/* ---- typed reads ---------------------------------------------------------- */

/* The value as it appears in messages, shortened so a stray paragraph stays readable. */
static const char *shown(const struct tsr_pnode *v, char *buf, size_t n) {
  if (v->kind == TSR_PNODE_MAP) return "a map";
  if (v->kind == TSR_PNODE_SEQ) return "a list";
  if (tsr_pnode_is_null(v)) return "nothing (an empty value)";
  size_t len = strlen(v->str);
  if (len > 60)
    snprintf(buf, n, "%s'%.57s...'", v->quoted ? "the quoted string " : "", v->str);
  else
    snprintf(buf, n, "%s'%s'", v->quoted ? "the quoted string " : "", v->str);
  return buf;
}

static tsr_status type_error(const struct tsr_pnode *v, const char *key, const char *expected,
                             const char *hint) {
  char buf[96];
  return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: key '%s': expected %s, got %s%s", v->where, key,
                       expected, shown(v, buf, sizeof buf), hint ? hint : "");
}

/* Quoted scalars are strings in YAML; a number or bool must be written bare. */
static const char *scalar_or_fail(const struct tsr_pnode *v) {
  if (v->kind != TSR_PNODE_SCALAR || v->quoted || tsr_pnode_is_null(v)) return NULL;
  return v->str;
}

static const char *quote_hint(const struct tsr_pnode *v) {
  return v->kind == TSR_PNODE_SCALAR && v->quoted ? " (remove the quotes)" : NULL;
}

tsr_status tsr_pnode_int(const struct tsr_pnode *v, const char *key, int64_t lo, int64_t hi,
                         int64_t *out) {
  const char *s = scalar_or_fail(v);
  if (!s) return type_error(v, key, "an integer", quote_hint(v));
  const char *p = s + (*s == '-' || *s == '+');
  int neg = *s == '-';
  if (!*p) return type_error(v, key, "an integer", NULL);
  uint64_t mag = 0;
  for (; *p; p++) {
    if (*p < '0' || *p > '9') {
      int exp = strpbrk(s, "eE") && !strpbrk(s, "xX");
      return type_error(v, key, "an integer",
                        exp ? " (write integers out in full: exponents are not accepted)" : NULL);
    }
    if (mag > (UINT64_MAX - 9) / 10) mag = UINT64_MAX; /* saturate: out of any range below */
    else mag = mag * 10 + (uint64_t)(*p - '0');
  }
  if (mag > (uint64_t)INT64_MAX + neg)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: key '%s': %s does not fit in 64 bits",
                         v->where, key, s);
  int64_t x = neg ? (int64_t)(0 - mag) : (int64_t)mag;
  if (x < lo || x > hi) {
    if (hi == INT64_MAX || hi == INT32_MAX)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: key '%s': %lld is out of range (at least %lld)",
                           v->where, key, (long long)x, (long long)lo);
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: key '%s': %lld is out of range %lld..%lld",
                         v->where, key, (long long)x, (long long)lo, (long long)hi);
  }
  *out = x;
  return TSR_OK;
}

/* digits with an optional point and exponent; no inf, nan, hex */
static int float_syntax(const char *s) {
  s += *s == '-' || *s == '+';
  int digits = 0;
  while (*s >= '0' && *s <= '9') s++, digits++;
  if (*s == '.') {
    s++;
    while (*s >= '0' && *s <= '9') s++, digits++;
  }
  if (!digits) return 0;
  if (*s == 'e' || *s == 'E') {
    s++;
    s += *s == '-' || *s == '+';
    if (*s < '0' || *s > '9') return 0;
    while (*s >= '0' && *s <= '9') s++;
  }
  return !*s;
}

tsr_status tsr_pnode_float(const struct tsr_pnode *v, const char *key, double *out) {
  const char *s = scalar_or_fail(v);
  if (!s || !float_syntax(s)) return type_error(v, key, "a number", quote_hint(v));
  double x = strtod(s, NULL);
  if (!isfinite(x))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: key '%s': %s is too large", v->where, key, s);
  *out = x;
  return TSR_OK;
}

tsr_status tsr_pnode_bool(const struct tsr_pnode *v, const char *key, int *out) {
  const char *s = scalar_or_fail(v);
  static const char *const t[] = {"true", "True", "TRUE"}, *const f[] = {"false", "False", "FALSE"};
  for (int i = 0; s && i < 3; i++) {
    if (!strcmp(s, t[i])) return *out = 1, TSR_OK;
    if (!strcmp(s, f[i])) return *out = 0, TSR_OK;
  }
  return type_error(v, key, "true or false", quote_hint(v));
}

int tsr_profile_parse_size(const char *s, uint64_t *out, const char **why) {
  static const struct { const char *name; uint64_t mul; } units[] = {
      {"B", 1}, {"KB", 1000}, {"MB", 1000000}, {"GB", 1000000000}, {"TB", 1000000000000},
      {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30}, {"TiB", 1ull << 40}};
  if (*s == '-') return *why = "a size cannot be negative", 0;
  unsigned __int128 whole = 0, frac = 0, scale = 1;
  int digits = 0;
  for (; *s >= '0' && *s <= '9'; s++, digits++)
    if ((whole = whole * 10 + (unsigned)(*s - '0')) > UINT64_MAX) return *why = "too large", 0;
  if (*s == '.') {
    for (s++; *s >= '0' && *s <= '9'; s++, digits++) {
      if (scale > 1000000000000000000ull) return *why = "too many decimals", 0;
      frac = frac * 10 + (unsigned)(*s - '0');
      scale *= 10;
    }
  }
  if (!digits) return *why = "expected a number of bytes, optionally with a unit (512MiB, 8GiB, 1.5GB)", 0;
  if (*s == ' ') s++;
  uint64_t mul = 0;
  if (!*s) mul = 1;
  for (size_t i = 0; i < sizeof units / sizeof units[0] && !mul; i++)
    if (!strcasecmp(s, units[i].name)) mul = units[i].mul;
  if (!mul) return *why = "unknown unit (known: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)", 0;
  unsigned __int128 bytes = whole * mul + frac * mul / scale;
  if ((frac * mul) % scale) return *why = "not a whole number of bytes", 0;
  if (bytes > UINT64_MAX) return *why = "too large", 0;
  *out = (uint64_t)bytes;
  return 1;
}

tsr_status tsr_pnode_size(const struct tsr_pnode *v, const char *key, uint64_t *out) {
  const char *why;
  char buf[96];
  if (v->kind != TSR_PNODE_SCALAR || tsr_pnode_is_null(v))
    return type_error(v, key, "a size such as 512MiB or 8GiB", NULL);
  if (!tsr_profile_parse_size(v->str, out, &why))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: key '%s': %s is not a size: %s", v->where, key,
                         shown(v, buf, sizeof buf), why);
  return TSR_OK;
}

static tsr_status read_string(const struct tsr_pnode *v, const char *key, const char **out) {
  if (v->kind != TSR_PNODE_SCALAR || tsr_pnode_is_null(v)) return type_error(v, key, "a string", NULL);
  if (!v->str[0])
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: key '%s': must not be empty", v->where, key);
  *out = v->str;
  return TSR_OK;
}

/* ---- schema tables -------------------------------------------------------- */

enum ftype { F_INT, F_FLOAT, F_STR, F_OPT_STR, F_SIZE, F_CHOICE, F_MAP, F_FN };

struct vctx {
  struct tsr_profile *p;
  struct tsr_parena *a;
};

struct section;
typedef tsr_status (*field_fn)(struct vctx *c, const char *key, const struct tsr_pnode *v);

struct field {
  const char *name;
  enum ftype type;
  size_t off;  /* into the struct the section fills */
  int width;   /* F_INT: 4 or 8 bytes */
  int64_t ilo, ihi;
  double flo, fhi;
  int lo_open, hi_open; /* F_FLOAT: bound excluded */
  const char *const *choices;
  const struct section *sub;
  field_fn fn;
};

struct section {
  const struct field *fields;
  size_t n;
};

#define N_OF(x) (sizeof(x) / sizeof((x)[0]))
#define SECTION(tab) {tab, N_OF(tab)}
#define INT(nm, st, m, lo, hi) {.name = nm, .type = F_INT, .off = offsetof(st, m), \
                                .width = sizeof(((st *)0)->m), .ilo = lo, .ihi = hi}
#define FLT(nm, st, m, lo, hi, lopen, hopen) {.name = nm, .type = F_FLOAT, .off = offsetof(st, m), \
                                .flo = lo, .fhi = hi, .lo_open = lopen, .hi_open = hopen}
#define STR(nm, st, m) {.name = nm, .type = F_STR, .off = offsetof(st, m)}
#define OPT_STR(nm, st, m) {.name = nm, .type = F_OPT_STR, .off = offsetof(st, m)}
#define MAP(nm, off_, sec) {.name = nm, .type = F_MAP, .off = off_, .sub = &sec}
#define FN(nm, f) {.name = nm, .type = F_FN, .fn = f}

typedef struct tsr_profile P;
typedef struct tsr_profile_kv_pair KVP;

static const struct field kv_pair_fields[] = {STR("k", KVP, k), STR("v", KVP, v)};
static const struct section kv_pair = SECTION(kv_pair_fields);

static const struct field per_kind_fields[] = {
    MAP("full", offsetof(P, kv_per_kind[TSR_PROFILE_LAYER_FULL]), kv_pair),
    MAP("sliding", offsetof(P, kv_per_kind[TSR_PROFILE_LAYER_SLIDING]), kv_pair),
    MAP("linear", offsetof(P, kv_per_kind[TSR_PROFILE_LAYER_LINEAR]), kv_pair)};
static const struct section per_kind = SECTION(per_kind_fields);

typedef struct tsr_profile_kv_boundary KVB;
static const struct field kv_boundary_fields[] = {INT("layers", KVB, layers, 0, 4096),
                                                  STR("k", KVB, k), STR("v", KVB, v)};
static const struct section kv_boundary = SECTION(kv_boundary_fields);

static const char *const booleans[] = {"true", "false", NULL};
static const struct field kv_fields[] = {
    STR("k", P, kv.k), STR("v", P, kv.v), MAP("per_kind", 0, per_kind),
    MAP("boundary", offsetof(P, kv_boundary), kv_boundary),
    {.name = "lift", .type = F_CHOICE, .off = offsetof(P, kv_lift), .choices = booleans}};
static const struct section kv = SECTION(kv_fields);

typedef struct tsr_profile_sampling S;
static const struct field sampling_fields[] = {
    FLT("temperature", S, temperature, 0, INFINITY, 0, 1),
    INT("top_k", S, top_k, 0, INT32_MAX),
    FLT("top_p", S, top_p, 0, 1, 1, 0),
    FLT("min_p", S, min_p, 0, 1, 0, 1),
    INT("seed", S, seed, -1, INT64_MAX),
    INT("max_tokens", S, max_tokens, 1, INT32_MAX)};
static const struct section sampling = SECTION(sampling_fields);

typedef struct tsr_profile_server SV;
static const struct field server_fields[] = {
    STR("host", SV, host), INT("port", SV, port, 1, 65535),
    INT("parallel", SV, parallel, 1, 64), OPT_STR("api_key_env", SV, api_key_env),
    INT("header_timeout", SV, header_timeout, 1, 3600),
    INT("body_timeout", SV, body_timeout, 1, 3600),
    INT("client_connections", SV, client_connections, 0, 65536),
    OPT_STR("cors_origins", SV, cors_origins)};
static const struct section server = SECTION(server_fields);

static const char *const backends[] = {"cpu", "cuda", NULL};

static tsr_status f_extends(struct vctx *c, const char *key, const struct tsr_pnode *v);
static tsr_status f_model(struct vctx *c, const char *key, const struct tsr_pnode *v);
static tsr_status f_plugins(struct vctx *c, const char *key, const struct tsr_pnode *v);
static tsr_status f_policies(struct vctx *c, const char *key, const struct tsr_pnode *v);
static tsr_status f_speculator(struct vctx *c, const char *key, const struct tsr_pnode *v);
static tsr_status f_attention(struct vctx *c, const char *key, const struct tsr_pnode *v);
static tsr_status f_backend(struct vctx *c, const char *key, const struct tsr_pnode *v);

static const struct field backend_name = {.name = "backend", .type = F_CHOICE,
                                          .off = offsetof(P, backend), .choices = backends};

static const struct field top_fields[] = {
    FN("extends", f_extends),
    FN("model", f_model),
    FN("backend", f_backend),
    INT("threads", P, threads, 0, INT32_MAX),
    INT("context", P, context, 1, 16777216),
    INT("batch", P, batch, 1, INT32_MAX),
    INT("ubatch", P, ubatch, 1, INT32_MAX),
    {.name = "memory_limit", .type = F_SIZE, .off = offsetof(P, memory_limit)},
    FN("attention", f_attention),
    MAP("kv", 0, kv),
    FN("plugins", f_plugins),
    FN("decode_policies", f_policies),
    FN("speculator", f_speculator),
    MAP("sampling", offsetof(P, sampling), sampling),
    MAP("server", offsetof(P, server), server)};
static const struct section top = SECTION(top_fields);

/* ---- checking ------------------------------------------------------------- */

static size_t edit_distance(const char *a, const char *b) {
  size_t n = strlen(b), row[64];
  if (n >= 64 || strlen(a) >= 64) return 99;
  for (size_t j = 0; j <= n; j++) row[j] = j;
  for (size_t i = 1; a[i - 1]; i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= n; j++) {
      size_t up = row[j];
      size_t best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[n];
}

static tsr_status unknown_key(const struct tsr_pnode *k, const char *key, const char *const *names,
                              size_t n) {
  char known[512] = "", hint[96] = "";
  size_t used = 0, best = 3;
  for (size_t i = 0; i < n; i++) {
    int w = snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "", names[i]);
    if (w > 0 && (size_t)w < sizeof known - used) used += (size_t)w;
    size_t d = edit_distance(k->str, names[i]);
    if (d < best) {
      best = d;
      snprintf(hint, sizeof hint, "; did you mean '%s'?", names[i]);
    }
  }
  return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: unknown key '%s'%s (known here: %s)", k->where,
                       key, hint, known);
}

static tsr_status check_map_keys(const struct tsr_pnode *m, const char *prefix,
                                 const char *const *names, size_t n) {
  for (size_t i = 0; i < m->n; i++) {
    size_t j = 0;
    while (j < n && strcmp(m->keys[i]->str, names[j])) j++;
    if (j == n) {
      char key[256];
      snprintf(key, sizeof key, "%s%s%s", prefix, *prefix ? "." : "", m->keys[i]->str);
      return unknown_key(m->keys[i], key, names, n);
    }
  }
  return TSR_OK;
}

static tsr_status check_section(struct vctx *c, const char *prefix, const struct tsr_pnode *m,
                                const struct section *sec, char *base);

static tsr_status check_field(struct vctx *c, const char *key, const struct field *f,
                              const struct tsr_pnode *v, char *base) {
  void *dst = base + f->off;
  tsr_status st;
  switch (f->type) {
  case F_INT: {
    int64_t x;
    if ((st = tsr_pnode_int(v, key, f->ilo, f->ihi, &x))) return st;
    if (f->width == 4) *(int32_t *)dst = (int32_t)x;
    else *(int64_t *)dst = x;
    return TSR_OK;
  }
  case F_FLOAT: {
    double x;
    if ((st = tsr_pnode_float(v, key, &x))) return st;
    if (x < f->flo || x > f->fhi || (f->lo_open && x == f->flo) || (f->hi_open && x == f->fhi)) {
      char range[64];
      if (isinf(f->fhi)) snprintf(range, sizeof range, "at least %g", f->flo);
      else snprintf(range, sizeof range, "%c%g, %g%c", f->lo_open ? '(' : '[', f->flo, f->fhi,
                    f->hi_open ? ')' : ']');
      return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: key '%s': %s is out of range %s", v->where,
                           key, v->str, range);
    }
    *(double *)dst = x;
    return TSR_OK;
  }
  case F_OPT_STR:
    if (tsr_pnode_is_null(v)) return *(const char **)dst = NULL, TSR_OK;
    return read_string(v, key, dst);
  case F_STR: return read_string(v, key, dst);
  case F_SIZE:
    if (tsr_pnode_is_null(v)) return *(uint64_t *)dst = 0, TSR_OK;
    return tsr_pnode_size(v, key, dst);
  case F_CHOICE: {
    const char *s;
    if ((st = read_string(v, key, &s))) return st;
    char known[128] = "";
    for (size_t i = 0; f->choices[i]; i++) {
      if (!strcmp(s, f->choices[i])) return *(const char **)dst = f->choices[i], TSR_OK;
      snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "",
               f->choices[i]);
    }
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: key '%s': unknown %s '%s' (known: %s)",
                         v->where, key, f->name, s, known);
  }
  case F_MAP: return check_section(c, key, v, f->sub, dst);
  case F_FN: return f->fn(c, key, v);
  }
  return TSR_OK;
}

/* A null section (every line under it commented out) leaves the defaults. */
static tsr_status check_section(struct vctx *c, const char *prefix, const struct tsr_pnode *m,
                                const struct section *sec, char *base) {
  if (tsr_pnode_is_null(m)) return TSR_OK;
  if (m->kind != TSR_PNODE_MAP) return type_error(m, prefix, "a map of keys", NULL);
  const char *names[32];
  for (size_t j = 0; j < sec->n; j++) names[j] = sec->fields[j].name;
  tsr_status st = check_map_keys(m, prefix, names, sec->n);
  for (size_t i = 0; i < m->n && !st; i++) {
    const struct field *f = sec->fields;
    while (strcmp(f->name, m->keys[i]->str)) f++;
    char key[256];
    snprintf(key, sizeof key, "%s%s%s", prefix, *prefix ? "." : "", f->name);
    st = check_field(c, key, f, m->items[i], base);
  }
  return st;
}

static tsr_status f_extends(struct vctx *c, const char *key, const struct tsr_pnode *v) {
  return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: key 'extends' is only read from profile files",
                       v->where);
}

/* A relative path is read against the directory of the file that wrote it, so
** a base profile can name files beside itself; --set values against the cwd. */
static const char *resolve(struct vctx *c, const struct tsr_pnode *v) {
  if (v->line == 0 || v->str[0] == '/') return v->str;
  return tsr_profile_join(c->a, tsr_profile_dirname(c->a, v->file), v->str);
}

static tsr_status f_model(struct vctx *c, const char *key, const struct tsr_pnode *v) {
  tsr_status st = read_string(v, key, &c->p->model);
  if (st || !strcmp(v->str, "default")) return st;
  if (!(c->p->model_path = resolve(c, v))) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  return TSR_OK;
}

/* A plugin or speculator entry: a name, or {name, path, settings}. */
static tsr_status read_plugin(struct vctx *c, const char *key, const struct tsr_pnode *v,
                              int allow_path, struct tsr_profile_plugin *out) {
  static const char *const names[] = {"name", "settings", "path"};
  memset(out, 0, sizeof *out);
  out->node = v;
  if (v->kind == TSR_PNODE_SCALAR) return read_string(v, key, &out->name);
  if (v->kind != TSR_PNODE_MAP)
    return type_error(v, key, "a plugin name or a map with name and settings", NULL);
  tsr_status st = check_map_keys(v, key, names, allow_path ? 3 : 2);
  if (st) return st;
  char sub[256];
  const struct tsr_pnode *name = tsr_pnode_get(v, "name"), *path = tsr_pnode_get(v, "path");
  const struct tsr_pnode *settings = tsr_pnode_get(v, "settings");
  if (!name)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: key '%s': 'name' is required", v->where, key);
  snprintf(sub, sizeof sub, "%s.name", key);
  if ((st = read_string(name, sub, &out->name))) return st;
  if (path) {
    snprintf(sub, sizeof sub, "%s.path", key);
    if ((st = read_string(path, sub, &out->path))) return st;
    if (!(out->resolved_path = resolve(c, path))) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  }
  if (settings && !tsr_pnode_is_null(settings)) {
    snprintf(sub, sizeof sub, "%s.settings", key);
    if (settings->kind != TSR_PNODE_MAP) return type_error(settings, sub, "a map of settings", NULL);
    out->settings = settings;
  }
  return TSR_OK;
}

static tsr_status list_or_null(const struct tsr_pnode *v, const char *key, const char *what) {
  if (tsr_pnode_is_null(v) || v->kind == TSR_PNODE_SEQ) return TSR_OK;
  return type_error(v, key, what, NULL);
}

static tsr_status f_plugins(struct vctx *c, const char *key, const struct tsr_pnode *v) {
  tsr_status st = list_or_null(v, key, "a list of plugins");
  if (st || v->kind != TSR_PNODE_SEQ) return st;
  struct tsr_profile_plugin *pl = tsr_parena_alloc(c->a, (v->n + 1) * sizeof *pl);
  if (!pl) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < v->n; i++) {
    char sub[64];
    snprintf(sub, sizeof sub, "%s[%zu]", key, i);
    if ((st = read_plugin(c, sub, v->items[i], 1, &pl[i]))) return st;
    for (size_t j = 0; j < i; j++)
      if (!strcmp(pl[j].name, pl[i].name))
        return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: plugin '%s' is listed twice (first at %s)",
                             pl[i].node->where, pl[i].name, pl[j].node->where);
  }
  c->p->plugins = pl;
  c->p->n_plugins = v->n;
  return TSR_OK;
}

static tsr_status f_policies(struct vctx *c, const char *key, const struct tsr_pnode *v) {
  tsr_status st = list_or_null(v, key, "a list of decode policy names");
  if (st || v->kind != TSR_PNODE_SEQ) return st;
  const char **names = tsr_parena_alloc(c->a, (v->n + 1) * sizeof *names);
  if (!names) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < v->n; i++) {
    char sub[64];
    snprintf(sub, sizeof sub, "%s[%zu]", key, i);
    if ((st = read_string(v->items[i], sub, &names[i]))) return st;
    for (size_t j = 0; j < i; j++)
      if (!strcmp(names[j], names[i]))
        return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: decode policy '%s' is listed twice (first at %s)",
                             v->items[i]->where, names[i], v->items[j]->where);
  }
  c->p->decode_policies = names;
  c->p->n_decode_policies = v->n;
  return TSR_OK;
}

/* One name for every layer kind, or a name per kind: {full: .., sliding: ..};
** a kind the map leaves out keeps the default, flash. Linear layers have no
** attention to choose. */
static tsr_status f_attention(struct vctx *c, const char *key, const struct tsr_pnode *v) {
  static const char *const kinds[] = {"full", "sliding"};
  struct tsr_profile *p = c->p;
  for (int k = 0; k < TSR_PROFILE_LAYER_KINDS; k++) p->attention_kind[k] = NULL;
  if (v->kind == TSR_PNODE_SCALAR) return read_string(v, key, &p->attention);
  if (v->kind != TSR_PNODE_MAP)
    return type_error(v, key, "an attention name, or a map of names per layer kind "
                      "{full: NAME, sliding: NAME}", NULL);
  const struct tsr_pnode *lin = tsr_pnode_get(v, "linear");
  if (lin)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: key '%s.linear': linear (recurrent) layers "
                         "have no attention implementation to choose (kinds here: full, "
                         "sliding)", lin->where, key);
  tsr_status st = check_map_keys(v, key, kinds, 2);
  for (int k = 0; k < 2 && !st; k++) {
    const struct tsr_pnode *name = tsr_pnode_get(v, kinds[k]);
    char sub[64];
    snprintf(sub, sizeof sub, "%s.%s", key, kinds[k]);
    p->attention_kind[k] = "flash";
    if (name) st = read_string(name, sub, &p->attention_kind[k]);
  }
  p->attention = p->attention_kind[TSR_PROFILE_LAYER_FULL];
  return st;
}

/* `backend: NAME`, or a map: {name: NAME} and, for cuda, its settings
** (core/graph/cuda_settings.h); for cpu, `activations` alone. A setting under the other
** backend cannot take effect: refused, naming it. */
static tsr_status f_backend(struct vctx *c, const char *key, const struct tsr_pnode *v) {
  struct tsr_profile *p = c->p;
  tsr_cuda_settings_default(&p->cuda);
  p->cpu_activations_f32 = 0;
  if (v->kind == TSR_PNODE_SCALAR) return check_field(c, key, &backend_name, v, (char *)p);
  if (v->kind != TSR_PNODE_MAP)
    return type_error(v, key, "a backend name (cpu, cuda), or a map {name: cuda, gemm: f16, ...}",
                      NULL);
  const struct tsr_pnode *name = tsr_pnode_get(v, "name");
  if (!name)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: key '%s' needs its name (cpu or cuda)",
                         v->where, key);
  char sub[96];
  snprintf(sub, sizeof sub, "%s.name", key);
  tsr_status st = check_field(c, sub, &backend_name, name, (char *)p);
  /* the map's keys: name, the settings' top keys, and `attention` holding the rest */
  const char *names[TSR_CUDA_N_SETTINGS + 3] = {"name", "attention", "activations"};
  const char *attn_names[TSR_CUDA_N_SETTINGS];
  size_t n = 3, n_attn = 0;
  for (int i = 0; i < TSR_CUDA_N_SETTINGS; i++) {
    const char *k = tsr_cuda_setting_key(i)->key;
    if (!strncmp(k, "attention.", 10)) attn_names[n_attn++] = k + 10;
    else names[n++] = k;
  }
  if (!st) st = check_map_keys(v, key, names, n);
  const struct tsr_pnode *attn = tsr_pnode_get(v, "attention");
  if (!st && attn) {
    snprintf(sub, sizeof sub, "%s.attention", key);
    st = attn->kind == TSR_PNODE_MAP ? check_map_keys(attn, sub, attn_names, n_attn)
                                     : type_error(attn, sub, "a map of attention kernel choices",
                                                  NULL);
  }
  for (int i = 0; i < TSR_CUDA_N_SETTINGS && !st; i++) {
    const char *k = tsr_cuda_setting_key(i)->key;
    const struct tsr_pnode *x = !strncmp(k, "attention.", 10)
                                    ? (attn ? tsr_pnode_get(attn, k + 10) : NULL)
                                    : tsr_pnode_get(v, k);
    if (!x) continue;
    if (strcmp(p->backend, "cuda"))
      return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: key '%s.%s' is a cuda setting, and the "
                           "backend is %s: it would take no effect", x->where, key, k,
                           p->backend);
    if (x->kind != TSR_PNODE_SCALAR)
      return type_error(x, k, tsr_cuda_setting_key(i)->values, NULL);
    st = tsr_cuda_setting_parse(&p->cuda, i, x->str, false, x->where);
  }
  const struct tsr_pnode *act = st ? NULL : tsr_pnode_get(v, "activations");
  if (act) {
    snprintf(sub, sizeof sub, "%s.activations", key);
    if (strcmp(p->backend, "cpu"))
      return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: key '%s' is a cpu setting, and the "
                           "backend is %s: it would take no effect", act->where, sub, p->backend);
    const bool q8 = act->kind == TSR_PNODE_SCALAR && !strcmp(act->str, "q8");
    if (!q8 && !(act->kind == TSR_PNODE_SCALAR && !strcmp(act->str, "f32")))
      return type_error(act, sub, "q8 or f32", NULL);
    p->cpu_activations_f32 = !q8;
  }
  return st;
}

static tsr_status f_speculator(struct vctx *c, const char *key, const struct tsr_pnode *v) {
  c->p->has_speculator = 0;
  if (tsr_pnode_is_null(v)) return TSR_OK;
  tsr_status st = read_plugin(c, key, v, 0, &c->p->speculator);
  c->p->has_speculator = !st;
  return st;
}

static void set_defaults(struct tsr_profile *p) {
  p->backend = "cpu";
  tsr_cuda_settings_default(&p->cuda);
  p->cpu_activations_f32 = 0;
  p->context = 4096;
  p->batch = 2048;
  p->ubatch = 512;
  p->attention = "flash";
  p->kv.k = p->kv.v = "f16";
  p->kv_lift = "true";
  p->sampling = (struct tsr_profile_sampling){.temperature = 0.8, .top_k = 40, .top_p = 0.95,
                                              .min_p = 0.05, .seed = -1, .max_tokens = 256};
  p->server = (struct tsr_profile_server){.host = "127.0.0.1", .port = 8080, .parallel = 1,
                                          .header_timeout = 30, .body_timeout = 60};
}

/* The cuda settings the exact mode (backend.precision f32) implies, refusing one written
** against it: where each was written is its variable's name or its profile line. */
static tsr_status resolve_cuda(struct tsr_profile *p) {
  const char *given[TSR_CUDA_N_SETTINGS];
  for (int i = 0; i < TSR_CUDA_N_SETTINGS; i++) {
    char path[64];
    snprintf(path, sizeof path, "backend.%s", tsr_cuda_setting_key(i)->key);
    given[i] = p->cuda_env[i] ? p->cuda_env[i] : tsr_profile_where_set(p, path);
  }
  return tsr_cuda_settings_resolve(&p->cuda, given, p->cuda_forced);
}

static tsr_status check_profile(struct vctx *c) {
  struct tsr_profile *p = c->p;
  tsr_status st = check_section(c, "", p->root, &top, (char *)p);
  if (st) return st;
  /* the environment's overrides of the cuda settings, which profile check shows */
  if (!strcmp(p->backend, "cuda") && (st = tsr_cuda_settings_from_env(&p->cuda, p->cuda_env)))
    return st;
  if (!strcmp(p->backend, "cuda") && (st = resolve_cuda(p))) return st;
  if (!p->model)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: key 'model' is required: a GGUF file, or "
                         "'default' for the model this build ships", p->path);
  /* a boundary that changes nothing is refused, not ignored */
  const struct tsr_profile_kv_boundary *kb = &p->kv_boundary;
  if (kb->layers && !kb->k && !kb->v)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: kv.boundary names no codec: give k, v or "
                         "both", tsr_profile_where(p, "kv.boundary.layers"));
  if (!kb->layers && (kb->k || kb->v)) {
    const char *side = kb->k ? "kv.boundary.k" : "kv.boundary.v";
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: %s would reach no layer: kv.boundary.layers "
                         "is 0", tsr_profile_where(p, side), side);
  }
  if (p->ubatch > p->batch) {
    const struct tsr_pnode *u = tsr_pnode_get(p->root, "ubatch");
    const struct tsr_pnode *b = tsr_pnode_get(p->root, "batch");
    if (u)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: key 'ubatch': %d is larger than batch (%d, %s%s)",
                           u->where, p->ubatch, p->batch, b ? "set at " : "the default",
                           b ? b->where : "");
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: key 'batch': %d is smaller than ubatch (%d, "
                         "the default); set ubatch too", tsr_profile_where(p, "batch"), p->batch,
                         p->ubatch);
  }
  return TSR_OK;
}

/* ---- public API ----------------------------------------------------------- */

static tsr_status load(const char *path, const char *data, size_t len, const char *const *sets,
                       int n_sets, struct tsr_profile **out) {
  *out = NULL;
  struct tsr_parena *a = tsr_parena_new();
  struct tsr_profile *p = a ? tsr_parena_alloc(a, sizeof *p) : NULL;
  if (!p) {
    tsr_parena_free(a);
    return tsr_error_set(TSR_ERR_NOMEM, "out of memory loading %s", path);
  }
  p->arena_ = a;
  set_defaults(p);
  p->path = tsr_parena_strdup(a, path);
  p->dir = tsr_profile_dirname(a, path);
  if (p->dir && !p->dir[0]) p->dir = ".";
  struct tsr_pnode *root = NULL;
  tsr_status st = !p->path || !p->dir ? tsr_error_set(TSR_ERR_NOMEM, "out of memory")
                                      : tsr_profile_build_tree(a, path, data, len, sets, n_sets, &root);
  if (!st) {
    p->root = root;
    struct vctx c = {p, a};
    st = check_profile(&c);
  }
  if (st) {
    tsr_parena_free(a);
    return st;
  }
  *out = p;
  return TSR_OK;
}

tsr_status tsr_profile_load(const char *path, const char *const *sets, int n_sets,
                            struct tsr_profile **out) {
  return load(path, NULL, 0, sets, n_sets, out);
}

tsr_status tsr_profile_load_mem(const char *name, const char *data, size_t len,
                                const char *const *sets, int n_sets, struct tsr_profile **out) {
  return load(name, data ? data : "", data ? len : 0, sets, n_sets, out);
}

void tsr_profile_free(struct tsr_profile *p) {
  if (p) tsr_parena_free(p->arena_);
}

const char *tsr_profile_where_set(const struct tsr_profile *p, const char *key_path) {
  const struct tsr_pnode *n = p->root;
  char seg[128];
  for (const char *s = key_path; n && *s;) {
    size_t len = strcspn(s, ".");
    if (len >= sizeof seg) return p->path;
    memcpy(seg, s, len);
    seg[len] = '\0';
    if (n->kind == TSR_PNODE_SEQ) {
      char *end;
      unsigned long i = strtoul(seg, &end, 10);
      n = !*end && len && i < n->n ? n->items[i] : NULL;
    } else {
      n = tsr_pnode_get(n, seg);
    }
    s += len + (s[len] == '.');
  }
  return n ? n->where : NULL;
}

const char *tsr_profile_where(const struct tsr_profile *p, const char *key_path) {
  const char *w = tsr_profile_where_set(p, key_path);
  if (w) return w;
  const char *d = tsr_parena_printf(p->arena_, "%s (default)", p->path);
  return d ? d : p->path;
}

bool tsr_profile_value(const struct tsr_profile *p, const char *key_path, char *buf, size_t cap) {
  const struct section *sec = &top;
  const char *base = (const char *)p;
  for (const char *s = key_path; s && *s;) {
    const size_t len = strcspn(s, ".");
    const struct field *f = NULL;
    for (size_t i = 0; i < sec->n && !f; i++)
      if (strlen(sec->fields[i].name) == len && !strncmp(sec->fields[i].name, s, len))
        f = &sec->fields[i];
    if (!f || f->type == F_FN) return false;
    const char *at = base + f->off;
    s += len;
    if (f->type == F_MAP) {
      if (*s++ != '.') return false; /* a section is not one value */
      sec = f->sub, base = at;
      continue;
    }
    if (*s) return false;
    switch (f->type) {
    case F_INT:
      snprintf(buf, cap, "%lld", f->width == 8 ? (long long)*(const int64_t *)at
                                               : (long long)*(const int32_t *)at);
      return true;
    case F_FLOAT: snprintf(buf, cap, "%.17g", *(const double *)at); return true;
    case F_SIZE: snprintf(buf, cap, "%llu", (unsigned long long)*(const uint64_t *)at); return true;
    default: /* strings and choices; an unset optional string is "" */
      snprintf(buf, cap, "%s", *(const char *const *)at ? *(const char *const *)at : "");
      return true;
    }
  }
  return false;
}

const char *tsr_profile_k_codec(const struct tsr_profile *p, enum tsr_profile_layer_kind kind) {
  return kind < TSR_PROFILE_LAYER_KINDS && p->kv_per_kind[kind].k ? p->kv_per_kind[kind].k : p->kv.k;
}

const char *tsr_profile_v_codec(const struct tsr_profile *p, enum tsr_profile_layer_kind kind) {
  return kind < TSR_PROFILE_LAYER_KINDS && p->kv_per_kind[kind].v ? p->kv_per_kind[kind].v : p->kv.v;
}

const char *tsr_profile_attention(const struct tsr_profile *p, enum tsr_profile_layer_kind kind) {
  return kind < TSR_PROFILE_LAYER_KINDS && p->attention_kind[kind] ? p->attention_kind[kind]
                                                                   : p->attention;
}

const char *tsr_profile_kv_label(const struct tsr_profile *p, char *buf, size_t n) {
  const char *k = tsr_profile_k_codec(p, TSR_PROFILE_LAYER_FULL);
  const char *v = tsr_profile_v_codec(p, TSR_PROFILE_LAYER_FULL);
  const struct tsr_profile_kv_boundary *b = &p->kv_boundary;
  int used = snprintf(buf, n, "k=%s v=%s", k, v);
  if (b->layers && used >= 0 && (size_t)used < n)
    snprintf(buf + used, n - (size_t)used, ", boundary %d%s%s%s%s", (int)b->layers,
             b->k ? " k=" : "", b->k ? b->k : "", b->v ? " v=" : "", b->v ? b->v : "");
  return buf;
}

const char *tsr_profile_layer_kind_name(enum tsr_profile_layer_kind kind) {
  switch (kind) {
  case TSR_PROFILE_LAYER_FULL: return "full";
  case TSR_PROFILE_LAYER_SLIDING: return "sliding";
  case TSR_PROFILE_LAYER_LINEAR: return "linear";
  default: return "?";
  }
}

size_t tsr_profile_settings_count(const struct tsr_pnode *settings) {
  return settings && settings->kind == TSR_PNODE_MAP ? settings->n : 0;
}

int tsr_profile_settings_get(const struct tsr_pnode *settings, size_t i,
                             struct tsr_profile_setting *out) {
  if (i >= tsr_profile_settings_count(settings)) return 0;
  const struct tsr_pnode *v = settings->items[i];
  out->key = settings->keys[i]->str;
  out->value = v->kind == TSR_PNODE_SCALAR ? v->str : NULL;
  out->quoted = v->quoted;
  out->node = v;
  out->where = settings->keys[i]->where;
  return 1;
}
