"""The servers scripts/bench_serving.py compares: how each is started with the
same settings, when it is ready, how it is stopped, and its /metrics.

Why the bench starts them itself: every server gets the same model, slots,
context, threads and flash-attention setting from one place, on a free
loopback port, and is stopped (SIGTERM, SIGKILL after 10 s) whatever
happens, so a run measures what it says and leaves nothing behind. Starting,
readiness and the stop are frontends.testing.Proc's, as in the tests.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from frontends.testing import HOST, Proc, free_port, get, parse_metrics
from ipc import shm
from ipc.arena import Arena

ROOT = Path(__file__).resolve().parent.parent
LCP_EXTRAS = ("fastapi", "uvicorn", "sse_starlette", "starlette_context", "pydantic_settings")


def llama_server_path() -> str:
    """Where scripts/build_llama_server.sh puts llama-server ("" if not built)."""
    env = os.environ.get("LLAMA_SERVER", "")
    if env:
        return env if os.access(env, os.X_OK) else ""
    import llama_cpp

    base = os.environ.get("RINGSERVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ringserve")
    p = os.path.join(base, f"llama.cpp-{llama_cpp.__version__}", "build", "bin", "llama-server")
    return p if os.access(p, os.X_OK) else ""


def lcp_available() -> bool:
    """llama-cpp-python's server needs its [server] extras installed."""
    return all(importlib.util.find_spec(m) is not None for m in LCP_EXTRAS)


@dataclass
class Settings:
    """What every server under test gets, the same for all of them."""

    model: str
    slots: int
    ctx: int
    threads: int
    flash_attn: str  # on | off | auto
    swa_full: bool = True  # ringserve always runs a full-size sliding-window cache


@dataclass
class Server:
    """One kind of server: its command line, readiness path and API style."""

    name: str
    api: str  # "native" (/completion) or "openai" (/v1/completions)
    ready_path: str
    extra: list[str] = field(default_factory=list)

    def command(self, s: Settings, port: int) -> tuple[list[str], dict]:
        raise NotImplementedError


class Ringserve(Server):
    def __init__(self, extra: list[str]):
        super().__init__("ringserve", "native", "/health", extra)

    def command(self, s: Settings, port: int) -> tuple[list[str], dict]:
        # frontends.process.cli:main is the `ringserve` console command; run as a module
        # from this tree so the bench measures the code beside it, installed or not.
        head = [sys.executable, "-m", "frontends.process.cli"]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        # HTTP threads: one per stream plus room for /health and /metrics.
        http = ["-w", "1", "--threads-http", str(max(s.slots + 2, 8))]
        return head + _common(s, port) + http + self.extra, env


class LlamaServer(Server):
    def __init__(self, path: str, extra: list[str]):
        super().__init__("llama-server", "native", "/health", extra)
        self.path = path

    def command(self, s: Settings, port: int) -> tuple[list[str], dict]:
        return [self.path] + _common(s, port) + self.extra, dict(os.environ)


class LlamaCppPython(Server):
    """``python -m llama_cpp.server``: one model, requests served one at a time.

    --interrupt_requests False: its default cuts a stream short with [DONE] as
    soon as another request waits, which would make every concurrent stream
    a truncated one instead of a queued one."""

    def __init__(self, extra: list[str]):
        super().__init__("llama-cpp-python", "openai", "/v1/models", extra)

    def command(self, s: Settings, port: int) -> tuple[list[str], dict]:
        fa = "True" if s.flash_attn in ("on", "auto") else "False"
        return [sys.executable, "-m", "llama_cpp.server", "--model", s.model, "--n_ctx", str(s.ctx),
                "--n_threads", str(s.threads), "--n_threads_batch", str(s.threads), "--flash_attn", fa,
                "--host", HOST, "--port", str(port), "--interrupt_requests", "False"] + self.extra, dict(os.environ)


def add_server_args(add, timeout: float) -> None:
    """The flags that start the servers and bound a request, the same in
    every bench that compares them (``add`` is a parser's add_argument)."""
    add("--ringserve-args", default="", help="extra ringserve flags")
    add("--llama-server-args", default="", help="extra llama-server flags")
    add("--llama-server", default="", help="llama-server binary (default: scripts/build_llama_server.sh's)")
    add("--timeout", type=float, default=timeout, help="per request, seconds")


def _common(s: Settings, port: int) -> list[str]:
    """llama-server's flags, which ringserve takes unchanged.

    --swa-full: ringserve always keeps a full-size sliding-window KV cache
    (exact prefix reuse) and accepts the flag as a no-op; llama-server's
    default is the small one. With it both have the same KV layout, so greedy
    outputs agree token for token (without it they part at near ties)."""
    return ["-m", s.model, "-np", str(s.slots), "-c", str(s.ctx), "-t", str(s.threads), "-fa", s.flash_attn,
            "--host", HOST, "--port", str(port), "--metrics", "--no-webui"] + (["--swa-full"] if s.swa_full else [])


class Running(Proc):
    """A started server (frontends.testing.Proc: free port, ready path, the
    whole tree stopped); a context manager that always stops it."""

    def __init__(self, server: Server, settings: Settings, ready_timeout: float = 180.0):
        self.server, self.settings = server, settings
        port = free_port()
        cmd, env = server.command(settings, port)
        self.instance = ""
        super().__init__(cmd, port, env, server.ready_path, ready_timeout, name=server.name)

    def on_ready(self) -> None:
        if isinstance(self.server, Ringserve):
            self.instance = Arena.instance_of(self.proc.pid)

    def metrics(self) -> dict[str, float]:
        code, body = get(f"{self.base}/metrics", 10.0)
        return parse_metrics(body.decode()) if code == 200 else {}

    def log_tail(self, n: int = 4000) -> str:
        return super().log_tail(n)

    def stop(self, timeout: float = 10.0) -> list[str]:
        """SIGTERM, SIGKILL after 10 s; returns problems (a hang, processes
        or /dev/shm objects left behind: removed)."""
        if self.returncode is not None:
            return []
        t0 = time.monotonic()
        super().stop(timeout)
        problems = []
        if time.monotonic() - t0 >= timeout:
            problems.append(f"{self.server.name} ignored SIGTERM for {timeout:.0f} s: SIGKILL")
        if self.leftover:
            problems.append(f"{self.server.name} left processes {self.leftover}: killed")
        if self.instance:
            left = shm.instance_entries(self.instance)
            if left:
                problems.append(f"{self.server.name} left {len(left)} objects in /dev/shm: removed")
                shm.unlink_instance(self.instance)
            self.instance = ""
        if not problems:
            self.cleanup()
        return problems


def run_rounds(runs: list, names, rounds: int, sides, key, one, problems: list, bar,
               errors: tuple = (RuntimeError,)) -> None:
    """Every workload, round and side in the A B A B order, one fresh run each,
    appended to ``runs`` as it ends (an interrupt keeps what finished); a run
    that fails with one of ``errors`` is a problem line, and the rest go on.
    ``one(side, name, rnd)`` runs one; ``key(side)`` names a side in messages."""
    for name in names:
        for rnd in range(rounds):
            for side in sides:
                try:
                    runs.append(one(side, name, rnd))
                except errors as e:
                    problems.append(f"{name} {key(side)} r{rnd + 1}: {e}"[:2000])
                    bar.write(problems[-1], file=sys.stderr)
