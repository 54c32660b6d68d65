#!/usr/bin/env python3
"""Why a K cache with outlier channels can rank the KV codecs out of bit order.

Keys of 64 dims, N(0, 1) plus two channel pairs carrying a rotated bias of amplitude AMP (as
Qwen2.5's biased K projections give after RoPE), are rounded through ggml's block formats
(blocks of 32, f16 scales) and the RMS error of the logits q.k is printed per codec. The
symmetric formats (q5_0, q4_0) keep 0 on their grid; the min formats (q5_1, q4_1) put their
grid at min + j d, so a block whose range an outlier stretches moves every small value by up
to d / 2. With no outliers the order follows the bits; with large ones it does not.

    python3 tests/reference/kv_outlier_sim.py        (numpy only)
"""
import numpy as np


def f16(x):
    return np.asarray(x, np.float16).astype(np.float32)


def q_sym(x, bits):  # q4_0 / q5_0: d = (the value of largest magnitude) / -2^(bits-1)
    n = 1 << (bits - 1)
    r = x.reshape(-1, 32)
    mx = r[np.arange(len(r)), np.abs(r).argmax(1)]
    d = (mx / -n).astype(np.float32)
    inv = np.where(d != 0, 1 / np.where(d != 0, d, 1), 0)
    q = np.clip(np.floor(r * inv[:, None] + n + 0.5), 0, 2 * n - 1)
    return ((q - n) * f16(d)[:, None]).reshape(x.shape)


def q_min(x, bits):  # q4_1 / q5_1: d = (max - min) / (2^bits - 1), m = min
    r = x.reshape(-1, 32)
    lo, hi = r.min(1), r.max(1)
    d = ((hi - lo) / ((1 << bits) - 1)).astype(np.float32)
    inv = np.where(d != 0, 1 / np.where(d != 0, d, 1), 0)
    q = np.clip(np.floor((r - lo[:, None]) * inv[:, None] + 0.5), 0, (1 << bits) - 1)
    return (q * f16(d)[:, None] + f16(lo)[:, None]).reshape(x.shape)


def q8_0(x):
    r = x.reshape(-1, 32)
    d = np.abs(r).max(1) / 127
    inv = np.where(d > 0, 1 / np.where(d > 0, d, 1), 0)
    y = r * inv[:, None]
    return (np.sign(y) * np.floor(np.abs(y) + 0.5) * f16(d)[:, None]).reshape(x.shape)


CODECS = [("q8_0", q8_0), ("q5_1", lambda x: q_min(x, 5)), ("q5_0", lambda x: q_sym(x, 5)),
          ("q4_1", lambda x: q_min(x, 4)), ("q4_0", lambda x: q_sym(x, 4))]


def main():
    rng = np.random.default_rng(0)
    n, dim = 4096, 64
    theta = 1e6 ** (-np.arange(dim // 2) / (dim // 2))
    pos = np.arange(n)
    print("logit RMS error per codec (keys of 64 dims, two biased channel pairs)")
    for amp in [0, 20, 100, 300]:
        k = rng.standard_normal((n, dim)).astype(np.float32)
        for c in [3, 17]:  # NeoX pairs c and c + 32
            k[:, c] += amp * np.cos(pos * theta[c])
            k[:, c + dim // 2] += amp * np.sin(pos * theta[c])
        q = rng.standard_normal(dim).astype(np.float32)
        errs = ", ".join(f"{name} {np.sqrt(np.mean(((fn(k) - k) @ q) ** 2)):.3f}"
                         for name, fn in CODECS)
        print(f"  amplitude {amp:3d}: {errs}")


if __name__ == "__main__":
    main()
