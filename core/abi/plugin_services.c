/*
** The services table plugins get in init(): logging, errors, state,
** settings, capability registration and engagement, and the sub-tables for
** GGUF reading, graph building, an arch's KV cache, conversion and plugin
** ops (tessera/plugin/host.h). Each table only ever appends within a major
** (tessera/plugin/abi.h).
*/
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/convert.h"
#include "cpu/vec.h"
#include "graph/dtype.h"
#include "common/error.h"
#include "graph/graph.h"
#include "model/gguf.h"
#include "model/model_check.h"
#include "abi/op_registry.h"
#include "abi/plugin_graph_api.h"
#include "abi/plugin_host_internal.h"
#include "api/embed.h"

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

/* The size of a struct through `field`, its last field in ABI 2.0: what a plugin
** built for any minor of major 2 registers at least. */
#define SIZE_THROUGH(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))

/* A registered struct holds at least ABI 2.0's fields; checked before any is read. */
static tsr_status check_size(const struct tsr_plugin *self, const char *iface, const char *name,
                             uint32_t impl_size, size_t base) {
  if (impl_size >= base) return TSR_OK;
  return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin %s registered %s '%s' with struct_size %u, "
                       "less than ABI %d.0's %zu", self->desc->name, iface, name ? name : "?",
                       impl_size, TSR_PLUGIN_ABI_MAJOR, base);
}

static tsr_status add_cap(struct tsr_plugin *self, struct cap_list *list, const char *iface,
                          const char *name, const void *impl, uint32_t impl_size, size_t known,
                          size_t base) {
  if (!impl || !name || !*name)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin %s registered a %s without a name",
                         self->desc->name, iface);
  tsr_status st = check_size(self, iface, name, impl_size, base);
  if (st != TSR_OK) return st;
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
_Static_assert(offsetof(struct tsr_attention_v1, name) == offsetof(struct tsr_convert_v1, hf_types),
               "name offset");

/* The dtype ids of tessera/plugin/dtype.h are the core's. */
#define SAME_ID(plugin_id, core_id) _Static_assert((int)(plugin_id) == (int)(core_id), #plugin_id)
SAME_ID(TSR_DTYPE_ID_F32, TSR_F32);
SAME_ID(TSR_DTYPE_ID_F16, TSR_F16);
SAME_ID(TSR_DTYPE_ID_Q4_0, TSR_Q4_0);
SAME_ID(TSR_DTYPE_ID_Q4_1, TSR_Q4_1);
SAME_ID(TSR_DTYPE_ID_Q5_0, TSR_Q5_0);
SAME_ID(TSR_DTYPE_ID_Q5_1, TSR_Q5_1);
SAME_ID(TSR_DTYPE_ID_Q8_0, TSR_Q8_0);
SAME_ID(TSR_DTYPE_ID_I32, TSR_I32);
SAME_ID(TSR_DTYPE_ID_BF16, TSR_BF16);
SAME_ID(TSR_DTYPE_ID_Q6_0, TSR_Q6_0);
SAME_ID(TSR_DTYPE_ID_CODEC_FIRST, TSR_DTYPE_CODEC_BASE);
SAME_ID(TSR_DTYPE_ID_CODEC_COUNT, TSR_DTYPE_CODEC_MAX);
#undef SAME_ID

static tsr_status host_register_attention(struct tsr_plugin *self, const struct tsr_attention_v1 *a) {
  if (a && (!a->negotiate || !a->build))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin %s: attention '%s' lacks negotiate or build",
                         self->desc->name, a->name ? a->name : "?");
  return add_cap(self, &self->host->attention, TSR_IFACE_ATTENTION, a ? a->name : NULL, a,
                 a ? a->struct_size : 0, sizeof(struct tsr_attention_v1),
                 SIZE_THROUGH(struct tsr_attention_v1, honours_decode));
}

static tsr_status host_register_kernel_lib(struct tsr_plugin *self, int32_t op_id,
                                           const char *backend, const char *file,
                                           const char *symbol, void *ctx);

/* The op of an own-layout codec's kernel ("PLUGIN.CODEC.encode"): registered
** by the first host of the process, found by the others. */
static tsr_status codec_op(struct tsr_plugin *self, const char *codec, const char *role,
                           int32_t *op) {
  char name[96];
  snprintf(name, sizeof name, "%s.%s.%s", self->desc->name, codec, role);
  if ((*op = tsr_op_registry_find(name)) >= 0) return TSR_OK;
  return tsr_op_registry_add(name, op);
}

/* Every device backend an own-layout codec names has its kernels. */
static tsr_status codec_kernels(struct tsr_plugin *self, const struct tsr_kv_codec_v1 *c,
                                int dtype) {
  const struct tsr_kv_codec_kernels *k = c->kernels;
  const uint32_t n = k ? c->n_kernels : 0;
  if (n > TSR_CODEC_MAX_KERNEL_SETS)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%u kernel sets (at most %d)", n,
                         TSR_CODEC_MAX_KERNEL_SETS);
  int32_t enc = -1, lift = -1, read = -1;
  tsr_status st = TSR_OK;
  for (uint32_t i = 0; i < n && st == TSR_OK; i++) {
    if (!k[i].backend || !k[i].file || !k[i].encode || !k[i].lift || !strcmp(k[i].backend, "cpu"))
      return tsr_error_set(TSR_ERR_INVALID_ARG, "kernels[%u] needs a device backend, a file, "
                           "and encode and lift symbols", i);
    if (!k[i].read != !k[i].reads)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "kernels[%u] has a %s without %s: a read kernel "
                           "comes with the reads() that says which layers it takes", i,
                           k[i].read ? "read symbol" : "reads()", k[i].read ? "reads()" : "read");
    if (k[i].read && read < 0) st = codec_op(self, c->name, "read", &read);
    if (st == TSR_OK && k[i].read && !tsr_op_registry_has_kernel(read, k[i].backend))
      st = host_register_kernel_lib(self, read, k[i].backend, k[i].file, k[i].read, k[i].ctx);
    if (st == TSR_OK && enc < 0) st = codec_op(self, c->name, "encode", &enc);
    if (st == TSR_OK && lift < 0) st = codec_op(self, c->name, "lift", &lift);
    if (st == TSR_OK && !tsr_op_registry_has_kernel(enc, k[i].backend))
      st = host_register_kernel_lib(self, enc, k[i].backend, k[i].file, k[i].encode, k[i].ctx);
    if (st == TSR_OK && !tsr_op_registry_has_kernel(lift, k[i].backend))
      st = host_register_kernel_lib(self, lift, k[i].backend, k[i].file, k[i].lift, k[i].ctx);
  }
  if (st == TSR_OK && enc >= 0) st = tsr_dtype_codec_set_ops(dtype, enc, lift, read);
  /* each backend it names but the cpu needs a kernel set */
  for (const char *b = c->backends; st == TSR_OK && b && *b;) {
    const size_t len = strcspn(b, ",");
    bool found = len == 3 && !strncmp(b, "cpu", 3);
    for (uint32_t i = 0; i < n && !found; i++)
      found = strlen(k[i].backend) == len && !strncmp(k[i].backend, b, len);
    if (!found)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "its backends name %.*s, and it has no kernels "
                           "there (tsr_kv_codec_v1.kernels)", (int)len, b);
    b += len + (b[len] == ',');
  }
  return st;
}

static tsr_status host_register_kv_codec(struct tsr_plugin *self, const struct tsr_kv_codec_v1 *c) {
  const size_t base = SIZE_THROUGH(struct tsr_kv_codec_v1, n_kernels);
  if (c && check_size(self, TSR_IFACE_KV_CODEC, c->name, c->struct_size, base) != TSR_OK)
    return TSR_ERR_INVALID_ARG;
  if (c && (c->block_size <= 0 || c->block_bytes == 0 || !c->encode_rows || !c->backends))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin %s: kv codec '%s' needs a block size, "
                         "block bytes, backends and encode_rows", self->desc->name,
                         c->name ? c->name : "?");
  int dtype = c ? c->dtype : -1;
  if (c && c->dtype == TSR_KV_CODEC_OWN_DTYPE) {
    /* its own block layout: a dtype of the process, read and written on the cpu
    ** through the codec's reference functions */
    if (!c->decode_f32 || !c->name)
      return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin %s: kv codec '%s' of its own layout "
                           "needs decode_f32", self->desc->name, c->name ? c->name : "?");
    tsr_status st = tsr_dtype_register_codec(self->desc->name, c->name, c->block_size,
                                             c->block_bytes, c->encode_rows, c->decode_f32,
                                             c->ctx, &dtype);
    if (st == TSR_OK) st = codec_kernels(self, c, dtype);
    if (st != TSR_OK) {
      tsr_error_prefix("plugin %s: kv codec '%s'", self->desc->name, c->name);
      return st;
    }
  }
  /* otherwise the rows are a type the backends know, in that type's blocks */
  const struct tsr_dtype_traits *tr = c ? tsr_dtype_traits(dtype) : NULL;
  if (c && (!tr || !tr->to_f32 || !tr->from_f32 || tr->block_size != c->block_size ||
            tr->type_size != c->block_bytes))
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "plugin %s: kv codec '%s' stores dtype %d in "
                         "blocks of %lld values / %zu bytes; a codec stores its rows in a dtype "
                         "the backends read and write (f32, f16, bf16, q8_0, q6_0, q5_1, q5_0, "
                         "q4_1, q4_0) with that dtype's blocks, or in its own layout "
                         "(TSR_KV_CODEC_OWN_DTYPE)", self->desc->name, c->name ? c->name : "?",
                         (int)c->dtype, (long long)c->block_size, c->block_bytes);
  tsr_status st = add_cap(self, &self->host->codecs, TSR_IFACE_KV_CODEC, c ? c->name : NULL, c,
                          c ? c->struct_size : 0, sizeof(struct tsr_kv_codec_v1), base);
  if (st == TSR_OK) {
    struct registered *r = &self->host->codecs.items[self->host->codecs.n - 1];
    const int32_t n_state = r->u.codec.n_state; /* 0 from a plugin built before it existed */
    if (n_state < 0 || n_state > TSR_KV_CODEC_MAX_STATE || (n_state && !r->u.codec.state_shape)) {
      self->host->codecs.n--;
      return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin %s: kv codec '%s' declares %d state "
                           "tensors: 0..%d, and state_shape with any", self->desc->name, c->name,
                           n_state, TSR_KV_CODEC_MAX_STATE);
    }
    r->u.codec.dtype = dtype;
    /* only an own-layout codec's kernels were checked (codec_kernels) and are kept */
    const uint32_t n = tsr_dtype_is_codec(dtype) && c->kernels ? c->n_kernels : 0;
    if (n) memcpy(r->codec_kernels, c->kernels, n * sizeof *c->kernels);
    r->u.codec.kernels = n ? r->codec_kernels : NULL;
    r->u.codec.n_kernels = n;
  }
  return st;
}

static tsr_status host_register_arch(struct tsr_plugin *self, const struct tsr_arch_v1 *a) {
  if (a && !a->describe)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin %s: arch '%s' lacks describe",
                         self->desc->name, a->names ? a->names : "?");
  return add_cap(self, &self->host->archs, TSR_IFACE_ARCH, a ? a->names : NULL, a,
                 a ? a->struct_size : 0, sizeof(struct tsr_arch_v1),
                 SIZE_THROUGH(struct tsr_arch_v1, validate));
}

static tsr_status host_register_convert(struct tsr_plugin *self, const struct tsr_convert_v1 *c) {
  const size_t base = SIZE_THROUGH(struct tsr_convert_v1, convert);
  if (c && check_size(self, TSR_IFACE_CONVERT, c->hf_types, c->struct_size, base) != TSR_OK)
    return TSR_ERR_INVALID_ARG;
  if (c && !c->convert)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin %s: converter '%s' lacks convert",
                         self->desc->name, c->hf_types ? c->hf_types : "?");
  return add_cap(self, &self->host->converters, TSR_IFACE_CONVERT, c ? c->hf_types : NULL, c,
                 c ? c->struct_size : 0, sizeof(struct tsr_convert_v1), base);
}

static tsr_status host_register_decode_policy(struct tsr_plugin *self,
                                              const struct tsr_decode_policy_v1 *p) {
  return add_cap(self, &self->host->policies, TSR_IFACE_DECODE_POLICY, p ? p->name : NULL, p,
                 p ? p->struct_size : 0, sizeof(struct tsr_decode_policy_v1),
                 SIZE_THROUGH(struct tsr_decode_policy_v1, params));
}

static tsr_status host_register_speculator(struct tsr_plugin *self,
                                           const struct tsr_speculator_v1 *s) {
  return add_cap(self, &self->host->speculators, TSR_IFACE_SPECULATOR, s ? s->name : NULL, s,
                 s ? s->struct_size : 0, sizeof(struct tsr_speculator_v1),
                 SIZE_THROUGH(struct tsr_speculator_v1, accepted));
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
  if (!c) { /* more names than slots: the last slot sums the rest, so nothing is lost */
    c = &self->counters[TSR_PLUGIN_MAX_COUNTERS - 1];
    snprintf(c->name, sizeof c->name, "other");
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

/* A relative file is looked for beside the plugin's .so (the built-in core
** has none: the name goes to dlopen as it is). */
static tsr_status host_register_kernel_lib(struct tsr_plugin *self, int32_t op_id,
                                           const char *backend, const char *file,
                                           const char *symbol, void *ctx) {
  if (!file || !*file)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin %s: a kernel library needs a file name",
                         self->desc->name);
  char path[1024];
  const char *slash = strrchr(self->library, '/');
  int n = file[0] == '/' || !slash
              ? snprintf(path, sizeof path, "%s", file)
              : snprintf(path, sizeof path, "%.*s/%s", (int)(slash - self->library), self->library,
                         file);
  if (n < 0 || (size_t)n >= sizeof path)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin %s: kernel library path too long",
                         self->desc->name);
  return tsr_op_registry_add_kernel_lib(op_id, backend, path, symbol, ctx);
}

/* Only the plugin's own ops ("NAME.op", as register_op names them). */
static tsr_status host_declare_replayable(struct tsr_plugin *self, int32_t op_id,
                                          const char *backend) {
  const char *name = tsr_op_registry_name(op_id);
  const size_t len = strlen(self->desc->name);
  if (!name || strncmp(name, self->desc->name, len) || name[len] != '.')
    return tsr_error_set(TSR_ERR_INVALID_ARG, "plugin %s: op id %d (%s) is not one of its ops; "
                         "a plugin declares only its own kernels replayable", self->desc->name,
                         op_id, name ? name : "none");
  return tsr_op_registry_set_replayable(op_id, backend);
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
                              .window = c->window, .decode = c->decode};
  return tsr_flash_attn(g, c->q, c->k, c->v, c->mask, c->q_pos, c->kv_pos, &p);
}
static struct tsr_tensor *host_cast(struct tsr_graph *g, struct tsr_tensor *a, int32_t dtype) {
  return tsr_cast(g, a, (enum tsr_dtype)dtype);
}

static void host_graph_fail(struct tsr_graph *g, tsr_status st, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  tsr_graph_fail(g, st, msg);
}

static const struct tsr_kv_codec_v1 *host_find_kv_codec(const struct tsr_plugin *self,
                                                        const char *name, int32_t dtype) {
  if (!self || !self->host) return NULL;
  if (name) return tsr_plugin_host_kv_codec(self->host, name, NULL);
  const struct cap_list *l = &self->host->codecs;
  for (int i = 0; i < l->n; i++)
    if (l->items[i].u.codec.dtype == dtype) return &l->items[i].u.codec;
  return NULL;
}

static const struct tsr_host_gguf g_gguf = {
    .struct_size = sizeof(struct tsr_host_gguf),
    .get_u32 = host_gguf_u32,
    .get_f32 = host_gguf_f32,
    .get_str = host_gguf_str,
    .get_bool = host_gguf_bool,
    .has_key = host_gguf_has,
    .arr_len = host_gguf_arr_len,
    .arr_i64 = host_gguf_arr_i64,
    .arr_bool = host_gguf_arr_bool,
    .has_weight = tsr_api_has_weight,
    .f32_positive = tsr_model_f32_positive,
    .weight_shape = tsr_model_weight_shape,
    .check_weight = tsr_model_check_weight,
    .check_layer_weights = tsr_model_check_layer_weights,
};

static const struct tsr_host_graph g_graph = {
    .struct_size = sizeof(struct tsr_host_graph),
    .tensor_info = tsr_tensor_get_info,
    .weight = tsr_api_weight,
    .new_tensor = tsr_api_new_tensor,
    .set_name = tsr_api_set_name,
    .mark_output = tsr_graph_mark_output,
    .fail = host_graph_fail,
    .serial = tsr_graph_serial,
    .custom_op = host_custom_op,
    .custom_op_typed = tsr_api_custom_op_typed,
    .cast = host_cast,
    .scale = tsr_scale,
    .mat_mul = tsr_mat_mul,
    .mat_mul_id = tsr_mat_mul_id,
    .add = tsr_add,
    .mul = tsr_mul,
    .get_rows = tsr_get_rows,
    .rms_norm = tsr_rms_norm,
    .l2_norm = tsr_l2_norm,
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
    .rope = tsr_api_rope,
    .rope_apply = tsr_api_rope_apply,
    .flash_attn = host_flash_attn,
    .decode_counters = tsr_decode_counters,
};

static const struct tsr_host_arch g_arch = {
    .struct_size = sizeof(struct tsr_host_arch),
    .kv_attend = tsr_api_kv_attend,
    .kv_state = tsr_api_kv_state,
    .kv_checkpoints = tsr_api_kv_checkpoints,
    .attn_rope = tsr_api_attn_rope,
    .attn_build = tsr_api_attn_build,
    .kv_shift_k = tsr_api_kv_shift_k,
    .kv_shift_rope = tsr_api_kv_shift_rope,
    .kv_shift_store = tsr_api_kv_shift_store,
};

static const struct tsr_host_convert g_convert = {
    .struct_size = sizeof(struct tsr_host_convert),
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
    .out_arr_bool = tsr_convert_out_arr_bool,
    .out_tensor = tsr_convert_out_tensor,
    .out_tensor_i32 = tsr_convert_out_tensor_i32,
    .tokenizer = tsr_convert_tokenizer,
};

static const struct tsr_host_kernel g_kernel = {
    .struct_size = sizeof(struct tsr_host_kernel),
    .register_op = host_register_op,
    .register_kernel = host_register_kernel,
    .register_kernel_lib = host_register_kernel_lib,
    .declare_replayable = host_declare_replayable,
    .device_call = tsr_op_registry_device_call,
    .vec_dot_f32 = tsr_vec_dot_f32,
    .vec_dot_f16_f32 = tsr_vec_dot_f16_f32,
    .vec_axpy_f32 = tsr_vec_axpy_f32,
    .vec_axpy_f16 = tsr_vec_axpy_f16,
    .vec_scale_f32 = tsr_vec_scale_f32,
    .vec_exp_sum_f32 = tsr_vec_exp_sum_f32,
};

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
    .register_arch = host_register_arch,
    .register_convert = host_register_convert,
    .register_attention = host_register_attention,
    .register_kv_codec = host_register_kv_codec,
    .register_decode_policy = host_register_decode_policy,
    .register_speculator = host_register_speculator,
    .find_kv_codec = host_find_kv_codec,
    .engaged = host_engaged,
    .gguf = &g_gguf,
    .graph = &g_graph,
    .arch = &g_arch,
    .convert = &g_convert,
    .kernel = &g_kernel,
    .spec = &tsr_host_spec_services,
};

const struct tsr_host *tsr_plugin_host_services(void) { return &g_services; }
