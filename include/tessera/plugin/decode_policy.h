/*
** tessera plugin ABI: the decode_policy interface and the parameters it hands
** an attention kernel on decode steps.
*/
#ifndef TESSERA_PLUGIN_DECODE_POLICY_H
#define TESSERA_PLUGIN_DECODE_POLICY_H

#include "tessera/plugin/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- decode policies' parameters ------------------------------------------ */

/* What an attention kernel did under a layer's decode parameters; the kernel adds
** to it (atomically: threads share it), the host reports it to the policy. */
struct tsr_decode_counters {
  uint64_t v_rows_read;    /* V rows of visible keys a decode step weighed */
  uint64_t v_rows_skipped; /* of them, skipped for a weight below the threshold */
  /* ABI 2.2 */
  uint64_t query_rows;      /* (query head, decode step) rows the mass below is over */
  uint64_t mass_dropped_e9; /* sum over those rows of the softmax mass their skipped V
                            ** rows carried (against the row's final normaliser), in
                            ** units of 1e-9 */
};

/* The counters' mass unit: a row that dropped mass x adds round(x * 1e9). */
#define TSR_DECODE_MASS_UNIT 1e9

/* What the decode policies of one layer ask of its attention on a decode step (one
** token of one sequence). The host fills one per layer from the policies' params
** hooks and hands it to an attention that honours them (tsr_attention_v1.
** honours_decode) in tsr_attn_call.decode. */
struct tsr_decode_params {
  uint32_t struct_size;
  /* > 0: a V row is skipped when every query head reading it weighs it below this
  ** against the running max, exp(s - m_run): conservative, the final weight can
  ** only be smaller. The running max and sum stay exact. 0: every row is read. */
  float v_skip_threshold;
  int32_t sink;   /* keys at positions below sink are never skipped */
  int32_t recent; /* nor keys within recent positions of the query */
  struct tsr_decode_counters *counters; /* the layer's (host memory) */
  /* ABI 2.2 */
  /* > 0: a mass budget: a first pass over the keys finds each row's final max M and sum
  ** L, then a V row is skipped when every query head reading it weighs it below
  ** budget / (visible keys) of its softmax, exp(s - M) / L: each row drops at most
  ** `budget` of its mass, against its true normaliser. With a threshold too, a row is
  ** skipped only when both say so. The cpu's kernels only (profile check refuses it
  ** elsewhere). */
  float v_skip_budget;
};

struct tsr_attention_v1;

/* ---- decode_policy, version 1 ------------------------------------------ */

struct tsr_decode_policy_v1 {
  uint32_t struct_size;
  const char *name;
  void *ctx;
  /* Whether the policy can act on this layer with this attention
  ** implementation (e.g. needs v_skip). */
  tsr_status (*negotiate)(void *ctx, const struct tsr_layer_desc *layer,
                          const struct tsr_attention_v1 *attention);
  /* Its parameters for the layer (p arrives zeroed but for struct_size
  ** and counters; leaving it so keeps the policy off the layer). Two policies
  ** setting the same parameter of a layer are refused. */
  tsr_status (*params)(void *ctx, const struct tsr_layer_desc *layer,
                       struct tsr_decode_params *p);
  /* ABI 2.2 */
  /* Why params says what it says for this layer, in a few words the composition
  ** printout shows beside the parameters ("auto: full-attention layer of an iSWA
  ** model, q8_0 V"); writes at most n bytes, NUL included. NULL: nothing to add. */
  void (*describe)(void *ctx, const struct tsr_layer_desc *layer, char *out, size_t n);
};

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_PLUGIN_DECODE_POLICY_H */
