"""The tiny models behind the reference fixtures: configs, weight initialisation, MTP weights.

Each FIXTURES entry names a transformers class and a config that exercises one feature set of a
target architecture (see README.md). Weights come from `randomize`, not from transformers'
initialisers, so their scale is chosen here: activations keep unit-ish size through every layer,
logits have a spread of a few units, and every norm weight, scalar and per-expert scale differs
from its neutral value, so forgetting one of them shows up in the outputs.
"""

import math

import torch
from torch import nn

VOCAB = 512

# Qwen ids from tiny_tokenizers: <|endoftext|> 509, <|im_start|> 510, <|im_end|> 511.
QWEN_IDS = dict(bos_token_id=509, eos_token_id=511, pad_token_id=509)
GEMMA_IDS = dict(pad_token_id=0, eos_token_id=1, bos_token_id=2)


def _qwen3(tied):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=192, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, head_dim=128,
        max_position_embeddings=4096, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=tied, **QWEN_IDS,
    )


def _qwen3_moe(norm_topk_prob):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=192, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, head_dim=128,
        max_position_embeddings=4096, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        num_experts=8, num_experts_per_tok=3, moe_intermediate_size=64,
        norm_topk_prob=norm_topk_prob, decoder_sparse_step=1, mlp_only_layers=[],
        tie_word_embeddings=False, **QWEN_IDS,
    )


# A vision tower as small as the config allows: real Qwen3.5 checkpoints are
# *ForConditionalGeneration with model.visual.* weights that a text converter must skip.
_QWEN35_VISION = dict(
    depth=1, hidden_size=32, intermediate_size=64, num_heads=2, num_position_embeddings=16,
    patch_size=16, temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=64,
)


def _qwen35_text(moe):
    text = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=192, num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"], full_attention_interval=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=256,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
        linear_value_head_dim=64, linear_conv_kernel_dim=4,
        max_position_embeddings=4096, rms_norm_eps=1e-6,
        rope_parameters={
            "rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10], "mrope_interleaved": True,
        },
        # Keys the released checkpoints carry; transformers 5.17 keeps them as plain attributes.
        attn_output_gate=True, mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False,
        tie_word_embeddings=not moe, **QWEN_IDS,
    )
    if moe:
        text.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                    shared_expert_intermediate_size=64)
    return text


def _qwen35(moe):
    from transformers import Qwen3_5Config, Qwen3_5MoeConfig

    cls = Qwen3_5MoeConfig if moe else Qwen3_5Config
    return cls(text_config=_qwen35_text(moe), vision_config=dict(_QWEN35_VISION),
               tie_word_embeddings=not moe)


def _gemma4_text(**over):
    text = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=5,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention", "full_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=256,
        global_head_dim=512, num_global_key_value_heads=1, attention_k_eq_v=True,
        sliding_window=32, final_logit_softcapping=30.0, max_position_embeddings=4096,
        rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
        hidden_size_per_layer_input=0, vocab_size_per_layer_input=VOCAB,
        tie_word_embeddings=True, **GEMMA_IDS,
    )
    text.update(over)
    return text


def _gemma4(**over):
    from transformers import Gemma4Config

    return Gemma4Config(text_config=_gemma4_text(**over), vision_config=None, audio_config=None,
                        tie_word_embeddings=True)


def _gemma4_moe():
    return _gemma4(
        num_hidden_layers=4, layer_types=["sliding_attention"] * 3 + ["full_attention"],
        intermediate_size=64, enable_moe_block=True, num_experts=8, top_k_experts=2,
        moe_intermediate_size=32,
    )


# E2B-style: per-layer inputs, the last 4 of 8 layers reuse K/V, double-wide MLP on those.
E2B_LAYERS = ["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3 + ["full_attention"]


def _gemma4_e2b():
    return _gemma4(
        num_hidden_layers=8, layer_types=list(E2B_LAYERS), num_attention_heads=2,
        num_key_value_heads=1, attention_k_eq_v=False, num_global_key_value_heads=None,
        intermediate_size=64, hidden_size_per_layer_input=16, vocab_size_per_layer_input=VOCAB,
        num_kv_shared_layers=4, use_double_wide_mlp=True,
    )


# E2B's features at hidden size 8 (#31's fixture): per-layer inputs of width 8, the last 2 of 6
# layers reusing K/V, the double-wide MLP on those, a 32-token window that a 200-token sequence
# passes six times over; head dims 32 / 64, so the cuda backend's tensor-core kernels take it.
def _gemma4_e2b_h8():
    return _gemma4(
        hidden_size=8, num_hidden_layers=6,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention", "sliding_attention", "full_attention"],
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, global_head_dim=64,
        attention_k_eq_v=False, num_global_key_value_heads=None, intermediate_size=16,
        hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB,
        num_kv_shared_layers=2, use_double_wide_mlp=True,
    )


def _gemma4_assistant():
    from transformers import Gemma4AssistantConfig

    text = _gemma4_text(
        hidden_size=32, intermediate_size=64, num_hidden_layers=4,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        num_attention_heads=2, num_key_value_heads=1, attention_k_eq_v=False,
        num_global_key_value_heads=None, num_kv_shared_layers=4,
        hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
        final_logit_softcapping=None,
    )
    text["model_type"] = "gemma4_text"
    return Gemma4AssistantConfig(
        text_config=text, backbone_hidden_size=64, use_ordered_embeddings=True,
        num_centroids=32, centroid_intermediate_top_k=4, tie_word_embeddings=True,
    )


def _cls(name):
    import transformers

    return getattr(transformers, name)


# name, golden.arch, transformers class, config factory, tokenizer kind, seed,
# weights dtype in model.safetensors, embedding std, lm_head gain, sequence lengths.
FIXTURES = [
    dict(name="qwen3_tied", arch="qwen3", cls="Qwen3ForCausalLM", config=lambda: _qwen3(True),
         tokenizer="qwen2", seed=1001, dtype="float32", embed_std=0.5, head_gain=1.0),
    dict(name="qwen3_untied", arch="qwen3", cls="Qwen3ForCausalLM", config=lambda: _qwen3(False),
         tokenizer="qwen2", seed=1002, dtype="bfloat16", embed_std=1.0, head_gain=3.0),
    dict(name="qwen3_moe_norm", arch="qwen3_moe", cls="Qwen3MoeForCausalLM",
         config=lambda: _qwen3_moe(True), tokenizer="qwen2", seed=1003, dtype="bfloat16",
         embed_std=1.0, head_gain=3.0),
    dict(name="qwen3_moe_nonorm", arch="qwen3_moe", cls="Qwen3MoeForCausalLM",
         config=lambda: _qwen3_moe(False), tokenizer="qwen2", seed=1004, dtype="bfloat16",
         embed_std=1.0, head_gain=3.0),
    dict(name="qwen3_5", arch="qwen3_5", cls="Qwen3_5ForConditionalGeneration",
         config=lambda: _qwen35(False), tokenizer="qwen35", seed=1005, dtype="bfloat16",
         embed_std=0.5, head_gain=1.0, mtp=True),
    dict(name="qwen3_5_moe", arch="qwen3_5_moe", cls="Qwen3_5MoeForConditionalGeneration",
         config=lambda: _qwen35(True), tokenizer="qwen35", seed=1006, dtype="bfloat16",
         embed_std=1.0, head_gain=3.0, mtp=True),
    dict(name="gemma4_dense", arch="gemma4", cls="Gemma4ForConditionalGeneration",
         config=lambda: _gemma4(), tokenizer="gemma", seed=1007, dtype="bfloat16",
         embed_std=0.5, head_gain=1.0),
    dict(name="gemma4_moe", arch="gemma4", cls="Gemma4ForConditionalGeneration",
         config=_gemma4_moe, tokenizer="gemma", seed=1008, dtype="bfloat16",
         embed_std=0.5, head_gain=1.0),
    dict(name="gemma4_e2b", arch="gemma4", cls="Gemma4ForConditionalGeneration",
         config=_gemma4_e2b, tokenizer="gemma", seed=1009, dtype="bfloat16",
         embed_std=0.5, head_gain=1.0),
    dict(name="gemma4_e2b_h8", arch="gemma4", cls="Gemma4ForConditionalGeneration",
         config=_gemma4_e2b_h8, tokenizer="gemma", seed=1011, dtype="float16",
         embed_std=0.5, head_gain=1.0, seq_lens=(160, 200)),
    dict(name="gemma4_assistant", arch="gemma4_assistant", cls="Gemma4AssistantForCausalLM",
         config=_gemma4_assistant, tokenizer="gemma", seed=1010, dtype="float32",
         embed_std=0.7, head_gain=1.0, target="gemma4_e2b", draft_steps=4),
]
for _f in FIXTURES:
    _f.setdefault("mtp", False)
    _f.setdefault("seq_lens", (160, 131))
    _f["model_cls"] = (lambda n: lambda: _cls(n))(_f["cls"])

ZERO_CENTRED_NORMS = {"Qwen3_5RMSNorm", "Qwen3_5MoeRMSNorm"}
SKIP_PREFIXES = ("model.visual.",)


def _randn(shape, std, gen):
    return torch.randn(shape, generator=gen, dtype=torch.float32) * std


def _uniform(shape, lo, hi, gen):
    return lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=torch.float32)


def _param_value(mod, mname, pname, p, spec, gen, text_cfg):
    """The random value of one parameter, chosen by what the module does with it."""
    cls = type(mod).__name__
    shape = tuple(p.shape)
    if "RMSNorm" in cls:
        # Zero-centred norms compute x*(1+w); the others x*w. Keep both away from neutral.
        base = 0.0 if cls in ZERO_CENTRED_NORMS else 1.0
        return base + _randn(shape, 0.2, gen)
    if isinstance(mod, nn.Embedding):
        if mname.endswith("embed_tokens_per_layer"):
            # Scaled by sqrt(per-layer dim) in the forward pass: unit size after scaling.
            return _randn(shape, 1.0 / math.sqrt(text_cfg.hidden_size_per_layer_input), gen)
        return _randn(shape, spec["embed_std"], gen)
    if isinstance(mod, nn.Linear):
        gain = 1.0
        if mname.endswith("lm_head"):
            gain = spec["head_gain"]
        elif mname.endswith("router.proj"):
            gain = math.sqrt(shape[1])  # the router input is scaled by hidden**-0.5
        return _randn(shape, gain / math.sqrt(shape[1]), gen)
    if isinstance(mod, nn.Conv1d):
        return _randn(shape, 1.0 / math.sqrt(shape[-1]), gen)
    if pname == "A_log":
        # Per-step decay exp(-A*softplus(a+dt)) roughly 0.3-0.98: long memory, not frozen.
        return torch.log(_uniform(shape, 0.05, 1.0, gen))
    if pname == "dt_bias":
        return _randn(shape, 0.5, gen)
    if cls == "Gemma4TextRouter" and pname in ("scale", "per_expert_scale"):
        return _uniform(shape, 0.5, 1.5, gen)
    if cls.endswith("TopKRouter") and pname == "weight":
        return _randn(shape, 2.0 / math.sqrt(shape[1]), gen)
    if cls.endswith("Experts") and len(shape) == 3:
        return _randn(shape, 1.0 / math.sqrt(shape[2]), gen)
    raise RuntimeError(f"no init rule for {mname}.{pname} ({cls}, {shape})")


def randomize(model, spec, gen, text_cfg):
    """Overwrites every text-model parameter (and the scalar buffers) with seeded values."""
    seen = set()
    with torch.no_grad():
        for mname, mod in model.named_modules():
            if any((mname + ".").startswith(s) for s in SKIP_PREFIXES):
                continue
            for pname, p in mod.named_parameters(recurse=False):
                if id(p) in seen:
                    continue
                seen.add(id(p))
                p.copy_(_param_value(mod, mname, pname, p, spec, gen, text_cfg))
            for bname, b in mod.named_buffers(recurse=False):
                if bname == "layer_scalar":
                    b.copy_(_uniform(tuple(b.shape), 0.6, 1.2, gen))
                elif bname == "token_ordering":
                    b.copy_(torch.randperm(b.numel(), generator=gen))


def mtp_weights(model, spec, gen):
    """Qwen3.5 MTP block weights, named as in the released checkpoints (top-level `mtp.*`).

    transformers 5.17 drops `mtp.*` on load, so these only travel to the converter; the goldens
    cover the trunk. The block is built from the trunk's own full-attention layer class, so
    shapes follow the config; fused experts are written per expert, as the checkpoints do.
    """
    text_cfg = model.config.get_text_config()
    h = text_cfg.hidden_size
    full_idx = text_cfg.layer_types.index("full_attention")
    trunk_layer = model.model.language_model.layers[full_idx]
    layer = type(trunk_layer)(text_cfg, full_idx)
    block = nn.Module()
    block.layer = layer
    block.fc = nn.Linear(2 * h, h, bias=False)
    norm_cls = type(trunk_layer.input_layernorm)
    block.pre_fc_norm_embedding = norm_cls(h, eps=text_cfg.rms_norm_eps)
    block.pre_fc_norm_hidden = norm_cls(h, eps=text_cfg.rms_norm_eps)
    block.norm = norm_cls(h, eps=text_cfg.rms_norm_eps)
    randomize(block, spec, gen, text_cfg)
    out = {}
    for k, v in block.state_dict().items():
        if k.startswith("layer."):
            k = "layers.0." + k[len("layer."):]
        if k.endswith("mlp.experts.gate_up_proj"):
            inter = v.shape[1] // 2
            base = k[: -len("gate_up_proj")]
            for e in range(v.shape[0]):
                out[f"mtp.{base}{e}.gate_proj.weight"] = v[e, :inter].clone()
                out[f"mtp.{base}{e}.up_proj.weight"] = v[e, inter:].clone()
            continue
        if k.endswith("mlp.experts.down_proj"):
            base = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"mtp.{base}{e}.down_proj.weight"] = v[e].clone()
            continue
        out["mtp." + k] = v.clone()
    return out
