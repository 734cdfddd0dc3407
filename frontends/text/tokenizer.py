"""The worker's tokenizer: engine/vocab.py's ``Vocab``, loaded vocab-only.

Each worker loads only the GGUF's vocabulary and hyper-parameters (no
tensors; about half a second for a 262k vocabulary), so tokenizing,
detokenizing and reading the chat template never touch the engine. The
llama.cpp calls are engine/vocab.py's (one implementation for the engine and
the workers); this class only adapts them to what the HTTP handlers want:
``str`` in and out, and the model facts of /props and /v1/models read once.
ctypes releases the GIL during each call and the vocabulary is read-only
once loaded, so the worker's threads share one ``Vocab``.
"""
from __future__ import annotations

import logging
import os

from engine import gguf
from engine.vocab import Vocab as _Vocab
from engine.vocab import init_backend


class Vocab:
    """Tokenizer and model facts of one GGUF, loaded vocab-only, or of
    weights loaded already (``core``: the launcher's, engine/weights.py)."""

    def __init__(self, path: str, core: _Vocab | None = None) -> None:
        init_backend(forward=logging.ERROR)  # the engine logs the model's load warnings; each worker would repeat them
        self.core = v = core if core is not None else _Vocab.load(path)  # raises ModelError if it cannot load
        self.path = path
        self.n_vocab, self.bos, self.eos, self.eot, self.add_bos = v.n_vocab, v.bos, v.eos, v.eot, v.add_bos
        info = v.info()
        self.vocab_type: int = info["vocab_type"]
        self.arch: str = info["arch"]
        self.n_ctx_train: int = info["n_ctx_train"]
        self.n_embd: int = info["n_embd"]
        self.desc: str = info["desc"]
        self.ftype: str = info["ftype"]
        self.name: str = info["name"]
        self.bos_text: str = info["bos_token"]
        self.eos_text: str = info["eos_token"]
        self.chat_template = v.chat_template
        self.size = os.path.getsize(path) if os.path.exists(path) else 0  # vocab-only: llama.cpp says 0
        # loaded weights count their own; vocab-only (no tensors): the file's tensor infos (~50 ms for Gemma 3)
        self.n_params = info["n_params"] or (gguf.n_params(path) if os.path.exists(path) else 0)

    def meta(self, key: str) -> str:
        """GGUF metadata value as a string ("" if absent)."""
        return self.core.meta(key) or ""

    # ------------------------------------------------------------ text <-> ids
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special`` adds BOS as the model asks.
        Lone surrogates (JSON allows them) pass through as their bytes."""
        return self.core.tokenize(text.encode("utf-8", "surrogatepass"), add_special, parse_special)

    def piece(self, tok: int, special: bool = False) -> bytes:
        """The bytes of one token (possibly part of a UTF-8 character).

        ``special=False`` renders control tokens (EOS, turn markers) as
        nothing, as llama-server does for generated text.
        """
        return self.core.token_to_piece(tok, special)

    def detokenize(self, ids: list[int], special: bool = True) -> str:
        """Text of ``ids``; invalid UTF-8 becomes U+FFFD."""
        return self.core.detokenize(ids, False, special).decode("utf-8", "replace")

    def is_eog(self, tok: int) -> bool:
        return self.core.is_eog(tok)

    def valid(self, tok: int) -> bool:
        return 0 <= tok < self.n_vocab
