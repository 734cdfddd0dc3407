"""A lazy grammar is held off while the model thinks (engine/sampling/budget.py,
as llama.cpp's common_sampler): a trigger written inside the thoughts starts
no call; once the thinking's end marker is written, the grammar is back on
and the next trigger holds the model to the schema.

The real engine and model, through the channels: the default model, shown
get_weather calls, writes more of them; the lazy grammar allows only
get_time from its trigger on. With a budget header whose prefill opens the
thinking, the first call (inside the "thoughts") stays get_weather; the end
marker here is the call's closing tag, so the next call is get_time."""
from __future__ import annotations

import json
import re

import pytest

from engine.config import Config
from engine.direct import generate
from engine.process import EngineProcess
from ipc.budget import UNLIMITED, pack
from ipc.client import WorkerPort
from test_toolfmt_lazy import PROMPT, lazy_grammar


FREE = 48  # tokens of the unconstrained runs, which compare text only (the held ones end by eos, at 33 and 63)


@pytest.fixture(scope="module")
def engine(gemma_vocab):
    cfg = Config(parallel=1, ctx_size=1024, threads=1, http_threads=4, workers=1)
    with EngineProcess(cfg) as eng:
        yield WorkerPort(eng.arena, 0), gemma_vocab


def lazy() -> bytes:
    return lazy_grammar().encode()


def run(engine, grammar: bytes, n_predict: int = 72) -> str:
    """72 tokens by default: room for the free call and the held one after it, which ends the answer (eos at 63)."""
    port, vocab = engine
    ids = vocab.tokenize(PROMPT.encode(), add_bos=True, special=True)
    out = generate(port, ids, {"n_predict": n_predict, "temperature": 0.0, "cache_prompt": False}, grammar=grammar)
    assert out.stop in ("eos", "limit"), out.stop
    return vocab.detokenize(out.tokens).decode(errors="replace")


def names(text: str) -> list[str]:
    return re.findall(r'"name": "(\w+)"', text)


def test_the_grammar_waits_for_the_end_of_the_thoughts(engine) -> None:
    port, vocab = engine
    tok = lambda s: vocab.tokenize(s.encode(), add_bos=False, special=True)  # noqa: E731
    # the free text's first two calls and the third's start fit in FREE tokens (it never stops by itself)
    free, held = run(engine, b"", FREE), run(engine, lazy())
    assert names(free)[:2] == ["get_weather", "get_weather"], free  # what it writes unconstrained
    assert names(held)[:1] == ["get_time"], held  # the grammar from the first trigger
    # thinking opened by the prefill, ended by the call's closing tag: the first call is free, the next held
    think = pack(UNLIMITED, tok("so far:"), tok("</tool_call>"), tok("</tool_call>"), tok("so far:"))
    both = run(engine, think + lazy())
    assert names(both)[:2] == ["get_weather", "get_time"], both
    body = both[both.index("get_time"):]
    assert json.loads("{" + body[body.index('"arguments"'):body.index("}") + 1] + "}")["arguments"]["zone"] in (
        "UTC", "CET"), both
    # never ended: the grammar stays off, the text is the free one
    never = pack(UNLIMITED, tok("so far:"), tok("NEVER-WRITTEN"), tok("x"), tok("so far:"))
    assert run(engine, never + lazy(), FREE) == free
