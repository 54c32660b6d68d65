/*
** What the embedding API (tessera/tessera.h) keeps per engine beyond the
** engine itself: the tokenizer, the chosen chat template, the logits of the
** last evaluated token, the cancel flag and the last generation's figures.
*/
#ifndef TSR_EMBED_H
#define TSR_EMBED_H

struct tsr_embed;

#include <stddef.h>
#include <stdint.h>

#include "tessera/tessera.h"

/* Frees the state (NULL: nothing). */
void tsr_embed_free(struct tsr_embed *s);

/* The bytes token id of e's vocabulary decodes to, or NULL out of range; and the
** vocabulary's size (tokens the tokenizer knows, which the logits may pad). */
const char *tsr_embed_piece(tsr_engine *e, int32_t id, size_t *len);
int32_t tsr_embed_n_tokens(tsr_engine *e);

/* host->spec: draft models for speculators (spec_model.c) */
extern const struct tsr_host_spec tsr_host_spec_services;

#endif
