#include "abi/plugin_manifest.h"

/* inih's own line buffer (its default INI_MAX_LINE, which the system library keeps) */
#define INI_LINE_MAX 200

#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/file.h"

struct parse_state {
  struct tsr_manifest *m;
  int seen_plugin_section;
  char seen_keys[8][16]; /* a key given twice is an error, not a silent override */
  int n_seen;
  char error[1024]; /* the problem; its line is what ini_parse_file returns */
};

static int copy_field(struct parse_state *ps, char *dst, size_t cap, const char *key,
                      const char *value) {
  if (strlen(value) >= cap) {
    snprintf(ps->error, sizeof ps->error, "'%s' is longer than %zu characters", key,
             cap - 1);
    return 0;
  }
  strcpy(dst, value);
  return 1;
}

/* "attention:1, kv_codec:1" -> list; an empty value is an empty list. */
static int parse_ifaces(struct parse_state *ps, const char *value, int provides) {
  struct tsr_manifest *m = ps->m;
  char buf[512];
  snprintf(buf, sizeof buf, "%s", value);
  int *n = provides ? &m->n_provides : &m->n_requires;
  for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
    char *colon = strchr(tok, ':');
    char *end = NULL;
    unsigned long ver = colon ? strtoul(colon + 1, &end, 10) : 0;
    if (!colon || colon == tok || !end || *end || ver == 0 || ver > 1000 ||
        (size_t)(colon - tok) >= sizeof m->provides[0].name) {
      snprintf(ps->error, sizeof ps->error,
               "interface '%s' must be written NAME:VERSION (e.g. attention:1)", tok);
      return 0;
    }
    if (*n == TSR_MANIFEST_MAX_IFACES) {
      snprintf(ps->error, sizeof ps->error, "more than %d interfaces", TSR_MANIFEST_MAX_IFACES);
      return 0;
    }
    *colon = '\0';
    for (int i = 0; i < *n; i++) /* each interface once: the descriptor check counts them */
      if (!strcmp(provides ? m->provides[i].name : m->requires[i].name, tok)) {
        snprintf(ps->error, sizeof ps->error, "interface '%s' listed twice", tok);
        return 0;
      }
    if (provides) {
      snprintf(m->provides[*n].name, sizeof m->provides[*n].name, "%s", tok);
      m->provides[*n].version = (uint32_t)ver;
    } else {
      snprintf(m->requires[*n].name, sizeof m->requires[*n].name, "%s", tok);
      m->requires[*n].version = (uint32_t)ver;
    }
    (*n)++;
  }
  return 1;
}

static int on_entry(void *user, const char *section, const char *key, const char *value) {
  struct parse_state *ps = user;
  struct tsr_manifest *m = ps->m;
  if (ps->error[0]) return 0;
  if (strcmp(section, "plugin")) {
    snprintf(ps->error, sizeof ps->error, "unknown section [%s] (only [plugin])", section);
    return 0;
  }
  ps->seen_plugin_section = 1;
  for (int i = 0; i < ps->n_seen; i++)
    if (!strcmp(ps->seen_keys[i], key)) {
      snprintf(ps->error, sizeof ps->error, "key '%s' given twice", key);
      return 0;
    }
  if (ps->n_seen < 8 && strlen(key) < sizeof ps->seen_keys[0])
    strcpy(ps->seen_keys[ps->n_seen++], key);
  if (!strcmp(key, "name")) return copy_field(ps, m->name, sizeof m->name, key, value);
  if (!strcmp(key, "version")) return copy_field(ps, m->version, sizeof m->version, key, value);
  if (!strcmp(key, "library")) return copy_field(ps, m->library, sizeof m->library, key, value);
  if (!strcmp(key, "description"))
    return copy_field(ps, m->description, sizeof m->description, key, value);
  if (!strcmp(key, "provides")) return parse_ifaces(ps, value, 1);
  if (!strcmp(key, "requires")) return parse_ifaces(ps, value, 0);
  if (!strcmp(key, "abi")) {
    unsigned major, minor;
    char tail;
    if (strchr(value, '-') || strchr(value, '+') ||
        sscanf(value, "%u.%u%c", &major, &minor, &tail) != 2 || major == 0) {
      snprintf(ps->error, sizeof ps->error, "abi '%s' must be MAJOR.MINOR (major >= 1)",
               value);
      return 0;
    }
    m->abi_major = major;
    m->abi_minor = minor;
    return 1;
  }
  snprintf(ps->error, sizeof ps->error, "unknown key '%s' (known: name, version, abi, "
           "provides, requires, library, description)", key);
  return 0;
}

tsr_status tsr_manifest_read(const char *path, struct tsr_manifest *out) {
  memset(out, 0, sizeof *out);
  if (strlen(path) >= sizeof out->path)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "manifest path too long: %s", path);
  strcpy(out->path, path);
  strcpy(out->dir, path);
  char *slash = strrchr(out->dir, '/');
  if (slash) *slash = '\0';
  else strcpy(out->dir, ".");

  FILE *f;
  if (tsr_file_fopen(path, &f) != TSR_OK) {
    tsr_error_prefix("plugin manifest");
    return TSR_ERR_IO;
  }
  /* inih reads lines of at most INI_LINE_MAX bytes and parses the rest of a longer
  ** one as a line of its own: name the long line instead of that remainder */
  char line[4096];
  for (int n = 1; fgets(line, sizeof line, f); n++) {
    const size_t len = strcspn(line, "\r\n");
    if (len >= INI_LINE_MAX) {
      fclose(f);
      return tsr_error_set(TSR_ERR_FORMAT, "%s:%d: the line is %s%zu bytes long; a manifest's "
                           "lines hold at most %d", path, n, len == sizeof line - 1 ? "at least " : "", len,
                           INI_LINE_MAX - 1);
    }
  }
  rewind(f);
  struct parse_state ps = {.m = out};
  int rc = ini_parse_file(f, on_entry, &ps);
  fclose(f);
  if (ps.error[0]) return tsr_error_set(TSR_ERR_FORMAT, "%s:%d: %s", path, rc, ps.error);
  if (rc > 0) return tsr_error_set(TSR_ERR_FORMAT, "%s:%d: not INI syntax", path, rc);
  if (rc < 0) return tsr_error_set(TSR_ERR_IO, "%s: cannot read", path);
  const char *missing = !ps.seen_plugin_section ? "[plugin] section"
                        : !out->name[0]         ? "name"
                        : !out->version[0]      ? "version"
                        : !out->abi_major       ? "abi"
                        : !out->n_provides      ? "provides"
                                                : NULL;
  if (missing) return tsr_error_set(TSR_ERR_FORMAT, "%s: missing %s", path, missing);
  return TSR_OK;
}

void tsr_manifest_format_ifaces(const struct tsr_manifest *m, int provides, char *buf, size_t n) {
  int count = provides ? m->n_provides : m->n_requires;
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < count && used < n; i++) {
    const char *name = provides ? m->provides[i].name : m->requires[i].name;
    uint32_t ver = provides ? m->provides[i].version : m->requires[i].version;
    int w = snprintf(buf + used, n - used, "%s%s:%u", i ? ", " : "", name, ver);
    if (w < 0) break;
    used += (size_t)w;
  }
}

/* Same interfaces in any order. */
static int same_ifaces(const struct tsr_manifest *m, int provides, const struct tsr_plugin_iface *d,
                       uint32_t nd) {
  int n = provides ? m->n_provides : m->n_requires;
  if ((uint32_t)n != nd) return 0;
  for (int i = 0; i < n; i++) {
    const char *name = provides ? m->provides[i].name : m->requires[i].name;
    uint32_t ver = provides ? m->provides[i].version : m->requires[i].version;
    int found = 0;
    for (uint32_t j = 0; j < nd && !found; j++) found = !strcmp(d[j].name, name) && d[j].version == ver;
    if (!found) return 0;
  }
  return 1;
}

static void format_desc_ifaces(const struct tsr_plugin_iface *d, uint32_t n, char *buf, size_t cap) {
  size_t used = 0;
  buf[0] = '\0';
  for (uint32_t i = 0; i < n && used < cap; i++) {
    int w = snprintf(buf + used, cap - used, "%s%s:%u", i ? ", " : "", d[i].name, d[i].version);
    if (w < 0) break;
    used += (size_t)w;
  }
}

tsr_status tsr_manifest_check(const struct tsr_manifest *m, const struct tsr_plugin_descriptor *d) {
  if (strcmp(m->name, d->name))
    return tsr_error_set(TSR_ERR_FORMAT, "%s says name '%s', the library says '%s'", m->path,
                         m->name, d->name);
  if (strcmp(m->version, d->version))
    return tsr_error_set(TSR_ERR_FORMAT, "%s says version %s, the library %s is version %s",
                         m->path, m->version, d->name, d->version);
  if (m->abi_major != d->abi_major || m->abi_minor != d->abi_minor)
    return tsr_error_set(TSR_ERR_FORMAT, "%s says ABI %u.%u, the library %s was built for %u.%u",
                         m->path, m->abi_major, m->abi_minor, d->name, d->abi_major, d->abi_minor);
  for (int provides = 1; provides >= 0; provides--) {
    const struct tsr_plugin_iface *di = provides ? d->provides : d->requires;
    uint32_t dn = provides ? d->n_provides : d->n_requires;
    /* a count that disagrees is not trusted: the array behind it is never read */
    const int mn = provides ? m->n_provides : m->n_requires;
    if ((uint32_t)mn != dn)
      return tsr_error_set(TSR_ERR_FORMAT, "%s lists %d interfaces it %s, the library %s "
                           "counts %u", m->path, mn, provides ? "provides" : "requires", d->name,
                           dn);
    if (!same_ifaces(m, provides, di, dn)) {
      char a[256], b[256];
      tsr_manifest_format_ifaces(m, provides, a, sizeof a);
      format_desc_ifaces(di, dn, b, sizeof b);
      return tsr_error_set(TSR_ERR_FORMAT, "%s says %s '%s', the library %s declares '%s'",
                           m->path, provides ? "provides" : "requires", a, d->name, b);
    }
  }
  return TSR_OK;
}
