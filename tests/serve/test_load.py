"""A bounded load on `tessera serve`: 32 concurrent streams over loopback, a fixed number of
requests, every stream complete and well formed, memory back near its baseline, counters exact.

usage: test_load.py TESSERA_BINARY SOURCE_ROOT DEFAULT_MODEL.gguf
Prints "ok   name" / "FAIL name" per case.

The memory bound: the KV cache and compute buffers are planned and allocated once at load, so
serving should not grow the process. What does legitimately move is malloc's per-thread arenas
and fragmentation, which the warm-up round (the same 32-way concurrency) mostly grows to their
working size: measured on the default model, RSS rose 0.6 MiB over the first round and then
levelled off at +1.6 MiB after ten rounds. RSS_SLACK_MIB = 8 is five times that noise, and still
catches a leak of per-request state: 5 x 96 requests leaking more than ~17 KiB each (a slot's
buffers, a request's token or logit arrays, an SSE buffer) break it. Smaller leaks are for the
valgrind run in test_shutdown.py to find.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402
from server_util import case, check_chunks, check_usage  # noqa: E402

TESSERA, SOURCE, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
PARALLEL, STREAMS, REQUESTS, ROUNDS = 4, 32, 96, 5
RSS_SLACK_MIB = 8


def request_body(i):
    """Request i: chat or completion, 16..32 tokens, sampled with its own seed."""
    n = 16 + (i * 7) % 17
    common = {"max_tokens": n, "temperature": 0.8, "seed": i, "stream": True,
              "stream_options": {"include_usage": True}}
    if i % 2:
        return "/v1/completions", {"prompt": f"Load request {i}:", **common}
    return "/v1/chat/completions", {"messages": [{"role": "user", "content": f"Load {i}"}],
                                    **common}


def one_stream(s, i):
    path, body = request_body(i)
    st = s.stream(path, body, timeout=120)
    obj = "chat.completion.chunk" if "chat" in path else "text_completion"
    text, finish, usage = check_chunks(st, obj, None)
    assert usage is not None, f"request {i}: no usage chunk"
    check_usage(usage, body["max_tokens"], finish)
    return usage


def load(s, n, offset):
    """n streamed requests on STREAMS threads; returns (usages, seconds). Fails on the first
    bad stream, naming the request."""
    t0 = time.monotonic()
    got = su.parallel_map(lambda i: one_stream(s, i), list(range(offset, offset + n)), STREAMS)
    took = time.monotonic() - t0
    bad = [(offset + k, g) for k, g in enumerate(got) if isinstance(g, Exception)]
    assert not bad, f"{len(bad)} of {n} streams failed; first: request {bad[0][0]}: " \
                    f"{type(bad[0][1]).__name__}: {bad[0][1]}"
    return got, took


with su.Server(TESSERA, MODEL, ["--parallel", str(PARALLEL)], label="load") as s:
    state = {}

    @case
    def test_warm_up_round_completes():
        usages, took = load(s, STREAMS, 10000)
        s.wait_slots_idle()
        time.sleep(0.3)
        state["baseline"] = s.rss_kib()
        print(f"  warm-up: {STREAMS} streams in {took:.1f} s, RSS {state['baseline'] / 1024:.1f} "
              f"MiB", file=sys.stderr)

    for r in range(ROUNDS):
        def run_round(r=r):
            before = s.metrics()
            usages, took = load(s, REQUESTS, r * REQUESTS)
            s.wait_slots_idle()
            after = s.metrics()
            d = {k: after[k] - before[k] for k in before}
            assert d["tessera_requests_total"] == REQUESTS, \
                f"requests_total grew by {d['tessera_requests_total']} for {REQUESTS} requests"
            assert d["tessera_requests_failed_total"] == 0, d
            gen = sum(u["completion_tokens"] for u in usages)
            assert d["tessera_generated_tokens_total"] == gen, \
                f"generated_tokens_total grew by {d['tessera_generated_tokens_total']}, the " \
                f"streams' usage sums to {gen}"
            prompt = sum(u["prompt_tokens"] for u in usages)
            assert 0 < d["tessera_prompt_tokens_total"] <= prompt, \
                (d["tessera_prompt_tokens_total"], prompt)
            assert after["tessera_slots_busy"] == 0 and after["tessera_requests_waiting"] == 0, after
            time.sleep(0.3)
            rss = s.rss_kib()
            print(f"  round {r + 1}: {REQUESTS} streams ({gen} tokens) in {took:.1f} s, RSS "
                  f"{rss / 1024:.1f} MiB (baseline {state.get('baseline', 0) / 1024:.1f})",
                  file=sys.stderr)
            assert "baseline" in state, "no baseline: the warm-up failed"
            grew = (rss - state["baseline"]) / 1024
            assert grew <= RSS_SLACK_MIB, \
                f"RSS grew {grew:.1f} MiB over the baseline (allowed {RSS_SLACK_MIB})"
        su.report(f"test_round_{r + 1}_of_{REQUESTS}_streams_complete_counted_and_memory_flat",
                  run_round)

    @case
    def test_after_the_load_every_slot_is_idle_and_the_server_answers():
        slots = s.wait_slots_idle()
        assert len(slots) == PARALLEL, slots
        assert s.get("/health") == {"status": "ok"}
        r = s.post("/v1/completions", {"prompt": "after", "max_tokens": 4, "temperature": 0})
        assert r["usage"]["completion_tokens"] <= 4, r

su.finish()
