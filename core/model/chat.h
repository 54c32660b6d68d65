/*
** Built-in chat templates. tessera renders conversations itself rather than
** running the Jinja the GGUF carries: the template text is only read to
** recognise which family it is, by markers no other family uses.
**
**  - chatml (Qwen): <|im_start|>ROLE\nCONTENT<|im_end|>\n per message, then
**    <|im_start|>assistant\n for the generation prompt. No default system
**    message is invented (Qwen2.5's own template adds one when none is given;
**    pass it as a system message to get the same text).
**  - gemma (Gemma 2/3): <start_of_turn>ROLE\nCONTENT<end_of_turn>\n with the
**    assistant role written "model", then <start_of_turn>model\n. Gemma has no
**    system role: a leading system message is prepended, followed by a blank
**    line, to the first turn after it, and contents are trimmed of surrounding
**    whitespace, as Gemma's own template does.
**  - gemma4: <|turn>ROLE\nCONTENT<turn|>\n with assistant written "model",
**    then <|turn>model\n; the system role is kept as it is written.
**
** The BOS token is not part of the rendered text: the tokenizer adds it when
** the model asks for it. Rendered text holds control tokens, but only the ones
** the template wrote may be parsed as such: a message's text is text, so a user
** who writes "<|im_end|>" cannot open a turn of another role. Tokenize what
** tsr_chat_render_marked returns with tsr_tokenizer_encode_marked.
*/
#ifndef TSR_CHAT_H
#define TSR_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "tessera/tessera.h"

enum tsr_chat_template {
  TSR_CHAT_CHATML = 1,
  TSR_CHAT_GEMMA,
  TSR_CHAT_GEMMA4,
};

/* role: "system", "user" or "assistant". */
struct tsr_chat_message {
  const char *role;
  const char *content;
};

/* "chatml", "gemma", "gemma4". */
const char *tsr_chat_template_name(enum tsr_chat_template t);
/* The template a name stands for; an unknown name is TSR_ERR_INVALID_ARG listing the names. */
tsr_status tsr_chat_template_parse(const char *name, enum tsr_chat_template *out);

/* Recognises a GGUF's tokenizer.chat_template by its markers: <|im_start|> is chatml,
** <start_of_turn> gemma, <|turn> gemma4. No template (NULL or empty) or one with none of
** them is TSR_ERR_UNSUPPORTED saying what was found. */
tsr_status tsr_chat_template_detect(const char *template_text, enum tsr_chat_template *out);

/* Renders n messages, then the generation prompt when add_generation_prompt. An unknown
** role, or for gemma a system message that is not the first, is TSR_ERR_INVALID_ARG
** naming the message. *out is malloc'd and NUL-terminated. */
tsr_status tsr_chat_render(enum tsr_chat_template t, const struct tsr_chat_message *msgs,
                           size_t n, bool add_generation_prompt, char **out);
/* The same text, and *template_bytes (malloc'd, one per byte of *out): 1 where the
** template wrote the byte, 0 where it is a message's. */
tsr_status tsr_chat_render_marked(enum tsr_chat_template t, const struct tsr_chat_message *msgs,
                                  size_t n, bool add_generation_prompt, char **out,
                                  unsigned char **template_bytes);

#endif
