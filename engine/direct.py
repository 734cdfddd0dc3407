"""Drive one request through a channel without HTTP (tests, benchmarks).

The same steps a worker takes: lease, submit, read records until LAST.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ipc.client import WorkerPort
from ipc.layout import STOP_NAMES


@dataclass
class Output:
    tokens: list[int] = field(default_factory=list)
    stop: str = "none"
    result: dict = field(default_factory=dict)
    t_submit: float = 0.0
    t_first: float = 0.0
    t_end: float = 0.0
    probs: list = field(default_factory=list)  # per token (ids, logprobs) when asked


def generate(port: WorkerPort, prompt, params: dict, timeout: float = 120.0,
             read_delay: float = 0.0, cancel_after: int = -1, grammar: bytes = b"") -> Output:
    """Run one request to its end. ``read_delay`` sleeps before each read
    (a slow reader); ``cancel_after`` cancels after that many tokens;
    ``grammar``: the channel's grammar area (GBNF, maybe behind a header)."""
    out = Output(t_submit=time.perf_counter())
    deadline = out.t_submit + timeout
    with port.lease() as lease:
        lease.submit(prompt, params, grammar)
        while True:
            if read_delay:
                time.sleep(read_delay)
            tok = lease.read(0.05)
            if tok is None:
                if time.perf_counter() > deadline or not lease.engine_ok():
                    raise TimeoutError("no result from the engine")
                continue
            if tok.token >= 0:
                if not out.tokens:
                    out.t_first = time.perf_counter()
                out.tokens.append(tok.token)
                if tok.probs is not None:
                    out.probs.append(tok.probs)
            if tok.last:
                out.stop = STOP_NAMES[tok.stop]
                r = lease.channel.result[0]
                out.result = {k: r[k].item() for k in r.dtype.names if not k.startswith("_")}
                break
            if cancel_after >= 0 and len(out.tokens) >= cancel_after:
                lease.cancel()
                out.stop = "cancel"
                break
    out.t_end = time.perf_counter()
    return out
