/*
** The plugin host: finds plugins (manifests on a search path), loads them
** (dlopen, ABI and manifest checks, settings validation, init), keeps the
** registry of what they provide, negotiates a composition for a model's
** layers, and counts what each plugin actually did.
**
** Search path, in order: directories added by the caller (paths relative to
** a profile), $TESSERA_PLUGIN_PATH (colon-separated), the build tree's
** plugin folder, the install prefix's. A plugin lives in <dir>/<name>/ with
** its plugin.ini and the library the manifest names.
*/
#ifndef TSR_PLUGIN_HOST_H
#define TSR_PLUGIN_HOST_H

#include <stdbool.h>
#include <stdio.h>

#include "abi/plugin_manifest.h"
#include "tessera/plugin.h"

struct tsr_plugin_host;

/* A setting from a profile: its key, its scalar text and where it was
** written ("conf/x.yaml:12:7"), for messages. */
struct tsr_setting_value {
  const char *key;
  const char *value;
  const char *where;
};

/* Creates a host with the core's built-in plugin ("core": the `flash`
** attention and the scalar KV codecs) already registered. */
tsr_status tsr_plugin_host_new(struct tsr_plugin_host **out);
void tsr_plugin_host_free(struct tsr_plugin_host *h);

tsr_status tsr_plugin_host_add_search_dir(struct tsr_plugin_host *h, const char *dir);
/* The directories searched, in order (the core's defaults included). */
int tsr_plugin_host_n_search_dirs(const struct tsr_plugin_host *h);
const char *tsr_plugin_host_search_dir(const struct tsr_plugin_host *h, int i);

/* Every plugin.ini found on the search path (first one wins per name);
** manifests that fail to parse are reported through on_error and skipped
** from the list, so one bad folder does not hide the rest. */
tsr_status tsr_plugin_host_scan(struct tsr_plugin_host *h, struct tsr_manifest **list, int *n,
                                void (*on_error)(void *user, const char *message), void *user);

/* Loads plugin `name` from the search path, or from `path` (a plugin
** folder, its plugin.ini, or its library file) when not NULL. */
tsr_status tsr_plugin_host_load(struct tsr_plugin_host *h, const char *name, const char *path,
                                const struct tsr_setting_value *settings, int n_settings,
                                struct tsr_plugin **out);

/* Loads every plugin on the search path whose manifest provides iface and
** names a library (those already loaded are kept), e.g. all arch plugins so
** a model's architecture can be found by name. A plugin that fails to load is
** skipped with a warning naming it (stderr): only a caller that then lacks what
** it asked for fails. */
tsr_status tsr_plugin_host_load_providers(struct tsr_plugin_host *h, const char *iface);

/* Every interface a loaded plugin requires is provided by a loaded one. */
tsr_status tsr_plugin_host_check_requires(const struct tsr_plugin_host *h);

/* ---- the registry ---- */
const struct tsr_attention_v1 *tsr_plugin_host_attention(const struct tsr_plugin_host *h,
                                                         const char *name,
                                                         const struct tsr_plugin **owner);
const struct tsr_kv_codec_v1 *tsr_plugin_host_kv_codec(const struct tsr_plugin_host *h,
                                                       const char *name,
                                                       const struct tsr_plugin **owner);
/* by general.architecture value */
const struct tsr_arch_v1 *tsr_plugin_host_arch(const struct tsr_plugin_host *h, const char *arch,
                                               const struct tsr_plugin **owner);
const struct tsr_decode_policy_v1 *tsr_plugin_host_decode_policy(const struct tsr_plugin_host *h,
                                                                 const char *name,
                                                                 const struct tsr_plugin **owner);
const struct tsr_speculator_v1 *tsr_plugin_host_speculator(const struct tsr_plugin_host *h,
                                                           const char *name,
                                                           const struct tsr_plugin **owner);
/* "f16, q8_0, ..." — names registered for an interface, for messages. */
void tsr_plugin_host_list_names(const struct tsr_plugin_host *h, const char *iface, char *buf,
                                size_t n);

/* The host's services table (what plugins get in init). */
const struct tsr_host *tsr_plugin_host_services(void);

/* ---- loaded plugins ---- */
int tsr_plugin_host_n_plugins(const struct tsr_plugin_host *h);
const struct tsr_plugin *tsr_plugin_host_plugin(const struct tsr_plugin_host *h, int i);
const struct tsr_plugin *tsr_plugin_host_find_plugin(const struct tsr_plugin_host *h,
                                                     const char *name);
const char *tsr_plugin_name(const struct tsr_plugin *p);
const char *tsr_plugin_version(const struct tsr_plugin *p);
/* What the plugin's descriptor says it provides, "attention:1, kv_codec:1", into out. */
void tsr_plugin_provides(const struct tsr_plugin *p, char *out, size_t cap);
const char *tsr_plugin_library(const struct tsr_plugin *p); /* "" for built-in */

/* ---- engagement ---- */
/* Total of all of a plugin's counters. */
uint64_t tsr_plugin_engaged_total(const struct tsr_plugin *p);
/* One counter of a plugin; 0 when it never counted it. */
uint64_t tsr_plugin_engaged(const struct tsr_plugin *p, const char *counter);
/* Zeroes every counter: setup work (e.g. building a graph only to plan its
** memory) is not what a run engaged. */
void tsr_plugin_host_reset_engagement(struct tsr_plugin_host *h);
/* Prints "name: counter=n, ..." for every loaded plugin. */
void tsr_plugin_host_print_engagement(const struct tsr_plugin_host *h, FILE *f);
/* fn(ctx, plugin, counter, value) for every counter of every plugin, under the counters'
** lock (fn must not count). */
void tsr_plugin_host_each_counter(const struct tsr_plugin_host *h,
                                  void (*fn)(void *ctx, const char *plugin, const char *counter,
                                             uint64_t value),
                                  void *ctx);
/* A line per decode policy and layer kind that weighed V rows on decode steps (the
** counters "<kind>.v_rows_read", ... the engine reports): rows skipped, their share,
** and the mean softmax mass a row dropped. Nothing where no policy acted. */
void tsr_plugin_host_print_decode_counters(const struct tsr_plugin_host *h, FILE *f);
/* Fails naming each plugin in names that never counted anything (or is
** not loaded at all). */
tsr_status tsr_plugin_host_require_engaged(const struct tsr_plugin_host *h,
                                           const char *const *names, int n);

#endif
