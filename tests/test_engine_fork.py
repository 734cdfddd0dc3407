"""The engine forked from the launcher's weights (engine/weights.py) against
an exec'd one (``--engine-start exec``, the GPU path): the same answers, one
vocabulary for the whole tree, restarts forked from the same weights."""
from __future__ import annotations

import os
import signal
import time

import requests

from frontends import testing as S
from frontends.testing import procs

FLAGS = ("-np", "2", "-c", "2048", "-t", "2", "-fa", "on")
ASK = {"prompt": "The capital of France is", "n_predict": 12, "temperature": 0}


def _tree_pss(launcher: int) -> float:
    return sum(p.memory_full_info().pss for p in procs.tree(launcher)) / 2**20  # smaps_rollup's Pss


def _serve(mode: str) -> tuple[str, str, float, str]:
    """(answer, the engine's command line, the idle tree's PSS MiB, the log)."""
    s = S.Server(*FLAGS, "--engine-start", mode)
    try:
        r = requests.post(s.url("/completion"), json=ASK, timeout=60)
        assert r.status_code == 200, r.text
        time.sleep(0.5)
        cmd = " ".join(procs.roles(s.proc.pid)["engine"][0].cmdline())
        return r.json()["content"], cmd, _tree_pss(s.proc.pid), s.log()
    finally:
        rc, left = s.finish()
        assert rc == 0 and left == []


def test_a_forked_engine_answers_as_an_execd_one_and_shares_the_vocabulary() -> None:
    fork_text, fork_cmd, fork_pss, fork_log = _serve("auto")
    exec_text, exec_cmd, exec_pss, exec_log = _serve("exec")
    print(f"tree PSS idle: forked engine {fork_pss:.1f} MiB, exec'd {exec_pss:.1f} MiB")
    assert "forked from the loaded weights" in fork_log and "ringserve: engine --arena rs_" in fork_cmd, fork_log
    assert "-m engine --arena" in exec_cmd and "forked" not in exec_log
    assert fork_text == exec_text and fork_text
    # one vocabulary (~40 MiB for Gemma's 262k tokens) where there were two; measured 41 MiB less
    assert fork_pss < exec_pss - 20, (fork_pss, exec_pss)


def test_a_killed_forked_engine_is_forked_again_from_the_same_weights() -> None:
    s = S.Server(*FLAGS)
    try:
        before = requests.post(s.url("/completion"), json=ASK, timeout=60).json()["content"]
        old = s.engine_pid
        os.kill(old, signal.SIGKILL)
        S.wait_for(lambda: s.engine_pid not in (0, old), 30, lambda: "a new engine\n" + s.log_tail())
        s.wait_ready(60)
        after = requests.post(s.url("/completion"), json=ASK, timeout=60).json()["content"]
        log = s.log()
        assert log.count("forked from the loaded weights") == 2, log
        assert after == before
    finally:
        rc, left = s.finish()
        assert rc == 0 and left == []
