/* Built-in chat templates: recognised from the GGUF's Jinja text, rendered in C. */
#include "model/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

struct family {
  enum tsr_chat_template id;
  const char *name;
  const char *marker; /* a token only this family's templates write */
};

/* Order matters only if a template held two markers; none of the real ones does. */
static const struct family g_families[] = {
    {TSR_CHAT_CHATML, "chatml", "<|im_start|>"},
    {TSR_CHAT_GEMMA, "gemma", "<start_of_turn>"},
    {TSR_CHAT_GEMMA4, "gemma4", "<|turn>"},
};
#define N_FAMILIES (sizeof g_families / sizeof g_families[0])

const char *tsr_chat_template_name(enum tsr_chat_template t) {
  for (size_t i = 0; i < N_FAMILIES; i++)
    if (g_families[i].id == t) return g_families[i].name;
  return "?";
}

tsr_status tsr_chat_template_parse(const char *name, enum tsr_chat_template *out) {
  for (size_t i = 0; i < N_FAMILIES; i++)
    if (!strcmp(name, g_families[i].name)) {
      *out = g_families[i].id;
      return TSR_OK;
    }
  return tsr_error_set(TSR_ERR_INVALID_ARG,
                       "chat template '%s' is not built in (chatml, gemma, gemma4)", name);
}

tsr_status tsr_chat_template_detect(const char *text, enum tsr_chat_template *out) {
  if (!text || !*text)
    return tsr_error_set(TSR_ERR_UNSUPPORTED, "the model has no tokenizer.chat_template");
  for (size_t i = 0; i < N_FAMILIES; i++)
    if (strstr(text, g_families[i].marker)) {
      *out = g_families[i].id;
      return TSR_OK;
    }
  /* Show the start of what was found, on one line, so the user can tell what it is. */
  char head[61];
  size_t n = 0;
  for (const char *p = text; *p && n + 1 < sizeof head; p++)
    head[n++] = (*p == '\n' || *p == '\r' || *p == '\t') ? ' ' : *p;
  head[n] = 0;
  return tsr_error_set(TSR_ERR_UNSUPPORTED,
                       "tokenizer.chat_template (%zu bytes, \"%s%s\") is none of the built-in "
                       "templates: it has no <|im_start|> (chatml), <start_of_turn> (gemma) or "
                       "<|turn> (gemma4)", strlen(text), head, strlen(text) > n ? "..." : "");
}

/* ---- rendering ---- */

struct sbuf {
  char *p;
  unsigned char *mark; /* per byte: 1 written by the template, 0 from a message */
  size_t len, cap;
  bool failed, in_message;
};

static void sb_put(struct sbuf *b, const char *s, size_t n) {
  if (b->failed) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *q = realloc(b->p, cap);
    if (q) b->p = q;
    unsigned char *m = q ? realloc(b->mark, cap) : NULL;
    if (!m) {
      b->failed = true;
      return;
    }
    b->mark = m;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  memset(b->mark + b->len, !b->in_message, n);
  b->len += n;
  b->p[b->len] = 0;
}

static void sb_str(struct sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* A message's own text: never parsed for special tokens. */
static void sb_message(struct sbuf *b, const char *s) {
  b->in_message = true;
  sb_str(b, s);
  b->in_message = false;
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' ||
                                      c == '\f' || c == '\v'; }

/* Jinja's trim: surrounding whitespace removed. */
static void sb_trimmed(struct sbuf *b, const char *s) {
  size_t n = strlen(s), i = 0;
  while (i < n && is_space(s[i])) i++;
  while (n > i && is_space(s[n - 1])) n--;
  b->in_message = true;
  sb_put(b, s + i, n - i);
  b->in_message = false;
}

static tsr_status check_role(const struct tsr_chat_message *m, size_t i) {
  if (!m->role || !m->content)
    return tsr_error_set(TSR_ERR_INVALID_ARG, "chat message %zu: role or content missing", i);
  if (strcmp(m->role, "system") && strcmp(m->role, "user") && strcmp(m->role, "assistant"))
    return tsr_error_set(TSR_ERR_INVALID_ARG, "chat message %zu: role '%s' is not system, user "
                         "or assistant", i, m->role);
  return TSR_OK;
}

static const char *gemma_role(const char *role) {
  return strcmp(role, "assistant") ? role : "model";
}

static void render_chatml(struct sbuf *b, const struct tsr_chat_message *msgs, size_t n,
                          bool gen) {
  for (size_t i = 0; i < n; i++) {
    sb_str(b, "<|im_start|>");
    sb_str(b, msgs[i].role);
    sb_str(b, "\n");
    sb_message(b, msgs[i].content);
    sb_str(b, "<|im_end|>\n");
  }
  if (gen) sb_str(b, "<|im_start|>assistant\n");
}

static tsr_status render_gemma(struct sbuf *b, const struct tsr_chat_message *msgs, size_t n,
                               bool gen) {
  const char *system = NULL;
  size_t first = 0;
  if (n && !strcmp(msgs[0].role, "system")) {
    system = msgs[0].content;
    first = 1;
  }
  for (size_t i = first; i < n; i++)
    if (!strcmp(msgs[i].role, "system"))
      return tsr_error_set(TSR_ERR_INVALID_ARG, "chat message %zu: gemma has no system role; "
                           "only a first system message is accepted (it joins the first turn)",
                           i);
  /* A system message with nothing after it still reaches the model, as a user turn. */
  if (system && first == n) {
    sb_str(b, "<start_of_turn>user\n");
    sb_trimmed(b, system);
    sb_str(b, "<end_of_turn>\n");
  }
  for (size_t i = first; i < n; i++) {
    sb_str(b, "<start_of_turn>");
    sb_str(b, gemma_role(msgs[i].role));
    sb_str(b, "\n");
    if (system && i == first) {
      sb_message(b, system);
      sb_str(b, "\n\n");
    }
    sb_trimmed(b, msgs[i].content);
    sb_str(b, "<end_of_turn>\n");
  }
  if (gen) sb_str(b, "<start_of_turn>model\n");
  return TSR_OK;
}

static void render_gemma4(struct sbuf *b, const struct tsr_chat_message *msgs, size_t n,
                          bool gen) {
  for (size_t i = 0; i < n; i++) {
    sb_str(b, "<|turn>");
    sb_str(b, gemma_role(msgs[i].role));
    sb_str(b, "\n");
    sb_message(b, msgs[i].content);
    sb_str(b, "<turn|>\n");
  }
  if (gen) sb_str(b, "<|turn>model\n");
}

tsr_status tsr_chat_render_marked(enum tsr_chat_template t, const struct tsr_chat_message *msgs,
                                  size_t n, bool add_generation_prompt, char **out,
                                  unsigned char **template_bytes) {
  *out = NULL;
  if (template_bytes) *template_bytes = NULL;
  for (size_t i = 0; i < n; i++) {
    tsr_status st = check_role(&msgs[i], i);
    if (st != TSR_OK) return st;
  }
  struct sbuf b = {0};
  sb_put(&b, "", 0); /* an empty conversation renders as "" */
  tsr_status st = TSR_OK;
  switch (t) {
  case TSR_CHAT_CHATML: render_chatml(&b, msgs, n, add_generation_prompt); break;
  case TSR_CHAT_GEMMA: st = render_gemma(&b, msgs, n, add_generation_prompt); break;
  case TSR_CHAT_GEMMA4: render_gemma4(&b, msgs, n, add_generation_prompt); break;
  default: st = tsr_error_set(TSR_ERR_INVALID_ARG, "chat template %d is not built in", (int)t);
  }
  if (st == TSR_OK && b.failed) st = tsr_error_set(TSR_ERR_NOMEM, "rendering a chat prompt");
  if (st != TSR_OK) {
    free(b.p);
    free(b.mark);
    return st;
  }
  *out = b.p;
  if (template_bytes) *template_bytes = b.mark;
  else free(b.mark);
  return TSR_OK;
}

tsr_status tsr_chat_render(enum tsr_chat_template t, const struct tsr_chat_message *msgs,
                           size_t n, bool add_generation_prompt, char **out) {
  return tsr_chat_render_marked(t, msgs, n, add_generation_prompt, out, NULL);
}
