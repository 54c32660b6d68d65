"""Python bindings for tessera's embedding API (tessera/tessera.h, libtessera).

    from tessera import Engine
    with Engine(context=4096) as e:             # the default profile and model
        print(e.generate("The capital of France is", max_tokens=16, temperature=0))
        for piece in e.stream("Once upon a time", max_tokens=32):
            print(piece, end="", flush=True)
        print(e.chat([{"role": "user", "content": "Hello"}]))

The library is found through $TESSERA_LIBRARY (a path to libtessera.so), else
the system's library search (an installed tessera). An engine is not
thread-safe: one call at a time, except cancel(), which any thread may call.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import queue
import threading
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = ["Engine", "TesseraError", "library_version"]

_STATUS = ["ok", "invalid argument", "i/o error", "format error", "unsupported",
           "out of memory", "internal error"]
_STOP = ["none", "limit", "end of generation", "cancelled", "context full"]
_STATS = ["prompt_tokens", "prompt_reused", "prompt_ms", "generated", "eval_steps", "eval_ms",
          "shifts", "max_draft"]


class TesseraError(Exception):
    """A failed call: .status is the kind ("invalid argument", "i/o error", ...), the
    message names what was wrong and where, as the C library said it."""

    def __init__(self, status: int, message: str):
        self.status = _STATUS[status] if 0 <= status < len(_STATUS) else f"status {status}"
        self.code = status
        super().__init__(message or self.status)


_i32p = ctypes.POINTER(ctypes.c_int32)
_TOKEN_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int32,
                             ctypes.POINTER(ctypes.c_char), ctypes.c_size_t)
_COUNTER_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                               ctypes.c_uint64)


def _load() -> ctypes.CDLL:
    path = os.environ.get("TESSERA_LIBRARY") or ctypes.util.find_library("tessera")
    if not path:
        raise ImportError("libtessera not found: set TESSERA_LIBRARY to the path of "
                          "libtessera.so (a build tree's core/libtessera.so), or install tessera")
    lib = ctypes.CDLL(path)
    c = ctypes
    sig = {
        "tsr_error_message": (c.c_char_p, []),
        "tsr_version": (c.c_char_p, []),
        "tsr_free": (None, [c.c_void_p]),
        "tsr_engine_open": (c.c_int, [c.c_char_p, c.c_char_p, c.POINTER(c.c_char_p), c.c_int,
                                      c.POINTER(c.c_void_p)]),
        "tsr_engine_close": (None, [c.c_void_p]),
        "tsr_engine_describe": (c.c_int, [c.c_void_p, c.POINTER(c.c_void_p)]),
        "tsr_engine_n_vocab": (c.c_int32, [c.c_void_p]),
        "tsr_engine_n_ctx": (c.c_int32, [c.c_void_p]),
        "tsr_engine_n_seq": (c.c_int32, [c.c_void_p]),
        "tsr_engine_model_path": (c.c_char_p, [c.c_void_p]),
        "tsr_engine_arch": (c.c_char_p, [c.c_void_p]),
        "tsr_engine_max_tokens": (c.c_int32, [c.c_void_p]),
        "tsr_engine_setting": (c.c_int, [c.c_void_p, c.c_char_p, c.POINTER(c.c_void_p),
                                         c.POINTER(c.c_char_p)]),
        "tsr_tokenize": (c.c_int, [c.c_void_p, c.c_char_p, c.c_size_t, c.c_uint,
                                   c.POINTER(_i32p), c.POINTER(c.c_size_t)]),
        "tsr_detokenize": (c.c_int, [c.c_void_p, _i32p, c.c_size_t, c.POINTER(c.c_void_p),
                                     c.POINTER(c.c_size_t)]),
        "tsr_chat_template_choose": (c.c_int, [c.c_void_p, c.c_char_p, c.POINTER(c.c_char_p),
                                               c.POINTER(c.c_char_p)]),
        "tsr_chat_format": (c.c_int, [c.c_void_p, c.POINTER(c.c_char_p),
                                      c.POINTER(c.c_char_p), c.c_size_t, c.c_int,
                                      c.POINTER(c.c_void_p)]),
        "tsr_chat_tokenize": (c.c_int, [c.c_void_p, c.POINTER(c.c_char_p),
                                        c.POINTER(c.c_char_p), c.c_size_t, c.c_int,
                                        c.POINTER(_i32p), c.POINTER(c.c_size_t)]),
        "tsr_engine_eval": (c.c_int, [c.c_void_p, c.c_int32, _i32p, c.c_int32,
                                      c.POINTER(c.c_float), c.POINTER(c.c_float)]),
        "tsr_engine_logprobs": (c.c_int, [c.c_void_p, c.c_int32, _i32p, c.c_int32,
                                          c.POINTER(c.c_float)]),
        "tsr_engine_seq_len": (c.c_int32, [c.c_void_p, c.c_int32]),
        "tsr_engine_seq_rm": (c.c_int, [c.c_void_p, c.c_int32, c.c_int32, c.c_int32]),
        "tsr_engine_seq_cp": (c.c_int, [c.c_void_p, c.c_int32, c.c_int32]),
        "tsr_engine_seq_keep": (c.c_int, [c.c_void_p, c.c_int32]),
        "tsr_sampler_open": (c.c_int, [c.c_void_p, c.POINTER(c.c_char_p), c.c_int,
                                       c.POINTER(c.c_void_p)]),
        "tsr_sampler_close": (None, [c.c_void_p]),
        "tsr_generate": (c.c_int, [c.c_void_p, c.c_int32, c.c_void_p, _i32p, c.c_size_t,
                                   c.c_int64, c.c_int32, _TOKEN_FN, c.c_void_p,
                                   c.POINTER(c.c_int)]),
        "tsr_engine_cancel": (None, [c.c_void_p]),
        "tsr_engine_stat": (c.c_double, [c.c_void_p, c.c_int]),
        "tsr_engine_counters": (None, [c.c_void_p, _COUNTER_FN, c.c_void_p]),
        "tsr_engine_reset_counters": (None, [c.c_void_p]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


_lib = _load()


def library_version() -> str:
    """The linked libtessera's version, e.g. "0.1.0"."""
    return _lib.tsr_version().decode()


def _check(status: int) -> None:
    if status != 0:
        raise TesseraError(status, _lib.tsr_error_message().decode("utf-8", "replace"))


def _take_text(ptr: ctypes.c_void_p, length: Optional[int] = None) -> str:
    try:
        raw = ctypes.string_at(ptr.value) if length is None else ctypes.string_at(ptr.value, length)
    finally:
        _lib.tsr_free(ptr)
    return raw.decode("utf-8", "replace")


def _take_tokens(ptr: Any, n: int) -> List[int]:
    try:
        return list(ptr[:n]) if n else []
    finally:
        _lib.tsr_free(ctypes.cast(ptr, ctypes.c_void_p))


def _strings(items: Sequence[str]) -> Any:
    return (ctypes.c_char_p * max(len(items), 1))(*[s.encode() for s in items])


def _set_text(key: str, value: Any) -> str:
    if isinstance(value, bool):
        value = "true" if value else "false"
    return f"{key}={value}"


Messages = Sequence[Mapping[str, str]]
Prompt = Union[str, Sequence[int]]


class Engine:
    """One loaded profile: plugins, model, composition, KV cache and backend.

    profile: a YAML profile path (None: the default profile the build ships);
    model: a GGUF path that replaces the profile's; sets: --set style overrides
    ("kv.k=q8_0"); keyword overrides are the same with dots written as "__"
    (kv__k="q8_0", context=8192, server__parallel=2).
    """

    def __init__(self, profile: Optional[str] = None, model: Optional[str] = None,
                 sets: Iterable[str] = (), **overrides: Any):
        all_sets = [str(s) for s in sets]
        all_sets += [_set_text(k.replace("__", "."), v) for k, v in overrides.items()]
        handle = ctypes.c_void_p()
        arr = _strings(all_sets)
        _check(_lib.tsr_engine_open(profile.encode() if profile else None,
                                    model.encode() if model else None, arr, len(all_sets),
                                    ctypes.byref(handle)))
        self._h: Optional[ctypes.c_void_p] = handle
        self._busy = threading.Lock()
        #: why the last generate or stream ended: "limit", "end of generation",
        #: "cancelled" or "context full"
        self.last_stop = "none"

    # ---- lifetime ----

    def close(self) -> None:
        """Frees the engine; further calls raise TesseraError."""
        h, self._h = getattr(self, "_h", None), None
        if h:
            _lib.tsr_engine_close(h)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def _handle(self) -> ctypes.c_void_p:
        if not self._h:
            raise TesseraError(1, "the engine is closed")
        return self._h

    # ---- what it is ----

    def describe(self) -> str:
        """The resolved profile, model, composition and memory plan (`profile check`)."""
        out = ctypes.c_void_p()
        _check(_lib.tsr_engine_describe(self._handle(), ctypes.byref(out)))
        return _take_text(out)

    @property
    def n_vocab(self) -> int:
        return _lib.tsr_engine_n_vocab(self._handle())

    @property
    def n_ctx(self) -> int:
        return _lib.tsr_engine_n_ctx(self._handle())

    @property
    def n_seq(self) -> int:
        return _lib.tsr_engine_n_seq(self._handle())

    @property
    def model_path(self) -> str:
        return _lib.tsr_engine_model_path(self._handle()).decode()

    @property
    def arch(self) -> str:
        return _lib.tsr_engine_arch(self._handle()).decode()

    def setting(self, key: str) -> Tuple[str, str]:
        """A resolved profile value as text, and where it was set."""
        out, where = ctypes.c_void_p(), ctypes.c_char_p()
        _check(_lib.tsr_engine_setting(self._handle(), key.encode(), ctypes.byref(out),
                                       ctypes.byref(where)))
        return _take_text(out), (where.value or b"").decode()

    # ---- tokens and chat ----

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> List[int]:
        if not isinstance(text, str):
            raise TypeError(f"tokenize: text must be a str, not {type(text).__name__}")
        raw = text.encode()
        ptr, n = _i32p(), ctypes.c_size_t()
        _check(_lib.tsr_tokenize(self._handle(), raw, len(raw),
                                 (1 if add_special else 0) | (2 if parse_special else 0),
                                 ctypes.byref(ptr), ctypes.byref(n)))
        return _take_tokens(ptr, n.value)

    def detokenize(self, tokens: Sequence[int]) -> str:
        arr = (ctypes.c_int32 * max(len(tokens), 1))(*tokens)
        out, n = ctypes.c_void_p(), ctypes.c_size_t()
        _check(_lib.tsr_detokenize(self._handle(), arr, len(tokens), ctypes.byref(out),
                                   ctypes.byref(n)))
        return _take_text(out, n.value)

    def chat_template(self, name: Optional[str] = None) -> Tuple[str, str]:
        """Chooses the chat template (None: the model's own); returns it and its source."""
        chosen, source = ctypes.c_char_p(), ctypes.c_char_p()
        _check(_lib.tsr_chat_template_choose(self._handle(), name.encode() if name else None,
                                             ctypes.byref(chosen), ctypes.byref(source)))
        return chosen.value.decode(), source.value.decode()

    @staticmethod
    def _messages(messages: Messages) -> Tuple[Any, Any, int]:
        roles, contents = [], []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or \
                    not isinstance(m.get("content"), str):
                raise TypeError(f"messages[{i}] must be a mapping with 'role' and 'content' "
                                "strings")
            roles.append(m["role"])
            contents.append(m["content"])
        return _strings(roles), _strings(contents), len(roles)

    def format_chat(self, messages: Messages, add_generation_prompt: bool = True) -> str:
        roles, contents, n = self._messages(messages)
        out = ctypes.c_void_p()
        _check(_lib.tsr_chat_format(self._handle(), roles, contents, n, int(add_generation_prompt),
                                    ctypes.byref(out)))
        return _take_text(out)

    def tokenize_chat(self, messages: Messages, add_generation_prompt: bool = True) -> List[int]:
        """The conversation's tokens: only the template's own markers are special tokens."""
        roles, contents, n = self._messages(messages)
        ptr, count = _i32p(), ctypes.c_size_t()
        _check(_lib.tsr_chat_tokenize(self._handle(), roles, contents, n,
                                      int(add_generation_prompt), ctypes.byref(ptr),
                                      ctypes.byref(count)))
        return _take_tokens(ptr, count.value)

    # ---- sequences and evaluation ----

    def seq_len(self, seq: int = 0) -> int:
        return _lib.tsr_engine_seq_len(self._handle(), seq)

    def seq_rm(self, seq: int = 0, p0: int = 0, p1: int = -1) -> None:
        _check(_lib.tsr_engine_seq_rm(self._handle(), seq, p0, p1))

    def seq_cp(self, src: int, dst: int) -> None:
        _check(_lib.tsr_engine_seq_cp(self._handle(), src, dst))

    def seq_keep(self, seq: int) -> None:
        _check(_lib.tsr_engine_seq_keep(self._handle(), seq))

    def eval(self, tokens: Sequence[int], seq: int = 0) -> List[float]:
        """Evaluates tokens at seq's next positions; the last token's logits."""
        if not tokens:
            raise ValueError("eval: no tokens")
        arr = (ctypes.c_int32 * len(tokens))(*tokens)
        logits = (ctypes.c_float * self.n_vocab)()
        _check(_lib.tsr_engine_eval(self._handle(), seq, arr, len(tokens), logits, None))
        return list(logits)

    def logprobs(self, text_or_tokens: Prompt, seq: int = 0) -> List[float]:
        """log p(token i+1 | what precedes it) for each token after the first, after
        evaluating them at seq's next positions (natural log)."""
        tokens = self._prompt_tokens(text_or_tokens)
        arr = (ctypes.c_int32 * len(tokens))(*tokens)
        out = (ctypes.c_float * max(len(tokens) - 1, 1))()
        _check(_lib.tsr_engine_logprobs(self._handle(), seq, arr, len(tokens), out))
        return list(out[:len(tokens) - 1])

    # ---- generation ----

    def _prompt_tokens(self, prompt: Prompt) -> List[int]:
        if isinstance(prompt, str):
            return self.tokenize(prompt, add_special=True, parse_special=True)
        if isinstance(prompt, (bytes, bytearray)) or not all(isinstance(t, int) for t in prompt):
            raise TypeError("a prompt is a str or a sequence of token ids")
        return list(prompt)

    def _sampler(self, sampling: Mapping[str, Any]) -> ctypes.c_void_p:
        sets = [_set_text(k, v) for k, v in sampling.items() if v is not None]
        handle = ctypes.c_void_p()
        _check(_lib.tsr_sampler_open(self._handle(), _strings(sets), len(sets),
                                     ctypes.byref(handle)))
        return handle

    def _generate(self, tokens: List[int], max_tokens: Optional[int], seq: int, keep: int,
                  sampling: Mapping[str, Any], on_piece: Any) -> str:
        h = self._handle()
        if max_tokens is None:
            max_tokens = _lib.tsr_engine_max_tokens(h)
        smp = self._sampler(sampling)
        failure: List[BaseException] = []

        def callback(_user: Any, token: int, text: Any, length: int) -> int:
            try:
                return 1 if on_piece(ctypes.string_at(text, length)) else 0
            except BaseException as exc:  # noqa: B902: surfaced after the call returns
                failure.append(exc)
                return 0

        fn = _TOKEN_FN(callback)
        arr = (ctypes.c_int32 * max(len(tokens), 1))(*tokens)
        stop = ctypes.c_int()
        with self._busy:
            try:
                status = _lib.tsr_generate(h, seq, smp, arr, len(tokens), max_tokens, keep, fn,
                                           None, ctypes.byref(stop))
            finally:
                _lib.tsr_sampler_close(smp)
        if failure:
            raise failure[0]
        _check(status)
        return _STOP[stop.value]

    def generate(self, prompt: Prompt, max_tokens: Optional[int] = None, *, seq: int = 0,
                 keep: int = 4, temperature: Optional[float] = None,
                 top_k: Optional[int] = None, top_p: Optional[float] = None,
                 min_p: Optional[float] = None, seed: Optional[int] = None) -> str:
        """The continuation of prompt (text, or token ids) as text. max_tokens None: the
        profile's sampling.max_tokens (-1 there: until the model ends it); sampling
        settings default to the profile's. A full context is shifted keeping the first
        `keep` tokens (keep < 0: it stops there)."""
        pieces: List[bytes] = []
        self.last_stop = self._generate(self._prompt_tokens(prompt), max_tokens, seq, keep,
                                        dict(temperature=temperature, top_k=top_k, top_p=top_p,
                                             min_p=min_p, seed=seed),
                                        lambda b: pieces.append(b) or True)
        return b"".join(pieces).decode("utf-8", "replace")

    def stream(self, prompt: Prompt, max_tokens: Optional[int] = None, *, seq: int = 0,
               keep: int = 4, temperature: Optional[float] = None, top_k: Optional[int] = None,
               top_p: Optional[float] = None, min_p: Optional[float] = None,
               seed: Optional[int] = None) -> Iterator[str]:
        """generate's text piece by piece as it is produced (whole characters). Leaving
        the loop early (break, or closing the iterator) cancels the generation."""
        tokens = self._prompt_tokens(prompt)
        pieces: "queue.Queue[Any]" = queue.Queue()
        done = object()
        stopped = threading.Event()
        sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)

        def on_piece(b: bytes) -> bool:
            if stopped.is_set():
                return False  # the consumer left: the generation stops at this token
            pieces.put(b)
            return True

        def work() -> None:
            try:
                self.last_stop = self._generate(tokens, max_tokens, seq, keep, sampling, on_piece)
                pieces.put(done)
            except BaseException as exc:  # handed to the consumer
                pieces.put(exc)

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        try:
            while True:
                item = pieces.get()
                if item is done:
                    break
                if isinstance(item, BaseException):
                    raise item
                if item:  # whole characters already: the library cuts pieces there
                    yield item.decode("utf-8", "replace")
        finally:
            stopped.set()
            worker.join()

    def chat(self, messages: Messages, max_tokens: Optional[int] = None, **sampling: Any) -> str:
        """The assistant's reply to a conversation ([{"role": ..., "content": ...}])."""
        return self.generate(self.tokenize_chat(messages), max_tokens, **sampling)

    def cancel(self) -> None:
        """Stops the generation running on this engine (from any thread)."""
        h = self._h
        if h:
            _lib.tsr_engine_cancel(h)

    # ---- figures ----

    def stats(self) -> Dict[str, float]:
        """What the last generation did (tokens, reuse, milliseconds, shifts)."""
        h = self._handle()
        return {name: _lib.tsr_engine_stat(h, i) for i, name in enumerate(_STATS)}

    def counters(self) -> Dict[Tuple[str, str], int]:
        """{(plugin, counter): value} for the work each plugin counted."""
        out: Dict[Tuple[str, str], int] = {}

        def add(_user: Any, plugin: bytes, counter: bytes, value: int) -> None:
            out[(plugin.decode(), counter.decode())] = value

        _lib.tsr_engine_counters(self._handle(), _COUNTER_FN(add), None)
        return out

    def reset_counters(self) -> None:
        _lib.tsr_engine_reset_counters(self._handle())
