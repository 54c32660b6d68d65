/*
** Tokenizers read from a GGUF's tokenizer.* keys.
**
** Three families:
**  - "gpt2": byte-level BPE (GPT-2's byte <-> unicode mapping, merges ranked
**    by their order in tokenizer.ggml.merges), after a pre-tokenizer regex
**    chosen by tokenizer.ggml.pre ("qwen2", "qwen35"; PCRE2 with Unicode
**    properties) and NFC normalization (utf8proc), as the Qwen tokenizers do.
**  - "llama": SentencePiece BPE as Gemma 3 ships it: spaces become U+2581,
**    no pre-tokenizer, pieces merged by highest score, characters missing from
**    the vocabulary fall back to <0xXX> byte tokens.
**  - "gemma4": Gemma 4's tokenizer.json BPE as `tessera convert` and
**    llama.cpp's converter write it (every score -1000): text as for "llama"
**    (U+2581 for spaces, byte fallback, no dummy prefix), merged by rank in
**    tokenizer.ggml.merges. The whole stretch between added tokens is one
**    word, as in the reference (its Split-on-space pre-tokenizer runs after
**    the normalizer has replaced every space), so pieces such as ":\n" form
**    across newlines; llama.cpp splits newline runs off first and can differ.
**
** Added tokens: every CONTROL, UNKNOWN and USER_DEFINED token is matched
** literally in the raw text (leftmost, then longest) before normalization.
** USER_DEFINED tokens are always matched; CONTROL and UNKNOWN ones only when
** the caller asks (parse_special); unparsed, their text is ordinary text, but
** the match still covers it, so no USER_DEFINED token is found inside it
** (as in the reference, Hugging Face tokenizers).
**
** Decoding renders every token, control tokens included, as its text; byte
** tokens become raw bytes, so a piece may end inside a UTF-8 character
** (tsr_utf8_stream reassembles them for streaming output). Decoded text is
** the exact bytes the tokens stand for: invalid UTF-8 that was encoded
** byte-level decodes back to the same bytes.
**
** A tokenizer copies what it needs: it outlives the GGUF it was loaded from.
** Encoding and decoding only read the tokenizer, so one tokenizer may be used
** from several threads at once.
*/
#ifndef TSR_TOKENIZER_H
#define TSR_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"
#include "tessera/tessera.h"

/* tokenizer.ggml.token_type values (SentencePiece's numbering). */
enum tsr_token_type {
  TSR_TOKEN_UNDEFINED = 0,
  TSR_TOKEN_NORMAL = 1,
  TSR_TOKEN_UNKNOWN = 2,
  TSR_TOKEN_CONTROL = 3,
  TSR_TOKEN_USER_DEFINED = 4,
  TSR_TOKEN_UNUSED = 5,
  TSR_TOKEN_BYTE = 6,
};

struct tsr_tokenizer; /* opaque */

/*
** Reads tokenizer.ggml.model, .pre, .tokens, .token_type, .merges, .scores,
** the bos/eos/unk/pad/eot/eom ids, add_bos_token/add_eos_token and
** tokenizer.chat_template. A missing or malformed key, a token id out of
** range or a merge naming an unknown piece is TSR_ERR_FORMAT naming the key;
** an unknown model or pre-tokenizer is TSR_ERR_UNSUPPORTED naming it.
*/
tsr_status tsr_tokenizer_load(const struct tsr_gguf *model, struct tsr_tokenizer **out);
void tsr_tokenizer_free(struct tsr_tokenizer *tok);

/*
** Encodes len bytes of text (any bytes; NULs included). With add_special the
** model's BOS is prepended when the GGUF asks for it (add_bos_token; absent
** means yes for "llama" and "gemma4", no for "gpt2"), and EOS appended when
** add_eos_token says so. *ids is malloc'd (free() it; NULL when *n is 0).
*/
tsr_status tsr_tokenizer_encode(const struct tsr_tokenizer *tok, const char *text, size_t len,
                                bool parse_special, bool add_special, int32_t **ids, size_t *n);
/* As tsr_tokenizer_encode with parse_special, but a special token is parsed only
** where every byte of it has special_ok[byte] set (special_ok: len flags, or NULL
** for all): a chat prompt's template markers are tokens, the same characters in a
** message are text (tsr_chat_render_marked). User-defined added tokens are matched
** everywhere, as with parse_special off. */
tsr_status tsr_tokenizer_encode_marked(const struct tsr_tokenizer *tok, const char *text,
                                       size_t len, bool parse_special,
                                       const unsigned char *special_ok, bool add_special,
                                       int32_t **ids, size_t *n);

/* The concatenated pieces of n ids, NUL-terminated (the text itself may hold
** NULs; *len, if not NULL, gets its length). An id out of range is
** TSR_ERR_INVALID_ARG naming it. *text is malloc'd. */
tsr_status tsr_tokenizer_decode(const struct tsr_tokenizer *tok, const int32_t *ids, size_t n,
                                char **text, size_t *len);

/* The bytes one token decodes to (not NUL-terminated; valid while tok lives),
** or NULL for an id out of range. */
const char *tsr_tokenizer_piece(const struct tsr_tokenizer *tok, int32_t id, size_t *len);

/* The token's text as stored in the GGUF (NUL-terminated), or NULL. */
const char *tsr_tokenizer_token_text(const struct tsr_tokenizer *tok, int32_t id);
enum tsr_token_type tsr_tokenizer_token_type(const struct tsr_tokenizer *tok, int32_t id);
/* The id whose stored text is exactly these bytes, or -1. */
int32_t tsr_tokenizer_find(const struct tsr_tokenizer *tok, const char *text, size_t len);

int32_t tsr_tokenizer_n_vocab(const struct tsr_tokenizer *tok);
int32_t tsr_tokenizer_bos(const struct tsr_tokenizer *tok); /* -1 if none */
int32_t tsr_tokenizer_eos(const struct tsr_tokenizer *tok); /* -1 if none */
int32_t tsr_tokenizer_pad(const struct tsr_tokenizer *tok); /* -1 if none */
/* Whether add_special prepends BOS / appends EOS. */
bool tsr_tokenizer_adds_bos(const struct tsr_tokenizer *tok);
bool tsr_tokenizer_adds_eos(const struct tsr_tokenizer *tok);
/* tokenizer.ggml.model and .pre as read ("gpt2"/"llama"/"gemma4"; pre may be "default"). */
const char *tsr_tokenizer_model_name(const struct tsr_tokenizer *tok);
const char *tsr_tokenizer_pre_name(const struct tsr_tokenizer *tok);
/* tokenizer.chat_template, or NULL when the GGUF has none. */
const char *tsr_tokenizer_chat_template(const struct tsr_tokenizer *tok);

/* End of generation: the eos, eot and eom ids, and the control tokens
** <|endoftext|>, <|im_end|>, <end_of_turn>, <|eot_id|>, <|eom_id|>, <|end|>, <turn|>. */
bool tsr_tokenizer_is_eog(const struct tsr_tokenizer *tok, int32_t id);

/*
** Streaming output: pieces go in as they are generated, and only whole UTF-8
** characters come out; a character split across tokens waits for its last
** byte. Bytes that can never become a valid character are passed through
** unchanged as soon as that is known, so output never stalls.
*/
struct tsr_utf8_stream {
  unsigned char pending[4];
  uint32_t n_pending;
};
#define TSR_UTF8_STREAM_INIT                                                                       \
  { {0}, 0 }
/* Writes up to len + 3 bytes to out; returns how many. */
size_t tsr_utf8_stream_push(struct tsr_utf8_stream *s, const char *piece, size_t len, char *out);
/* Writes what is still pending (at most 3 bytes, an incomplete character). */
size_t tsr_utf8_stream_flush(struct tsr_utf8_stream *s, char *out);

#endif
