"""`tessera serve` given bad input: every error of docs/SERVER.md's table answers with its status
and an OpenAI-style error JSON, broken HTTP never crashes it, and afterwards it still answers
and holds no slot.

usage: test_bad_input.py TESSERA_BINARY SOURCE_ROOT DEFAULT_MODEL.gguf
Prints "ok   name" / "FAIL name" per case.
"""
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402
from server_util import case, check_error, chat_body, short  # noqa: E402

TESSERA, SOURCE, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
MAX_BODY = 16384
CHAT, COMPL, LLAMA = "/v1/chat/completions", "/v1/completions", "/completion"
INVALID = "invalid_request_error"


def expect_400(s, path, body, names=None, code=None, what=None):
    status, doc = s.json("POST", path, body)
    return check_error(status, doc, 400, INVALID, code, names, what or f"{path} {short(body, 200)}")


def still_serving(s):
    assert s.get("/health") == {"status": "ok"}
    s.wait_slots_idle()


def raw_request(method, path, body=b"", extra=b""):
    return (b"%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n%s\r\n" % (method, path, len(body), extra)) + body


with su.Server(TESSERA, MODEL, ["--parallel", "2", "--max-body", str(MAX_BODY)],
               label="bad_input") as s:
    N_CTX = s.slots()[0]["n_ctx"]

    @case
    def test_invalid_json_is_400():
        for path in (CHAT, COMPL, LLAMA, "/tokenize", "/detokenize"):
            for body in (b"{not json", b"", b'{"prompt": "a",}', b"\xff\xfe", b'{"a": 1} trailing',
                         b"[1, 2]", b'"a string"', b"null", b"42"):
                status, doc = s.json("POST", path, body, {"Content-Type": "application/json"})
                check_error(status, doc, 400, INVALID, what=f"{path} {body!r}")

    @case
    def test_deeply_nested_json_is_refused_not_a_stack_overflow():
        body = b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}"
        status, doc = s.json("POST", COMPL, body, {"Content-Type": "application/json"})
        check_error(status, doc, 400, INVALID)

    @case
    def test_wrong_types_are_400():
        msgs = [{"role": "user", "content": "x"}]
        cases = [
            (CHAT, {"messages": "hi"}, "messages"),
            (CHAT, {"messages": [{"role": "user", "content": 5}]}, "content"),
            (CHAT, {"messages": [{"role": 1, "content": "x"}]}, "role"),
            (CHAT, {"messages": ["x"]}, "messages"),
            (CHAT, {"messages": msgs, "max_tokens": "10"}, "max_tokens"),
            (CHAT, {"messages": msgs, "max_tokens": 2.5}, "max_tokens"),
            (CHAT, {"messages": msgs, "temperature": "hot"}, "temperature"),
            (CHAT, {"messages": msgs, "stream": "yes"}, "stream"),
            (CHAT, {"messages": msgs, "stream_options": {"include_usage": "yes"}},
             "include_usage"),
            (CHAT, {"messages": msgs, "stop": 5}, "stop"),
            (CHAT, {"messages": msgs, "stop": ["a", 1]}, "stop"),
            (CHAT, {"messages": msgs, "seed": 1.5}, "seed"),
            (CHAT, {"messages": msgs, "seed": "1"}, "seed"),
            (CHAT, {"messages": msgs, "top_k": 1.5}, "top_k"),
            (CHAT, {"messages": msgs, "model": 3}, "model"),
            (CHAT, {"messages": msgs, "user": {}}, "user"),
            (CHAT, {"messages": msgs, "n": "1"}, "n"),
            (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": 7}]}]},
             "text"),
            (COMPL, {"prompt": 5}, "prompt"),
            (COMPL, {"prompt": {"a": 1}}, "prompt"),
            (COMPL, {"prompt": [1.5, 2]}, "prompt"),
            (COMPL, {"prompt": ["a", 1]}, "prompt"),
            (COMPL, {"prompt": "a", "echo": "no"}, "echo"),
            (LLAMA, {"prompt": "a", "n_predict": "5"}, "n_predict"),
            (LLAMA, {"prompt": "a", "cache_prompt": 1}, "cache_prompt"),
            (LLAMA, {"prompt": 7}, "prompt"),
            ("/tokenize", {"content": 5}, "content"),
            ("/tokenize", {"content": "a", "add_special": "yes"}, "add_special"),
            ("/detokenize", {"tokens": ["a"]}, "tokens"),
            ("/detokenize", {"tokens": "a"}, "tokens"),
        ]
        for path, body, field in cases:
            expect_400(s, path, body, what=f"{path} {field}: {short(body, 200)}")

    @case
    def test_missing_required_fields_are_400():
        for path, body in ((CHAT, {}), (CHAT, {"model": "m"}), (COMPL, {}), (LLAMA, {}),
                           ("/tokenize", {}), ("/detokenize", {}),
                           (CHAT, {"messages": [{"role": "user"}]}),
                           (CHAT, {"messages": [{"content": "x"}]})):
            expect_400(s, path, body)

    @case
    def test_unknown_fields_are_400_and_named():
        msgs = [{"role": "user", "content": "x"}]
        for path, body, name in (
                (CHAT, {"messages": msgs, "frobnicate": 1}, "frobnicate"),
                (CHAT, {"messages": msgs, "tools": []}, "tools"),
                (CHAT, {"messages": msgs, "response_format": {"type": "json_object"}},
                 "response_format"),
                (CHAT, {"messages": msgs, "logit_bias": {}}, "logit_bias"),
                (CHAT, {"messages": [{"role": "user", "content": "x", "colour": "red"}]},
                 "colour"),
                (CHAT, {"messages": msgs, "stream": True,
                        "stream_options": {"include_usage": True, "zz": 1}}, "zz"),
                (COMPL, {"prompt": "x", "suffix": "y"}, "suffix"),
                (COMPL, {"prompt": "x", "best_of": 1}, "best_of"),
                (COMPL, {"prompt": "x", "n_predict": 3}, "n_predict"),
                (LLAMA, {"prompt": "x", "max_tokens": 3}, "max_tokens"),
                (LLAMA, {"prompt": "x", "mirostat": 2}, "mirostat"),
                ("/tokenize", {"content": "x", "with_pieces": True}, "with_pieces"),
                ("/detokenize", {"tokens": [1], "extra": 1}, "extra")):
            expect_400(s, path, body, names=name)

    @case
    def test_out_of_range_values_are_400():
        msgs = [{"role": "user", "content": "x"}]
        for extra in ({"temperature": -0.1}, {"temperature": 2.5}, {"top_p": 0}, {"top_p": 1.01},
                      {"top_p": -1}, {"top_k": -1}, {"min_p": 1}, {"min_p": -0.1}, {"n": 2},
                      {"n": 0}, {"max_tokens": 0}, {"max_tokens": -1},
                      {"max_completion_tokens": 0}, {"stop": [str(i) for i in range(17)]},
                      {"presence_penalty": 0.5}, {"frequency_penalty": -1},
                      {"logprobs": True}):
            expect_400(s, CHAT, {"messages": msgs, **extra}, what=f"chat {extra}")
        # 1e999 is valid JSON that parses to infinity
        body = '{"messages": [{"role": "user", "content": "x"}], "temperature": 1e999}'
        status, doc = s.json("POST", CHAT, body, {"Content-Type": "application/json"})
        check_error(status, doc, 400, INVALID, what="temperature 1e999")
        for extra in ({"n": 3}, {"echo": True}, {"logprobs": 2}, {"max_tokens": 0},
                      {"temperature": 3}, {"presence_penalty": 1}):
            expect_400(s, COMPL, {"prompt": "x", **extra})
        for extra in ({"n_predict": -2}, {"temperature": -1}, {"top_p": 0}, {"min_p": 1.5}):
            expect_400(s, LLAMA, {"prompt": "x", **extra})
        expect_400(s, CHAT, {"messages": [{"role": "robot", "content": "x"}]})
        # a setting that would be silently ignored is an error (as OpenAI does for this one)
        expect_400(s, CHAT, {"messages": msgs, "stream_options": {"include_usage": True}},
                   names="stream_options")
        expect_400(s, CHAT, {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]})

    @case
    def test_token_ids_outside_the_vocabulary_are_400():
        vocab_probe = s.post("/tokenize", {"content": "a"})["tokens"]
        assert vocab_probe, vocab_probe
        for bad in (-1, 1 << 20, 2 ** 31, 2 ** 40):
            expect_400(s, "/detokenize", {"tokens": [bad]})
            expect_400(s, COMPL, {"prompt": [bad], "max_tokens": 1})
            expect_400(s, LLAMA, {"prompt": [bad], "n_predict": 1})

    @case
    def test_edge_values_in_range_are_accepted():
        msgs = [{"role": "user", "content": "x"}]
        for extra in ({"temperature": 0}, {"temperature": 2}, {"top_p": 1}, {"top_k": 0},
                      {"min_p": 0}, {"n": 1}, {"presence_penalty": 0}, {"frequency_penalty": 0},
                      {"logprobs": False}, {"seed": -1}, {"seed": 0}, {"stop": []},
                      {"stop": [str(i) for i in range(16)]}, {"user": "u"},
                      {"max_completion_tokens": 1},
                      {"model": "whatever"}):
            limit = {} if "max_completion_tokens" in extra else {"max_tokens": 2}
            status, doc = s.json("POST", CHAT, {"messages": msgs, **limit, **extra})
            assert status == 200, f"chat {extra}: {status} {short(doc)}"
        for body in ({"messages": [{"role": "developer", "content": "d"},
                                   {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                {"type": "text", "text": "b"}]},
                                   {"role": "assistant", "content": "c"},
                                   {"role": "user", "content": "e"}], "max_tokens": 2},):
            s.post(CHAT, body)
        st = s.stream(CHAT, {"messages": msgs, "max_tokens": 2, "stream": True,
                             "stream_options": {"include_usage": False}})
        su.check_chunks(st, "chat.completion.chunk", None)
        for extra in ({"logprobs": None}, {"echo": False}, {"prompt": ["one string"]}):
            s.post(COMPL, {"prompt": "x", "max_tokens": 2, **extra})
        s.post(LLAMA, {"prompt": "x", "n_predict": 1, "cache_prompt": False, "top_k": 0,
                       "min_p": 0, "seed": 3, "stop": ["zz"]})

    @case
    def test_context_overflow_is_400_context_length_exceeded():
        long = "a" * (N_CTX + 1)
        n_long = len(s.post("/tokenize", {"content": long})["tokens"])
        assert n_long > N_CTX, f"{n_long} tokens for {N_CTX + 1} bytes"
        expect_400(s, COMPL, {"prompt": long, "max_tokens": 1}, code="context_length_exceeded")
        expect_400(s, CHAT, chat_body(long, max_tokens=1), code="context_length_exceeded")
        expect_400(s, LLAMA, {"prompt": long, "n_predict": 1}, code="context_length_exceeded")
        toks = s.post("/tokenize", {"content": "b" * (N_CTX + 1)})["tokens"]
        expect_400(s, COMPL, {"prompt": toks, "max_tokens": 1}, code="context_length_exceeded")
        # the prompt fits, prompt + max_tokens does not
        half = "c" * (N_CTX // 2)
        n_half = len(s.post("/tokenize", {"content": half})["tokens"])
        expect_400(s, COMPL, {"prompt": half, "max_tokens": N_CTX - n_half + 1},
                   code="context_length_exceeded")
        status, doc = s.json("POST", COMPL, {"prompt": long, "stream": True})
        check_error(status, doc, 400, INVALID, "context_length_exceeded", what="streamed")

    @case
    def test_prompt_plus_max_tokens_equal_to_the_context_fits():
        half = "d" * (N_CTX // 2)
        n_half = len(s.post("/tokenize", {"content": half})["tokens"])
        r = s.post(COMPL, {"prompt": half, "max_tokens": N_CTX - n_half, "temperature": 0},
                   timeout=600)
        u = r["usage"]
        assert u["prompt_tokens"] + u["completion_tokens"] <= N_CTX, u
        assert r["choices"][0]["finish_reason"] == "stop" or u["completion_tokens"] == N_CTX - n_half

    @case
    def test_body_over_max_body_is_413():
        big = {"prompt": "x", "max_tokens": 1, "user": "u" * (MAX_BODY + 10)}
        for path in (CHAT, COMPL, LLAMA, "/tokenize"):
            status, doc = s.json("POST", path, big)
            check_error(status, doc, 413, INVALID, "request_too_large", what=path)
        # the same body sent chunked, without a Content-Length to refuse it up front
        data = json.dumps(big).encode()
        c = s.conn()
        c.putrequest("POST", COMPL)
        c.putheader("Content-Type", "application/json")
        c.putheader("Transfer-Encoding", "chunked")
        c.endheaders()
        try:
            for i in range(0, len(data), 4096):
                piece = data[i:i + 4096]
                c.send(b"%x\r\n%s\r\n" % (len(piece), piece))
            c.send(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before the whole body went out: fine, the answer still counts
        r = c.getresponse()
        check_error(r.status, json.loads(r.read()), 413, INVALID, "request_too_large",
                    what="chunked")
        c.close()
        # whitespace keeps a body under the limit valid JSON: it must be accepted
        under = json.dumps({"prompt": "x", "max_tokens": 1}) + " " * (MAX_BODY - 100)
        status, doc = s.json("POST", COMPL, under, {"Content-Type": "application/json"})
        assert status == 200, f"{len(under)}-byte body under --max-body {MAX_BODY}: {status} {doc}"

    @case
    def test_wrong_method_is_405():
        for method, path in (("GET", CHAT), ("GET", COMPL), ("GET", LLAMA), ("GET", "/tokenize"),
                             ("PUT", "/detokenize"), ("POST", "/health"), ("POST", "/v1/models"),
                             ("DELETE", "/slots"), ("POST", "/metrics"), ("PATCH", CHAT)):
            status, doc = s.json(method, path, b"{}" if method != "GET" else None)
            check_error(status, doc, 405, INVALID, "method_not_allowed", what=f"{method} {path}")

    @case
    def test_unknown_path_is_404():
        # "/" is the chat page (test_chat_page.py); "//" and "/index.html" are not it
        for method, path in (("GET", "//"), ("GET", "/index.html"),
                             ("GET", "/v2/models"), ("POST", "/v1/embeddings"),
                             ("GET", "/health/x"), ("GET", "/v1/models/../../etc/passwd"),
                             ("POST", "/v1/chat/completions/x"), ("GET", "/" + "a" * 2000)):
            status, doc = s.json(method, path, b"{}" if method == "POST" else None)
            check_error(status, doc, 404, "not_found_error", what=f"{method} {path}")

    @case
    def test_truncated_body_and_client_leaving_mid_request():
        body = json.dumps(chat_body("truncated", max_tokens=2)).encode()
        for cut in (1, len(body) // 2, len(body) - 1):
            sock = socket.create_connection((su.HOST, s.port), timeout=5)
            sock.sendall(raw_request(b"POST", CHAT.encode(), body)[:-len(body) + cut])
            sock.close()
        # half-closed: the server sees EOF before the promised Content-Length
        got = su.raw_exchange(s.port, raw_request(b"POST", CHAT.encode(), body)[:-5],
                              close_write=True)
        assert not got or got.startswith(b"HTTP/1.1 4"), got[:200]
        # headers only, then gone
        for _ in range(5):
            sock = socket.create_connection((su.HOST, s.port), timeout=5)
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100")
            sock.close()
        time.sleep(0.2)
        still_serving(s)

    @case
    def test_garbage_instead_of_http_does_not_crash():
        import random
        rng = random.Random(12)
        for data in (bytes(rng.randrange(256) for _ in range(2000)), b"\r\n\r\n",
                     b"GET\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"\x00" * 64 + b"\r\n\r\n",
                     b"POST /v1/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
                     b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999999999999"
                     b"\r\n\r\n",
                     b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"zz\r\nxx\r\n0\r\n\r\n",
                     b"GET /health HTTP/1.1\r\nX: " + b"h" * 100000 + b"\r\n\r\n"):
            got = su.raw_exchange(s.port, data, read_timeout=3, close_write=True)
            assert not got or got.startswith(b"HTTP/1."), f"{data[:40]!r}: answer {got[:100]!r}"
            assert s.proc.poll() is None, f"the server died on {data[:60]!r}: {s.log()[-2000:]}"
        still_serving(s)

    @case
    def test_ambiguous_request_framing_is_refused_not_guessed():
        # RFC 9112: conflicting lengths are a 400, an unknown transfer coding a 501, and the
        # connection closes after the answer (a proxy in front could frame it otherwise)
        body = b'{"prompt": "a", "n_predict": 1}'
        head = b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        cases = [
            (head + b"Content-Length: %d\r\nContent-Length: 5\r\n\r\n" % len(body) + body,
             b"400", b"Content-Length headers that differ"),
            (head + b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % len(body) +
             body, b"400", b"both Transfer-Encoding and Content-Length"),
            (head + b"Transfer-Encoding: xchunked\r\n\r\n" + body, b"501", b"'xchunked'"),
            (b"GET /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", b"501",
             b"'gzip' is not supported"),
        ]
        for data, status, needle in cases:
            got = su.raw_exchange(s.port, data, read_timeout=30)
            assert got.startswith(b"HTTP/1.1 " + status), f"{data[:60]!r}: {got[:120]!r}"
            assert needle in got and b"Connection: close" in got, got[:300]
            json.loads(got.split(b"\r\n\r\n", 1)[1])
        # agreeing duplicates are one length
        same = head + b"Connection: close\r\nContent-Length: %d\r\nContent-Length: %d\r\n\r\n" % (
            len(body), len(body))
        got = su.raw_exchange(s.port, same + body, read_timeout=30)
        assert got.startswith(b"HTTP/1.1 200"), got[:200]
        still_serving(s)

    @case
    def test_error_bodies_are_valid_json_whatever_bytes_the_request_held():
        # request text echoed in an error (a field name, a role, a path) that is not
        # UTF-8 is replaced, so the body stays UTF-8 JSON
        bad = b"\xff\xfe\xc3"
        cases = [(b"/v1/completions", b'{"prompt": "a", "' + bad + b'": 1}'),
                 (b"/v1/chat/completions", b'{"messages": [{"role": "' + bad + b'", "content": "x"}]}'),
                 (b"/v1/" + bad, b"{}")]
        for path, body in cases:
            data = (b"POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
                    b"application/json\r\nContent-Length: %d\r\n\r\n" % (path, len(body)) + body)
            got = su.raw_exchange(s.port, data, read_timeout=10)
            assert got.startswith(b"HTTP/1.1 4"), f"{path!r}: {got[:120]!r}"
            doc = json.loads(got.split(b"\r\n\r\n", 1)[1].decode("utf-8"))
            assert "\ufffd" in doc["error"]["message"], doc

    @case
    def test_nul_characters_are_refused_not_cut():
        # "stop\u0000x" used to be taken as the known key "stop", a prompt cut at the NUL
        for path, body in ((COMPL, b'{"prompt": "a", "stop\\u0000x": 1}'),
                           (COMPL, b'{"prompt": "ab\\u0000cd", "max_tokens": 1}'),
                           (CHAT, b'{"messages": [{"role": "user", "content": "x\\u0000y"}]}'),
                           ("/tokenize", b'{"content": "a\\u0000b"}')):
            status, doc = s.json("POST", path, body, {"Content-Type": "application/json"})
            check_error(status, doc, 400, INVALID, what=f"{path} {body!r}")
            assert "\\u0000" in doc["error"]["message"], doc
        # an escaped backslash before u0000 is text, not a NUL
        r = s.post("/tokenize", {"content": "a\\u0000b"})
        assert r["tokens"], r

    @case
    def test_error_messages_say_what_was_sent():
        # the prompt's length alone, with no stray digit after it
        long = "b" * (N_CTX + 1)
        n = len(s.post("/tokenize", {"content": long, "add_special": True})["tokens"])
        status, doc = s.json("POST", LLAMA, {"prompt": long, "n_predict": -1})
        check_error(status, doc, 400, INVALID, "context_length_exceeded")
        assert doc["error"]["message"].endswith(f"the prompt has {n}"), doc
        # /completion's limit is n_predict, and it is named so
        status, doc = s.json("POST", LLAMA, {"prompt": "b" * (N_CTX // 2), "n_predict": N_CTX})
        check_error(status, doc, 400, INVALID, "context_length_exceeded")
        msg = doc["error"]["message"]
        assert f"n_predict asks for {N_CTX} more" in msg and "max_tokens" not in msg, doc
        # a number a double cannot hold is too large, not "not number"
        status, doc = s.json("POST", COMPL, b'{"prompt": "a", "temperature": 1e999}',
                             {"Content-Type": "application/json"})
        check_error(status, doc, 400, INVALID)
        assert "too large" in doc["error"]["message"], doc

    @case
    def test_errors_leave_the_server_serving_and_every_slot_idle():
        still_serving(s)
        r = s.post(COMPL, {"prompt": "after all that", "max_tokens": 3, "temperature": 0})
        assert r["usage"]["completion_tokens"] == 3, r
        m = s.metrics()
        assert m["tessera_slots_busy"] == 0 and m["tessera_requests_waiting"] == 0, m
        # the plugins' counters (flash's layers built, at least)
        assert m.get("tessera_plugin_counter", 0) > 0, m


def wait_for(what, pred, timeout=120):
    t_end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < t_end, f"{what}: not within {timeout} s"
        time.sleep(0.05)


def still_streaming(sock):
    """Whether a stream has not ended yet (reads what arrived, without waiting)."""
    sock.setblocking(False)
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk or b"data: [DONE]" in chunk:
                return False
    except BlockingIOError:
        return True
    finally:
        sock.setblocking(True)


with su.Server(TESSERA, MODEL, ["--parallel", "1", "--queue", "1"], label="busy") as s:
    @case
    def test_more_requests_than_parallel_plus_queue_get_503_server_busy():
        # one stream holds the slot, a second waits in the queue: a third must be refused
        # at once. Nothing here depends on speed: each state is waited for, and a round in
        # which the first stream ended before the third was sent is run again.
        n_ctx = s.slots()[0]["n_ctx"]
        body = {"prompt": "Busy", "max_tokens": n_ctx - 8, "temperature": 0}
        for round_ in range(5):
            running, _ = su.open_stream(s.port, COMPL, body)
            waiting = None
            try:
                wait_for("the slot busy", lambda: s.metrics()["tessera_slots_busy"] == 1)
                waiting, _ = su.open_stream(s.port, COMPL, body)
                wait_for("a request queued", lambda: s.metrics()["tessera_requests_waiting"] == 1)
                status, doc = s.json("POST", COMPL, {"prompt": "x", "max_tokens": 1})
                overlapped = still_streaming(running)
            finally:
                running.close()
                if waiting:
                    waiting.close()
            if overlapped:
                check_error(status, doc, 503, "server_error", "server_busy")
                assert "--queue 1" in doc["error"]["message"], doc
                break
        else:
            raise AssertionError("in 5 rounds the first stream always ended before the third "
                                 "request was sent")
        s.wait_slots_idle(120)
        still_serving(s)
        m = s.metrics()
        assert m["tessera_requests_waiting"] == 0 and m["tessera_slots_busy"] == 0, m
        r = s.post(COMPL, {"prompt": "free again", "max_tokens": 2})
        assert r["usage"]["completion_tokens"] <= 2, r

su.finish()
