/* libFuzzer target: the GGUF reader on arbitrary bytes. Opening must either
** fail cleanly or produce a handle whose every pair and tensor can be walked
** without reading outside the input; the invariants below trap if not. */
#include <stdint.h>
#include <string.h>

#include "model/gguf.h"

#define REQUIRE(c) do { if (!(c)) __builtin_trap(); } while (0)

static volatile uint64_t g_sink; /* keeps the reads from being optimised out */

static void walk_kv(const struct tsr_gguf *g, const struct tsr_gguf_kv *kv) {
  REQUIRE(kv->key && kv->key[0]);
  REQUIRE(tsr_gguf_kv_at(g, tsr_gguf_find_key(g, kv->key)) == kv); /* keys unique */
  uint32_t u32;
  int32_t i32;
  uint64_t u64;
  int64_t i64;
  float f32;
  double f64;
  int b;
  const char *s;
  const struct tsr_gguf_kv *arr;
  /* Every getter on every key: the wrong-type paths must fail cleanly. */
  g_sink += tsr_gguf_get_u32(g, kv->key, &u32) + tsr_gguf_get_i32(g, kv->key, &i32) +
            tsr_gguf_get_u64(g, kv->key, &u64) + tsr_gguf_get_i64(g, kv->key, &i64) +
            tsr_gguf_get_f32(g, kv->key, &f32) + tsr_gguf_get_f64(g, kv->key, &f64) +
            tsr_gguf_get_bool(g, kv->key, &b) + tsr_gguf_get_str(g, kv->key, &s);
  if (kv->type == TSR_GGUF_STRING) {
    REQUIRE(kv->v.s.ptr[kv->v.s.len] == '\0');
    for (uint64_t i = 0; i < kv->v.s.len; i++) g_sink += (unsigned char)kv->v.s.ptr[i];
  }
  if (kv->type != TSR_GGUF_ARRAY) return;
  REQUIRE(tsr_gguf_get_arr(g, kv->key, kv->elem_type, &arr) == TSR_OK && arr == kv);
  REQUIRE(kv->elem_type != TSR_GGUF_ARRAY);
  for (uint64_t i = 0; i < kv->n; i++) {
    struct tsr_gguf_str str;
    if (tsr_gguf_arr_str(g, kv, i, &str) == TSR_OK) {
      REQUIRE(str.ptr[str.len] == '\0');
      for (uint64_t j = 0; j < str.len; j++) g_sink += (unsigned char)str.ptr[j];
    }
    g_sink += tsr_gguf_arr_i64(g, kv, i, &i64) + tsr_gguf_arr_u64(g, kv, i, &u64) +
              tsr_gguf_arr_f64(g, kv, i, &f64) + tsr_gguf_arr_f32(g, kv, i, &f32);
  }
  REQUIRE(tsr_gguf_arr_i64(g, kv, kv->n, &i64) == TSR_ERR_INVALID_ARG);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct tsr_gguf *g;
  if (tsr_gguf_open_memory(data, size, "fuzz", &g) != TSR_OK) {
    REQUIRE(g == NULL);
    return 0;
  }
  REQUIRE(tsr_gguf_version(g) == 2 || tsr_gguf_version(g) == 3);
  uint32_t align = tsr_gguf_alignment(g);
  REQUIRE(align && !(align & (align - 1)) && align <= TSR_GGUF_MAX_ALIGNMENT);
  for (int64_t i = 0; i < tsr_gguf_n_kv(g); i++) walk_kv(g, tsr_gguf_kv_at(g, i));
  const unsigned char *lo = data, *hi = data + size;
  for (int64_t i = 0; i < tsr_gguf_n_tensors(g); i++) {
    const struct tsr_gguf_tensor *t = tsr_gguf_tensor_at(g, i);
    size_t len = strlen(t->name);
    REQUIRE(len > 0 && len < TSR_GGUF_MAX_NAME);
    REQUIRE(tsr_gguf_find_tensor(g, t->name) == t);
    REQUIRE(t->n_dims >= 1 && t->n_dims <= TSR_GGUF_MAX_DIMS && t->n_elements > 0);
    REQUIRE(tsr_dtype_traits((int)t->dtype) != NULL && t->nbytes > 0);
    REQUIRE(t->file_offset % align == 0 && t->file_offset >= tsr_gguf_data_offset(g));
    const unsigned char *p = t->data;
    REQUIRE(p >= lo && p + t->nbytes <= hi);
    g_sink += p[0] + p[t->nbytes - 1];
  }
  tsr_gguf_close(g);
  return 0;
}
