"""The shapes of the two reference models (and the tiny ones the CPU check trains).

qwen3 (Qwen3ForCausalLM): H 512, 6 layers, 4 q heads / 2 kv heads of head_dim 128 (Qwen3's
real head_dim; q width 512 = H), SwiGLU FFN 1536, q/k RMSNorm, RoPE theta 1e4 over all 128
dims (a base suited to the 2048-token context), tied embeddings, vocabulary 4096.

gemma4 (Gemma4ForCausalLM, gemma4_text): H 384, 8 layers [s, full] x 4 (sliding window
128 unless train.py --window), sliding layers 4 q heads / 1 kv head of head_dim 256 with RoPE
theta 1e4 over all dims; full layers 4 q heads / 1 kv head of global_head_dim 512 with
attention_k_eq_v (no v_proj: V is the raw k_proj output) and proportional RoPE theta 1e6 over
a quarter of the dims, as the released Gemma 4 checkpoints; GELU-tanh FFN 1152, final logit softcap 30, sqrt(H) embedding
scale, attention scale 1, tied embeddings, no per-layer inputs, vocabulary 4096.

`tiny` keeps every head dim and layer kind and shrinks the rest, for the CPU check.

Why this Gemma shape: two runs of [s, s, s, full] x 2 with 2 q heads and a 512-token window
retrieved only needles inside the window (every one within 375 tokens of the question, none
past 545): the sliding layers solved the short samples and the two full layers never learned
to retrieve. A window of 128, below nearly every task's length, leaves retrieval to the full
layers, and four of them with 4 q heads each give it the heads the qwen3 model has.
"""

CTX = 2048
WINDOW = 128  # gemma4's sliding window (train.py --window)
VOCAB = 4096
GEMMA_LAYERS = ["sliding_attention", "full_attention"]

SHAPES = {
    ("qwen3", "full"): dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=6,
                            num_attention_heads=4, num_key_value_heads=2),
    ("qwen3", "tiny"): dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1),
    ("gemma4", "full"): dict(hidden_size=384, intermediate_size=1152, num_hidden_layers=8,
                             layer_types=GEMMA_LAYERS * 4, num_attention_heads=4,
                             num_key_value_heads=1, num_global_key_value_heads=1),
    ("gemma4", "tiny"): dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                             layer_types=["sliding_attention"] * 3 + ["full_attention"],
                             num_attention_heads=2,
                             num_key_value_heads=1, num_global_key_value_heads=1),
}


def config(kind, size, tok, window=WINDOW):
    """The transformers config of a model; token ids come from its tokenizer."""
    shape = dict(SHAPES[(kind, size)])
    if kind == "qwen3":
        from transformers import Qwen3Config

        eot = tok.convert_tokens_to_ids("<|endoftext|>")
        return Qwen3Config(
            vocab_size=VOCAB, head_dim=128, max_position_embeddings=CTX, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=True, bos_token_id=None, eos_token_id=eot, pad_token_id=eot,
            **shape)
    from transformers import Gemma4TextConfig

    return Gemma4TextConfig(
        vocab_size=VOCAB, head_dim=256, global_head_dim=512, attention_k_eq_v=True,
        sliding_window=window, final_logit_softcapping=30.0, max_position_embeddings=CTX,
        rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=VOCAB, tie_word_embeddings=True,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1000000.0},
        },
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id, **shape)


def model_class(kind):
    import transformers

    return transformers.Qwen3ForCausalLM if kind == "qwen3" else transformers.Gemma4ForCausalLM


def build(kind, size, tok, seed, window=WINDOW):
    """A freshly initialised model from a fixed seed: transformers' own init (normal, std
    0.02), except Gemma's q_norm/k_norm scales, which start at head_dim^-1/4 instead of 1.

    Gemma 4 scales attention logits by 1 and relies on the learned q/k norm scales; with
    scales of 1 the initial logits q.k of RMS-normed vectors have a standard deviation of
    sqrt(head_dim) = 16-23, the softmax starts one-hot and the first layers' gradients are
    ~100x the rest (gradient norm ~3000 at step 0, against ~10 with this init). Starting at
    head_dim^-1/4 gives unit-variance logits, as 1/sqrt(head_dim) scaling would; the trained
    values are ordinary weights, so nothing downstream changes.
    """
    import torch

    torch.manual_seed(seed)
    cfg = config(kind, size, tok, window)
    model = model_class(kind)._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    if kind == "gemma4":
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
                    p.fill_(p.numel() ** -0.25)
    return model


def n_params(model):
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def flops_per_token(model, ctx=CTX):
    """Training FLOPs per token: 6 x (every Linear weight, the tied LM head included) plus
    attention, whose score and value products cost 2 x 2 x ctx/2 x (q width) per layer forward,
    x3 with the backward. Sliding layers count ctx/2 too: SDPA computes a masked full product.
    """
    from torch import nn

    weights = model.get_output_embeddings().weight.numel()
    attn = 0.0
    for name, mod in model.model.named_modules():
        if isinstance(mod, nn.Linear):
            weights += mod.weight.numel()
            if name.endswith("self_attn.q_proj"):
                attn += 3 * 2 * 2 * (ctx / 2) * mod.out_features
    return 6 * weights + attn


def describe(model):
    return (f"{type(model).__name__}: {n_params(model) / 1e6:.2f}M parameters, "
            f"{flops_per_token(model) / 1e6:.0f} MFLOP per training token at ctx {CTX}")

