"""libllama setup (backend, log capture) and the tokenizer side of a GGUF.

`Vocab` wraps a llama_model pointer. The engine's `Model` owns a full model
and exposes its `Vocab`; worker processes use `Vocab.load(path)`, which maps
only the vocabulary (llama_model_params.vocab_only): ~0.4 s to open, ~43 MB
RSS for Gemma 3's 262k tokens, no context, no weights. Every method here is thread-safe (no shared scratch
buffers), since HTTP workers tokenize from many threads.
"""
from __future__ import annotations

import collections
import ctypes
import logging
import os
import threading
from typing import Optional, Sequence

import numpy as np

from engine import lowlevel
from engine.gguf import ftype_name

L = lowlevel.install()  # the C bindings without llama_cpp.llama and its imports (engine/lowlevel.py)

log = logging.getLogger("ringserve.llama")

_init_lock = threading.Lock()
_backend_ready = False
# Last libllama log lines: error messages quote them, Model parses the KV size.
_lines: collections.deque[str] = collections.deque(maxlen=400)
_partial: list[str] = []
_count = [0]  # lines ever captured
_verbose = os.environ.get("RINGSERVE_LLAMA_LOG", "") not in ("", "0")
# ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 continuation of the previous
# line. (llama_cpp/_logger.py still maps the older 1..4 numbering.)
_LEVEL = {3: logging.WARNING, 4: logging.ERROR}
_last_level = [2]
_forward = [logging.WARNING]  # lowest level passed on to Python logging (init_backend)
_hush = [False]  # a decode we aborted on purpose (engine/preempt.py): its error lines are kept, not logged


def hush(on: bool) -> None:
    """While on, libllama's lines are kept (``_lines``) but not logged: the
    ERROR lines llama_decode writes for an abort the engine asked for."""
    _hush[0] = on


def _on_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    """libllama log sink: keep complete lines, forward warnings and errors."""
    s = text.decode("utf-8", "replace") if text else ""
    if level == 5:
        level = _last_level[0]
    _last_level[0] = level
    if _verbose:
        os.write(2, s.encode())
    if level <= 1:  # debug chatter (per-tensor graph dumps) would flush the ring
        return
    _partial.append(s)
    if not s.endswith("\n"):
        return
    line = "".join(_partial).rstrip("\n")
    _partial.clear()
    _lines.append(line)
    _count[0] += 1
    if level in _LEVEL and _LEVEL[level] >= _forward[0] and not _verbose and not _hush[0]:
        log.log(_LEVEL[level], "%s", line)


_log_cb = L.llama_log_callback(_on_log)  # module-level: the C side keeps only the pointer


def init_backend(forward: int | None = None) -> None:
    """llama_backend_init once per process, and route libllama logs to `_on_log`.

    Replaces llama-cpp-python's own sink (which prints every line unless a
    `Llama(verbose=False)` ran first). Set RINGSERVE_LLAMA_LOG=1 to see all.
    `forward` (kept for the process; default WARNING) is the lowest level
    passed on to Python logging: HTTP workers and tools pass ERROR, since the
    engine already reports the model's load-time warnings once.
    """
    global _backend_ready
    with _init_lock:
        if forward is not None:
            _forward[0] = forward
        L.llama_log_set(_log_cb, ctypes.c_void_p(0))
        if not _backend_ready:
            L.llama_backend_init()
            _backend_ready = True


def log_mark() -> int:
    """A position in the captured log; `log_since(mark)` returns what followed."""
    return _count[0]


def log_since(mark: int) -> list[str]:
    n = min(_count[0] - mark, len(_lines))
    return list(_lines)[len(_lines) - n:] if n > 0 else []


def log_tail(n: int = 8) -> str:
    """The last n libllama log lines (for error messages)."""
    return "\n".join(list(_lines)[-n:])


# An empty, NULL-terminated device list (llama_model_params.devices).
_NO_DEVICES = (ctypes.c_void_p * 1)()


def vocab_params() -> L.llama_model_params:
    """Model params for a vocabulary-only load that never touches a GPU.

    With the default device list (NULL: every device), llama.cpp queries each
    GPU's free memory even for vocab_only (llama_prepare_model_devices), and
    on CUDA that creates a context: ~0.5 GiB of device memory held by the
    gunicorn master for its lifetime, and a CUDA state inherited by every
    worker it forks (CUDA does not survive fork; a child that touches it, or
    its exit handlers, can crash), and a second process on the GPU beside the
    engine (refused outright in exclusive-process compute mode). An explicit
    empty list means no device at all; the vocabulary needs none."""
    p = L.llama_model_default_params()
    p.vocab_only = True
    p.n_gpu_layers = 0
    p.devices = ctypes.addressof(_NO_DEVICES)  # module-level: valid for the whole call
    return p


class ModelError(RuntimeError):
    """Loading the model or creating the context failed; message says why."""


class Vocab:
    """Tokenizer, special ids, chat template and GGUF metadata of one model.

    Invariant: `self.model` stays valid until `close()`; only the owner (the
    object that loaded it) frees it.
    """

    def __init__(self, model: L.llama_model_p, own: bool = False, path: str = "") -> None:
        self.model = model
        self.own = own
        self.path = path
        self.vocab = L.llama_model_get_vocab(model)
        v = self.vocab
        self.n_vocab: int = L.llama_vocab_n_tokens(v)
        self.bos: int = L.llama_vocab_bos(v)
        self.eos: int = L.llama_vocab_eos(v)
        self.eot: int = L.llama_vocab_eot(v)
        self.add_bos: bool = bool(L.llama_vocab_get_add_bos(v))
        self.add_eos: bool = bool(L.llama_vocab_get_add_eos(v))
        self._eog: Optional[np.ndarray] = None

    @classmethod
    def load(cls, path: str) -> "Vocab":
        """Open only the vocabulary of the GGUF at `path` (worker processes)."""
        init_backend()
        m = L.llama_model_load_from_file(os.fsencode(path), vocab_params())
        if not m:
            raise ModelError(f"failed to load vocabulary from {path!r}: {log_tail(4)}")
        return cls(m, own=True, path=path)

    # --- end of generation -------------------------------------------------
    @property
    def eog_mask(self) -> np.ndarray:
        """bool[n_vocab], True for end-of-generation ids (built once, ~n_vocab C calls)."""
        if self._eog is None:
            f, v = L.llama_vocab_is_eog, self.vocab
            mask = np.zeros(self.n_vocab, dtype=bool)
            for t in range(self.n_vocab):
                if f(v, t):
                    mask[t] = True
            self._eog = mask
        return self._eog

    @property
    def eog_ids(self) -> np.ndarray:
        return np.flatnonzero(self.eog_mask).astype(np.int32)

    def is_eog(self, token: int) -> bool:
        return bool(self.eog_mask[token])

    # --- text <-> ids --------------------------------------------------------
    def tokenize(self, text: bytes | str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text`. Defaults are llama-server's for prompts (BOS if
        the model wants one, special tokens like <start_of_turn> parsed);
        /tokenize uses add_special=False."""
        b = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        cap = len(b) + 8
        while True:
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(self.vocab, b, len(b), buf, cap, add_special, parse_special)
            if n >= 0:
                return buf[:n]
            if n == -(2**31):
                raise ValueError("tokenization result does not fit int32")
            cap = -n

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        """Bytes of one token (may be a partial UTF-8 sequence).
        special=True renders control tokens such as <end_of_turn>.

        Not cached here: libllama keeps every token's piece in a table built
        at load (in the gunicorn master, shared copy-on-write by the workers),
        and a call costs ~1.5 us. A Python dict in front of it saved ~1.4 us
        per token but grew in every worker with each token id first seen, up
        to the whole vocabulary (~20 MB per worker for Gemma's 262k; issue 18).
        """
        if not 0 <= token < self.n_vocab:
            raise IndexError(f"token id {token} outside vocabulary [0, {self.n_vocab})")
        cap = 64
        while True:
            buf = ctypes.create_string_buffer(cap)
            n = L.llama_token_to_piece(self.vocab, token, buf, cap, 0, special)
            if n >= 0:
                return buf.raw[:n]
            cap = -n

    def detokenize(self, ids: Sequence[int] | np.ndarray, remove_special: bool = False, unparse_special: bool = False) -> bytes:
        """Text of `ids` (llama_detokenize: handles the leading-space rules)."""
        arr = np.ascontiguousarray(ids, dtype=np.int32)
        if arr.size == 0:
            return b""
        ptr = arr.ctypes.data_as(ctypes.POINTER(L.llama_token))
        cap = arr.size * 8 + 16
        while True:
            buf = ctypes.create_string_buffer(cap)
            n = L.llama_detokenize(self.vocab, ptr, arr.size, buf, cap, remove_special, unparse_special)
            if n >= 0:
                return buf.raw[:n]
            cap = -n

    # --- metadata ------------------------------------------------------------
    def meta(self, key: str) -> Optional[str]:
        """GGUF metadata value as a string (None if absent; arrays unsupported)."""
        cap = 256
        while True:
            buf = ctypes.create_string_buffer(cap)
            n = L.llama_model_meta_val_str(self.model, key.encode(), buf, cap)
            if n < 0:
                return None
            if n < cap:
                return buf.value.decode("utf-8", "replace")
            cap = n + 1

    def meta_all(self) -> dict[str, str]:
        out = {}
        for i in range(L.llama_model_meta_count(self.model)):
            kb = ctypes.create_string_buffer(256)
            L.llama_model_meta_key_by_index(self.model, i, kb, 256)
            vb = ctypes.create_string_buffer(256)
            L.llama_model_meta_val_str_by_index(self.model, i, vb, 256)
            out[kb.value.decode("utf-8", "replace")] = vb.value.decode("utf-8", "replace")
        return out

    @property
    def chat_template(self) -> str:
        """The GGUF's default chat template ("" if none)."""
        t = L.llama_model_chat_template(self.model, None)
        return t.decode("utf-8", "replace") if t else ""

    def info(self) -> dict:
        """Facts for /props and /v1/models meta (n_params and size are 0 in vocab-only mode)."""
        desc = ctypes.create_string_buffer(256)
        L.llama_model_desc(self.model, desc, 256)
        arch = self.meta("general.architecture") or ""

        def dim(value: int, key: str) -> int:  # vocab-only models report 0 dims
            return value or int(self.meta(f"{arch}.{key}") or 0)

        return {
            "name": self.meta("general.name") or os.path.basename(self.path),
            "desc": desc.value.decode("utf-8", "replace"),
            "arch": arch,
            "vocab_type": int(L.llama_vocab_type(self.vocab)),
            "n_vocab": self.n_vocab,
            "n_ctx_train": dim(L.llama_model_n_ctx_train(self.model), "context_length"),
            "n_embd": dim(L.llama_model_n_embd(self.model), "embedding_length"),
            "n_layer": dim(L.llama_model_n_layer(self.model), "block_count"),
            "n_params": int(L.llama_model_n_params(self.model)),
            "size": int(L.llama_model_size(self.model)),
            "ftype": ftype_name(self.meta("general.file_type") or ""),
            "bos_token": self.token_to_piece(self.bos, True).decode("utf-8", "replace") if self.bos >= 0 else "",
            "eos_token": self.token_to_piece(self.eos, True).decode("utf-8", "replace") if self.eos >= 0 else "",
        }

    def close(self) -> None:
        if self.own and self.model:
            L.llama_model_free(self.model)
        self.model = None  # type: ignore[assignment]
        self.vocab = None

    def __enter__(self) -> "Vocab":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

