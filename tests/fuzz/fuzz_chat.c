/* libFuzzer target: chat template rendering (core/model/chat.c) with arbitrary
** messages and template choice, the messages given either as raw fields or
** as a JSON request body read with core/model/json.c, the way `tessera serve` reads
** /v1/chat/completions.
**
** Input: one flag byte, then the payload.
**   bits 0-1: the template (0 is no template at all: it must be refused)
**   bit 2: add_generation_prompt
**   bit 3: the payload is JSON {"messages": [{"role": .., "content": ..}, ..]}
**          (content a string or a list of {"type": "text", "text": ..} parts);
**          otherwise NUL-separated fields role, content, role, content, ...
**          (a one-byte role stands for system, user, assistant or itself; an
**          odd field count leaves the last message without content)
**   bit 4: the payload is also read as a GGUF's chat template text (detect)
** Checked for every rendering that succeeds: the text is what
** tsr_chat_render gives; the bytes marked as a message's are the contents
** (trimmed as Gemma trims them), in order; the bytes marked as the template's
** are what the same conversation renders to with every content empty. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/chat.h"
#include "common/error.h"
#include "model/json.h"

#define REQUIRE(c) do { if (!(c)) __builtin_trap(); } while (0)

#define MAX_MESSAGES 64

static volatile uint64_t g_sink;

struct buf {
  char *p;
  size_t n, cap;
};

static void put(struct buf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    b->cap = (b->n + n + 1) * 2;
    b->p = realloc(b->p, b->cap);
    if (!b->p) abort();
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = '\0';
}

static bool is_space(char c) { return c && strchr(" \t\n\r\f\v", c); }

static void put_trimmed(struct buf *b, const char *s) {
  size_t n = strlen(s), i = 0;
  while (i < n && is_space(s[i])) i++;
  while (n > i && is_space(s[n - 1])) n--;
  put(b, s + i, n - i);
}

/* The bytes the messages contribute, as chat.h documents them. */
static void expected_message_bytes(enum tsr_chat_template t, const struct tsr_chat_message *m,
                                   size_t n, struct buf *out) {
  if (t != TSR_CHAT_GEMMA) {
    for (size_t i = 0; i < n; i++) put(out, m[i].content, strlen(m[i].content));
    return;
  }
  size_t first = n && !strcmp(m[0].role, "system");
  if (first && n == 1) put_trimmed(out, m[0].content); /* a system message alone is a user turn */
  else if (first) put(out, m[0].content, strlen(m[0].content));
  for (size_t i = first; i < n; i++) put_trimmed(out, m[i].content);
}

static void render(enum tsr_chat_template t, const struct tsr_chat_message *m, size_t n,
                   bool gen) {
  char *text, *plain;
  unsigned char *marks;
  tsr_error_clear();
  tsr_status st = tsr_chat_render_marked(t, m, n, gen, &text, &marks);
  tsr_status st2 = tsr_chat_render(t, m, n, gen, &plain);
  REQUIRE(st == st2);
  if (st != TSR_OK) {
    REQUIRE(!text && !marks && !plain && tsr_error_message()[0]);
    return;
  }
  size_t len = strlen(text);
  REQUIRE(!strcmp(text, plain));
  free(plain);

  struct buf msg = {0}, tmpl = {0}, want = {0};
  put(&msg, "", 0);
  put(&tmpl, "", 0);
  put(&want, "", 0);
  for (size_t i = 0; i < len; i++) {
    REQUIRE(marks[i] <= 1);
    put(marks[i] ? &tmpl : &msg, text + i, 1);
  }
  expected_message_bytes(t, m, n, &want);
  REQUIRE(msg.n == want.n && !memcmp(msg.p, want.p, msg.n));

  struct tsr_chat_message *empty = malloc((n ? n : 1) * sizeof *empty);
  for (size_t i = 0; i < n; i++) empty[i] = (struct tsr_chat_message){m[i].role, ""};
  char *bare;
  REQUIRE(tsr_chat_render(t, empty, n, gen, &bare) == TSR_OK);
  REQUIRE(!strcmp(bare, tmpl.p));
  free(bare);
  free(empty);
  free(msg.p);
  free(tmpl.p);
  free(want.p);
  free(text);
  free(marks);
}

/* ---- messages from raw fields ------------------------------------------------- */

static const char *role_of(const char *field) {
  static const char *const roles[] = {"system", "user", "assistant"};
  if (strlen(field) == 1 && (unsigned char)field[0] % 4 < 3) return roles[(unsigned char)field[0] % 4];
  return field;
}

static void from_fields(enum tsr_chat_template t, bool gen, const char *p, size_t len) {
  struct tsr_chat_message m[MAX_MESSAGES];
  size_t n = 0;
  const char *end = p + len;
  /* the payload was copied with a NUL after it, so every field is a string */
  while (p < end && n < MAX_MESSAGES) {
    const char *role = p;
    p += strlen(p) + 1;
    m[n].role = role_of(role);
    m[n].content = p < end ? p : NULL;
    n++;
    if (p < end) p += strlen(p) + 1;
  }
  render(t, m, n, gen);
}

/* ---- messages from a JSON body, as the server reads them ------------------------ */

static void from_json(enum tsr_chat_template t, bool gen, const char *p, size_t len) {
  cJSON *root;
  tsr_error_clear();
  if (tsr_json_parse(p, len, "request body", &root) != TSR_OK) {
    REQUIRE(root == NULL && tsr_error_message()[0]);
    return;
  }
  int64_t i64;
  double f64;
  bool b;
  const char *s;
  g_sink += tsr_json_i64(root, "body", "max_tokens", &i64) +
            tsr_json_f64(root, "body", "temperature", &f64) +
            tsr_json_bool(root, "body", "stream", &b) + tsr_json_str(root, "body", "model", &s) +
            tsr_json_str(root, "body", "messages.0.role", &s) +
            tsr_json_arr_str(root, "body", "stop", 0, &s);
  const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
  struct tsr_chat_message m[MAX_MESSAGES];
  char *owned[MAX_MESSAGES] = {0};
  size_t n = 0;
  bool ok = cJSON_IsArray(msgs);
  for (const cJSON *x = ok ? msgs->child : NULL; x && ok && n < MAX_MESSAGES; x = x->next) {
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(x, "role");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(x, "content");
    if (!cJSON_IsObject(x) || !cJSON_IsString(role)) {
      ok = false;
      break;
    }
    m[n].role = role->valuestring;
    if (cJSON_IsString(content)) {
      m[n].content = content->valuestring;
    } else if (cJSON_IsArray(content)) {
      struct buf joined = {0};
      put(&joined, "", 0);
      for (const cJSON *part = content->child; part && ok; part = part->next) {
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (cJSON_IsString(text)) put(&joined, text->valuestring, strlen(text->valuestring));
        else ok = false;
      }
      owned[n] = joined.p;
      m[n].content = joined.p;
    } else {
      m[n].content = NULL; /* render must refuse it, naming the message */
    }
    n++;
  }
  if (ok) render(t, m, n, gen);
  for (size_t i = 0; i < n; i++) free(owned[i]);
  cJSON_Delete(root);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const unsigned flags = data[0];
  const enum tsr_chat_template t = (enum tsr_chat_template)(flags & 3);
  const bool gen = flags & 4;
  const size_t len = size - 1;
  char *p = malloc(len + 1);
  memcpy(p, data + 1, len);
  p[len] = '\0';

  if (flags & 8) from_json(t, gen, p, len);
  else from_fields(t, gen, p, len);

  if (flags & 16) {
    enum tsr_chat_template found = 0;
    tsr_status st = tsr_chat_template_detect(p, &found);
    REQUIRE(st == TSR_OK ? found >= TSR_CHAT_CHATML && found <= TSR_CHAT_GEMMA4
                         : st == TSR_ERR_UNSUPPORTED);
    enum tsr_chat_template named;
    st = tsr_chat_template_parse(p, &named);
    REQUIRE(st == TSR_OK ? !strcmp(tsr_chat_template_name(named), p) : st == TSR_ERR_INVALID_ARG);
  }
  REQUIRE(tsr_chat_template_name(t) != NULL);
  free(p);
  return 0;
}
