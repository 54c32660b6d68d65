/* JSON files and dotted-path access over cJSON. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"
#include "common/file.h"
#include "model/json.h"

#define MAX_JSON_FILE (1ull << 31) /* tokenizer.json of a 256k vocab is ~30 MB */

tsr_status tsr_json_parse(const char *text, size_t len, const char *label, cJSON **out) {
  *out = NULL;
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
  if (!root) {
    /* cJSON reports where it stopped; turn that into a line and column */
    const char *at = cJSON_GetErrorPtr();
    if (!at || at < text || at > text + len) at = text;
    int line = 1, col = 1;
    for (const char *p = text; p < at; p++) {
      if (*p == '\n') line++, col = 1;
      else col++;
    }
    return tsr_error_set(TSR_ERR_FORMAT, "%s: not valid JSON (stopped at line %d, column %d)",
                         label, line, col);
  }
  /* trailing non-space after the value means the file is not one JSON document */
  for (const char *p = end; p && p < text + len; p++)
    if (*p != ' ' && *p != '\n' && *p != '\r' && *p != '\t' && *p != '\0') {
      cJSON_Delete(root);
      return tsr_error_set(TSR_ERR_FORMAT, "%s: unexpected bytes after the JSON value (offset %zu)",
                           label, (size_t)(p - text));
    }
  *out = root;
  return TSR_OK;
}

bool tsr_json_file_exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

tsr_status tsr_json_load(const char *path, cJSON **out) {
  *out = NULL;
  FILE *f;
  tsr_status fst = tsr_file_fopen(path, &f);
  if (fst != TSR_OK) return fst;
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > MAX_JSON_FILE) {
    fclose(f);
    return tsr_error_set(TSR_ERR_IO, "%s: not a regular file of at most 2 GiB", path);
  }
  size_t n = (size_t)sb.st_size;
  char *buf = malloc(n + 1);
  if (!buf) {
    fclose(f);
    return tsr_error_set(TSR_ERR_NOMEM, "%s: out of memory reading %zu bytes", path, n);
  }
  size_t got = fread(buf, 1, n, f);
  fclose(f);
  if (got != n) {
    free(buf);
    return tsr_error_set(TSR_ERR_IO, "%s: short read (%zu of %zu bytes)", path, got, n);
  }
  buf[n] = '\0';
  tsr_status st = tsr_json_parse(buf, n, path, out);
  free(buf);
  return st;
}

const char *tsr_json_type_name(const cJSON *v) {
  if (!v) return "nothing";
  if (cJSON_IsObject(v)) return "object";
  if (cJSON_IsArray(v)) return "array";
  if (cJSON_IsString(v)) return "string";
  if (cJSON_IsNumber(v)) return "number";
  if (cJSON_IsBool(v)) return "boolean";
  if (cJSON_IsNull(v)) return "null";
  return "invalid";
}

static bool all_digits(const char *s, size_t n) {
  if (!n) return false;
  for (size_t i = 0; i < n; i++)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

/* One path component of n bytes inside node (object key, or array index). */
static const cJSON *child(const cJSON *node, const char *name, size_t n) {
  if (cJSON_IsObject(node)) {
    for (const cJSON *c = node->child; c; c = c->next)
      if (c->string && strlen(c->string) == n && !memcmp(c->string, name, n)) return c;
    return NULL;
  }
  if (cJSON_IsArray(node) && all_digits(name, n) && n < 10) {
    int i = atoi(name);
    return cJSON_GetArrayItem(node, i);
  }
  return NULL;
}

/* Walks the path; *stop is the node reached last (for messages). */
static const cJSON *walk(const cJSON *root, const char *path, const cJSON **stop,
                         size_t *stop_len) {
  const cJSON *node = root;
  const char *s = path;
  *stop = root;
  *stop_len = 0;
  while (node) {
    size_t n = strcspn(s, ".");
    const cJSON *next = child(node, s, n);
    if (!next) return NULL;
    node = next;
    *stop = node;
    *stop_len = (size_t)(s - path) + n;
    if (cJSON_IsNull(node)) return NULL;
    if (!s[n]) return node;
    s += n + 1;
  }
  return NULL;
}

const cJSON *tsr_json_find(const cJSON *root, const char *path) {
  const cJSON *stop;
  size_t len;
  return walk(root, path, &stop, &len);
}

/* A short rendering of a value for messages. */
static void show(const cJSON *v, char *buf, size_t n) {
  if (cJSON_IsString(v)) snprintf(buf, n, " \"%.40s%s\"", v->valuestring,
                                  strlen(v->valuestring) > 40 ? "..." : "");
  else if (cJSON_IsNumber(v)) snprintf(buf, n, " %.17g", v->valuedouble);
  else if (cJSON_IsBool(v)) snprintf(buf, n, " %s", cJSON_IsTrue(v) ? "true" : "false");
  else buf[0] = '\0';
}

static tsr_status find_typed(const cJSON *root, const char *label, const char *path,
                             const char *want, bool (*ok)(const cJSON *), const cJSON **out) {
  const cJSON *stop;
  size_t stop_len;
  const cJSON *v = walk(root, path, &stop, &stop_len);
  if (!v) {
    if (cJSON_IsNull(stop))
      return tsr_error_set(TSR_ERR_FORMAT, "%s: '%.*s' is null, so '%s' has no value (expected %s)",
                           label, (int)stop_len, path, path, want);
    if (stop_len)
      return tsr_error_set(TSR_ERR_FORMAT, "%s: no '%s' (found '%.*s', a%s %s, but not the rest)",
                           label, path, (int)stop_len, path,
                           cJSON_IsObject(stop) || cJSON_IsArray(stop) ? "n" : "",
                           tsr_json_type_name(stop));
    return tsr_error_set(TSR_ERR_FORMAT, "%s: no '%s'", label, path);
  }
  if (!ok(v)) {
    char shown[64];
    show(v, shown, sizeof shown);
    return tsr_error_set(TSR_ERR_FORMAT, "%s: '%s' should be %s, found a %s%s", label, path, want,
                         tsr_json_type_name(v), shown);
  }
  *out = v;
  return TSR_OK;
}

bool tsr_json_as_i64(const cJSON *v, int64_t *out) {
  if (!cJSON_IsNumber(v)) return false;
  double d = v->valuedouble;
  if (!isfinite(d) || d != floor(d) || fabs(d) > 9007199254740992.0) return false;
  *out = (int64_t)d;
  return true;
}

static bool is_integer(const cJSON *v) {
  int64_t x;
  return tsr_json_as_i64(v, &x);
}
static bool is_number(const cJSON *v) { return cJSON_IsNumber(v); }
static bool is_bool(const cJSON *v) { return cJSON_IsBool(v); }
static bool is_string(const cJSON *v) { return cJSON_IsString(v) && v->valuestring; }
static bool is_array(const cJSON *v) { return cJSON_IsArray(v); }

tsr_status tsr_json_i64(const cJSON *root, const char *label, const char *path, int64_t *out) {
  const cJSON *v = NULL;
  tsr_status st = find_typed(root, label, path, "an integer", is_integer, &v);
  if (st == TSR_OK) tsr_json_as_i64(v, out);
  return st;
}

tsr_status tsr_json_f64(const cJSON *root, const char *label, const char *path, double *out) {
  const cJSON *v = NULL;
  tsr_status st = find_typed(root, label, path, "a number", is_number, &v);
  if (st == TSR_OK) *out = v->valuedouble;
  return st;
}

tsr_status tsr_json_bool(const cJSON *root, const char *label, const char *path, bool *out) {
  const cJSON *v = NULL;
  tsr_status st = find_typed(root, label, path, "true or false", is_bool, &v);
  if (st == TSR_OK) *out = cJSON_IsTrue(v);
  return st;
}

tsr_status tsr_json_str(const cJSON *root, const char *label, const char *path, const char **out) {
  const cJSON *v = NULL;
  tsr_status st = find_typed(root, label, path, "a string", is_string, &v);
  if (st == TSR_OK) *out = v->valuestring;
  return st;
}

tsr_status tsr_json_arr_len(const cJSON *root, const char *label, const char *path, int64_t *n) {
  const cJSON *v = NULL;
  tsr_status st = find_typed(root, label, path, "an array", is_array, &v);
  if (st == TSR_OK) *n = cJSON_GetArraySize(v);
  return st;
}

/* Element i of the array at path, checked by ok(). */
static tsr_status element(const cJSON *root, const char *label, const char *path, int64_t i,
                          const char *want, bool (*ok)(const cJSON *), const cJSON **out) {
  const cJSON *arr = NULL;
  tsr_status st = find_typed(root, label, path, "an array", is_array, &arr);
  if (st != TSR_OK) return st;
  int64_t n = cJSON_GetArraySize(arr);
  if (i < 0 || i >= n)
    return tsr_error_set(TSR_ERR_FORMAT, "%s: '%s' has %lld elements, asked for element %lld",
                         label, path, (long long)n, (long long)i);
  const cJSON *v = cJSON_GetArrayItem(arr, (int)i);
  if (!ok(v)) {
    char shown[64];
    show(v, shown, sizeof shown);
    return tsr_error_set(TSR_ERR_FORMAT, "%s: '%s'[%lld] should be %s, found a %s%s", label, path,
                         (long long)i, want, tsr_json_type_name(v), shown);
  }
  *out = v;
  return TSR_OK;
}

tsr_status tsr_json_arr_i64(const cJSON *root, const char *label, const char *path, int64_t i,
                            int64_t *out) {
  const cJSON *v = NULL;
  tsr_status st = element(root, label, path, i, "an integer", is_integer, &v);
  if (st == TSR_OK) tsr_json_as_i64(v, out);
  return st;
}

tsr_status tsr_json_arr_f64(const cJSON *root, const char *label, const char *path, int64_t i,
                            double *out) {
  const cJSON *v = NULL;
  tsr_status st = element(root, label, path, i, "a number", is_number, &v);
  if (st == TSR_OK) *out = v->valuedouble;
  return st;
}

tsr_status tsr_json_arr_str(const cJSON *root, const char *label, const char *path, int64_t i,
                            const char **out) {
  const cJSON *v = NULL;
  tsr_status st = element(root, label, path, i, "a string", is_string, &v);
  if (st == TSR_OK) *out = v->valuestring;
  return st;
}
