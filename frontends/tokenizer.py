"""The worker's tokenizer: a vocab-only llama.cpp model load.

Each worker loads only the GGUF's vocabulary and hyper-parameters (no
tensors; about half a second for a 262k vocabulary), so tokenizing,
detokenizing and reading the chat template never touch the engine. llama.cpp
is called through llama-cpp-python's low-level ctypes API; ctypes releases the
GIL during each call, and the vocabulary is read-only once loaded, so the
worker's threads share one ``Vocab``.
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading

import llama_cpp as L

log = logging.getLogger("ringserve")

LOG_ERROR = 4  # GGML_LOG_LEVEL_ERROR


def _quiet_logs() -> object:
    """Route llama.cpp's log to Python's, errors only (it prints every GGUF
    key at load otherwise). Returns the callback, which must stay referenced."""

    @L.llama_log_callback
    def cb(level, text, user_data):  # noqa: ARG001
        if level == LOG_ERROR:
            log.error("llama.cpp: %s", text.decode("utf-8", "replace").rstrip())

    L.llama_log_set(cb, ctypes.c_void_p(0))
    return cb


class Vocab:
    """Tokenizer and model facts of one GGUF, loaded vocab-only."""

    def __init__(self, path: str):
        self._cb = _quiet_logs()
        L.llama_backend_init()
        p = L.llama_model_default_params()
        p.vocab_only = True
        self.path = path
        self.model = L.llama_model_load_from_file(path.encode(), p)
        if not self.model:
            raise RuntimeError(f"failed to load the vocabulary of {path}")
        m = self.model
        self.vocab = v = L.llama_model_get_vocab(m)
        self.n_vocab = L.llama_vocab_n_tokens(v)
        self.bos, self.eos, self.eot = L.llama_vocab_bos(v), L.llama_vocab_eos(v), L.llama_vocab_eot(v)
        self.add_bos = bool(L.llama_vocab_get_add_bos(v))
        self.vocab_type = int(L.llama_vocab_type(v))
        # vocab_only skips the hyper-parameters: read them from the metadata
        self.arch = arch = self.meta("general.architecture")
        self.n_ctx_train = int(self.meta(f"{arch}.context_length") or 0)
        self.n_embd = int(self.meta(f"{arch}.embedding_length") or 0)
        buf = ctypes.create_string_buffer(256)
        L.llama_model_desc(m, buf, 256)
        self.desc = buf.value.decode("utf-8", "replace")
        self.ftype = self.meta("general.file_type")
        self.name = self.meta("general.name") or os.path.basename(path)
        raw = L.llama_model_chat_template(m, None)
        self.chat_template = raw.decode("utf-8", "replace") if raw else ""
        self.size = os.path.getsize(path) if os.path.exists(path) else 0
        self._pieces: dict[tuple[int, bool], bytes] = {}
        self._lock = threading.Lock()
        self.bos_text = self.piece(self.bos, True).decode("utf-8", "replace") if self.bos >= 0 else ""
        self.eos_text = self.piece(self.eos, True).decode("utf-8", "replace") if self.eos >= 0 else ""

    def meta(self, key: str) -> str:
        buf = ctypes.create_string_buffer(512)
        n = L.llama_model_meta_val_str(self.model, key.encode(), buf, 512)
        return buf.value.decode("utf-8", "replace") if n >= 0 else ""

    # ------------------------------------------------------------ text <-> ids
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special`` adds BOS as the model asks."""
        data = text.encode("utf-8", "surrogatepass")
        cap = len(data) + 8
        while True:
            arr = (L.llama_token * cap)()
            n = L.llama_tokenize(self.vocab, data, len(data), arr, cap, add_special, parse_special)
            if n >= 0:
                return list(arr[:n])
            cap = -n

    def piece(self, tok: int, special: bool = False) -> bytes:
        """The bytes of one token (possibly part of a UTF-8 character).

        ``special=False`` renders control tokens (EOS, turn markers) as
        nothing, as llama-server does for generated text.
        """
        key = (tok, special)
        got = self._pieces.get(key)
        if got is not None:
            return got
        cap = 64
        while True:
            buf = ctypes.create_string_buffer(cap)
            n = L.llama_token_to_piece(self.vocab, tok, buf, cap, 0, special)
            if n >= 0:
                out = buf.raw[:n]
                break
            cap = -n
        self._pieces[key] = out  # dict assignment is atomic under the GIL
        return out

    def detokenize(self, ids: list[int], special: bool = True) -> str:
        """Text of ``ids``; invalid UTF-8 becomes U+FFFD."""
        if not ids:
            return ""
        arr = (L.llama_token * len(ids))(*ids)
        cap = 8 * len(ids) + 16
        while True:
            buf = ctypes.create_string_buffer(cap)
            n = L.llama_detokenize(self.vocab, arr, len(ids), buf, cap, False, special)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", "replace")
            cap = -n

    def is_eog(self, tok: int) -> bool:
        return bool(L.llama_vocab_is_eog(self.vocab, tok))

    def valid(self, tok: int) -> bool:
        return 0 <= tok < self.n_vocab
