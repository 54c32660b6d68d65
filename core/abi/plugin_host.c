/* Plugin loading, the services table, the registry and engagement counts. */
#include <dirent.h>
#include <limits.h>
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"
#include "model/gguf.h"
#include "abi/plugin_host_internal.h"

#ifndef TSR_BUILD_PLUGIN_DIR
#define TSR_BUILD_PLUGIN_DIR ""
#endif
#ifndef TSR_INSTALL_PLUGIN_DIR
#define TSR_INSTALL_PLUGIN_DIR ""
#endif

/* ---- settings ------------------------------------------------------------ */

static tsr_status validate_value(const struct tsr_plugin *p, const struct tsr_plugin_setting *d,
                                 const char *value, const char *where) {
  const char *who = p->desc->name;
  char *end;
  errno = 0;
  switch (d->type) {
  case TSR_SETTING_INT: {
    long long v = strtoll(value, &end, 10);
    if (errno || end == value || *end)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: plugin %s setting '%s': '%s' is not an "
                           "integer", where, who, d->key, value);
    if (d->min <= d->max && ((double)v < d->min || (double)v > d->max))
      return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: plugin %s setting '%s': %lld is outside "
                           "[%.17g, %.17g]", where, who, d->key, v, d->min, d->max);
    return TSR_OK;
  }
  case TSR_SETTING_FLOAT: {
    double v = strtod(value, &end);
    if (errno || end == value || *end || !isfinite(v))
      return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: plugin %s setting '%s': '%s' is not a "
                           "number", where, who, d->key, value);
    if (d->min <= d->max && (v < d->min || v > d->max))
      return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: plugin %s setting '%s': %g is outside "
                           "[%g, %g]", where, who, d->key, v, d->min, d->max);
    return TSR_OK;
  }
  case TSR_SETTING_BOOL:
    if (strcmp(value, "true") && strcmp(value, "false"))
      return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: plugin %s setting '%s': '%s' is not true or "
                           "false", where, who, d->key, value);
    return TSR_OK;
  case TSR_SETTING_STRING:
    return TSR_OK;
  case TSR_SETTING_ENUM: {
    const char *c = d->choices ? d->choices : "";
    size_t n = strlen(value);
    for (const char *s = c; *s;) {
      const char *bar = strchr(s, '|');
      size_t len = bar ? (size_t)(bar - s) : strlen(s);
      if (len == n && !strncmp(s, value, n)) return TSR_OK;
      s += len + (bar ? 1 : 0);
    }
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: plugin %s setting '%s': '%s' is not one of %s",
                         where, who, d->key, value, c);
  }
  }
  return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin %s declares setting '%s' with unknown type %d",
                       who, d->key, (int)d->type);
}

static tsr_status apply_settings(struct tsr_plugin *p, const struct tsr_setting_value *given,
                                 int n_given) {
  const struct tsr_plugin_descriptor *d = p->desc;
  if (d->n_settings > TSR_PLUGIN_MAX_SETTINGS)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin %s declares %u settings (at most %d)",
                         d->name, d->n_settings, TSR_PLUGIN_MAX_SETTINGS);
  for (int i = 0; i < n_given; i++) {
    const struct tsr_plugin_setting *decl = NULL;
    for (uint32_t j = 0; j < d->n_settings && !decl; j++)
      if (!strcmp(d->settings[j].key, given[i].key)) decl = &d->settings[j];
    if (!decl) {
      char known[512] = "";
      size_t used = 0;
      for (uint32_t j = 0; j < d->n_settings && used < sizeof known; j++)
        used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", j ? ", " : "",
                                 d->settings[j].key);
      return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: plugin %s has no setting '%s' (settings: %s)",
                           given[i].where, d->name, given[i].key, d->n_settings ? known : "none");
    }
  }
  p->n_settings = 0;
  for (uint32_t j = 0; j < d->n_settings; j++) {
    const struct tsr_plugin_setting *decl = &d->settings[j];
    const char *value = decl->default_value ? decl->default_value : "";
    const char *where = "default";
    for (int i = 0; i < n_given; i++)
      if (!strcmp(given[i].key, decl->key)) value = given[i].value, where = given[i].where;
    tsr_status st = validate_value(p, decl, value, where);
    if (st != TSR_OK) return st;
    struct plugin_setting *s = &p->settings[p->n_settings++];
    s->decl = decl;
    if (strlen(value) >= sizeof s->value)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: plugin %s setting '%s' is too long", where,
                           d->name, decl->key);
    strcpy(s->value, value);
  }
  return TSR_OK;
}

/* ---- loading ----------------------------------------------------------- */

static tsr_status check_descriptor(const struct tsr_plugin_descriptor *d, const char *where) {
  if (!d) return tsr_error_set(TSR_ERR_FORMAT, "%s: the entry point returned no descriptor", where);
  if (d->abi_major != TSR_PLUGIN_ABI_MAJOR)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: plugin built for ABI %u.%u, this tessera has "
                         "ABI %d.%d (majors must match)", where, d->abi_major, d->abi_minor,
                         TSR_PLUGIN_ABI_MAJOR, TSR_PLUGIN_ABI_MINOR);
  if (d->abi_minor > TSR_PLUGIN_ABI_MINOR)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "%s: plugin built for ABI %u.%u, newer than this "
                         "tessera's ABI %d.%d", where, d->abi_major, d->abi_minor,
                         TSR_PLUGIN_ABI_MAJOR, TSR_PLUGIN_ABI_MINOR);
  if (d->struct_size < offsetof(struct tsr_plugin_descriptor, destroy) + sizeof d->destroy)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: descriptor struct_size %u is too small", where,
                         d->struct_size);
  if (!d->name || !*d->name || !d->version || !d->init || (d->n_provides && !d->provides) ||
      (d->n_requires && !d->requires) || (d->n_settings && !d->settings))
    return tsr_error_set(TSR_ERR_FORMAT, "%s: descriptor lacks a name, version, init or a list it "
                         "counts", where);
  return TSR_OK;
}

/* Registers a plugin whose descriptor is in hand (built-in or dlopened). */
static tsr_status attach(struct tsr_plugin_host *h, const struct tsr_plugin_descriptor *d,
                         const struct tsr_manifest *m, const char *library,
                         const struct tsr_setting_value *settings, int n_settings,
                         struct tsr_plugin **out) {
  const char *where = library && *library ? library : "built-in";
  tsr_status st = check_descriptor(d, where);
  if (st != TSR_OK) return st;
  if (m && (st = tsr_manifest_check(m, d)) != TSR_OK) return st;
  if (tsr_plugin_host_find_plugin(h, d->name))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: a plugin named '%s' is already loaded", where,
                         d->name);
  if (h->n_plugins == TSR_HOST_MAX_PLUGINS)
    return tsr_error_set(TSR_ERR_NOMEM, "more than %d plugins", TSR_HOST_MAX_PLUGINS);
  struct tsr_plugin *p = calloc(1, sizeof *p);
  if (!p) return tsr_error_set(TSR_ERR_NOMEM, "out of memory loading %s", d->name);
  p->host = h;
  p->desc = d;
  if (m) p->manifest = *m;
  snprintf(p->library, sizeof p->library, "%s", library ? library : "");
  st = apply_settings(p, settings, n_settings);
  if (st == TSR_OK) {
    h->plugins[h->n_plugins++] = p; /* visible to registration checks */
    st = d->init(tsr_plugin_host_services(), p);
    if (st != TSR_OK) {
      tsr_error_prefix("plugin %s %s: init failed", d->name, d->version);
      tsr_plugin_host_unregister(h, p);
      h->n_plugins--;
    }
  }
  if (st != TSR_OK) {
    free(p); /* the library stays mapped: it may have started threads */
    return st;
  }
  if (out) *out = p;
  return TSR_OK;
}

static bool is_file(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static bool is_dir(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

/* The manifest path for a name on the search path, or for an explicit path. */
static tsr_status locate_manifest(const struct tsr_plugin_host *h, const char *name,
                                  const char *path, char *out, size_t cap) {
  if (path) {
    if (is_dir(path)) snprintf(out, cap, "%s/plugin.ini", path);
    else if (ends_with(path, ".ini")) snprintf(out, cap, "%s", path);
    else {
      const char *slash = strrchr(path, '/');
      int dir_len = slash ? (int)(slash - path) : 1;
      snprintf(out, cap, "%.*s/plugin.ini", dir_len, slash ? path : ".");
    }
    if (!is_file(out))
      return tsr_error_set(TSR_ERR_IO, "plugin %s: no manifest at %s", name ? name : path, out);
    return TSR_OK;
  }
  for (int i = 0; i < h->n_dirs; i++) {
    snprintf(out, cap, "%s/%s/plugin.ini", h->dirs[i], name);
    if (is_file(out)) return TSR_OK;
  }
  char dirs[2048] = "";
  size_t used = 0;
  for (int i = 0; i < h->n_dirs && used < sizeof dirs; i++)
    used += (size_t)snprintf(dirs + used, sizeof dirs - used, "%s%s", i ? ":" : "", h->dirs[i]);
  return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin '%s' not found on the search path (%s); set "
                       "TESSERA_PLUGIN_PATH or give its path", name, h->n_dirs ? dirs : "empty");
}

tsr_status tsr_plugin_host_load(struct tsr_plugin_host *h, const char *name, const char *path,
                                const struct tsr_setting_value *settings, int n_settings,
                                struct tsr_plugin **out) {
  if (out) *out = NULL;
  if (!name && !path) return tsr_error_set(TSR_ERR_INVALID_ARG, "load: no plugin name or path");
  char ini[1100];
  tsr_status st = locate_manifest(h, name, path, ini, sizeof ini);
  if (st != TSR_OK) return st;
  struct tsr_manifest m;
  if ((st = tsr_manifest_read(ini, &m)) != TSR_OK) return st;
  if (name && strcmp(m.name, name))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s names plugin '%s', not '%s'", ini, m.name, name);
  if (!m.library[0])
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "plugin %s %s has no code yet (%s names no "
                         "library)", m.name, m.version, ini);
  if (strchr(m.library, '/'))
    return tsr_error_set(TSR_ERR_FORMAT, "%s: library '%s' must be a file name in the plugin's "
                         "folder", ini, m.library);
  char lib[1400];
  if (path && !is_dir(path) && !ends_with(path, ".ini")) snprintf(lib, sizeof lib, "%s", path);
  else snprintf(lib, sizeof lib, "%s/%s", m.dir, m.library);
  /* RTLD_LOCAL keeps the plugin's symbols out of everyone else's way; it is
  ** never dlclosed (threads or callbacks of it may outlive any unload) */
  void *dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!dl) return tsr_error_set(TSR_ERR_IO, "plugin %s: cannot load %s: %s", m.name, lib, dlerror());
  tsr_plugin_entry_fn entry;
  *(void **)&entry = dlsym(dl, TSR_PLUGIN_ENTRY_SYMBOL);
  if (!entry)
    return tsr_error_set(TSR_ERR_FORMAT, "plugin %s: %s does not export %s", m.name, lib,
                         TSR_PLUGIN_ENTRY_SYMBOL);
  return attach(h, entry(), &m, lib, settings, n_settings, out);
}

/* ---- host lifetime and search path --------------------------------------- */

static void add_dir(struct tsr_plugin_host *h, const char *dir) {
  if (!dir || !*dir || h->n_dirs == TSR_HOST_MAX_DIRS || strlen(dir) >= sizeof h->dirs[0]) return;
  for (int i = 0; i < h->n_dirs; i++)
    if (!strcmp(h->dirs[i], dir)) return;
  strcpy(h->dirs[h->n_dirs++], dir);
}

/* Rebuilds the default part of the path after the caller's directories. */
static void reset_default_dirs(struct tsr_plugin_host *h) {
  h->n_dirs = h->n_caller_dirs;
  const char *env = getenv("TESSERA_PLUGIN_PATH");
  if (env) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", env);
    for (char *save = NULL, *d = strtok_r(buf, ":", &save); d; d = strtok_r(NULL, ":", &save))
      add_dir(h, d);
  }
  /* the build tree beside this executable, wherever the tree was copied */
  char exe_dir[1024];
  if (tsr_exe_dir(exe_dir, sizeof exe_dir) == TSR_OK) {
    char rel[1100], real[PATH_MAX];
    snprintf(rel, sizeof rel, "%s/../../plugins", exe_dir);
    if (is_dir(rel) && realpath(rel, real)) add_dir(h, real);
  }
  add_dir(h, TSR_BUILD_PLUGIN_DIR);
  add_dir(h, TSR_INSTALL_PLUGIN_DIR);
}

tsr_status tsr_plugin_host_new(struct tsr_plugin_host **out) {
  *out = NULL;
  struct tsr_plugin_host *h = calloc(1, sizeof *h);
  if (!h) return tsr_error_set(TSR_ERR_NOMEM, "out of memory creating the plugin host");
  pthread_mutex_init(&h->counter_lock, NULL);
  reset_default_dirs(h);
  tsr_status st = attach(h, tsr_builtin_core_descriptor(), NULL, NULL, NULL, 0, NULL);
  if (st != TSR_OK) {
    tsr_plugin_host_free(h);
    return st;
  }
  *out = h;
  return TSR_OK;
}

void tsr_plugin_host_free(struct tsr_plugin_host *h) {
  if (!h) return;
  for (int i = h->n_plugins - 1; i >= 0; i--) {
    struct tsr_plugin *p = h->plugins[i];
    if (p->desc->destroy) p->desc->destroy(tsr_plugin_host_services(), p);
    free(p);
  }
  pthread_mutex_destroy(&h->counter_lock);
  free(h);
}

tsr_status tsr_plugin_host_add_search_dir(struct tsr_plugin_host *h, const char *dir) {
  if (h->n_caller_dirs == TSR_HOST_MAX_DIRS - 4 || strlen(dir) >= sizeof h->dirs[0])
    return tsr_error_set(TSR_ERR_INVALID_ARG, "cannot add plugin directory %s", dir);
  h->n_dirs = h->n_caller_dirs;
  add_dir(h, dir);
  h->n_caller_dirs = h->n_dirs;
  reset_default_dirs(h);
  return TSR_OK;
}

int tsr_plugin_host_n_search_dirs(const struct tsr_plugin_host *h) { return h->n_dirs; }
const char *tsr_plugin_host_search_dir(const struct tsr_plugin_host *h, int i) {
  return (i >= 0 && i < h->n_dirs) ? h->dirs[i] : NULL;
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const struct tsr_manifest *)a)->name, ((const struct tsr_manifest *)b)->name);
}

tsr_status tsr_plugin_host_scan(struct tsr_plugin_host *h, struct tsr_manifest **list, int *n,
                                void (*on_error)(void *user, const char *message), void *user) {
  *list = NULL;
  *n = 0;
  int cap = 0;
  for (int d = 0; d < h->n_dirs; d++) {
    DIR *dir = opendir(h->dirs[d]);
    if (!dir) continue; /* a search directory that does not exist holds nothing */
    struct dirent *e;
    while ((e = readdir(dir))) {
      if (e->d_name[0] == '.') continue;
      char ini[1400];
      snprintf(ini, sizeof ini, "%s/%s/plugin.ini", h->dirs[d], e->d_name);
      if (!is_file(ini)) continue;
      struct tsr_manifest m;
      if (tsr_manifest_read(ini, &m) != TSR_OK) {
        if (on_error) on_error(user, tsr_error_message());
        continue;
      }
      bool seen = false; /* earlier directories win */
      for (int i = 0; i < *n && !seen; i++) seen = !strcmp((*list)[i].name, m.name);
      if (seen) continue;
      if (*n == cap) {
        cap = cap ? 2 * cap : 16;
        struct tsr_manifest *grown = realloc(*list, (size_t)cap * sizeof *grown);
        if (!grown) {
          closedir(dir);
          return tsr_error_set(TSR_ERR_NOMEM, "out of memory listing plugins");
        }
        *list = grown;
      }
      (*list)[(*n)++] = m;
    }
    closedir(dir);
  }
  if (*n) qsort(*list, (size_t)*n, sizeof **list, by_name);
  return TSR_OK;
}

/* A broken manifest elsewhere on the path does not stop a search, but is said. */
static void warn_bad_manifest(void *user, const char *message) {
  (void)user;
  fprintf(stderr, "tessera: skipping a plugin: %s\n", message);
}

/* A plugin that does not load is one provider fewer, not a failure of the search:
** the caller fails only when what it asks for is then missing, and the warning
** says which plugin it might have been. */
tsr_status tsr_plugin_host_load_providers(struct tsr_plugin_host *h, const char *iface) {
  struct tsr_manifest *list = NULL;
  int n = 0;
  tsr_status st = tsr_plugin_host_scan(h, &list, &n, warn_bad_manifest, NULL);
  for (int i = 0; i < n && st == TSR_OK; i++) {
    bool provides = false;
    for (int j = 0; j < list[i].n_provides; j++) provides |= !strcmp(list[i].provides[j].name, iface);
    if (!provides || !list[i].library[0] || tsr_plugin_host_find_plugin(h, list[i].name)) continue;
    if (tsr_plugin_host_load(h, list[i].name, list[i].dir, NULL, 0, NULL) != TSR_OK)
      warn_bad_manifest(NULL, tsr_error_message());
  }
  free(list);
  return st;
}

/* ---- registry lookups ---------------------------------------------------- */

static const struct registered *find_cap(const struct cap_list *list, const char *name) {
  for (int i = 0; i < list->n; i++)
    if (!strcmp(list->items[i].u.attention.name, name)) return &list->items[i];
  return NULL;
}

#define LOOKUP(fn, type, list, member)                                                  \
  const type *fn(const struct tsr_plugin_host *h, const char *name,                    \
                 const struct tsr_plugin **owner) {                                    \
    const struct registered *r = name ? find_cap(&h->list, name) : NULL;               \
    if (owner) *owner = r ? r->owner : NULL;                                            \
    return r ? &r->u.member : NULL;                                                     \
  }
LOOKUP(tsr_plugin_host_attention, struct tsr_attention_v1, attention, attention)
LOOKUP(tsr_plugin_host_kv_codec, struct tsr_kv_codec_v1, codecs, codec)
LOOKUP(tsr_plugin_host_decode_policy, struct tsr_decode_policy_v1, policies, policy)
LOOKUP(tsr_plugin_host_speculator, struct tsr_speculator_v1, speculators, speculator)
#undef LOOKUP

/* Whether a comma-separated list holds item. */
static bool list_has(const char *list, const char *item) {
  size_t n = strlen(item);
  for (const char *s = list; s && *s;) {
    while (*s == ' ' || *s == ',') s++;
    size_t len = strcspn(s, ", ");
    if (len == n && !strncmp(s, item, n)) return true;
    s += len;
  }
  return false;
}

const struct tsr_arch_v1 *tsr_plugin_host_arch(const struct tsr_plugin_host *h, const char *arch,
                                               const struct tsr_plugin **owner) {
  for (int i = 0; i < h->archs.n; i++)
    if (list_has(h->archs.items[i].u.arch.names, arch)) {
      if (owner) *owner = h->archs.items[i].owner;
      return &h->archs.items[i].u.arch;
    }
  if (owner) *owner = NULL;
  return NULL;
}

static const struct cap_list *list_for(const struct tsr_plugin_host *h, const char *iface) {
  if (!strcmp(iface, TSR_IFACE_ATTENTION)) return &h->attention;
  if (!strcmp(iface, TSR_IFACE_KV_CODEC)) return &h->codecs;
  if (!strcmp(iface, TSR_IFACE_ARCH)) return &h->archs;
  if (!strcmp(iface, TSR_IFACE_CONVERT)) return &h->converters;
  if (!strcmp(iface, TSR_IFACE_DECODE_POLICY)) return &h->policies;
  if (!strcmp(iface, TSR_IFACE_SPECULATOR)) return &h->speculators;
  return NULL;
}

void tsr_plugin_host_list_names(const struct tsr_plugin_host *h, const char *iface, char *buf,
                                size_t n) {
  const struct cap_list *list = list_for(h, iface);
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; list && i < list->n && used < n; i++)
    used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? ", " : "",
                             list->items[i].u.attention.name);
  if (!buf[0]) snprintf(buf, n, "none");
}

void tsr_plugin_host_unregister(struct tsr_plugin_host *h, const struct tsr_plugin *p) {
  struct cap_list *lists[] = {&h->attention, &h->codecs,   &h->archs,
                              &h->converters, &h->policies, &h->speculators};
  for (size_t l = 0; l < sizeof lists / sizeof lists[0]; l++) {
    struct cap_list *list = lists[l];
    int kept = 0;
    for (int i = 0; i < list->n; i++)
      if (list->items[i].owner != p) list->items[kept++] = list->items[i];
    list->n = kept;
  }
}

tsr_status tsr_plugin_host_check_requires(const struct tsr_plugin_host *h) {
  for (int i = 0; i < h->n_plugins; i++) {
    const struct tsr_plugin_descriptor *d = h->plugins[i]->desc;
    for (uint32_t r = 0; r < d->n_requires; r++) {
      bool found = false;
      for (int j = 0; j < h->n_plugins && !found; j++) {
        const struct tsr_plugin_descriptor *o = h->plugins[j]->desc;
        for (uint32_t k = 0; k < o->n_provides && !found; k++)
          found = !strcmp(o->provides[k].name, d->requires[r].name) &&
                  o->provides[k].version == d->requires[r].version;
      }
      if (!found)
        return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin %s requires %s:%u, which no loaded "
                             "plugin provides", d->name, d->requires[r].name,
                             d->requires[r].version);
    }
  }
  return TSR_OK;
}

/* ---- loaded plugins and engagement ---------------------------------------- */

int tsr_plugin_host_n_plugins(const struct tsr_plugin_host *h) { return h->n_plugins; }
const struct tsr_plugin *tsr_plugin_host_plugin(const struct tsr_plugin_host *h, int i) {
  return (i >= 0 && i < h->n_plugins) ? h->plugins[i] : NULL;
}
const struct tsr_plugin *tsr_plugin_host_find_plugin(const struct tsr_plugin_host *h,
                                                     const char *name) {
  for (int i = 0; i < h->n_plugins; i++)
    if (!strcmp(h->plugins[i]->desc->name, name)) return h->plugins[i];
  return NULL;
}
const char *tsr_plugin_name(const struct tsr_plugin *p) { return p->desc->name; }
const char *tsr_plugin_version(const struct tsr_plugin *p) { return p->desc->version; }

void tsr_plugin_provides(const struct tsr_plugin *p, char *out, size_t cap) {
  size_t used = 0;
  if (cap) out[0] = '\0';
  for (uint32_t i = 0; i < p->desc->n_provides && used < cap; i++) {
    const int n = snprintf(out + used, cap - used, "%s%s:%u", i ? ", " : "",
                           p->desc->provides[i].name, p->desc->provides[i].version);
    if (n < 0) break;
    used += (size_t)n;
  }
}
const char *tsr_plugin_library(const struct tsr_plugin *p) { return p->library; }

uint64_t tsr_plugin_engaged_total(const struct tsr_plugin *p) {
  pthread_mutex_lock(&p->host->counter_lock);
  uint64_t total = 0;
  for (int i = 0; i < p->n_counters; i++) total += p->counters[i].value;
  pthread_mutex_unlock(&p->host->counter_lock);
  return total;
}

uint64_t tsr_plugin_engaged(const struct tsr_plugin *p, const char *counter) {
  pthread_mutex_lock(&p->host->counter_lock);
  uint64_t n = 0;
  for (int i = 0; i < p->n_counters; i++)
    if (!strcmp(p->counters[i].name, counter)) n = p->counters[i].value;
  pthread_mutex_unlock(&p->host->counter_lock);
  return n;
}

void tsr_plugin_host_reset_engagement(struct tsr_plugin_host *h) {
  pthread_mutex_lock(&h->counter_lock);
  for (int i = 0; i < h->n_plugins; i++) h->plugins[i]->n_counters = 0;
  pthread_mutex_unlock(&h->counter_lock);
}

void tsr_plugin_host_print_engagement(const struct tsr_plugin_host *h, FILE *f) {
  pthread_mutex_lock((pthread_mutex_t *)&h->counter_lock);
  for (int i = 0; i < h->n_plugins; i++) {
    const struct tsr_plugin *p = h->plugins[i];
    fprintf(f, "  %-12s", p->desc->name);
    if (!p->n_counters) fprintf(f, " did nothing");
    for (int c = 0; c < p->n_counters; c++)
      fprintf(f, "%s %s=%llu", c ? "," : "", p->counters[c].name,
              (unsigned long long)p->counters[c].value);
    fputc('\n', f);
  }
  pthread_mutex_unlock((pthread_mutex_t *)&h->counter_lock);
}

void tsr_plugin_host_each_counter(const struct tsr_plugin_host *h,
                                  void (*fn)(void *ctx, const char *plugin, const char *counter,
                                             uint64_t value),
                                  void *ctx) {
  pthread_mutex_lock((pthread_mutex_t *)&h->counter_lock);
  for (int i = 0; i < h->n_plugins; i++)
    for (int c = 0; c < h->plugins[i]->n_counters; c++)
      fn(ctx, h->plugins[i]->desc->name, h->plugins[i]->counters[c].name,
         h->plugins[i]->counters[c].value);
  pthread_mutex_unlock((pthread_mutex_t *)&h->counter_lock);
}

void tsr_plugin_host_print_decode_counters(const struct tsr_plugin_host *h, FILE *f) {
  static const char *const kinds[] = {"full", "sliding"};
  for (int i = 0; i < h->n_plugins; i++)
    for (int k = 0; k < 2; k++) {
      char name[48];
      uint64_t v[4];
      static const char *const what[] = {"v_rows_read", "v_rows_skipped", "query_rows",
                                         "mass_dropped_e9"};
      for (int w = 0; w < 4; w++) {
        snprintf(name, sizeof name, "%s.%s", kinds[k], what[w]);
        v[w] = tsr_plugin_engaged(h->plugins[i], name);
      }
      if (!v[0]) continue;
      fprintf(f, "decode policy %s, %s layers: %llu of %llu V rows skipped (%.1f%%), %.3g of a "
              "row's softmax mass dropped on average\n", h->plugins[i]->desc->name, kinds[k],
              (unsigned long long)v[1], (unsigned long long)v[0],
              100.0 * (double)v[1] / (double)v[0],
              v[2] ? (double)v[3] / TSR_DECODE_MASS_UNIT / (double)v[2] : 0.0);
    }
}

tsr_status tsr_plugin_host_require_engaged(const struct tsr_plugin_host *h,
                                           const char *const *names, int n) {
  for (int i = 0; i < n; i++) {
    const struct tsr_plugin *p = tsr_plugin_host_find_plugin(h, names[i]);
    if (!p)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "--require-engaged %s: no plugin of that name is "
                           "loaded", names[i]);
    if (!tsr_plugin_engaged_total(p))
      return tsr_error_set(TSR_ERR_INTERNAL, "--require-engaged %s: plugin %s %s never engaged "
                           "in this run", names[i], p->desc->name, p->desc->version);
  }
  return TSR_OK;
}
