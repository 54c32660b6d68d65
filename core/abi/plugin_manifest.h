/*
** plugin.ini: the declared facts of a plugin, readable without loading its
** code (so `tessera plugins` lists everything and a profile can be checked
** before any dlopen). After a plugin loads, its descriptor must agree with
** its manifest on name, version, ABI and interfaces, or the load fails.
**
**   [plugin]
**   name = example_attention
**   version = 1.0.0
**   abi = 2.0
**   provides = attention:1
**   requires =
**   library = libexample_attention.so   ; absent: the plugin has no code yet
**   description = an attention built out of tree
*/
#ifndef TSR_PLUGIN_MANIFEST_H
#define TSR_PLUGIN_MANIFEST_H

#include <stdint.h>

#include "tessera/plugin.h"

#define TSR_MANIFEST_MAX_IFACES 8

struct tsr_manifest {
  char path[1024];   /* the plugin.ini file */
  char dir[1024];    /* its folder */
  char name[64];
  char version[32];
  uint32_t abi_major, abi_minor;
  struct {
    char name[32];
    uint32_t version;
  } provides[TSR_MANIFEST_MAX_IFACES], requires[TSR_MANIFEST_MAX_IFACES];
  int n_provides, n_requires;
  char library[256]; /* "" when the plugin has no code yet */
  char description[256];
};

/* Reads and validates a plugin.ini; errors name the file and line. */
tsr_status tsr_manifest_read(const char *path, struct tsr_manifest *out);

/* Whether a loaded descriptor agrees with the manifest; the error names
** the field and both values. */
tsr_status tsr_manifest_check(const struct tsr_manifest *m, const struct tsr_plugin_descriptor *d);

/* "attention:1, kv_codec:1" */
void tsr_manifest_format_ifaces(const struct tsr_manifest *m, int provides, char *buf, size_t n);

#endif
