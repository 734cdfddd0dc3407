"""The engine under --embedding / --reranking: every request is a vector.

As llama-server's --embedding, the context is created with embeddings on
and the pooling type of --pooling (the model's own when not given), and the
server answers no completions (the workers' generation routes say 501).

Why one request per decode: llama.cpp pools per ubatch and keeps only the
last ubatch's vector of a sequence (llama_context::decode clears embd_seq
for each batch and overwrites it per ubatch), and with per-slot KV streams
(kv_unified off) it splits a multi-sequence batch into equal-length ubatches
(split_equal), so sequences of different lengths decoded together are cut
across ubatches and their pooled vectors are those of a fragment. That is
llama-server's corruption with several slots busy (llama.cpp issue 26282).
Here a decode holds exactly one request's whole prompt (at most n_ubatch
tokens, else a 400 as llama-server's "input is too large" check), in its
slot's cleared sequence, so a vector never depends on what else is queued:
the test compares a vector computed alone with the same input computed
among concurrent requests, bit for bit.

The vector travels back through the request's channel: the engine writes
``n`` float32 over the prompt area (Channel.vector; the prompt was copied
out at intake) and ``n`` into RESULT.n_embd, then publishes one LAST record
(token -1, STOP_EOS); that record's post orders the vector for the reader
(ipc/layout.py chan_layout). Normalisation (embd_normalize) is the worker's.
The area is the next request's prompt once the channel is leased again: a
request whose reader hung up gets no vector (owner_ok, checked before the
write), and its worker leases the channel again only after this engine's end
of it (ipc/client.py module doc), so the check cannot turn stale before the
write.
"""
from __future__ import annotations

import ctypes
import time

import numpy as np

import llama_cpp as L

from ipc.layout import F_FIRST, F_LAST, SLOT_PROMPT, STOP_CANCEL, STOP_EOS, STOP_ERROR, STOP_SHIFT

from .config import POOLING, Config
from .gguf import tensor_names
from .loop import Engine
from .slots import Request, Slot
from .vocab import ModelError

POOL_NONE, POOL_RANK = POOLING.index("none"), POOLING.index("rank")


def has_rank_head(path: str) -> bool:
    """A classification head (llama.cpp's ``cls`` / ``cls.output`` tensors).
    Without one llama.cpp still "rank"-pools, scoring by the first hidden
    unit of the last token: numbers that mean nothing."""
    names = set(tensor_names(path))
    return bool({"cls.weight", "cls.output.weight"} & names)


def context_params(cp: L.llama_context_params, cfg: Config) -> None:
    """Embeddings on, --pooling (unspecified: the model's), every token an
    output (llama.cpp requires it for pooling; n_outputs_max 0 = n_batch).
    Rank pooling on a model without a rank head is refused (ModelError)."""
    if cfg.pooling_type == "rank" and not has_rank_head(cfg.model_path()):
        raise ModelError("--reranking needs a model with a classification (rank) head; this one has none")
    cp.embeddings = True
    cp.pooling_type = POOLING.index(cfg.pooling_type) if cfg.pooling_type else L.LLAMA_POOLING_TYPE_UNSPECIFIED
    cp.n_outputs_max = 0
    cp.n_outputs_max_per_seq = 0


class EmbedEngine(Engine):
    """The step loop with a vector instead of sampled tokens (see module doc)."""

    def __init__(self, cfg: Config, port, model) -> None:
        super().__init__(cfg, port, model)
        self.pool = L.llama_pooling_type(model.ctx)
        if self.pool == POOL_RANK:
            self.n_out = max(1, L.llama_model_n_cls_out(model.model))
        else:
            self.n_out = L.llama_model_n_embd_out(model.model)
        if self.n_out > self.arena.geom.max_prompt:
            raise ModelError(f"vector of {self.n_out} floats exceeds the channel's {self.arena.geom.max_prompt}")
        self.n_ubatch = model.n_ubatch

    def start(self, req: Request, s: Slot, src=None, k: int = 0) -> None:
        n = len(req.prompt)  # no KV reuse: every vector from its whole input
        if self.pool == POOL_NONE:
            self.reject(req, 501, "pooling type 'none' is not supported by this server: start it with "
                                  "--pooling mean, cls or last")
            return
        if n > self.n_ubatch:  # all of a prompt must be one ubatch (module doc)
            self.reject(req, 400, f"input ({n} tokens) is too large to process. increase the physical batch "
                                  f"size (current batch size: {self.n_ubatch})")
            return
        self.model.seq_rm(s.id, 0, -1)
        s.req, s.n_past, s.i_prompt, s.n_cache = req, 0, 0, 0
        s.n_decoded, s.last, s.held, s.i_batch, s.reported = 0, -1, None, -1, False
        s.t_first, s.n_predict, s.n_probs, s.ignore_eos = 0.0, 0, 0, False
        s.state = SLOT_PROMPT
        s.t_start = time.perf_counter()
        self.n_task += 1
        s.id_task, s.n_prompt = self.n_task, n
        self.show(s)

    def build(self) -> int:
        """The oldest waiting request's whole prompt, every token an output."""
        m = self.model
        m.clear()
        for s in self.slots:
            s.i_batch = -1
        waiting = [s for s in self.slots if s.state == SLOT_PROMPT]
        self.n_gen = self.n_prompt = 0
        if not waiting:
            return 0
        s = min(waiting, key=lambda s: s.t_start)
        prompt = s.req.prompt
        n = len(prompt)
        b = m.batch
        b.token[:n] = prompt
        b.pos[:n] = np.arange(n, dtype=np.int32)
        b.seq[:n] = s.id
        b.out[:n] = 1
        b.n = b.n_out = n
        s.cache[:n] = prompt
        s.n_past = s.i_prompt = n
        s.i_batch = n - 1
        self.n_prompt = n
        return n

    def fail_batch(self, ret: int) -> None:
        """Only the request in the failed decode ends; the waiting ones stay queued in their slots."""
        msg = "Context size has been exceeded." if ret == 1 else "Compute error."
        for s in self.slots:
            if s.i_batch >= 0:
                self.model.seq_rm(s.id, 0, -1)
                s.n_past = 0
                self.finish(s, STOP_ERROR, 500, msg)

    def sample(self) -> None:
        t_ns = time.monotonic_ns()
        for s in self.slots:
            if s.i_batch < 0:
                continue
            # Its reader may have hung up during the decode: then no vector. A
            # cancelled request's channel stays out of its worker's free list
            # until the end that finish publishes (ipc/client.py module doc), so
            # the header keeps this rid (EnginePort.holds) through the writes
            # below, which all precede this request's LAST record
            # (engine/publish.py); a cancel flag set meanwhile only means the
            # vector is written for nobody.
            if not self.port.owner_ok(s.req.channel, s.req.rid):
                self.finish(s, STOP_CANCEL)
                continue
            s.t_first = time.perf_counter()
            try:
                n = self.write_vector(s)
            except Exception as e:  # a failure ends this request only
                self.finish(s, STOP_ERROR, 500, f"embedding failed: {e}")
                continue
            self.result(s, STOP_EOS)
            self.arena.channel(s.req.channel).result["n_embd"] = n  # before the LAST record's post
            self.out.append((s, (s.req.rid, t_ns, -1, F_FIRST | F_LAST | STOP_EOS << STOP_SHIFT, 0.0, None)))

    def write_vector(self, s: Slot) -> int:
        """The sequence's pooled vector into its channel's vector area."""
        ptr = L.llama_get_embeddings_seq(self.model.ctx, s.id)
        if not ptr:
            raise RuntimeError(f"no pooled embedding for sequence {s.id}")
        n = self.n_out
        src = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n,))
        self.arena.channel(s.req.channel).vector[:n] = src
        return n
