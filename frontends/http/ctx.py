"""What a worker's handlers share: config, arena port, vocabulary, template.

Built once per worker process by ``frontends.api.app.build`` and handed to every
resource; nothing lives in module globals.
"""
from __future__ import annotations

import functools
import os
import time
from typing import TYPE_CHECKING
from dataclasses import dataclass, field

import falcon
import orjson

from engine.config import Config
from ipc.arena import Arena
from ipc.client import WorkerPort
from ipc.layout import STATE_NAMES, ST_FAILED

from frontends.text.errors import ApiError, bad

if TYPE_CHECKING:  # annotations only: the app builds both (frontends/api/app.py)
    from frontends.text.chat import ChatTemplate
    from frontends.text.tokenizer import Vocab

FINGERPRINT = "b0-ringserve"


@dataclass
class Ctx:
    cfg: Config
    vocab: Vocab
    chat: ChatTemplate
    arena: Arena | None = None
    port: WorkerPort | None = None
    w: int = -1
    started: float = field(default_factory=time.time)

    @property
    def model(self) -> str:
        """The name responses report: the first alias, else the file name."""
        aliases = self.aliases
        return aliases[0] if aliases else os.path.basename(self.vocab.path)

    @property
    def aliases(self) -> list[str]:
        return names(self.cfg.alias)

    @property
    def tags(self) -> list[str]:
        return names(self.cfg.tags)

    @functools.cached_property
    def spec_types(self) -> list[str]:
        """The drafters the engine chains (["none"]: no speculation), as engine.spec resolves the flags;
        resolved once (every request's generation_settings show them)."""
        from engine.spec import resolved

        return resolved(self.cfg)

    @property
    def n_slots(self) -> int:
        return self.arena.geom.n_slots if self.arena is not None else max(self.cfg.parallel, 1)

    @property
    def n_ctx_slot(self) -> int:
        """Tokens a slot holds: the engine's figure once known, else the
        channel capacity the launcher sized from the config."""
        a = self.arena
        if a is None:
            return self.cfg.n_ctx_slot
        n = int(a.get("n_ctx_slot"))
        return min(n, a.geom.max_prompt) if n > 0 else a.geom.max_prompt

    def ready(self) -> bool:
        return self.arena is not None and self.port is not None and self.arena.ready()

    def not_ready(self) -> ApiError:
        """The 503 llama-server gives while it cannot serve."""
        a = self.arena
        if a is not None and a.state == ST_FAILED:
            reason = a.get("reason")
            reason = reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
            return ApiError(503, f"Model failed to load: {reason}" if reason else "Model failed to load")
        if self.port is None and a is not None:
            return ApiError(503, "no worker index for this worker")
        return ApiError(503, "Loading model")

    def state_name(self) -> str:
        return STATE_NAMES[self.arena.state] if self.arena is not None else "down"


def names(csv: str) -> list[str]:
    """--alias / --tags: comma separated, stripped, empty ones dropped,
    sorted and unique (llama-server keeps them in a std::set)."""
    return sorted({a.strip() for a in csv.split(",") if a.strip()})


def read_json(req: falcon.Request, limit: int) -> dict:
    """The request body as a JSON object; 413 past ``limit`` bytes, 400 for
    anything that is not one valid UTF-8 JSON object (orjson rejects invalid
    UTF-8 and lone surrogates)."""
    n = req.content_length
    if n is not None and n > limit:
        raise ApiError(413, f"request body of {n} bytes exceeds the limit of {limit}")
    # Chunked bodies have no Content-Length: read gunicorn's decoded input to
    # EOF (Falcon's bounded_stream would read nothing), never past the limit.
    src = req.bounded_stream if n is not None else req.stream
    parts, got = [], 0
    while got <= limit:
        chunk = src.read(limit + 1 - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    data = b"".join(parts)
    if len(data) > limit:
        raise ApiError(413, f"request body exceeds the limit of {limit} bytes")
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark: nlohmann::json (llama-server) skips it
        data = data[3:]
    if not data.strip():
        raise bad("empty request body: expected a JSON object")
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise bad(f"invalid JSON: {e}") from None
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    return body


def client_socket(req: falcon.Request):
    """gunicorn's connection socket (None under other servers and in tests)."""
    return req.env.get("gunicorn.socket")
