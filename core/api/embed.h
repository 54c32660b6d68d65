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

/* Prefix reuse: keeps what of tokens[0..n) (n >= 1) seq already holds, at most n - 1
** (the last is evaluated again for its logits), forgets the rest (all of it where the
** sequence cannot resume mid-way); *keep is how many it kept. */
tsr_status tsr_embed_hold_prefix(tsr_engine *e, int32_t seq, const int32_t *tokens, int32_t n,
                                 int32_t *keep);

/* host->spec: draft models for speculators (spec_model.c) */
extern const struct tsr_host_spec tsr_host_spec_services;

#endif
