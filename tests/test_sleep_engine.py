"""--sleep-idle-seconds on the real engine (engine/sleep.py): what comes
while it falls asleep is served, and an engine that died asleep comes back
awake. llama.cpp's own sleep tests (test_llama_server_tests.py) cover the
HTTP side. SmolLM2: a small model, a fast reload."""
from __future__ import annotations

import dataclasses
import time

import pytest

from engine.config import Config
from engine.process import EngineProcess
from frontends import testing
from ipc.client import WorkerPort
from ipc.layout import CNT, ST_DOWN

PROMPT = [1, 504, 3458, 282, 4649, 314]
pytestmark = pytest.mark.skipif(testing.models.smollm2() is None, reason="needs SmolLM2 (test extra)")


def _cfg(**kw) -> Config:
    return Config(model=testing.models.smollm2(), parallel=1, ctx_size=512, threads=1, flash_attn="off",
                  http_threads=4, workers=1, **kw)


def _answer(port: WorkerPort, within: float) -> int:
    """Tokens of one greedy 4-token request; 0 if its first comes later than ``within`` s."""
    with port.lease() as lease:
        lease.submit(PROMPT, _cfg().sampling(temperature=0.0, n_predict=4))
        n, t_end = 0, time.monotonic() + within
        while True:
            rec = lease.read(max(0.0, t_end - time.monotonic()) if n == 0 else 30.0)
            if rec is None:
                return n
            n += rec.token >= 0
            if rec.last:
                return n


def test_a_submission_in_the_last_idle_wait_is_served_not_slept_over():
    """The idle step waits on the doorbell (heartbeat_s, 4 s here to widen
    the window); a request that rings it after the idle threshold (1 s) has
    passed used to find the engine deciding to sleep right after that wait,
    with the ring spent: it dozed with the record in its ring, and the
    stream hung until some other ring."""
    with EngineProcess(_cfg(sleep_idle_seconds=1, heartbeat_s=4.0)) as eng:
        port = WorkerPort(eng.arena, 0)
        port.register()  # rings once: the engine's next idle wait starts about now
        time.sleep(2.0)  # past the 1 s threshold, inside the 4 s wait
        assert eng.arena.counters[CNT["sleeping"]] == 0
        assert _answer(port, 3.0) == 4, "no first token within 3 s: the engine slept over the request"


def test_an_engine_that_died_asleep_comes_back_awake():
    """``sleeping`` lives in the arena: an engine killed asleep (or whose
    reload failed) left it set, and the next engine, the launcher's restart,
    kept every request in the workers' wake loop and /props saying
    is_sleeping."""
    cfg = _cfg(sleep_idle_seconds=1)
    with EngineProcess(cfg) as eng:
        a = eng.arena
        testing.wait_for(lambda: a.counters[CNT["sleeping"]] == 1, 10, "the engine to fall asleep")
        eng.proc.kill()
        eng.proc.wait()
        a.set("state", ST_DOWN)  # what the launcher's reap does
        eng.cfg = dataclasses.replace(cfg, sleep_idle_seconds=30)
        eng.start()
        assert a.counters[CNT["sleeping"]] == 0
        assert _answer(WorkerPort(a, 0), 5.0) == 4
