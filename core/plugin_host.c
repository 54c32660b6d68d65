/* Plugin loading, the services table, the registry and engagement counts. */
#include <dirent.h>
#include <limits.h>
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "convert.h"
#include "error.h"
#include "graph.h"
#include "gguf.h"
#include "op_registry.h"
#include "plugin_graph_api.h"
#include "plugin_host_internal.h"

#ifndef TSR_BUILD_PLUGIN_DIR
#define TSR_BUILD_PLUGIN_DIR ""
#endif
#ifndef TSR_INSTALL_PLUGIN_DIR
#define TSR_INSTALL_PLUGIN_DIR ""
#endif

/* ---- services table ------------------------------------------------------ */

static void host_log(struct tsr_plugin *self, enum tsr_log_level level, const char *fmt, ...) {
  static const char *names[] = {"debug", "info", "warn", "error"};
  if (level < TSR_LOG_INFO && !getenv("TESSERA_DEBUG")) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "[%s] %s: ", self ? self->desc->name : "?",
          (level >= 0 && level <= 3) ? names[level] : "log");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static tsr_status host_set_error(tsr_status st, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return tsr_error_set(st, "%s", msg);
}

static void host_set_state(struct tsr_plugin *self, void *state) { self->state = state; }
static void *host_get_state(const struct tsr_plugin *self) { return self->state; }

static const struct plugin_setting *find_setting(const struct tsr_plugin *p, const char *key) {
  for (int i = 0; i < p->n_settings; i++)
    if (!strcmp(p->settings[i].decl->key, key)) return &p->settings[i];
  return NULL;
}

static tsr_status setting_of_type(const struct tsr_plugin *p, const char *key,
                                  enum tsr_setting_type want, const struct plugin_setting **out) {
  const struct plugin_setting *s = find_setting(p, key);
  if (!s)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin %s asked for setting '%s', which it does "
                         "not declare", p->desc->name, key);
  bool ok = s->decl->type == want || (want == TSR_SETTING_STRING && s->decl->type == TSR_SETTING_ENUM);
  if (!ok)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin %s read setting '%s' with the wrong type",
                         p->desc->name, key);
  *out = s;
  return TSR_OK;
}

static tsr_status host_setting_i64(const struct tsr_plugin *self, const char *key, int64_t *out) {
  const struct plugin_setting *s;
  tsr_status st = setting_of_type(self, key, TSR_SETTING_INT, &s);
  if (st == TSR_OK) *out = strtoll(s->value, NULL, 10);
  return st;
}
static tsr_status host_setting_f64(const struct tsr_plugin *self, const char *key, double *out) {
  const struct plugin_setting *s;
  tsr_status st = setting_of_type(self, key, TSR_SETTING_FLOAT, &s);
  if (st == TSR_OK) *out = strtod(s->value, NULL);
  return st;
}
static tsr_status host_setting_bool(const struct tsr_plugin *self, const char *key, bool *out) {
  const struct plugin_setting *s;
  tsr_status st = setting_of_type(self, key, TSR_SETTING_BOOL, &s);
  if (st == TSR_OK) *out = !strcmp(s->value, "true");
  return st;
}
static tsr_status host_setting_str(const struct tsr_plugin *self, const char *key,
                                   const char **out) {
  const struct plugin_setting *s;
  tsr_status st = setting_of_type(self, key, TSR_SETTING_STRING, &s);
  if (st == TSR_OK) *out = s->value;
  return st;
}

/* Copies a plugin's struct: no more than it declared, no more than we know. */
static void copy_sized(void *dst, size_t dst_size, const void *src, uint32_t src_size) {
  memset(dst, 0, dst_size);
  memcpy(dst, src, src_size < dst_size ? src_size : dst_size);
}

static tsr_status add_cap(struct tsr_plugin *self, struct cap_list *list, const char *iface,
                          const char *name, const void *impl, uint32_t impl_size, size_t known) {
  if (!impl || impl_size < 2 * sizeof(void *) || !name || !*name)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin %s registered a %s without a name or "
                         "struct_size", self->desc->name, iface);
  bool provides = false;
  for (uint32_t i = 0; i < self->desc->n_provides; i++)
    provides |= !strcmp(self->desc->provides[i].name, iface);
  if (!provides)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin %s registered %s '%s' but its descriptor "
                         "does not provide %s", self->desc->name, iface, name, iface);
  for (int i = 0; i < list->n; i++) {
    const char *other = (const char *)*(const char *const *)((const char *)&list->items[i].u +
                                                             offsetof(struct tsr_attention_v1, name));
    if (!strcmp(other, name))
      return tsr_error_set(TSR_ERR_INVALID_ARG, "%s '%s' from plugin %s is already registered "
                           "by plugin %s", iface, name, self->desc->name,
                           list->items[i].owner->desc->name);
  }
  if (list->n == TSR_HOST_MAX_CAPS)
    return tsr_error_set(TSR_ERR_NOMEM, "more than %d %s registrations", TSR_HOST_MAX_CAPS, iface);
  struct registered *r = &list->items[list->n++];
  r->owner = self;
  copy_sized(&r->u, known, impl, impl_size);
  return TSR_OK;
}

/* Every v1 struct starts with struct_size then name, so the name sits at the
** same offset in each; checked here rather than assumed. */
_Static_assert(offsetof(struct tsr_attention_v1, name) == offsetof(struct tsr_kv_codec_v1, name),
               "name offset");
_Static_assert(offsetof(struct tsr_attention_v1, name) ==
                   offsetof(struct tsr_decode_policy_v1, name), "name offset");
_Static_assert(offsetof(struct tsr_attention_v1, name) == offsetof(struct tsr_speculator_v1, name),
               "name offset");
_Static_assert(offsetof(struct tsr_attention_v1, name) == offsetof(struct tsr_arch_v1, names),
               "name offset");

static tsr_status host_register_attention(struct tsr_plugin *self, const struct tsr_attention_v1 *a) {
  if (a && (!a->negotiate || !a->build))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin %s: attention '%s' lacks negotiate or build",
                         self->desc->name, a->name ? a->name : "?");
  return add_cap(self, &self->host->attention, TSR_IFACE_ATTENTION, a ? a->name : NULL, a,
                 a ? a->struct_size : 0, sizeof(struct tsr_attention_v1));
}

static tsr_status host_register_kv_codec(struct tsr_plugin *self, const struct tsr_kv_codec_v1 *c) {
  if (c && (c->block_size <= 0 || c->block_bytes == 0 || !c->encode_rows || !c->backends))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin %s: kv codec '%s' needs a block size, "
                         "block bytes, backends and encode_rows", self->desc->name,
                         c->name ? c->name : "?");
  return add_cap(self, &self->host->codecs, TSR_IFACE_KV_CODEC, c ? c->name : NULL, c,
                 c ? c->struct_size : 0, sizeof(struct tsr_kv_codec_v1));
}

static tsr_status host_register_arch(struct tsr_plugin *self, const struct tsr_arch_v1 *a) {
  if (a && !a->describe)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin %s: arch '%s' lacks describe",
                         self->desc->name, a->names ? a->names : "?");
  return add_cap(self, &self->host->archs, TSR_IFACE_ARCH, a ? a->names : NULL, a,
                 a ? a->struct_size : 0, sizeof(struct tsr_arch_v1));
}

static tsr_status host_register_decode_policy(struct tsr_plugin *self,
                                              const struct tsr_decode_policy_v1 *p) {
  return add_cap(self, &self->host->policies, TSR_IFACE_DECODE_POLICY, p ? p->name : NULL, p,
                 p ? p->struct_size : 0, sizeof(struct tsr_decode_policy_v1));
}

static tsr_status host_register_speculator(struct tsr_plugin *self,
                                           const struct tsr_speculator_v1 *s) {
  return add_cap(self, &self->host->speculators, TSR_IFACE_SPECULATOR, s ? s->name : NULL, s,
                 s ? s->struct_size : 0, sizeof(struct tsr_speculator_v1));
}

static void host_engaged(struct tsr_plugin *self, const char *counter, uint64_t n) {
  struct tsr_plugin_host *h = self->host;
  pthread_mutex_lock(&h->counter_lock);
  struct plugin_counter *c = NULL;
  for (int i = 0; i < self->n_counters && !c; i++)
    if (!strcmp(self->counters[i].name, counter)) c = &self->counters[i];
  if (!c && self->n_counters < TSR_PLUGIN_MAX_COUNTERS) {
    c = &self->counters[self->n_counters++];
    snprintf(c->name, sizeof c->name, "%s", counter);
    c->value = 0;
  }
  if (c) c->value += n;
  pthread_mutex_unlock(&h->counter_lock);
}

static tsr_status host_register_op(struct tsr_plugin *self, const char *name, int32_t *op_id) {
  char full[64];
  /* op names are namespaced by plugin so two plugins cannot collide */
  if ((size_t)snprintf(full, sizeof full, "%s.%s", self->desc->name, name) >= sizeof full)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin %s: op name '%s' too long", self->desc->name,
                         name);
  return tsr_op_registry_add(full, op_id);
}

static tsr_status host_register_kernel(struct tsr_plugin *self, int32_t op_id, const char *backend,
                                       tsr_plugin_kernel_fn fn, void *ctx) {
  (void)self;
  return tsr_op_registry_add_kernel(op_id, backend, fn, ctx);
}

static struct tsr_tensor *host_custom_op(struct tsr_graph *g, int32_t op_id, int32_t n_dims,
                                         const int64_t *ne, struct tsr_tensor *const *src,
                                         int32_t n_src, const int32_t *params, int32_t n_params) {
  return tsr_custom_op(g, op_id, n_dims, ne, src, n_src, params, n_params);
}

static tsr_status host_gguf_u32(const struct tsr_gguf *m, const char *key, uint32_t *out) {
  return tsr_gguf_get_u32(m, key, out);
}
static tsr_status host_gguf_f32(const struct tsr_gguf *m, const char *key, float *out) {
  return tsr_gguf_get_f32(m, key, out);
}
static tsr_status host_gguf_str(const struct tsr_gguf *m, const char *key, const char **out) {
  return tsr_gguf_get_str(m, key, out);
}
static tsr_status host_gguf_bool(const struct tsr_gguf *m, const char *key, bool *out) {
  int v = 0;
  tsr_status st = tsr_gguf_get_bool(m, key, &v);
  if (st == TSR_OK) *out = v != 0;
  return st;
}
static tsr_status host_gguf_arr_len(const struct tsr_gguf *m, const char *key, int64_t *n) {
  const struct tsr_gguf_kv *kv;
  tsr_status st = tsr_gguf_get_arr(m, key, TSR_GGUF_TYPE_COUNT, &kv);
  if (st == TSR_OK) *n = (int64_t)kv->n;
  return st;
}
static tsr_status host_gguf_arr_i64(const struct tsr_gguf *m, const char *key, int64_t i,
                                    int64_t *out) {
  const struct tsr_gguf_kv *kv;
  tsr_status st = tsr_gguf_get_arr(m, key, TSR_GGUF_TYPE_COUNT, &kv);
  if (st == TSR_OK && i < 0)
    st = tsr_error_set(TSR_ERR_INVALID_ARG, "%s: negative index %lld", key, (long long)i);
  if (st == TSR_OK) st = tsr_gguf_arr_i64(m, kv, (uint64_t)i, out);
  return st;
}
static tsr_status host_gguf_arr_bool(const struct tsr_gguf *m, const char *key, int64_t i,
                                     bool *out) {
  const struct tsr_gguf_kv *kv;
  tsr_status st = tsr_gguf_get_arr(m, key, TSR_GGUF_BOOL, &kv);
  if (st == TSR_OK && (i < 0 || (uint64_t)i >= kv->n))
    st = tsr_error_set(TSR_ERR_INVALID_ARG, "%s: index %lld outside its %llu elements", key,
                       (long long)i, (unsigned long long)kv->n);
  if (st == TSR_OK) *out = ((const uint8_t *)kv->data)[i] != 0;
  return st;
}
static int host_gguf_has(const struct tsr_gguf *m, const char *key) {
  return tsr_gguf_find_key(m, key) >= 0;
}

static struct tsr_tensor *host_flash_attn(struct tsr_graph *g, const struct tsr_attn_call *c) {
  struct tsr_attn_params p = {.scale = c->scale, .softcap = c->softcap, .causal = c->causal,
                              .window = c->window};
  return tsr_flash_attn(g, c->q, c->k, c->v, c->mask, c->q_pos, c->kv_pos, &p);
}
static struct tsr_tensor *host_cast(struct tsr_graph *g, struct tsr_tensor *a, int32_t dtype) {
  return tsr_cast(g, a, (enum tsr_dtype)dtype);
}

static const struct tsr_host g_services = {
    .abi_major = TSR_PLUGIN_ABI_MAJOR,
    .abi_minor = TSR_PLUGIN_ABI_MINOR,
    .struct_size = sizeof(struct tsr_host),
    .log = host_log,
    .set_error = host_set_error,
    .set_state = host_set_state,
    .get_state = host_get_state,
    .setting_i64 = host_setting_i64,
    .setting_f64 = host_setting_f64,
    .setting_bool = host_setting_bool,
    .setting_str = host_setting_str,
    .register_attention = host_register_attention,
    .register_kv_codec = host_register_kv_codec,
    .register_arch = host_register_arch,
    .register_decode_policy = host_register_decode_policy,
    .register_speculator = host_register_speculator,
    .engaged = host_engaged,
    .register_op = host_register_op,
    .register_kernel = host_register_kernel,
    .custom_op = host_custom_op,
    .gguf_u32 = host_gguf_u32,
    .gguf_f32 = host_gguf_f32,
    .gguf_str = host_gguf_str,
    .gguf_has = host_gguf_has,
    .tensor_info = tsr_tensor_get_info,
    .flash_attn = host_flash_attn,
    .cast = host_cast,
    .scale = tsr_scale,
    .mat_mul = tsr_mat_mul,
    .add = tsr_add,
    .mul = tsr_mul,
    .hf_has = tsr_convert_hf_has,
    .hf_i64 = tsr_convert_hf_i64,
    .hf_f64 = tsr_convert_hf_f64,
    .hf_bool = tsr_convert_hf_bool,
    .hf_str = tsr_convert_hf_str,
    .hf_arr_len = tsr_convert_hf_arr_len,
    .hf_arr_i64 = tsr_convert_hf_arr_i64,
    .hf_arr_f64 = tsr_convert_hf_arr_f64,
    .hf_arr_str = tsr_convert_hf_arr_str,
    .hf_n_tensors = tsr_convert_hf_n_tensors,
    .hf_tensor_name = tsr_convert_hf_tensor_name,
    .hf_tensor_has = tsr_convert_hf_tensor_has,
    .hf_tensor_shape = tsr_convert_hf_tensor_shape,
    .hf_tensor_read = tsr_convert_hf_tensor_read,
    .hf_skip_prefix = tsr_convert_hf_skip_prefix,
    .out_u32 = tsr_convert_out_u32,
    .out_i32 = tsr_convert_out_i32,
    .out_f32 = tsr_convert_out_f32,
    .out_bool = tsr_convert_out_bool,
    .out_str = tsr_convert_out_str,
    .out_arr_i32 = tsr_convert_out_arr_i32,
    .out_arr_f32 = tsr_convert_out_arr_f32,
    .out_tensor = tsr_convert_out_tensor,
    .convert_tokenizer = tsr_convert_tokenizer,
    .weight = tsr_api_weight,
    .has_weight = tsr_api_has_weight,
    .new_tensor = tsr_api_new_tensor,
    .set_name = tsr_api_set_name,
    .mark_output = tsr_graph_mark_output,
    .get_rows = tsr_get_rows,
    .mat_mul_id = tsr_mat_mul_id,
    .rms_norm = tsr_rms_norm,
    .l2_norm = tsr_l2_norm,
    .rope = tsr_api_rope,
    .softmax = tsr_softmax,
    .unary = tsr_api_unary,
    .glu = tsr_api_glu,
    .softcap = tsr_softcap,
    .concat = tsr_api_concat,
    .cont = tsr_cont,
    .reshape = tsr_api_reshape,
    .view = tsr_api_view,
    .permute = tsr_api_permute,
    .top_k = tsr_api_top_k,
    .argmax = tsr_argmax,
    .gguf_bool = host_gguf_bool,
    .out_arr_bool = tsr_convert_out_arr_bool,
    .gguf_arr_len = host_gguf_arr_len,
    .gguf_arr_i64 = host_gguf_arr_i64,
    .gguf_arr_bool = host_gguf_arr_bool,
};

const struct tsr_host *tsr_plugin_host_services(void) { return &g_services; }

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
    st = d->init(&g_services, p);
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
    if (p->desc->destroy) p->desc->destroy(&g_services, p);
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

tsr_status tsr_plugin_host_load_providers(struct tsr_plugin_host *h, const char *iface) {
  struct tsr_manifest *list = NULL;
  int n = 0;
  tsr_status st = tsr_plugin_host_scan(h, &list, &n, warn_bad_manifest, NULL);
  for (int i = 0; i < n && st == TSR_OK; i++) {
    bool provides = false;
    for (int j = 0; j < list[i].n_provides; j++) provides |= !strcmp(list[i].provides[j].name, iface);
    if (!provides || !list[i].library[0] || tsr_plugin_host_find_plugin(h, list[i].name)) continue;
    st = tsr_plugin_host_load(h, list[i].name, list[i].dir, NULL, 0, NULL);
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
  struct cap_list *lists[] = {&h->attention, &h->codecs, &h->archs, &h->policies, &h->speculators};
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
const char *tsr_plugin_library(const struct tsr_plugin *p) { return p->library; }

uint64_t tsr_plugin_engaged_total(const struct tsr_plugin *p) {
  pthread_mutex_lock(&p->host->counter_lock);
  uint64_t total = 0;
  for (int i = 0; i < p->n_counters; i++) total += p->counters[i].value;
  pthread_mutex_unlock(&p->host->counter_lock);
  return total;
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
