"""One choice of a request (``Job``) and what a runner yields (``Step``).

A ``Job`` holds one prompt's lease while it runs, its detokenizer (stop
strings), the tokens and probabilities so far, and once its last record came
the engine's RESULT, read by ``finish`` into llama-server's stop type, error
and timings. gen.py's ``Runner`` drives the jobs of one request; the API
modules read the jobs' figures (frontends/api/).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ipc.client import Lease
from ipc.layout import STOP_CANCEL, STOP_CTX, STOP_EOS, STOP_ERROR, STOP_LIMIT, STOP_NONE, STOP_SHUTDOWN, STOP_STALL

from frontends.text.detok import Detok
from frontends.text.errors import ApiError, unavailable

LOWEST = -3.4028234663852886e38  # llama-server writes log(0) as the lowest float (JSON has no -inf)


def utf8_prefix(b: bytes) -> str:
    """The longest valid UTF-8 prefix (llama-server's validate_utf8 cut)."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError as e:
        return b[: e.start].decode("utf-8", "replace")


def lp_json(x: float) -> float:
    """A log-probability as llama-server writes it: -inf as the lowest float."""
    return LOWEST if not math.isfinite(x) else float(x)


@dataclass(slots=True)
class Step:
    job: "Job"
    text: str
    token: int  # -1 on the final step
    probs: dict | None
    final: bool
    progress: dict | None = None  # a prompt_progress step (no token): llama-server's object


PING = Step(None, "", -1, None, False)  # no record: the stream was silent (Runner.steps); sent as stream.PING_SSE


class Job:
    """One choice: its lease, detokenizer and counters."""

    def __init__(self, index: int, prompt: list[int], lease: Lease, stops: list[str]):
        self.index, self.prompt, self.lease = index, prompt, lease
        self.detok = Detok(stops)
        self.tokens: list[int] = []
        self.probs: list[dict] = []
        self.stop_type = "none"
        self.truncated = False
        self.done = False
        self.deadline = 0.0  # set after a stop-string (or time-limit) cancel
        self.limited = False  # t_max_predict_ms ran out at a newline, or n_indent: stopped as "limit"
        # n_indent (gen.Runner._indent): the released text from the start of the line after the last
        # newline found (the whole text until one is), and how much was released before it; nl: -1 no
        # newline released yet, 0 one released but not yet found (found one token late), 1 found
        self.nl, self.tail, self.n_before = -1, "", 0
        self.result: dict = {}
        self.error: ApiError | None = None
        # live figures from F_PROGRESS records (return_progress, timings_per_token)
        self.p_cache, self.p_done, self.p_ms = -1, 0, 0.0  # cached prompt tokens; in the KV; ms spent so far
        self.t_first_ns = 0  # engine time of the first token's record
        self.t_last_ns = 0

    @property
    def word(self) -> str:
        return self.detok.word or ""

    def whole_probs(self, vocab) -> list[dict]:
        """The token probabilities of a whole (non-streamed) answer, as
        llama-server's send_final_response gives them: less as many of the
        last as the stop word has tokens (tokenized alone, no BOS), which
        carried the text the answer leaves out."""
        if self.stop_type != "word" or not self.probs:
            return self.probs
        n = min(len(self.probs), len(vocab.tokenize(self.word, add_special=False, parse_special=False)))
        return self.probs[:len(self.probs) - n]

    def finish(self, stop: int) -> str:
        """The last record arrived (or never will): read RESULT, set stop_type."""
        self.done = True
        if stop >= 0:
            r = self.lease.channel.result[0]
            self.result = {k: r[k].item() for k in r.dtype.names if not k.startswith("_")}
            self.truncated = self.result.get("n_discarded", 0) > 0  # context shifts dropped tokens (llama-server's)
        if self.detok.word is not None:
            self.stop_type = "word"
        elif self.limited:
            self.stop_type = "limit"
        elif stop == STOP_EOS:
            self.stop_type = "eos"
        elif stop in (STOP_LIMIT, STOP_NONE):
            self.stop_type = "limit"
        elif stop == STOP_CTX:
            self.stop_type, self.truncated = "limit", True
        elif stop == STOP_ERROR:
            msg = self.result.get("error", b"")
            msg = msg.decode("utf-8", "replace") if isinstance(msg, bytes) else str(msg)
            code = int(self.result.get("error_code") or 500)
            self.error = ApiError(code if 400 <= code < 600 else 500, msg or "engine error")
        elif stop == STOP_SHUTDOWN:
            self.error = unavailable("server is shutting down")
        elif stop == STOP_STALL:
            self.error = ApiError(503, "request stalled: the reader fell behind", "unavailable_error")
        elif stop == STOP_CANCEL:
            self.error = ApiError(503, "request cancelled by the engine", "unavailable_error")
        return self.detok.finish()

    def timings(self) -> dict:
        """llama-server's timings (server_slot_stats::to_json): predicted_ms
        runs from the first token to the last, and the per-token figures
        divide by the decode steps, one fewer than the tokens (the first
        token comes from the prompt's logits)."""
        r = self.result
        pn, pms = int(r.get("n_eval", 0)), float(r.get("prompt_ms", 0.0))
        gn, gms = len(self.tokens), float(r.get("predicted_ms", 0.0))
        t = _timings(int(r.get("n_cache", 0)), pn, pms, gn, gms)
        if int(r.get("draft_n", 0)) > 0:  # speculative decoding, as llama-server's (only when it drafted)
            t["draft_n"], t["draft_n_accepted"] = int(r["draft_n"]), int(r.get("draft_n_accepted", 0))
        return t

    def progress(self, processed: int, ms: float) -> dict:
        """One F_PROGRESS record as llama-server's prompt_progress (the first
        record of a request carries the cached count)."""
        if self.p_cache < 0:
            self.p_cache = processed
        self.p_done, self.p_ms = processed, ms
        return {"total": len(self.prompt), "cache": self.p_cache, "processed": processed, "time_ms": int(ms)}

    def live_timings(self) -> dict:
        """timings_per_token: the figures so far, shaped as timings() (from
        the progress records and the token records' engine times)."""
        cache = max(self.p_cache, 0)
        pn, pms = max(self.p_done - cache, 0), self.p_ms
        gn = len(self.tokens)
        gms = max(self.t_last_ns - self.t_first_ns, 1000) / 1e6 if gn else 0.0
        return _timings(cache, pn, pms, gn, gms)

    @property
    def n_prompt(self) -> int:
        return int(self.result.get("n_prompt") or len(self.prompt))

    @property
    def n_cached(self) -> int:
        return int(self.result.get("n_cache", 0))


def _timings(cache: int, pn: int, pms: float, gn: int, gms: float) -> dict:
    """llama-server's timings object; the generation rate divides by the
    decode steps, one fewer than the tokens (the first comes with the prompt)."""
    steps = max(gn - 1, 0)
    return {
        "cache_n": cache, "prompt_n": pn, "prompt_ms": pms,
        "prompt_per_token_ms": pms / pn if pn else 0.0,
        "prompt_per_second": 1e3 * pn / pms if pms > 0 else 0.0,
        "predicted_n": gn, "predicted_ms": gms,
        "predicted_per_token_ms": gms / steps if steps else 0.0,
        "predicted_per_second": 1e3 * steps / gms if gms > 0 else 0.0,
    }
