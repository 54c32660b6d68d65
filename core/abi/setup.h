/*
** From a profile to a negotiated composition: load the profile, load the
** plugins it declares (with their settings), open the model, ask the arch
** plugin for the layer plan, negotiate attention x codecs x policies x
** speculator, and plan memory. Every step fails with a message naming the
** file, key, plugin or layer at fault; nothing is skipped.
*/
#ifndef TSR_SETUP_H
#define TSR_SETUP_H

#include <stdio.h>

#include "model/chat.h"
#include "abi/composition.h"
#include "model/gguf.h"
#include "abi/plugin_host.h"
#include "profile/profile.h"

#define TSR_MAX_LAYERS 512

struct tsr_memory_plan {
  uint64_t weights;                         /* tensor bytes of the model file */
  uint64_t kv[TSR_LAYER_KIND_COUNT];        /* KV cache (or state) per layer kind */
  uint64_t kv_cells[TSR_LAYER_KIND_COUNT];  /* cells per layer of that kind */
  bool compute_known;                       /* the arch builds graphs to plan */
  bool drafter;                             /* layers read a paired target's K/V */
  uint64_t compute;                         /* planned arena of one ubatch's forward graph */
  uint64_t compute_tokens;
  uint64_t lift;                            /* the largest layer's K/V lifted to f16 on a
                                            ** device (own-layout codecs), whole context */
  uint64_t total;
  uint64_t limit;                           /* 0: none */
};

struct tsr_setup {
  struct tsr_profile *profile;
  struct tsr_plugin_host *host;
  char model_path[1024];
  struct tsr_gguf *model;
  const char *arch_name;
  const struct tsr_arch_v1 *arch;
  const struct tsr_plugin *arch_owner;
  struct tsr_arch_layer layers[TSR_MAX_LAYERS];
  int32_t n_layers;
  struct tsr_composition_request request; /* what composition answers */
  struct tsr_composition composition;
  struct tsr_memory_plan memory;
};

/* Runs every step; on failure *out is still set (partially filled, so the
** caller can print what succeeded) and must be freed. */
tsr_status tsr_setup_from_profile(const char *profile_path, const char *const *sets, int n_sets,
                                  struct tsr_setup **out);
/* The same from a profile held in memory; name labels messages and is the
** base of relative paths (its directory). */
tsr_status tsr_setup_from_profile_text(const char *name, const char *text,
                                       const char *const *sets, int n_sets,
                                       struct tsr_setup **out);
void tsr_setup_free(struct tsr_setup *s);

/* Proposals one speculation step verifies at most (its batch: the token and them). */
#define TSR_SPEC_MAX_DRAFT 8

/* The KV cache's parameters for this setup, one formula for the memory plan and
** the engine's allocation: the profile's context, parallel sequences and ubatch,
** and with a speculator on a model with linear layers the checkpoint rows a
** verify batch needs (TSR_SPEC_MAX_DRAFT + 1, or the ubatch when smaller). */
struct tsr_kv_cache_params;
void tsr_setup_kv_params(const struct tsr_setup *s, struct tsr_kv_cache_params *out);

/* The attention implementation each layer kind negotiated, for a forward
** pass's attention_kind (struct tsr_arch_forward) or a shift's
** (struct tsr_kv_shift). */
void tsr_setup_attention_kinds(const struct tsr_setup *s,
                               const struct tsr_attention_v1 *out[TSR_LAYER_KIND_COUNT]);

void tsr_memory_plan_print(const struct tsr_memory_plan *m, FILE *f);
/* What `tessera profile check` prints: the resolved profile (when loaded) and, when
** complete (every step succeeded), the model, the composition and the memory plan. */
void tsr_setup_print(const struct tsr_setup *s, bool complete, FILE *f);

/* The chat template of the loaded model: the name in override when given,
** else what the GGUF's tokenizer.chat_template (gguf_template) is recognised
** as, else the arch plugin's built-in template for the architecture. *source
** says which ("override", "tokenizer.chat_template", "arch plugin NAME").
** None of them: TSR_ERR_UNSUPPORTED saying so. */
tsr_status tsr_setup_chat_template(const struct tsr_setup *s, const char *override,
                                   const char *gguf_template, enum tsr_chat_template *out,
                                   const char **source);

/* Where `model: default` points: $TESSERA_DEFAULT_MODEL, else the build
** tree's generated model, else the installed one. */
const char *tsr_default_model_path(void);

#endif
