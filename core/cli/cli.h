/* Subcommands of the `tessera` command line. Each takes argv with argv[0]
** set to the subcommand's name and returns the process exit code:
** 0 success, 1 runtime error, 2 usage / profile / input error. */
#ifndef TSR_CLI_H
#define TSR_CLI_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { TSR_EXIT_OK = 0, TSR_EXIT_RUNTIME = 1, TSR_EXIT_USAGE = 2 };

/* A whole decimal integer in [lo, hi]; false for anything else. */
static inline bool tsr_cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

/* "--help", "-h" (and "help" where a subcommand name is expected) */
static inline bool tsr_cli_is_help(const char *arg) {
  return !strcmp(arg, "--help") || !strcmp(arg, "-h") || !strcmp(arg, "help");
}

/* The flags of every command that opens one engine: -m/--model, --profile,
** --set key=value and --threads/-t. */
#define TSR_CLI_MAX_SETS 64
struct tsr_cli_engine_args {
  const char *model, *profile;
  const char *sets[TSR_CLI_MAX_SETS];
  int n_sets, threads;
};

/* 1: f is one of those flags and took v; 0: f is not one of them; -1: v is not
** valid for it (or more than 62 --set: one slot stays for a preset). */
static inline int tsr_cli_engine_flag(struct tsr_cli_engine_args *a, const char *f,
                                      const char *v) {
  int64_t n;
  if (!strcmp(f, "-m") || !strcmp(f, "--model")) a->model = v;
  else if (!strcmp(f, "--profile")) a->profile = v;
  else if (!strcmp(f, "--threads") || !strcmp(f, "-t")) {
    if (!tsr_cli_parse_i64(v, 1, 4096, &n)) return -1;
    a->threads = (int)n;
  } else if (!strcmp(f, "--set")) {
    if (a->n_sets >= TSR_CLI_MAX_SETS - 1) return -1;
    a->sets[a->n_sets++] = v;
  } else return 0;
  return 1;
}

/* Puts key=value before the user's --set overrides, so that a user's --set of
** the same key still wins (the command's own default, e.g. the context). */
static inline void tsr_cli_engine_preset(struct tsr_cli_engine_args *a, const char *set) {
  memmove(a->sets + 1, a->sets, (size_t)a->n_sets * sizeof *a->sets);
  a->sets[0] = set;
  a->n_sets++;
}

int tsr_cli_gguf(int argc, char **argv);
int tsr_cli_gen_model(int argc, char **argv);
int tsr_cli_plugins(int argc, char **argv);
int tsr_cli_profile(int argc, char **argv);
int tsr_cli_convert(int argc, char **argv);
int tsr_cli_parity(int argc, char **argv);
int tsr_cli_run(int argc, char **argv);
int tsr_cli_perplexity(int argc, char **argv);
int tsr_cli_logit_eq(int argc, char **argv);
int tsr_cli_serve(int argc, char **argv);
int tsr_cli_ruler(int argc, char **argv);
int tsr_cli_ab(int argc, char **argv);
int tsr_cli_bench(int argc, char **argv);

#endif
