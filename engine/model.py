"""The engine's model: its weights (engine/weights.py), one llama_context, one batch.

Only the engine process creates a `Model`; it is not thread-safe (one decode
loop drives it). Workers use `Vocab.load` (engine/vocab.py), or the
launcher's weights' vocabulary where the engine is forked from them.

KV layout: as llama-server with an explicit -np, kv_unified=False: every
slot is one sequence (seq id = slot id) owning its own stream of
n_ctx // parallel cells (padded to 256 by llama.cpp), so `seq_rm` on one slot
never touches another and each decode attends over a slot's own cells only.
The prefix cache (engine/kvcache.py) moves KV between slots with `seq_cp`
(across streams: a whole-stream buffer copy at the next decode) and between
a slot and host RAM with `state_get` / `state_set`. The hidden
``kv_unified`` setting (scripts/bench_kv_layout.py only) builds one shared
pool instead.
"""
from __future__ import annotations

import ctypes
import re
import weakref
from typing import Sequence

import numpy as np

import llama_cpp as L

from engine import memory
from engine.llbatch import Batch, _logits_ith
from engine.config import Config
from engine.setting import KV_TYPES
from engine.llamaparams import FLASH_ATTN, context_params_dict
from engine.vocab import ModelError, Vocab, log_mark, log_since, log_tail
from engine.weights import Weights, offloads


_KV_LINE = re.compile(r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+)/(\d+) seqs\)"
                      r"(?:, K \((\w+)\):[^,]*, V \((\w+)\))?")


class Model:
    """Weights, context and batch; tokenizer calls delegate to `self.vocab`.

    Attributes (read-only after __init__): n_vocab, n_ctx, n_ctx_slot,
    n_ctx_train, n_batch, n_ubatch, n_seq_max, kv_bytes, kv_caches, swa_full,
    n_swa, bos, eos, add_bos, flash_attn (as configured), flash_attn_on (as
    resolved), chat_template ("" if the GGUF has none), info (name, n_params,
    size, n_embd, ... for /props and /v1/models), params (what llama.cpp was
    handed: engine/llamaparams.py; the context's thread counts as it holds them).
    """

    def __init__(self, cfg: Config, weights: Weights | None = None) -> None:
        """``weights``: loaded already (the launcher's, inherited by a forked
        engine: engine/weights.py), not freed by ``close``; else loaded here."""
        self.cfg = cfg
        self.ctx = None
        self.samplers: weakref.WeakSet = weakref.WeakSet()  # freed by close()
        self._own = weights is None
        self.weights = w = weights if weights is not None else Weights(cfg)
        self.vocab: Vocab | None = w.vocab
        self.model = w.model
        self.params = dict(w.params)
        try:
            self._init_ctx(cfg)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def vocab_only(path: str) -> Vocab:
        """Tokenizer-only handle for worker processes (no weights, no context)."""
        return Vocab.load(path)

    def _init_ctx(self, cfg: Config) -> None:
        if cfg.flash_attn not in FLASH_ATTN:
            raise ModelError(f"flash_attn must be on|off|auto, not {cfg.flash_attn!r}")
        if cfg.parallel < 1:
            raise ModelError("parallel must be >= 1")
        self.n_ctx_train = L.llama_model_n_ctx_train(self.model)
        cp = L.llama_context_default_params()
        cp.n_ctx = cfg.ctx_size if cfg.ctx_size > 0 else self.n_ctx_train
        cp.n_batch = cfg.batch_size
        cp.n_ubatch = min(cfg.ubatch_size, cfg.batch_size)
        unified = cfg.kv_unified
        # --cache-streams: streams past the slots' that hold cached prefixes (engine/kvcache.py); each
        # is a slot's size (llama.cpp gives every stream n_ctx / n_seq_max cells), decodes never touch them
        self.n_park = cfg.cache_streams if cfg.prefix_cache and not unified and not cfg.embeddings else 0
        cp.n_seq_max = cfg.parallel + self.n_park
        if cp.n_seq_max > 256:  # LLAMA_MAX_SEQ
            raise ModelError(f"parallel + cache_streams must be <= 256, not {cp.n_seq_max}")
        cp.n_ctx = cp.n_ctx * cp.n_seq_max // cfg.parallel
        cp.n_threads, cp.n_threads_batch = cfg.n_threads, cfg.n_threads_batch  # -t, -tb
        cp.flash_attn_type = FLASH_ATTN[cfg.flash_attn]
        # -ctk/-ctv: every cell of every stream (slots and parking), so state_get blobs (RAM tier,
        # checkpoints, slot files) hold this type too; a quantized V with -fa off: llama.cpp's own refusal
        cp.type_k, cp.type_v = KV_TYPES[cfg.cache_type_k][0], KV_TYPES[cfg.cache_type_v][0]
        # One logits row per slot per decode, as llama-server sets it: shrinks
        # the reserved compute buffer from n_ubatch rows of n_vocab floats
        # (512 MiB here) to n_seq_max rows. More outputs in one decode would
        # trip a GGML_ASSERT (process abort), so Batch.add refuses them.
        # llama.cpp reserves (and zero-fills) max(outputs, n_seq_max) rows whatever we ask;
        # the engine gives back the rows past Batch.max_out after start-up (engine/memory.py)
        # speculative decoding (engine/spec/): a slot verifying k drafted tokens needs k + 1 rows in one
        # decode; the step's drafts are bounded by n_rows (spec.MAX_ROWS) in all
        from engine.spec import n_rows, per_slot

        self.spec_rows = n_rows(cfg) if not cfg.embeddings else 0
        cp.n_outputs_max = cp.n_seq_max + self.spec_rows
        cp.n_outputs_max_per_seq = 1 + per_slot(cfg) if self.spec_rows else 1
        cp.swa_full = cfg.swa_full
        cp.kv_unified = unified
        cp.no_perf = True
        if cfg.embeddings:  # pooled vectors instead of logits (engine/embed.py)
            from engine.embed import context_params

            context_params(cp, cfg)
        mark = log_mark()
        # the context's zero-filled KV (and its other buffers) resident only where written (engine/memory.py);
        # a CPU build only: a device build's host buffers may be pinned or shared with the device
        lazy = not offloads()
        before, tasks = (memory.maps(), memory.threads()) if lazy else ([], frozenset())
        if lazy:  # each buffer of a MiB or more its own new mapping: glibc's dynamic threshold rises to 32 MiB
            memory.mmap_threshold(1 << 20)  # after a large free, and a buffer in the heap is not new_anon's
        ctx = L.llama_init_from_model(self.model, cp)
        if not ctx:
            raise ModelError(f"failed to create context (n_ctx={cp.n_ctx}, parallel={cfg.parallel}): {log_tail(4)}")
        self.ctx = ctx
        # no thread but ours was started in there: nothing else can write the pages we check; and only malloc's own
        # mappings are checked: a pymalloc arena among the new ranges is written by this very thread (memory.py)
        self.zero_dropped = memory.drop_zero_pages(memory.malloc_chunks(memory.new_anon(before))) \
            if lazy and memory.threads() == tasks else 0
        # what the context holds (llama_n_threads*), not only what it was asked
        self.params.update(context_params_dict(cp), n_threads=L.llama_n_threads(ctx),
                           n_threads_batch=L.llama_n_threads_batch(ctx))
        self.mem = L.llama_get_memory(ctx)
        self.n_ctx = L.llama_n_ctx(ctx)
        seq = getattr(L, "llama_n_ctx_seq", None)
        self.unified = unified
        self.n_ctx_slot = self.n_ctx // cfg.parallel if unified else seq(ctx) if seq else self.n_ctx // cp.n_seq_max
        self.n_batch = L.llama_n_batch(ctx)
        self.n_ubatch = L.llama_n_ubatch(ctx)
        self.n_seq_max = L.llama_n_seq_max(ctx)
        self.n_swa = L.llama_model_n_swa(self.model)
        self.swa_full = bool(cfg.swa_full or self.n_swa == 0)
        self.flash_attn = cfg.flash_attn
        v = self.vocab
        assert v is not None
        self.n_vocab, self.bos, self.eos, self.add_bos = v.n_vocab, v.bos, v.eos, v.add_bos
        v.eog_mask  # built with the weights (engine/weights.py), not on the first is_eog in the loop
        self.chat_template = v.chat_template
        self.info = v.info()
        lines = log_since(mark)
        self.kv_caches, self.kv_bytes = self._kv_size(lines)
        # "auto" resolves inside llama_init_from_model; only its log says how
        self.flash_attn_on = cfg.flash_attn == "on" or (cfg.flash_attn == "auto" and any(
            "Flash Attention enabled" in x or "enabling flash_attn since it is required" in x for x in lines))
        if self.n_batch < cfg.parallel:  # decode asserts (aborts) on n_tokens > n_batch
            raise ModelError(f"batch_size {self.n_batch} < parallel {cfg.parallel}")
        self.n_outputs_max = cp.n_outputs_max
        self.batch = Batch(self.n_batch, cfg.parallel + self.spec_rows)
        self._farr = ctypes.c_float * self.n_vocab

    def _kv_size(self, lines: list[str]) -> tuple[list[dict], int]:
        """KV cache bytes. libllama has no query for it, so read the
        `llama_kv_cache: size = X MiB (N cells, L layers, s/S seqs)` lines it
        logs while creating the context (one per cache: iSWA models have a
        full and a sliding-window cache) and recompute each exactly as
        S streams * N cells * L layers * n_head_kv * (key_length * K's bytes
        per element + value_length * V's) (-ctk/-ctv: 2 for f16, 34/32 for
        q8_0, ...), keeping the logged MiB when the recomputation disagrees
        (per-layer head counts). Without log lines: n_layer * n_ctx *
        n_embd_{k,v}_gqa at those sizes (full-size)."""
        arch = self.info["arch"]
        hkv = int(self.vocab.meta(f"{arch}.attention.head_count_kv") or 0)  # type: ignore[union-attr]
        n_head = L.llama_model_n_head(self.model)
        hd = L.llama_model_n_embd(self.model) // max(n_head, 1)
        kl = int(self.vocab.meta(f"{arch}.attention.key_length") or hd)  # type: ignore[union-attr]
        vl = int(self.vocab.meta(f"{arch}.attention.value_length") or hd)  # type: ignore[union-attr]
        hkv = hkv or n_head
        per_cell = kl * KV_TYPES[self.cfg.cache_type_k][1] + vl * KV_TYPES[self.cfg.cache_type_v][1]
        caches, total = [], 0
        for line in lines:
            m = _KV_LINE.search(line)
            if not m:
                continue
            mib, cells, layers, _, streams = float(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5])
            exact = int(streams * cells * layers * hkv * per_cell)
            nbytes = exact if abs(exact - mib * 2**20) <= 0.006 * 2**20 else int(mib * 2**20)
            caches.append({"cells": cells, "layers": layers, "streams": streams, "bytes": nbytes,
                           "type_k": m[6] or "", "type_v": m[7] or ""})  # as llama.cpp made them
            total += nbytes
        if not caches:
            total = int(L.llama_model_n_layer(self.model) * self.n_ctx * hkv * per_cell)
        return caches, total

    # --- tokenizer (delegates) -----------------------------------------------
    def tokenize(self, text: bytes | str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.vocab.tokenize(text, add_special, parse_special)  # type: ignore[union-attr]

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        return self.vocab.token_to_piece(token, special)  # type: ignore[union-attr]

    def detokenize(self, ids: Sequence[int] | np.ndarray, remove_special: bool = False, unparse_special: bool = False) -> bytes:
        return self.vocab.detokenize(ids, remove_special, unparse_special)  # type: ignore[union-attr]

    def is_eog(self, token: int) -> bool:
        return bool(self.vocab.eog_mask[token])  # type: ignore[union-attr]

    @property
    def eog_mask(self) -> np.ndarray:
        return self.vocab.eog_mask  # type: ignore[union-attr]

    # --- batch and decode ----------------------------------------------------
    def clear(self) -> None:
        self.batch.clear()

    def add(self, token: int, pos: int, seq: int, want_logits: bool) -> int:
        return self.batch.add(token, pos, seq, want_logits)

    def add_many(self, tokens: Sequence[int] | np.ndarray, pos0: int, seq: int, logits_last: bool) -> int:
        return self.batch.add_many(tokens, pos0, seq, logits_last)

    def decode(self) -> int:
        """llama_decode over the whole batch (llama.cpp splits it by n_ubatch).
        0 ok; 1 no KV room (KV unchanged); 2 aborted; -1 invalid batch;
        < -1 fatal (ubatches already done stay in the KV). Invalidates every
        array `logits()` returned before."""
        return L.llama_decode(self.ctx, self.batch.view())

    def logits(self, i: int) -> np.ndarray:
        """float32[n_vocab] view (no copy) of the logits of batch entry i (its
        want_logits flag must have been set). Valid only until the next
        decode(): llama.cpp overwrites, and may reallocate, the buffer."""
        addr = _logits_ith(self.ctx, i)
        if not addr:
            raise IndexError(f"no logits for batch index {i}")
        return np.frombuffer(self._farr.from_address(addr), dtype=np.float32)

    # --- KV ------------------------------------------------------------------
    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        """Drop seq's cells with positions in [p0, p1) (-1: open end). False
        when a partial removal is impossible (e.g. SWA cache without
        swa_full); the caller must then clear the whole sequence."""
        return bool(L.llama_memory_seq_rm(self.mem, seq, p0, p1))

    def seq_clear(self, seq: int) -> None:
        """Remove every cell of seq (never fails)."""
        if not L.llama_memory_seq_rm(self.mem, seq, -1, -1):
            raise ModelError(f"llama_memory_seq_rm({seq}, -1, -1) failed")

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        L.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """Move seq's cells with positions in [p0, p1) by ``delta`` (the keys
        are re-roped at the next decode: llama.cpp's K-shift); only where
        ``can_shift``."""
        L.llama_memory_seq_add(self.mem, seq, p0, p1, delta)

    @property
    def can_shift(self) -> bool:
        """llama_memory_can_shift: positions may move (context shift, cache
        reuse). A sliding-window cache can only with swa_full (its window
        cache as large as the full one: llama_kv_cache_iswa::get_can_shift)."""
        return bool(L.llama_memory_can_shift(self.mem))

    def pos_max(self, seq: int) -> int:
        """Largest position cached for seq (-1 if empty)."""
        return L.llama_memory_seq_pos_max(self.mem, seq)

    def pos_min(self, seq: int) -> int:
        return L.llama_memory_seq_pos_min(self.mem, seq)

    def state_size(self, seq: int, swa_only: bool = False) -> int:
        """Bytes `state_get` would return for ``seq`` (llama.cpp counts them
        without copying: ~0.05 ms against ~1-30 ms for the copy)."""
        return L.llama_state_seq_get_size_ext(self.ctx, seq, L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if swa_only else 0)

    def state_get(self, seq: int, swa_only: bool = False) -> np.ndarray:
        """The KV of ``seq`` as llama_state_seq_get_data bytes (a numpy
        buffer: freed, and its pages returned, as soon as nobody holds it).
        llama.cpp leaves out sliding-window cells already outside the window
        of the sequence's last position (state_write's is_masked_swa).
        ``swa_only``: the sliding-window cache alone (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)."""
        f = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if swa_only else 0
        n = L.llama_state_seq_get_size_ext(self.ctx, seq, f)
        buf = np.empty(n, np.uint8)
        got = L.llama_state_seq_get_data_ext(self.ctx, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), n, seq, f)
        if got != n:
            raise ModelError(f"llama_state_seq_get_data({seq}) wrote {got} of {n} bytes")
        return buf

    def state_set(self, seq: int, blob: np.ndarray, swa_only: bool = False) -> bool:
        """Replace ``seq``'s KV (``swa_only``: its sliding-window cache only)
        by a `state_get` blob; False (and ``seq`` empty) if llama.cpp could
        not place it."""
        f = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if swa_only else 0
        got = L.llama_state_seq_set_data_ext(self.ctx, blob.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)),
                                             blob.nbytes, seq, f)
        if got == 0:
            self.seq_clear(seq)
        return got != 0

    def kv_clear(self) -> None:
        L.llama_memory_clear(self.mem, True)

    # --- lifetime ------------------------------------------------------------
    def close(self) -> None:
        """Free every sampler made for this model, the context and the model
        (batch buffers are numpy-owned). Idempotent."""
        for s in list(self.samplers):
            s.free()
        if self.ctx:
            L.llama_free(self.ctx)
            self.ctx = None
        if self.vocab is not None and self._own:
            self.weights.close()
        self.vocab = None
        self.model = None

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
