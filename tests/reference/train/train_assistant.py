#!/usr/bin/env python3
"""A gemma4_assistant drafter trained for the project's Gemma 4 reference model
(models/ref-gemma4-23m.gguf), the instrument that makes spec_mtp's `assistant` acceptance
mean something.

The target is read back from its GGUF (q8_0 matrices dequantized, names mapped to
transformers' Gemma4ForCausalLM), so the drafter learns the model tessera runs; `check`
writes golden logits of that reconstruction for `tessera parity` against the file.

The drafter is transformers' Gemma4AssistantForCausalLM: every layer reads the K/V of the
target's last layer of its kind. One draft step at position N (the target has evaluated
tokens < N): x = pre_projection([E_target(t_N) * sqrt(H_t), h]) with h the target's
final-normed hidden state at N - 1 (a later step: the previous step's projected state), the
layers attending to the target's keys < N (sliding layers the last window + 1 of them), and
logits predicting token N + 1. Training unrolls STEPS such steps at every position of a
corpus window at once (all at position N, as drafting does): step k feeds token N + k - 1
and is taught the target's distribution at N + k - 1 (soft cross-entropy, the target's
softcapped logits), so a step is right exactly where it would be accepted.

Ordered embeddings (as the released assistants): after training, the drafter's tied
embedding rows are split into NUM_CENTROIDS equal clusters (balanced k-means) and the
centroid layer is fitted to pick the cluster of the drafter's own top token; only the
tokens of the top CENTROID_TOP_K clusters keep logits.

  python3 train_assistant.py check --prep PREP --target GGUF --out DIR
  python3 train_assistant.py train --prep PREP --target GGUF --out DIR [--minutes 20]
  python3 train_assistant.py golden --prep PREP --target GGUF --hf DIR/hf --out DIR
"""
import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

import data
import models
from export import write_golden

STEPS = 3
SHAPE = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=2,
             layer_types=["sliding_attention", "full_attention"], num_attention_heads=4)
NUM_CENTROIDS = 64
CENTROID_TOP_K = 8

# GGUF tensor name (after blk.N.) -> transformers parameter (after model.layers.N.)
LAYER_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "post_ffw_norm": "post_feedforward_layernorm", "layer_output_scale": "layer_scalar",
}


def load_target(path, tok):
    """Gemma4ForCausalLM with the GGUF's weights (dequantized to f32), eval mode, no grads."""
    import gguf
    from gguf.quants import dequantize

    r = gguf.GGUFReader(str(path))
    window = int(r.fields["gemma4.attention.sliding_window"].contents())
    cfg = models.config("gemma4", "full", tok, window=window)
    model = models.model_class("gemma4")._from_config(cfg, attn_implementation="sdpa",
                                                      dtype=torch.float32)
    state = {}
    for t in r.tensors:
        if t.name == "rope_freqs.weight":  # derived from the config's rope
            continue
        arr = dequantize(t.data, t.tensor_type).astype(np.float32)
        if t.name == "token_embd.weight":
            name = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            name = "model.norm.weight"
        else:
            _, layer, key, _ = t.name.split(".")
            name = f"model.layers.{layer}.{LAYER_NAMES[key]}.weight"
            if key == "layer_output_scale":
                name = name[: -len(".weight")]
        state[name] = torch.from_numpy(arr.reshape(tuple(reversed([int(n) for n in t.shape]))))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to embed_tokens
    if missing or unexpected:
        raise RuntimeError(f"{path}: missing {missing}, unexpected {unexpected}")
    model.eval().requires_grad_(False)
    return model


def drafter_config(target_cfg):
    """The drafter's config: the target's attention geometry and rope (its layers read the
    target's K/V), SHAPE's width and depth, every layer KV-shared."""
    from transformers import Gemma4AssistantConfig, Gemma4TextConfig

    t = target_cfg.to_dict()  # the global values (attributes refuse per-layer ones)
    full = t["layer_types"].index("full_attention")
    per_layer = (t.get("per_layer_config") or {}).get(str(full), {})
    global_head_dim = per_layer.get("head_dim", t["head_dim"])
    keep = ("vocab_size", "head_dim", "num_key_value_heads", "sliding_window",
            "max_position_embeddings", "rms_norm_eps", "hidden_activation", "rope_parameters",
            "pad_token_id", "eos_token_id", "bos_token_id")
    text = Gemma4TextConfig(
        **{k: t[k] for k in keep}, global_head_dim=global_head_dim, attention_k_eq_v=False,
        num_global_key_value_heads=None, final_logit_softcapping=None,
        hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
        num_kv_shared_layers=SHAPE["num_hidden_layers"],
        tie_word_embeddings=True, **SHAPE).to_dict()
    text["model_type"] = "gemma4_text"
    return Gemma4AssistantConfig(
        text_config=text, backbone_hidden_size=t["hidden_size"], use_ordered_embeddings=True,
        num_centroids=NUM_CENTROIDS, centroid_intermediate_top_k=CENTROID_TOP_K,
        tie_word_embeddings=True)


def windows(tokens, bos, seed, step, batch, ctx):
    """batch corpus windows of ctx tokens, each starting with <bos> as the target's prompts
    do: a function of (seed, step) alone."""
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(tokens) - ctx, size=batch)
    x = np.stack([tokens[s:s + ctx].astype(np.int64) for s in starts])
    x[:, 0] = bos
    return x


def target_pass(target, x):
    """The target over x: its final-normed hidden states, logits, and the K/V of its last
    sliding and full layers (what the drafter reads)."""
    out = target.model(input_ids=x, use_cache=False, return_shared_kv_states=True)
    hidden = out.last_hidden_state
    logits = target.lm_head(hidden)
    cap = target.config.final_logit_softcapping
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return hidden, logits, dict(out.shared_kv_states)


def masks(n, window, device):
    """Which keys 0..n-1 the queries at positions 1..n-1 see (query row j is position j + 1):
    full layers the keys < N, sliding layers the last window + 1 of them."""
    q = torch.arange(1, n, device=device)[:, None]
    k = torch.arange(n, device=device)[None, :]
    full = k < q
    return {"full_attention": full[None, None],
            "sliding_attention": (full & (q - k < window + 2))[None, None]}


def drafter_steps(drafter, target, x, hidden, kv, n_steps, full_head=True):
    """Logits of n_steps unrolled draft steps at every position N = 1..n-2 - (step - 1):
    step k (0-based) at row j (position N = j + 1) feeds token N + k and predicts N + k + 1."""
    n = x.shape[1]
    window = drafter.config.get_text_config().sliding_window
    m = masks(n, window, x.device)
    pos = torch.arange(1, n, device=x.device)[None].expand(x.shape[0], -1)
    embed = target.get_input_embeddings()
    h = hidden[:, : n - 1]
    out = []
    for k in range(n_steps):
        # step k at position N reads token N + k; rows past the window's end repeat the last
        tok = x[:, torch.clamp(torch.arange(1, n, device=x.device) + k, max=n - 1)]
        pre = drafter.pre_projection(torch.cat([embed(tok), h], dim=-1))
        last = drafter.model(inputs_embeds=pre, attention_mask=m, position_ids=pos,
                             shared_kv_states=kv, use_cache=False).last_hidden_state
        if full_head or drafter.masked_embedding is None:
            logits = drafter.lm_head(last)
        else:
            logits = drafter.masked_embedding(last, drafter.lm_head.weight)
        out.append((logits, last))
        h = drafter.post_projection(last)
    return out


def step_loss(steps, t_logits, n):
    """Soft cross-entropy of each step against the target's distribution at N + k, over the
    rows where N + k + 1 is inside the window; and each step's top-1 agreement."""
    losses, agree = [], []
    for k, (logits, _) in enumerate(steps):
        rows = n - 2 - k  # N = 1..n-2-k
        p = torch.softmax(t_logits[:, 1 + k : 1 + k + rows].float(), dim=-1)
        q = torch.log_softmax(logits[:, :rows].float(), dim=-1)
        losses.append(-(p * q).sum(-1).mean())
        agree.append((logits[:, :rows].argmax(-1) == p.argmax(-1)).float().mean())
    return losses, agree


def balanced_clusters(emb, n_clusters, iters=12, seed=0):
    """Equal-size clusters of the rows of emb (k-means on unit rows, each assignment filling
    clusters greedily by similarity): a permutation whose every run of len/n_clusters ids is
    one cluster, and the cluster of each row."""
    g = torch.Generator().manual_seed(seed)
    x = nn.functional.normalize(emb.float(), dim=-1)
    n, size = x.shape[0], x.shape[0] // n_clusters
    cent = x[torch.randperm(n, generator=g)[:n_clusters]].clone()
    for _ in range(iters):
        sim = x @ cent.T
        order = torch.argsort(sim.flatten(), descending=True)
        assign = torch.full((n,), -1, dtype=torch.long)
        fill = torch.zeros(n_clusters, dtype=torch.long)
        for idx in order.tolist():
            row, c = divmod(idx, n_clusters)
            if assign[row] < 0 and fill[c] < size:
                assign[row] = c
                fill[c] += 1
        cent = torch.stack([nn.functional.normalize(x[assign == c].mean(0), dim=0)
                            for c in range(n_clusters)])
    ordering = torch.cat([torch.nonzero(assign == c).flatten() for c in range(n_clusters)])
    return ordering, assign


def setup(a):
    from transformers import AutoTokenizer

    device = torch.device(a.device if a.device != "auto" else
                          ("cuda" if torch.cuda.is_available() else "cpu"))
    tok = AutoTokenizer.from_pretrained(str(Path(a.prep) / "gemma4"))
    target = load_target(a.target, tok).to(device)
    return device, tok, target


def cmd_check(a):
    """Golden logits of the reconstructed target on held-out text, for `tessera parity`."""
    device, tok, target = setup(a)
    val = data.load_tokens(Path(a.prep), "gemma4", "val")
    ids = val[a.start:a.start + a.n].astype(np.int64)
    ids[0] = tok.bos_token_id
    with torch.no_grad():
        _, logits, _ = target_pass(target, torch.from_numpy(ids)[None].to(device))
    Path(a.out).mkdir(parents=True, exist_ok=True)
    meta = {"golden.arch": "gemma4", "golden.n_sequences": 1,
            "golden.n_layers": target.config.num_hidden_layers,
            "golden.hidden_size": target.config.hidden_size,
            "golden.vocab_size": target.config.vocab_size}
    write_golden(Path(a.out) / "target_golden.gguf", meta,
                 {"seq.0.ids": ids.astype(np.int32),
                  "seq.0.logits": logits[0].cpu().numpy().astype(np.float32)})
    print(f"golden: {len(ids)} held-out tokens of the reconstructed target", flush=True)


def cmd_train(a):
    from transformers import Gemma4AssistantForCausalLM

    device, tok, target = setup(a)
    torch.manual_seed(a.seed)
    drafter = Gemma4AssistantForCausalLM._from_config(
        drafter_config(target.config), attn_implementation="sdpa", dtype=torch.float32)
    with torch.no_grad():  # unit-variance attention logits at the start, as models.build does
        for name, p in drafter.named_parameters():
            if name.endswith("self_attn.q_norm.weight"):
                p.fill_(p.numel() ** -0.25)
    drafter.to(device).train()
    trainable = [p for n, p in drafter.named_parameters() if "masked_embedding" not in n]
    n_params = sum(p.numel() for p in {id(p): p for p in drafter.parameters()}.values())
    prep, out = Path(a.prep), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    train_tok = data.load_tokens(prep, "gemma4", "train")
    val_tok = data.load_tokens(prep, "gemma4", "val")
    opt = torch.optim.AdamW(trainable, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    amp = device.type == "cuda" or a.amp
    bos = tok.bos_token_id
    print(f"Gemma4AssistantForCausalLM: {n_params / 1e6:.2f}M parameters on {device}", flush=True)
    t0, step, log = time.time(), 0, []
    budget = a.minutes * 60
    while time.time() - t0 < budget and (not a.steps or step < a.steps):
        frac = min(1.0, (time.time() - t0) / budget)
        cosine = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))  # to 0.1x over the minutes
        lr = a.lr * min(1.0, (step + 1) / a.warmup) * cosine
        for g in opt.param_groups:
            g["lr"] = lr
        x = torch.from_numpy(windows(train_tok, bos, a.seed, step, a.batch, a.ctx)).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            with torch.no_grad():
                hidden, t_logits, kv = target_pass(target, x)
            losses, agree = step_loss(drafter_steps(drafter, target, x, hidden, kv, STEPS),
                                      t_logits, a.ctx)
        sum(losses).backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % a.log_every == 0:
            entry = {"step": step, "seconds": round(time.time() - t0, 1),
                     "loss": [round(v.item(), 4) for v in losses],
                     "agree": [round(v.item(), 4) for v in agree]}
            log.append(entry)
            print(json.dumps(entry), flush=True)
    drafter.eval()

    # ordered embeddings: balanced clusters of the tied embedding, then the centroid layer
    ordering, assign = balanced_clusters(drafter.lm_head.weight.detach().cpu(), NUM_CENTROIDS)
    me = drafter.masked_embedding
    with torch.no_grad():
        me.token_ordering.copy_(ordering.to(device))
        me.centroids.weight.copy_(nn.functional.normalize(torch.stack(
            [drafter.lm_head.weight[(assign == c).to(device)].mean(0)
             for c in range(NUM_CENTROIDS)]), dim=-1))
    assign = assign.to(device)
    copt = torch.optim.Adam(me.centroids.parameters(), lr=a.lr)
    for cstep in range(a.centroid_steps):
        x = torch.from_numpy(windows(train_tok, bos, a.seed + 2, cstep, a.batch, a.ctx)).to(device)
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            hidden, _, kv = target_pass(target, x)
            steps = drafter_steps(drafter, target, x, hidden, kv, STEPS)
        feats = torch.cat([last.float().flatten(0, 1) for _, last in steps])
        label = assign[torch.cat([lg.float().argmax(-1).flatten() for lg, _ in steps])]
        closs = nn.functional.cross_entropy(me.centroids(feats), label)
        closs.backward()
        copt.step()
        copt.zero_grad(set_to_none=True)
        if (cstep + 1) % a.log_every == 0:
            print(json.dumps({"centroid_step": cstep + 1, "loss": round(closs.item(), 4)}),
                  flush=True)

    # held-out agreement with the target, full head and ordered head
    val = {"full": [[] for _ in range(STEPS)], "ordered": [[] for _ in range(STEPS)]}
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
        for i in range(a.val_batches):
            x = torch.from_numpy(windows(val_tok, bos, a.seed + 1, i, 8, a.ctx)).to(device)
            hidden, t_logits, kv = target_pass(target, x)
            for head in val:
                steps = drafter_steps(drafter, target, x, hidden, kv, STEPS, head == "full")
                for k, v in enumerate(step_loss(steps, t_logits, a.ctx)[1]):
                    val[head][k].append(v.item())
    status = {"steps": step, "centroid_steps": a.centroid_steps,
              "minutes": round((time.time() - t0) / 60, 2), "params": n_params,
              "val_agree": {h: [round(float(np.mean(v)), 4) for v in val[h]] for h in val},
              "batch": a.batch, "ctx": a.ctx, "lr": a.lr, "seed": a.seed,
              "device": str(device), "torch": torch.__version__}
    (out / "loss.tsv").write_text("step\tseconds\t" + "\t".join(
        f"loss{k}\tagree{k}" for k in range(STEPS)) + "\n" + "".join(
        f"{e['step']}\t{e['seconds']}\t" + "\t".join(
            f"{e['loss'][k]}\t{e['agree'][k]}" for k in range(STEPS)) + "\n" for e in log))
    (out / "status.json").write_text(json.dumps(status, indent=2) + "\n")
    drafter.to("cpu").save_pretrained(out / "hf")
    tok.save_pretrained(out / "hf")
    print(json.dumps(status), flush=True)


def cmd_golden(a):
    """The trained drafter's steps the way transformers' assisted generation runs them after
    one target pass over a held-out prefix (make_fixtures.py's drafter golden layout, for
    plugins/arch_gemma4's test_arch_gemma4_drafter against the converted drafter), and the
    same steps through the training forward, which must agree with them."""
    from transformers import Gemma4AssistantForCausalLM

    device, tok, target = setup(a)
    drafter = Gemma4AssistantForCausalLM.from_pretrained(
        str(a.hf), dtype=torch.float32, attn_implementation="sdpa").to(device).eval()
    val = data.load_tokens(Path(a.prep), "gemma4", "val")
    prefix = val[a.start:a.start + a.n].astype(np.int64)
    prefix[0] = tok.bos_token_id
    n = len(prefix)
    with torch.no_grad():
        hidden, logits, kv = target_pass(target, torch.from_numpy(prefix)[None].to(device))
        embed = target.get_input_embeddings()
        mask = torch.ones(1, n + 1, dtype=torch.long, device=device)
        pos = torch.tensor([[n]], device=device)
        token, h = int(logits[0, -1].argmax()), hidden[:, n - 1:n]
        tensors, inputs, drafted = {}, [], []
        for k in range(a.steps):
            x = torch.cat([embed(torch.tensor([[token]], device=device)), h], dim=-1)
            out = drafter(inputs_embeds=x, attention_mask=mask, position_ids=pos,
                          shared_kv_states=kv, use_cache=False)
            inputs.append(token)
            token = int(out.logits[0, 0].argmax())
            drafted.append(token)
            h = out.last_hidden_state
            tensors[f"draft.{k}.logits"] = out.logits[0, 0].cpu().numpy().astype(np.float32)
            tensors[f"draft.{k}.projected"] = h[0, 0].cpu().numpy().astype(np.float32)
        # the training forward over prefix + the chain's inputs, at the prefix's last row
        x = torch.from_numpy(np.concatenate([prefix, inputs])).to(device)[None]
        t_hidden, _, t_kv = target_pass(target, x)
        steps = drafter_steps(drafter, target, x, t_hidden, t_kv, a.steps, full_head=False)
    worst = 0.0
    for k, (lg, _) in enumerate(steps):  # over the tokens of the selected clusters: the
        want = torch.from_numpy(tensors[f"draft.{k}.logits"]).to(device)  # fill value is the
        kept = want > want.min()  # minimum over the whole batch
        got = lg[0, n - 1][kept]
        worst = max(worst, float((got - want[kept]).abs().max() / want[kept].abs().max()))
    head = {"draft.prefix_ids": prefix.astype(np.int32),
            "draft.input_ids": np.asarray(inputs, dtype=np.int32),
            "draft.tokens": np.asarray(drafted, dtype=np.int32),
            "draft.target_hidden": hidden[0].cpu().numpy().astype(np.float32)}
    for kind in ("sliding_attention", "full_attention"):
        short = kind.split("_")[0]
        head[f"draft.kv.{short}.k"] = kv[kind][0][0].cpu().numpy().astype(np.float32)
        head[f"draft.kv.{short}.v"] = kv[kind][1][0].cpu().numpy().astype(np.float32)
    head.update(tensors)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    write_golden(Path(a.out) / "drafter_golden.gguf",
                 {"golden.draft.position": n, "golden.draft.n_steps": a.steps}, head)
    print(f"golden: drafts {drafted} after {n} held-out tokens (inputs {inputs}); the training "
          f"forward's logits within {worst:.2e} of assisted generation's", flush=True)
    if worst > 1e-4:
        raise SystemExit("the training forward is not the drafter transformers runs")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("check", "train"):
        p = sub.add_parser(name)
        p.add_argument("--prep", required=True)
        p.add_argument("--target", required=True, help="the target GGUF")
        p.add_argument("--out", required=True)
        p.add_argument("--device", default="auto")
    c = sub.choices["check"]
    c.add_argument("--start", type=int, default=2000)
    c.add_argument("--n", type=int, default=400)
    t = sub.choices["train"]
    t.add_argument("--minutes", type=float, default=20.0)
    t.add_argument("--steps", type=int, default=0, help="stop here too (0: the minutes only)")
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--ctx", type=int, default=384)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--warmup", type=int, default=50)
    t.add_argument("--seed", type=int, default=13)
    t.add_argument("--centroid-steps", type=int, default=60)
    t.add_argument("--val-batches", type=int, default=4)
    t.add_argument("--log-every", type=int, default=10)
    t.add_argument("--amp", action="store_true", help="bf16 autocast off the GPU too")
    g = sub.add_parser("golden")
    g.add_argument("--prep", required=True)
    g.add_argument("--target", required=True, help="the target GGUF")
    g.add_argument("--hf", required=True, help="the trained drafter's checkpoint")
    g.add_argument("--out", required=True)
    g.add_argument("--device", default="cpu")
    g.add_argument("--start", type=int, default=3000)
    g.add_argument("--n", type=int, default=200)
    g.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    {"check": cmd_check, "train": cmd_train, "golden": cmd_golden}[a.cmd](a)


if __name__ == "__main__":
    main()
