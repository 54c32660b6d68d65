/*
** The cuda backend's choices: the profile's `backend:` map (conf/default.yaml)
** and the TESSERA_CUDA_* environment variables that override its keys. One
** table names each choice's profile key, variable, type and range, so the
** profile, the override and `profile check`'s printout cannot drift apart.
*/
#ifndef TSR_CUDA_SETTINGS_H
#define TSR_CUDA_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tessera/tessera.h"

/* attention.decode: the kernels decode attention runs on */
enum { TSR_CUDA_DECODE_TILE = 0, TSR_CUDA_DECODE_GQA = 1, TSR_CUDA_DECODE_GQA_STAGED = 2 };

struct tsr_cuda_settings {
  int32_t device;          /* the GPU's ordinal */
  int32_t gemm_f32;        /* prefill GEMMs in f32 instead of f16 (cuBLAS) */
  int32_t gemv_f32;        /* decode products in f32 instead of on q8 activations */
  int32_t graphs;          /* decode steps replayed as CUDA graphs */
  int32_t sync;            /* synchronize after every node (finds a failing kernel) */
  int32_t attn_pipelined;  /* attention's pipelined tile loop */
  int32_t attn_decode;     /* TSR_CUDA_DECODE_* */
  int32_t attn_split_keys; /* the fewest keys a decode split takes; 0: the backend's 256 */
  int32_t graph_slots;     /* captures kept at once, one per graph signature */
  int32_t precision_f32;   /* the exact mode: every product and attention in f32 */
};

enum { TSR_CUDA_N_SETTINGS = 10, TSR_CUDA_SETTING_PRECISION = 9 };

struct tsr_cuda_setting_key {
  const char *key;    /* under `backend:` ("attention.decode") */
  const char *env;    /* "TESSERA_CUDA_ATTN_GQA_DECODE" */
  const char *values; /* what it takes, for messages and the printout */
};
/* Setting i's key, variable and values (i < TSR_CUDA_N_SETTINGS). */
const struct tsr_cuda_setting_key *tsr_cuda_setting_key(int i);

void tsr_cuda_settings_default(struct tsr_cuda_settings *s);
/* Setting i from the profile's text (a bool: true/false) or a variable's (a bool: 1/0;
** attention.decode: 2, 1 or 0); an unknown value is TSR_ERR_INVALID_ARG naming `where`,
** the key and what it takes. */
tsr_status tsr_cuda_setting_parse(struct tsr_cuda_settings *s, int i, const char *text,
                                  bool from_env, const char *where);
/* Setting i's value as the profile writes it. */
const char *tsr_cuda_setting_text(const struct tsr_cuda_settings *s, int i, char *buf,
                                  size_t cap);
/* backend.precision f32, the exact mode: every product and attention with f32 operands and
** sums, so the backend matches the cpu's f32 path to rounding. It sets gemm f32, gemv f32 and
** attention.decode tile (the GQA decode kernel and the prefill tiles' tensor cores take f16
** operands; the backend's attention skips its tensor-core kernel itself). given[i] says where
** setting i was written (a profile's line, a variable's name) or is NULL: a value written
** there that the exact mode contradicts is TSR_ERR_INVALID_ARG naming it. forced[i] (when
** not NULL) says which settings it changed. */
tsr_status tsr_cuda_settings_resolve(struct tsr_cuda_settings *s,
                                     const char *const given[TSR_CUDA_N_SETTINGS],
                                     bool forced[TSR_CUDA_N_SETTINGS]);
/* Applies every TESSERA_CUDA_* variable that is set and not empty; overridden[i] (when
** not NULL) gets the variable that set setting i, else NULL. */
tsr_status tsr_cuda_settings_from_env(struct tsr_cuda_settings *s,
                                      const char *overridden[TSR_CUDA_N_SETTINGS]);

#endif
