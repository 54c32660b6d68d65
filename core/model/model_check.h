/*
** A model file checked against what its architecture makes of it, at load
** (setup.c, parity.c), so that an inconsistent GGUF is refused with its
** key or tensor named instead of running and writing different text:
**
**  - the arch plugin's validate() (struct tsr_arch_v1) checks each
**    hyperparameter against the tensor shapes it implies, that every layer
**    holds the tensors it needs, and its float keys' ranges, through the
**    host calls implemented here (tsr_model_f32_positive ..
**    tsr_model_check_layer_weights);
**  - every float hyperparameter (a scalar or array element of type f32 or
**    f64 under "<arch>.") must be finite, whether the plugin reads it or not;
**  - tensors that none of the model's graphs reads are warned of in one
**    line on stderr, never refused: a file may carry tensors only some paths
**    read (NextN heads, which the accounting builds too).
*/
#ifndef TSR_MODEL_CHECK_H
#define TSR_MODEL_CHECK_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "model/gguf.h"
#include "graph/graph.h"
#include "tessera/plugin.h"

/* validate() (when the plugin has one) and then the finite-float check.
** Errors are TSR_ERR_FORMAT with the plugin's or this file's message; the
** caller prefixes the file and plugin. */
tsr_status tsr_model_validate(const struct tsr_arch_v1 *arch, const struct tsr_gguf *model,
                              const struct tsr_arch_layer *layers, int32_t n_layers);

/* Every f32/f64 value under "<arch>." is finite: "qwen3.rope.freq_base is
** inf: must be a finite number". */
tsr_status tsr_model_check_floats(const struct tsr_gguf *model);

/* The model checks of host->gguf (tessera/plugin/gguf.h documents each). */
tsr_status tsr_model_f32_positive(const struct tsr_gguf *model, const char *key, float *out);
tsr_status tsr_model_weight_shape(const struct tsr_gguf *model, const char *name,
                                  int32_t *n_dims, int64_t ne[4]);
tsr_status tsr_model_check_weight(const struct tsr_gguf *model, const char *name, int32_t n_dims,
                                  const int64_t *ne, const char *const *why);
tsr_status tsr_model_check_layer_weights(const struct tsr_gguf *model, const char *suffix,
                                         const int32_t *layers, int32_t n, bool *present);

/* Which of a model's tensors its graphs read: used[i] for tensor i of the
** file (tsr_gguf_tensor_at), n_tensors entries the caller allocates zeroed. */
void tsr_model_note_used(const struct tsr_gguf *model, const struct tsr_graph *g, bool *used);
/* One line on f when some tensor is unused: how many, and the first few
** names. Returns how many are unused. */
int64_t tsr_model_warn_unused(const struct tsr_gguf *model, const bool *used, FILE *f);

#endif
