/*
** What the embedding API (tessera/tessera.h) keeps per engine beyond the
** engine itself: the tokenizer, the chosen chat template, the logits of the
** last evaluated token, the cancel flag and the last generation's figures.
*/
#ifndef TSR_EMBED_H
#define TSR_EMBED_H

struct tsr_embed;

/* Frees the state (NULL: nothing). */
void tsr_embed_free(struct tsr_embed *s);

#endif
