/*
** A chat over libtessera: opens a profile (the default one when none is
** given), then for each user line on stdin renders the conversation with the
** model's chat template, generates the reply and streams it to stdout.
**
**   cc chat.c $(pkg-config --cflags --libs tessera) -o chat
**   printf 'Hello\nAnd then?\n' | ./chat [PROFILE.yaml] [key=value]...
*/
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tessera/tessera.h>

#define MAX_TURNS 64

static int stream(void *user, int32_t token, const char *text, size_t len) {
  (void)token;
  fwrite(text, 1, len, stdout);
  fflush(stdout);
  /* keep the reply: it is part of the conversation the next turn renders */
  char **reply = user;
  size_t have = *reply ? strlen(*reply) : 0;
  char *grown = realloc(*reply, have + len + 1);
  if (!grown) return 0; /* stop: out of memory */
  memcpy(grown + have, text, len);
  grown[have + len] = 0;
  *reply = grown;
  return 1;
}

static int fail(const char *what, tsr_engine *e) {
  fprintf(stderr, "chat: %s: %s\n", what, tsr_error_message());
  tsr_engine_close(e);
  return 1;
}

int main(int argc, char **argv) {
  const char *profile = argc > 1 && !strchr(argv[1], '=') ? argv[1] : NULL;
  const int first_set = profile ? 2 : 1;
  tsr_engine *e = NULL;
  if (tsr_engine_open(profile, NULL, (const char *const *)argv + first_set, argc - first_set,
                      &e) != TSR_OK)
    return fail("open", NULL);
  tsr_sampler *s = NULL;
  if (tsr_sampler_open(e, NULL, 0, &s) != TSR_OK) return fail("sampler", e);
  const char *roles[2 * MAX_TURNS];
  char *contents[2 * MAX_TURNS];
  size_t n = 0;
  char line[4096];
  int code = 0;
  while (n + 2 <= 2 * MAX_TURNS && fgets(line, sizeof line, stdin)) {
    line[strcspn(line, "\r\n")] = 0;
    if (!*line) continue;
    roles[n] = "user";
    contents[n++] = strdup(line);
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    char *reply = NULL;
    enum tsr_stop stop;
    if (tsr_chat_tokenize(e, roles, (const char *const *)contents, n, 1, &prompt, &n_prompt) !=
            TSR_OK ||
        tsr_generate(e, 0, s, prompt, n_prompt, tsr_engine_max_tokens(e), 4, stream, &reply,
                     &stop) != TSR_OK) {
      fprintf(stderr, "chat: %s\n", tsr_error_message());
      tsr_free(prompt);
      free(reply);
      code = 1;
      break;
    }
    tsr_free(prompt);
    printf("\n[%g tokens, %s]\n", tsr_engine_stat(e, TSR_STAT_GENERATED),
           stop == TSR_STOP_EOG ? "end of turn" : "limit");
    roles[n] = "assistant";
    contents[n++] = reply ? reply : strdup("");
  }
  for (size_t i = 0; i < n; i++) free(contents[i]);
  tsr_sampler_close(s);
  tsr_engine_close(e);
  return code;
}
