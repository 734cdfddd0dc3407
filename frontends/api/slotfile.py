"""POST /slots/{id}?action=save|restore: llama-server's slot files.

The request body is ``{"filename": "..."}``; the file lives in
``--slot-save-path`` (without it: 501, as llama-server). The name is checked
here (400 "Invalid filename": no separators, no "..", llama.cpp's
fs_validate_filename) and again by the engine, which does the work between
steps once the slot is idle (engine/slotfile.py, where the exchange over the
channel is described). Answers, llama-server's shapes:

  save:    {"id_slot", "filename", "n_saved", "n_written", "timings": {"save_ms"}}
  restore: {"id_slot", "filename", "n_restored", "n_read", "timings": {"restore_ms"}}
"""
from __future__ import annotations

import time

import falcon
import numpy as np

from engine.slotfile import valid_filename
from ipc.client import EngineUnavailable, NoChannel
from ipc.layout import RESULT, SUB_RESTORE, SUB_SAVE

from frontends.http.ctx import Ctx, client_socket, read_json
from frontends.http.gen import POLL, refused, peer_gone
from frontends.text.errors import ApiError, bad, unavailable

NOT_ENABLED = "This server does not support slots action. Start it with `--slot-save-path`"


def save_restore(ctx: Ctx, req: falcon.Request, resp: falcon.Response, sid: int, action: str) -> None:
    """Validate, hand the operation to the engine, wait for its answer."""
    if not ctx.cfg.slot_save_path:
        raise ApiError(501, NOT_ENABLED)
    body = read_json(req, ctx.cfg.max_body)
    name = body.get("filename")
    if not isinstance(name, str) or not valid_filename(name):
        raise bad("Invalid filename")
    if not 0 <= sid < ctx.n_slots:
        raise bad("Invalid slot ID")
    if not ctx.ready():
        raise ctx.not_ready()
    try:
        lease = ctx.port.lease()
    except (EngineUnavailable, NoChannel) as e:
        raise refused(e) from None
    with lease:
        ch = lease.channel
        raw = name.encode("utf-8")
        ch.grammar[: len(raw)] = np.frombuffer(raw, np.uint8)
        ch.params["n_grammar"] = len(raw)
        ch.result[:] = np.zeros(1, RESULT)
        try:  # the post orders the stores above before the engine reads them
            lease.post(SUB_SAVE if action == "save" else SUB_RESTORE, sid)
        except EngineUnavailable as e:
            raise unavailable(str(e)) from None
        sock = client_socket(req)
        next_check = time.monotonic() + POLL
        while True:  # the slot may be busy: the engine waits for it to go idle, so do we
            tok = lease.read(POLL)
            if tok is not None and tok.last:
                break
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + POLL
                if not lease.engine_ok():
                    raise unavailable("engine unavailable")
                if peer_gone(sock):
                    return  # leaving the lease cancels; the engine drops the operation
        r = ch.result[0].copy()
    code = int(r["error_code"])
    if code:
        raise ApiError(code, r["error"].decode("utf-8", "replace"))
    n, nbytes, ms = int(r["n_prompt"]), int(r["predicted_ms"]), float(r["prompt_ms"])
    if action == "save":
        resp.media = {"id_slot": sid, "filename": name, "n_saved": n, "n_written": nbytes,
                      "timings": {"save_ms": ms}}
    else:
        resp.media = {"id_slot": sid, "filename": name, "n_restored": n, "n_read": nbytes,
                      "timings": {"restore_ms": ms}}
