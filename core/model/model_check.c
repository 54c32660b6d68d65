/* Model-file checks at load (model_check.h). */
#include "model/model_check.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "graph/graph_internal.h"
#include "abi/plugin_host.h"

/* At most this many names in a message listing layers or tensors. */
#define LIST_CAP 8

tsr_status tsr_model_validate(const struct tsr_arch_v1 *arch, const struct tsr_gguf *model,
                              const struct tsr_arch_layer *layers, int32_t n_layers) {
  /* the plugin's checks first: its range messages are the more precise */
  if (arch->validate) {
    tsr_status st = arch->validate(arch->ctx, tsr_plugin_host_services(), model, layers, n_layers);
    if (st != TSR_OK) return st;
  }
  return tsr_model_check_floats(model);
}

static tsr_status not_finite(const char *key, const char *index, double v) {
  return tsr_error_set(TSR_ERR_FORMAT, "%s%s is %g: must be a finite number", key, index, v);
}

tsr_status tsr_model_check_floats(const struct tsr_gguf *model) {
  const char *arch = NULL;
  if (tsr_gguf_get_str(model, "general.architecture", &arch) != TSR_OK) return TSR_OK;
  const size_t len = strlen(arch);
  for (int64_t i = 0; i < tsr_gguf_n_kv(model); i++) {
    const struct tsr_gguf_kv *kv = tsr_gguf_kv_at(model, i);
    if (strncmp(kv->key, arch, len) || kv->key[len] != '.') continue;
    if ((kv->type == TSR_GGUF_F32 || kv->type == TSR_GGUF_F64) && !isfinite(kv->v.f))
      return not_finite(kv->key, "", kv->v.f);
    if (kv->type != TSR_GGUF_ARRAY ||
        (kv->elem_type != TSR_GGUF_F32 && kv->elem_type != TSR_GGUF_F64))
      continue;
    for (uint64_t j = 0; j < kv->n; j++) {
      double v;
      tsr_status st = tsr_gguf_arr_f64(model, kv, j, &v);
      if (st != TSR_OK) return st;
      char index[32];
      snprintf(index, sizeof index, "[%llu]", (unsigned long long)j);
      if (!isfinite(v)) return not_finite(kv->key, index, v);
    }
  }
  return TSR_OK;
}

tsr_status tsr_model_f32_positive(const struct tsr_gguf *model, const char *key, float *out) {
  float v;
  tsr_status st = tsr_gguf_get_f32(model, key, &v);
  if (st != TSR_OK) return st;
  if (!isfinite(v) || !(v > 0.0f))
    return tsr_error_set(TSR_ERR_FORMAT, "%s is %g: must be a finite positive number", key,
                         (double)v);
  *out = v;
  return TSR_OK;
}

tsr_status tsr_model_weight_shape(const struct tsr_gguf *model, const char *name,
                                  int32_t *n_dims, int64_t ne[4]) {
  const struct tsr_gguf_tensor *t = tsr_gguf_find_tensor(model, name);
  if (!t) return tsr_error_set(TSR_ERR_FORMAT, "tensor %s is missing", name);
  *n_dims = (int32_t)t->n_dims;
  for (int i = 0; i < 4; i++) ne[i] = t->ne[i];
  return TSR_OK;
}

/* "[896, 151936]"; -1 prints as "*" */
static void format_shape(char *buf, size_t cap, int n, const int64_t *ne) {
  size_t at = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < n && at < cap; i++)
    at += (size_t)(ne[i] < 0 ? snprintf(buf + at, cap - at, "%s*", i ? ", " : "")
                             : snprintf(buf + at, cap - at, "%s%lld", i ? ", " : "",
                                        (long long)ne[i]));
  if (at < cap) snprintf(buf + at, cap - at, "]");
}

static const char *dim_word(int d) {
  return d == 0 ? "columns" : d == 1 ? "rows" : NULL;
}

tsr_status tsr_model_check_weight(const struct tsr_gguf *model, const char *name, int32_t n_dims,
                                  const int64_t *ne, const char *const *why) {
  if (n_dims < 1 || n_dims > 4)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "check_weight %s: %d dims", name, n_dims);
  int64_t want[4] = {1, 1, 1, 1};
  for (int i = 0; i < n_dims; i++) want[i] = ne[i];
  char expected[96], found[96];
  format_shape(expected, sizeof expected, n_dims, want);
  const struct tsr_gguf_tensor *t = tsr_gguf_find_tensor(model, name);
  if (!t) return tsr_error_set(TSR_ERR_FORMAT, "tensor %s is missing (expected %s)", name, expected);
  format_shape(found, sizeof found, (int)t->n_dims, t->ne);
  for (int i = 0; i < 4; i++) {
    if (want[i] < 0 || want[i] == t->ne[i]) continue;
    if (i < n_dims && why && why[i]) {
      char has[48];
      if (dim_word(i))
        snprintf(has, sizeof has, "%lld %s", (long long)t->ne[i], dim_word(i));
      else
        snprintf(has, sizeof has, "%lld in dim %d", (long long)t->ne[i], i);
      return tsr_error_set(TSR_ERR_FORMAT, "%s is %lld but %s has %s (shape %s)", why[i],
                           (long long)want[i], name, has, found);
    }
    return tsr_error_set(TSR_ERR_FORMAT, "%s has shape %s, expected %s", name, found, expected);
  }
  return TSR_OK;
}

/* "layers 0-2, 4-27" (or "layer 0") of the listed layers whose tensor
** presence is `want`, at most LIST_CAP runs; returns how many there are. */
static int32_t format_layers(char *buf, size_t cap, const int32_t *layers, const bool *has,
                             int32_t n, bool want) {
  int32_t count = 0;
  for (int32_t i = 0; i < n; i++) count += has[i] == want;
  size_t at = (size_t)snprintf(buf, cap, "%s ", count == 1 ? "layer" : "layers");
  int runs = 0;
  for (int32_t i = 0; i < n && at < cap; i++) {
    if (has[i] != want) continue;
    int32_t j = i;
    while (j + 1 < n && has[j + 1] == want && layers[j + 1] == layers[j] + 1) j++;
    if (runs == LIST_CAP) {
      snprintf(buf + at, cap - at, ", ...");
      break;
    }
    at += (size_t)(j > i ? snprintf(buf + at, cap - at, "%s%d-%d", runs ? ", " : "", layers[i],
                                    layers[j])
                         : snprintf(buf + at, cap - at, "%s%d", runs ? ", " : "", layers[i]));
    runs++;
    i = j;
  }
  return count;
}

tsr_status tsr_model_check_layer_weights(const struct tsr_gguf *model, const char *suffix,
                                         const int32_t *layers, int32_t n, bool *present) {
  *present = false;
  if (n <= 0) return TSR_OK;
  bool has[512];
  if (n > (int32_t)(sizeof has / sizeof has[0]))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "check_layer_weights %s: %d layers", suffix, n);
  int32_t first_diff = -1;
  for (int32_t i = 0; i < n; i++) {
    char name[TSR_GGUF_MAX_NAME + 32];
    snprintf(name, sizeof name, "blk.%d.%s", layers[i], suffix);
    has[i] = tsr_gguf_find_tensor(model, name) != NULL;
    if (first_diff < 0 && has[i] != has[0]) first_diff = i;
  }
  *present = has[0];
  if (first_diff < 0) return TSR_OK;
  char list[160];
  const int32_t count = format_layers(list, sizeof list, layers, has, n, has[0]);
  return has[0] ? tsr_error_set(TSR_ERR_FORMAT, "blk.%d.%s is missing (%s %s it)",
                                layers[first_diff], suffix, list, count == 1 ? "has" : "have")
                : tsr_error_set(TSR_ERR_FORMAT, "blk.%d.%s is present but %s %s it; such a "
                                "tensor is in every layer of its kind or in none",
                                layers[first_diff], suffix, list, count == 1 ? "lacks" : "lack");
}

void tsr_model_note_used(const struct tsr_gguf *model, const struct tsr_graph *g, bool *used) {
  const int64_t n = tsr_gguf_n_tensors(model);
  if (!n) return;
  const struct tsr_gguf_tensor *first = tsr_gguf_tensor_at(model, 0);
  for (int i = 0; i < g->n; i++) {
    const struct tsr_tensor *t = &g->tensors[i];
    if (!(t->flags & TSR_FLAG_WEIGHT) || !t->data) continue;
    /* host->graph->weight names a leaf after its tensor; the data pointer tells it
    ** from another file's tensor of the same name (a drafter's target) */
    const struct tsr_gguf_tensor *w = tsr_gguf_find_tensor(model, t->name);
    if (w && w->data == t->data) used[w - first] = true; /* tensors are one array */
  }
}

int64_t tsr_model_warn_unused(const struct tsr_gguf *model, const bool *used, FILE *f) {
  const int64_t n = tsr_gguf_n_tensors(model);
  int64_t n_unused = 0;
  char list[640];
  size_t at = 0;
  list[0] = '\0';
  for (int64_t i = 0; i < n; i++) {
    if (used[i]) continue;
    if (n_unused++ < LIST_CAP && at < sizeof list)
      at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", at ? ", " : "",
                             tsr_gguf_tensor_at(model, i)->name);
  }
  if (!n_unused) return 0;
  const char *arch = "?";
  tsr_gguf_get_str(model, "general.architecture", &arch);
  tsr_error_clear();
  fprintf(f, "tessera: warning: %s: %lld of its %lld tensors %s read by no %s graph (ignored): "
          "%s%s\n", tsr_gguf_path(model), (long long)n_unused, (long long)n,
          n_unused == 1 ? "is" : "are", arch, list, n_unused > LIST_CAP ? ", ..." : "");
  return n_unused;
}
