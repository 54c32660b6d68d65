/*
** The resolved profile as YAML, for `tessera profile check`: every key with the
** value in force after extends, --set and defaults, and a comment saying where
** that value came from. The output loads back to the same profile.
*/
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "profile/profile.h"

#define COMMENT_COLUMN 44

/* One printout. Its text is built in an arena freed when printing ends, so no
** value (a long path, a setting of any length, lists nested deep) is cut to fit
** a buffer: what is printed must load back. */
struct printer {
  FILE *f;
  const struct tsr_profile *p;
  struct tsr_parena *a;
  bool failed; /* out of memory: said at the end of the printout */
};

static const char *fmt(struct printer *pr, const char *f, ...) TSR_PRINTF(2, 3);
static const char *fmt(struct printer *pr, const char *f, ...) {
  va_list ap;
  va_start(ap, f);
  int n = vsnprintf(NULL, 0, f, ap);
  va_end(ap);
  char *d = n < 0 ? NULL : tsr_parena_alloc(pr->a, (size_t)n + 1);
  if (!d) {
    pr->failed = true;
    return "";
  }
  va_start(ap, f);
  vsnprintf(d, (size_t)n + 1, f, ap);
  va_end(ap);
  return d;
}

/* The code point of the N-byte UTF-8 sequence at S (N from tsr_profile_utf8_len). */
static uint32_t code_point(const char *str, size_t n) {
  const unsigned char *s = (const unsigned char *)str;
  if (n == 1) return s[0];
  uint32_t cp = s[0] & (0x7Fu >> n);
  for (size_t i = 1; i < n; i++) cp = cp << 6 | (s[i] & 0x3Fu);
  return cp;
}

/* Whether the code point may stand raw on a printed line: YAML's c-printable set
** (libyaml refuses C0 and C1 controls, DEL, U+FEFF and U+FFFE/F in a file) less
** tab and the line breaks NEL, LS and PS. */
static int yaml_printable(uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7F && cp < 0xA0)) return 0;
  return cp != 0x2028 && cp != 0x2029 && cp != 0xFEFF && cp != 0xFFFE && cp != 0xFFFF;
}

/* A comment's text (a file name as given, a --set key path) stays on its line
** and loads back: every byte of a control character, a line break or an invalid
** sequence is written as \xNN. */
static void comment(FILE *f, const char *s) {
  while (*s) {
    size_t n = tsr_profile_utf8_len(s);
    if (n == 0 || !yaml_printable(code_point(s, n))) {
      for (size_t i = 0; i < (n ? n : 1); i++) fprintf(f, "\\x%02x", (unsigned char)s[i]);
      s += n ? n : 1;
    } else {
      fwrite(s, 1, n, f);
      s += n;
    }
  }
}

static void line(FILE *f, int indent, const char *text, const char *where) {
  int n = fprintf(f, "%*s%s", indent, "", text);
  if (where) {
    fprintf(f, "%*s# ", n < COMMENT_COLUMN ? COMMENT_COLUMN - n : 1, "");
    comment(f, where);
  }
  fputc('\n', f);
}

static int plain_ok(const char *s) {
  if (!*s || !strcmp(s, "~") || !strcasecmp(s, "null") || (s[0] == '-' && !s[1])) return 0;
  for (; *s; s++)
    if (!(*s >= 'a' && *s <= 'z') && !(*s >= 'A' && *s <= 'Z') && !(*s >= '0' && *s <= '9') &&
        !strchr("_./+-", *s))
      return 0;
  return 1;
}

/* S as a YAML scalar: bare when that reads back the same, else double-quoted,
** with every code point YAML does not allow raw (or that would break the line)
** as its escape. S is UTF-8 (the loader checks); a stray byte is escaped alone. */
static const char *scalar(struct printer *pr, const char *s, int quoted) {
  if (!quoted && plain_ok(s)) return s;
  char *buf = tsr_parena_alloc(pr->a, 4 * strlen(s) + 3); /* an escape is at most 4 a byte */
  if (!buf) {
    pr->failed = true;
    return "\"\"";
  }
  size_t o = 0;
  buf[o++] = '"';
  while (*s) {
    size_t n = tsr_profile_utf8_len(s);
    uint32_t cp = n ? code_point(s, n) : (unsigned char)*s;
    if (!n) {
      o += (size_t)sprintf(buf + o, "\\x%02x", cp);
      s++;
      continue;
    }
    if (cp == '"' || cp == '\\') o += (size_t)sprintf(buf + o, "\\%c", (char)cp);
    else if (cp == '\n') o += (size_t)sprintf(buf + o, "\\n");
    else if (cp == '\t') o += (size_t)sprintf(buf + o, "\\t");
    else if (cp == 0x85) o += (size_t)sprintf(buf + o, "\\N");
    else if (cp == 0x2028) o += (size_t)sprintf(buf + o, "\\L");
    else if (cp == 0x2029) o += (size_t)sprintf(buf + o, "\\P");
    else if (cp < 0x100 && !yaml_printable(cp)) o += (size_t)sprintf(buf + o, "\\x%02x", cp);
    else if (!yaml_printable(cp)) o += (size_t)sprintf(buf + o, "\\u%04x", cp);
    else {
      memcpy(buf + o, s, n);
      o += n;
    }
    s += n;
  }
  buf[o++] = '"';
  buf[o] = '\0';
  return buf;
}

static const char *str(struct printer *pr, const char *s) { return scalar(pr, s, 0); }

/* the shortest decimal that reads back as the same double */
static const char *num(char *buf, size_t n, double x) {
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, n, "%.*g", prec, x);
    if (strtod(buf, NULL) == x) break;
  }
  return buf;
}

static const char *size_text(char *buf, size_t n, uint64_t bytes) {
  static const char *const units[] = {"TiB", "GiB", "MiB", "KiB"};
  for (int i = 0; i < 4 && bytes; i++) {
    uint64_t mul = 1ull << (10 * (4 - i));
    if (bytes % mul == 0) {
      snprintf(buf, n, "%llu%s", (unsigned long long)(bytes / mul), units[i]);
      return buf;
    }
  }
  snprintf(buf, n, "%llu", (unsigned long long)bytes);
  return buf;
}

/* Where the value at KEY_PATH came from, or "default". */
static const char *origin(const struct tsr_profile *p, const char *key_path) {
  const char *w = tsr_profile_where_set(p, key_path);
  return w ? w : "default";
}

static void kv_line(struct printer *pr, int indent, const char *key, const char *value,
                    const char *key_path) {
  line(pr->f, indent, fmt(pr, "%s: %s", key, value), key_path ? origin(pr->p, key_path) : NULL);
}

/* The entries of a map or list, content at column INDENT; LEAD ("- " for a
** collection inside a list) is written before the first line, to its left. */
static void print_entries(struct printer *pr, const struct tsr_pnode *n, int indent,
                          const char *lead) {
  for (size_t i = 0; i < n->n; i++) {
    const struct tsr_pnode *v = n->items[i];
    const char *ld = i == 0 && lead ? lead : "";
    int ind = indent - (int)strlen(ld);
    const char *key = n->kind == TSR_PNODE_MAP ? fmt(pr, "%s:", scalar(pr, n->keys[i]->str, 0)) : "-";
    if (strlen(key) > 1000) {
      /* YAML reads at most 1024 characters as an implicit key: "? KEY" on a line
      ** of its own, the value after ": " on the next */
      line(pr->f, ind, fmt(pr, "%s? %.*s", ld, (int)strlen(key) - 1, key), NULL);
      ld = "";
      ind = indent;
      key = ":";
    }
    if (v->kind == TSR_PNODE_SCALAR || v->n == 0) {
      const char *text = v->kind == TSR_PNODE_MAP   ? "{}"
                         : v->kind == TSR_PNODE_SEQ ? "[]"
                         : tsr_pnode_is_null(v)     ? v->str /* "", ~, null as written */
                                                    : scalar(pr, v->str, v->quoted);
      line(pr->f, ind, fmt(pr, "%s%s %s", ld, key, text), v->where);
    } else if (n->kind == TSR_PNODE_MAP) {
      line(pr->f, ind, fmt(pr, "%s%s", ld, key), NULL);
      print_entries(pr, v, indent + 2, NULL);
    } else {
      /* a collection inside a list starts on the dash's line */
      print_entries(pr, v, indent + 2, fmt(pr, "%s- ", ld));
    }
  }
}

static void print_plugin(struct printer *pr, const struct tsr_profile_plugin *pl, int indent,
                         const char *lead) {
  line(pr->f, indent - (int)strlen(lead), fmt(pr, "%sname: %s", lead, str(pr, pl->name)),
       pl->node->where);
  if (pl->path) line(pr->f, indent, fmt(pr, "path: %s", str(pr, pl->resolved_path)), NULL);
  if (pl->settings && pl->settings->n) {
    line(pr->f, indent, "settings:", NULL);
    print_entries(pr, pl->settings, indent + 2, NULL);
  }
}

/* `backend: cpu`, or cuda's map with every setting in force and where it came from:
** the profile, the default, or the environment variable that overrides it. */
static void print_backend(struct printer *pr) {
  const struct tsr_profile *p = pr->p;
  const struct tsr_pnode *b = tsr_pnode_get(p->root, "backend");
  const bool map = b && b->kind == TSR_PNODE_MAP;
  if (strcmp(p->backend, "cuda")) {
    line(pr->f, 0, "backend:", NULL);
    kv_line(pr, 2, "name", p->backend, map ? "backend.name" : "backend");
    kv_line(pr, 2, "activations", p->cpu_activations_f32 ? "f32" : "q8", "backend.activations");
    for (int i = 0; i < TSR_CUDA_N_SETTINGS; i++) {
      const char *env = getenv(tsr_cuda_setting_key(i)->env);
      if (env && *env) {
        line(pr->f, 0, fmt(pr, "# %s=%s is set and takes no effect on backend %s",
                           tsr_cuda_setting_key(i)->env, env, p->backend), NULL);
      }
    }
    return;
  }
  line(pr->f, 0, "backend:", NULL);
  kv_line(pr, 2, "name", p->backend, map ? "backend.name" : "backend");
  bool attention_open = false;
  for (int i = 0; i < TSR_CUDA_N_SETTINGS; i++) {
    const struct tsr_cuda_setting_key *k = tsr_cuda_setting_key(i);
    const bool in_attention = !strncmp(k->key, "attention.", 10);
    if (in_attention && !attention_open) line(pr->f, 2, "attention:", NULL);
    attention_open |= in_attention;
    char val[32], path[64], where[96];
    tsr_cuda_setting_text(&p->cuda, i, val, sizeof val);
    snprintf(path, sizeof path, "backend.%s", k->key);
    if (p->cuda_env[i]) snprintf(where, sizeof where, "%s (environment, over the profile)",
                                 p->cuda_env[i]);
    else if (p->cuda_forced[i]) snprintf(where, sizeof where, "backend.precision f32");
    line(pr->f, in_attention ? 4 : 2, fmt(pr, "%s: %s", in_attention ? k->key + 10 : k->key, val),
         p->cuda_env[i] || p->cuda_forced[i] ? where : origin(p, path));
  }
}

void tsr_profile_print(const struct tsr_profile *p, FILE *f) {
  struct printer pr = {.f = f, .p = p, .a = tsr_parena_new()};
  char v[64]; /* numbers */
  fprintf(f, "# %s, resolved: extends, --set and defaults applied\n", p->path);
  if (!pr.a) {
    fprintf(f, "# out of memory: nothing printed\n");
    return;
  }
  /* paths as resolved (relative to the cwd), since the file that wrote them is not this one */
  kv_line(&pr, 0, "model", str(&pr, p->model_path ? p->model_path : p->model), "model");
  print_backend(&pr);
  snprintf(v, sizeof v, "%d", p->threads);
  kv_line(&pr, 0, "threads", v, "threads");
  snprintf(v, sizeof v, "%lld", (long long)p->context);
  kv_line(&pr, 0, "context", v, "context");
  snprintf(v, sizeof v, "%d", p->batch);
  kv_line(&pr, 0, "batch", v, "batch");
  snprintf(v, sizeof v, "%d", p->ubatch);
  kv_line(&pr, 0, "ubatch", v, "ubatch");
  kv_line(&pr, 0, "memory_limit", size_text(v, sizeof v, p->memory_limit), "memory_limit");
  if (!p->attention_kind[TSR_PROFILE_LAYER_FULL]) {
    kv_line(&pr, 0, "attention", str(&pr, p->attention), "attention");
  } else {
    line(f, 0, "attention:", NULL);
    kv_line(&pr, 2, "full", str(&pr, p->attention_kind[TSR_PROFILE_LAYER_FULL]),
            "attention.full");
    kv_line(&pr, 2, "sliding", str(&pr, p->attention_kind[TSR_PROFILE_LAYER_SLIDING]),
            "attention.sliding");
  }

  line(f, 0, "kv:", NULL);
  kv_line(&pr, 2, "k", str(&pr, p->kv.k), "kv.k");
  kv_line(&pr, 2, "v", str(&pr, p->kv.v), "kv.v");
  kv_line(&pr, 2, "lift", p->kv_lift, "kv.lift");
  int any = 0;
  for (int kind = 0; kind < TSR_PROFILE_LAYER_KINDS; kind++) {
    const struct tsr_profile_kv_pair *kp = &p->kv_per_kind[kind];
    if (!kp->k && !kp->v) continue;
    if (!any++) line(f, 2, "per_kind:", NULL);
    const char *name = tsr_profile_layer_kind_name((enum tsr_profile_layer_kind)kind);
    line(f, 4, fmt(&pr, "%s:", name), NULL);
    char path[64];
    if (kp->k) {
      snprintf(path, sizeof path, "kv.per_kind.%s.k", name);
      kv_line(&pr, 6, "k", str(&pr, kp->k), path);
    }
    if (kp->v) {
      snprintf(path, sizeof path, "kv.per_kind.%s.v", name);
      kv_line(&pr, 6, "v", str(&pr, kp->v), path);
    }
  }

  const struct tsr_profile_kv_boundary *kb = &p->kv_boundary;
  if (kb->layers) {
    line(f, 2, "boundary:", NULL);
    kv_line(&pr, 4, "layers", fmt(&pr, "%d", kb->layers), "kv.boundary.layers");
    if (kb->k) kv_line(&pr, 4, "k", str(&pr, kb->k), "kv.boundary.k");
    if (kb->v) kv_line(&pr, 4, "v", str(&pr, kb->v), "kv.boundary.v");
  }

  if (!p->n_plugins) kv_line(&pr, 0, "plugins", "[]", NULL);
  else line(f, 0, "plugins:", NULL);
  for (size_t i = 0; i < p->n_plugins; i++) print_plugin(&pr, &p->plugins[i], 4, "- ");

  if (!p->n_decode_policies) kv_line(&pr, 0, "decode_policies", "[]", NULL);
  else line(f, 0, "decode_policies:", origin(p, "decode_policies"));
  for (size_t i = 0; i < p->n_decode_policies; i++) {
    line(f, 2, fmt(&pr, "- %s", str(&pr, p->decode_policies[i])), NULL);
  }

  if (!p->has_speculator) {
    kv_line(&pr, 0, "speculator", "null", "speculator");
  } else {
    line(f, 0, "speculator:", NULL);
    print_plugin(&pr, &p->speculator, 2, "");
  }

  const struct tsr_profile_sampling *s = &p->sampling;
  line(f, 0, "sampling:", NULL);
  kv_line(&pr, 2, "temperature", num(v, sizeof v, s->temperature), "sampling.temperature");
  snprintf(v, sizeof v, "%d", s->top_k);
  kv_line(&pr, 2, "top_k", v, "sampling.top_k");
  kv_line(&pr, 2, "top_p", num(v, sizeof v, s->top_p), "sampling.top_p");
  kv_line(&pr, 2, "min_p", num(v, sizeof v, s->min_p), "sampling.min_p");
  snprintf(v, sizeof v, "%lld", (long long)s->seed);
  kv_line(&pr, 2, "seed", v, "sampling.seed");
  snprintf(v, sizeof v, "%d", s->max_tokens);
  kv_line(&pr, 2, "max_tokens", v, "sampling.max_tokens");

  const struct tsr_profile_server *sv = &p->server;
  line(f, 0, "server:", NULL);
  kv_line(&pr, 2, "host", str(&pr, sv->host), "server.host");
  snprintf(v, sizeof v, "%d", sv->port);
  kv_line(&pr, 2, "port", v, "server.port");
  snprintf(v, sizeof v, "%d", sv->parallel);
  kv_line(&pr, 2, "parallel", v, "server.parallel");
  kv_line(&pr, 2, "api_key_env", sv->api_key_env ? str(&pr, sv->api_key_env) : "null",
          "server.api_key_env");
  snprintf(v, sizeof v, "%d", sv->header_timeout);
  kv_line(&pr, 2, "header_timeout", v, "server.header_timeout");
  snprintf(v, sizeof v, "%d", sv->body_timeout);
  kv_line(&pr, 2, "body_timeout", v, "server.body_timeout");
  snprintf(v, sizeof v, "%d", sv->client_connections);
  kv_line(&pr, 2, "client_connections", v, "server.client_connections");
  kv_line(&pr, 2, "cors_origins", sv->cors_origins ? str(&pr, sv->cors_origins) : "null",
          "server.cors_origins");
  if (pr.failed) fprintf(f, "# out of memory: values above are missing\n");
  tsr_parena_free(pr.a);
}
