"""`tessera serve` stopped by SIGTERM or SIGINT: in-flight streams end well formed (or their
connection closes), a waiting request gets 503 shutting_down, the process exits 0 promptly, and
under valgrind a short session frees everything.

usage: test_shutdown.py TESSERA_BINARY SOURCE_ROOT DEFAULT_MODEL.gguf
Prints "ok   name" / "FAIL name" per case.
"""
import json
import os
import re
import shutil
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402
from server_util import case, check_error, chat_body  # noqa: E402

TESSERA, SOURCE, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
EXIT_WITHIN = 30.0  # seconds: generous, so a loaded machine passes; a hang still fails


class StreamReader(threading.Thread):
    """Reads one streaming request on its own thread; .first is set once a data event came."""

    def __init__(self, s, path, body):
        super().__init__(daemon=True)
        self.s, self.path, self.body = s, path, body
        self.first = threading.Event()
        self.result, self.error = None, None

    def run(self):
        try:
            c = self.s.conn(60)
            c.request("POST", self.path, body=json.dumps(self.body).encode(),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                self.result = su.Stream(r.status, {}, [], False, r.read())
                return
            line = r.readline()  # the first data line, then the rest as a stream
            self.first.set()
            rest = su.read_sse(_Prepend(line, r))
            self.result = rest
        except Exception as e:
            self.error = e
        finally:
            self.first.set()


class _Prepend:
    def __init__(self, line, r):
        self.line, self.r = line, r

    def readline(self):
        if self.line is not None:
            line, self.line = self.line, None
            return line
        return self.r.readline()


def long_stream_body(n_ctx, chat=False):
    """A greedy stream that runs until the slot's context is full (~1 s on the default model)."""
    if chat:  # no max_tokens: until an end-of-generation token or a full context
        return "/v1/chat/completions", chat_body("Keep going", temperature=0, stream=True)
    return "/v1/completions", {"prompt": "Keep going", "max_tokens": n_ctx - 16,
                               "temperature": 0, "stream": True}


def check_interrupted_stream(reader):
    """The stream of a server told to stop (docs/SERVER.md): every event JSON (read_sse checks),
    a last chunk with finish_reason "cancelled" (or "stop"/"length" if it ended first), then
    data: [DONE]. Returns that finish_reason."""
    reader.join(10)
    assert not reader.is_alive(), "the stream is still open 10 s after the signal"
    assert reader.error is None, f"{type(reader.error).__name__}: {reader.error}"
    st = reader.result
    assert st.status == 200, st
    choices = [c for e in st.events for c in e.get("choices", [])]
    assert st.done, f"the stream closed without data: [DONE] after {len(st.events)} chunks: {st}"
    assert choices, f"[DONE] without any chunk: {st}"
    last = choices[-1].get("finish_reason")
    assert last in ("cancelled", "stop", "length"), f"last finish_reason {last!r}: {st}"
    return last


def stop_and_check(server, sig, within=EXIT_WITHIN):
    t0 = time.monotonic()
    server.send_signal(sig)
    code = server.wait_exit(within)
    took = time.monotonic() - t0
    if code is None:
        server.proc.kill()
        server.wait_exit(5)
        raise AssertionError(f"still running {within:.0f} s after {sig.name}")
    assert code == 0, f"exit {code} after {sig.name}; stderr:\n{server.log()[-2000:]}"
    return took


for sig in (signal.SIGTERM, signal.SIGINT):
    name = sig.name.lower()
    with su.Server(TESSERA, MODEL, ["--parallel", "2"], label=f"idle_{name}") as s:
        def idle(s=s, sig=sig):
            s.get("/health")
            took = stop_and_check(s, sig)
            print(f"  idle server: exit 0 {took:.2f} s after {sig.name}", file=sys.stderr)
        su.report(f"test_idle_server_exits_0_on_{name}", idle)

    with su.Server(TESSERA, MODEL, ["--parallel", "2"], label=f"stream_{name}") as s:
        def during_stream(s=s, sig=sig):
            n_ctx = s.slots()[0]["n_ctx"]
            readers = [StreamReader(s, *long_stream_body(n_ctx, chat=k == 0)) for k in range(2)]
            for r in readers:
                r.start()
            for r in readers:
                assert r.first.wait(60), "no first chunk in 60 s"
            took = stop_and_check(s, sig)
            ends = [check_interrupted_stream(r) for r in readers]
            print(f"  streams ended with {ends}; exit 0 {took:.2f} s after {sig.name}",
                  file=sys.stderr)
        su.report(f"test_{name}_during_streams_ends_them_and_exits_0", during_stream)

with su.Server(TESSERA, MODEL, ["--parallel", "1", "--queue", "4"], label="waiting") as s:
    @case
    def test_sigterm_answers_a_waiting_request_503_shutting_down():
        n_ctx = s.slots()[0]["n_ctx"]
        active = StreamReader(s, *long_stream_body(n_ctx))
        active.start()
        assert active.first.wait(60), "no first chunk in 60 s"
        waiting = {}

        def wait_request():
            try:
                waiting["answer"] = s.json("POST", "/v1/completions",
                                           {"prompt": "waiting", "max_tokens": 4}, timeout=120)
            except Exception as e:
                waiting["error"] = e
        t = threading.Thread(target=wait_request, daemon=True)
        t.start()
        t_end = time.monotonic() + 60
        while s.metrics()["tessera_requests_waiting"] < 1:
            assert time.monotonic() < t_end and t.is_alive(), \
                f"the second request never waited: {waiting}"
            time.sleep(0.01)
        stop_and_check(s, signal.SIGTERM)
        t.join(60)
        end = check_interrupted_stream(active)
        assert "error" not in waiting, f"{type(waiting['error']).__name__}: {waiting['error']}"
        status, doc = waiting["answer"]
        if status == 200 and end in ("stop", "length"):
            print("  note: the active stream finished before the signal; the waiting request "
                  "ran", file=sys.stderr)
            return
        check_error(status, doc, 503, "server_error", "shutting_down")

VALGRIND = shutil.which("valgrind")
if not VALGRIND:
    @case
    def test_valgrind_is_installed():
        raise AssertionError("valgrind is not installed: the leak check cannot run")
else:
    vg = [VALGRIND, "--leak-check=full", "--errors-for-leak-kinds=definite", "--error-exitcode=9"]
    s = su.Server(TESSERA, MODEL, ["--parallel", "2", "--threads", "2", "--max-body", "4096"],
                  label="valgrind",
                  wrapper=vg, start_timeout=120, stop_timeout=120)
    with s:
        @case
        def test_valgrind_session_serves_requests():
            r = s.post("/v1/chat/completions", chat_body("vg", max_tokens=4, temperature=0),
                       timeout=120)
            assert r["choices"][0]["finish_reason"] in ("stop", "length"), r
            st = s.stream("/v1/completions", {"prompt": "vg", "max_tokens": 4, "stream": True,
                                              "stream_options": {"include_usage": True}},
                          timeout=120)
            su.check_chunks(st, "text_completion", None)
            d = s.post("/completion", {"prompt": "vg", "n_predict": 3, "cache_prompt": True},
                       timeout=120)
            assert d["stop"] is True, d
            toks = s.post("/tokenize", {"content": "vg"})["tokens"]
            assert s.post("/detokenize", {"tokens": toks})["content"] == "vg"
            status, doc = s.json("POST", "/v1/completions", b"{bad", timeout=120)
            check_error(status, doc, 400, "invalid_request_error")
            status, doc = s.json("GET", "/nope", timeout=120)
            check_error(status, doc, 404, "not_found_error")
            status, doc = s.json("POST", "/v1/completions", {"prompt": "x" * 5000}, timeout=120)
            check_error(status, doc, 413, "invalid_request_error", "request_too_large")
            status, doc = s.json("POST", "/v1/chat/completions",
                                 chat_body("x", temperature="hot"), timeout=120)
            check_error(status, doc, 400, "invalid_request_error")
            s.metrics()
            s.slots()
            # more streams than slots: two decode together while two wait
            got = su.parallel_map(lambda i: s.stream("/v1/completions", {
                "prompt": f"vg {i}", "max_tokens": 6, "stream": True, "seed": i}, timeout=120),
                list(range(4)), 4)
            for g in got:
                assert not isinstance(g, Exception), g
                su.check_chunks(g, "text_completion", None)
            # a client that leaves mid-stream
            su.abandon_stream(s.port, "/v1/completions", {"prompt": "leave", "max_tokens": 64,
                                                          "stream": True}, timeout=120)
            s.wait_slots_idle(60)

        @case
        def test_valgrind_sigterm_exits_0_without_definite_leaks():
            n_ctx = s.slots()[0]["n_ctx"]
            reader = StreamReader(s, *long_stream_body(n_ctx))
            reader.start()
            assert reader.first.wait(60), "no first chunk"
            stop_and_check(s, signal.SIGTERM, 120)
            log = s.log()
            lost = re.search(r"definitely lost: ([\d,]+) bytes", log)
            assert lost is None or lost.group(1) == "0", log[-3000:]
            m = re.search(r"ERROR SUMMARY: (\d+) errors", log)
            assert m and m.group(1) == "0", f"valgrind reports errors:\n{log[-4000:]}"

su.finish()
