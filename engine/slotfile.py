"""``/slots/{id}?action=save|restore``: a slot's KV to a file and back.

llama-server's slot save/restore (tools/server, SERVER_TASK_TYPE_SLOT_SAVE /
_RESTORE) on the same state functions: ``llama_state_seq_save_file`` writes
the slot's sequence with its tokens ``cache[:n_past]``, and
``llama_state_seq_load_file`` puts them back into the slot's sequence. Files
live in ``--slot-save-path``; a name is checked by ``valid_filename``
(llama.cpp's fs_validate_filename, without subdirectories) in the worker and
again here, so no request reaches a path outside that directory.

The exchange rides on an ordinary channel lease: the worker writes the file
name into the channel's grammar area (``n_grammar`` bytes of UTF-8), sends
SUB_SAVE or SUB_RESTORE with the slot id as ``arg``, and waits for the LAST
record. The engine answers in the result area (ipc.layout.RESULT), read by
frontends/api/slotfile.py:

  id_slot, n_prompt = tokens saved / restored, prompt_ms = the file
  operation's ms, predicted_ms = bytes written / read (a float64 holds any
  file size exactly), error_code + error when it failed.

A busy slot defers the operation until it is idle (as llama-server defers
the task); a pending operation whose lease went away is dropped. Invariant
after a restore: ``cache[:n_past]`` are the restored tokens, which sit in the
slot's KV (engine/slots.py), so the next request reuses them as a prefix.
"""
from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass

import numpy as np

from ipc.layout import STOP_CANCEL, STOP_ERROR, STOP_NONE, SUB_RESTORE, SUB_SAVE

MAX_NAME = 255  # bytes: the longest file name on common Linux filesystems
# llama.cpp's forbidden code points besides C0/C1 controls and surrogates:
# DEL, fullwidth full stop, division slash, set minus, replacement char, BOM.
_FORBIDDEN = set(':*?"<>|/\\') | {"\x7f", "\uff0e", "\u2215", "\u2216", "\ufffd", "\ufeff"}


def valid_filename(name: str) -> bool:
    """llama.cpp's fs_validate_filename(name, allow_subdirs=false): no path
    separator, no "..", no control or look-alike characters, no leading or
    trailing space, no trailing dot, at most 255 UTF-8 bytes. What passes
    names a file directly inside the save directory."""
    try:
        raw = name.encode("utf-8")  # a lone surrogate fails here
    except UnicodeEncodeError:
        return False
    if not raw or len(raw) > MAX_NAME:
        return False
    for c in name:
        o = ord(c)
        if o <= 0x1F or 0x80 <= o <= 0x9F or c in _FORBIDDEN:
            return False
    if name[0] == " " or name[-1] in " .":
        return False
    return ".." not in name and name != "."


def slot_path(directory: str, name: str) -> str:
    """The file a valid name stands for (ValueError otherwise); the joined
    path is checked to stay in ``directory`` as a second line of defence."""
    if not directory or not valid_filename(name):
        raise ValueError("Invalid filename")
    base = os.path.realpath(directory)
    path = os.path.join(base, name)
    if os.path.dirname(path) != base:
        raise ValueError("Invalid filename")
    return path


@dataclass(slots=True)
class Pending:
    kind: int  # SUB_SAVE or SUB_RESTORE
    channel: int
    rid: int
    slot: int


class SlotFiles:
    """The engine's pending save/restore operations and their execution.

    ``engine`` is engine.loop.Engine: its slots, model, port, arena and
    ``show``/``end`` are used; nothing else of it is touched."""

    def __init__(self, directory: str):
        self.directory = directory
        self.pending: list[Pending] = []

    def submit(self, kind: int, channel: int, rid: int, slot: int) -> None:
        self.pending.append(Pending(kind, channel, rid, slot))

    def run(self, engine) -> None:
        """Do every pending operation whose slot is idle now (in arrival
        order); keep the others for a later step."""
        keep = []
        for op in self.pending:
            if not engine.port.owner_ok(op.channel, op.rid):
                # the client left; nobody reads the answer, but its end frees the channel (engine/publish.py)
                engine.end(_Req(op.channel, op.rid), STOP_CANCEL)
                continue
            s = engine.slots[op.slot] if 0 <= op.slot < len(engine.slots) else None
            if s is not None and (not s.idle or (engine.kv is not None and engine.kv.pending(s.id))):
                keep.append(op)  # busy, or its stream still waits for a copy (engine/kvcache.py)
                continue
            self._do(engine, op, s)
        self.pending = keep

    def drop(self, channels: range) -> None:
        """A worker index is reclaimed: forget its operations."""
        self.pending = [op for op in self.pending if op.channel not in channels]

    def _do(self, engine, op: Pending, s) -> None:
        ch = engine.arena.channel(op.channel)
        t0 = time.perf_counter()
        n_tok = n_bytes = 0
        code, err = 0, ""
        try:
            if s is None:
                raise _Fail(400, "Invalid slot ID")
            n = int(ch.params[0]["n_grammar"])
            if not 0 < n <= MAX_NAME:
                raise _Fail(400, "Invalid filename")
            try:
                name = ch.grammar[:n].tobytes().decode("utf-8")
                path = slot_path(self.directory, name)
            except (UnicodeDecodeError, ValueError):
                raise _Fail(400, "Invalid filename") from None
            if op.kind == SUB_SAVE:
                n_tok, n_bytes = self._save(engine, s, path)
            else:
                n_tok, n_bytes = self._restore(engine, s, path)
        except _Fail as e:
            code, err = e.code, e.msg
        ms = (time.perf_counter() - t0) * 1e3
        ch.result[0] = (op.slot, n_tok, 0, 0, 0, n_tok, ms, float(n_bytes), code, 0, 0, err.encode()[:199], 0, 0)
        engine.end(_Req(op.channel, op.rid), STOP_ERROR if code else STOP_NONE)

    @staticmethod
    def _save(engine, s, path: str) -> tuple[int, int]:
        import llama_cpp as L

        n = s.n_past
        toks = np.ascontiguousarray(s.cache[:max(n, 1)], np.int32)
        ptr = toks.ctypes.data_as(ctypes.POINTER(L.llama_token))
        wrote = L.llama_state_seq_save_file(engine.model.ctx, path.encode(), s.id, ptr, n)
        if wrote == 0:
            raise _Fail(500, "Unable to save slot")
        return n, int(wrote)

    @staticmethod
    def _restore(engine, s, path: str) -> tuple[int, int]:
        import llama_cpp as L

        m = engine.model
        engine.model.seq_rm(s.id, 0, -1)  # the slot's old KV goes whatever happens
        s.n_past = 0
        buf = np.zeros(s.n_ctx, np.int32)
        got = ctypes.c_size_t(0)
        nread = 0
        if os.path.isfile(path):
            nread = L.llama_state_seq_load_file(m.ctx, path.encode(), s.id,
                                                buf.ctypes.data_as(ctypes.POINTER(L.llama_token)), s.n_ctx,
                                                ctypes.byref(got))
        n = int(got.value)
        bad = nread == 0 or n > s.n_ctx or (n and (buf[:n].min() < 0 or buf[:n].max() >= m.n_vocab))
        if not bad and n and m.pos_max(s.id) != n - 1:
            bad = True  # the KV must hold exactly positions 0..n-1 for cache[:n_past] to be true
        if bad:
            m.seq_rm(s.id, 0, -1)
            if engine.kv is not None:
                engine.kv.sync(s)
            engine.show(s)
            raise _Fail(400, "Unable to restore slot: No available space in KV cache or invalid slot save file")
        s.cache[:n] = buf[:n]
        s.n_past = n
        if engine.kv is not None:
            engine.kv.sync(s)
        engine.show(s)
        return n, int(nread)


class _Fail(Exception):
    def __init__(self, code: int, msg: str):
        super().__init__(msg)
        self.code, self.msg = code, msg


@dataclass(slots=True)
class _Req:  # what Engine.end reads of a request
    channel: int
    rid: int


KINDS = (SUB_SAVE, SUB_RESTORE)
