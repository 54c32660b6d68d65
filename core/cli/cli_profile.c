/* `tessera profile check FILE`: the resolved profile, composition and memory plan. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "abi/setup.h"

static void profile_usage(FILE *f) {
  fprintf(f, "usage: tessera profile check FILE [--set key.path=value]...\n"
             "Loads the profile (extends, overrides, schema), loads its plugins, opens the\n"
             "model, negotiates the composition and plans memory. Prints all of it; exits 2\n"
             "naming the file, line and column (or plugin and layer) of the first problem.\n");
}

int tsr_cli_profile(int argc, char **argv) {
  if (argc >= 2 && (tsr_cli_is_help(argv[1]))) {
    profile_usage(stdout);
    return TSR_EXIT_OK;
  }
  if (argc < 3 || strcmp(argv[1], "check")) {
    profile_usage(stderr);
    return TSR_EXIT_USAGE;
  }
  const char *path = NULL;
  const char **sets = calloc((size_t)argc, sizeof *sets);
  int n_sets = 0;
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--set") && i + 1 < argc) sets[n_sets++] = argv[++i];
    else if (!strncmp(argv[i], "--set=", 6)) sets[n_sets++] = argv[i] + 6;
    else if (!path && argv[i][0] != '-') path = argv[i];
    else {
      fprintf(stderr, "tessera profile check: unexpected argument '%s'\n", argv[i]);
      free(sets);
      return TSR_EXIT_USAGE;
    }
  }
  if (!path) {
    profile_usage(stderr);
    free(sets);
    return TSR_EXIT_USAGE;
  }
  struct tsr_setup *s = NULL;
  tsr_status st = tsr_setup_from_profile(path, sets, n_sets, &s);
  free(sets);
  if (s) tsr_setup_print(s, st == TSR_OK, stdout);
  fflush(stdout);
  if (st != TSR_OK) fprintf(stderr, "tessera profile check: %s\n", tsr_error_message());
  tsr_setup_free(s);
  if (st == TSR_OK) return TSR_EXIT_OK;
  return (st == TSR_ERR_NOMEM || st == TSR_ERR_INTERNAL) ? TSR_EXIT_RUNTIME : TSR_EXIT_USAGE;
}
