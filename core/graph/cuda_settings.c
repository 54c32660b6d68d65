#include "graph/cuda_settings.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

enum kind { K_INT, K_BOOL, K_DECODE };

static const struct {
  struct tsr_cuda_setting_key k;
  enum kind kind;
  size_t off;
  long lo, hi; /* K_INT */
} g_keys[TSR_CUDA_N_SETTINGS] = {
    {{"device", "TESSERA_CUDA_DEVICE", "a GPU ordinal, 0..255"}, K_INT,
     offsetof(struct tsr_cuda_settings, device), 0, 255},
    {{"gemm", "TESSERA_CUDA_GEMM", "f16 or f32"}, K_BOOL,
     offsetof(struct tsr_cuda_settings, gemm_f32), 0, 0},
    {{"gemv", "TESSERA_CUDA_GEMV", "q8 or f32"}, K_BOOL,
     offsetof(struct tsr_cuda_settings, gemv_f32), 0, 0},
    {{"graphs", "TESSERA_CUDA_GRAPHS", "true or false (variable: 1 or 0)"}, K_BOOL,
     offsetof(struct tsr_cuda_settings, graphs), 0, 0},
    {{"sync", "TESSERA_CUDA_SYNC", "true or false (variable: 1 or 0)"}, K_BOOL,
     offsetof(struct tsr_cuda_settings, sync), 0, 0},
    {{"attention.pipeline", "TESSERA_CUDA_ATTN_PIPELINE", "true or false (variable: 1 or 0)"},
     K_BOOL, offsetof(struct tsr_cuda_settings, attn_pipelined), 0, 0},
    {{"attention.decode", "TESSERA_CUDA_ATTN_GQA_DECODE",
      "gqa_staged, gqa or tile (variable: 2, 1 or 0)"},
     K_DECODE, offsetof(struct tsr_cuda_settings, attn_decode), 0, 0},
    {{"attention.split_keys", "TESSERA_CUDA_ATTN_SPLIT_KEYS",
      "0 (the backend's 256) or 16..1048576 keys"},
     K_INT, offsetof(struct tsr_cuda_settings, attn_split_keys), 0, 1 << 20},
    {{"graph_slots", "TESSERA_CUDA_GRAPH_SLOTS", "1..16 captures kept at once"}, K_INT,
     offsetof(struct tsr_cuda_settings, graph_slots), 1, 16},
    {{"precision", "TESSERA_CUDA_PRECISION", "mixed or f32"}, K_BOOL,
     offsetof(struct tsr_cuda_settings, precision_f32), 0, 0},
};

/* The two spellings of gemm's and gemv's choices: the profile's word for 0, then for 1. */
static const char *const g_words[TSR_CUDA_N_SETTINGS][2] = {
    [1] = {"f16", "f32"}, [2] = {"q8", "f32"}, [TSR_CUDA_SETTING_PRECISION] = {"mixed", "f32"}};
static const char *const g_decode[3] = {"tile", "gqa", "gqa_staged"};

const struct tsr_cuda_setting_key *tsr_cuda_setting_key(int i) {
  return i >= 0 && i < TSR_CUDA_N_SETTINGS ? &g_keys[i].k : NULL;
}

void tsr_cuda_settings_default(struct tsr_cuda_settings *s) {
  *s = (struct tsr_cuda_settings){
      .graphs = 1, .attn_decode = TSR_CUDA_DECODE_GQA_STAGED, .graph_slots = 8};
}

static int32_t *field(struct tsr_cuda_settings *s, int i) {
  return (int32_t *)((char *)s + g_keys[i].off);
}

tsr_status tsr_cuda_setting_parse(struct tsr_cuda_settings *s, int i, const char *text,
                                  bool from_env, const char *where) {
  int32_t v = -1;
  switch (g_keys[i].kind) {
  case K_INT: {
    char *end;
    const long x = strtol(text, &end, 10);
    const bool ok = *text && !*end && x >= g_keys[i].lo && x <= g_keys[i].hi &&
                    (i != 7 || x == 0 || x >= 16); /* split_keys: 0 or a real split */
    if (ok) v = (int32_t)x;
    break;
  }
  case K_BOOL:
    if (g_words[i][0]) {
      for (int w = 0; w < 2; w++)
        if (!strcmp(text, g_words[i][w])) v = w;
    } else if (from_env) {
      v = !strcmp(text, "1") ? 1 : !strcmp(text, "0") ? 0 : -1;
    } else {
      v = !strcmp(text, "true") ? 1 : !strcmp(text, "false") ? 0 : -1;
    }
    break;
  case K_DECODE:
    for (int w = 0; w < 3; w++) {
      char digit[2] = {(char)('0' + w), 0};
      if (!strcmp(text, from_env ? digit : g_decode[w])) v = w;
    }
    break;
  }
  if (v < 0)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: %s%s is '%s'; it takes %s", where,
                         from_env ? "" : "backend.", from_env ? g_keys[i].k.env : g_keys[i].k.key,
                         text, g_keys[i].k.values);
  *field(s, i) = v;
  return TSR_OK;
}

const char *tsr_cuda_setting_text(const struct tsr_cuda_settings *s, int i, char *buf,
                                  size_t cap) {
  const int32_t v = *field((struct tsr_cuda_settings *)s, i);
  if (g_keys[i].kind == K_DECODE) snprintf(buf, cap, "%s", g_decode[v]);
  else if (g_keys[i].kind == K_INT) snprintf(buf, cap, "%d", (int)v);
  else if (g_words[i][0]) snprintf(buf, cap, "%s", g_words[i][v != 0]);
  else snprintf(buf, cap, "%s", v ? "true" : "false");
  return buf;
}

tsr_status tsr_cuda_settings_resolve(struct tsr_cuda_settings *s,
                                     const char *const given[TSR_CUDA_N_SETTINGS],
                                     bool forced[TSR_CUDA_N_SETTINGS]) {
  if (forced)
    for (int i = 0; i < TSR_CUDA_N_SETTINGS; i++) forced[i] = false;
  if (!s->precision_f32) return TSR_OK;
  /* what the exact mode needs of the settings it overrules */
  static const struct {
    int i;
    int32_t want;
  } needs[] = {{1, 1} /* gemm f32 */, {2, 1} /* gemv f32 */, {6, TSR_CUDA_DECODE_TILE}};
  for (size_t n = 0; n < sizeof needs / sizeof needs[0]; n++) {
    const int i = needs[n].i;
    if (*field(s, i) == needs[n].want) continue;
    if (given && given[i]) {
      struct tsr_cuda_settings exact = *s;
      *field(&exact, i) = needs[n].want;
      char was[32], want[32];
      return tsr_error_set(TSR_ERR_INVALID_ARG, "%s: backend.%s is %s, and backend.precision "
                           "f32 runs every product and attention in f32: leave it unset or "
                           "make it %s", given[i], g_keys[i].k.key,
                           tsr_cuda_setting_text(s, i, was, sizeof was),
                           tsr_cuda_setting_text(&exact, i, want, sizeof want));
    }
    *field(s, i) = needs[n].want;
    if (forced) forced[i] = true;
  }
  return TSR_OK;
}

tsr_status tsr_cuda_settings_from_env(struct tsr_cuda_settings *s,
                                      const char *overridden[TSR_CUDA_N_SETTINGS]) {
  for (int i = 0; i < TSR_CUDA_N_SETTINGS; i++) {
    const char *env = getenv(g_keys[i].k.env);
    if (overridden) overridden[i] = NULL;
    if (!env || !*env) continue;
    char where[64];
    snprintf(where, sizeof where, "environment");
    tsr_status st = tsr_cuda_setting_parse(s, i, env, true, where);
    if (st != TSR_OK) return st;
    if (overridden) overridden[i] = g_keys[i].k.env;
  }
  return TSR_OK;
}
