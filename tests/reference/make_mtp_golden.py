#!/usr/bin/env python3
"""Reference outputs of the Qwen3.5 MTP (NextN) block of the fixtures that carry one.

transformers 5.17 drops `mtp.*` on load, so the fixture goldens cover the trunk only. This
builds the block from the checkpoint's own `mtp.*` weights with transformers' modules (the
trunk's full-attention decoder layer class, its zero-centred RMSNorm, its rotary embedding)
and runs it over golden sequence 0 the way the drafters of vLLM and llama.cpp feed it:

    entry i (0 <= i < n-1): token ids[i+1], the trunk's final-normed hidden state at i,
    position i; x = fc([pre_fc_norm_embedding(E[ids[i+1]]), pre_fc_norm_hidden(h_i)]),
    one decoder layer attending causally over the entries, norm, the tied LM head:
    logits predicting the token at i+2.

It writes <fixture>/mtp_golden.gguf: mtp.ids (i32 [n-1]), mtp.positions (i32 [n-1]),
mtp.hidden_in (f32 [n-1, H]: the trunk's normed hidden, a check of the trunk's output too),
mtp.logits (f32 [n-1, V]).

  python3 tests/reference/make_mtp_golden.py            # write them
  python3 tests/reference/make_mtp_golden.py --check    # regenerate in memory, compare bytes
"""

import os

os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"
os.environ.setdefault("MKL_CBWR", "AVX2")
os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import safetensors  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixture_models as fm  # noqa: E402
import make_fixtures as mf  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def mtp_block(model, ckpt):
    """The MTP block as modules, its weights from the checkpoint's mtp.* tensors."""
    text_cfg = model.config.get_text_config()
    h = text_cfg.hidden_size
    full_idx = text_cfg.layer_types.index("full_attention")
    trunk_layer = mf.text_model(model).layers[full_idx]
    block = nn.Module()
    block.layer = type(trunk_layer)(text_cfg, full_idx)
    block.fc = nn.Linear(2 * h, h, bias=False)
    norm_cls = type(trunk_layer.input_layernorm)
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        setattr(block, name, norm_cls(h, eps=text_cfg.rms_norm_eps))
    state = {}
    with safetensors.safe_open(str(ckpt), "pt") as f:
        mtp = {k[4:]: f.get_tensor(k).to(torch.float32) for k in f.keys() if k.startswith("mtp.")}
    for k, v in list(mtp.items()):
        if k.startswith("layers.0."):
            k = "layer." + k[len("layers.0."):]
        state[k] = v
    # per-expert weights back into the fused layout the module holds
    for key in [k for k in block.state_dict() if k.endswith("mlp.experts.gate_up_proj")]:
        base = key[: -len("gate_up_proj")]
        n_exp = block.state_dict()[key].shape[0]
        state[key] = torch.stack([torch.cat([state.pop(f"{base}{e}.gate_proj.weight"),
                                             state.pop(f"{base}{e}.up_proj.weight")])
                                  for e in range(n_exp)])
        state[base + "down_proj"] = torch.stack([state.pop(f"{base}{e}.down_proj.weight")
                                                 for e in range(n_exp)])
    block.load_state_dict(state, strict=True)
    return block.eval()


def mtp_outputs(model, block, ids):
    stack = mf.text_model(model)
    x = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        hidden = stack(input_ids=x, use_cache=False).last_hidden_state[0]  # final-normed
        n = len(ids) - 1
        emb = stack.embed_tokens(x[:, 1:])
        inp = block.fc(torch.cat([block.pre_fc_norm_embedding(emb),
                                  block.pre_fc_norm_hidden(hidden[None, :n])], dim=-1))
        pos = torch.arange(n)[None]
        # M-RoPE takes (temporal, height, width) ids; text uses the position for all three
        rope = stack.rotary_emb(inp, pos[None].expand(3, 1, n))
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        out = block.layer(inp, position_embeddings=rope, attention_mask=mask, position_ids=pos)
        out = out[0] if isinstance(out, tuple) else out
        logits = model.lm_head(block.norm(out))[0]
    return {
        "mtp.ids": np.asarray(ids[1:], dtype=np.int32),
        "mtp.positions": np.arange(n, dtype=np.int32),
        "mtp.hidden_in": mf.f32(hidden[:n]),
        "mtp.logits": mf.f32(logits),
    }


def build(spec, out_path):
    fixture = FIXTURES / spec["name"]
    model = mf.load_model(spec, fixture)
    block = mtp_block(model, fixture / "model.safetensors")
    ids = mf.sequences(spec, mf.load_tokenizer(spec, fixture))[0]
    tensors = mtp_outputs(model, block, ids)
    std, distinct = mf.check_logits(spec["name"], "mtp", tensors["mtp.logits"])
    meta = {"golden.fixture": spec["name"], "golden.mtp.n_entries": len(ids) - 1,
            "golden.transformers_version": mf.transformers.__version__,
            "golden.torch_version": torch.__version__}
    mf.write_golden(out_path, meta, tensors)
    out_path.chmod(0o644)
    print(f"{spec['name']}: {len(ids) - 1} MTP entries, logits std {std:.2f}, "
          f"{distinct} distinct argmax", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="regenerate and compare byte for byte")
    args = ap.parse_args()
    mf.setup_torch()
    ok = True
    for spec in [f for f in fm.FIXTURES if f["mtp"]]:
        path = FIXTURES / spec["name"] / "mtp_golden.gguf"
        if not args.check:
            build(spec, path)
            continue
        with tempfile.TemporaryDirectory(prefix="tessera-mtp-") as tmp:
            fresh = Path(tmp) / "mtp_golden.gguf"
            build(spec, fresh)
            if not path.exists() or path.read_bytes() != fresh.read_bytes():
                print(f"DIFFERS {path}", file=sys.stderr)
                ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
