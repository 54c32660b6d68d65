/*
** tessera plugin ABI.
**
** A plugin is a shared object exporting one symbol, TSR_PLUGIN_ENTRY_SYMBOL,
** a function returning a static descriptor (struct tsr_plugin_descriptor).
** The host opens it with dlopen(RTLD_NOW | RTLD_LOCAL), never dlcloses it
** while any of it is in use, and refuses it when
**   - its ABI major differs from the host's, or
**   - its ABI minor is newer than the host's (it may use slots the host
**     does not have),
** naming both versions. Then the host calls init() with a services table
** (struct tsr_host): the plugin registers what it provides through that
** table and never touches the host's internals, so it builds out of tree
** against this header alone (pkg-config: tessera-plugin).
**
** Growth rules (SQLite's and Vulkan's): every struct here starts with or
** carries a struct_size; later minors only append fields at the end, each
** group marked with the minor that added it ("ABI 1.1"), and a reader checks
** struct_size before touching an appended field. Nothing is ever removed or
** reordered within a major.
**
** The ABI is one header per interface under tessera/plugin/, all included
** here: abi.h (versions, the descriptor, interface names, shared vocabulary),
** dtype.h, attention.h, kv_codec.h, arch.h, decode_policy.h, speculator.h,
** kernel.h (plugin ops' kernels, device calls) and host.h (the services).
**
** Interfaces (each versioned on its own):
**   arch           1: hyperparameters and layer plan from GGUF, graph per ubatch
**   attention      1: attention over one layer's KV; negotiates codec reads
**   kv_codec       2: a KV-cache storage format: encode rows, decode (lift),
**                  graph hooks around attention, its own block layout
**   decode_policy  2: parameters that reach the attention kernel on decode
**                  steps (e.g. V skipping), counters back
**   speculator     2: drafts tokens; the host verifies them in one batch
** docs/PLUGINS.md is the author's guide to each.
** Built-in pieces (the `flash` attention, the scalar KV codecs) register
** through the same calls: the core is the first plugin author.
*/
#ifndef TESSERA_PLUGIN_H
#define TESSERA_PLUGIN_H

#include "tessera/plugin/abi.h"
#include "tessera/plugin/dtype.h"
#include "tessera/plugin/attention.h"
#include "tessera/plugin/kv_codec.h"
#include "tessera/plugin/arch.h"
#include "tessera/plugin/decode_policy.h"
#include "tessera/plugin/speculator.h"
#include "tessera/plugin/kernel.h"
#include "tessera/plugin/host.h"

#endif /* TESSERA_PLUGIN_H */
