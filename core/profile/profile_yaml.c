/*
** YAML text -> tree of tsr_pnode, with libyaml's event parser. Every node keeps
** its file, line and column so schema errors can point at the exact spot, even
** after profiles from several files have been merged. Nodes live in an arena
** owned by the profile, so merging can move subtrees between files freely.
*/
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "common/file.h"
#include "profile/profile.h"

/* Deeper than any profile needs; it bounds the recursion of merge and print. */
#define MAX_DEPTH 64

/* ---- arena ---------------------------------------------------------------- */

struct chunk {
  struct chunk *next;
  size_t used, size;
  _Alignas(16) unsigned char data[];
};

struct tsr_parena {
  struct chunk *head;
};

struct tsr_parena *tsr_parena_new(void) { return calloc(1, sizeof(struct tsr_parena)); }

void tsr_parena_free(struct tsr_parena *a) {
  if (!a) return;
  for (struct chunk *c = a->head, *next; c; c = next) {
    next = c->next;
    free(c);
  }
  free(a);
}

void *tsr_parena_alloc(struct tsr_parena *a, size_t n) {
  n = (n + 15) & ~(size_t)15;
  struct chunk *c = a->head;
  if (!c || c->size - c->used < n) {
    size_t size = n > 65536 ? n : 65536;
    size_t total;
    if (!tsr_size_add(size, sizeof *c, &total)) return NULL;
    c = malloc(total);
    if (!c) return NULL;
    c->used = 0;
    c->size = size;
    c->next = a->head;
    a->head = c;
  }
  void *p = c->data + c->used;
  c->used += n;
  memset(p, 0, n);
  return p;
}

static char *arena_strndup(struct tsr_parena *a, const char *s, size_t n) {
  char *d = tsr_parena_alloc(a, n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

char *tsr_parena_strdup(struct tsr_parena *a, const char *s) {
  return s ? arena_strndup(a, s, strlen(s)) : NULL;
}

char *tsr_parena_printf(struct tsr_parena *a, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return NULL;
  char *d = tsr_parena_alloc(a, (size_t)n + 1);
  if (!d) return NULL;
  va_start(ap, fmt);
  vsnprintf(d, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return d;
}

/* ---- nodes ---------------------------------------------------------------- */

struct tsr_pnode *tsr_pnode_new(struct tsr_parena *a, enum tsr_pnode_kind kind, const char *file,
                                int line, int col) {
  struct tsr_pnode *n = tsr_parena_alloc(a, sizeof *n);
  if (!n) return NULL;
  n->kind = kind;
  n->file = file;
  n->line = line;
  n->col = col;
  n->where = line > 0 ? tsr_parena_printf(a, "%s:%d:%d", file, line, col) : file;
  if (!n->where) return NULL;
  n->str = "";
  return n;
}

int tsr_pnode_append(struct tsr_parena *a, struct tsr_pnode *node, struct tsr_pnode *key,
                     struct tsr_pnode *value) {
  if (node->n == node->cap_) {
    size_t cap = node->cap_ ? node->cap_ * 2 : 8;
    struct tsr_pnode **items = tsr_parena_alloc(a, cap * sizeof *items);
    struct tsr_pnode **keys = key ? tsr_parena_alloc(a, cap * sizeof *keys) : NULL;
    if (!items || (key && !keys)) return 0;
    /* the old arrays stay in the arena until the profile is freed: profiles are small */
    if (node->n) memcpy(items, node->items, node->n * sizeof *items);
    if (keys && node->n) memcpy(keys, node->keys, node->n * sizeof *keys);
    node->items = items;
    if (key) node->keys = keys;
    node->cap_ = cap;
  }
  if (key) node->keys[node->n] = key;
  node->items[node->n++] = value;
  return 1;
}

int tsr_pnode_is_null(const struct tsr_pnode *node) {
  if (!node || node->kind != TSR_PNODE_SCALAR || node->quoted) return 0;
  const char *s = node->str;
  return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
         !strcmp(s, "NULL");
}

const struct tsr_pnode *tsr_pnode_get(const struct tsr_pnode *map, const char *key) {
  if (!map || map->kind != TSR_PNODE_MAP) return NULL;
  for (size_t i = 0; i < map->n; i++)
    if (!strcmp(map->keys[i]->str, key)) return map->items[i];
  return NULL;
}

/* ---- parser --------------------------------------------------------------- */

struct frame {
  struct tsr_pnode *node;
  struct tsr_pnode *key; /* map: the key waiting for its value */
};

struct builder {
  struct tsr_parena *a;
  const char *file;
  const char *data;
  size_t len;
  struct tsr_pnode *root;
  struct frame stack[MAX_DEPTH];
  int depth;
};

static tsr_status at(const struct builder *b, yaml_mark_t m, const char *fmt, ...)
    TSR_PRINTF(3, 4);
static tsr_status at(const struct builder *b, yaml_mark_t m, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  /* a --set value is one line: a column into it would not help anyone */
  if (!strncmp(b->file, "--set ", 6))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: %s (in the value '%.*s')", b->file, msg,
                         (int)b->len, b->data);
  return tsr_error_set(TSR_ERR_INVALID_ARG, "%s:%zu:%zu: %s", b->file, m.line + 1, m.column + 1,
                       msg);
}

/* Reader errors (bad UTF-8) carry a byte offset, not a mark. */
static yaml_mark_t mark_of_offset(const struct builder *b, size_t off) {
  yaml_mark_t m = {0, 0, 0};
  for (size_t i = 0; i < off && i < b->len; i++) {
    if (b->data[i] == '\n') {
      m.line++;
      m.column = 0;
    } else if (((unsigned char)b->data[i] & 0xc0) != 0x80) {
      m.column++;
    }
  }
  return m;
}

static tsr_status parser_error(const struct builder *b, const yaml_parser_t *p) {
  if (p->error == YAML_MEMORY_ERROR)
    return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory while parsing YAML", b->file);
  const char *problem = p->problem ? p->problem : "malformed YAML";
  if (p->error == YAML_READER_ERROR)
    return at(b, mark_of_offset(b, p->problem_offset), "%s (the file must be UTF-8 text)",
              problem);
  if (p->context && strncmp(b->file, "--set ", 6))
    return at(b, p->problem_mark, "%s (%s started at line %zu, column %zu)", problem,
              p->context, p->context_mark.line + 1, p->context_mark.column + 1);
  return at(b, p->problem_mark, "%s", problem);
}

static int cmp_keys(const void *x, const void *y) {
  const struct tsr_pnode *a = *(struct tsr_pnode *const *)x, *b = *(struct tsr_pnode *const *)y;
  int c = strcmp(a->str, b->str);
  if (c) return c;
  return a->line != b->line ? (a->line < b->line ? -1 : 1) : (a->col > b->col) - (a->col < b->col);
}

/* Sorting instead of comparing each pair keeps a hostile file with a huge map
** from taking quadratic time. Names the earliest repeated key and its first use. */
static tsr_status check_duplicate_keys(const struct builder *b, const struct tsr_pnode *map) {
  if (map->n < 2) return TSR_OK;
  struct tsr_pnode **sorted = malloc(map->n * sizeof *sorted);
  if (!sorted) return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory", b->file);
  memcpy(sorted, map->keys, map->n * sizeof *sorted);
  qsort(sorted, map->n, sizeof *sorted, cmp_keys);
  const struct tsr_pnode *first = NULL, *second = NULL;
  for (size_t i = 1; i < map->n; i++) {
    if (strcmp(sorted[i - 1]->str, sorted[i]->str)) continue;
    size_t j = i - 1; /* the first of this run of equal keys */
    while (j > 0 && !strcmp(sorted[j - 1]->str, sorted[i]->str)) j--;
    if (!second || sorted[i]->line < second->line ||
        (sorted[i]->line == second->line && sorted[i]->col < second->col)) {
      first = sorted[j];
      second = sorted[i];
    }
  }
  free(sorted);
  if (!second) return TSR_OK;
  return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: duplicate key '%s' (first at line %d, again at line %d)",
                       second->where, second->str, first->line, second->line);
}

static tsr_status attach(struct builder *b, struct tsr_pnode *node, yaml_mark_t m) {
  if (b->depth == 0) {
    b->root = node;
    return TSR_OK;
  }
  struct frame *top = &b->stack[b->depth - 1];
  if (top->node->kind == TSR_PNODE_SEQ) {
    if (!tsr_pnode_append(b->a, top->node, NULL, node)) goto nomem;
    return TSR_OK;
  }
  if (!top->key) {
    if (node->kind != TSR_PNODE_SCALAR) return at(b, m, "a map key must be a plain word, not a %s",
                                                   node->kind == TSR_PNODE_MAP ? "map" : "list");
    top->key = node;
    return TSR_OK;
  }
  if (!tsr_pnode_append(b->a, top->node, top->key, node)) goto nomem;
  top->key = NULL;
  return TSR_OK;
nomem:
  return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory", b->file);
}

static tsr_status refuse_anchor_tag(const struct builder *b, yaml_mark_t m, const yaml_char_t *anchor,
                                    const yaml_char_t *tag) {
  if (anchor)
    return at(b, m, "anchors (&%s) are not supported in profiles; write the value out, or "
                    "share it with extends:", (const char *)anchor);
  if (tag)
    return at(b, m, "tags (%s) are not supported in profiles", (const char *)tag);
  return TSR_OK;
}

static tsr_status on_event(struct builder *b, const yaml_event_t *ev, int *n_docs, int *done) {
  yaml_mark_t m = ev->start_mark;
  int line = (int)m.line + 1, col = (int)m.column + 1;
  tsr_status st;
  struct tsr_pnode *node;
  switch (ev->type) {
  case YAML_STREAM_END_EVENT:
    *done = 1;
    return TSR_OK;
  case YAML_DOCUMENT_START_EVENT:
    if ((*n_docs)++ > 0)
      return at(b, m, "a profile holds one YAML document; this starts a second one");
    return TSR_OK;
  case YAML_ALIAS_EVENT:
    return at(b, m, "aliases (*%s) are not supported in profiles; write the value out, or "
                    "share it with extends:", (const char *)ev->data.alias.anchor);
  case YAML_SCALAR_EVENT: {
    if ((st = refuse_anchor_tag(b, m, ev->data.scalar.anchor, ev->data.scalar.tag))) return st;
    const char *v = (const char *)ev->data.scalar.value;
    size_t n = ev->data.scalar.length;
    if (memchr(v, '\0', n)) return at(b, m, "a value holds a NUL character");
    if (!(node = tsr_pnode_new(b->a, TSR_PNODE_SCALAR, b->file, line, col))) break;
    if (!(node->str = arena_strndup(b->a, v, n))) break;
    node->quoted = ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
    return attach(b, node, m);
  }
  case YAML_SEQUENCE_START_EVENT:
  case YAML_MAPPING_START_EVENT: {
    int is_map = ev->type == YAML_MAPPING_START_EVENT;
    st = is_map ? refuse_anchor_tag(b, m, ev->data.mapping_start.anchor,
                                    ev->data.mapping_start.tag)
                : refuse_anchor_tag(b, m, ev->data.sequence_start.anchor,
                                    ev->data.sequence_start.tag);
    if (st) return st;
    if (b->depth == MAX_DEPTH) return at(b, m, "nested deeper than %d levels", MAX_DEPTH);
    node = tsr_pnode_new(b->a, is_map ? TSR_PNODE_MAP : TSR_PNODE_SEQ, b->file, line, col);
    if (!node) break;
    if ((st = attach(b, node, m))) return st;
    b->stack[b->depth++] = (struct frame){node, NULL};
    return TSR_OK;
  }
  case YAML_SEQUENCE_END_EVENT:
  case YAML_MAPPING_END_EVENT:
    node = b->stack[--b->depth].node;
    return node->kind == TSR_PNODE_MAP ? check_duplicate_keys(b, node) : TSR_OK;
  default:
    return TSR_OK;
  }
  return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory", b->file);
}

tsr_status tsr_profile_parse_yaml(struct tsr_parena *a, const char *file, const char *data,
                                  size_t len, struct tsr_pnode **root) {
  struct builder b = {.a = a, .file = file, .data = data, .len = len};
  yaml_parser_t parser;
  if (!yaml_parser_initialize(&parser))
    return tsr_error_set(TSR_ERR_NOMEM, "%s: cannot start the YAML parser", file);
  yaml_parser_set_input_string(&parser, (const unsigned char *)data, len);
  tsr_status st = TSR_OK;
  int n_docs = 0, done = 0;
  while (!done && !st) {
    yaml_event_t ev;
    if (!yaml_parser_parse(&parser, &ev)) {
      st = parser_error(&b, &parser);
      break;
    }
    st = on_event(&b, &ev, &n_docs, &done);
    yaml_event_delete(&ev);
  }
  yaml_parser_delete(&parser);
  if (st) return st;
  if (!b.root && !(b.root = tsr_pnode_new(a, TSR_PNODE_SCALAR, file, 1, 1)))
    return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory", file);
  *root = b.root;
  return TSR_OK;
}

/* ---- layering: extends, merge, --set -------------------------------------- */

#define MAX_EXTENDS 16
/* files read in all: a chain within MAX_EXTENDS can still fan out (each file naming
** its base many times), which would read 16^depth files */
#define MAX_LOADS 64
#define MAX_FILE_BYTES (1u << 20)

char *tsr_profile_dirname(struct tsr_parena *a, const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return tsr_parena_strdup(a, "");
  if (slash == path) return tsr_parena_strdup(a, "/");
  return arena_strndup(a, path, (size_t)(slash - path));
}

char *tsr_profile_join(struct tsr_parena *a, const char *dir, const char *rel) {
  if (rel[0] == '/' || !dir[0]) return tsr_parena_strdup(a, rel);
  size_t n = strlen(dir);
  return tsr_parena_printf(a, "%s%s%s", dir, dir[n - 1] == '/' ? "" : "/", rel);
}

struct loader {
  struct tsr_parena *a;
  const char *canon[MAX_EXTENDS + 1]; /* real paths of the files being loaded, outermost first */
  const char *name[MAX_EXTENDS + 1];  /* the same as written, for messages */
  int depth;
  int loads; /* files read so far, each time a base is named */
};

static tsr_status read_file(const char *path, const struct tsr_pnode *from, char **out,
                            size_t *len) {
  const char *ctx = from ? from->where : path;
  FILE *f;
  if (tsr_file_fopen(path, &f) != TSR_OK) {
    if (from) tsr_error_prefix("%s: extends", from->where);
    return TSR_ERR_IO;
  }
  char *buf = malloc(MAX_FILE_BYTES + 1);
  if (!buf) {
    fclose(f);
    return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory", path);
  }
  size_t n = fread(buf, 1, MAX_FILE_BYTES + 1, f);
  int bad = ferror(f);
  fclose(f);
  if (bad || n > MAX_FILE_BYTES) {
    free(buf);
    return bad ? tsr_error_set(TSR_ERR_IO, "%s: cannot read '%s'", ctx, path)
               : tsr_error_set(TSR_ERR_INVALID_ARG, "%s: larger than %u bytes; a profile is a "
                               "short file", path, MAX_FILE_BYTES);
  }
  *out = buf;
  *len = n;
  return TSR_OK;
}

/* BASE with OVER laid on it: maps merge key by key, anything else is replaced.
** Keys that OVER sets take OVER's key node, so messages point at the file that
** set the value. Mutates BASE, which is always a tree loaded for this merge. */
static struct tsr_pnode *merge(struct tsr_parena *a, struct tsr_pnode *base,
                               struct tsr_pnode *over) {
  if (base->kind != TSR_PNODE_MAP || over->kind != TSR_PNODE_MAP) return over;
  for (size_t i = 0; i < over->n; i++) {
    size_t j = 0;
    while (j < base->n && strcmp(base->keys[j]->str, over->keys[i]->str)) j++;
    if (j == base->n) {
      if (!tsr_pnode_append(a, base, over->keys[i], over->items[i])) return NULL;
      continue;
    }
    struct tsr_pnode *m = merge(a, base->items[j], over->items[i]);
    if (!m) return NULL;
    base->keys[j] = over->keys[i];
    base->items[j] = m;
  }
  return base;
}

static char *chain_text(struct loader *L, int from, const char *last) {
  char *s = "";
  for (int i = from; i < L->depth && s; i++) s = tsr_parena_printf(L->a, "%s%s -> ", s, L->name[i]);
  return s ? tsr_parena_printf(L->a, "%s%s", s, last) : NULL;
}

static tsr_status load_file(struct loader *L, const char *path, const char *data, size_t len,
                            const struct tsr_pnode *from, struct tsr_pnode **out);

/* Loads the files named by EXT (a name or a list of names, relative to DIR)
** and merges them in order into *merged. */
static tsr_status load_bases(struct loader *L, const char *dir, const struct tsr_pnode *ext,
                             struct tsr_pnode **merged) {
  size_t n = ext->kind == TSR_PNODE_SEQ ? ext->n : 1;
  for (size_t i = 0; i < n; i++) {
    const struct tsr_pnode *item = ext->kind == TSR_PNODE_SEQ ? ext->items[i] : ext;
    if (item->kind != TSR_PNODE_SCALAR || tsr_pnode_is_null(item) || !item->str[0])
      return tsr_error_set(TSR_ERR_INVALID_ARG,
                           "%s: key 'extends': expected a profile file name or a list of them",
                           item->where);
    const char *base_path = tsr_profile_join(L->a, dir, item->str);
    struct tsr_pnode *base;
    if (!base_path) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
    tsr_status st = load_file(L, base_path, NULL, 0, item, &base);
    if (st) return st;
    if (!(*merged = merge(L->a, *merged, base))) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  }
  return TSR_OK;
}

static tsr_status load_file(struct loader *L, const char *path, const char *data, size_t len,
                            const struct tsr_pnode *from, struct tsr_pnode **out) {
  char *buf = NULL;
  const char *canon = path;
  tsr_status st;
  if (!data) {
    char *real = realpath(path, NULL);
    if (!real)
      return tsr_error_set(errno == ENOENT ? TSR_ERR_INVALID_ARG : TSR_ERR_IO, "%s: %s'%s': %s",
                           from ? from->where : path, from ? "extends: cannot open " : "cannot open ",
                           path, strerror(errno));
    canon = tsr_parena_strdup(L->a, real);
    free(real);
    if (!canon) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  }
  for (int i = 0; i < L->depth; i++)
    if (!strcmp(L->canon[i], canon))
      return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: extends cycle: %s", from->where,
                           chain_text(L, i, path));
  if (L->depth == MAX_EXTENDS + 1)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: extends chain deeper than %d files: %s",
                         from->where, MAX_EXTENDS, chain_text(L, 0, path));
  if (++L->loads > MAX_LOADS)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: extends reads more than %d files in all (a "
                         "base named more than once is read each time): %s", from->where,
                         MAX_LOADS, chain_text(L, 0, path));
  const char *name = tsr_parena_strdup(L->a, path);
  if (!name) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  if (!data) {
    if ((st = read_file(path, from, &buf, &len))) return st;
    data = buf;
  }
  struct tsr_pnode *root;
  st = tsr_profile_parse_yaml(L->a, name, data, len, &root);
  free(buf);
  if (st) return st;
  if (tsr_pnode_is_null(root)) root->kind = TSR_PNODE_MAP; /* an empty file sets nothing */
  if (root->kind != TSR_PNODE_MAP)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: a profile is a map of 'key: value' lines, "
                         "not a %s", root->where, root->kind == TSR_PNODE_SEQ ? "list" : "single value");

  /* take extends: out of the tree; what is left is laid on the bases */
  const struct tsr_pnode *ext = NULL;
  for (size_t i = 0; i < root->n; i++) {
    if (strcmp(root->keys[i]->str, "extends")) continue;
    ext = root->items[i];
    memmove(root->keys + i, root->keys + i + 1, (root->n - i - 1) * sizeof *root->keys);
    memmove(root->items + i, root->items + i + 1, (root->n - i - 1) * sizeof *root->items);
    root->n--;
    break;
  }
  if (!ext || tsr_pnode_is_null(ext)) {
    *out = root;
    return TSR_OK;
  }
  L->canon[L->depth] = canon;
  L->name[L->depth] = name;
  L->depth++;
  struct tsr_pnode *merged = tsr_pnode_new(L->a, TSR_PNODE_MAP, name, 1, 1);
  if (!merged) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  st = load_bases(L, tsr_profile_dirname(L->a, path), ext, &merged);
  L->depth--;
  if (st) return st;
  if (!(*out = merge(L->a, merged, root))) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  return TSR_OK;
}

size_t tsr_profile_utf8_len(const char *str) {
  const unsigned char *s = (const unsigned char *)str;
  unsigned char lo = 0x80, hi = 0xBF; /* range of the second byte */
  size_t n;
  if (s[0] < 0x80) return 1;
  if (s[0] >= 0xC2 && s[0] <= 0xDF) {
    n = 2;
  } else if (s[0] >= 0xE0 && s[0] <= 0xEF) {
    n = 3;
    if (s[0] == 0xE0) lo = 0xA0; /* overlong */
    if (s[0] == 0xED) hi = 0x9F; /* surrogates */
  } else if (s[0] >= 0xF0 && s[0] <= 0xF4) {
    n = 4;
    if (s[0] == 0xF0) lo = 0x90; /* overlong */
    if (s[0] == 0xF4) hi = 0x8F; /* past U+10FFFF */
  } else {
    return 0;
  }
  if (s[1] < lo || s[1] > hi) return 0;
  for (size_t i = 2; i < n; i++)
    if ((s[i] & 0xC0) != 0x80) return 0;
  return n;
}

/* Collections nested in N: 0 for a scalar. */
static int depth_of(const struct tsr_pnode *n) {
  int d = 0;
  for (size_t i = 0; i < n->n; i++) {
    int c = depth_of(n->items[i]);
    if (c > d) d = c;
  }
  return n->kind == TSR_PNODE_SCALAR ? 0 : d + 1;
}

/* Values given with --set have no line in any file: they are named by the flag. */
static void relabel(struct tsr_pnode *n, const char *label) {
  n->file = n->where = label;
  n->line = n->col = 0;
  for (size_t i = 0; i < n->n; i++) {
    if (n->keys) relabel(n->keys[i], label);
    relabel(n->items[i], label);
  }
}

static int seq_index(const char *seg, size_t n, size_t *idx) {
  char *end;
  if (*seg < '0' || *seg > '9') return 0;
  unsigned long v = strtoul(seg, &end, 10);
  if (*end || v >= n) return 0;
  *idx = v;
  return 1;
}

/* Applies "a.b.c=value": missing or null maps on the way are created; a list
** is entered by index (plugins.0.settings.x). */
static tsr_status apply_set(struct tsr_parena *a, struct tsr_pnode *root, const char *arg) {
  const char *eq = strchr(arg, '=');
  if (!eq || eq == arg)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "--set '%s': expected KEY.PATH=VALUE", arg);
  /* a key in a file is UTF-8 (libyaml checks it); one given here must be too, or
  ** the resolved profile could not be printed as YAML */
  for (const char *c = arg; c < eq;) {
    size_t n = tsr_profile_utf8_len(c);
    if (!n || c + n > eq)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "--set: the key path is not UTF-8 text (byte "
                           "0x%02X at offset %zu)", (unsigned char)*c, (size_t)(c - arg));
    c += n;
  }
  char *path = arena_strndup(a, arg, (size_t)(eq - arg));
  char *label = path ? tsr_parena_printf(a, "--set %s", path) : NULL;
  if (!label) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
  struct tsr_pnode *value;
  tsr_status st = tsr_profile_parse_yaml(a, label, eq + 1, strlen(eq + 1), &value);
  if (st) return st;
  /* each key of the path is one map (or list) deeper, as in a file: the tree stays
  ** within the depth a file may have, which bounds merge and print */
  int levels = 1;
  for (const char *c = path; *c; c++) levels += *c == '.';
  if (levels + depth_of(value) > MAX_DEPTH)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: nested deeper than %d levels", label,
                         MAX_DEPTH);
  relabel(value, label);

  struct tsr_pnode *cur = root;
  char *seg = path;
  for (;;) {
    char *dot = strchr(seg, '.');
    if (dot) *dot = '\0';
    if (!*seg)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: empty key in the path", label);
    const char *done = tsr_parena_printf(a, "%.*s", (int)(seg - path + strlen(seg)),
                                         arg); /* the path up to this key */
    if (!done) return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
    struct tsr_pnode **slot = NULL;
    if (cur->kind == TSR_PNODE_SEQ) {
      size_t idx;
      if (!seq_index(seg, cur->n, &idx))
        return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: '%s' is a list of %zu items (at %s); "
                             "'%s' is not an index into it", label,
                             seg == path ? "" : tsr_parena_printf(a, "%.*s", (int)(seg - path - 1), arg),
                             cur->n, cur->where, seg);
      slot = &cur->items[idx];
    } else {
      for (size_t i = 0; i < cur->n; i++)
        if (!strcmp(cur->keys[i]->str, seg)) slot = &cur->items[i];
      if (!slot) {
        struct tsr_pnode *key = tsr_pnode_new(a, TSR_PNODE_SCALAR, label, 0, 0);
        struct tsr_pnode *map = tsr_pnode_new(a, TSR_PNODE_MAP, label, 0, 0);
        if (!key || !map || !(key->str = tsr_parena_strdup(a, seg)) ||
            !tsr_pnode_append(a, cur, key, map))
          return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
        slot = &cur->items[cur->n - 1];
      }
    }
    if (!dot) {
      *slot = value;
      return TSR_OK;
    }
    if (tsr_pnode_is_null(*slot)) {
      if (!(*slot = tsr_pnode_new(a, TSR_PNODE_MAP, label, 0, 0)))
        return tsr_error_set(TSR_ERR_NOMEM, "out of memory");
    } else if ((*slot)->kind == TSR_PNODE_SCALAR) {
      return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: '%s' is a single value ('%s' at %s), not a "
                           "map: cannot set a key inside it", label, done, (*slot)->str,
                           (*slot)->where);
    }
    cur = *slot;
    seg = dot + 1;
  }
}

tsr_status tsr_profile_build_tree(struct tsr_parena *a, const char *path, const char *data,
                                  size_t len, const char *const *sets, int n_sets,
                                  struct tsr_pnode **root) {
  struct loader L = {.a = a};
  tsr_status st = load_file(&L, path, data, len, NULL, root);
  for (int i = 0; i < n_sets && !st; i++) st = apply_set(a, *root, sets[i]);
  return st;
}
