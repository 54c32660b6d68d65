/* `tessera plugins`: every plugin on the search path, from manifests alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "abi/plugin_host.h"

static void report_bad_manifest(void *user, const char *message) {
  int *bad = user;
  fprintf(stderr, "tessera plugins: %s\n", message);
  (*bad)++;
}

int tsr_cli_plugins(int argc, char **argv) {
  struct tsr_plugin_host *h = NULL;
  const char *dirs[16];
  int n_dirs = 0;
  for (int i = 1; i < argc; i++) {
    if (tsr_cli_is_help(argv[i])) {
      printf("usage: tessera plugins [--path DIR]...\n"
             "Lists the built-in plugin and every plugin folder on the search path\n"
             "(--path dirs, $TESSERA_PLUGIN_PATH, the build tree, the install prefix)\n"
             "from their plugin.ini manifests, without loading their code.\n");
      return TSR_EXIT_OK;
    }
    if (!strcmp(argv[i], "--path") && i + 1 < argc && n_dirs < 16) {
      dirs[n_dirs++] = argv[++i];
      continue;
    }
    fprintf(stderr, "tessera plugins: unexpected argument '%s'\n", argv[i]);
    return TSR_EXIT_USAGE;
  }
  if (tsr_plugin_host_new(&h) != TSR_OK) {
    fprintf(stderr, "tessera plugins: %s\n", tsr_error_message());
    return TSR_EXIT_RUNTIME;
  }
  for (int i = 0; i < n_dirs; i++) tsr_plugin_host_add_search_dir(h, dirs[i]);
  printf("search path:\n");
  for (int i = 0; i < tsr_plugin_host_n_search_dirs(h); i++)
    printf("  %s\n", tsr_plugin_host_search_dir(h, i));

  char names[512];
  const struct tsr_plugin *core = tsr_plugin_host_find_plugin(h, "core");
  tsr_plugin_provides(core, names, sizeof names);
  printf("\nbuilt in:\n  core %s  provides %s\n", tsr_plugin_version(core), names);
  tsr_plugin_host_list_names(h, TSR_IFACE_ATTENTION, names, sizeof names);
  printf("    attention: %s\n", names);
  tsr_plugin_host_list_names(h, TSR_IFACE_KV_CODEC, names, sizeof names);
  printf("    kv codecs: %s\n", names);

  struct tsr_manifest *list = NULL;
  int n = 0, bad = 0;
  if (tsr_plugin_host_scan(h, &list, &n, report_bad_manifest, &bad) != TSR_OK) {
    fprintf(stderr, "tessera plugins: %s\n", tsr_error_message());
    tsr_plugin_host_free(h);
    return TSR_EXIT_RUNTIME;
  }
  printf("\nplugins (%d):\n", n);
  for (int i = 0; i < n; i++) {
    const struct tsr_manifest *m = &list[i];
    char provides[256], requires[256];
    tsr_manifest_format_ifaces(m, 1, provides, sizeof provides);
    tsr_manifest_format_ifaces(m, 0, requires, sizeof requires);
    printf("  %-12s %-8s abi %u.%u  provides %s%s%s  %s\n", m->name, m->version, m->abi_major,
           m->abi_minor, provides, m->n_requires ? "  requires " : "", requires,
           m->library[0] ? "" : "[no code yet]");
    printf("    %s\n    %s\n", m->description, m->dir);
  }
  free(list);
  tsr_plugin_host_free(h);
  return bad ? TSR_EXIT_USAGE : TSR_EXIT_OK;
}
