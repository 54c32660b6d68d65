"""Tiny Hugging Face checkpoints written by the test itself (standard library only).

They cover what tests/reference/fixtures does not: qwen2 (q/k/v biases, untied), qwen2 with
tied embeddings and YaRN scaling, and qwen3_moe with the fused expert layout
(mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj [E, H, I]). The weights come from a
fixed integer generator, so every run writes the same bytes, here and in make_expected.py
(which runs llama.cpp's converter on them). The tokenizer files are the qwen3_tied fixture's.
"""
import json
import os
import shutil
import struct

H, V, L, HEADS, KV_HEADS, FF = 64, 512, 2, 4, 2, 128
E, FF_EXP = 4, 32


def _values(seed, n, scale):
    """n floats in [-scale, scale), exact in f32, from a 64-bit LCG."""
    x = (seed * 0x9E3779B97F4A7C15 + 1) & 0xFFFFFFFFFFFFFFFF
    out = []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        out.append(((x >> 40) / float(1 << 24) * 2.0 - 1.0) * scale)
    return out


def _config(model_type, arch, tie, extra):
    cfg = {"architectures": [arch], "model_type": model_type, "hidden_size": H,
           "num_hidden_layers": L, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
           "intermediate_size": FF, "vocab_size": V, "max_position_embeddings": 4096,
           "rms_norm_eps": 1e-6, "tie_word_embeddings": tie, "hidden_act": "silu",
           "bos_token_id": 509, "eos_token_id": 511,
           "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}
    cfg.update(extra)
    return cfg


def _tensors(kind, tie):
    """(name, shape, scale) of a checkpoint, in order."""
    hd = H // HEADS if kind == "qwen2" else 32
    out = [("model.embed_tokens.weight", [V, H], 0.5)]
    for i in range(L):
        p = "model.layers.%d." % i
        out += [(p + "input_layernorm.weight", [H], 1.0),
                (p + "post_attention_layernorm.weight", [H], 1.0),
                (p + "self_attn.q_proj.weight", [HEADS * hd, H], 0.2),
                (p + "self_attn.k_proj.weight", [KV_HEADS * hd, H], 0.2),
                (p + "self_attn.v_proj.weight", [KV_HEADS * hd, H], 0.2),
                (p + "self_attn.o_proj.weight", [H, HEADS * hd], 0.2)]
        if kind == "qwen2":
            out += [(p + "self_attn.q_proj.bias", [HEADS * hd], 0.1),
                    (p + "self_attn.k_proj.bias", [KV_HEADS * hd], 0.1),
                    (p + "self_attn.v_proj.bias", [KV_HEADS * hd], 0.1),
                    (p + "mlp.gate_proj.weight", [FF, H], 0.2),
                    (p + "mlp.up_proj.weight", [FF, H], 0.2),
                    (p + "mlp.down_proj.weight", [H, FF], 0.2)]
        else:
            out += [(p + "self_attn.q_norm.weight", [hd], 1.0),
                    (p + "self_attn.k_norm.weight", [hd], 1.0),
                    (p + "mlp.gate.weight", [E, H], 0.3),
                    (p + "mlp.experts.gate_up_proj", [E, 2 * FF_EXP, H], 0.2),
                    (p + "mlp.experts.down_proj", [E, H, FF_EXP], 0.2)]
    out.append(("model.norm.weight", [H], 1.0))
    if not tie:
        out.append(("lm_head.weight", [V, H], 0.5))
    return out, hd


SYNTH = {
    "synth_qwen2": ("qwen2", False, {}),
    "synth_qwen2_tied_yarn": ("qwen2", True, {"rope_parameters": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
        "rope_theta": 10000.0}}),
    "synth_qwen3_moe_fused": ("qwen3_moe", False, {
        "head_dim": 32, "num_experts": E, "num_experts_per_tok": 2,
        "moe_intermediate_size": FF_EXP, "norm_topk_prob": True}),
}
ARCHS = {"qwen2": "Qwen2ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}


def write_safetensors(path, tensors):
    """tensors: list of (name, shape, list of floats), stored F32."""
    header, blobs, offset = {}, [], 0
    for name, shape, vals in tensors:
        blob = struct.pack("<%df" % len(vals), *vals)
        header[name] = {"dtype": "F32", "shape": shape,
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def write(name, out_dir, tokenizer_dir, drop=(), extra_tensors=(), config_changes=None):
    """Writes checkpoint `name` into out_dir; drop / extra_tensors / config_changes break it
    on purpose for the error tests."""
    kind, tie, extra = SYNTH[name]
    os.makedirs(out_dir, exist_ok=True)
    cfg = _config(kind, ARCHS[kind], tie, extra)
    cfg.update(config_changes or {})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1, sort_keys=True)
    specs, _ = _tensors(kind, tie)
    tensors = []
    for seed, (tname, shape, scale) in enumerate(specs):
        if tname in drop:
            continue
        n = 1
        for d in shape:
            n *= d
        vals = _values(seed + 1, n, scale)
        if tname.endswith("norm.weight"):
            vals = [1.0 + v * 0.25 for v in vals]
        tensors.append((tname, shape, vals))
    for tname, shape in extra_tensors:
        n = 1
        for d in shape:
            n *= d
        tensors.append((tname, shape, [0.0] * n))
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        src = os.path.join(tokenizer_dir, f)
        if os.path.exists(src):
            shutil.copy(src, out_dir)


def copy_without(src_dir, dst_dir, prefix):
    """Copies a checkpoint folder, leaving out the tensors whose names start with prefix."""
    os.makedirs(dst_dir, exist_ok=True)
    for f in os.listdir(src_dir):
        if f != "model.safetensors" and os.path.isfile(os.path.join(src_dir, f)):
            shutil.copy(os.path.join(src_dir, f), dst_dir)
    with open(os.path.join(src_dir, "model.safetensors"), "rb") as f:
        blob = f.read()
    n = struct.unpack_from("<Q", blob)[0]
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    header.pop("__metadata__", None)
    kept, parts, offset = {}, [], 0
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        if name.startswith(prefix):
            continue
        a, b = t["data_offsets"]
        kept[name] = dict(t, data_offsets=[offset, offset + b - a])
        parts.append(data[a:b])
        offset += b - a
    head = json.dumps(kept, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(os.path.join(dst_dir, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"".join(parts))
