/*
** tessera plugin ABI, version 2.7 (TSR_PLUGIN_ABI_MAJOR.TSR_PLUGIN_ABI_MINOR).
**
** A plugin is a shared object exporting one symbol, TSR_PLUGIN_ENTRY_SYMBOL,
** a function returning a static descriptor (struct tsr_plugin_descriptor).
** The host opens it with dlopen(RTLD_NOW | RTLD_LOCAL), never dlcloses it
** while any of it is in use, and refuses it when
**   - its ABI major differs from the host's, or
**   - its ABI minor is newer than the host's (it may use fields the host
**     does not have),
** naming both versions. Then the host calls init() with a services table
** (struct tsr_host): the plugin registers what it provides through that
** table and never touches the host's internals, so it builds out of tree
** against the installed headers alone (pkg-config: tessera-plugin).
**
** One header per interface, all included here:
**   tessera/plugin/abi.h            the version, the descriptor, interface names,
**                                   shared vocabulary and the growth rule
**   tessera/plugin/dtype.h          dtype ids (GGUF's, codecs' own) and tensor layouts
**   tessera/plugin/host.h           the services table, with its sub-tables:
**   tessera/plugin/gguf.h             host->gguf: reading and checking a model file
**   tessera/plugin/graph.h            host->graph: building graphs
**   tessera/plugin/kernel.h           host->kernel: plugin ops, kernels, device calls
**   tessera/plugin/arch.h           arch 1: hyperparameters and layer plan from GGUF,
**                                   graph per ubatch (and host->arch)
**   tessera/plugin/convert.h        convert 1: a Hugging Face checkpoint to GGUF
**                                   (and host->convert)
**   tessera/plugin/attention.h      attention 1: attention over one layer's KV;
**                                   negotiates codec reads
**   tessera/plugin/kv_codec.h       kv_codec 1: a KV-cache storage format: encode rows,
**                                   decode (lift), graph hooks, its own block layout
**   tessera/plugin/decode_policy.h  decode_policy 1: parameters that reach the
**                                   attention kernel on decode steps, counters back
**   tessera/plugin/speculator.h     speculator 1: drafts tokens; the host verifies them
** A CUDA kernel of a plugin adds tessera/plugin_cuda.h; the core's attention
** kernels are tessera/cpu_attn_tile.h and tessera/cuda_attn_tile.cuh (with
** cuda_attn_args.cuh, cuda_attn_mma.cuh, cuda_attn_gqa.cuh, cuda_quant.cuh).
** docs/PLUGINS.md is the author's guide to each.
** Built-in pieces (the `flash` attention, the scalar KV codecs) register
** through the same calls: the core is the first plugin author.
*/
#ifndef TESSERA_PLUGIN_H
#define TESSERA_PLUGIN_H

#include "tessera/plugin/abi.h"
#include "tessera/plugin/dtype.h"
#include "tessera/plugin/gguf.h"
#include "tessera/plugin/graph.h"
#include "tessera/plugin/kernel.h"
#include "tessera/plugin/attention.h"
#include "tessera/plugin/kv_codec.h"
#include "tessera/plugin/arch.h"
#include "tessera/plugin/convert.h"
#include "tessera/plugin/decode_policy.h"
#include "tessera/plugin/speculator.h"
#include "tessera/plugin/host.h"

#endif /* TESSERA_PLUGIN_H */
