"""`tessera serve` with a speculator (spec_mtp's prompt lookup) on the default model: a lone
request decodes by speculative steps and gets exactly the text a server without one gives at
temperature 0, max_tokens holds exactly, the drafts show in /metrics; requests at once verify
their drafts in shared batches and each completes whole, drafting (their texts are not
compared: a batch of several sequences rounds differently from one alone, with or without a
speculator); a sampled request completes and reproduces from its seed.

usage: test_speculation.py TESSERA_BINARY SOURCE_ROOT DEFAULT_MODEL.gguf
Prints "ok   name" / "FAIL name" per case.
"""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402
from server_util import case  # noqa: E402

TESSERA, SOURCE, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
TMP = tempfile.mkdtemp(prefix="tsr_serve_spec_")
PROMPTS = [
    "The pass key is 71432. Remember it. The grass is green. The sky is blue. The pass key is "
    "71432. Remember it. The grass is green. The sky is blue. What is the pass key? The pass "
    "key is",
    "one two three four five six seven one two three four five six seven one two three",
]
N = 40

profile = os.path.join(TMP, "spec.yaml")
with open(profile, "w") as f:
    f.write(f"model: {MODEL}\nplugins:\n  - arch_qwen\n  - name: spec_mtp\n"
            f"    settings: {{engine: lookup}}\nspeculator: {{name: spec_mtp}}\n")


def complete(s, prompt, **kw):
    body = {"prompt": prompt, "max_tokens": N, "temperature": 0, **kw}
    doc = s.post("/v1/completions", body, timeout=120)
    return doc["choices"][0]["text"], doc["usage"]["completion_tokens"], \
        doc["choices"][0]["finish_reason"]


def spec_counters(s):
    status, _, data = s.request("GET", "/metrics")
    assert status == 200, status
    got = {}
    for name in ("tokens_drafted", "tokens_accepted"):
        m = re.search(r'tessera_plugin_counter\{plugin="spec_mtp",counter="%s"\} (\d+)' % name,
                      data.decode())
        got[name] = int(m.group(1)) if m else 0
    return got


with su.Server(TESSERA, MODEL, ["--parallel", "2"], label="plain") as plain:
    want = [complete(plain, p) for p in PROMPTS]
    # a stop string inside the reply: speculative steps yield several tokens at once
    STOP = want[1][0][12:16]
    want_stop = complete(plain, PROMPTS[1], stop=[STOP])

with su.Server(TESSERA, None, ["--profile", profile, "--parallel", "2"], label="spec") as s:

    @case
    def test_a_lone_request_speculates_and_gets_the_plain_text():
        before = spec_counters(s)
        for p, w in zip(PROMPTS, want):
            got = complete(s, p)
            assert got == w, f"{p[:30]!r}: {got} against {w}"
        after = spec_counters(s)
        assert after["tokens_drafted"] > before["tokens_drafted"], (before, after)
        assert after["tokens_accepted"] > before["tokens_accepted"], (before, after)

    @case
    def test_max_tokens_holds_exactly_under_speculation():
        for n in (1, 2, 7, 23):
            text, count, finish = complete(s, PROMPTS[1], max_tokens=n)
            assert count == n and finish == "length", (n, count, finish, text)
            assert want[1][0].startswith(text), (n, text, want[1][0])

    @case
    def test_a_stop_string_cuts_a_speculative_step_as_it_cuts_plain_decoding():
        assert want_stop[2] == "stop" and STOP not in want_stop[0], want_stop
        assert complete(s, PROMPTS[1], stop=[STOP]) == want_stop

    @case
    def test_requests_at_once_each_complete():
        before = spec_counters(s)
        got = su.parallel_map(lambda p: complete(s, p), PROMPTS * 3, 4)
        for i, g in enumerate(got):
            assert not isinstance(g, Exception), f"request {i}: {g}"
            assert g[1:] == want[i % 2][1:], f"request {i}: {g} against {want[i % 2]}"
        after = spec_counters(s)
        assert after["tokens_drafted"] > before["tokens_drafted"], (before, after)

    @case
    def test_a_sampled_request_completes():
        text, count, finish = complete(s, PROMPTS[1], temperature=0.8, seed=3)
        assert finish in ("length", "stop") and 0 < count <= N, (text, count, finish)
        assert complete(s, PROMPTS[1], temperature=0.8, seed=3) == (text, count, finish)

su.finish()
